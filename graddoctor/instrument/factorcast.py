"""A per-sample factor (sample weights, advantages, a validity mask, importance weights) that
meets the per-sample loss terms it weighs in another layout: ``w * per_sample`` with ``w`` of
shape (N,) and ``per_sample`` of shape (N, 1) broadcasts to (N, N), every term weighted by every
sample's factor.

At the first ``_LOOKED`` backwards of each backward line, the loss's pointwise top is walked
from the root: reductions (sum, mean), the pointwise arithmetic and functions a loss is built
of, and the views between them; anything else (a layer, a loss function, a matmul) ends the
walk there, so the model's forward and the library losses are not looked into. Each product or
quotient met is judged from shapes alone: the side with a gradient from its autograd node's
metadata, a side without one from the tensor the node saved for the other side's gradient
(``graphpaths.saved``: never one packed by saved-tensor hooks — unknown then, and not judged).
It is a ``factor_broadcast`` when the two sides hold the same sizes in layouts that differ only
by size-1 dimensions ((N, 1) against (N,), (B, 1, H, W) against (B, H, W)) and the result has
more elements than either. Two computed sides one of which is a vector made a column on purpose
(``s[:, None] * s``, ``s.view(-1, 1)``: a pairwise term) are left alone. The shape test is the
one ``loss-shape-broadcast`` applies to regression losses, whose differences this leaves to it
(only products and quotients are judged here).
"""

from __future__ import annotations

from .. import events as ev
from .graphpaths import saved
from .lossterms import LossGraphReader

_LOOKED = 3  # backwards of each backward line looked at
_LINES = 8  # backward lines looked at, at most
_NODES = 256  # nodes of the loss's pointwise top walked

# the nodes of a loss's pointwise top: reductions, elementwise arithmetic and functions, views
_WALKED = frozenset({
    "MeanBackward0", "MeanBackward1", "SumBackward0", "SumBackward1", "NegBackward0",
    "AddBackward0", "AddBackward1", "SubBackward0", "SubBackward1", "RsubBackward0", "RsubBackward1",
    "MulBackward0", "MulBackward1", "DivBackward0", "DivBackward1", "PowBackward0", "PowBackward1",
    "ExpBackward0", "LogBackward0", "Log1PBackward0", "SqrtBackward0", "RsqrtBackward0",
    "AbsBackward0", "SigmoidBackward0", "TanhBackward0", "ClampBackward1", "ClampMinBackward0",
    "ClampMaxBackward0", "WhereBackward0", "MaximumBackward0", "MinimumBackward0",
    "SqueezeBackward0", "SqueezeBackward1", "SqueezeBackward2", "UnsqueezeBackward0",
    "ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "CloneBackward0",
    "ToCopyBackward0",
})
# what turns a vector into a column on purpose (``s[:, None]``, ``s.view(-1, 1)``)
_RESHAPES = frozenset({"UnsqueezeBackward0", "ViewBackward0", "UnsafeViewBackward0",
                       "ReshapeAliasBackward0", "AsStridedBackward0", "ExpandBackward0"})


def _out_shape(node, index: int = 0) -> tuple | None:
    """The shape of the ``index``-th value ``node``'s forward made (its metadata), or None."""
    try:
        meta = node._input_metadata
        return tuple(meta[index].shape) if len(meta) > index else None
    except Exception:  # an older torch, a node without metadata
        return None


def misaligned(a, b) -> bool:
    """The same sizes in two layouts that differ only by size-1 dimensions and their number:
    (N, 1) against (N,), (B, 1, H, W) against (B, H, W)."""
    return len(a) != len(b) and [d for d in a if d != 1] == [d for d in b if d != 1]


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _made_column(child, shape) -> bool:
    """Is ``child`` (of forward output ``shape``) a vector reshaped on purpose: an unsqueeze or
    view whose input is that vector without its size-1 dimensions?"""
    if child is None or type(child).__name__ not in _RESHAPES or not child.next_functions:
        return False
    below, index = child.next_functions[0]
    source = _out_shape(below, index) if below is not None else None
    return source is not None and len(source) < len(shape) and misaligned(source, shape)


def _sides(node) -> list[tuple[tuple | None, object]] | None:
    """``[(shape, child node or None)]`` of a product's or quotient's two operands; None when
    the node does not say (a Python number, a released or packed saved tensor)."""
    children = node.next_functions
    if len(children) != 2:
        return None
    sides = []
    for index, (child, nr) in enumerate(children):
        if child is not None:
            shape = _out_shape(child, nr)
        else:  # no gradient: the tensor saved for the other side's gradient
            value = saved(node, "_saved_self" if index == 0 else "_saved_other")
            shape = tuple(value.shape) if hasattr(value, "shape") else None
        if shape is None:
            return None
        sides.append((shape, child))
    return sides


def factor_broadcasts(root) -> list[tuple[str, list, list, list, bool]]:
    """``[(op, term shape, factor shape, broadcast shape, factor has gradient)]`` of the
    products and quotients of the loss's pointwise top whose two per-sample sides broadcast to
    every pair."""
    found: list = []
    stack, seen = [root], set()
    while stack and len(seen) < _NODES:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        name = type(node).__name__
        if name not in _WALKED:
            continue
        stack.extend(child for child, _ in node.next_functions)
        if name not in ("MulBackward0", "DivBackward0"):
            continue
        sides, out = _sides(node), _out_shape(node)
        if sides is None or out is None:
            continue
        (a, a_node), (b, b_node) = sides
        if not misaligned(a, b) or _numel(out) <= max(_numel(a), _numel(b)):
            continue
        if a_node is not None and b_node is not None and (_made_column(a_node, a) or _made_column(b_node, b)):
            continue  # s[:, None] * s: a pairwise term built on purpose
        term, factor, factor_node = (a, b, b_node) if a_node is not None else (b, a, a_node)
        found.append(("mul" if name == "MulBackward0" else "div", list(term), list(factor),
                      list(out), factor_node is not None))
    return found


class FactorBroadcastWatcher(LossGraphReader):
    label = "loss factor broadcast"
    per_line, lines = _LOOKED, _LINES

    def _judge(self, root, loc) -> None:
        for op, term, factor, shape, factor_grad in factor_broadcasts(root)[:1]:
            self._done.add(loc)
            self.rec.emit_aside(ev.factor_broadcast(op=op, term_shape=term, factor_shape=factor,
                                                    shape=shape, factor_grad=factor_grad), loc)
