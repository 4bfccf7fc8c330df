"""Cumulative ops (``cumsum``, ``logcumsumexp``, ``cumprod``) whose running order is not the order
the loss needs: each row paired with the running total of the wrong rows.

Two shapes of the same bug are looked at, both at the first ``_WINDOWS`` backwards that follow a
cumulative op with a graph:

* **a ranking normalizer over rows in no order** (a Cox partial likelihood, a Plackett-Luce /
  ListMLE term): ``h - logcumsumexp(h, 0)`` (or ``h - log(cumsum(exp(h), 0))``, ``exp(h) /
  cumsum(exp(h), 0)``) over the rows of a 1-D score is only a risk set when the rows run in the
  order of a key (event times, descending). At the op's call, the user's frames (the op's own
  and its caller's) are read for the per-row keys they hold: 1-D tensors of the rows' length,
  without gradient, with many distinct values (not a 0/1 event indicator, not a permutation).
  At the backward, the key is put in the order the op ran over (an index taken on the way in,
  a flip) and checked for order. No key in either direction: ``unsorted``. For a survival
  likelihood (the term is multiplied by a 0/1 per-row indicator: censoring) a key in ascending
  order under a prefix sum is ``reversed`` (the sum covers the earlier times, not the risk
  set). Nothing is said when no key is in the frames, or when one is in either order.
* **an inclusive transmittance** (NeRF volume rendering): ``alpha * cumprod(1 - alpha)`` (or
  ``alpha * exp(cumsum(log(1 - alpha)))``) with no shift between the product and the
  multiplication: sample ``i`` is dimmed by its own opacity. Found as a product of a node ``A``
  with a cumulative op over ``1 - A`` (or over ``E`` with ``A = 1 - E``), with only constant
  additions (an epsilon) between them.

Each finding is an aside event ``cumulative_order`` at the op's call line, once per line. Cost:
the six entry points (``torch.cumsum``/``cumprod``/``logcumsumexp`` and the Tensor methods) are
wrapped; inside the window a call with a graph notes its node (and for a 1-D score, the keys
of two frames); after the window the wrapper returns at once. A later training phase
(``LossWindow``: an optimizer given parameters after the window closed) opens the window again:
the wrappers never left, nothing is patched again.
"""

from __future__ import annotations

import sys
from threading import get_ident

import torch

from .. import events as ev
from .graphpaths import saved, saved_dims
from .inlinable import watched_result
from .lossterms import loss_roots
from .losswindow import LossWindow
from .recorder import Recorder

_LISTEN = 8  # backwards listened to at most
_WINDOWS = 3  # backwards after cumulative ops judged
_NODES = 20000  # nodes walked from a loss
_NOTED = 256  # cumulative calls noted between two backwards
_MIN_ROWS = 8  # rows a normalizer must have to judge its order
_KEYS = 8  # keys kept per call
_FRAMES = 2  # user frames whose locals are read for keys
_OPS = ("cumsum", "cumprod", "logcumsumexp")
_NODE_OPS = {"CumsumBackward0": "cumsum", "CumprodBackward0": "cumprod",
             "LogcumsumexpBackward0": "logcumsumexp"}
# nodes that add a constant or clamp: the positions they pass on are the same
_CONSTANT = {"AddBackward1", "SubBackward1", "ClampMinBackward0", "ClampBackward1",
             "ClampMaxBackward0"}
# nodes between a 1-D score and its normalizer that keep the rows (or put them in another order)
_ROWS = {"ExpBackward0", "SqueezeBackward0", "SqueezeBackward1", "ViewBackward0",
         "UnsqueezeBackward0", "ReshapeAliasBackward0", "CloneBackward0", "FlipBackward0",
         "IndexBackward0", "SelectBackward0"}


_SHIFT = {"SliceBackward0", "ConstantPadNdBackward0", "CatBackward0", "RollBackward0"}


def _ndim(node) -> int | None:
    """The number of dims of a cumulative op's result (its saved input's sizes, or its result)."""
    result = saved(node, "_saved_result")
    if isinstance(result, torch.Tensor):
        return result.dim()
    kids = _inputs(node)
    sizes = saved(kids[0], "_saved_self_sym_sizes") if kids else None
    if isinstance(sizes, tuple):
        return len(sizes)
    return None


def _composited_axis(product, parents: dict) -> int | None:
    """The axis of ``product`` (``alpha * T``, the weights) that the rendering sums over: up
    through an ``unsqueeze`` and a product with the colours to a ``sum``; None when it is not
    that plain."""
    up, inserted = product, None
    for _ in range(4):
        ups = parents.get(up, ())
        if len(ups) != 1:
            return None
        parent = ups[0]
        name = type(parent).__name__
        if name == "UnsqueezeBackward0" and inserted is None:
            inserted = saved_dims(parent)
        elif name == "SumBackward1":
            dims = saved_dims(parent)
            sizes = saved(parent, "_saved_self_sym_sizes")
            if not isinstance(dims, tuple) or len(dims) != 1 or not isinstance(sizes, tuple):
                return None
            axis = dims[0] % len(sizes)
            if inserted is not None:
                inserted %= len(sizes)
                if axis == inserted:
                    return None
                if axis > inserted:
                    axis -= 1
            return axis
        elif name != "MulBackward0":
            return None
        up = parent
    return None


def _inputs(node) -> list:
    return [child for child, _ in node.next_functions if child is not None]


def _strip(node):
    """Below the nodes that add a constant (an epsilon) or clamp."""
    for _ in range(8):
        if node is None:
            return None
        name = type(node).__name__
        kids = _inputs(node)
        if (name in _CONSTANT or name in ("AddBackward0", "SubBackward0")) and len(kids) == 1:
            node = kids[0]
            continue
        return node
    return node


def _same(a, b, depth: int = 3) -> bool:
    """The same node, or the same op of the same inputs written twice (``-sigma * delta`` in two
    lines), ``depth`` levels down."""
    if a is b:
        return True
    if depth <= 0 or a is None or b is None or type(a) is not type(b):
        return False
    kids_a, kids_b = _inputs(a), _inputs(b)
    return bool(kids_a) and len(kids_a) == len(kids_b) and \
        all(_same(x, y, depth - 1) for x, y in zip(kids_a, kids_b))


def _complement(node):
    """``X`` when ``node`` is ``1 - X`` (``RsubBackward1``), else None."""
    if node is not None and type(node).__name__ == "RsubBackward1":
        kids = _inputs(node)
        if len(kids) == 1:
            return kids[0]
    return None


def _sorted_as(values, descending: bool) -> bool:
    diffs = values[1:] - values[:-1]
    return bool((diffs <= 0).all()) if descending else bool((diffs >= 0).all())


def _is_key(value, rows: int, exclude) -> bool:
    if not isinstance(value, torch.Tensor) or value is exclude or value.requires_grad:
        return False
    if value.device.type != "cpu" or value.dtype == torch.bool or value.is_complex():
        return False
    if value.numel() != rows or value.dim() == 0 or value.shape[0] != rows:
        return False
    try:
        flat = value.reshape(-1).double()
        distinct = int(torch.unique(flat).numel())
        if distinct < max(4, rows // 4):
            return False  # an event indicator, a group label: no order to follow
        if not value.is_floating_point() and distinct == rows and int(flat.min()) == 0 \
                and int(flat.max()) == rows - 1:
            return False  # a permutation (argsort's output): an index, not a key
        return True
    except Exception:
        return False


def _distribution_prefix(op: str, node, result) -> bool:
    """Whether a cumulative op of 3 axes or more (CPU) ends at 1 (``cumsum``) or 0
    (``logcumsumexp``) everywhere along its axis: the CDF of a distribution over classes or
    bins, not a running state."""
    if op == "cumprod" or result.dim() < 3 or result.device.type != "cpu" \
            or not result.is_floating_point():
        return False
    dim = saved_dims(node)
    if not isinstance(dim, int):
        return False
    with torch.no_grad():
        last = result.detach().select(dim, -1)
        return bool(((last - (1.0 if op == "cumsum" else 0.0)).abs() < 1e-3).all())


class CumulativeOrderWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.active = True
        self._noted: dict = {}  # node -> (op, loc, [(name, key tensor)], result's shape)
        self._axes_told: set = set()  # call lines whose axis was recorded
        self._judged = 0
        self._failed = False
        # the backwards listened to (``_LISTEN``); a later phase listens again
        self.loss_window = LossWindow(rec, _LISTEN, describer=self.describe_loss, on_reopen=self._reopen)
        self._done: set = set()

    # -- the calls ------------------------------------------------------------------------------
    def _note(self, op: str, result) -> None:
        if not self.active or len(self._noted) >= _NOTED:
            return
        node = getattr(result, "grad_fn", None)
        if node is None or node in self._noted or get_ident() != self.rec.script_thread:
            return
        try:
            loc = self.rec.here()
            keys: list = []
            if result.dim() >= 1 and result.numel() == result.shape[0] >= _MIN_ROWS \
                    and op != "cumprod":
                keys = self._keys(int(result.shape[0]))
            self._noted[node] = (op, loc, keys, tuple(int(n) for n in result.shape),
                                 _distribution_prefix(op, node, result))
        except Exception as exc:
            self.active = False
            self._failed = True  # never reopened after an internal error
            self.rec.internal_error(f"torch.{op}", exc)

    def _keys(self, rows: int) -> list:
        found: list = []
        frames = self.rec.finder.user_frames(sys._getframe(1))
        for depth, frame in enumerate(frames):
            if depth >= _FRAMES:
                break
            for name, value in list(frame.f_locals.items()):
                if len(found) >= _KEYS:
                    return found
                if _is_key(value, rows, None) and all(value is not k for _, k in found):
                    found.append((name, value))
        return found

    # -- the backward ---------------------------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        """Judges the backwards after noted calls; off the backwards after ``_WINDOWS`` judged
        or ``_LISTEN`` in all."""
        self.loss_window.take()
        noted, self._noted = self._noted, {}
        try:
            if noted:
                self._judged += 1
                self._judge(tensors, noted)
        except Exception as exc:
            self.rec.internal_error("cumulative_order", exc)
        if self._judged >= _WINDOWS or self.loss_window.closed:
            self.active = False
            self._noted = {}
            self.loss_window.end()  # retires describe_loss
        return {}

    def _reopen(self) -> None:
        """A later phase: its first cumulative ops are noted and judged too."""
        if self._failed:
            return
        self._judged = 0
        self._noted = {}
        self.active = True

    def _judge(self, tensors, noted: dict) -> None:
        parents: dict = {}
        seen: set = set()
        stack = list(loss_roots(tensors))
        found = []
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            if len(seen) > _NODES:
                return
            if node in noted:
                found.append(node)
            for child in _inputs(node):
                parents.setdefault(child, []).append(node)
                stack.append(child)
        for node in found:
            op, loc, keys, shape, cdf = noted[node]
            if loc is not None and len(shape) >= 3 and (loc.path, loc.line) not in self._axes_told:
                # the axis each prefix of a loss runs over, for the rules that know which axis
                # holds the positions (prefix-sum-off-positions)
                dim = saved_dims(node)
                if isinstance(dim, int):
                    self._axes_told.add((loc.path, loc.line))
                    self.rec.emit_aside(ev.cumulative_axis(op=op, shape=list(shape),
                                                           dim=dim % len(shape), cdf=cdf), loc)
            if loc is None or (loc.path, loc.line) in self._done:
                continue
            made = self._transmittance(node, op, parents) or self._normalizer(node, op, keys, parents)
            if made is not None:
                self._done.add((loc.path, loc.line))
                self.rec.emit_aside(made, loc)

    # -- an inclusive transmittance --------------------------------------------------------------
    def _transmittance(self, node, op: str, parents: dict):
        kids = _inputs(node)
        if len(kids) != 1 or op == "logcumsumexp":
            return None
        inner, shifted = _strip(kids[0]), False
        if type(inner).__name__ in _SHIFT:  # a 1 prepended before the product: exclusive
            grads = _inputs(inner)
            if len(grads) != 1:
                return None
            inner, shifted = _strip(grads[0]), True
        log = inner if type(inner).__name__ == "LogBackward0" else None
        inner_log = _strip(_inputs(log)[0]) if log is not None and _inputs(log) else None
        # walk up: shifts (a slice, a pad), constant additions, and for a sum in log space its exp
        up, exped = node, op == "cumprod"
        for _ in range(6):
            ups = parents.get(up, ())
            for parent in ups:
                if type(parent).__name__ != "MulBackward0" or not exped:
                    continue
                others = [k for k in _inputs(parent) if k is not up]
                if len(others) != 1:
                    continue
                alpha = others[0]
                if op == "cumprod":
                    hit = _same(_complement(inner), alpha) or _same(_complement(alpha), inner)
                else:  # alpha = 1 - exp(s), T = exp(cumsum(s)); or T = exp(cumsum(log(1 - alpha)))
                    base = _complement(alpha)
                    hit = (base is not None and type(base).__name__ == "ExpBackward0"
                           and len(_inputs(base)) == 1 and _same(_inputs(base)[0], inner)) or \
                        (inner_log is not None and _same(_complement(inner_log), alpha))
                if not hit:
                    continue
                dim = saved_dims(node)
                dim = dim if isinstance(dim, int) else None
                if not shifted:
                    return ev.cumulative_order(op=op, case="inclusive", key=None, rows=None, dim=dim)
                summed = _composited_axis(parent, parents)
                ndim = _ndim(node)
                if summed is not None and dim is not None and ndim is not None \
                        and summed != dim % ndim:
                    return ev.cumulative_order(op=op, case="axis", key=None, rows=summed, dim=dim)
                return None
            if len(ups) != 1:
                return None
            name = type(ups[0]).__name__
            if name in _SHIFT:
                shifted = True
            elif name == "ExpBackward0" and not exped:
                exped = True
            elif not (name in _CONSTANT or (name == "AddBackward0" and len(_inputs(ups[0])) == 1)):
                return None
            up = ups[0]
        return None

    # -- a ranking normalizer over rows out of order ---------------------------------------------
    def _normalizer(self, node, op: str, keys: list, parents: dict):
        if op == "cumprod" or not keys:
            return None
        dim = saved_dims(node)
        if dim not in (0, -1):
            return None
        kids = _inputs(node)
        if len(kids) != 1:
            return None
        # the rows' way in: flips and one index
        chain, flips, perm, below = set(), 0, None, kids[0]
        rows = int(keys[0][1].shape[0])
        for _ in range(12):
            if below is None:
                break
            name = type(below).__name__
            if name not in _ROWS:
                break
            chain.add(below)
            if name == "FlipBackward0":
                flips += 1
            elif name == "IndexBackward0":
                indices = saved(below, "_saved_indices")
                if not isinstance(indices, (tuple, list)) or len(indices) != 1 \
                        or not isinstance(indices[0], torch.Tensor) or perm is not None:
                    return None
                index = indices[0]
                if index.dim() != 1 or index.numel() != rows or index.dtype == torch.bool \
                        or index.device.type != "cpu":
                    return None
                perm = index
            nxt = _inputs(below)
            if len(nxt) != 1:
                break
            below = nxt[0]
        chain.add(below)
        # the normalizer: a row's own score minus (or over) the running total
        up, normalizer, survival = node, None, False
        for _ in range(6):
            ups = parents.get(up, ())
            for parent in ups:
                name = type(parent).__name__
                if name in ("SubBackward0", "DivBackward0"):
                    others = [k for k in _inputs(parent) if k is not up]
                    if others and others[0] in chain:
                        normalizer = parent
            if normalizer is not None or len(ups) != 1:
                break
            if type(ups[0]).__name__ not in ("LogBackward0", "FlipBackward0", "AddBackward0",
                                              "AddBackward1", "UnsqueezeBackward0",
                                              "ViewBackward0", "SqueezeBackward0",
                                              "SqueezeBackward1"):
                break
            up = ups[0]
        if normalizer is None:
            return None
        for parent in parents.get(normalizer, ()):
            if type(parent).__name__ == "MulBackward0":
                other = saved(parent, "_saved_other")
                if not isinstance(other, torch.Tensor):
                    other = saved(parent, "_saved_self")
                if isinstance(other, torch.Tensor) and not other.requires_grad \
                        and other.numel() == rows and other.device.type == "cpu":
                    values = other.reshape(-1)
                    if bool(((values == 0) | (values == 1)).all()) and bool((values == 0).any()):
                        survival = True
        descending_needed = flips % 2 == 0  # a prefix sum: the keys must fall along the rows
        reversed_named = None
        for name, key in keys:
            views = [key.reshape(-1).double()]
            if perm is not None:
                views.append(views[0][perm])
            for view in views:
                if flips % 2:
                    view = view.flip(0)
                if _sorted_as(view, descending=True):
                    return None  # in the risk sets' order
                if _sorted_as(view, descending=False):
                    if not survival:
                        return None  # ascending: a ranking's own convention, not judged
                    reversed_named = reversed_named or name
        del descending_needed
        if reversed_named is not None:
            return ev.cumulative_order(op=op, case="reversed", key=reversed_named, rows=rows,
                                       dim=0)
        return ev.cumulative_order(op=op, case="unsorted", key=keys[0][0], rows=rows, dim=0)

    # -- install -------------------------------------------------------------------------------
    def install(self, patcher) -> None:
        watcher = self
        for op in _OPS:
            def note(result, op=op) -> None:
                watcher._note(op, result)
            for owner in (torch, torch.Tensor):
                original = getattr(owner, op, None)
                if original is not None:
                    patcher.patch(owner, op, watched_result(original, note))
