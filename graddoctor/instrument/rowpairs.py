"""Whether a loop that slices its own batches (no DataLoader) gives the model the rows of some
samples and the loss the targets of other samples.

A hand-rolled loop keeps inputs and targets in two tensors of one length, ``X`` and ``y``, and
takes the rows of a batch from each by indexing. The pairing of row ``i`` with label ``i`` holds
only while both are indexed alike. It breaks without an error when they are not: the inputs
shuffled with ``X[perm]`` and the labels left in order, or shuffled by a second ``randperm``;
``X[perm[i:i + bs]]`` beside ``y[i:i + bs]``. Each output is then scored against another sample's
label: the model trains on noise and the loss stalls.

What is read, on the first ``WINDOW`` backwards (CPU tensors only):

* ``Tensor.__getitem__`` is wrapped (``watched_call``) and put back when the window ends. An
  index by the script's own code that selects rows along the first dimension only (a slice, a
  1-D integer or boolean index, a list of ints) of a tensor of at least ``_MIN_LENGTH`` rows
  gives the result a *row origin*: the tensor the rows were first taken from (its root) and
  which of that root's rows, in order (an index of an indexed tensor composes the two). Results
  are known by their memory (data pointer and size), so a view of them (``yb.view(-1, 1)``)
  keeps the origin; the lines of the selections are kept.
* A global forward pre-hook on the outermost module call notes this turn's inputs that have a
  row origin; at the backward, the targets the loss nodes saved (``batchpairs.loss_targets``)
  are looked up the same way.
* An input and a target are compared when their roots differ and hold as many rows, and they
  name as many rows: the same rows in the same order, or rows at one fixed offset (a forecast's
  target ``horizon`` steps after its features), is a pairing; anything else is not. A target
  paired with none of the inputs it can be compared with makes its turn count; two such turns
  make a ``row_pairing`` aside event at the target's selection that first departs from the
  input's (the line to change).

Silent on: DataLoader batches (``batchpairs.py``); targets computed from the inputs or from both
sides (an autoencoder's, a siamese pair's "same class" label); a forecast or language model that
reads its targets from the same tensor as its inputs (one root); inputs made of other values
(normalised, augmented, mixed): they have no row origin.
"""

from __future__ import annotations

import sys
import weakref
from threading import get_ident

import torch

from .. import events as ev
from .batchpairs import loss_targets
from .dependency import close_before_compile, register_module_hooks
from .inlinable import watched_call
from .recorder import Recorder

WINDOW = 6  # backwards judged, from the first one
_MIN_LENGTH = 16  # rows a tensor must hold for its selections to be followed
_MIN_ROWS = 4  # rows a batch must name to be compared
_KNOWN = 256  # row origins kept at most (the window's batches)
_TURNS = 2  # turns with a target paired with no input, before it is told
_INPUTS = 8  # model inputs with a row origin noted per turn at most


def _row_key(key, length: int):
    """``key`` as a selection of rows along the first dimension, or None when it selects along
    other dimensions too (``x[:, 0]``, ``x[idx, 1:]``)."""
    if isinstance(key, tuple):
        if not key or any(k is not Ellipsis and k != slice(None) for k in key[1:]):
            return None
        key = key[0]
    if isinstance(key, slice):
        return key
    if isinstance(key, torch.Tensor):
        if key.dim() != 1 or key.device.type != "cpu":
            return None
        if key.dtype is torch.bool:
            return key if key.numel() == length else None
        return key if not key.is_floating_point() and not key.is_complex() else None
    if isinstance(key, list) and key and len(key) <= 1 << 16 and all(type(k) is int for k in key):
        return torch.tensor(key)
    return None


class _Origin:
    __slots__ = ("ref", "root", "length", "rows", "lines")

    def __init__(self, ref, root: int, length: int, rows: torch.Tensor, lines: tuple):
        self.ref, self.root, self.length, self.rows, self.lines = ref, root, length, rows, lines


def pairs_agree(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether rows ``a`` of one tensor and rows ``b`` of another are a pairing: the same rows in
    the same order, or the same rows shifted by one fixed offset."""
    offset = a - b
    return bool((offset == offset[0]).all())


class RowPairWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.active = False
        self._patcher = None
        self._handles: list = []
        self._wrapper = None
        self._origins: dict[tuple, _Origin] = {}  # (data_ptr, numel) -> where its rows came from
        self._roots: dict[int, object] = {}  # root number -> a weak reference to the root
        self._inputs: list[_Origin] = []  # this turn's model inputs with a row origin
        self._backwards = 0
        self._disagreed = 0
        self._first: tuple | None = None  # (input origin, target origin) of the first disagreement

    # -- the window -----------------------------------------------------------------------------
    def _stop(self) -> None:
        self.active = False
        if self._wrapper is not None and self._patcher is not None:
            self._patcher.unpatch(torch.Tensor, "__getitem__", self._wrapper)
        self._wrapper = None
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._origins, self._roots, self._inputs = {}, {}, []

    # -- Tensor.__getitem__ ---------------------------------------------------------------------
    def _origin(self, t: torch.Tensor) -> _Origin | None:
        found = self._origins.get((t.data_ptr(), t.numel()))
        if found is None or found.ref() is None:
            return None
        return found

    def _indexed(self, args, kwargs, result) -> None:
        if not self.active or get_ident() != self.rec.script_thread or len(args) != 2:
            return
        source, key = args
        if not isinstance(result, torch.Tensor) or not isinstance(source, torch.Tensor) \
                or source.device.type != "cpu" or source.dim() == 0 or result.dim() != source.dim():
            return
        try:
            length = int(source.shape[0])
            rows_key = _row_key(key, length)
            if rows_key is None or not self.rec.finder.is_user_file(sys._getframe(2).f_code.co_filename):
                return
            if len(self._origins) >= _KNOWN:
                self._origins = {k: o for k, o in self._origins.items() if o.ref() is not None}
                if len(self._origins) >= _KNOWN:
                    return
            known = self._origin(source)
            if known is None:
                if length < _MIN_LENGTH:
                    return
                root = id(source)
                if root in self._roots and self._roots[root]() is not source:
                    root = max(self._roots) + 1  # an id reused by a new tensor: a new root
                self._roots.setdefault(root, weakref.ref(source))
                base, parent_lines, root_length = torch.arange(length), (), length
            else:
                root, base, parent_lines, root_length = known.root, known.rows, known.lines, known.length
            rows = base[rows_key]
            if rows.numel() != int(result.shape[0]):
                return
            loc = self.rec.here()
            self._origins[(result.data_ptr(), result.numel())] = _Origin(
                weakref.ref(result), root, root_length, rows, (parent_lines + (loc,))[-4:])
        except Exception as exc:
            self._stop()
            self.rec.internal_error("row pairing (index)", exc)

    # -- the model's inputs ---------------------------------------------------------------------
    def _pre(self, module, args, *rest):
        if not self.active or get_ident() != self.rec.script_thread or not self._origins:
            return None
        try:
            kwargs = rest[0] if rest and isinstance(rest[0], dict) else {}
            if not (torch.is_grad_enabled() and getattr(module, "training", False)):
                return None
            for t in list(args) + list(kwargs.values()):
                if isinstance(t, torch.Tensor) and not t.requires_grad and t.dim() >= 1:
                    found = self._origin(t)
                    if found is not None and len(self._inputs) < _INPUTS:
                        self._inputs.append(found)
        except Exception as exc:
            self._stop()
            self.rec.internal_error("row pairing (forward)", exc)
        return None

    # -- DESCRIBE_LOSS --------------------------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        if not self.active:
            return {}
        try:
            self._backwards += 1
            inputs, self._inputs = self._inputs, []
            if inputs:
                self._judge(tensors, inputs)
            if self._backwards >= WINDOW:
                self._stop()
        except Exception as exc:
            self._stop()
            self.rec.internal_error("row pairing", exc)
        return {}

    def _judge(self, tensors, inputs) -> None:
        """This turn's targets, each against the model's inputs: one that names other rows than
        every input it can be compared with disagrees (a target that agrees with one input, as
        a query's labels with the query beside its support set, is paired)."""
        roots = [t.grad_fn for t in (tensors if isinstance(tensors, (list, tuple)) else [tensors])
                 if isinstance(t, torch.Tensor) and t.grad_fn is not None][:4]
        disagreed = None
        for root in roots:
            for _fn, target in loss_targets(root, {})[0]:
                if target.requires_grad or target.device.type != "cpu" or target.dim() == 0:
                    continue
                told = self._origin(target)
                if told is None:
                    continue
                comparable = [given for given in inputs
                              if given.root != told.root and given.length == told.length
                              and given.rows.numel() == told.rows.numel() >= _MIN_ROWS]
                if comparable and not any(pairs_agree(g.rows, told.rows) for g in comparable):
                    disagreed = disagreed or (comparable[0], told)
        if disagreed is None:
            return
        self._disagreed += 1
        self._first = self._first or disagreed
        if self._disagreed >= _TURNS:
            self._tell()

    def _tell(self) -> None:
        given, told = self._first
        # the target's first selection at a line the input's selections do not share
        line = next((loc for loc in told.lines if loc is not None and loc not in given.lines),
                    told.lines[-1] if told.lines else None)
        same_rows = bool(torch.equal(given.rows.sort().values, told.rows.sort().values))
        self.rec.emit_aside(ev.row_pairing(rows=int(told.rows.numel()), length=told.length,
                                           same_rows=same_rows,
                                           input_lines=[loc.line for loc in given.lines if loc is not None],
                                           input_path=next((loc.path for loc in given.lines if loc), None)),
                            line)
        self._stop()

    def _before_compile(self) -> None:
        self._stop()

    def install(self, patcher) -> None:
        close_before_compile(patcher, self._before_compile)
        self._patcher = patcher
        self._wrapper = watched_call(torch.Tensor.__getitem__, self._indexed)
        patcher.patch(torch.Tensor, "__getitem__", self._wrapper)
        self._handles = register_module_hooks(patcher, self._pre, None, outermost=True)
        self.active = True
