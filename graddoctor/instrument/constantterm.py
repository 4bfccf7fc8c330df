"""Loss terms whose value does not move while the loss does: a term constant by construction,
which passes its parameters no gradient.

``reg = ((1 - alphas.sum(dim=2)) ** 2).mean()`` where the attention weights ``alphas`` are a
softmax over dim 2 (the doubly stochastic penalty summed over the pixels, which always add up
to 1, instead of over the time steps), ``((z.norm(dim=1) - 1) ** 2).mean()`` of a ``z`` that
``F.normalize`` already made unit-length, a load-balancing loss whose mean probability is taken
over the experts (``1 / E`` for every token) instead of over the tokens, ``p.sum(dim=1)`` of a
softmax over dim 1 where ``dim=0`` was meant: each is a number the model cannot change. The
term is computed, weighted and added, and it does nothing; the regulariser the script was
written for is absent.

How it is seen: at the first ``_LOOKED`` backwards of each backward line (``_LINES`` lines at
most), the loss's linear top (sums, differences, negations, views, products and quotients by
constants) is walked from its root, and the scalar tensors of the backward's frames (the user's
innermost two) whose ``grad_fn`` lies on that top are read: each is a named term of the loss
(``reg``, ``aux``), with the loss's own value beside it. At the last of those backwards a term
is *constant* when its values agree to ``_SAME`` of their size, or all lie within ``_TINY``
of zero against the loss's size, while the loss's values spread by ``_MOVED`` of their size or
more (the run moved: new batches, updated parameters). Such a term is recorded (a
``constant_term`` aside event, loc: the backward) when also

* it shares a computed activation with the rest of the loss (a node below it that the loss
  reaches outside it): a penalty on the parameters alone (an L2 term at a tiny learning rate,
  an orthogonality penalty at an orthogonal initialisation) moves too little to tell from a
  constant and is no activation's function; and
* no saturating op (a ReLU, a clamp, a max or min, a ``torch.where``, a rounding, a selection
  by a mask: ``masked_fill``, ``h[keep]``) lies in what
  only the term computes (below it, outside the rest of the loss): a hinge that is not yet
  active (``relu(|logits| - 50)``) is zero for now, not by construction; and
* no factor of zero makes it zero (``0 * logits.sum()``, a term kept in the graph on purpose);
  and
* it is no product or quotient with a tensor that carries no gradient (a Python number aside):
  a confidence mask that keeps no sample yet makes ``(ce * mask).mean()`` zero for now, and
  ``l / l.detach()`` is 1 by construction but passes ``l``'s gradient on purpose.

Cost: at the first backwards of each line, a walk of the loss's top, a read of the frames'
variables (their ``grad_fn`` only) and one ``.item()`` per named term; the walks below a
term at the last of them, for a term found constant only. CPU tensors only (no host sync).
"""

from __future__ import annotations

import sys

import torch

from .. import events as ev
from .graphpaths import reached
from .lossfactor import python_number
from .lossterms import PerLine, loss_root

_LOOKED = 4  # backwards per line whose terms are read
_LINES = 8  # backward lines looked at, at most
_TOP = 256  # nodes of the loss's linear top walked
_FRAMES_READ = 2  # the user's frames read, innermost first
_NAMES_READ = 2000  # a frame's variables read, at most
_TERMS = 16  # named terms followed per line
_BELOW = 4000  # nodes walked below a constant term and beside it
_SAME = 1e-6  # relative spread of a constant's values (float rounding of a sum of ones)
_TINY = 1e-9  # values this small against the loss are zero
_MOVED = 1e-3  # relative spread of the loss's values that says the run moved
_PRINTED = 1 << 16  # elements of a frame tensor fingerprinted, at most
# the linear top: a term's value reaches the loss through these unchanged in kind
_TOP_OPS = ("AddBackward", "SubBackward", "RsubBackward", "NegBackward", "MulBackward", "DivBackward",
            "ViewBackward", "ReshapeAliasBackward", "UnsafeViewBackward", "SqueezeBackward",
            "UnsqueezeBackward", "CloneBackward", "ToCopyBackward", "AliasBackward")
# ops below which a zero is saturation, not construction (an inactive hinge)
_SATURATING = ("ReluBackward", "ClampBackward", "ClampMinBackward", "ClampMaxBackward",
               "ThresholdBackward", "HardtanhBackward", "MaximumBackward", "MinimumBackward",
               "WhereBackward", "MaxBackward", "MinBackward", "AbsBackward", "SoftplusBackward",
               "SignBackward", "RoundBackward", "FloorBackward", "CeilBackward",
               # a selection by a mask that may keep nothing yet
               "MaskedFillBackward", "MaskedScatterBackward", "MaskedSelectBackward", "IndexBackward")


def _children(node) -> list:
    return [child for child, _ in getattr(node, "next_functions", ()) if child is not None]


def linear_top(root, limit: int = _TOP) -> set:
    """The nodes of the loss's linear top, ``root`` included (see the module's docs)."""
    seen: set = set()
    stack = [root]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__.startswith(_TOP_OPS):
            stack.extend(_children(node))
    return seen


def _zero_factor(node, limit: int = 32) -> bool:
    """Whether the term's own linear top multiplies by a constant zero (``0 * logits.sum()``)."""
    stack, seen = [node], 0
    while stack and seen < limit:
        node = stack.pop()
        seen += 1
        name = type(node).__name__
        if name.startswith("MulBackward"):
            for attr in ("_saved_other", "_saved_self"):
                if python_number(getattr(node, attr, None)) == 0.0:
                    return True
        if name.startswith(_TOP_OPS):
            stack.extend(_children(node))
    return False


def _beside(root, term, limit: int = _BELOW) -> set:
    """The nodes the loss reaches without passing through ``term``."""
    seen: set = set()
    stack = [root]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or node is term or node in seen:
            continue
        seen.add(node)
        stack.extend(_children(node))
    return seen


def judge(root, term) -> set | None:
    """For a term found constant that is an activation's constant (see the module's docs: it
    shares a computed node with the rest of the loss, holds no saturating op and no zero
    factor), the nodes only it computes; else None."""
    nodes = reached(term, _BELOW, truncate=True)[0]
    beside = _beside(root, term)
    own = nodes - beside  # what only the term computes: where a hinge would saturate
    if any(type(node).__name__.startswith(_SATURATING) for node in own) or _zero_factor(term) \
            or any(_data_operand(node) for node in own):
        return None
    if not any(getattr(node, "variable", None) is None for node in nodes & beside):
        return None
    return own


def _data_operand(node) -> bool:
    """A product or quotient of the term with a tensor that carries no gradient and is no Python
    number: a mask (``(ce * mask).mean()`` with no sample above the threshold yet: zero for now)
    or the term's own detached copy (``l / l.detach()``, 1 by construction with a gradient)."""
    if not type(node).__name__.startswith(("MulBackward0", "DivBackward0")):
        return False
    for index, (child, _) in enumerate(node.next_functions):
        if child is None:
            value = getattr(node, "_saved_other" if index == 1 else "_saved_self", None)
            if isinstance(value, torch.Tensor) and python_number(value) is None:
                return True
    return False


def _fingerprint(tensor) -> tuple[float, float]:
    """Two numbers that change when a tensor's values do: their sum and the sum of their
    squares."""
    values = tensor.detach().double()
    return float(values.sum()), float((values * values).sum())


def _origin(term, own: set, constants: dict) -> str | None:
    """Of the frame's tensors whose values stayed the same too (``constants``, by name), the
    one computed only for the term farthest below it (``usage`` for ``balance = (usage *
    log(usage * K)).sum()``): where the constant is made. None: no such tensor."""
    where = {tensor.grad_fn: name for name, tensor in constants.items() if tensor.grad_fn in own}
    found, level, seen = None, [term], set()
    while level and len(seen) < _BELOW:
        following = []
        for node in level:
            if node in seen:
                continue
            seen.add(node)
            if node in where:
                found = where[node]
            following.extend(child for child in _children(node) if child in own)
        level = following
    return found


def constant(values: list, totals: list) -> bool:
    """Whether ``values`` hold one number (to ``_SAME`` of their size, or all within ``_TINY``
    of zero against the loss) while ``totals`` moved by ``_MOVED`` of theirs."""
    size = max(abs(v) for v in totals)
    if size == 0 or (max(totals) - min(totals)) < _MOVED * size:
        return False
    largest = max(abs(v) for v in values)
    if largest <= _TINY * size:
        return True
    return (max(values) - min(values)) <= _SAME * largest


class ConstantTermWatcher:
    """A DESCRIBE_LOSS subscriber (see the module's docs)."""

    def __init__(self, rec):
        self.rec = rec
        self._lines = PerLine(_LOOKED, _LINES)
        self._read: dict = {}  # backward location -> ([loss values], {name: [values]})
        self._told: set = set()

    def describe_loss(self, tensors) -> dict:
        lines = self._lines
        if lines.exhausted:
            return {}
        root = loss_root(tensors)
        if root is None or not isinstance(tensors, torch.Tensor) or tensors.device.type != "cpu" \
                or tensors.numel() != 1:
            return {}
        loc = self.rec.here()
        if loc in self._told or not lines.admit(loc):
            return {}
        try:
            self._look(tensors, root, loc, lines.seen.get(loc, 0))
        except Exception as exc:
            self.rec.internal_error("constant_term", exc)
        return {}

    def _look(self, loss, root, loc, count: int) -> None:
        top = linear_top(root)
        top.discard(root)
        named = self._named()
        totals, terms, prints = self._read.setdefault(loc, ([], {}, {}))
        if len(totals) != count - 1:
            return  # a backward of this line was not read (an error): its values do not line up
        totals.append(float(loss.detach()))
        for name, tensor in named.items():
            node = tensor.grad_fn
            if node in top and tensor.numel() == 1:
                if (name in terms or count == 1) and (len(terms) < _TERMS or name in terms):
                    terms.setdefault(name, []).append(float(tensor.detach()))
            elif name in prints or count == 1:
                prints.setdefault(name, []).append(_fingerprint(tensor))
        for held in (terms, prints):
            for name in [name for name, values in held.items() if len(values) != count]:
                del held[name]  # a value not read at every backward is not compared
        if count < _LOOKED:
            return
        del self._read[loc]
        tracked = self.rec.tensors
        for name, values in terms.items():
            if not constant(values, totals):
                continue
            node = named[name].grad_fn
            own = judge(root, node)
            if own is None:
                continue
            leaves = reached(node, _BELOW, truncate=True)[1]
            pids = sorted(pid for i in leaves
                          if (pid := tracked.number.get(i)) is not None and id(tracked.refs[pid]()) == i)
            if not pids:
                continue
            self._told.add(loc)
            origin = _origin(node, own, {n: named[n] for n, v in prints.items()
                                         if all(constant(list(column), totals) for column in zip(*v))})
            self.rec.emit_aside(ev.constant_term(name=name, value=values[-1], loss_low=min(totals),
                                                 loss_high=max(totals), params=pids[:64],
                                                 origin=origin), loc)
            return

    def _named(self) -> dict:
        """The CPU tensors with a graph in the backward's frames, by variable name (the
        innermost frame's first)."""
        found: dict = {}
        frames = []
        for frame in self.rec.finder.user_frames(sys._getframe(2)):
            frames.append(frame)
            if len(frames) >= _FRAMES_READ:
                break
        try:
            for frame in frames:
                for i, (name, value) in enumerate(frame.f_locals.items()):
                    if i >= _NAMES_READ:
                        break
                    if not isinstance(value, torch.Tensor) or name in found:
                        continue
                    if value.grad_fn is not None and value.device.type == "cpu" \
                            and value.numel() <= _PRINTED and value.is_floating_point():
                        found[name] = value
        finally:
            del frames
        return found

    def install(self, patcher) -> None:
        pass
