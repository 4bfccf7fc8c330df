"""A log-det of a transform shared over the positions of an image counted once
(log-det-misses-positions).

Glow's invertible 1x1 convolution applies one C x C matrix W at each of the H x W positions of
its input, and its actnorm one scale per channel at every position: the Jacobian of the whole
map is block-diagonal with H x W copies of the same block, so its log-det is
``H * W * log|det W|`` and ``H * W * sum(logs)``. Summed once, without the factor, the flow's
NLL under-counts the volume change by H x W: the optimizer is free to shrink W or the
scales at almost no cost, and the reported bits/dim are not the model's.

Read from the loss's graph at the first backwards of each line (``LossGraphReader``):

* each ``LinalgSlogdetBackward0`` (or ``LogdetBackward0``) of a matrix that, through views,
  is the weight of a 1x1 ``ConvolutionBackward0`` whose saved input has more than one
  position;
* each full ``SumBackward0`` of a parameter (through ``log``/``abs``) shaped with size-1 axes
  (``(1, C, 1, 1)``) that, itself or through ``exp``, multiplies a tensor broadcast over
  more than one position along those axes (the batch axis left out);

followed up to the loss through the constant factors (products and quotients by a number,
negations) applied to it alone: none (a factor of exactly 1) while the transform covers more
than one position is a ``log_det_positions`` aside. A use of the value by several nodes, a
product with a tensor, or an expand are not judged.
"""

from __future__ import annotations

import math

import torch

from .. import events as ev
from .graphpaths import saved
from .lossterms import LossGraphReader

_NODES = 20000  # nodes of the loss's graph walked, at most
_VIEWS = frozenset({"UnsqueezeBackward0", "ViewBackward0", "ReshapeAliasBackward0",
                    "UnsafeViewBackward0", "SqueezeBackward0", "SqueezeBackward1",
                    "UnsqueezeBackward1", "CloneBackward0", "ToCopyBackward0"})
_LOGDETS = frozenset({"LinalgSlogdetBackward0", "LogdetBackward0"})


def _base(node):
    """``node`` followed down through views to the node that makes the tensor."""
    for _ in range(8):
        if node is None or type(node).__name__ not in _VIEWS or not node.next_functions:
            return node
        node = node.next_functions[0][0]
    return node


def _number(value) -> float | None:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.requires_grad:
        return float(value)
    return None


def _factor(node, parents) -> float | None:
    """The product of the constant factors applied to ``node``'s value alone on its way up to
    the loss: None when it is used twice, or scaled by a tensor, before it meets another term."""
    factor = 1.0
    for _ in range(16):
        up = parents.get(id(node), ())
        if len(up) != 1:
            return factor if not up else None
        parent, slot = up[0]
        name = type(parent).__name__
        others = [i for i, (fn, _) in enumerate(parent.next_functions) if i != slot]
        if name in _VIEWS:
            pass  # a cast or a view of the value: the same number
        elif name == "NegBackward0":
            factor = -factor
        elif name in ("MulBackward0", "MulBackward1", "DivBackward0", "DivBackward1"):
            if any(parent.next_functions[i][0] is not None for i in others):
                return factor  # meets another computed tensor: the term ends here
            const = _number(saved(parent, "_saved_other")) if slot == 0 or name.endswith("1") \
                else _number(saved(parent, "_saved_self"))
            if const is None:
                return None
            if name.startswith("Div"):
                if slot != 0 or const == 0:
                    return None
                const = 1.0 / const
            factor *= const
        else:
            return factor
        node = parent
    return None


class LogDetPositionsWatcher(LossGraphReader):
    label = "log_det_positions"

    def _judge(self, root, loc) -> None:
        parents: dict = {}
        seen = {id(root)}
        queue = [root]
        convs, logdets, sums, muls = [], [], [], []
        while queue and len(seen) < _NODES:
            node = queue.pop()
            name = type(node).__name__
            if name == "ConvolutionBackward0":
                convs.append(node)
            elif name in _LOGDETS:
                logdets.append(node)
            elif name == "SumBackward0":
                sums.append(node)
            elif name == "MulBackward0":
                muls.append(node)
            for slot, (child, _) in enumerate(node.next_functions):
                if child is None:
                    continue
                parents.setdefault(id(child), []).append((node, slot))
                if id(child) not in seen:
                    seen.add(id(child))
                    queue.append(child)
        found = self._slogdets(convs, logdets, parents) or self._sums(sums, muls, parents)
        if found is None:
            return
        op, positions, node = found
        pids = []
        tensors = self.rec.tensors
        variable = getattr(node, "variable", None)
        if variable is not None:
            pid = tensors.number.get(id(variable))
            if pid is not None and tensors.refs[pid]() is variable:
                pids.append(pid)
        self._done.add(loc)
        self.rec.emit_aside(ev.log_det_positions(op=op, positions=positions, params=pids,
                                                 line=getattr(loc, "line", None)), loc)

    @staticmethod
    def _slogdets(convs, logdets, parents):
        if not convs or not logdets:
            return None
        spread = {}
        for conv in convs:
            weight = saved(conv, "_saved_weight")
            x = saved(conv, "_saved_input")
            if weight is None or x is None or weight.dim() < 3 or any(k != 1 for k in weight.shape[2:]):
                continue
            positions = math.prod(x.shape[2:])
            base = _base(conv.next_functions[1][0])
            if base is not None and positions > 1:
                spread[id(base)] = (positions, base)
        for node in logdets:
            base = _base(node.next_functions[0][0])
            hit = spread.get(id(base)) if base is not None else None
            if hit is None:
                continue
            if _factor(node, parents) == 1.0:
                return "slogdet", hit[0], hit[1]
        return None

    @staticmethod
    def _sums(sums, muls, parents):
        if not sums or not muls:
            return None
        for node in sums:
            leaf = node.next_functions[0][0] if node.next_functions else None
            for _ in range(3):
                if leaf is not None and type(leaf).__name__ in ("LogBackward0", "AbsBackward0"):
                    leaf = leaf.next_functions[0][0]
            variable = getattr(leaf, "variable", None)
            if variable is None or variable.dim() < 3 or variable.shape[0] != 1 \
                    or sum(1 for s in variable.shape[1:] if s == 1) < 1:
                continue
            positions = None
            for mul in muls:
                for slot, (child, _) in enumerate(mul.next_functions):
                    scale = child
                    if scale is not None and type(scale).__name__ == "ExpBackward0":
                        scale = scale.next_functions[0][0]
                    if scale is not leaf:
                        continue
                    other = saved(mul, "_saved_other" if slot == 0 else "_saved_self")
                    if not isinstance(other, torch.Tensor) or other.dim() != variable.dim():
                        continue
                    spread = math.prod(o for o, v in zip(other.shape[1:], variable.shape[1:]) if v == 1)
                    positions = max(positions or 0, spread)
            if positions and positions > 1 and _factor(node, parents) == 1.0:
                return "sum", positions, leaf
        return None
