"""Learned loss weights that the optimizer can only shrink: a parameter that reaches the loss
only as a monotone factor of terms that are never negative.

Kendall's uncertainty weighting without its regulariser (``exp(-s) * task_loss`` where
``exp(-s) * task_loss + s`` is meant), a learned ``1 / (2 * sigma**2)`` without ``log(sigma)``,
a task weight ``softplus(w) * loss`` or ``w * loss`` learned with nothing holding it up: the
derivative of the loss along the weight is the task loss itself (times the factor's slope), so
it has the same sign at every step, whatever the data. The optimizer shrinks the factor without
end (``s`` grows, ``sigma`` grows, ``w`` falls through zero), and the task losses it weighs are
switched off, or the loss turns unbounded below.

At a backward (the first ``_LOOKED`` of each backward line; ``describe_loss``) the loss's linear
top is walked from its root with each node's sign (``lossterms.signed_walk``). A product (or a
quotient) of two computed tensors reached with a positive sign is a *weighted term* when one
side is a loss by construction (a torch loss function's node, or the top node of one that torch
builds of plain ops and that is never negative: ``l1_loss``, ``kl_div``, the hinge embedding
and multilabel soft margin losses, ``lossnodes.loss_of``; an absolute value, an even power,
a norm, a ReLU: ``_is_loss``, also through sums, means, stacks and positive constants) and the
other side is a chain of monotone one-input ops (exp, negation, reciprocal, softplus, sigmoid,
powers, products by constants, indexing and views) down to one leaf tensor (the *factor*, the
quotient's denominator). A leaf whose every path to the root goes through the factor side of
such terms has no other path that could bound it (Kendall's ``+ s``, a temperature that also
divides the logits); for a term that selects one element of the leaf (``exp(-s[1])``), no other
path to that element (a regulariser ``+ s[0]`` does not hold ``s[1]``). The factor's values,
which autograd saved on the product's node (CPU, at most ``_VALUES`` elements), are kept at
each looked-at backward of the line: a factor that the steps between them only ever moved one
way, the way the gradient's fixed sign says (a product's factor down, a quotient's denominator
up), and moved ``_MOVES`` times, is the bug, so an ascent
(a Lagrange multiplier with ``maximize=True``), a weight renormalised after each step (GradNorm)
or one whose gradient is replaced by another loss's stays silent. A ``loss_weight_learned``
aside event names it, once per backward line.

Cost: a walk of at most ``_NODES`` nodes of the loss's linear top, a walk of the graph below it
(``_GRAPH_NODES``) when a weighted term is found, and a float64 copy of each factor's few saved
values; at the first backwards of a line only.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import saved
from .lossnodes import NONNEGATIVE, loss_of
from .lossterms import _KEEP, _sign_of, _signed, LossGraphReader, signed_walk

_LOOKED = 8  # backwards of each line looked at, at most (an accumulation window has no step)
_MOVES = 3  # moves of the factor, all one way, that tell it
_NODES = 256  # nodes of the linear top walked
_GRAPH_NODES = 20000  # nodes walked below the root to find a leaf's other paths
_VALUES = 64  # elements of a factor read, at most
_DEPTH = 16  # ops of a factor's chain, or of a loss's linear top, followed

# the autograd nodes of torch's loss functions: their output is never negative
_LOSS_NODES = ("MseLossBackward", "NllLossBackward", "NllLoss2DBackward", "BinaryCrossEntropyBackward",
               "BinaryCrossEntropyWithLogitsBackward", "SmoothL1LossBackward", "HuberLossBackward",
               "SoftMarginLossBackward", "MultiMarginLossBackward", "MultilabelMarginLossBackward",
               "CtcLossBackward", "KlDivBackward", "L1LossBackward")
# one-input ops monotone in their input (or in its size: even powers), through which a factor
# keeps its fixed-sign derivative
_MONOTONE = ("ExpBackward", "Exp2Backward", "NegBackward", "ReciprocalBackward", "SoftplusBackward",
             "SigmoidBackward", "PowBackward0", "SqrtBackward", "RsqrtBackward", "AddBackward1",
             "SubBackward1", "RsubBackward1", "ExpandBackward", "SelectBackward", "IndexBackward",
             "UnbindBackward", "SqueezeBackward", "UnsqueezeBackward", "ViewBackward",
             "ReshapeAliasBackward", "UnsafeViewBackward", "CloneBackward", "ToCopyBackward",
             "AliasBackward", "SliceBackward", "SplitBackward", "TBackward")


def _children(node) -> list[tuple[int, object]]:
    return [(i, child) for i, (child, _) in enumerate(node.next_functions) if child is not None]


def _is_loss(node, depth: int = 0) -> bool:
    """Whether the node's output is a loss by construction: never negative whatever the data."""
    if node is None or depth > _DEPTH:
        return False
    name = type(node).__name__
    if name.startswith(_LOSS_NODES):
        return True
    call = loss_of(node)  # l1_loss, kl_div...: torch builds them of plain ops
    if call is not None and call.fn in NONNEGATIVE:
        return True
    children = _children(node)
    if name in ("AddBackward0", "StackBackward0", "CatBackward0") and children:
        if name == "AddBackward0" and getattr(node, "_saved_alpha", 1) != 1:
            return False
        return all(_is_loss(child, depth + 1) for _, child in children)
    if name in ("MulBackward0", "DivBackward0") and len(children) == 1 and children[0][0] == 0:
        factor = saved(node, "_saved_other")
        if isinstance(factor, (int, float)):
            positive = factor > 0
        elif isinstance(factor, torch.Tensor) and factor.dim() == 0 and factor.device.type == "cpu":
            positive = bool(factor > 0)
        else:
            return False
        return positive and _is_loss(children[0][1], depth + 1)
    if name.startswith(_KEEP) and len(children) == 1 and _is_loss(children[0][1], depth + 1):
        return True
    return _signed(node) == 1.0


def _element(node) -> tuple[int, int] | None:
    """``(dim, index)`` when ``node`` selects one element of a leaf tensor (``s[1]``), else None."""
    if type(node).__name__ != "SelectBackward0":
        return None
    children = _children(node)
    if len(children) != 1 or getattr(children[0][1], "variable", None) is None:
        return None
    dim, index = saved(node, "_saved_dim"), saved(node, "_saved_index")
    return (dim, index) if type(dim) is int and type(index) is int else None


def _factor_leaf(node):
    """``(leaf, element)``: the leaf tensor at the end of a chain of monotone one-input ops from
    ``node`` (products by constants included) and the element of it the chain selects (None:
    all of it); None when the chain is no such one."""
    element = None
    for _ in range(_DEPTH):
        if node is None:
            return None
        variable = getattr(node, "variable", None)
        if variable is not None:
            return variable, element
        element = _element(node)
        name = type(node).__name__
        children = _children(node)
        if len(children) != 1:
            return None
        if name in ("MulBackward0", "DivBackward0", "AddBackward0", "SubBackward0"):
            if name == "DivBackward0" and children[0][0] != 0:
                return None  # a constant divided by the factor: 1 / s is ReciprocalBackward
        elif not name.startswith(_MONOTONE):
            return None
        node = children[0][1]
    return None


# one-input ops whose output rises with their input (on the domain they are used on)
_RISING = ("ExpBackward", "Exp2Backward", "SoftplusBackward", "SigmoidBackward", "SqrtBackward",
           "LogBackward", "AddBackward1", "SubBackward1", "ExpandBackward", "SelectBackward",
           "IndexBackward", "UnbindBackward", "SqueezeBackward", "UnsqueezeBackward", "ViewBackward",
           "ReshapeAliasBackward", "UnsafeViewBackward", "CloneBackward", "ToCopyBackward",
           "AliasBackward", "SliceBackward", "SplitBackward", "TBackward")
# ... and those whose output falls as their input rises (a reciprocal of a positive scale)
_FALLING = ("NegBackward", "RsubBackward1", "ReciprocalBackward", "RsqrtBackward")


def chain_direction(node) -> float | None:
    """+1 when the output of the chain of one-input ops from ``node`` down to a leaf tensor rises
    with the leaf, -1 when it falls; None when the chain holds an op whose direction is not
    known (a power, a product by a tensor) or reaches no leaf."""
    direction = 1.0
    for _ in range(_DEPTH):
        if node is None:
            return None
        if getattr(node, "variable", None) is not None:
            return direction
        name = type(node).__name__
        children = _children(node)
        if len(children) != 1:
            return None
        index, child = children[0]
        if name in ("MulBackward0", "DivBackward0"):
            if name == "DivBackward0" and index != 0:
                return None
            sign = _sign_of(saved(node, "_saved_other" if index == 0 else "_saved_self"))
            if not sign:
                return None
            direction *= sign
        elif name in ("AddBackward0", "SubBackward0"):
            direction *= -1.0 if (name == "SubBackward0" and index == 1) else 1.0
        elif name.startswith(_FALLING):
            direction = -direction
        elif name == "PowBackward0":  # x ** p of a positive x: rises with x when p > 0
            base, exponent = saved(node, "_saved_self"), saved(node, "_saved_exponent")
            if not isinstance(exponent, (int, float)) or exponent == 0 or \
                    not isinstance(base, torch.Tensor) or base.device.type != "cpu" or \
                    base.numel() > _VALUES or not bool((base > 0).all()):
                return None
            direction *= 1.0 if exponent > 0 else -1.0
        elif not name.startswith(_RISING):
            return None
        node = child
    return None


def regulariser_terms(root, limit: int = _NODES) -> list[tuple[object, float, object, object]]:
    """``[(node, slope, leaf, element)]``: the terms of the loss's linear top that are a
    monotone chain of one-input ops down to one leaf tensor (Kendall's ``+ s``, ``+ log(sigma)``),
    with the sign of the loss's slope along the leaf (the term's sign on the top times the
    chain's direction)."""
    found = []

    def visit(node, sign, name, children) -> bool:
        if len(children) != 1 and getattr(node, "variable", None) is None:
            return False
        chain = _factor_leaf(node) if not name.startswith("Log") else _factor_leaf(children[0][1])
        if chain is None:
            return False
        direction = chain_direction(node)
        if direction is None:
            return False
        found.append((node, sign * direction, *chain))
        return True

    signed_walk(root, limit, visit)
    return found


def weighted_terms(root, limit: int = _NODES) -> list[tuple[object, int, str, object, object]]:
    """``[(node, factor's input index, "mul" | "div", leaf, element)]``: the products and
    quotients the loss holds with a positive sign of a loss by construction and a monotone chain
    to a leaf (``element``: the ``(dim, index)`` of it the chain selects, or None)."""
    found = []

    def visit(node, sign, name, children) -> bool:
        if sign <= 0 or name not in ("MulBackward0", "DivBackward0") or len(children) != 2:
            return False
        (i0, c0), (i1, c1) = children
        if name == "DivBackward0":
            chain = _factor_leaf(c1)
            if chain is not None and _is_loss(c0):
                found.append((node, i1, "div", *chain))
                return True
            return False
        for (index, factor), (_, other) in (((i0, c0), (i1, c1)), ((i1, c1), (i0, c0))):
            chain = _factor_leaf(factor)
            if chain is not None and _is_loss(other):
                found.append((node, index, "mul", *chain))
                return True
        return False

    signed_walk(root, limit, visit)
    return found


def _reached_otherwise(root, skipped: dict, cut=frozenset()) -> dict | None:
    """The leaf tensors reached from ``root`` without going through the factor input of the
    weighted terms (``skipped``: node -> that input's index): id -> None when all of the tensor
    is reached, else the set of its elements (``(dim, index)``) that are; None past
    ``_GRAPH_NODES`` nodes."""
    seen: set = set()
    leaves: dict = {}
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen or node in cut:
            continue
        seen.add(node)
        if len(seen) > _GRAPH_NODES:
            return None
        variable = getattr(node, "variable", None)
        if variable is not None:
            leaves[id(variable)] = None
            continue
        element = _element(node)
        if element is not None:
            leaf = id(_children(node)[0][1].variable)
            if leaves.get(leaf, set()) is not None:
                leaves.setdefault(leaf, set()).add(element)
            continue
        skip = skipped.get(node)
        stack.extend(child for i, (child, _) in enumerate(node.next_functions)
                     if child is not None and i != skip)
    return leaves


def _values(node, index: int) -> list[float] | None:
    """The factor's values autograd saved on the term's node (a quotient's denominator is its
    ``other``), as floats; None on an accelerator or past ``_VALUES`` elements."""
    value = saved(node, "_saved_self" if index == 0 else "_saved_other")
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu" or value.numel() > _VALUES:
        return None
    return value.detach().to(torch.float64).flatten().tolist()


def held(others: dict, leaf, element) -> bool:
    """Whether another path of the loss reaches the weighted term's leaf (its element, for a
    term that selects one: a regulariser of ``s[0]`` does not hold ``s[1]``)."""
    reached = others.get(id(leaf), False)
    if reached is False:
        return False
    return reached is None or element is None or element in reached


def moves_one_way(series: list[list[float]], down: bool) -> int | None:
    """How many times the values moved between consecutive looks, when they only ever moved
    the one way (down, or up); None when some moved the other way."""
    moves = 0
    for before, after in zip(series, series[1:]):
        if len(before) != len(after):
            return None
        if any((a > b) if down else (a < b) for b, a in zip(before, after)):
            return None
        moves += before != after
    return moves


class LearnedWeightWatcher(LossGraphReader):
    label = "loss_weight_learned"
    per_line = _LOOKED

    def __init__(self, rec):
        super().__init__(rec)
        self._series: dict = {}  # backward location -> {(term key) -> [values per backward]}
        self._reversed_pids: set = set()  # weights whose only other path is a reversed regulariser

    def _judge(self, root, loc) -> None:
        terms = weighted_terms(root)
        series = self._series.setdefault(loc, {})
        if not terms:
            series.clear()  # a line whose loss changed form: its series starts again
            return
        skipped = {node: index for node, index, *_ in terms}
        others = _reached_otherwise(root, skipped)
        if others is None:
            return
        reversed_by = self._reversed(root, terms, others)
        if reversed_by:
            cut = {node for found in reversed_by.values() for node in found}
            others = _reached_otherwise(root, skipped, cut)
            if others is None:
                return
        tensors = self.rec.tensors
        seen_keys = set()
        for position, (node, index, kind, leaf, element) in enumerate(terms):
            if held(others, leaf, element):
                continue  # another path bounds it (a regulariser, the same weight elsewhere)
            pid = tensors.number.get(id(leaf))
            if pid is None or id(tensors.refs[pid]()) != id(leaf):
                continue  # a tensor graddoctor does not track
            values = _values(node, index)
            if values is None:
                continue
            key = (position, pid, kind, element)
            if (id(leaf), element) in reversed_by:
                self._reversed_pids.add(pid)
            seen_keys.add(key)
            series.setdefault(key, []).append(values)
        for key in [k for k in series if k not in seen_keys]:
            del series[key]
        by_pid: dict[int, list[str]] = {}
        elements: dict[int, set] = {}  # pid -> the indices told (dim 0), None: all of it
        against: set = set()  # weights one of whose terms moved against its gradient
        looked = 0
        for (position, pid, kind, element), values in series.items():
            moves = moves_one_way(values, down=kind == "mul")
            if moves is None:
                against.add(pid)
            elif moves >= _MOVES:
                by_pid.setdefault(pid, []).append(kind)
                if element is not None and element[0] == 0 and elements.get(pid, set()) is not None:
                    elements.setdefault(pid, set()).add(element[1])
                else:
                    elements[pid] = None
            elif len(values) < self.per_line:
                return  # not moved often enough yet: looked at again at the next backward
            looked = max(looked, len(values))
        by_pid = {pid: kinds for pid, kinds in by_pid.items() if pid not in against}
        if not by_pid:
            return
        self._done.add(loc)
        kinds = sorted({kind for found in by_pid.values() for kind in found})
        told = sorted(by_pid)[:64]
        indices = [sorted(elements[pid]) if elements.get(pid) is not None else None for pid in told]
        self.rec.emit_aside(ev.loss_weight_learned(params=told, kinds=kinds, elements=indices,
                                                   terms=sum(len(v) for v in by_pid.values()),
                                                   backwards=looked, line=getattr(loc, "line", None),
                                                   reversed=[pid in self._reversed_pids for pid in told]),
                            loc)

    @staticmethod
    def _reversed(root, terms, others) -> dict:
        """``{(id(leaf), element): [regulariser nodes]}`` for the weighted terms whose leaf the
        loss reaches otherwise only through regulariser terms that push it the same way as the
        term does (Kendall's ``exp(-s) * loss - s``: both make the loss fall as ``s`` grows), so
        that nothing bounds it."""
        found: dict = {}
        regularisers = None
        for node, index, kind, leaf, element in terms:
            if not held(others, leaf, element):
                continue
            factor = node.next_functions[index][0]
            direction = chain_direction(factor)
            if direction is None:
                continue
            slope = direction if kind == "mul" else -direction  # the term's, the loss >= 0
            if regularisers is None:
                regularisers = regulariser_terms(root)
            same = [r for r in regularisers if r[2] is leaf and (r[3] == element or r[3] is None)]
            if same and all(r[1] == slope for r in same):
                found[(id(leaf), element)] = [r[0] for r in same]
        return found

    def install(self, patcher) -> None:
        pass
