from __future__ import annotations

import ast
import math
import re

from ..analysis.source import scope_walk
from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_LOSSES = {"cross_entropy", "CrossEntropyLoss", "log_softmax", "LogSoftmax", "nll_loss"}
_INVERSE = re.compile(r"logit_scale|inv_temp|inverse_temp", re.I)  # an inverse temperature: multiplies
_MATMUL_CALLS = ("matmul", "mm", "bmm", "einsum", "cosine_similarity")


def _name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("exp", "clamp", "clamp_max", "clip"):
        node = node.func.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _similarity(node: ast.AST) -> bool:
    """A matrix product of features: ``a @ b.t()``, ``torch.matmul``, ``einsum``."""
    for sub in walk(node):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.MatMult):
            return True
        if isinstance(sub, ast.Call):
            func = sub.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in _MATMUL_CALLS:
                return True
    return False



def _left_of(text: str) -> ast.AST:
    node = ast.parse(text, mode="eval").body
    return node.left if isinstance(node, ast.BinOp) else node


def logit_scale_divisions(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``[(line, the expression, the divisor)]`` for similarity logits (a matrix product of
    features) divided by a learned logit scale (CLIP's ``logit_scale.exp()``, an inverse
    temperature meant to multiply), directly or through a name the scope binds once."""
    found = []
    for scope in [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        bound: dict[str, list] = {}
        for node in scope_walk(scope):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                bound.setdefault(node.targets[0].id, []).append(node.value)
        for node in scope_walk(scope):
            if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _similarity(node.left)):
                continue
            name = _name(node.right)
            if name is None:
                continue
            origin = bound.get(name, [None])
            origin_name = _name(origin[0]) if len(origin) == 1 and origin[0] is not None else None
            if any(_INVERSE.search(n) for n in (name, origin_name) if n is not None):
                found.append((node.lineno, ast.unparse(node), ast.unparse(node.right)))
    return sorted(set(found))




def temperature_line(a, path: str, factor: float) -> tuple[int, str, str] | None:
    """``(line, text, the same divided)`` of the script's multiplication by the temperature (a
    number equal to the factor the run saw, or a name that reads as a temperature): one whose
    other side holds the matrix product first, then the nearest above a loss call; None when the
    file has none."""
    losses = [line for line, _, _ in a.source.calls_named(path, _LOSSES)]
    best, best_key = None, None
    for line, text, divided, with_product, value in a.source.temperature_products(path):
        if value is not None and not math.isclose(value, factor, rel_tol=1e-3):
            continue  # another number (a mixing weight): not what scaled these logits
        below = [loss - line for loss in losses if loss >= line]
        key = (not with_product, min(below) if below else math.inf, value is None)
        if best_key is None or key < best_key:
            best, best_key = (line, text, divided), key
    return best


class ContrastiveTemperatureMultiplied(Rule):
    """
    ## What it does
    Finds a contrastive loss (InfoNCE, SimCLR's NT-Xent, CLIP, SupCon) whose temperature is
    multiplied instead of divided: `logits = z1 @ z2.T * 0.07` with `z1`, `z2` L2-normalised.
    At the first backwards the loss's graph is read: from each `log_softmax` (the one inside
    `cross_entropy` included) down to the matrix products that made its logits (`@`,
    `torch.matmul`, `torch.einsum`, `bmm`), multiplying the constant factors met on the way and
    on either operand. It is reported when both operands are divided by their own norm over the
    dimension the product sums (cosine similarities, within [-1, 1]) and the factor is at most
    0.5. It points at the line of the script that multiplies by the temperature.

    ## Why is this bad?
    Cosine similarities lie in [-1, 1]; a temperature of 0.07 is meant to stretch them to
    [-14.3, 14.3] so the softmax over the candidates can single out the positive. Multiplied,
    they are squeezed into [-0.07, 0.07]: the softmax is nearly uniform whatever the embeddings
    are, the positive never gets much more probability than the negatives, the loss sits near
    log(N) and its gradient is about 200 times too small. The model still trains, barely, and
    nothing fails.

    ## Example
    ```python
    z1, z2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    logits = z1 @ z2.T * 0.07
    loss = F.cross_entropy(logits, torch.arange(len(z1)))
    ```

    ## Use instead
    ```python
    logits = z1 @ z2.T / 0.07
    loss = F.cross_entropy(logits, torch.arange(len(z1)))
    ```

    ## Stays silent on
    A temperature divided (`/ 0.07`, `* (1 / tau)`); a learned temperature (a parameter,
    CLIP's `logit_scale.exp()`); dot products of embeddings that are not normalised (their
    logits can have any size); factors above 0.5 and a temperature of 1; cosine similarities in
    a regression, MSE or margin loss (no softmax over candidates); cosine attention (a softmax
    feeding a product, not a loss's log_softmax: `attention-scores-misscaled`'s business).
    Not looked at: similarities from `F.cosine_similarity` (no matrix product); a normalised
    parameter as one side (a cosine classifier's weight).

    The learned form's inverse is found in the source too: similarity logits (a matrix product
    of features) divided by a learned logit scale (`image_features @ text_features.t() /
    logit_scale` with `logit_scale = self.logit_scale.exp()`), which is an inverse temperature
    meant to multiply them; it points at the division. Attention's `q @ k.T / self.scale` (a
    scale not named for logits) stays silent.
    """

    code = "GD163"
    slug = "contrastive-temperature-multiplied"
    severity = Severity.WARNING
    summary = ("a contrastive loss multiplies its cosine similarities by the temperature "
               "instead of dividing: the logits stay within [-tau, tau]")
    fix = "divide by the temperature: logits = z1 @ z2.T / tau"

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("temperature_multiplied"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            factor = e.get("factor")
            if not pids or not factor:
                continue  # nothing trained makes the logits
            shape = list(e.get("shape") or ())
            loc = e.loc
            line = temperature_line(a, loc.path, factor) if loc is not None else None
            if line is not None:
                loc = Location(loc.path, line[0])
            written = f"`{line[1]}`" if line is not None else "the contrastive logits"
            fix = (f"divide by the temperature: `{line[2]}`" if line is not None else
                   f"divide by the temperature: logits = z1 @ z2.T / {factor:.4g}")
            yield self.finding(
                f"{written} multiplies cosine similarities (both sides L2-normalised) by "
                f"{factor:.4g} before the loss's softmax over {shape[-1] if shape else 'the'} "
                f"candidates: the logits stay within [-{factor:.3g}, {factor:.3g}], so the "
                f"softmax is nearly uniform, the positive can never stand out, the loss sits "
                f"near log(N) and the gradient through the logits is scaled by {factor:.3g} instead "
                f"of {1 / factor:.3g}",
                loc, step=a.next_step_number(e.seq),
                evidence={"factor": factor, "shape": shape, "params": pids[:16]},
                fix=fix)
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, divisor in logit_scale_divisions(tree):
                yield self.finding(
                    f"`{text}` divides the similarities by `{divisor}`, a learned logit scale (an "
                    f"inverse temperature, e^2.66 ≈ 14 at CLIP's start) meant to multiply them: "
                    f"the logits shrink instead of sharpening, the softmax over the batch is "
                    f"nearly uniform and the contrastive gradient is weak",
                    Location(path, line), evidence={"expression": text, "divisor": divisor,
                                                    "how": "logit scale divides"},
                    fix=f"multiply by the logit scale: `{divisor} * {ast.unparse(_left_of(text))}`")
