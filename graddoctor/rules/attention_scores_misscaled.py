from __future__ import annotations

import math

from ..findings import Severity
from ..trace import Location
from .base import Rule
from .softmax_wrong_axis import _dim_of


def scaling_line(a, path: str, how: str, ndim: int) -> tuple[int, str] | None:
    """``(line, text)`` of the script's line that scales the scores: a multiplication or
    division by what reads as a scale, moving the scores the way the run saw (up by a square
    root for ``how == "multiplied"``, down for a division by another size's), one whose scaled
    side holds the matrix product first, else the nearest one above a softmax over the last
    axis; else that softmax's line; None when the file has neither."""
    want = "up" if how == "multiplied" else "down"
    softmaxes = [line for line, text, _ in a.source.calls_named(path, {"softmax", "Softmax"})
                 if _dim_of(text) in (-1, ndim - 1)]
    best, best_key = None, None
    for line, text, direction, with_product in a.source.score_scalings(path):
        if direction not in (want, "named"):
            continue
        below = [s - line for s in softmaxes if s >= line]
        key = (direction != want, not with_product, min(below) if below else math.inf)
        if best_key is None or key < best_key:
            best, best_key = (line, text), key
    if best is not None:
        return best
    if softmaxes:
        return softmaxes[0], a.source.line_text(path, softmaxes[0]).strip()
    return None


class AttentionScoresMisscaled(Rule):
    """
    ## What it does
    Finds hand-written attention whose scores are scaled the wrong way before the softmax:
    `q @ k.transpose(-2, -1) * math.sqrt(d)` (multiplied by the square root of the head
    dimension instead of divided), `* d ** 0.5`, a `self.scale = head_dim ** 0.5` applied to the
    scores or to the queries, or a division by the square root of another size than the head
    dimension (`/ math.sqrt(q.size(0))`: the batch, the heads, the sequence length). At the
    first backwards the loss's graph is read: from each softmax over the last axis, down to the
    matrix products that made its scores and on to the projections of Q and K, multiplying the
    constant factors met on the way; the head dimension `d` is the size the product contracts,
    read from the graph's metadata. The factor should be `1/sqrt(d)`. It points at the line of
    the script that scales the scores.

    ## Why is this bad?
    The dot product of two vectors of `d` unit-variance entries has a spread of `sqrt(d)`;
    dividing by `sqrt(d)` brings the scores back to about 1. Multiplied instead, they are `d`
    times too large (64 times for heads of 64): the softmax saturates to one-hot weights, its
    gradient vanishes, and the attention never learns where to look, while the rest of the
    model trains around it and the loss still falls. Divided by the square root of the batch
    or the sequence length, the scores' scale changes with a size that has nothing to do with
    them (and with the last, shorter batch).

    ## Example
    ```python
    scores = q @ k.transpose(-2, -1) * math.sqrt(d)
    weights = F.softmax(scores, dim=-1)
    ```

    ## Use instead
    ```python
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # d = q.size(-1), the head dimension
    weights = F.softmax(scores, dim=-1)
    # or: out = F.scaled_dot_product_attention(q, k, v)
    ```

    ## Stays silent on
    Scores scaled by `1/sqrt(d)`, however it is written (after the product, on the queries, or
    split as `d ** -0.25` on both Q and K) and through `F.scaled_dot_product_attention` (its
    default scale and an explicit `scale=`); scores left unscaled on purpose (T5); `/ d` (muP's
    attention scale); a learned temperature (a parameter, `logit_scale.exp()`); cosine
    attention (Q and K normalised), whose factor is a temperature; ALiBi slopes,
    relative-position biases and additive masks added to the scores; a softmax over logits that
    are no Q@K^T (a distillation temperature over a classifier's output, `h @ W`); heads smaller
    than 8 (a factor of 2 reads as a choice). Not looked at: attention built in another file
    than the backward's is reported at the backward; a scale through `baddbmm`/`addmm`.
    """

    code = "GD157"
    slug = "attention-scores-misscaled"
    severity = Severity.WARNING
    summary = ("attention scores are scaled the wrong way before the softmax: multiplied by "
               "sqrt(d) instead of divided, or divided by the square root of another size")
    fix = "divide by math.sqrt(d) (d = the head dimension), or use F.scaled_dot_product_attention"

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("attention_scale"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids:
                continue  # nothing trained makes the scores
            how, n, d = e.get("how"), e.get("n"), e.get("d")
            shape = list(e.get("shape") or ())
            factor = e.get("factor")
            if how not in ("multiplied", "other_dim") or not d or not n or factor is None:
                continue
            loc = e.loc
            line = scaling_line(a, loc.path, how, len(shape)) if loc is not None else None
            if line is not None:
                loc = Location(loc.path, line[0])
            written = f"`{line[1]}`" if line is not None else "the attention scores"
            if how == "multiplied":
                why = (f"multiplies the scores by sqrt({d}) = {factor:.4g} instead of dividing: "
                       f"they are {d}x larger than 1/sqrt(d) scaling makes them. The softmax "
                       f"saturates to one-hot weights, its gradient vanishes, and the attention "
                       f"stops learning where to look while the loss still falls")
            else:
                why = (f"scales the scores by {factor:.4g} = 1/sqrt({n}), where {n} is another "
                       f"size of the scores {tuple(shape)} (the batch, the heads or the sequence "
                       f"length), not the head dimension {d}: the scores are "
                       f"{math.sqrt(d / n):.3g}x what 1/sqrt(d) makes them, and their scale "
                       f"changes with that size")
            yield self.finding(
                f"{written} {why} (Q@K^T contracts d = {d})",
                loc, step=a.next_step_number(e.seq),
                evidence={"how": how, "n": n, "d": d, "factor": factor, "shape": shape,
                          "params": pids[:16]},
                fix=(f"divide by math.sqrt(d) (d = head dim = {d}), or use "
                     f"F.scaled_dot_product_attention(q, k, v), which does"))
