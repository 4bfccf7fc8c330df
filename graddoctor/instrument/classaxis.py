"""Class scores normalised over one axis while the loss picks the target's class along another.

A sequence tagger's ``log_softmax(scores, dim=1)`` on (batch, time, tags) scores normalises each
tag over the time steps; ``logp.gather(2, tags[..., None])`` then reads, at each step, the entry
of the target tag: a number that is no log-probability over the tags. A segmentation loss's
``softmax(logits, dim=-1)`` on (N, C, H, W) logits read with ``gather(1, mask[:, None])`` or
multiplied by a one-hot mask laid out (N, C, H, W) is the same. The shapes agree and the loss
falls.

How it is seen: at the first ``_WINDOWS`` backwards (``DESCRIBE_LOSS``), the loss's graph is
walked once (at most ``_NODES`` nodes) for the two ways a loss reads the target's class:

* ``GatherBackward0`` over axis ``g`` whose input is, through ops that keep every element in
  place (``_IN_PLACE``: log, exp, clamps, negation, a power, arithmetic with a number), the
  result of a ``SoftmaxBackward0`` / ``LogSoftmaxBackward0`` over another axis ``d``, with an
  index as long as the scores along ``d`` whose values differ along ``d``. An index constant
  along ``d`` (expanded over the classes) picks whole distributions, a time step or a row, and
  is left alone.
* ``MulBackward0`` of such a (log-)softmax result by a tensor without gradient of the same
  shape that is a distribution over another axis ``a`` (its values at least 0, summing to 1
  along ``a``, a one-hot mask or soft targets; positions an ignore mask zeroed sum to 0) and
  not over ``d``; or of such a result indexed
  per sample on its leading axes, ``d`` among them (``log_softmax(out, dim=1)[arange(B), a]``
  of a distributional Q-network's (batch, actions, atoms) output), by a distribution along a
  remaining axis: each row is then one entry of distributions over the indexed axis.

Each finding becomes a ``class_axis`` aside event (the function, the scores' shape, the axis
normalised, the axis the target picks, how) at the backward's line; the rule finds the call in
the script's source. Only shapes and the values of the index or of the target tensor the node
saved are read (a few thousand elements at most, ``_VALUES``), never under saved-tensor hooks
(``graphpaths.saved``).
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import post_order, saved, saved_dims
from .losswindow import LossWindow
from .recorder import Recorder

_WINDOWS = 3  # backwards whose losses are looked at
_NODES = 20000  # graph nodes walked per backward
_DEPTH = 8  # in-place ops followed from the pick down to the softmax
_VALUES = 1 << 22  # elements of an index or target read at most
_DISTRIBUTED = 0.5  # share of a target's positions summing to 1 (the others masked to 0), at least
_KINDS = {"SoftmaxBackward0": "softmax", "LogSoftmaxBackward0": "log_softmax"}
# ops that keep each element where it was: the softmax's axis is the pick's axis
_IN_PLACE = frozenset({
    "LogBackward0", "ExpBackward0", "NegBackward0", "ClampBackward1", "ClampMinBackward0",
    "ClampMaxBackward0", "PowBackward0", "AddBackward1", "SubBackward1", "RsubBackward1",
    "MulBackward1", "DivBackward1", "CloneBackward0", "Log1pBackward0"})
# arithmetic that keeps the elements in place when only one operand carries gradient (the other
# a number or a constant tensor)
_ONE_OPERAND = frozenset({"AddBackward0", "SubBackward0", "MulBackward0", "DivBackward0"})


def _shape(node, name: str) -> tuple[int, ...] | None:
    value = saved(node, name)
    if isinstance(value, torch.Tensor):
        return tuple(int(s) for s in value.shape)
    return None


def _normaliser(node) -> tuple[str, object] | None:
    """The (log-)softmax node that ``node`` is, or that it reads through in-place ops."""
    for _ in range(_DEPTH):
        if node is None:
            return None
        name = type(node).__name__
        if name in _KINDS:
            return _KINDS[name], node
        children = [child for child, _ in node.next_functions if child is not None]
        if name not in _IN_PLACE and not (name in _ONE_OPERAND and len(children) == 1):
            return None
        node = children[0] if children else None
    return None


def _softmax_axis(node) -> tuple[int, tuple[int, ...]] | None:
    dim, shape = saved_dims(node), _shape(node, "_saved_result")
    if not isinstance(dim, int) or shape is None or len(shape) < 2:
        return None
    return dim % len(shape), shape


def varies_along(index: torch.Tensor, dim: int) -> bool:
    """Whether ``index`` holds different values along ``dim``."""
    if index.dim() <= dim or index.shape[dim] < 2:
        return False
    return bool((index != index.narrow(dim, 0, 1)).any())


def distribution_axis(target: torch.Tensor, atol: float = 1e-4) -> set[int]:
    """The axes (longer than 1) along which ``target`` is a distribution: values at least 0
    summing to 1 — or to 0 at a minority of positions, all of whose entries an ignore mask
    zeroed (``one_hot * valid`` of a segmentation loss with ignored pixels)."""
    if not target.is_floating_point() or target.dim() < 2 or bool((target < 0).any()):
        return set()
    axes = set()
    for axis in range(target.dim()):
        if target.shape[axis] < 2:
            continue
        sums = target.sum(axis)
        one = (sums - 1).abs() <= atol
        if bool((one | (sums == 0)).all()) and float(one.float().mean()) >= _DISTRIBUTED:
            axes.add(axis)
    return axes


class ClassAxisWatcher:
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
            self.rec.internal_error("class axis", exc)
        return {}

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            for node in post_order(root, _NODES) or ():
                name = type(node).__name__
                if name == "GatherBackward0":
                    self._gathered(node)
                elif name == "MulBackward0":
                    self._multiplied(node)

    def _emit(self, fn: str, shape: tuple, dim: int, picked: int, how: str) -> None:
        key = (fn, shape, dim, picked, how)
        if key in self._told:
            return
        self._told.add(key)
        self.rec.emit_aside(ev.class_axis(fn=fn, shape=list(shape), dim=dim, picked=picked,
                                          how=how), self.rec.here())

    def _gathered(self, node) -> None:
        found = _normaliser(node.next_functions[0][0]) if node.next_functions else None
        if found is None:
            return
        fn, softmax = found
        axis = _softmax_axis(softmax)
        index = saved(node, "_saved_index")
        dim = saved_dims(node)
        if axis is None or not isinstance(index, torch.Tensor) or not isinstance(dim, int):
            return
        d, shape = axis
        g = dim % len(shape)
        if g == d or index.dim() != len(shape) or index.numel() > _VALUES:
            return
        if index.shape[d] != shape[d] or not varies_along(index, d):
            return  # whole distributions picked (a time step, a row): not a class per position
        self._emit(fn, shape, d, g, "gather")

    def _multiplied(self, node) -> None:
        edges = node.next_functions
        if len(edges) != 2:
            return
        for mine, other, name in ((0, 1, "_saved_other"), (1, 0, "_saved_self")):
            if edges[mine][0] is None or edges[other][0] is not None:
                continue
            target = saved(node, name)
            if not isinstance(target, torch.Tensor) or target.requires_grad or target.numel() > _VALUES:
                continue
            found = _normaliser(edges[mine][0])
            if found is None:
                self._picked_rows(edges[mine][0], target)
                continue
            fn, softmax = found
            axis = _softmax_axis(softmax)
            if axis is None:
                continue
            d, shape = axis
            if tuple(target.shape) != shape:
                continue
            axes = distribution_axis(target.detach())
            if len(axes) != 1 or d in axes:
                continue  # a distribution along the normalised axis, or along several (a permutation)
            self._emit(fn, shape, d, axes.pop(), "target")

    def _picked_rows(self, node, target: torch.Tensor) -> None:
        """A (log-)softmax over axis ``d`` indexed per sample on its leading axes, ``d`` among
        them (``log_softmax(out, dim=1)[arange(B), actions]`` of (B, actions, atoms) scores),
        multiplied by a distribution along a remaining axis: each row read is one entry of
        distributions over the indexed axis, not a distribution over the target's axis."""
        for _ in range(_DEPTH):
            if node is None or type(node).__name__ == "IndexBackward0":
                break
            children = [child for child, _ in node.next_functions if child is not None]
            name = type(node).__name__
            if name not in _IN_PLACE and not (name in _ONE_OPERAND and len(children) == 1):
                return
            node = children[0] if children else None
        if node is None or type(node).__name__ != "IndexBackward0" or not node.next_functions:
            return
        found = _normaliser(node.next_functions[0][0])
        indices = saved(node, "_saved_indices")
        if found is None or not isinstance(indices, (list, tuple)) or not indices:
            return
        fn, softmax = found
        axis = _softmax_axis(softmax)
        if axis is None:
            return
        d, shape = axis
        k = len(indices)
        if not all(isinstance(i, torch.Tensor) and i.dim() == 1 and not i.is_floating_point()
                   and i.dtype != torch.bool and i.shape == indices[0].shape for i in indices):
            return  # only per-sample picks on the leading axes, one index tensor each
        if d >= k or k >= len(shape) or tuple(target.shape) != (indices[0].shape[0], *shape[k:]):
            return
        axes = distribution_axis(target.detach())
        if len(axes) != 1 or 0 in axes:
            return
        self._emit(fn, shape, d, axes.pop() - 1 + k, "target")
