"""A masked per-element loss averaged over every position, the masked-out ones included:
``(loss * mask).mean()``, ``(loss * mask).sum() / loss.numel()``, ``torch.where(valid, l, 0).mean()``,
``l.masked_fill(pad, 0).mean()``.

The zeros the mask puts in still count in the mean's denominator, so the loss (and its
gradient) is scaled by the share of positions the mask keeps: a batch with more padding trains
with a smaller step, and the reported loss is off by that share. ``.sum() / mask.sum()``,
``ignore_index`` with the loss's own mean or ``loss[mask].mean()`` divide by the kept positions
only; ``reduction="none"`` with ``ignore_index`` (-100, a pad id) then a plain ``.mean()`` is the
masked mean again: the ignored targets give 0 and still count.

Read from the autograd graph of the backpropagated loss, at the first ``_WINDOW`` backwards:

* ``Tensor.mean``/``Tensor.sum`` are wrapped until then (put back after: no cost for the rest
  of the run; ``torch.mean``/``torch.sum`` are not, being compared as values by libraries, and a
  mean taken with them is located at the backward). A call from the user's code on a tensor whose
  ``grad_fn`` is a product, a ``where`` or a ``masked_fill`` (or a view of one) notes that node
  with the call's line: the line that takes the mean.
* At each of those backwards (``DESCRIBE_LOSS``), the loss's linear top is walked (sums,
  negations, products and quotients by a Python number) to its reductions. A chain of ``mean``
  and ``sum`` reductions (views between them) over a masking node, whose mean sizes times some
  run of constant divisors right above it equal the number of elements of that node, averages
  it over every position: a masking node is a product of a gradient-carrying value and a
  constant tensor holding only 0s and 1s, a ``where`` with one gradient-carrying branch, a
  ``masked_fill``, or an unreduced ``nll_loss``/``cross_entropy`` (its saved targets against its
  saved ``ignore_index``). The mask is read through graphpaths' ``saved`` (never unpacked). With at least
  ``_MIN_ZEROS`` of its (broadcast) elements masked out, a ``masked_mean`` aside event records
  the kept share and whether the mask equals the first one seen at that line (a constant of the
  model: a fixed triangle over pairs), at the mean's line (else the backward's).

Silent: a one-dimensional masked value of samples, no sequence or image axis flattened into
it below (``(ce(logits_u, pseudo, reduction="none") * (confidence >= tau)).mean()``: FixMatch's
unlabelled loss, an average over every sample by definition); a sum divided by a computed count (``mask.sum()``, clamped or not; per-row counts);
``masked_select``/boolean indexing (no mask in the graph: the padding is gone); a per-row sum
averaged over the rows (``(l * m).sum(1).mean()``: a sum per sequence, by design); weights that
are not 0/1; masks without zeros; a dropout inside the model (under a layer, not at the loss's
reduction); attention masks (inside the model).
"""

from __future__ import annotations

import math
import sys

import torch

from .. import events as ev
from .graphpaths import saved, signed
from .inlinable import watched
from .lossfactor import python_number
from .losswindow import LossWindow
from .recorder import Recorder
from .patcher import put_back

_WINDOW = 4  # backwards looked at; the wrappers go at the last one
_LINES = 8  # backward lines looked at, at most
_NODES = 256  # nodes of the loss's linear top walked per backward
_NOTED = 256  # masking nodes noted between two backwards, at most
_CHAIN = 12  # reductions and views walked below the top reduction, at most
_MIN_ZEROS = 0.10  # share of masked-out elements below which a mask is not judged

# an unreduced nll/cross-entropy masks too: its ignored targets (ignore_index: -100, a pad id)
# give 0 at their positions, which a plain mean still counts
_NLL = frozenset({"NllLossBackward0", "NllLoss2DBackward0"})
_MASKING = frozenset({"MulBackward0", "WhereBackward0", "MaskedFillBackward0"}) | _NLL
_VIEWS = frozenset({"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "SqueezeBackward0",
                    "SqueezeBackward1", "SqueezeBackward2", "UnsqueezeBackward0", "PermuteBackward0",
                    "TransposeBackward0", "TBackward0", "CloneBackward0", "ToCopyBackward0",
                    "AliasBackward0", "ExpandBackward0"})
_NOTE = _MASKING | _VIEWS
_MEANS = frozenset({"MeanBackward0", "MeanBackward1"})
_SUMS = frozenset({"SumBackward0", "SumBackward1"})


def _children(node) -> list[tuple[int, object]]:
    return [(i, child) for i, (child, _) in enumerate(node.next_functions) if child is not None]


def _numel(node) -> int | None:
    """The number of elements of the value ``node``'s forward made (from its metadata)."""
    try:
        return math.prod(int(s) for s in node._input_metadata[0].shape)
    except Exception:  # a node without metadata
        return None


def masked_share(node) -> tuple[object, str, int] | None:
    """``(mask, how, index)`` when ``node`` masks a gradient-carrying value with a constant:
    ``mask`` is True (or 1) where the value is kept, ``how`` is "product", "where",
    "masked_fill" or "ignore_index" (an unreduced nll loss: its targets other than the ignored
    index), ``index`` the operand position of the gradient-carrying value. None for any other
    node, or a product with a scalar or a computed tensor."""
    name = type(node).__name__
    children = _children(node)
    if len(children) != 1:
        return None  # both sides computed (or neither): no constant mask
    index = children[0][0]
    if name in _NLL:
        target, ignored = saved(node, "_saved_target"), saved(node, "_saved_ignore_index")
        if saved(node, "_saved_reduction") != 0 or not isinstance(target, torch.Tensor) \
                or not isinstance(ignored, int):
            return None
        return target != signed(ignored), "ignore_index", index
    if name == "MulBackward0":
        mask = saved(node, "_saved_other" if index == 0 else "_saved_self")
        if not isinstance(mask, torch.Tensor) or mask.dim() == 0 or mask.requires_grad:
            return None
        return mask, "product", index
    if name == "WhereBackward0":
        condition = saved(node, "_saved_condition")
        if not isinstance(condition, torch.Tensor) or condition.dtype != torch.bool:
            return None
        return (condition if index == 0 else ~condition), "where", index
    if name == "MaskedFillBackward0":
        filled = saved(node, "_saved_mask")
        if not isinstance(filled, torch.Tensor) or filled.dtype != torch.bool:
            return None
        return ~filled, "masked_fill", index
    return None


def _shape(node) -> tuple | None:
    """The shape of the value ``node``'s forward made (its metadata), or None."""
    try:
        return tuple(int(s) for s in node._input_metadata[0].shape)
    except Exception:
        return None


def per_sample(masking, index: int, limit: int = 12) -> bool:
    """Is the masked value one-dimensional with no axis flattened into it below (each element a
    sample: a confidence mask over a batch, not padding over tokens or pixels)? Looks at most
    ``limit`` nodes below the gradient-carrying operand for a view that merges leading axes
    (``logits.view(-1, V)`` of a (B, T, V) tensor)."""
    shape = _shape(masking)
    if shape is None or len(shape) != 1:
        return False
    children = dict(_children(masking))
    start = children.get(index)
    todo, seen = ([start] if start is not None else []), 0
    while todo and seen < limit:
        node = todo.pop()
        seen += 1
        below = _children(node)
        if type(node).__name__ in _VIEWS and len(below) == 1:
            out, inp = _shape(node), _shape(below[0][1])
            if out and inp and len(inp) > len(out) and out[0] == math.prod(inp[:len(inp) - len(out) + 1]) \
                    and inp[0] != out[0]:  # a squeezed (B, 1) keeps its samples
                return False  # (B, T, ...) viewed as (B*T, ...): positions, not samples
        todo.extend(child for _, child in below)
    return True


def _reduced(node) -> tuple[object, int, int, str] | None:
    """Below a reduction: ``(masking node, count, elements, reductions)`` when a chain of
    means and sums (views between them) reduces a masking node; ``count`` is the product of the
    sizes the means divided by, ``elements`` the masking node's number of elements."""
    count, names = 1, []
    for _ in range(_CHAIN):
        name = type(node).__name__
        children = _children(node)
        if name in _MEANS or name in _SUMS:
            if len(children) != 1:
                return None
            if name in _MEANS:
                after, before = _numel(node), _numel(children[0][1])
                if not after or not before:
                    return None
                count *= before // after
            names.append("mean" if name in _MEANS else "sum")
        elif name in _VIEWS:
            if len(children) != 1:
                return None
        elif name in _MASKING:
            elements = _numel(node)
            return (node, count, elements, "+".join(names)) if elements else None
        else:
            return None
        node = children[0][1]
    return None


def _averages_all(count: int, divisors: tuple, elements: int) -> float | None:
    """The divisor of the masked sum (the means' count times the run of constant divisors
    closest above them) when it equals the number of elements: a mean over every position."""
    total = float(count)
    for divisor in (1.0, *reversed(divisors)):
        total *= divisor
        if abs(total - elements) <= 1e-6 * elements:
            return total
    return None


def masked_means(root, limit: int = _NODES) -> list[tuple[object, object, str, str]]:
    """``[(masking node, top reduction node, how it was reduced, how it masks)]`` for each
    masked value the loss averages over all its elements (see the module's docs)."""
    found: list = []
    stack = [(root, ())]
    seen: set = set()
    while stack and len(seen) < limit:
        node, divisors = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        name = type(node).__name__
        children = _children(node)
        if name in _MEANS or name in _SUMS:
            chain = _reduced(node)
            if chain is not None:
                masking, count, elements, names = chain
                if _averages_all(count, divisors, elements) is not None:
                    found.append((masking, node, names if "mean" in names else names + "/numel", ""))
                continue
            stack.extend((child, ()) for _, child in children)
        elif name in ("DivBackward0", "MulBackward0"):
            if len(children) != 1 or (name == "DivBackward0" and children[0][0] != 0):
                continue  # a product of two computed values, or a constant divided by the loss
            index, child = children[0]
            value = python_number(saved(node, "_saved_other" if index == 0 else "_saved_self"))
            if not value:
                continue  # a computed count (mask.sum()), or a tensor weight: not a constant
            stack.append((child, divisors + ((value if name == "DivBackward0" else 1.0 / value),)))
        elif name in ("DivBackward1", "MulBackward1"):
            value = saved(node, "_saved_other")
            if not isinstance(value, (int, float)) or not value:
                continue
            stack.extend((child, divisors + ((value if name == "DivBackward1" else 1.0 / value),))
                         for _, child in children)
        elif name in ("NegBackward0",) or name in _VIEWS:
            stack.extend((child, divisors) for _, child in children)
        elif name in ("AddBackward0", "SubBackward0", "AddBackward1", "SubBackward1", "StackBackward0",
                      "CatBackward0"):
            stack.extend((child, ()) for _, child in children)
    return found


def _mask_facts(mask) -> tuple[float, float] | None:
    """``(kept share, fingerprint)`` of a 0/1 mask, or None for one with other values."""
    flat = mask.detach().reshape(-1)
    if flat.dtype != torch.bool:
        if flat.is_complex() or not bool(((flat == 0) | (flat == 1)).all()):
            return None  # weights, not a mask
        flat = flat != 0
    n = flat.numel()
    if n == 0:
        return None
    positions = torch.arange(1, n + 1, device=flat.device, dtype=torch.float64)
    stats = torch.stack([flat.sum().to(torch.float64), (positions * flat).sum()]).tolist()
    return stats[0] / n, stats[1] + n * 1e-9


def _complementary(masks: list) -> set[int]:
    """The positions in ``masks`` of those that, with another of the same shape, keep every
    element exactly once (``(y * pos).mean() + ((1 - y) * neg).mean()``: a contrastive or binary
    loss written as two halves, whose sum is a mean over every position, as meant)."""
    covered: set[int] = set()
    for i in range(len(masks)):
        for j in range(i + 1, len(masks)):
            a, b = masks[i], masks[j]
            if a.shape != b.shape or a.device != b.device:
                continue
            if bool(((a != 0).to(torch.int8) + (b != 0).to(torch.int8) == 1).all()):
                covered.update((i, j))
    return covered


class MaskedMeanWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._open = True
        # a later phase's backwards are read from the graph alone: torch's mean and sum are not
        # wrapped again (they are passed around as values), so a finding there is placed at the
        # loss's line rather than at its mean
        self._graph_only = False
        self.loss_window = LossWindow(rec, _WINDOW, on_reopen=self._reopen)
        self._noted: dict = {}  # id of a masking node -> (the node, the line of its mean/sum)
        self._first: dict = {}  # mean line -> fingerprint of the first mask seen there
        self._restore: list = []

    def install(self, patcher) -> None:
        # the methods only: ``torch.mean``/``torch.sum`` are passed around as values (Lightning's
        # ``reduce_fx``) and compared, so a wrapper put back mid-run would change what they equal
        for owner, name in ((torch.Tensor, "mean"), (torch.Tensor, "sum")):
            original = getattr(owner, name, None)
            if original is None:
                continue
            wrapper = patcher.patch(owner, name, watched(original, self._before))
            self._restore.append((owner, name, original, wrapper))

    def _before(self, args, kwargs) -> None:
        if not self._open or not args or len(self._noted) >= _NOTED:
            return
        tensor = args[0]
        node = getattr(tensor, "grad_fn", None) if isinstance(tensor, torch.Tensor) else None
        if node is None or type(node).__name__ not in _NOTE or id(node) in self._noted:
            return
        try:
            caller = sys._getframe(2)  # the code that called mean/sum
            if not self.rec.finder.is_user_file(caller.f_code.co_filename):
                return
            while type(node).__name__ in _VIEWS:
                children = _children(node)
                if len(children) != 1:
                    return
                node = children[0][1]
            if type(node).__name__ in _MASKING:
                self._noted[id(node)] = (node, self.rec.here())
        except Exception as exc:
            self.rec.internal_error("masked mean", exc)

    def _reopen(self) -> None:
        if not self._open:
            self._graph_only = True

    def describe_loss(self, tensors) -> dict:
        if not (self._open or self._graph_only):
            return {}
        self.loss_window.take()
        noted, self._noted = self._noted, {}
        try:
            items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
            for root in [t.grad_fn for t in items[:4]
                         if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
                self._judge(root, noted)
        except Exception as exc:
            self.rec.internal_error("masked mean", exc)
        if self.loss_window.closed:
            if self._open:
                self._close()
            self._graph_only = False
        return {}

    def _judge(self, root, noted) -> None:
        found = []
        for masking, _top, reduced, _ in masked_means(root)[:4]:
            facts = masked_share(masking)
            if facts is not None:
                found.append((masking, reduced, *facts))
        covered = _complementary([mask for _, _, mask, _, _ in found])
        for i, (masking, reduced, mask, how, index) in enumerate(found):
            if i in covered:
                continue  # the terms' masks split every position between them: one mean over all
            if per_sample(masking, index):
                continue  # samples selected by a mask (FixMatch's confidence): the mean over the
                # batch is the loss's definition
            shares = _mask_facts(mask)
            if shares is None:
                continue
            kept, fingerprint = shares
            if 1.0 - kept < _MIN_ZEROS:
                continue
            held = noted.get(id(masking))
            loc = held[1] if held is not None and held[0] is masking else None
            at_mean = loc is not None
            if loc is None:
                loc = self.rec.here()
            if loc is None:
                continue
            key = (loc.path, loc.line)
            if key not in self._first and len(self._first) >= _LINES:
                continue
            first = self._first.setdefault(key, (fingerprint, tuple(mask.shape)))
            same = first == (fingerprint, tuple(mask.shape))
            self.rec.emit_aside(ev.masked_mean(how=how, reduced=reduced, kept=round(kept, 6),
                                               elements=_numel(masking) or 0, same_mask=same,
                                               at_mean=at_mean,
                                               mask_operand=1 - index if how == "product" else None), loc)

    def _close(self) -> None:
        """Put torch's own mean and sum back: nothing of this watcher runs after the first
        backwards."""
        self._open = False
        self._noted = {}
        for owner, name, original, wrapper in self._restore:
            try:  # not from under another watcher's wrapper
                put_back(owner, name, original, wrapper)
            except Exception as exc:
                self.rec.internal_error("masked mean", exc)
