"""Loss terms reduced over the batch in two different ways: one summed over the samples, another
averaged over them.

``loss = recon + beta * kl`` with ``recon = mse_loss(x_hat, x)`` (a mean over the batch) and
``kl = -0.5 * torch.sum(1 + logvar - mu**2 - logvar.exp())`` (a sum over the batch) weights the
KL by the batch size: at batch 32 it counts 32 times what ``beta`` says, at 256 eight times more
again. The balance the script chose holds at one batch size only, and changing the batch size
silently retunes the regulariser (and the effective learning rate of that term). The same holds
for an auxiliary loss built with ``reduction="sum"``, an activation penalty ``h.abs().sum()``
next to a mean task loss, a per-sequence loss summed over the batch next to a per-token mean.

At a backward (the first ``_LOOKED`` of each backward line; ``describe_loss``) the loss's graph is
walked from its root through its additive top (sums and differences, negations, views, products
and quotients by constants: ``_top_terms``). Each scalar term found there is a reduction: a
``sum``/``mean`` chain (views between) or a loss node with ``reduction="mean"``/``"sum"``. Its
*batch axis* is axis 0 of the value that chain reduces (the per-element value, shape (N, ...)),
followed up the chain through the views that keep or merge it (``(B, T, V) -> (B*T, V)``); it is
*averaged* when a mean reduces it or when constants the term is divided by hold a multiple of N
(``.sum() / x.size(0)``, ``.sum() / x.numel()``, ``reduction="batchmean"``) or weights that
add up to 1 multiply it (a weighted mean) or a count of the order of N divides it (above N/4:
the rows kept by cross_entropy's label smoothing with ignore_index, the tokens of a transformers
accumulation window), *summed* when a sum reduces it and nothing divides it by as much. A product by a constant is a weight (``beta * kl``), never a divisor (one that is exactly 1/N is noted
``times_reciprocal``: TRADES' ``(1.0 / batch_size) * kl_sum``, which the rule tells from a weight by the
script's text); a quotient by a count
the script computed (``/ mask.sum()``) ends the walk: that term is not judged. A mean over an
(N, N) matrix (a kernel's pairs) is not taken for a mean over samples. Below a mean over the
batch, the walk goes on through the per-sample value's additions (``_broadcast_sums``): a scalar
sum over the batch added to every row (``log_det = log_det + s.sum()`` where ``s.sum(dim=1)``
was meant, ``(recon + kl.sum()).mean()``) is a summed term too, since the mean of a value
repeated in every row is that value; its averaged partner is the mean around it, and the two
must share a per-sample activation outside the sum's own graph. A term of each kind is
reported (a ``batch_reduction`` aside event) when

* the summed term's N is at least 2 and the averaged term's N is a multiple of it (the same
  samples, or their tokens), and
* both are computed from one per-sample activation: a node below both whose output has N rows
  (not a parameter: a penalty ``sum(p.pow(2).sum() ...)`` shares only parameters with the loss,
  and a parameter with N rows is no batch).

Where the summed term's value is bound to a variable of the backward's frame (``kl``), the
event names it (the rule points at its assignment).

Cost: at the first backwards of each line, a walk of the loss's top (``_NODES``), and below the
two terms a walk of at most ``_BELOW`` nodes each; a read of the frame's variables (their
``grad_fn`` only) when a pair is found.
"""

from __future__ import annotations

import math
import sys

import torch

from .. import events as ev
from .graphpaths import saved, saved_dims
from .lossfactor import python_number
from .lossterms import LossGraphReader

_NODES = 256  # nodes of the loss's additive top walked
_BELOW = 4000  # nodes walked below each term to find the per-sample activation both share
_CHAIN = 12  # reductions and views followed below a term's top reduction
_NAMES_READ = 2000  # a frame's variables read, at most
_FRAMES_READ = 2  # the user's frames read, innermost first
_VIEWS = frozenset({"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "SqueezeBackward0",
                    "SqueezeBackward1", "SqueezeBackward2", "SqueezeBackward3", "UnsqueezeBackward0",
                    "CloneBackward0", "ToCopyBackward0", "AliasBackward0", "ExpandBackward0"})
_MEANS = frozenset({"MeanBackward0", "MeanBackward1"})
_SUMS = frozenset({"SumBackward0", "SumBackward1"})


def _children(node) -> list[tuple[int, object, int]]:
    return [(i, child, nr) for i, (child, nr) in enumerate(node.next_functions) if child is not None]


def _shape_of(node, output: int = 0) -> tuple | None:
    """The shape of output ``output`` of ``node``'s forward (its metadata), or None."""
    try:
        return tuple(int(s) for s in node._input_metadata[output].shape)
    except Exception:  # a node without metadata
        return None


def _constant(node, name: str) -> float | None:
    """A Python number a product or quotient saved (``/ x.size(0)``, ``* 0.5``), or None: a
    0-d tensor the script computed (``/ mask.sum()``, ``/ num_items``) is a count of its own,
    whose relation to the batch is not known."""
    value = saved(node, name)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return python_number(value)


def _axis_after_view(before: tuple, after: tuple) -> bool:
    """Does a view of ``before`` into ``after`` keep axis 0 as (the leading part of) axis 0?"""
    if not before or not after:
        return False
    if after[0] == before[0]:
        return True
    # leading axes merged: (B, T, V) -> (B*T, V)
    product = 1
    for size in before:
        product *= size
        if product == after[0]:
            return True
        if product > after[0]:
            return False
    return False


class Term:
    """One scalar term of the loss's additive top, reduced over its batch axis. ``inside``: for
    a sum broadcast into every sample's value before a mean (``log_det + s.sum()``), the mean's
    term; None for a term of the top itself."""

    __slots__ = ("top", "path", "reduction", "value", "n", "how", "divisor", "inside", "factors")

    def __init__(self, top, path, reduction, value, n, how, divisor, inside=None, factors=()):
        self.top, self.path, self.reduction = top, path, reduction
        self.value, self.n, self.how, self.divisor = value, n, how, divisor
        self.inside = inside
        self.factors = factors  # the constants the term is multiplied by (weights, as a rule)

    @property
    def averaged(self) -> bool:
        if self.how == "mean":
            return True
        # divided by N or by a count of the order of N: a mean over the rows kept (torch's own
        # label smoothing divides its sum by the targets not ignored, the transformers loss by
        # the tokens of the whole accumulation window: int64 counts that read like Python
        # numbers); a small constant (`kl.sum() / 2`, a temperature) leaves a sum
        d = self.divisor
        return d >= 4 and d > self.n / 4

    @property
    def times_reciprocal(self) -> bool:
        """Multiplied by a constant that is exactly 1 / N: a weight (``0.125 * h.abs().sum()``
        at N = 8) or a mean written as a product (TRADES' ``(1.0 / batch_size) * kl_sum``),
        which only the script's text tells apart."""
        return self.n >= 2 and any(abs(f / self.divisor * self.n - 1) < 1e-6 for f in self.factors)


def _loss_reduction(node) -> str | None:
    """'mean' or 'sum' for a loss node (``mse_loss``, ``cross_entropy``'s nll, BCE, ...) that
    reduces its input itself; None for any other node or ``reduction="none"``."""
    reduction = saved(node, "_saved_reduction")
    if isinstance(reduction, bool) or not isinstance(reduction, int):
        return None
    return {1: "mean", 2: "sum"}.get(reduction)


def _spans_batch(weights, value) -> bool:
    """Do ``weights`` vary along the batch axis of the product ``value``: as many axes as it,
    the first of them more than one row? A 0/1 mask over the features (``(1 - mask)`` of a
    coupling layer, shape (D,)) that happens to add up to 1 weighs no samples."""
    shape = _shape_of(value)
    return weights.dim() > 0 and shape is not None and weights.dim() == len(shape) \
        and weights.shape[0] > 1


def _weighted(value, name: str) -> str:
    """"mean" for a sum of values multiplied by weights that the script computed and that add up
    to 1 (``(softmax(scores.detach(), 0) * per_sample).sum()``, or a softmax with its graph: a
    weighted mean), else "sum"."""
    if type(value).__name__ != "MulBackward0":
        return "sum"
    children = _children(value)
    if len(children) == 2:  # weights with a graph: a softmax of the scores, not detached
        soft = [i for i, child, _ in children if type(child).__name__.startswith("SoftmaxBackward")]
        if len(soft) != 1:
            return "sum"
        weights = saved(value, "_saved_self" if soft[0] == 0 else "_saved_other")
        if not isinstance(weights, torch.Tensor) or not _spans_batch(weights, value):
            return "sum"
        return "mean" if abs(float(weights.detach().sum()) - 1.0) < 1e-3 else "sum"
    if len(children) != 1:
        return "sum"
    weights = saved(value, "_saved_other" if children[0][0] == 0 else "_saved_self")
    if not isinstance(weights, torch.Tensor) or not _spans_batch(weights, value) or weights.requires_grad \
            or not weights.is_floating_point():
        return "sum"
    total = float(weights.detach().sum())
    return "mean" if abs(total - 1.0) < 1e-3 else "sum"


def _batch_reduction(top) -> tuple[object, str, int] | None:
    """``(per-element value node, 'sum'|'mean', N)`` when ``top`` (a scalar) reduces a value of
    shape (N, ...) over its axis 0 through a chain of sums and means (views between), or is a
    loss node reducing its (N, ...) input; the kind of reduction that took the batch axis."""
    shape = _shape_of(top)
    if shape is None or math.prod(shape) != 1:
        return None
    loss = _loss_reduction(top)
    if loss is not None:
        children = _children(top)
        if not children or children[0][0] != 0:
            return None  # the input carries no gradient
        _, child, nr = children[0]
        below = _shape_of(child, nr)
        if not below or below[0] < 2:
            return None
        return child, loss, below[0]
    chain = []  # (node, kind) from the top down
    node = top
    for _ in range(_CHAIN):
        name = type(node).__name__
        children = _children(node)
        if len(children) != 1:
            break
        if name in _MEANS or name in _SUMS or name in _VIEWS:
            chain.append((node, name))
            node, nr = children[0][1], children[0][2]
            continue
        break
    if not chain or not any(n in _MEANS or n in _SUMS for _, n in chain):
        return None
    value = node
    last = chain[-1][0]
    nr = _children(last)[0][2]
    shape = _shape_of(value, nr)
    if not shape or shape[0] < 2:
        return None
    n, axis = shape[0], True  # axis: the batch axis is still axis 0 of the current value
    current = shape
    for node, name in reversed(chain):  # bottom up
        after = _shape_of(node)
        if after is None:
            return None
        if name in _VIEWS:
            if not _axis_after_view(current, after):
                return None  # the batch axis moved: not followed
            current = after
            continue
        kind = "mean" if name in _MEANS else _weighted(value, name)
        if name.endswith("Backward0"):  # a full reduction takes every axis, the batch's too
            return value, kind, n
        dims = saved_dims(node)  # signed: dim=-1 is saved as 2**64 - 1
        if not isinstance(dims, (tuple, list)):
            return None
        rank = len(current)
        dims = {int(d) % rank for d in dims} if rank else set()
        if not dims:
            return value, kind, n  # dim=() or [] reduces every axis
        if 0 in dims:
            return value, kind, n
        keepdim = saved(node, "_saved_keepdim")
        current = after
        if not keepdim and (not current or current[0] != n):
            return None
    return None


def _divides_by(name: str, value: float) -> float:
    """What a quotient or product by a constant divides the term by: a quotient's divisor; a
    product divides by nothing (``beta * kl``, ``5e-3 * off_diagonal``: weights, whatever their
    reciprocal)."""
    return abs(value) if name.startswith("Div") else 1.0


def _times(name: str, value: float) -> tuple:
    """The constant a product multiplies the term by (none for a quotient)."""
    return () if name.startswith("Div") else (abs(value),)


def _top_terms(root, limit: int = _NODES) -> list[Term]:
    """The batch-reduced scalar terms of the loss's additive top (see the module's docs)."""
    terms: list[Term] = []
    stack = [(root, 1.0, (), ())]
    seen = 0
    while stack and seen < limit:
        node, divisor, factors, path = stack.pop()
        seen += 1
        name = type(node).__name__
        children = _children(node)
        path = path + (node,)
        found = _batch_reduction(node)
        if found is not None:
            value, how, n = found
            term = Term(node, path, node, value, n, how, divisor, factors=factors)
            terms.append(term)
            if how == "mean":
                terms.extend(_broadcast_sums(term))
            continue
        if name in ("AddBackward0", "SubBackward0"):
            # a sum of terms divided as a whole (`(a.sum() + b.sum()) / n`): each term is
            stack.extend((child, divisor, factors, path) for _, child, _ in children)
        elif name in ("AddBackward1", "SubBackward1", "RsubBackward1", "NegBackward0") or name in _VIEWS:
            stack.extend((child, divisor, factors, path) for _, child, _ in children)
        elif name in ("MulBackward0", "DivBackward0"):
            if len(children) != 1:
                continue  # a product of two computed values: not a constant weight
            index, child, _ = children[0]
            if name == "DivBackward0" and index != 0:
                continue
            value = _constant(node, "_saved_other" if index == 0 else "_saved_self")
            if not value:
                continue
            stack.append((child, divisor * _divides_by(name, value), factors + _times(name, value), path))
        elif name in ("MulBackward1", "DivBackward1"):
            value = _constant(node, "_saved_other")
            if not value:
                continue
            stack.extend((child, divisor * _divides_by(name, value), factors + _times(name, value), path)
                         for _, child, _ in children)
    return terms


def _broadcast_sums(mean: Term, limit: int = _NODES) -> list[Term]:
    """The sums over the batch added to every sample's value below a mean over the batch
    (``(log_prob + log_det).mean()`` with ``log_det = log_det + s.sum()``, a per-sample
    log-det reduced over the batch too; ``(recon + kl.sum()).mean()``): a scalar operand of an
    addition or subtraction whose other side keeps the N rows, walked from the mean's value
    through additions, negations, views and products or quotients by constants. The mean of a
    value broadcast to every row is that value: such a sum keeps its full weight in the loss,
    the mean's divisor does not reach it."""
    out: list[Term] = []
    n = mean.n
    stack = [(mean.value, mean.divisor, mean.path)]
    seen: set = set()
    while stack and len(seen) < limit:
        node, divisor, path = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        shape = _shape_of(node)
        if not shape or shape[0] != n:
            continue  # only the per-sample part is walked: a scalar below is judged by its parent
        name = type(node).__name__
        children = _children(node)
        path = path + (node,)
        if name in ("AddBackward0", "SubBackward0"):
            for _, child, nr in children:
                below = _shape_of(child, nr)
                if below is not None and math.prod(below) == 1 and len(below) < len(shape):
                    for top, weight, inner in _scalar_terms(child):
                        found = _batch_reduction(top)
                        if found is not None and found[1] == "sum":
                            value, how, rows = found
                            term = Term(top, path + inner, top, value, rows, how, divisor * weight,
                                        inside=mean)
                            if not term.averaged and rows == n:
                                out.append(term)
                    continue
                stack.append((child, divisor, path))
        elif name in ("AddBackward1", "SubBackward1", "RsubBackward1", "NegBackward0") or name in _VIEWS:
            stack.extend((child, divisor, path) for _, child, _ in children)
        elif name in ("MulBackward0", "DivBackward0") and len(children) == 1:
            index, child, _ = children[0]
            if name == "DivBackward0" and index != 0:
                continue
            value = _constant(node, "_saved_other" if index == 0 else "_saved_self")
            if value:
                stack.append((child, divisor * _divides_by(name, value), path))
    return out


def _scalar_terms(node, limit: int = 32) -> list[tuple[object, float, tuple]]:
    """The scalar terms of a scalar's additive top (``0.0 + ld_1 + ld_2``, ``0.5 * kl.sum()``):
    ``(node, divisor, path)`` below sums, differences, negations and products or quotients by
    constants (what those divide by); a product of two computed values is left out."""
    out = []
    stack = [(node, 1.0, (node,))]
    seen = 0
    while stack and seen < limit:
        node, divisor, path = stack.pop()
        seen += 1
        name = type(node).__name__
        children = _children(node)
        if name in ("AddBackward0", "SubBackward0"):
            stack.extend((child, divisor, path + (child,)) for _, child, _ in children)
        elif name in ("AddBackward1", "SubBackward1", "RsubBackward1", "NegBackward0") or name in _VIEWS:
            stack.extend((child, divisor, path + (child,)) for _, child, _ in children)
        elif name in ("MulBackward0", "DivBackward0") and len(children) == 1:
            index, child, _ = children[0]
            if name == "DivBackward0" and index != 0:
                continue
            value = _constant(node, "_saved_other" if index == 0 else "_saved_self")
            if value:
                stack.append((child, divisor * _divides_by(name, value), path + (child,)))
        elif name in ("MulBackward1", "DivBackward1") and len(children) == 1:
            value = _constant(node, "_saved_other")
            if value:
                stack.append((children[0][1], divisor * _divides_by(name, value), path + (children[0][1],)))
        else:
            out.append((node, divisor, path))
    return out


def _pairwise(value) -> bool:
    """Is the reduced value an (N, N) matrix (pairs of samples)?"""
    shape = _shape_of(value)
    return shape is not None and len(shape) == 2 and shape[0] == shape[1]


def _per_sample_nodes(value, n: int, limit: int = _BELOW, skip=None) -> set:
    """The nodes below ``value`` (itself included) whose output has ``n`` rows, parameters'
    leaves left out; ``skip``: a node not walked into (a broadcast sum's own graph)."""
    out: set = set()
    seen: set = set() if skip is None else {skip}
    stack = [value]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "AccumulateGrad":
            continue
        shape = _shape_of(node)
        if shape and shape[0] == n:
            out.add(node)
        stack.extend(child for _, child, _ in _children(node))
    return out


def mixed_terms(root) -> tuple[Term, Term] | None:
    """``(summed term, averaged term)`` of the loss at ``root`` (see the module's docs), or None."""
    terms = _top_terms(root)
    summed = [t for t in terms if not t.averaged]
    # a mean over an (N, N) matrix (a kernel's, a similarity's) is one over pairs of samples
    averaged = [t for t in terms if t.averaged and not _pairwise(t.value)]
    for s in summed:
        below = None
        for a in averaged:
            if a.n % s.n or a.top is s.top:
                continue
            if s.inside is not None:
                if a is not s.inside:
                    continue
                below = _per_sample_nodes(s.value, s.n)
                # the rest of the mean's value (its other rows' terms), the broadcast sum left out
                if below & _per_sample_nodes(a.value, a.n, skip=s.top):
                    return s, a
                continue
            if below is None:
                below = _per_sample_nodes(s.value, s.n)
                if not below:
                    break
            shared = _per_sample_nodes(a.value, s.n) if a.n != s.n else _per_sample_nodes(a.value, a.n)
            if below & shared:
                return s, a
    return None


def _bound_name(frames, path: tuple, term_top) -> str | None:
    """The variable of ``frames`` (innermost first) bound to the node on the term's path nearest
    its reduction (``kl`` for ``loss = recon + beta * kl``), or None."""
    wanted = {id(node): depth for depth, node in enumerate(path[1:])}  # the root is the loss
    best = None
    for frame in frames:
        for i, (name, value) in enumerate(frame.f_locals.items()):
            if i >= _NAMES_READ:
                break
            if type(value) is not torch.Tensor and not isinstance(value, torch.Tensor):
                continue
            node = value.grad_fn
            depth = wanted.get(id(node)) if node is not None else None
            if depth is not None and (best is None or depth > best[0]):
                best = (depth, name)
        if best is not None:
            return best[1]
    return None


class BatchReductionWatcher(LossGraphReader):
    label = "batch_reduction"

    def install(self, patcher) -> None:
        pass

    def _judge(self, root, loc) -> None:
        pair = mixed_terms(root)
        if pair is None:
            return
        summed, averaged = pair
        frames = []
        for frame in self.rec.finder.user_frames(sys._getframe(1)):
            frames.append(frame)
            if len(frames) >= _FRAMES_READ:
                break
        try:
            path = summed.path
            if summed.inside is not None:  # the name of the per-sample value that holds the sum
                path = (path[0],) + tuple(node for node in path[1:] if (_shape_of(node) or (0,))[0] == summed.n
                                          and math.prod(_shape_of(node)) > 1)
            name = _bound_name(frames, path, summed.top)
            other = _bound_name(frames, averaged.path, averaged.top)
        finally:
            del frames
        self._done.add(loc)
        self.rec.emit_aside(ev.batch_reduction(
            summed=_describe(summed), averaged=_describe(averaged), batch=summed.n,
            averaged_rows=averaged.n, summed_name=name, averaged_name=other,
            broadcast=summed.inside is not None, times_reciprocal=summed.times_reciprocal), loc)


def _describe(term: Term) -> str:
    """How a term reduces: the op that took its batch axis (``sum``, ``mean``,
    ``MseLoss(reduction=sum)``), and what divides a sum (``sum / 32``)."""
    name = type(term.reduction).__name__
    if name in _MEANS or name in _SUMS or name in _VIEWS:
        said = term.how
    else:
        said = f"{name.replace('Backward0', '').replace('Backward1', '')}(reduction={term.how})"
    if term.how == "sum" and term.averaged:
        said += f" / {term.divisor:g}"
    return said
