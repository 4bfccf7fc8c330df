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

The same walk reads a cross-entropy written by hand, ``-(t * F.log_softmax(z, 1)).sum(1)`` (or
``torch.log(F.softmax(...))``): the product's factor that needs no gradient and has the
log-probabilities' shape is its soft targets, saved by the product node. Rows of probabilities
most of which sum above 1 (label smoothing whose ε was not divided by the classes, a mixing
weight left out), or rows that carry no label beside labelled ones all peaking at one column (a
one-hot scattered along the batch axis), are what ``F.cross_entropy`` would be told off for (``lossdomain.judge``): a
``target_domain`` aside event with fn ``events.SOFT_CE``. Multi-hot or signed factors are not judged
by hand: SupCon's positives mask and a policy gradient's signed returns are written the same way.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import saved
from .lossdomain import judge
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


_VIEWS = ("ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward", "PermuteBackward",
          "TransposeBackward", "CloneBackward")


def _log_probabilities(node):
    """``(node, dim)`` of the log-softmax ``node`` is (through views), as ``F.log_softmax(z, d)``
    or ``torch.log(F.softmax(z, d))``; None otherwise."""
    for _ in range(4):
        name = type(node).__name__
        if name.startswith("LogSoftmaxBackward"):
            return node, saved(node, "_saved_dim")
        if name.startswith("LogBackward"):
            below = node.next_functions[0][0] if node.next_functions else None
            if below is not None and type(below).__name__.startswith("SoftmaxBackward"):
                return below, saved(below, "_saved_dim")
            return None
        if not name.startswith(_VIEWS) or not node.next_functions:
            return None
        node = node.next_functions[0][0]
        if node is None:
            return None
    return None


def soft_targets(root) -> list[tuple[torch.Tensor, int]]:
    """``[(targets, class dim)]`` of the products ``target * log_softmax(z)`` in the loss's
    linear top whose other factor needs no gradient and has the log-probabilities' shape: the
    soft targets of a cross-entropy written by hand (``-(t * F.log_softmax(z, 1)).sum(1)``)."""
    found: list = []

    def visit(node, sign, name, children) -> bool:
        if name != "MulBackward0" or len(children) != 1:
            return False
        index, child = children[0]
        logp = _log_probabilities(child)
        if logp is None or not isinstance(logp[1], int):
            return False
        factor = saved(node, "_saved_other" if index == 0 else "_saved_self")
        shape = _shape(child)
        if not isinstance(factor, torch.Tensor) or shape is None or tuple(factor.shape) != shape \
                or factor.dim() < 2 or not factor.is_floating_point():
            return True  # a per-sample weight, a scalar: no target rows to judge
        found.append((factor, logp[1] % factor.dim()))
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
            return
        for factor, dim in soft_targets(root)[:2]:
            if factor.device.type != "cpu" and self.rec.progress.steps:
                return  # no host sync once the updates run
            rows = factor.detach().float()
            with torch.no_grad():
                if float(rows.sum()) < 0:
                    rows = -rows  # -t * log_softmax(z): the minus sign written on the target
            found = judge("distribution", rows.movedim(dim, 1), classes=int(rows.shape[dim]))
            # only rows that sum above 1: a hand-written product with log-probabilities may be
            # meant otherwise (SupCon's multi-hot positives, a policy gradient's signed returns)
            if found is None or found["problem"] not in ("over-summed", "unlabelled"):
                continue
            self._done.add(loc)
            self.rec.emit_aside(ev.target_domain(
                fn=ev.SOFT_CE, problem=found["problem"], low=round(found["low"], 4),
                high=round(found["high"], 4),
                share=round(found["share"], 4) if found.get("share") is not None else None,
                classes=int(rows.shape[dim]), detail=found.get("detail")), loc)
            return
