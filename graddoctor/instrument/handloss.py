"""A hand-written regression error whose prediction and target broadcast to every pair of the
batch: ``((pred - y) ** 2).mean()`` with ``pred`` of shape (N, 1) and ``y`` of shape (N,).

``F.mse_loss`` and its kin are watched at their call (``losses.py``: ``loss_broadcast``); the
same error written by hand is a subtraction no wrapper sees. At the first ``_LOOKED`` backwards
of each backward line, the loss's linear top (sums, means, constant factors:
``lossterms.signed_walk``) is walked down to a square or an absolute value of a difference
whose one side carries the gradient and the other none (the target). The shapes come from the
autograd nodes' metadata (no saved tensor is read): a difference of shape (N, N), N > 1, whose
computed side is (N, 1) or (N,) can only have met a target of the other layout, (N,) or (N, 1)
(or one of (N, N), which no regression target is). Such a difference becomes a ``loss_broadcast``
aside event (fn ``the hand-written squared error`` / ``absolute error``) at the backward's line;
the rule finds the line that computes the difference. Pairwise terms with both sides computed
(``pred[:, None] - pred[None, :]``) carry gradient on both sides: not looked at.
"""

from __future__ import annotations

from .. import events as ev
from .lossterms import LossGraphReader, signed_walk

_LOOKED = 3  # backwards of each backward line looked at
_LINES = 8  # backward lines looked at, at most
_NODES = 512  # nodes of the loss's linear top walked
_ERRORS = {"PowBackward0": "the hand-written squared error", "AbsBackward0": "the hand-written absolute error"}


def _shape(node) -> tuple | None:
    """The shape of the value ``node``'s forward made (from its metadata), or None."""
    try:
        meta = node._input_metadata
        return tuple(meta[0].shape) if meta else None
    except Exception:  # an older torch, a node without metadata
        return None


def broadcast_errors(root) -> list[tuple[str, list, list, list]]:
    """``[(fn, input shape, target shape, broadcast shape)]`` of the squared or absolute
    differences in the loss's linear top whose target broadcast them to every pair."""
    found: list = []

    def visit(node, sign, name, children) -> bool:
        fn = _ERRORS.get(name)
        if fn is None:
            return False
        if name == "PowBackward0" and getattr(node, "_saved_exponent", None) not in (2, 2.0):
            return True
        diff = node.next_functions[0][0] if node.next_functions else None
        if diff is None or type(diff).__name__ not in ("SubBackward0", "AddBackward0"):
            return True
        sides = [child for child, _ in diff.next_functions]
        computed = [child for child in sides if child is not None]
        if len(sides) != 2 or len(computed) != 1:
            return True  # both sides computed (pairwise on purpose), or neither
        out, given = _shape(diff), _shape(computed[0])
        if out is None or given is None or len(out) != 2 or out[0] != out[1] or out[0] < 2:
            return True
        n = out[0]
        if given == (n, 1):
            found.append((fn, [n, 1], [n], [n, n]))
        elif given == (n,):
            found.append((fn, [n], [n, 1], [n, n]))
        return True

    signed_walk(root, _NODES, visit)
    return found


class HandLossWatcher(LossGraphReader):
    label = "hand-written loss broadcast"
    per_line, lines = _LOOKED, _LINES

    def _judge(self, root, loc) -> None:
        for fn, given, target, shape in broadcast_errors(root)[:1]:
            self._done.add(loc)
            self.rec.emit_aside(ev.loss_broadcast(fn=fn, input_shape=given, target_shape=target,
                                                  shape=shape, reduction=None, grad=True), loc)
