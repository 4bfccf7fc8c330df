"""The targets of a pairwise-similarity loss that do not point at each row's positive.

A contrastive loss (InfoNCE, CLIP, SimCLR's NT-Xent) is a classification whose classes are the
columns of a similarity matrix: row i's logits are sample i's similarities with the samples
the columns stand for, and its label names the column that holds sample i's positive (its other
view, its caption). Two slips train without an error:

* **One label for every row** (``torch.zeros(B)``, MoCo's labels kept where the positive is no
  longer column 0): every sample is told that its positive is the sample of column 0. MoCo's
  labels are right only because its logits are ``cat([l_pos, l_neg], 1)``, with each row's own
  positive put in column 0; in ``z1 @ z2.T`` column 0 is one sample for every row.
* **Labels on the diagonal of a self-similarity** (``arange(2N)`` over ``z @ z.T`` with
  ``z = cat([z1, z2])``, where SimCLR's positive of row i is column ``(i + N) % 2N``): each row's
  label is its similarity with itself, a constant after normalisation, so the loss only pushes
  the samples apart and never pulls the two views together.

How it is seen, from the graph of the loss's input at its first calls (``cross_entropy``, and
``nll_loss`` through the ``log_softmax`` it is given), one small read of the targets: the
input is followed down through what keeps its entries in place (scalar factors, a learned
temperature, masked fills, casts, views, transposes, a subtracted row maximum) to the pairwise
similarities of two sets of vectors: a plain 2-D matrix product (``@``, ``mm``, ``matmul``,
``einsum`` of two matrices: a batched product of one batch), a broadcast product summed over
the features (``(a[:, None] * b[None]).sum(-1)``, ``F.cosine_similarity(a[:, None], b[None],
dim=-1)``), or ``cdist``. Its operands must both be a batch's embeddings: a product with a parameter (``x @
W.T``: classification with class labels, a normalised weight's cosine classifier) or with a
tensor made of parameters alone is not a similarity of samples; an operand without a graph (a
momentum encoder's keys) counts only when it has as many rows as the logits (one key per
sample). Then:

* "constant": at least ``_ROWS`` rows, at least as many columns as rows, every label one valid
  column;
* "self": both operands are the same tensor (the same node and output, through transposes), the
  matrix square, and at least half the rows labelled with their own index.

Silent on MoCo's ``cat([l_pos, l_neg])`` (the walk stops at the concatenation: column 0 is each
row's own positive), per-row candidate lists (``bmm(q[:, None], cands.transpose(1, 2))``: a
batched product), SimCLR's shifted ``arange``, CLIP's ``arange``, soft targets (SupCon's class
masks), a classification head.

The other member of the family, for ``triplet_margin_loss`` and
``triplet_margin_with_distance_loss`` (their ``nn`` modules call them): the positive given is the negative given with its rows reordered (``negative =
positive[perm]`` or ``positive.roll(1, 0)``, then ``loss(anchor, negative, positive)``): the
argument built from the anchor's own sample sits in the negative's place. Seen when the
positive's node is a row reordering (``roll``, ``flip``, ``index_select`` or indexing along
dimension 0) whose input is the negative's node and output, and the first calls' values agree:
in at least ``_NEARER`` of the rows the anchor is nearer the negative given than the positive
given. Silent on batch-hard mining (positive and negative both rows picked from one
embedding), on negatives made by rolling the positives (the right order), and on anything
whose values do not agree.

A ``pair_labels`` aside event, once per call line.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .. import events as ev
from .graphpaths import saved
from .graphpaths import signed as _signed
from .inlinable import watched
from .recorder import Recorder

_ROWS = 4  # rows a similarity needs before one label for all of them says anything
_DOWN = 16  # operations followed from the loss's input down to the product
_OPERAND = 12  # operations followed from a product's operand to the tensor it transposes
_PARAMS_ONLY = 64  # nodes walked below an operand to see whether it is made of parameters alone
_SELF_SHARE = 0.5  # rows labelled with their own index, over a self-similarity
_CAT_SHARE = 0.5  # rows labelled with the positive's column, over MoCo's cat([l_pos, l_neg])
_NEARER = 0.75  # rows whose anchor is nearer the negative given than the positive given
_SEPARATE_NEARER = 0.9  # the same, for three separately computed batches (two calls)
_SEPARATE_ROWS = 8  # rows those need
_READS = 8  # calls of each kind whose values are read (the first ones)
# the triplet losses (their nn modules call them), each (anchor, positive, negative)
_TRIPLETS = ("triplet_margin_loss", "triplet_margin_with_distance_loss")

# operations that keep each entry of the logits where it is (or scale it by one number)
_KEEP = ("CloneBackward", "ToCopyBackward", "AliasBackward", "MaskedFillBackward",
         "ContiguousBackward", "NegBackward")
_MOVE = ("ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward", "SqueezeBackward",
         "UnsqueezeBackward", "TransposeBackward", "TBackward", "PermuteBackward")
_SCALE = ("MulBackward", "DivBackward", "AddBackward", "SubBackward")
_REORDER = ("RollBackward", "FlipBackward", "IndexSelectBackward", "IndexBackward")


def _children(node) -> list:
    return [(child, nr) for child, nr in node.next_functions if child is not None]


def _shape(node, nr: int = 0):
    """The shape of output ``nr`` of ``node`` (from its metadata), or None."""
    try:
        meta = node._input_metadata[nr]
        return tuple(int(s) for s in meta.shape)
    except Exception:
        return None


def _broadcast_side(child, nr: int):
    """``(unsqueezed shape, edge below the unsqueeze)`` of one side of a broadcast product
    (``z[:, None]``, ``F.cosine_similarity``'s ``z / norm`` of the expanded ``z``), or None."""
    for _ in range(4):
        if child is None:
            return None
        name = type(child).__name__
        if name.startswith("UnsqueezeBackward"):
            shape = _shape(child, nr)
            children = _children(child)
            return (shape, children[0]) if shape is not None and len(children) == 1 else None
        children = list(child.next_functions)
        if name.startswith(("ExpandBackward", "CloneBackward")) and len(children) == 1:
            child, nr = children[0]
        elif name.startswith("DivBackward") and children:
            child, nr = children[0]  # the numerator: the vectors divided by their norm
        else:
            return None
    return None


def _pairwise(node, rows: int, columns: int):
    """The two edges ``((node, output) or None)`` of the tensors whose pairwise similarities or
    distances ``node`` makes, the rows' first: a 2-D matrix product (``MmBackward``, a
    ``BmmBackward`` of one batch: einsum's), ``cdist``, or a broadcast product summed over the
    features (``(a[:, None] * b[None]).sum(-1)``, ``F.cosine_similarity(a[:, None], b[None],
    dim=-1)``); None for anything else."""
    name = type(node).__name__
    if name.startswith(("MmBackward", "CdistBackward")):
        edges = list(node.next_functions)
        return edges if len(edges) == 2 else None
    if name.startswith("BmmBackward"):
        shape = _shape(node)
        edges = list(node.next_functions)
        return edges if shape is not None and len(shape) == 3 and shape[0] == 1 and len(edges) == 2 else None
    if name.startswith("SumBackward1"):
        dims = saved(node, "_saved_dim")
        sizes = saved(node, "_saved_self_sym_sizes")
        if not dims or sizes is None or len(sizes) != 3 or len(dims) != 1 or _signed(dims[0]) % 3 != 2:
            return None
        children = _children(node)
        if len(children) != 1 or not type(children[0][0]).__name__.startswith("MulBackward"):
            return None
        sides = [_broadcast_side(child, nr) for child, nr in children[0][0].next_functions]
        if len(sides) != 2 or None in sides:
            return None
        by_shape = {side[0][:2]: side[1] for side in sides}
        if set(by_shape) != {(rows, 1), (1, columns)} or rows == 1 or columns == 1:
            return None
        return [by_shape[(rows, 1)], by_shape[(1, columns)]]
    return None


def _product(input):
    """The two edges of the pairwise product (``_pairwise``) whose output the logits ``input``
    hold entry for entry (a transpose swaps them), or None."""
    node = input.grad_fn
    rows, columns = int(input.shape[0]), int(input.shape[1])
    for _ in range(_DOWN):
        if node is None:
            return None
        name = type(node).__name__
        edges = _pairwise(node, rows, columns)
        if edges is not None:
            return edges
        if name.startswith(("TransposeBackward", "TBackward", "PermuteBackward")):
            rows, columns = columns, rows
        children = _children(node)
        if name.startswith(_KEEP + _MOVE + ("SelectBackward",)) and len(children) == 1:
            # a select only on the way to the product: a batched product of one batch, [0]
            node = children[0][0]
            continue
        if name.startswith(_SCALE):
            # one side a number or a (learned) scalar, or a per-row shift (the row maximum
            # subtracted): the other side, as large as the logits, is followed
            wide = [child for child, nr in children if (_shape(child, nr) or ()) == (rows, columns)]
            if len(wide) == 1:
                node = wide[0]
                continue
            if len(children) == 1:
                node = children[0][0]
                continue
        return None
    return None


def _base(child, nr: int):
    """``(node, output)`` of the tensor an operand transposes or reshapes (``z`` for ``z.T``)."""
    for _ in range(_OPERAND):
        name = type(child).__name__
        children = _children(child)
        if not (name.startswith(_MOVE + ("ExpandBackward", "CloneBackward", "AliasBackward"))
                and len(children) == 1):
            break
        child, nr = children[0]
    return child, nr


def _params_only(node) -> bool:
    """Whether the tensor ``node`` made is a function of parameters alone (a weight, a weight
    normalised): every path ends at a parameter, no input without a graph and no lookup by index
    on the way."""
    seen, stack = set(), [node]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if len(seen) > _PARAMS_ONLY:
            return False
        name = type(node).__name__
        if name == "AccumulateGrad":
            continue
        if name.startswith(("Embedding", "Index", "Gather")):
            return False
        for child, _ in node.next_functions:
            if child is None:
                return False  # a tensor without a graph came in: the batch
            stack.append(child)
    return True


def similarity_operands(input):
    """``(left, right)`` bases of the 2-D product of two batches' embeddings behind the logits
    ``input``, each ``(node, output)`` or None for an operand without a graph; None when the
    logits are no such product (a classifier's, a concatenation's)."""
    edges = _product(input)
    if edges is None:
        return None
    rows, columns = int(input.shape[0]), int(input.shape[1])
    bases = []
    for child, nr in edges:
        if child is None:
            bases.append(None)
            continue
        base = _base(child, nr)
        if type(base[0]).__name__ == "AccumulateGrad" or _params_only(base[0]):
            return None  # x @ W.T: a classifier's weight, not a batch
        bases.append(base)
    if bases[0] is None and bases[1] is None:
        return None
    if None in bases and rows != columns:
        return None  # a table without a graph (a queue, a frozen weight): not one key per sample
    return bases[0], bases[1]


def pair_fault(fn: str, input, target, may_read: Callable[[], bool]):
    """``(how, label, share, halves)`` when the integer targets of a loss over pairwise similarities do
    not point at each row's positive ("constant", "self"), else None. One read of the targets,
    when the graph shows such a similarity and ``may_read()`` allows it."""
    if not (isinstance(target, torch.Tensor) and target.dim() == 1 and input.dim() == 2
            and not target.is_floating_point() and target.dtype != torch.bool
            and target.shape[0] == input.shape[0]):
        return None
    rows, columns = int(input.shape[0]), int(input.shape[1])
    if rows < _ROWS or columns < rows:
        return None
    logits = input
    node = input.grad_fn
    if fn == "nll_loss":
        if node is None or not type(node).__name__.startswith("LogSoftmaxBackward"):
            return None
        # the scores the log_softmax normalised: followed as cross_entropy's input would be
        logits = _Scores(node, tuple(input.shape))
    operands = similarity_operands(logits)
    if operands is None:
        column = _positive_column(logits)
        if column is None or not may_read():
            return None
        with torch.no_grad():
            on = float((target.detach() == column).float().mean())
        if on < _CAT_SHARE:
            return "cat", column, round(1.0 - on, 4), None
        return None
    if not may_read():
        return None
    with torch.no_grad():
        t = target.detach()
        rows_index = torch.arange(rows, device=t.device)
        low, high, own = torch.stack([t.min(), t.max(), (t == rows_index).sum()]).tolist()
    if low == high and 0 <= low < columns:
        return "constant", int(low), None, None
    share = own / rows
    if operands[0] is not None and operands[0] == operands[1] and rows == columns and share >= _SELF_SHARE:
        return "self", None, round(share, 4), halves(operands[0][0])
    return None


def _rowwise(node) -> bool:
    """Whether the (rows, 1) column ``node`` made is each row's similarity with its own pair
    (``einsum("nc,nc->n", q, k).unsqueeze(-1)``, ``(q * k).sum(1, keepdim=True)``,
    ``bmm(q[:, None], k[:, :, None])``): a product of two batches row by row, not a layer's
    output (``Linear``'s ``addmm``, a weight's ``mm``)."""
    for _ in range(_OPERAND):
        if node is None:
            return False
        name = type(node).__name__
        children = _children(node)
        if name.startswith(("SumBackward1", "BmmBackward")):
            return True
        if name.startswith(_MOVE + _KEEP) and len(children) == 1:
            node = children[0][0]
            continue
        return False
    return False


def _positive_column(logits) -> int | None:
    """The column holding each row's own positive when the logits are MoCo's ``cat([l_pos,
    l_neg], dim=1)`` (0) or ``cat([l_neg, l_pos], dim=1)`` (the last): one (rows, 1) column of
    row-wise similarities beside a block of at least ``_ROWS`` columns that is a product of the
    queries with the keys or a queue (``einsum("nc,ck->nk")``, ``q @ queue``); None otherwise
    (a classifier's background column beside its class scores, a concatenation of two heads)."""
    node = logits.grad_fn
    rows, columns = int(logits.shape[0]), int(logits.shape[1])
    for _ in range(_DOWN):
        if node is None:
            return None
        name = type(node).__name__
        children = _children(node)
        if name.startswith("CatBackward"):
            break
        if name.startswith(_KEEP) and len(children) == 1:
            node = children[0][0]
            continue
        if name.startswith(_SCALE):
            wide = [child for child, nr in children if (_shape(child, nr) or ()) == (rows, columns)]
            if len(wide) == 1 or len(children) == 1:
                node = (wide or [children[0][0]])[0]
                continue
        return None
    else:
        return None
    if node is None or not type(node).__name__.startswith("CatBackward"):
        return None
    dim = saved(node, "_saved_dim")
    parts = list(node.next_functions)
    if dim is None or _signed(dim) not in (1, -1) or len(parts) != 2 or None in (p[0] for p in parts):
        return None
    shapes = [_shape(child, nr) for child, nr in parts]
    if None in shapes or any(len(shape) != 2 or shape[0] != rows for shape in shapes):
        return None
    single = [i for i, shape in enumerate(shapes) if shape[1] == 1]
    if len(single) != 1 or shapes[1 - single[0]][1] < _ROWS:
        return None
    one, block = parts[single[0]], parts[1 - single[0]]
    if not _rowwise(one[0]) or _product(_Scores.of(block, shapes[1 - single[0]])) is None:
        return None
    return 0 if single[0] == 0 else columns - 1


def halves(node) -> bool:
    """Whether the embeddings ``node`` made are two halves of one size concatenated along the
    batch (``torch.cat([z1, z2])``, normalised or not): two views of one batch."""
    for _ in range(_OPERAND):
        name = type(node).__name__
        children = list(node.next_functions)
        if name.startswith("CatBackward"):
            dim = saved(node, "_saved_dim")
            sizes = [(_shape(child, nr) or (None,))[0] for child, nr in children if child is not None]
            return dim is not None and _signed(dim) in (0, -2) and len(children) == 2 \
                and len(sizes) == 2 and sizes[0] == sizes[1] is not None
        if name.startswith("DivBackward") and children and children[0][0] is not None:
            node = children[0][0]  # the numerator: the vectors divided by their norm
        elif name.startswith(_KEEP + _MOVE) and len(children) == 1 and children[0][0] is not None:
            node = children[0][0]
        else:
            return False
    return False


class _Scores:
    """What ``similarity_operands`` reads of the logits, for the input of a ``log_softmax`` (of
    the shape of its output)."""

    def __init__(self, log_softmax, shape: tuple):
        children = _children(log_softmax)
        self.grad_fn = children[0][0] if len(children) == 1 else None
        self.shape = shape

    @classmethod
    def of(cls, edge, shape: tuple) -> "_Scores":
        """The scores of one edge ``(node, output)`` of the given shape."""
        made = cls.__new__(cls)
        made.grad_fn, made.shape = edge[0], shape
        return made


def _reordered(positive, negative) -> bool:
    """Whether ``positive`` is ``negative`` with its rows reordered (its node a roll, flip or
    index along dimension 0 of exactly the negative's output)."""
    node, below = positive.grad_fn, negative.grad_fn
    if node is None or below is None:
        return False
    name = type(node).__name__
    if not name.startswith(_REORDER):
        return False
    children = _children(node)
    if len(children) != 1 or children[0] != (below, negative.output_nr):
        return False
    rows = (0, -positive.dim())
    if name.startswith("RollBackward"):
        dims = tuple(_signed(d) for d in saved(node, "_saved_dims", ()) or ())
        shifts = tuple(_signed(s) for s in saved(node, "_saved_shifts", ()) or ())
        return len(dims) == len(shifts) and any(d in rows and s % positive.shape[0]
                                                for d, s in zip(dims, shifts))
    if name.startswith("FlipBackward"):
        return any(_signed(d) in rows for d in saved(node, "_saved_dims", ()) or ())
    if name.startswith("IndexSelectBackward"):
        dim = saved(node, "_saved_dim")
        return dim is not None and _signed(dim) in rows
    indices = saved(node, "_saved_indices")
    return bool(indices) and isinstance(indices[0], torch.Tensor)  # x[idx]: rows picked


def _separate(anchor, positive, negative) -> bool:
    """Whether the three arguments are three tensors of their own, each computed with a graph
    (three forwards of the embedding net on three batches), none a row pick of another tensor:
    not batch-hard mining, whose positive and negative are rows indexed out of one embedding."""
    nodes = [t.grad_fn for t in (anchor, positive, negative)]
    if any(node is None for node in nodes) or len({id(node) for node in nodes}) != 3:
        return False
    return not any(type(node).__name__.startswith(_REORDER + ("GatherBackward",)) for node in nodes)


class TripletOrderWatcher:
    """``triplet_margin_loss`` given a positive that is its negative's rows reordered."""

    def __init__(self, rec: Recorder):
        self.rec = rec
        self._reads = 0
        self._told: set = set()
        self._seen: dict = {}  # call line -> calls of separate batches whose values agreed

    def _call(self, fn: str, args, kwargs) -> None:
        names = ("anchor", "positive", "negative")
        anchor, positive, negative = (args[i] if len(args) > i else kwargs.get(name)
                                      for i, name in enumerate(names))
        if not all(isinstance(t, torch.Tensor) for t in (anchor, positive, negative)):
            return
        if not (torch.is_grad_enabled() and positive.requires_grad and positive.dim() == 2
                and positive.shape == negative.shape and positive.shape[0] >= _ROWS
                and anchor.shape == positive.shape):
            return
        if self._reads >= _READS:
            return
        reordered = _reordered(positive, negative)
        if not reordered and not (positive.shape[0] >= _SEPARATE_ROWS
                                  and _separate(anchor, positive, negative)):
            return
        if self.rec.progress.steps and positive.device.type != "cpu":
            return  # no host sync in the updates after the first step
        self._reads += 1
        with torch.no_grad():
            a = anchor.detach().float()
            to_positive = (a - positive.detach().float()).norm(dim=1)
            to_negative = (a - negative.detach().float()).norm(dim=1)
            share = float((to_negative < to_positive).float().mean())
        if share < (_NEARER if reordered else _SEPARATE_NEARER):
            return
        loc = self.rec.here()
        if loc in self._told:
            return
        if not reordered:
            # three batches of their own: nothing in the graph says which is the anchor's own
            # sample, so the values must say it at two calls (the second after an update)
            self._seen[loc] = self._seen.get(loc, 0) + 1
            if self._seen[loc] < 2:
                return
        self._told.add(loc)
        rows = int(positive.shape[0])
        self.rec.emit_aside(ev.pair_labels(how="triplet" if reordered else "triplet-apart", fn=fn, rows=rows,
                                           columns=rows, share=round(share, 4)), loc)

    def install(self, patcher) -> None:
        for name in _TRIPLETS:
            original = getattr(F, name, None)
            if original is not None:
                patcher.patch(F, name, self._wrap(original, name))

    def _wrap(self, original, fn: str):
        watcher = self

        def before(args, kwargs) -> None:
            try:
                watcher._call(fn, args, kwargs)
            except Exception as exc:
                watcher.rec.internal_error(f"F.{fn}", exc)

        wrapped = watched(original, before)
        wrapped.__prepare_scriptable__ = lambda: original
        return wrapped
