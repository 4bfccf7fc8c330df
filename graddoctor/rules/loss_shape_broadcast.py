from __future__ import annotations

from dataclasses import replace

from ..findings import Severity
from ..trace import Location
from .base import Rule

# what minimising the loss over every (prediction, target) pair fits each prediction to
_FITS = {"mse_loss": "the mean of the batch's targets", "l1_loss": "the median of the batch's targets",
         "the hand-written squared error": "the mean of the batch's targets",
         "the hand-written absolute error": "the median of the batch's targets"}


def misaligned(a, b) -> bool:
    """The same data in two layouts that differ only by size-1 dimensions and their number:
    (N, 1) against (N,), (B, 1, H, W) against (B, H, W). Broadcasting them pairs every element of
    one with every element of the other, which nobody means. A broadcast both ways between
    tensors of one rank, (N, 1) against (1, M), took an explicit unsqueeze on each side: a
    pairwise comparison, perhaps deliberate."""
    return len(a) != len(b) and [d for d in a if d != 1] == [d for d in b if d != 1]


def _shape(shape) -> str:
    """(8, 1), (8,), ()"""
    dims = list(shape or ())
    return f"({dims[0]},)" if len(dims) == 1 else "(" + ", ".join(map(str, dims)) + ")"


class LossShapeBroadcast(Rule):
    """
    ## What it does
    Finds regression losses (`mse_loss`, `l1_loss`, `smooth_l1_loss`, `huber_loss`, functional
    or as `nn.MSELoss`, ...) whose input and target have different shapes that broadcast to a
    larger one — typically a prediction of shape `(N, 1)` against a target of shape `(N,)`. It
    points at the loss call. The same error written by hand (`((pred - y) ** 2).mean()`,
    `(pred - y).abs().mean()`, in the loop or in a function of the script) is read from the
    loss's graph at the first backwards: a squared or absolute difference of shape `(N, N)`
    between a computed `(N, 1)` (or `(N,)`) side and a target with no gradient; it points at
    the line that computes the difference; a side assigned on an earlier line by a
    `.squeeze(dim)` on the wrong dim (`pred = model(x).squeeze(0)` of an `(N, 1)` output: a
    no-op) is pointed at that line. Equal shapes, a scalar target and a target that only expands along
    the input (`(N, D)` against `(D,)`) are not reported. Other broadcasts that grow both sides
    (`(N, 1)` against `(1, M)`: a pairwise comparison, perhaps deliberate) are reported as info,
    and not at all with `reduction='none'`, which keeps the pairwise tensor. A target that only
    expands is reported when it is a slice of a tensor shaped like the prediction along the
    dims it expands on (`yb[:, :1]` of a `(N, 3)` batch against `(N, 3)` outputs: every output
    trained toward one column); an ensemble's `(N, K)` outputs against `y.unsqueeze(1)` are not.

    ## Why is this bad?
    `(N, 1)` and `(N,)` broadcast to `(N, N)`: every prediction is compared with every target of
    the batch. The loss still goes down, but the optimum predicts the same value for every
    sample (the mean of the targets for MSE, their median for L1): the model learns nothing
    about the inputs. torch only prints a UserWarning.

    ## Example
    ```python
    pred = model(x)             # (N, 1)
    loss = F.mse_loss(pred, y)  # y: (N,)
    ```

    ## Use instead
    ```python
    pred = model(x).squeeze(-1)  # (N,)
    loss = F.mse_loss(pred, y)
    ```

    ## Stays silent on
    Matching shapes and the broadcasts that are meant: a 0-d target, a per-feature target
    (D,) or a (1, D) row against (N, D), one target column made by `unsqueeze` or `[:, None]`
    for K heads of an ensemble, `reduction='none'` terms, pairwise terms with both
    sides unsqueezed on purpose; hand-written pairwise terms whose two sides are both computed
    (`s[:, None] - s[None, :]`), and differences against `M != N` centres. A hand-written
    difference against a target of shape `(N, N)` would read as a broadcast (no regression
    target has that shape).
    """

    code = "GD211"
    slug = "loss-shape-broadcast"
    severity = Severity.WARNING
    summary = "a regression loss broadcasts input (N, 1) against target (N,) to an N×N loss"
    fix = "make the shapes equal: pred.squeeze(-1) for a (N,) target, or y.view_as(pred)"

    def check(self, a):
        for e in a.of_kind("loss_broadcast"):
            fn = e.get("fn", "mse_loss")
            given, target, shape = _shape(e.get("input_shape")), _shape(e.get("target_shape")), _shape(e.get("shape"))
            kept = (f" (reduction='none' returns that {shape} tensor)"
                    if e.get("reduction") == "none" else "")
            evidence = {"function": fn, "input_shape": list(e.get("input_shape") or ()),
                        "target_shape": list(e.get("target_shape") or ()), "shape": list(e.get("shape") or ()),
                        "grad": bool(e.get("grad"))}
            step = a.next_step_number(e.seq) if e.get("grad") else (a.steps_before(e.seq) or None)
            loc = e.loc
            if fn.startswith("the hand-written") and loc is not None:  # seen at the backward
                found = a.source.error_line(loc.path, loc.line)
                if found is not None:
                    loc = Location(loc.path, found[0])
            if e.get("narrowed_from"):
                base = _shape(e.get("narrowed_from"))
                evidence["narrowed_from"] = list(e.get("narrowed_from"))
                yield self.finding(
                    f"{fn} compares input {given} with target {target}, a slice of a {base} "
                    f"tensor shaped like the input: the target broadcasts, so every output "
                    f"column is trained toward the one column the slice kept and the columns it "
                    f"dropped are never the target of anything",
                    loc, step=step, evidence=evidence,
                    fix="compare each output with its own target column: pass the whole tensor "
                        "(or slice the prediction the same way)")
                continue
            if not misaligned(evidence["input_shape"], evidence["target_shape"]):
                if e.get("reduction") == "none":
                    continue  # both sides grow and the whole pairwise tensor is kept: meant
                yield self.finding(
                    f"{fn} compares input {given} with target {target} broadcast to {shape}, more "
                    f"elements than either: each input is compared with several targets{kept}. "
                    f"If this pairwise comparison is deliberate, nothing is wrong; otherwise make "
                    f"the shapes equal",
                    loc, severity=Severity.INFO, step=step,
                    evidence=evidence)
                continue
            if e.get("grad"):
                effect = (f"training fits every prediction to {_FITS.get(fn, 'one value for the whole batch')} "
                          f"instead of its own target")
            else:
                effect = "the value computed here (a validation loss, a metric) is not the per-sample error"
            fix, squeezed = None, None
            if loc is not None and not fn.startswith("the hand-written"):
                # the side that kept its size-1 dim was squeezed on another dim on the line that
                # made it (`pred = model(x).squeeze(0)` of an (N, 1) output): that is the line
                # to change
                side = 0 if len(evidence["input_shape"]) > len(evidence["target_shape"]) else 1
                squeezed = a.source.squeeze_assignment(loc.path, loc.line, side)
            if squeezed is not None:
                kept_shape = given if side == 0 else target
                effect += (f"; `{squeezed[1]}` squeezes dim {squeezed[2]}, which is not of size 1, "
                           f"so it changes nothing and the tensor keeps its shape {kept_shape}")
                fix = (f"squeeze the size-1 dim: `{squeezed[1].replace(f'.squeeze({squeezed[2]})', '.squeeze(-1)')}`")
                evidence["loss_line"] = loc.line
                loc = replace(loc, line=squeezed[0])
            yield self.finding(
                f"{fn} compares input {given} with target {target}: they broadcast to {shape}, so every "
                f"prediction is compared with every target of the batch{kept} — {effect}",
                loc, step=step, fix=fix,
                evidence=evidence)
