"""Per-sample factors (sample weights, a focal loss's modulating factor, a mask) multiplied into
a loss that torch already reduced over the batch.

``loss = criterion(out, y)`` with the default ``reduction="mean"`` is one number; ``(loss *
w).mean()`` with ``w`` of shape (N,) is then ``loss * w.mean()``: every sample is weighted by the
batch's mean weight, not its own. A focal loss written on top of
``F.binary_cross_entropy_with_logits(logits, y)`` without ``reduction="none"`` turns
``alpha_t * (1 - p_t) ** gamma`` into one batch-wide factor: the hard samples are no longer
weighted up. Nothing fails: the product broadcasts a 0-d tensor, and the loss still falls.

How it is seen: at the first ``_WINDOWS`` backwards (``DESCRIBE_LOSS``), the loss's graph is
walked once (at most ``_NODES`` nodes) for ``MulBackward0`` nodes one of whose two inputs comes
straight from one of torch's loss nodes (``_LOSS_NODES``) saved with a reduction (mean or sum),
whose other factor (the tensor the product saved for that input's gradient) has one row per
sample: dim 0 as long as the loss's input's, ``_MIN_BATCH`` rows or more, more than one element.
Each kind of such product (loss, reduction, shapes) becomes one ``weighted_reduced`` aside event
at the backward's line; the rule finds the reduced call in the script's source. Shapes and saved
reductions only: no value is read, nothing under saved-tensor hooks is unpacked
(``graphpaths.saved``).
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import post_order, saved
from .losswindow import LossWindow
from .recorder import Recorder

_WINDOWS = 3  # backwards whose losses are looked at
_NODES = 20000  # graph nodes walked per backward
_MIN_BATCH = 4  # fewer rows than this could be a few tasks' weights as well as samples
# torch's loss nodes that save their reduction (0 none, 1 mean, 2 sum), and the function's name
_LOSS_NODES = {
    "MseLossBackward0": "mse_loss",
    "BinaryCrossEntropyWithLogitsBackward0": "binary_cross_entropy_with_logits",
    "BinaryCrossEntropyBackward0": "binary_cross_entropy",
    "NllLossBackward0": "cross_entropy",
    "NllLoss2DBackward0": "cross_entropy",
    "SmoothL1LossBackward0": "smooth_l1_loss",
    "HuberLossBackward0": "huber_loss",
    "SoftMarginLossBackward0": "soft_margin_loss",
    "MultiMarginLossBackward0": "multi_margin_loss",
    "MultilabelMarginLossBackward0": "multilabel_margin_loss",
}
_REDUCTIONS = {1: "mean", 2: "sum"}


def per_sample_factor(factor_shape: tuple, loss_input_shape: tuple) -> bool:
    """Whether a factor of ``factor_shape`` holds one value (or row) per sample of a loss whose
    input had ``loss_input_shape``."""
    if not factor_shape or not loss_input_shape:
        return False
    batch = loss_input_shape[0]
    numel = 1
    for size in factor_shape:
        numel *= size
    return batch >= _MIN_BATCH and factor_shape[0] == batch and numel > 1


class ReducedWeightWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.loss_window = LossWindow(rec, _WINDOWS)
        self._told: set = set()

    def install(self, patcher) -> None:  # subscribed at construction
        pass

    def describe_loss(self, tensors) -> dict:
        if not self.loss_window.take():
            return {}
        try:
            self._look(tensors)
        except Exception as exc:
            self.rec.internal_error("per-sample factor on a reduced loss", exc)
        return {}

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            for node in post_order(root, _NODES) or ():
                if type(node).__name__ != "MulBackward0":
                    continue
                inputs = node.next_functions
                if len(inputs) != 2:
                    continue
                for side, (child, _) in enumerate(inputs):
                    fn = _LOSS_NODES.get(type(child).__name__) if child is not None else None
                    if fn is None:
                        continue
                    reduction = _REDUCTIONS.get(saved(child, "_saved_reduction"))
                    loss_input = saved(child, "_saved_self")
                    # the other factor, saved by the product for this side's gradient
                    factor = saved(node, "_saved_other" if side == 0 else "_saved_self")
                    if reduction is None or not isinstance(loss_input, torch.Tensor) \
                            or not isinstance(factor, torch.Tensor):
                        continue
                    input_shape = tuple(int(s) for s in loss_input.shape)
                    factor_shape = tuple(int(s) for s in factor.shape)
                    if not per_sample_factor(factor_shape, input_shape):
                        continue
                    key = (fn, reduction, input_shape, factor_shape)
                    if key in self._told:
                        continue
                    self._told.add(key)
                    self.rec.emit_aside(ev.weighted_reduced(
                        fn=fn, reduction=reduction, input_shape=list(input_shape),
                        factor_shape=list(factor_shape), factor_grad=bool(factor.requires_grad)),
                        self.rec.here())
