"""A straight-through estimator written without its ``.detach()`` (straight-through-not-detached).

A straight-through estimator passes a non-differentiable value forward and a differentiable
one's gradient backward: ``z + (z_q - z).detach()`` (VQ-VAE), ``y_hard - y_soft.detach() +
y_soft`` (hard Gumbel-softmax), ``x + (torch.round(x) - x).detach()`` (quantisation-aware
training), ``w + (torch.sign(w) - w).detach()`` (binary weights). Without the detach, the sum
``z + (z_q - z)`` is ``z_q`` in value *and* in gradient: ``z`` is added once and subtracted
once, so the two gradients it gets along the sum cancel exactly, and the encoder (the logits,
the full-precision weights) gets nothing through the estimator. Nothing fails: the model trains
on whatever other terms reach those parameters (a commitment loss, a KL), or not at all.

Read at the first ``WINDOW`` backwards (``DESCRIBE_LOSS``), on the script's thread: the
loss's graph is walked (``_NODES`` nodes at most) for an ``AddBackward0`` whose two inputs are a
node ``X`` and a ``SubBackward0`` whose subtracted input is ``X`` itself (``x + (y - x)``,
``(y - x) + x``, ``y - x + x``), or a ``SubBackward0`` of ``X`` and a ``SubBackward0`` of ``X``
and something (``x - (x - y)``), every ``alpha`` 1: a ``straight_through_cancelled`` aside at
the backward's line, once per backward line. A sum that scales the difference (``x + (y - x) *
t``, an interpolation), a detached difference (no node: nothing to cancel), a difference of
another tensor (``x + (f(x) - x.mean())``) and ``x - x.detach()`` are not this shape.
"""

from __future__ import annotations

from threading import get_ident

from .. import events as ev
from .dropoutout import backward_roots
from .graphpaths import saved
from .recorder import Recorder

WINDOW = 3  # backwards whose graphs are walked
_NODES = 20000  # nodes of one loss's graph walked, at most
_FOUND = 8  # cancelling sums described in one event, at most


def _inputs(node) -> list:
    return [child for child, _ in node.next_functions]


def _alpha_one(node) -> bool:
    alpha = saved(node, "_saved_alpha", 1)
    try:
        return float(alpha) == 1.0
    except (TypeError, ValueError):
        return False


def _is(node, name: str) -> bool:
    return node is not None and type(node).__name__ == name and _alpha_one(node)


def cancelling(node) -> tuple[str, object] | None:
    """``(form, X)`` when ``node`` sums a node ``X`` with a difference that subtracts ``X``
    again, so that ``X``'s gradient along the sum is exactly zero; else None."""
    name = type(node).__name__
    if name not in ("AddBackward0", "SubBackward0") or not _alpha_one(node):
        return None
    inputs = _inputs(node)
    if len(inputs) != 2:
        return None
    first, second = inputs
    if name == "AddBackward0":
        for kept, diff in ((first, second), (second, first)):
            if kept is not None and _is(diff, "SubBackward0"):
                taken = _inputs(diff)
                if len(taken) == 2 and taken[1] is kept:
                    return "add", kept
        return None
    # x - (x - y)
    if first is not None and _is(second, "SubBackward0"):
        taken = _inputs(second)
        if len(taken) == 2 and taken[0] is first:
            return "sub", first
    return None


class StraightThroughWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.active = True
        self._backwards = 0
        self._told: set = set()

    def install(self, patcher) -> None:  # subscribed by Instrumentation
        pass

    def describe_loss(self, tensors) -> dict:
        if not self.active or get_ident() != self.rec.script_thread:
            return {}
        try:
            self._backwards += 1
            if self._backwards >= WINDOW:
                self.active = False
            found = []
            for root in backward_roots(tensors):
                found += self._walk(root)
            if found:
                loc = self.rec.here()
                key = (loc.path, loc.line) if loc is not None else None
                if key not in self._told:
                    self._told.add(key)
                    self.rec.emit_aside(ev.straight_through_cancelled(
                        forms=[form for form, _ in found[:_FOUND]],
                        kept=[name for _, name in found[:_FOUND]]), loc)
        except Exception as exc:
            self.active = False
            self.rec.internal_error("straight-through sums", exc)
        return {}

    @staticmethod
    def _walk(root) -> list[tuple[str, str]]:
        """The cancelling sums below ``root``: (form, the class name of the cancelled node)."""
        seen: set = set()
        stack = [root]
        found = []
        while stack and len(seen) < _NODES:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            hit = cancelling(node)
            if hit is not None:
                found.append((hit[0], type(hit[1]).__name__))
            stack.extend(child for child, _ in node.next_functions if child is not None)
        return found
