"""Which torch loss function a node of the loss's graph is: one place for the watchers that
find "the loss node" of a backward.

Most of torch's losses record one autograd node of their own (``MseLossBackward0``,
``NllLossBackward0``) that saves the target, and a watcher finds them by the node's class.
Some do not: in this torch ``F.l1_loss`` is ``abs`` then ``mean`` (``MeanBackward0``), and
``kl_div``, ``poisson_nll_loss``, ``gaussian_nll_loss``, ``hinge_embedding_loss`` and
``multilabel_soft_margin_loss`` are composites of plain ops too, so a lookup by class missed an
L1 loss entirely. Those functions are wrapped (``COMPOSITES``) until ``WINDOW`` backwards have
run, then put back: a call from eager code whose result has a graph gets its top node tagged,
in the node's own ``metadata`` (kept with the C++ node, whichever Python object a later walk
gets for it), with the function's name, its target, the node its input came from and the input's values; the tags
are taken off once the backward's watchers have read them. ``loss_of(node)`` then answers for
both kinds alike (``LossCall``).

What it costs: a wrapper call per composite loss call, first ``WINDOW`` backwards only; nothing
for the losses that record their own node. Nothing the script computes changes (a node's
``metadata`` is a dict torch keeps for its users; one key is added to it).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .graphpaths import saved
from .inlinable import watched_call
from .patcher import put_back
from .recorder import Recorder
from .topics import DESCRIBE_LOSS

WINDOW = 8  # backwards during which composite losses are tagged
_KEY = "graddoctor.loss"  # the key of a tagged node's metadata

# node class -> the function whose own node it is (its saved target: ``_saved_target``)
NATIVE = {
    "NllLossBackward0": "nll_loss", "NllLoss2DBackward0": "nll_loss",
    "MseLossBackward0": "mse_loss", "L1LossBackward0": "l1_loss",
    "SmoothL1LossBackward0": "smooth_l1_loss", "HuberLossBackward0": "huber_loss",
    "BinaryCrossEntropyBackward0": "binary_cross_entropy",
    "BinaryCrossEntropyWithLogitsBackward0": "binary_cross_entropy_with_logits",
    "SoftMarginLossBackward0": "soft_margin_loss", "MultiMarginLossBackward0": "multi_margin_loss",
    "MultilabelMarginLossBackward0": "multilabel_margin_loss", "KlDivBackward0": "kl_div",
}
# the functions built of plain ops in this torch (no node of their own): (owner, name), each
# with its (input, target) taken from the first two arguments
COMPOSITES = tuple((F, name) for name in (
    "l1_loss", "kl_div", "poisson_nll_loss", "gaussian_nll_loss", "hinge_embedding_loss",
    "multilabel_soft_margin_loss"))
COMPOSITE_FNS = frozenset(name for _, name in COMPOSITES)
REGRESSIONS = frozenset({"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"})
# the losses whose value is never negative whatever the data (a Poisson or Gaussian NLL is: its
# log-rate or log-variance term goes below 0)
NONNEGATIVE = frozenset(NATIVE.values()) | {"l1_loss", "kl_div", "hinge_embedding_loss",
                                             "multilabel_soft_margin_loss"}

# the class names of the top nodes tagged so far: a walk reads the metadata of those only
_tagged_tops: set = set()


class LossCall(NamedTuple):
    """A loss function's call seen from its node: its name (``mse_loss``), its target (None
    when not kept), the node its input came through (None: an input without graph), and
    whether it reduced the elements to one value (``reduction`` other than ``"none"``; None
    when not known), and its input's values (detached; None when not kept)."""
    fn: str
    target: object
    input_node: object
    reduced: bool | None
    input: object = None


def loss_of(node) -> LossCall | None:
    """The loss function ``node`` is the top node of, None for any other node."""
    name = type(node).__name__
    fn = NATIVE.get(name)
    if fn is not None:
        nexts = node.next_functions
        reduction = saved(node, "_saved_reduction")
        scores = saved(node, "_saved_self")
        return LossCall(fn, saved(node, "_saved_target"), nexts[0][0] if nexts else None,
                        None if not isinstance(reduction, int) else reduction != 0,
                        scores.detach() if isinstance(scores, torch.Tensor) else None)
    if name not in _tagged_tops:
        return None
    try:
        tag = node.metadata.get(_KEY)
    except Exception:
        return None
    if tag is None:
        return None
    return LossCall(*tag)


def tagged_top_names() -> frozenset:
    """The node classes a composite loss's top node has had so far (``MeanBackward0``...)."""
    return frozenset(_tagged_tops)


class CompositeLossWatcher:
    """Tags the top node of each composite loss call (``COMPOSITES``) for ``loss_of``."""

    def __init__(self, rec: Recorder):
        self.rec = rec
        self._open = True
        self._backwards = 0
        self._restore: list = []  # (owner, name, original, wrapper)
        self._tags: list = []  # the metadata dicts tagged since the last backward

    def install(self, patcher) -> None:
        for owner, name in COMPOSITES:
            original = getattr(owner, name, None)
            if original is None:
                continue
            wrapper = patcher.patch(owner, name, watched_call(original, self._after(name)))
            self._restore.append((owner, name, original, wrapper))

    def _after(self, fn: str):
        def after(args, kwargs, result) -> None:
            if not self._open:
                return
            try:
                node = getattr(result, "grad_fn", None)
                if node is None:
                    return
                scores = args[0] if args else kwargs.get("input")
                target = args[1] if len(args) > 1 else kwargs.get("target")
                input_node = getattr(scores, "grad_fn", None) if isinstance(scores, torch.Tensor) else None
                kept = target if isinstance(target, torch.Tensor) else None
                legacy = len(args) > 2 or "size_average" in kwargs or "reduce" in kwargs
                reduction = kwargs.get("reduction", "mean")
                reduced = None if legacy or not isinstance(reduction, str) else reduction != "none"
                metadata = node.metadata
                values = scores.detach() if isinstance(scores, torch.Tensor) else None
                metadata[_KEY] = (fn, kept, input_node, reduced, values)
                self._tags.append(metadata)
                _tagged_tops.add(type(node).__name__)
            except Exception as exc:
                self._close()
                self.rec.internal_error("composite loss", exc)
        return after

    def describe_loss(self, tensors) -> dict:
        """``DESCRIBE_LOSS``, subscribed after every watcher that reads the tags: they are
        taken off again (the targets let go of, as a loss's own node lets go of what it saved),
        and the wrappers are put back after ``WINDOW`` backwards."""
        self._backwards += 1
        tags, self._tags = self._tags, []
        for metadata in tags:
            metadata.pop(_KEY, None)
        if self._open and self._backwards >= WINDOW:
            self._close()
        return {}

    def _close(self) -> None:
        if not self._open:
            return
        self._open = False
        self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
        restore, self._restore = self._restore, []
        for owner, name, original, wrapper in restore:
            try:  # not from under another watcher's wrapper
                put_back(owner, name, original, wrapper)
            except Exception as exc:
                self.rec.internal_error("composite loss", exc)

