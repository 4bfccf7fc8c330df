"""How the backward'ed loss was scaled before backward: ``loss / k``, ``loss * (1 / k)``, ...

Walks down from the loss's ``grad_fn`` through multiplications and divisions by a Python
number (autograd saves those as 0-dim int64/float64 CPU tensors) and through sums of equally
scaled terms (``l1 / k + l2 / k``); the product of those constants is the factor.

* ``1.0`` — no such step: the loss went to backward as its reduction produced it;
* a float — the constant the loss was multiplied by (0.25 for ``loss / 4``);
* ``None`` — cannot tell: a division by a computed tensor (a token count, an accelerator's
  normaliser held in a tensor), mixed factors, an unusual graph. Rules stay silent then.

Below the constants the walk reaches the loss terms: one for ``loss / k``, n for
``(l1 + l2) / 2``. ``loss_scaling`` also returns how each term was reduced (``terms``, a list):
``"sum"`` (``.sum()``, ``reduction="sum"``: a constant dividing it makes a mean, e.g.
``kl_div(reduction="batchmean")`` or ``sum / batch_size``), ``"mean"``, ``"none"``, or ``None``
when the node does not say (a composite or custom loss). One attribute read per term.

Reads only 0-dim CPU tensors, so it never synchronises with an accelerator.
"""

from __future__ import annotations

import weakref

import torch

from .graphpaths import saved

_PYTHON_NUMBER_DTYPES = (torch.int64, torch.float64)  # how autograd saves a wrapped Python number
_MAX_NODES = 32


def python_number(constant) -> float | None:
    """The value of a Python number autograd saved (a 0-dim int64/float64 CPU tensor), 0
    included; None for anything else."""
    if not isinstance(constant, torch.Tensor) or constant.dim() != 0 or constant.device.type != "cpu":
        return None
    if constant.dtype not in _PYTHON_NUMBER_DTYPES:
        return None  # a tensor the script computed (a count, a weight): not a constant
    return float(constant.item())


def _constant(constant) -> float | None:
    value = python_number(constant)
    return value if value != 0.0 else None


def _grad_children(node) -> list[tuple[int, object]]:
    return [(i, child) for i, (child, _) in enumerate(node.next_functions) if child is not None]


# the nodes ``_factor`` walks through; at any other node it stops (a loss term)
_SCALING = frozenset({"MulBackward0", "DivBackward0", "AddBackward0", "SubBackward0"})

# the ``reduction`` argument autograd saves on the loss functions' nodes (at::Reduction)
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


# node type -> (its name, whether it is one of _SCALING, the reduction its name tells ("sum",
# "mean") or None, whether its nodes can have a ``_saved_reduction``): a type's name is a new
# string on each read, so it is read once per type, not on every backward
# (weak: a custom Function's node class is the script's and holds its namespace)
_TYPES: "weakref.WeakKeyDictionary[type, tuple[str, bool, str | None, bool]]" = \
    weakref.WeakKeyDictionary()
_TYPES_KEPT = 1024  # custom Functions made on the fly each make a type: start over past this


def _type_facts(node_type: type) -> tuple[str, bool, str | None, bool]:
    facts = _TYPES.get(node_type)
    if facts is None:
        name = node_type.__name__
        by_name = ("sum" if name.startswith("SumBackward") else
                   "mean" if name.startswith("MeanBackward") else None)
        # a getset of the node class, or an instance attribute (a node with a __dict__)
        reads = hasattr(node_type, "_saved_reduction") or node_type.__dictoffset__ != 0
        if len(_TYPES) >= _TYPES_KEPT:
            _TYPES.clear()
        facts = _TYPES[node_type] = (name, name in _SCALING, by_name, reads)
    return facts


def _reduction(node) -> str | None:
    """How the node the walk stopped at reduced the loss (one attribute read)."""
    _name, _scales, by_name, reads = _type_facts(type(node))
    if by_name is not None:
        return by_name
    return _REDUCTIONS.get(getattr(node, "_saved_reduction", None)) if reads else None


def _factor(node, budget: list[int], terms: list) -> float | None:
    """The constant factor below ``node``; the reduction of each loss term reached is appended
    to ``terms``."""
    budget[0] -= 1
    if budget[0] < 0:
        return None
    name = _type_facts(type(node))[0]
    if name in ("MulBackward0", "DivBackward0"):
        children = _grad_children(node)
        if len(children) != 1:
            terms.append(None)
            return 1.0  # a product of two computed tensors is part of the loss itself
        index, child = children[0]
        if name == "DivBackward0":
            if index != 0:
                return None  # constant / loss
            value = _constant(saved(node, "_saved_other"))
            value = None if value is None else 1.0 / value
        else:
            value = _constant(saved(node, "_saved_other" if index == 0 else "_saved_self"))
        if value is None:
            return None
        below = _factor(child, budget, terms)
        return None if below is None else value * below
    if name in ("AddBackward0", "SubBackward0"):
        alpha = getattr(node, "_saved_alpha", 1)
        if alpha not in (1, -1):
            return None
        factors = [_factor(child, budget, terms) for _, child in _grad_children(node)]
        if not factors or any(f is None for f in factors):
            return None
        first = factors[0]
        if all(abs(f - first) <= 1e-6 * abs(first) for f in factors):
            return first
        return None
    terms.append(_reduction(node))
    return 1.0


def loss_scaling(tensors, skip_top: bool = False) -> tuple[float | None, list | None]:
    """``(factor, terms)`` of the loss (see module docs); ``terms`` is None when the factor is.
    ``skip_top``: the tensor is ``scaler.scale(loss)``, whose top multiplication is the AMP
    scale, not the user's factor."""
    if isinstance(tensors, (list, tuple)):
        if len(tensors) != 1:
            return None, None
        tensors = tensors[0]
    if not isinstance(tensors, torch.Tensor):
        return None, None
    node = tensors.grad_fn
    if node is None:
        return None, None
    if skip_top:
        children = _grad_children(node)
        if type(node).__name__ != "MulBackward0" or len(children) != 1:
            return None, None
        node = children[0][1]
    else:
        _name, scales, by_name, reads = _type_facts(type(node))
        if not scales:  # the loss as its reduction made it (most loops): ``_reduction``, inline
            return 1.0, [by_name if by_name is not None else
                         _REDUCTIONS.get(getattr(node, "_saved_reduction", None)) if reads else None]
    terms: list = []
    factor = _factor(node, [_MAX_NODES], terms)
    return factor, (terms if factor is not None else None)


def loss_factor(tensors, skip_top: bool = False) -> float | None:
    """The constant factor of the loss (see module docs)."""
    return loss_scaling(tensors, skip_top)[0]


# the nodes of torch's loss functions (they save their ``reduction``): a loss that is minimised
# by definition, which a training loop never means to maximise with its model's own optimizer
def _is_criterion(node) -> bool:
    name, _scales, _by_name, reads = _type_facts(type(node))
    return reads and hasattr(node, "_saved_reduction") and ("Loss" in name or "Entropy" in name)


def negated_criterion(tensors) -> str | None:
    """The node name of a torch loss function (``NllLossBackward0`` for ``F.cross_entropy``) when
    the backward'ed loss falls as that criterion grows: the criterion times a negative constant
    (``-loss``, ``loss * -1``, ``1 - loss``), or its reciprocal (``1 / loss``,
    ``1 / (loss + eps)``: the name then has a ``1/`` prefix); else None. Walks at most a few
    negations, reciprocals, multiplications and divisions by Python numbers, and sums with a
    tensor that has no graph (a constant)."""
    if isinstance(tensors, (list, tuple)):
        if len(tensors) != 1:
            return None
        tensors = tensors[0]
    node = getattr(tensors, "grad_fn", None) if isinstance(tensors, torch.Tensor) else None
    negative = reciprocal = False
    for _ in range(8):
        if node is None:
            return None
        name = _type_facts(type(node))[0]
        if name in ("NegBackward0", "ReciprocalBackward0", "RsubBackward1", "AddBackward1", "SubBackward1"):
            children = _grad_children(node)
            if len(children) != 1:
                return None
            if name == "ReciprocalBackward0":
                reciprocal = True
            if name != "AddBackward1" and name != "SubBackward1":
                negative = not negative
            node = children[0][1]
        elif name in ("AddBackward0", "SubBackward0") and len(_grad_children(node)) == 1:
            # the criterion plus or minus a tensor with no graph (a wrapped number, eps)
            index, child = _grad_children(node)[0]
            alpha = getattr(node, "_saved_alpha", 1)
            if type(alpha) not in (int, float) or alpha == 0:
                return None
            # alpha multiplies the second operand: the loss's coefficient is 1 when it is the
            # first, alpha (a sum) or -alpha (a difference) when it is the second
            coefficient = 1 if index == 0 else (-alpha if name == "SubBackward0" else alpha)
            negative = negative != (coefficient < 0)
            node = child
        elif name in ("MulBackward0", "DivBackward0"):
            children = _grad_children(node)
            if len(children) != 1 or (name == "DivBackward0" and children[0][0] != 0):
                return None
            index, child = children[0]
            value = _constant(saved(node, "_saved_other" if index == 0 else "_saved_self"))
            if value is None:
                return None
            negative, node = negative != (value < 0), child
        else:
            if not (negative and _is_criterion(node)):
                return None
            return f"1/{name}" if reciprocal else name
    return None


def may_be_negated(tensors) -> bool:
    """Whether the loss's top node is a negation or a product (one attribute and a dict read):
    only those are walked by ``negated_criterion``."""
    node = getattr(tensors, "grad_fn", None) if isinstance(tensors, torch.Tensor) else None
    return node is not None and _type_facts(type(node))[0] in ("NegBackward0", "MulBackward0",
                                                                "DivBackward0", "ReciprocalBackward0",
                                                                "RsubBackward1")


def constant_term(tensors) -> bool:
    """Whether the backward'ed loss adds a tensor with no graph: its top sum (``AddBackward0`` /
    ``SubBackward0``, under constant factors) has an operand autograd does not reach
    (``next_functions`` holds None for it): a term computed from ``p.data``, ``.detach()``,
    ``torch.no_grad()``. Only the top sum: Python's ``sum()`` and ``loss = 0; loss += term``
    start from a wrapped 0, which sits at the bottom of a chain of sums (it is the top only for
    a single term). A Python number added (``loss + 1.0``) looks the same: the rule asks the
    source which term it is. Reads no tensor."""
    if isinstance(tensors, (list, tuple)):
        if len(tensors) != 1:
            return False
        tensors = tensors[0]
    node = getattr(tensors, "grad_fn", None) if isinstance(tensors, torch.Tensor) else None
    for _ in range(8):
        if node is None:
            return False
        name, scales, _by_name, _reads = _type_facts(type(node))
        if not scales:
            return False
        if name in ("AddBackward0", "SubBackward0"):
            return any(child is None for child, _ in node.next_functions)
        children = _grad_children(node)
        if len(children) != 1:
            return False
        node = children[0][1]
    return False
