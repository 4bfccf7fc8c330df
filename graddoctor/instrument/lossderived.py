"""Loss weights computed from the loss terms themselves, with their graph: a scalar factor that is
a function of a reduced loss, multiplied into that loss.

Two shapes of one mistake. Balancing weights written ``w = l_cls / (l_cls + l_reg)`` (or a
softmax, an exp, a reciprocal of the terms) and left attached: autograd differentiates the
weights too, so the optimizer lowers each weight as well as each loss, and the update is not the
weighted sum of the tasks' gradients the script meant. And a per-sample weight (a focal loss's
``(1 - exp(-ce)) ** gamma``, an OHEM-style modulation) computed from a loss that was already
reduced to the batch's mean: the "per-sample" weight is one number for the whole batch, so it
only rescales the step, and every sample, easy or hard, is weighted alike.

At the first backwards of each backward line (``describe_loss``) the loss's linear top is walked
from its root (``lossterms.signed_walk``). A product or quotient of two computed 0-dim tensors (or of
a short stack of loss terms and its weights) is a *loss-derived weight* when one side (the weight) starts with a non-linear op (a quotient, exp,
power, reciprocal, softmax's select, sigmoid, log, square root, ``1 - x``) and a short walk from
it reaches a reduced loss node (a torch loss function's node with mean or sum reduction, a full
``mean()``/``sum()``) that the other side also reaches. The weight ``.detach()``-ed, a number
(``.item()``), a learned parameter, or per-element tensors (a focal loss with
``reduction="none"``) stay out. A ``loss_derived_weight`` aside event names the kind (``"self"``:
the weight is a function of the term it multiplies alone; ``"ratio"``: of several terms), once
per backward line.

A third shape: a term divided by its own size with the divisor attached, ``mean(x) * (c /
mean(|x|))`` (TD3+BC's ``lmbda = alpha / q.abs().mean()`` multiplying ``q.mean()``; a norm or
a root mean square as the size, an eps added): the product does not change with ``x``'s size,
so its gradient cancels. Kind ``"scale"``: the divisor's reciprocal (or the quotient's
denominator), past constant factors and negations, measures the very node the other side
averages.

Cost: a walk of at most ``_NODES`` nodes of the loss's linear top, and two walks of at most
``_NEAR`` nodes below each product of two computed scalars; at the first backwards of a line only.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import saved
from .lossterms import LossGraphReader, signed_walk
from .lossweight import _LOSS_NODES

_LOOKED = 3  # backwards of each line looked at
_NODES = 256  # nodes of the linear top walked
_NEAR = 48  # nodes walked below each side of a product
_STACKED = 16  # loss terms stacked into one vector, at most
# the ops a weight computed from losses starts with
_NONLINEAR = ("DivBackward0", "ExpBackward0", "PowBackward0", "PowBackward1", "ReciprocalBackward0",
              "SelectBackward0", "UnbindBackward0", "SigmoidBackward0", "LogBackward0",
              "SqrtBackward0", "RsubBackward1", "SoftmaxBackward0")


def _reduced(node) -> bool:
    """A loss node reduced to one number: a torch loss function's (mean or sum reduction) or a
    full ``mean()``/``sum()``."""
    name = type(node).__name__
    if name in ("MeanBackward0", "SumBackward0"):
        return True
    if name.startswith(_LOSS_NODES):
        reduction = saved(node, "_saved_reduction")
        return reduction in (1, 2)  # 0: "none", per-element
    return False


def _losses_below(node, stop_at_loss: bool = True) -> set:
    """The reduced loss nodes within ``_NEAR`` nodes below ``node`` (itself included); the walk
    does not go under a loss node nor into leaves."""
    found: set = set()
    seen: set = set()
    stack = [node]
    while stack and len(seen) < _NEAR:
        n = stack.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        if getattr(n, "variable", None) is not None:
            continue
        if _reduced(n):
            found.add(n)
            if stop_at_loss:
                continue
        stack.extend(child for child, _ in n.next_functions if child is not None)
    return found


def _scalar(node, attribute: str) -> bool:
    """A 0-dim operand, or a short vector (a stack of a few loss terms and their weights)."""
    value = saved(node, attribute)
    return isinstance(value, torch.Tensor) and (value.dim() == 0 or (
        value.dim() == 1 and value.numel() <= _STACKED))


def _past_constants(node):
    """Below the products and quotients by a constant on top of a weight (``alpha * w``)."""
    for _ in range(8):
        if node is None or type(node).__name__ not in ("MulBackward0", "DivBackward0"):
            return node
        children = [(i, c) for i, (c, _) in enumerate(node.next_functions) if c is not None]
        if len(children) != 1 or (type(node).__name__ == "DivBackward0" and children[0][0] != 0):
            return node
        node = children[0][1]
    return node


# a tensor's size, of degree 1 in it: a norm (|x| averaged or summed, and the root of a mean
# square, are read below). A standard deviation is not: it centres x first, and a mean over a
# std is a Sharpe ratio, an objective of its own
_MAGNITUDES = ("LinalgVectorNormBackward", "NormBackward")
_VIEWS = ("ViewBackward", "ReshapeAlias", "UnsafeViewBackward", "SqueezeBackward",
          "UnsqueezeBackward", "ExpandBackward", "CloneBackward")


def _past_views(node):
    for _ in range(8):
        if node is None or not type(node).__name__.startswith(_VIEWS) or len(node.next_functions) != 1:
            return node
        node = node.next_functions[0][0]
    return node


def _one_child(node):
    children = [c for c, _ in node.next_functions if c is not None]
    return children[0] if len(children) == 1 else None


def _magnitude_of(node):
    """The tensor whose size ``node`` measures (past views and an added constant eps):
    ``x.abs().mean()``, ``x.abs().sum()``, ``x.norm()``, ``(x ** 2).mean().sqrt()``; else None."""
    node = _past_views(node)
    if node is not None and type(node).__name__ in ("AddBackward0", "AddBackward1"):  # + eps
        node = _past_views(_one_child(node))
    if node is None:
        return None
    name = type(node).__name__
    if name.startswith(_MAGNITUDES):
        return _past_views(_one_child(node))
    root = False
    if name == "SqrtBackward0":  # the root of a mean square
        node, root = _past_views(_one_child(node)), True
        name = type(node).__name__ if node is not None else ""
    if name in ("MeanBackward0", "SumBackward0"):
        inner = _past_views(_one_child(node))
        if inner is None:
            return None
        inner_name = type(inner).__name__
        if inner_name == "AbsBackward0" and not root:
            return _past_views(_one_child(inner))
        if inner_name == "PowBackward0" and saved(inner, "_saved_exponent") == 2 and root:
            return _past_views(_one_child(inner))
    return None


def _divides_by_magnitude(weight):
    """The tensor a weight divides by the size of (``c / x.abs().mean()``, ``-c / x.norm()``,
    past constant factors and negations), or None."""
    for _ in range(8):
        weight = _past_constants(weight)
        if weight is not None and type(weight).__name__ == "NegBackward0":
            weight = _one_child(weight)
            continue
        break
    if weight is None:
        return None
    name = type(weight).__name__
    if name == "ReciprocalBackward0":
        return _magnitude_of(_one_child(weight))
    if name == "DivBackward0" and len(weight.next_functions) == 2:
        return _magnitude_of(weight.next_functions[1][0])
    return None


def _averaged(term):
    """The tensor a term is the mean or sum of (past constant factors and negations), or None."""
    for _ in range(8):
        term = _past_constants(term)
        if term is not None and type(term).__name__ == "NegBackward0":
            term = _one_child(term)
            continue
        break
    if term is None or type(term).__name__ not in ("MeanBackward0", "SumBackward0"):
        return None
    return _past_views(_one_child(term))


def _scale_free(node, children) -> bool:
    """A product (or quotient) of two computed scalars ``mean(x) * (c / mean(|x|))``: a term
    divided by its own size with the divisor's graph kept, so the product no longer changes
    with the size of ``x`` (TD3+BC's ``lmbda = alpha / q.abs().mean()`` left attached)."""
    (_, first), (_, second) = children
    name = type(node).__name__
    if name == "DivBackward0":
        base = _magnitude_of(second)
        return base is not None and _averaged(first) is base
    for weight, term in ((first, second), (second, first)):
        base = _divides_by_magnitude(weight)
        if base is not None and _averaged(term) is base:
            return True
    return False


def derived_weights(root, limit: int = _NODES) -> list[str]:
    """The kinds (``"self"`` / ``"ratio"``) of the products and quotients of two computed
    scalars in the loss's linear top whose one side is a non-linear function of a reduced loss
    the other side holds."""
    found: list[str] = []

    def visit(node, sign, name, children) -> bool:
        if name not in ("MulBackward0", "DivBackward0") or len(children) != 2:
            return False
        if not (_scalar(node, "_saved_self") and _scalar(node, "_saved_other")):
            return False
        (_, first), (_, second) = children
        if saved(node, "_saved_self").dim() == 1 and not any(
                type(side).__name__.startswith(("StackBackward", "CatBackward")) for side in (first, second)):
            return False  # a vector that is no stack of loss terms: per-element weights
        if _scale_free(node, children):
            found.append("scale")
            return True
        pairs = ((second, first),) if name == "DivBackward0" else ((first, second), (second, first))
        for weight, term in pairs:
            weight = _past_constants(weight)
            if weight is None or not type(weight).__name__.startswith(_NONLINEAR):
                continue
            term_losses = _losses_below(term)
            if not term_losses:
                continue
            shared = _losses_below(weight) & term_losses
            if shared:
                others = _losses_below(weight) - term_losses
                alone = len(term_losses) == 1 and not others and name != "DivBackward0"
                found.append("self" if alone else "ratio")
                return True
        return False

    signed_walk(root, limit, visit)
    return found


class LossDerivedWeightWatcher(LossGraphReader):
    label = "loss_derived_weight"
    per_line = _LOOKED

    def _judge(self, root, loc) -> None:
        kinds = derived_weights(root)
        if not kinds:
            return
        self._done.add(loc)
        self.rec.emit_aside(ev.loss_derived_weight(kinds=sorted(set(kinds)), terms=len(kinds)), loc)

    def install(self, patcher) -> None:
        pass
