from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk


def _one_line(a, path: str, pattern: re.Pattern) -> tuple[int, str] | None:
    """``(line, text)`` of the one line of the file that matches, comments left out; of
    several, the one inside a module's ``forward`` (an evaluation's own log-det left out)."""
    hits = []
    for number, text in enumerate(a.source.lines(path) or (), 1):
        code = text.split("#", 1)[0]
        if pattern.search(code):
            hits.append((number, code.strip()))
    if len(hits) > 1:
        tree = a.source.tree(path)
        spans = [(n.lineno, n.end_lineno or n.lineno) for n in walk(tree)
                 if isinstance(n, ast.FunctionDef) and n.name == "forward"] if tree is not None else []
        hits = [h for h in hits if any(first <= h[0] <= last for first, last in spans)]
    return hits[0] if len(hits) == 1 else None


class LogDetMissesPositions(Rule):
    """
    ## What it does
    Finds a flow's log-det term for a transform applied at every position of an image that is
    counted once: the `log|det W|` of an invertible 1x1 convolution's weight (`torch.slogdet(W)`)
    or the `sum(logs)` of an actnorm's per-channel log-scale (a parameter shaped `(1, C, 1, 1)`
    that, through `exp`, scales every position), held by the loss with no constant factor
    while the transform covers H x W > 1 positions. Read from the loss's graph at the first
    backwards of each line; it points at the script's one line that takes the log-det
    (`slogdet`, or the parameter's `.sum()`), else at the loss's backward.

    ## Why is this bad?
    The 1x1 convolution applies the same C x C matrix at each of the H x W positions, so the
    Jacobian of the layer holds H x W copies of W and its log-det is `H * W * log|det W|`
    (actnorm's: `H * W * sum(logs)`). Counted once, the NLL charges the layer 1/(H·W) of the
    volume it really changes: shrinking W or the scales costs almost nothing, the flow drifts
    towards a degenerate map, and the bits/dim it reports are not the model's likelihood.

    ## Example
    ```python
    def forward(self, x):
        out = F.conv2d(x, self.weight.view(c, c, 1, 1))
        logdet = torch.slogdet(self.weight)[1]
        return out, logdet
    ```

    ## Use instead
    ```python
    def forward(self, x):
        _, _, h, w = x.shape
        out = F.conv2d(x, self.weight.view(c, c, 1, 1))
        logdet = h * w * torch.slogdet(self.weight)[1]
        return out, logdet
    ```

    ## Stays silent on
    The log-det scaled by the positions (`h * w * slogdet(W)[1]`, `logs.sum() * h * w`, a
    pixel count computed from the shape); a 1x1 convolution over a single position (a dense
    flow on vectors, `(B, C, 1, 1)`); a coupling's per-sample log-det (`log_s.sum(dim=(1, 2,
    3))`: computed per position already); a log-det taken through LU parameters (`sum(w_s)`,
    not judged); a log-det used by several terms or scaled by a tensor before it meets the
    others (not judged).
    """

    code = "GD346"
    slug = "log-det-misses-positions"
    severity = Severity.WARNING
    summary = ("a flow's log-det of a transform applied at every position of an image (a 1x1 "
               "invertible convolution, actnorm) is counted once instead of H x W times")
    fix = "multiply the layer's log-det by the number of positions it is applied at (h * w)"

    def check(self, a):
        told = set()
        for e in a.of_kind("log_det_positions"):
            key = (e["op"], tuple(e.get("params") or ()))
            if key in told:
                continue
            told.add(key)
            loc, text = e.loc, None
            pids = e.get("params") or []
            if loc is not None:
                if e["op"] == "slogdet":
                    found = _one_line(a, loc.path, re.compile(r"\b(?:slogdet|logdet)\s*\("))
                else:
                    attr = a.param_name(pids[0]).rsplit(".", 1)[-1].split(" ")[0] if pids else None
                    found = _one_line(a, loc.path, re.compile(
                        rf"\b{re.escape(attr)}\b[^=]*\.sum\(|sum\([^)]*\b{re.escape(attr)}\b")) if attr else None
                if found is not None:
                    loc, text = Location(loc.path, found[0]), found[1]
            what = ("log|det W| of the 1x1 convolution's weight" if e["op"] == "slogdet"
                    else f"sum of the per-channel log-scale {a.names(pids) if pids else ''}".rstrip())
            said = f" (`{text}`)" if text else ""
            p = e["positions"]
            yield self.finding(
                f"the loss holds the {what}{said} once, but the layer applies that transform at "
                f"each of the {p} positions of its input: the layer's log-det is {p} times it, so "
                f"the NLL charges 1/{p} of the volume the layer changes and the flow can shrink it "
                f"almost for free",
                loc, step=a.next_step_number(e.seq),
                evidence={"op": e["op"], "positions": p, "params": pids[:8]},
                fix=f"multiply this log-det by the number of positions the layer is applied at "
                    f"(h * w = {p} here): `h * w * torch.slogdet(W)[1]`, `h * w * logs.sum()`")
