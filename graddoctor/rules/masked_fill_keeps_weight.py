from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from .softmax_wrong_axis import _dim_of
from ..analysis.source import walk


def fill_line(a, path: str, ndim: int) -> tuple[int, str] | None:
    """``(line, text)`` of the script's ``masked_fill`` call that made the scores: the nearest
    one at or above a softmax over the last axis (the first one when no such softmax is in the
    file); None when the file calls none."""
    fills = [(line, text) for line, text, _ in a.source.calls_named(path, {"masked_fill", "masked_fill_"})]
    if not fills:
        return None
    softmaxes = [line for line, text, _ in a.source.calls_named(path, {"softmax", "Softmax"})
                 if _dim_of(text) in (-1, ndim - 1)]
    best, best_gap = None, None
    for line, text in fills:
        gaps = [s - line for s in softmaxes if s >= line]
        if gaps and (best_gap is None or min(gaps) < best_gap):
            best, best_gap = (line, text), min(gaps)
    line, text = best if best is not None else fills[0]
    written = a.source.line_text(path, line).split("  #")[0].strip()
    return line, written if "masked_fill" in written else text


def normaliser_line(a, path: str) -> tuple[int, str] | None:
    """``(line, text)`` of the script's softmax or log_softmax whose result a ``masked_fill``
    fills afterwards: the call assigned to the name the fill is called on (``log_p =
    F.log_softmax(s, dim=1)`` before ``log_p.masked_fill(pad, 0)``), or the fill's own line when
    the softmax is inside it; the first such pair, None when the file holds none."""
    normalisers = {"softmax", "log_softmax", "Softmax", "LogSoftmax"}
    softmaxes = a.source.calls_named(path, normalisers)
    for line, text, _ in a.source.calls_named(path, {"masked_fill", "masked_fill_"}):
        head = text.split(".masked_fill")[0]
        if "softmax" in head:
            return line, a.source.line_text(path, line).split("  #")[0].strip()
        receiver = head.strip()
        for s_line, s_text, _ in reversed(softmaxes):
            if s_line < line and a.source.assigned_name(path, s_line) == receiver:
                return s_line, a.source.line_text(path, s_line).split("  #")[0].strip()
    return None


def product_line(a, path: str) -> tuple[int, str] | None:
    """``(line, text)`` of the script's one product of something with a name that says mask
    (``scores * src_mask``) on a line that also calls a softmax or in the five lines above one,
    else of the one product of two non-constants there (``att * keep[:, None]``); None when
    there is not exactly one."""
    tree = a.source.tree(path)
    if tree is None:
        return None
    softmaxes = [line for line, _, _ in a.source.calls_named(path, {"softmax", "Softmax"})]
    near, named = set(), set()
    for node in walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) \
                and any(0 <= s - node.lineno <= 5 for s in softmaxes) \
                and not any(isinstance(side, ast.Constant) for side in (node.left, node.right)):
            near.add(node.lineno)
            if any("mask" in ast.unparse(side).lower() for side in (node.left, node.right)):
                named.add(node.lineno)
    found = named if len(named) == 1 else near  # a product named for a mask, else the only one
    if len(found) != 1:
        return None
    line = found.pop()
    return line, a.source.line_text(path, line).split("  #")[0].strip()


class MaskedFillKeepsWeight(Rule):
    """
    ## What it does
    Finds scores masked with `masked_fill` before a softmax whose masked positions still get
    the weight: a fill value with its sign flipped (`masked_fill(pad, 1e9)`: the padding takes
    all the attention), a typo'd exponent (`1e-9` for `-1e9`), or a fill of `0` (a neutral score,
    not a mask). At the first backwards the loss's graph is read: each softmax over the last
    axis whose input comes out of a `masked_fill` (through casts, clones and constant factors
    such as a temperature) is compared with the mask that fill saved: over the rows that hold
    masked and unmasked positions both, the mean weight the softmax gives the masked ones. A
    mask that masks leaves them exactly 0 (`exp(-1e9)` underflows); reported when they keep
    more than 1% of the weight, at the script's `masked_fill` line. Scores multiplied by a 0/1
    tensor without gradient before the softmax (`scores * mask`: the masked scores become 0,
    not a mask) are read the same way and reported at the product's line. The same weight is read
    when the padding is taken out after the softmax instead: a `masked_fill` of a softmax's or
    log_softmax's result over the last axis (`F.log_softmax(scores, 1).masked_fill(pad, 0)`,
    a listwise ranking loss over padded lists, attention pooling) whose mask holds each row's
    masked positions together at one end with rows of different lengths (padding), and whose
    result is not divided again. Reported, at the softmax's line, when the padding held more
    than 1% of the weight.

    ## Why is this bad?
    A mask before a softmax exists to take positions out: the padding of shorter sequences,
    the future in a causal model, invalid actions. With a fill that is not a large negative
    number, they stay in: every query mixes in the padding (or the future token it must
    predict), or, with the sign flipped, attends to nothing but the masked positions. Nothing
    fails: the model trains on a different problem than the one it is evaluated on, and the
    loss just ends higher (or lower, on a leak).

    ## Example
    ```python
    scores = torch.bmm(enc_out, query.unsqueeze(2)).squeeze(2)
    scores = scores.masked_fill(src_mask == 0, 1e9)    # sign flipped
    weights = F.softmax(scores, dim=-1)
    ```

    ```python
    log_p = F.log_softmax(scores, dim=1)                # padded list slots normalised too
    loss = -(target * log_p.masked_fill(pad, 0.0)).sum(1).mean()
    ```

    ## Use instead
    ```python
    scores = scores.masked_fill(src_mask == 0, float("-inf"))  # or -1e9, torch.finfo(dtype).min
    weights = F.softmax(scores, dim=-1)
    log_p = F.log_softmax(scores.masked_fill(pad, float("-inf")), dim=1)
    loss = -(target * log_p.masked_fill(pad, 0.0)).sum(1).mean()
    ```

    ## Stays silent on
    A fill after a softmax whose input was masked already (the `-inf` of the padding turned
    into 0 so that `0 * -inf` makes no NaN), after a softmax renormalised over the real positions
    (`w = w / w.sum(-1, keepdim=True)`), or of a mask that is no padding (each row's target
    class, one position per row; positions scattered in the row). Fills of `-inf`, `-1e9`,
    `-1e4`, `torch.finfo(dtype).min` (the masked positions' weight
    underflows to 0), however the scores are scaled after the fill; a mask with every position
    of a row masked (a fully padded row: NaN or uniform, not judged) and a mask that masks
    nothing at these batches; `masked_fill` of values that do not reach a softmax (a masked
    mean, labels) or reach it through another operation (an added bias, a gather); additive
    masks (`scores + mask`) and `F.scaled_dot_product_attention`'s masks (`attention-mask-added`,
    `attention-mask-inverted` judge those); softmaxes over another axis than the last; results
    on a GPU (read on the CPU only) and larger than 4M values. A mask whose convention is
    inverted (it fills the real tokens with -inf) masks what it says and is not this rule's.
    """

    code = "GD313"
    slug = "masked-fill-keeps-weight"
    severity = Severity.WARNING
    summary = ("the positions masked_fill masks before a softmax keep their weight: the fill "
               "value is not a large negative number (+1e9, 1e-9, 0)")
    fix = "fill the masked scores with float('-inf') or a large negative number (-1e9)"

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("masked_fill_weight"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            share, masked = e.get("share"), e.get("masked")
            shape = list(e.get("shape") or ())
            if not pids or share is None or masked is None or not shape:
                continue  # nothing trained makes the scores
            if e.get("after"):
                yield self._after(a, e, pids)
                continue
            loc = e.loc
            if e.get("multiplied"):
                yield self._multiplied(a, e, pids, shape)
                continue
            line = fill_line(a, loc.path, len(shape)) if loc is not None else None
            if line is not None:
                loc = Location(loc.path, line[0])
            written = f"`{line[1]}`" if line is not None else "a masked_fill before the softmax"
            if share >= 0.5 and share > masked:
                how = (f"the masked positions take {share:.0%} of the softmax's weight (they hold "
                       f"{masked:.0%} of the positions): the fill value is a large positive "
                       f"number, so each row attends to what it meant to leave out")
            else:
                how = (f"the masked positions keep {share:.1%} of the softmax's weight (they hold "
                       f"{masked:.0%} of the positions): the fill value is close to the scores "
                       f"(0, 1e-9) and masks nothing")
            yield self.finding(
                f"{written} fills the scores of a softmax of shape {tuple(shape)}, but {how}; "
                f"a mask leaves them 0 ({e.get('rows')} rows with masked and unmasked positions "
                f"read)",
                loc, step=a.next_step_number(e.seq),
                evidence={"share": share, "masked": masked, "rows": e.get("rows"),
                          "shape": shape, "params": pids[:16]},
                fix=("fill with float('-inf') or a large negative number (-1e9, "
                     "torch.finfo(scores.dtype).min) so the masked positions get no weight"))

    def _multiplied(self, a, e, pids, shape):
        loc = e.loc
        line = product_line(a, loc.path) if loc is not None else None
        if line is not None:
            loc = Location(loc.path, line[0])
        written = f"`{line[1]}`" if line is not None else "a product with a 0/1 mask before the softmax"
        return self.finding(
            f"{written} masks the scores of a softmax of shape {tuple(shape)} by multiplying them "
            f"with a 0/1 mask: the masked scores become 0, a score like any other, not one that "
            f"takes them out, so they keep {e['share']:.1%} of the softmax's weight (they hold "
            f"{e['masked']:.0%} of the positions; {e.get('rows')} rows with masked and unmasked "
            f"positions read)",
            loc, step=a.next_step_number(e.seq),
            evidence={"share": e["share"], "masked": e["masked"], "rows": e.get("rows"),
                      "shape": shape, "params": pids[:16], "multiplied": True},
            fix=("fill instead of multiplying: scores.masked_fill(mask == 0, float('-inf')) "
                 "before the softmax"))

    def _after(self, a, e, pids):
        share, masked, shape = e.get("share"), e.get("masked"), list(e.get("shape") or ())
        loc = e.loc
        line = normaliser_line(a, loc.path) if loc is not None else None
        if line is not None:
            loc = Location(loc.path, line[0])
        written = f"`{line[1]}`" if line is not None else "this softmax"
        return self.finding(
            f"{written} normalises scores of shape {tuple(shape)} over every position, padding "
            f"included, and a masked_fill takes the padding out of its result only afterwards: "
            f"the padded positions held {share:.1%} of each row's weight ({masked:.0%} of the "
            f"positions, {e.get('rows')} rows of different lengths read), so the real "
            f"positions' probabilities sum to less than 1 and the loss trains the scores against "
            f"padding it never sees",
            loc, step=a.next_step_number(e.seq),
            evidence={"share": share, "masked": masked, "rows": e.get("rows"), "shape": shape,
                      "params": pids[:16], "after": True},
            fix=("mask the scores before the softmax (scores.masked_fill(pad, float('-inf'))); "
                 "the fill after it can stay, to turn the padding's -inf into 0"))
