"""A view or reshape that reorders axes: ``x.view(B, C, T)`` of a (B, T, C) tensor where
``x.transpose(1, 2)`` was meant.

``view``/``reshape`` keep the elements in memory order and only cut them into new rows: when the
new shape is the old one's sizes in another order, each new "channel" is a run of consecutive
elements of the old layout, which mixes time steps and channels (or tokens and features) within
every sample. The shapes agree, nothing fails, and the model trains on scrambled inputs.

What is judged: the sizes other than 1 of the input (``a``) and of the output (``b``). The
reshape is suspect when it is no plain split or merge of whole axes in order (neither shape's
running products are all running products of the other's), while ``b`` is what merging
consecutive axes of ``a`` *in another order* gives (or ``a`` that of ``b``): ``(B, T, C) ->
(B, C, T)``, ``(B, C, H, W) -> (B, H*W, C)`` (``flatten(2).transpose(1, 2)`` meant), ``(B, N, D)
-> (B, D, h, w)`` (tokens put back on a grid without their transpose), ``(B, heads, T, d) ->
(B, T, heads*d)`` (heads merged without ``transpose(1, 2)``). A regrouping that splits and
merges in order (stacking frames: ``(B, T, C) -> (B, T/k, k*C)``; ``permute(...).view(B, -1,
4)``) stays silent, and so does any reshape whose sizes tell nothing (two axes of one length
swapped look unchanged), and Transformer-XL's relative shift (scores padded with one column and
viewed with their last two sizes swapped, on purpose: ``_skewed``).

A second suspect: channel-first scores cut into rows of classes, ``logits.reshape(-1, C)`` of a
(N, C, H, W) segmentation output (``class_rows``). Its sizes may regroup in memory order (W a
multiple of C), so it is reported only when the graph shows the reshaped tensor made by a
channel-first op (``_class_first``) and each row normalised by a softmax or log_softmax over its
C values (``_normalised_rows``: cross_entropy's own, or the script's before nll_loss or a dice
loss): each row is then C positions of one class channel taken as one position's class scores.

How it is seen, and what it costs:

* ``Tensor.view``, ``Tensor.reshape`` and ``torch.reshape`` are wrapped from the start until
  ``_WINDOWS`` backwards have run (then put back: no cost for the rest of the run). A call on a
  tensor that needs a gradient, under grad mode, made from the user's own code, has its output
  shape worked out from its arguments (``-1`` resolved); a suspect one is held with its line.
* At each of those backwards (``DESCRIBE_LOSS``), the loss's graph is walked once (at most
  ``_NODES`` nodes) for the view and reshape nodes, whose input sizes are saved and whose output
  shape is in their metadata (no tensor read). A held call whose shapes match one that reaches
  the loss becomes a ``view_axes`` aside event at its line, with the parameters that made the
  reshaped value.
* A reordering call on data without gradient outside any forward (a batch laid out for the
  model in the loop) is held by its result's memory (data pointer, shape, strides; at most
  ``_LOOSE`` between two backwards). At the backward, a node of the loss's graph that saved
  that tensor as its input (``_SAVED_INPUTS``: a convolution, a Linear's product, a product)
  makes it a ``view_axes`` event, with the parameters below that node.
* An integer one-hot encoding (0/1 values, one 1 along its last axis: ``F.one_hot``'s output)
  viewed with its axes reordered, the class axis moved off the last place (``one_hot(mask,
  C).view(N, C, H, W)``), is a target scattered: its values are read once (at most
  ``_ONE_HOT_VALUES``) and it becomes a ``view_axes`` event (``one_hot``) at the next backward,
  with the parameters that loss trains. The casts and masks after it break any identity a graph
  node could show, and a one-hot made under grad mode before a backward is the loss's target.
"""

from __future__ import annotations

import itertools
import sys
import weakref

import torch

from .. import events as ev
from .graphpaths import post_order, reached, saved
from .inlinable import watched_call
from .lossnodes import loss_of
from .recorder import Recorder
from .patcher import put_back

_WINDOWS = 3  # backwards whose losses are looked at; the wrappers go at the last one
_NODES = 20000  # graph nodes walked per backward
_LEAVES = 20000  # nodes walked below a reshape to name the parameters that made its input
_FLATTENED = 64  # flattened targets kept between two backwards, at most
# the losses that pair their input's rows with their target's (``lossnodes.loss_of``'s names,
# composites such as l1_loss included) -> the loss's name as told
_ROW_LOSSES = {"nll_loss": "cross_entropy/nll_loss", "mse_loss": "mse_loss", "l1_loss": "l1_loss",
               "smooth_l1_loss": "smooth_l1_loss", "huber_loss": "huber_loss",
               "binary_cross_entropy_with_logits": "binary_cross_entropy_with_logits",
               "binary_cross_entropy": "binary_cross_entropy", "kl_div": "kl_div",
               "poisson_nll_loss": "poisson_nll_loss", "gaussian_nll_loss": "gaussian_nll_loss",
               "soft_margin_loss": "soft_margin_loss",
               "multilabel_soft_margin_loss": "multilabel_soft_margin_loss"}
_MAX_AXES = 6  # sizes other than 1 judged at most (6! orders)
_LOOSE = 16  # data reshaped outside a forward held between two backwards, at most
_ONE_HOT_VALUES = 1 << 22  # elements of an integer tensor read to tell it is one-hot, at most
# the saved inputs of the nodes that read data with a parameter (convolutions, Linear layers'
# addmm, matrix products, elementwise products)
_SAVED_INPUTS = ("_saved_input", "_saved_mat1", "_saved_self", "_saved_other")
_VIEWS = ("ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward")
# ops whose output's axis 1 is channels (the class axis of a segmentation or tagging head)
_CHANNEL_FIRST = ("ConvolutionBackward", "CudnnConvolutionBackward", "MkldnnConvolutionBackward",
                  "ConvDepthwise", "SlowConv", "Upsample", "NativeBatchNormBackward",
                  "CudnnBatchNormBackward", "NativeGroupNormBackward", "AdaptiveAvgPool",
                  "AvgPool", "MaxPool", "ConvolutionBackwardOverrideable")


def _running(sizes) -> set:
    out, product = set(), 1
    for size in sizes:
        product *= size
        out.add(product)
    return out


def _merges_to(sizes, target) -> bool:
    """Whether ``target`` is ``sizes`` with runs of consecutive axes merged (each of its running
    products is one of ``sizes``')."""
    return _running(target) <= _running(sizes)


def _regroups(a, b) -> bool:
    """Whether ``b`` can be ``a`` cut into pieces and the pieces grouped anew, in memory order:
    every running product of either divides the next larger one of both (stacking frames,
    ``(B, H, W, A * 4) -> (B, H * W * A, 4)``)."""
    chain = sorted(_running(a) | _running(b))
    return all(high % low == 0 for low, high in zip(chain, chain[1:]))


def reordered(shape_in, shape_out) -> bool:
    """Whether a view of ``shape_in`` as ``shape_out`` reorders axes: the same sizes (other than
    1) in another order; or, when no cutting and regrouping in memory order gives it, what
    merging consecutive axes of one shape put in another order gives."""
    a = tuple(int(s) for s in shape_in if int(s) != 1)
    b = tuple(int(s) for s in shape_out if int(s) != 1)
    if a == b or len(a) < 2 or len(b) < 2 or max(len(a), len(b)) > _MAX_AXES:
        return False
    if sorted(a) == sorted(b):
        return True  # (B, T, C) -> (B, C, T)
    if _merges_to(a, b) or _merges_to(b, a):
        return False  # a split or a merge in memory order: what view is for
    if _regroups(a, b):
        # a regrouping in memory order is what view is for, unless the new sizes are whole
        # axes of the old shape merged in another order: (B, L, C) -> (B * C, L) regroups only
        # by the coincidence that C divides L (a channel-independent model's reshape without
        # its permute), and (B, T, H, d) -> (B * H, T, d) only when H divides T
        return _axis_merged_into_batch(a, b)
    for small, large in ((a, b), (b, a)):
        if len(small) > len(large):
            continue
        for order in set(itertools.permutations(large)):
            if order != large and _merges_to(order, small):
                return True
    return False


def _axis_merged_into_batch(a, b) -> bool:
    """Whether ``b`` is ``a`` with one later axis, shorter than every axis it passes, moved next
    to the first and merged with it: ``(B, L, C) -> (B * C, L)``, ``(B, T, H, d) -> (B * H, T,
    d)``. The reading as a regrouping in memory order would cut the longer axes into pieces
    exactly the short axis long; channel-first scores cut into rows of classes (``(N, C, T) ->
    (N * T, C)``: the longer axis moved) are ``class_rows``', judged with the graph."""
    if len(b) >= len(a) or not b or b[0] in _running(a):
        return False
    for j in range(2, len(a)):
        if a[j] >= min(a[1:j]):
            continue
        order = (a[0], a[j]) + a[1:j] + a[j + 1:]
        if b[0] == a[0] * a[j] and _merges_to(order, b):
            return True
    return False


def class_rows(shape_in, shape_out) -> bool:
    """Whether a view of ``shape_in`` as ``shape_out`` could be channel-first scores flattened
    into rows of classes without moving the classes last: ``shape_out`` ends with C (rows of C
    consecutive values), ``shape_in`` is (N, C, ...) with at least one axis after its axis of
    size C, its last axis not of size C (else those rows may be that axis's, NHWC), and the
    rows are no reordering ``reordered`` already reports (a (N, C, T) with T a multiple of C
    regroups in memory order, so it is not). Such rows hold C positions of one channel: the
    graph must still show that the channel axis is one (made by a channel-first op) and that
    each row is normalised as a distribution over classes (``_look``)."""
    a = tuple(int(s) for s in shape_in)
    b = tuple(int(s) for s in shape_out if int(s) != 1)
    if len(a) < 3 or len(b) < 2 or b[-1] < 2 or len(a) > _MAX_AXES:
        return False
    classes = b[-1]
    return a[1] == classes and a[-1] != classes and any(s != 1 for s in a[2:])


def _class_first(node, shape_in, levels: int = 6) -> bool:
    """Whether the tensor ``node`` viewed was made by a channel-first op (a convolution, its
    pooling, normalisation or upsampling) whose output has ``shape_in``, within ``levels``
    nodes along its first input (through elementwise ops, not through other views): its axis 1
    holds channels."""
    nxt = node.next_functions[0][0] if node.next_functions else None
    for _ in range(levels):
        if nxt is None:
            return False
        name = type(nxt).__name__
        if name.startswith(_VIEWS):
            return False
        if name.startswith(_CHANNEL_FIRST):
            try:
                return tuple(int(s) for s in nxt._input_metadata[0].shape) == tuple(shape_in)
            except Exception:  # a node without metadata
                return False
        nxt = nxt.next_functions[0][0] if nxt.next_functions else None
    return False


def _normalised_rows(nodes) -> set:
    """The ids of the view nodes whose output a softmax or log_softmax (cross_entropy's, or
    the script's own) normalises over its last axis: rows taken as distributions over
    classes."""
    out = set()
    for node in nodes:
        if not type(node).__name__.startswith(("LogSoftmaxBackward", "SoftmaxBackward")):
            continue
        below = node.next_functions[0][0] if node.next_functions else None
        if below is None or not type(below).__name__.startswith(_VIEWS):
            continue
        dim = saved(node, "_saved_dim")
        try:
            rank = len(below._input_metadata[0].shape)
            dim = int(dim)
        except Exception:
            continue
        if dim >= 1 << 63:
            dim -= 1 << 64  # a negative dim, saved unsigned
        if dim % rank == rank - 1:
            out.add(id(below))
    return out


def _skewed(tensor, shape_in, shape_out) -> bool:
    """The relative-position shift of Transformer-XL and the Music Transformer's skewing: scores
    padded with one column (``cat([zeros, x], -1)``, ``F.pad``) and viewed with their last two
    sizes swapped, so that each row starts one position later — a reshape that reorders sizes on
    purpose, which the slice after it undoes."""
    node = tensor.grad_fn
    if node is None or not type(node).__name__.startswith(("CatBackward", "ConstantPadNdBackward")):
        return False
    return sorted(shape_in) == sorted(shape_out) and shape_in[:-2] == shape_out[:-2] \
        and abs(shape_in[-1] - shape_in[-2]) == 1


def leading_merged(shape_in: tuple, shape_out: tuple) -> tuple | None:
    """The leading axes of ``shape_in`` that ``shape_out``'s first axis merges, its other axes
    kept as they were (``(B, T, C) -> (B*T, C)``: ``(B, T)``); None for any other reshape."""
    rest = len(shape_out) - 1
    if rest < 0 or len(shape_in) - rest < 2:
        return None
    if rest and tuple(shape_in[-rest:]) != tuple(shape_out[1:]):
        return None
    lead = tuple(shape_in[:len(shape_in) - rest])
    product = 1
    for size in lead:
        product *= size
    return lead if product == shape_out[0] else None


def _flattened_input(child) -> tuple[tuple, tuple] | None:
    """``(shape it was flattened from, flattened shape)`` of a loss's scores, read from the view
    node below it, from ``child``, the node they reached the loss through (through the loss's
    own log_softmax, casts and copies)."""
    for _ in range(4):
        if child is None:
            return None
        name = type(child).__name__
        if name.startswith(_VIEWS):
            sizes = saved(child, "_saved_self_sym_sizes")
            try:
                out = tuple(int(s) for s in child._input_metadata[0].shape)
            except Exception:
                return None
            return (tuple(int(s) for s in sizes), out) if sizes is not None else None
        if not name.startswith(("LogSoftmaxBackward", "ToCopyBackward", "CloneBackward")):
            return None
        child = child.next_functions[0][0] if child.next_functions else None
    return None


def _memory(tensor) -> tuple:
    """What tells a tensor's values apart from another's without reading them: where they start,
    the shape and the strides."""
    return (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))


def _target_shape(tensor, args, kwargs) -> tuple | None:
    """The shape a view/reshape call asks for (``-1`` resolved), None for another overload
    (``view(dtype)``) or arguments not understood."""
    shape = args[1:] if len(args) > 1 else ()
    if not shape:
        shape = kwargs.get("size", kwargs.get("shape", ()))
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = tuple(shape[0])
    if not shape or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape):
        return None
    numel = tensor.numel()
    known = 1
    for s in shape:
        if s != -1:
            known *= s
    if shape.count(-1) > 1 or known <= 0:
        return None
    if -1 in shape:
        if numel % known:
            return None
        shape = tuple(numel // known if s == -1 else s for s in shape)
    return tuple(shape)


class ViewAxesWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._windows = 0
        self._open = True
        self._held: dict = {}  # (input shape, output shape) -> the user's line of the call
        self._inputs: dict = {}  # the same for data reshaped in forward -> (line, module)
        # data without gradient reshaped outside any forward (a batch laid out for the model in
        # the loop): (data pointer, shape, strides) of the result -> (input shape, output
        # shape, line); reported when a node of the loss's graph saved it as its input
        self._loose: dict = {}
        self._judged: dict = {}  # (input shape, output shape) -> reordered?
        self._told: set = set()
        self._restore: list = []  # (owner, name, original) put back when the windows end
        # targets flattened by the user's code since the last backward: id(result) ->
        # (weak reference to the result, the shape it was flattened from, the call's line)
        self._flat: dict = {}
        self._rows_told: set = set()
        self._one_hots: dict = {}  # (input shape, output shape) of a one-hot viewed reordered -> line

    def install(self, patcher) -> None:
        for owner, name in ((torch.Tensor, "view"), (torch.Tensor, "reshape"), (torch, "reshape"),
                            (torch.Tensor, "flatten"), (torch, "flatten")):
            original = getattr(owner, name, None)
            if original is None:
                continue
            after = self._after_flatten if name == "flatten" else self._after
            wrapper = patcher.patch(owner, name, watched_call(original, after))
            self._restore.append((owner, name, original, wrapper))

    def _after(self, args, kwargs, result) -> None:
        if not self._open or not args:
            return
        caller = sys._getframe(2)  # the code that called view/reshape (<- the wrapper)
        self._flattened(args, result, caller)
        self._before(args, kwargs, caller, result)

    def _after_flatten(self, args, kwargs, result) -> None:
        if self._open and args:
            self._flattened(args, result, sys._getframe(2))

    def _flattened(self, args, result, caller) -> None:
        """A tensor without gradient (a target) whose leading axes the user's code merged into
        one (``y.view(-1)``, ``y.reshape(-1, k)``, ``y.flatten()``): kept until the backward,
        which compares the axis order with the one its loss input was flattened in."""
        tensor = args[0]
        try:
            if not (isinstance(tensor, torch.Tensor) and isinstance(result, torch.Tensor)) \
                    or result.requires_grad or result.dim() >= tensor.dim() or result.dim() == 0:
                return
            shape_in = tuple(int(s) for s in tensor.shape)
            if leading_merged(shape_in, tuple(int(s) for s in result.shape)) is None:
                return
            if not self.rec.finder.is_user_file(caller.f_code.co_filename):
                return
            loc = self.rec.here()
            if loc is not None:
                flat = self._flat
                if len(flat) >= _FLATTENED:  # the latest are the loss's
                    del flat[next(iter(flat))]
                flat[id(result)] = (weakref.ref(result), shape_in, loc)
        except Exception as exc:
            self.rec.internal_error("view axes", exc)

    def _before(self, args, kwargs, caller, result=None) -> None:
        tensor = args[0]
        if not (isinstance(tensor, torch.Tensor) and torch.is_grad_enabled()):
            return
        if not tensor.is_floating_point():
            self._one_hot(tensor, args, kwargs, caller)
            return
        try:
            shape = _target_shape(tensor, args, kwargs)
            if shape is None:
                return
            key = (tuple(int(s) for s in tensor.shape), shape)
            if key in self._held or key in self._inputs:
                return
            suspect = self._judged.get(key)
            if suspect is None:
                suspect = self._judged[key] = ("reordered" if reordered(*key) else
                                               "rows" if class_rows(*key) else "")
            if not suspect:
                return
            if not self.rec.finder.is_user_file(caller.f_code.co_filename):
                return  # a library's own reshape
            if tensor.requires_grad:
                if _skewed(tensor, *key):
                    return
                loc = self.rec.here()
                if loc is not None:
                    self._held[key] = loc  # confirmed in the loss's graph at the backward
                return
            if suspect == "rows":
                return  # rows of data: no graph tells they are scores
            # data without gradient (the batch itself) reshaped inside a training module's
            # forward: no graph to confirm it by, the module's parameters read it
            module = caller.f_locals.get("self") if caller.f_code.co_name == "forward" else None
            if isinstance(module, torch.nn.Module) and module.training:
                loc = self.rec.here()
                if loc is not None:
                    self._inputs[key] = (loc, weakref.ref(module))
            elif module is None and suspect == "reordered" and isinstance(result, torch.Tensor) \
                    and len(self._loose) < _LOOSE:
                # a batch laid out for the model outside its forward ((N, T, C, H, W) clips
                # viewed as (N, C, T, H, W)): confirmed at the backward by a node of the loss's
                # graph that saved this very tensor as its input
                loc = self.rec.here()
                if loc is not None:
                    self._loose[_memory(result)] = (key, loc)
        except Exception as exc:
            self.rec.internal_error("view axes", exc)

    def _one_hot(self, tensor, args, kwargs, caller) -> None:
        """An integer one-hot encoding (``F.one_hot``: classes on the last axis) viewed with its
        axes in another order (``one_hot(mask, C).view(N, C, H, W)`` for ``permute(0, 3, 1,
        2)``): the target a loss compares the scores with, scattered. Reported at the next
        backward with the parameters that loss trains."""
        try:
            if tensor.dim() < 3 or tensor.numel() > _ONE_HOT_VALUES or len(self._one_hots) >= _LOOSE \
                    or tensor.dtype == torch.bool:
                return
            shape = _target_shape(tensor, args, kwargs)
            if shape is None:
                return
            key = (tuple(int(s) for s in tensor.shape), shape)
            classes = key[0][-1]
            if classes < 2 or key in self._one_hots or key in self._told or shape[-1] == classes:
                return
            if key not in self._judged:
                self._judged[key] = ("reordered" if reordered(*key) else
                                     "rows" if class_rows(*key) else "")
            if self._judged[key] != "reordered":
                return
            if not self.rec.finder.is_user_file(caller.f_code.co_filename):
                return
            with torch.no_grad():
                if not (bool(((tensor == 0) | (tensor == 1)).all()) and bool((tensor.sum(-1) == 1).all())):
                    return
            loc = self.rec.here()
            if loc is not None:
                self._one_hots[key] = loc
        except Exception as exc:
            self.rec.internal_error("view axes", exc)

    def _one_hot_targets(self, tensors) -> None:
        held, self._one_hots = self._one_hots, {}
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        roots = [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        if not roots:
            return
        tensors_seen = self.rec.tensors
        pids: set = set()
        for root in roots:
            walked = reached(root, _LEAVES, truncate=True)
            pids |= {pid for i in walked[1] if (pid := tensors_seen.number.get(i)) is not None
                     and id(tensors_seen.refs[pid]()) == i}
        for key, loc in held.items():
            if key in self._told:
                continue
            self._told.add(key)
            self.rec.emit_aside(ev.view_axes(shape_in=list(key[0]), shape_out=list(key[1]),
                                             params=sorted(pids)[:64], one_hot=True), loc)

    def describe_loss(self, tensors) -> dict:
        if not self._open:
            return {}
        self._windows += 1
        try:
            if self._one_hots:
                self._one_hot_targets(tensors)
            if self._held:
                self._look(tensors)
            if self._inputs:
                self._data()
            if self._loose:
                self._loose_inputs(tensors)
            if self._flat:
                flat, self._flat = self._flat, {}
                self._rows(tensors, flat)
        except Exception as exc:
            self.rec.internal_error("view axes", exc)
        if self._windows >= _WINDOWS:
            self._close()
        return {}

    def _close(self) -> None:
        """Put torch's own view and reshape back: nothing of this watcher runs after the first
        backwards. (The patcher's undo at exit then finds them as they were.)"""
        self._open = False
        for owner, name, original, wrapper in self._restore:
            try:  # not from under another watcher's wrapper
                put_back(owner, name, original, wrapper)
            except Exception as exc:
                self.rec.internal_error("view axes", exc)

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            nodes = post_order(root, _NODES)
            if nodes is None:
                continue
            rows = None
            for node in nodes:
                if not type(node).__name__.startswith(_VIEWS):
                    continue
                sizes = saved(node, "_saved_self_sym_sizes")
                try:
                    out = tuple(int(s) for s in node._input_metadata[0].shape)
                except Exception:  # a node without metadata
                    continue
                if sizes is None:
                    continue
                key = (tuple(int(s) for s in sizes), out)
                loc = self._held.get(key)
                if loc is None or key in self._told:
                    continue
                classes = None
                if self._judged.get(key) == "rows":
                    if rows is None:
                        rows = _normalised_rows(nodes)
                    if id(node) not in rows or not _class_first(node, key[0]):
                        continue
                    classes = key[1][-1]
                self._told.add(key)
                self._report(node, key, loc, classes)

    def _loose_inputs(self, tensors) -> None:
        """Data reshaped outside a forward since the last backward, whose result a node of the
        loss's graph saved as its input (a convolution's, a Linear's, a matrix product's):
        reported with the parameters below that node (the ones that read it)."""
        loose, self._loose = self._loose, {}
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            for node in post_order(root, _NODES) or ():
                for name in _SAVED_INPUTS:
                    value = saved(node, name)
                    if not isinstance(value, torch.Tensor) or value.requires_grad:
                        continue
                    entry = loose.get(_memory(value))
                    if entry is None or entry[0] in self._told:
                        continue
                    key, loc = entry
                    self._told.add(key)
                    self._report(node, key, loc)

    def _rows(self, tensors, flat: dict) -> None:
        """Each loss of the graph whose target is one the user's code flattened: the axes its
        input was flattened from (the view node below it) against the target's, in order."""
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            nodes = post_order(root, _NODES)
            for node in nodes or ():
                call = loss_of(node)
                fn = _ROW_LOSSES.get(call.fn) if call is not None else None
                if fn is None:
                    continue
                target = call.target
                entry = flat.get(id(target)) if target is not None else None
                if entry is None or entry[0]() is not target:
                    continue
                scores = _flattened_input(call.input_node)
                if scores is None:
                    continue
                target_from, loc = entry[1], entry[2]
                lead_in = leading_merged(*scores)
                lead_target = leading_merged(target_from, tuple(int(s) for s in target.shape))
                if lead_in is None or lead_target is None or lead_in == lead_target \
                        or sorted(lead_in) != sorted(lead_target) or len(set(lead_in)) < 2:
                    continue
                key = (loc.path, loc.line, lead_in, lead_target)
                if key in self._rows_told:
                    continue
                self._rows_told.add(key)
                self.rec.emit_aside(ev.rows_misaligned(
                    fn=fn, scores_from=list(scores[0]), scores=list(scores[1]),
                    target_from=list(target_from), target=[int(s) for s in target.shape]), loc)

    def _data(self) -> None:
        """Data reshaped in a training module's forward since the last backward: reported with
        the module's parameters (their gradient reads the scrambled input)."""
        tensors = self.rec.tensors
        for key, (loc, module_ref) in list(self._inputs.items()):
            module = module_ref()
            if key in self._told or module is None:
                continue
            self._told.add(key)
            pids = sorted(pid for p in module.parameters()
                          if (pid := tensors.number.get(id(p))) is not None)
            self.rec.emit_aside(ev.view_axes(shape_in=list(key[0]), shape_out=list(key[1]),
                                             params=pids[:64]), loc)

    def _report(self, node, key, loc, classes=None) -> None:
        tensors = self.rec.tensors
        walked = reached(node, _LEAVES, truncate=True)
        pids = sorted(pid for i in walked[1]
                      if (pid := tensors.number.get(i)) is not None and id(tensors.refs[pid]()) == i)
        self.rec.emit_aside(ev.view_axes(shape_in=list(key[0]), shape_out=list(key[1]),
                                         params=pids[:64], classes=classes), loc)
