"""A matrix multiplied by itself where its transpose was meant, then compared with a constant
(orthogonality-without-transpose).

An orthogonality penalty, PointNet's feature-transform regulariser ``||A A^T - I||``, a
weight's ``||W W^T - I||``, reads the matrix and its transpose. Written ``torch.bmm(A, A) - I``
(or ``A @ A``, ``mse_loss(A @ A, eye)``) it pulls ``A`` toward an involution (``A² = I``: a
reflection, or a matrix whose eigenvalues are ±1), not toward a rotation, and the transform the
penalty was meant to keep well-conditioned is not. Nothing fails.

What the run observes: at the first backwards of each line (``LossGraphReader``) the loss's
graph is searched (``_NODES`` nodes, breadth first) for a ``BmmBackward0`` or ``MmBackward0``
whose two saved operands are one tensor seen the same way (the same storage, offset, shape and
strides: a transposed view has other strides) of square matrices, read by a node that compares
it with a constant: a subtraction or addition with one computed input (``A @ A - eye``) or a
regression loss (``mse_loss(A @ A, eye)``, ``l1_loss``). One ``self_product_offset`` aside event
per backward line (loc: the backward; the rule finds the product's line in the source).

Costs: a walk of the loss graph's first ``_NODES`` nodes at the first backwards of a line.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import nodes_below, reached, saved
from .lossterms import LossGraphReader, _children, _past_views

_NODES = 2048  # graph nodes searched, at most
_LEAF_NODES = 20000  # nodes walked below the product to its leaves
_COMPARE = ("SubBackward0", "AddBackward0", "RsubBackward1", "SubBackward1", "AddBackward1",
            "MseLossBackward", "L1LossBackward", "SmoothL1LossBackward", "HuberLossBackward")


def _same_view(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.data_ptr() == b.data_ptr() and a.shape == b.shape
            and a.stride() == b.stride() and a.dim() >= 2 and a.shape[-1] == a.shape[-2])


def self_product(node) -> bool:
    """Whether ``node`` is a matrix product of one tensor with itself, the same view twice."""
    name = type(node).__name__
    if name not in ("BmmBackward0", "MmBackward0"):
        return False
    return _same_view(saved(node, "_saved_self"), saved(node, "_saved_mat2"))


def offset_self_products(root, limit: int = _NODES) -> list:
    """The self products (``A @ A``) below ``root`` that a node compares with a constant."""
    found = []
    nodes, _ = nodes_below([root], limit)
    for node in nodes:
        name = type(node).__name__
        if not name.startswith(_COMPARE):
            continue
        children = _children(node)
        if len(children) != 1:
            continue  # two computed inputs: not a comparison with a constant
        product = _past_views(children[0][1])
        if product is not None and self_product(product) and product not in found:
            found.append(product)
    return found


class SelfProductWatcher(LossGraphReader):
    label = "self product"

    def _judge(self, root, loc) -> None:
        products = offset_self_products(root)
        if not products:
            return
        tensors = self.rec.tensors
        for product in products:
            common = reached(product, _LEAF_NODES, truncate=True)[1]
            pids = sorted(pid for i in common
                          if (pid := tensors.number.get(i)) is not None and id(tensors.refs[pid]()) == i)
            if not pids:
                continue
            matrix = saved(product, "_saved_self")
            self._done.add(loc)
            self.rec.emit_aside(ev.self_product_offset(
                op=type(product).__name__, shape=[int(s) for s in matrix.shape[-2:]],
                params=pids[:64], line=getattr(loc, "line", None)), loc)
            return

    def install(self, patcher) -> None:
        pass
