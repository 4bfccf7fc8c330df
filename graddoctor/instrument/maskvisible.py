"""A masked reconstruction loss that counts the positions the model sees, not the ones it hides
(``masked-target-visible``).

Masked modelling hides part of the input and asks for it back: MAE drops the masked patches
before its encoder, inpainting zeroes the hole, masked feature modelling replaces the chosen
cells. The loss must count the hidden positions. A mask the wrong way round (``mask[:, keep:] =
0`` for ``mask[:, :keep] = 0``, ``pred[~hidden]`` for ``pred[hidden]``, ``masked_fill(corrupt,
0)`` on the error) or an input that was never hidden (``torch.cat([img, hole], 1)``: the hole
given as a channel, the image whole) trains the model to copy what it is given; the loss falls
and the model learns nothing it can use where the input is missing.

What the run shows, with no name read, at the first ``WINDOW`` backwards, and at those of a
later training phase (``LossWindow``: an optimizer given parameters after the window closed; the
module hooks are registered again then, never after torch.compile or an internal error):

* Global module hooks note each ``nn.Linear`` and convolution called on graph-free CPU floating
  data (the model's input) and, for a linear layer, put a read-only gradient hook on its output:
  which of its positions the backward's gradient reaches. They also note every module's output
  by its ``grad_fn`` (a prediction, to read a target back from a saved difference).
* At each of those backwards (``DESCRIBE_LOSS``) the loss's top (sums, means, additions,
  products and quotients by constants or by a computed count, views) is walked to the terms a
  0/1 mask restricts to a set of positions: a product with a constant 0/1 tensor, a ``where``,
  a ``masked_fill``, a boolean index (on the error, or on the prediction given to
  ``F.mse_loss``/``l1_loss``/``smooth_l1_loss``). Below it the per-element error is followed to
  its target: saved by the loss function, or the prediction minus the difference a square or an
  absolute value saved (graphpaths' ``saved``: nothing unpacked under hooks).
* After the backward, the target is compared, position by position, with the input of the first
  layer of the same shape (the first channels of a convolution's wider input): a position
  shows the target when the input there holds the target's values (exactly, through one affine
  map over the counted positions, or, for vectors of 4 values or more, after each position's
  standardisation: MAE's ``norm_pix_loss``) and the linear layer's output there gets a gradient.
  A masked term whose counted positions (5 % to 95 % of them, at least ``_MIN_COUNTED``) show
  the target almost all (``_VISIBLE``), while the model hides the positions it does not count
  (``_HIDDEN`` of them: other values in its input, or no gradient at its first layer) or is
  given the loss's mask as an input channel, is told: ``masked_visible``, an aside at the
  backward, once per backward line.

Silent: a plain autoencoder or VAE (no mask); a masked autoencoder whose loss counts the hidden
positions (with ``norm_pix_loss`` too); inpainting with the hole zeroed; a denoising
autoencoder (noise everywhere: no position shows the target); padding left out of a
reconstruction loss (the model hides nothing: the padded input equals its target there); a loss
on every position beside a masked term; targets that are not the input (labels, next steps);
models on an accelerator. Skipped: threads other than the script's, torch.compile.
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from threading import get_ident

import torch
from torch import nn

from .. import events as ev
from .dependency import close_before_compile, register_module_hooks
from .lossnodes import REGRESSIONS, loss_of
from .graphpaths import saved
from .losswindow import LossWindow
from .maskmean import masked_share
from .patcher import check_hook
from .recorder import Recorder
from .topics import STEPPED

WINDOW = 4  # backwards watched, from the first one
_ENTRIES = 8  # first-layer calls on data noted per backward, at most
_OUTPUTS = 512  # module outputs noted per backward, at most
_RECENT = 4  # last module outputs of a turn held (strongly) until its backward
_NODES = 200  # nodes of the loss's top walked per backward
_CHAIN = 10  # nodes followed below a masked term to its error
_TERMS = 4  # masked terms judged per loss
_MIN_COUNTED = 8  # counted positions a verdict needs, at least
_VISIBLE = 0.95  # share of the counted positions whose input holds the target
_HIDDEN = 0.9  # share of the other positions the model hides
_COUNTED = (0.05, 0.95)  # share of the positions the mask counts: a restriction
_MAX_CELLS = 1 << 22  # targets larger than this are not read

_tensor_register_hook = torch.Tensor.register_hook  # torch's own: dependency.py wraps the script's calls


def _register_hook(tensor, hook):
    return check_hook(_tensor_register_hook(tensor, hook))  # removed when the check ends
_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_VIEWS = frozenset({"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "SqueezeBackward0",
                    "SqueezeBackward1", "SqueezeBackward2", "UnsqueezeBackward0", "CloneBackward0",
                    "AliasBackward0", "FlattenBackward0"})
_REDUCE = frozenset({"MeanBackward0", "MeanBackward1", "SumBackward0", "SumBackward1"})
_TOP = _REDUCE | _VIEWS | frozenset({"AddBackward0", "SubBackward0", "NegBackward0", "MulBackward0",
                                     "DivBackward0", "AddBackward1", "SubBackward1", "MulBackward1",
                                     "DivBackward1"})
_LOSSES = frozenset({"MseLossBackward0", "L1LossBackward0", "SmoothL1LossBackward0", "HuberLossBackward0"})


def _children(node) -> list[tuple[int, object]]:
    return [(i, child) for i, (child, _) in enumerate(node.next_functions) if child is not None]


def _shape(node) -> tuple | None:
    try:
        return tuple(int(s) for s in node._input_metadata[0].shape)
    except Exception:  # a node without metadata
        return None


class _Term:
    """A loss term restricted to the positions ``counted`` (bool, shape S); the target there:
    ``target`` of shape S + trailing (every position), or ``selected`` (the counted positions'
    rows, in order)."""
    __slots__ = ("how", "counted", "target", "selected")

    def __init__(self, how, counted, target=None, selected=None):
        self.how, self.counted, self.target, self.selected = how, counted, target, selected


class _Entry:
    """A first layer called on data: its input, and which positions of its output the
    backward's gradient reached (None until it runs; never, for a convolution)."""
    __slots__ = ("x", "positions", "reached", "conv", "handle", "node", "mixed", "loc",
                 "patch", "__weakref__")

    def __init__(self, x, positions, conv, node, loc):
        self.x, self.positions, self.conv, self.node, self.loc = x, positions, conv, node, loc
        self.reached = None
        self.handle = None
        self.mixed = False  # the loss reads this layer's output through an op that mixes positions
        self.patch = 0  # a patch embedding's patch size (a convolution with stride = kernel)


def _bool_index(node):
    """The boolean mask a ``tensor[mask]`` node indexed with, or None."""
    indices = saved(node, "_saved_indices")
    if not isinstance(indices, (list, tuple)) or len(indices) != 1:
        return None
    index = indices[0]
    if isinstance(index, torch.Tensor) and index.dtype == torch.bool and index.dim() >= 1:
        return index
    return None


class MaskedVisibleWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.active = False
        self._handles: list = []
        self._patcher = None
        self._ended = False  # torch.compile ran or the watcher failed: never reopened
        self.loss_window = LossWindow(rec, WINDOW, on_reopen=self._reopen)
        self._entries: list[_Entry] = []  # this turn's first layers on data
        self._outputs: dict[int, tuple] = {}  # id of an output's grad_fn -> (node, weakref to it)
        # the last module outputs of this turn, held until its backward: a prediction the script
        # drops (MAE's ``loss, _, _ = model(x)``) is still read back there
        self._recent: deque = deque(maxlen=_RECENT)
        self._pending: list[tuple] = []  # (terms, entries, loc) judged after their backward
        self._told: set = set()  # backward lines told

    # -- module hooks ------------------------------------------------------------------------
    def _post(self, module, args, *rest):
        if not self.active or get_ident() != self.rec.script_thread or not torch.is_grad_enabled():
            return None
        try:
            output = rest[-1] if rest else None
            outs = output if isinstance(output, (tuple, list)) else (output,)
            for out in outs[:4]:
                node = getattr(out, "grad_fn", None) if isinstance(out, torch.Tensor) else None
                if node is not None and len(self._outputs) < _OUTPUTS:
                    self._outputs[id(node)] = (node, weakref.ref(out))
                if node is not None:
                    self._recent.append((node, out))
            if isinstance(module, (nn.Linear, *_CONV)) and len(self._entries) < _ENTRIES:
                self._note(module, args[0] if args else None, output)
        except Exception as exc:
            self._stop()
            self.rec.internal_error("masked target visible (forward)", exc)
        return None

    def _note(self, module, x, out) -> None:
        if not (isinstance(x, torch.Tensor) and isinstance(out, torch.Tensor) and x.grad_fn is None
                and not x.requires_grad and x.is_floating_point() and x.device.type == "cpu"
                and x.dim() >= 2 and 0 < x.numel() <= _MAX_CELLS and out.requires_grad):
            return
        if any(e.x is x for e in self._entries):
            return
        conv = isinstance(module, _CONV)
        patch = conv and _patch_embedding(module, x, out)
        positions = (int(out.shape[0]), math.prod(int(s) for s in out.shape[2:])) if patch else \
            None if conv else tuple(out.shape[:-1])
        entry = _Entry(x, positions, conv, out.grad_fn, self.rec.here())
        entry.patch = int(module.kernel_size[0]) if patch else 0
        if patch:
            watcher = self

            def patch_hook(grad, entry_ref=weakref.ref(entry)):
                entry = entry_ref()
                try:
                    if entry is not None and entry.reached is None and watcher.rec.running_backwards \
                            and watcher.rec.in_backward():
                        g = grad.detach()
                        entry.reached = (g.flatten(2) != 0).any(1).reshape(-1).cpu()
                except Exception as exc:
                    watcher.rec.internal_error("masked target visible (gradient)", exc)
                return None

            entry.handle = _register_hook(out, patch_hook)
        elif not conv:
            watcher = self

            def hook(grad, entry_ref=weakref.ref(entry)):
                entry = entry_ref()
                try:
                    if entry is not None and entry.reached is None and watcher.rec.running_backwards \
                            and watcher.rec.in_backward():
                        entry.reached = (grad.detach() != 0).reshape(-1, int(grad.shape[-1])).any(1).cpu()
                except Exception as exc:
                    watcher.rec.internal_error("masked target visible (gradient)", exc)
                return None

            entry.handle = _register_hook(out, hook)
        self._entries.append(entry)

    # -- the loss's terms --------------------------------------------------------------------
    def _pred(self, node, shape):
        """The prediction a node made: a module's output (through views), or the result a
        sigmoid, tanh or exp saved; reshaped to ``shape``."""
        for _ in range(4):
            held = self._outputs.get(id(node))
            value = held[1]() if held is not None and held[0] is node else None
            if value is None:
                value = next((out for made, out in self._recent if made is node), None)
            name = type(node).__name__
            if value is None and name in ("SigmoidBackward0", "TanhBackward0", "ExpBackward0"):
                value = saved(node, "_saved_result")
            if isinstance(value, torch.Tensor):
                return value.reshape(shape) if value.numel() == math.prod(shape) else None
            children = _children(node)
            if name not in _VIEWS or len(children) != 1:
                return None
            node = children[0][1]
        return None

    def _difference_target(self, sub, diff):
        """The target of ``pred - target`` (or ``target - pred``) from the difference a square
        or absolute value saved, and the prediction (a module's output) it was taken from."""
        if type(sub).__name__ != "SubBackward0" or not isinstance(diff, torch.Tensor) \
                or diff.numel() > _MAX_CELLS:
            return None
        children = _children(sub)
        if len(children) != 1:
            return None
        alpha = saved(sub, "_saved_alpha", 1)
        if alpha != 1:
            return None
        index, child = children[0]
        pred = self._pred(child, tuple(diff.shape))
        if not isinstance(pred, torch.Tensor) or tuple(pred.shape) != tuple(diff.shape):
            return None
        with torch.no_grad():
            return pred.detach() - diff.detach() if index == 0 else diff.detach() + pred.detach()

    def _target_below(self, node):
        """The target of the per-element error ``node`` reduces (over trailing axes), or None."""
        for _ in range(_CHAIN):
            name = type(node).__name__
            children = _children(node)
            if name in _LOSSES:
                if saved(node, "_saved_reduction", 0) != 0:
                    return None
                target = saved(node, "_saved_target")
                return target.detach() if isinstance(target, torch.Tensor) \
                    and target.numel() <= _MAX_CELLS else None
            if name == "AbsBackward0" or (name == "PowBackward0" and saved(node, "_saved_exponent") == 2) \
                    or (name == "MulBackward0" and len(children) == 2 and children[0][1] is children[1][1]):
                if len(children) < 1:
                    return None
                return self._difference_target(children[0][1], saved(node, "_saved_self"))
            if (name in _REDUCE or name in _VIEWS) and len(children) == 1:
                node = children[0][1]
                continue
            return None
        return None

    def _terms(self, root) -> list[_Term]:
        found: list[_Term] = []
        stack, seen = [root], set()
        while stack and len(seen) < _NODES and len(found) < _TERMS:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            name = type(node).__name__
            children = _children(node)
            share = masked_share(node) if name in ("MulBackward0", "WhereBackward0", "MaskedFillBackward0") else None
            if share is not None:
                mask, how, index = share
                term = self._masked(node, mask, how, dict(children).get(index))
                if term is not None:
                    found.append(term)
                    continue
            if name == "IndexBackward0" and len(children) == 1:
                index = _bool_index(node)
                target = self._target_below(children[0][1]) if index is not None else None
                if target is not None and tuple(target.shape[:index.dim()]) == tuple(index.shape):
                    found.append(_Term("index", index, target=target))
                continue
            call = loss_of(node)  # l1_loss too, which torch builds of abs and mean
            if call is not None and call.fn in REGRESSIONS and call.reduced:
                target = call.target
                below = call.input_node
                alone = len(children) == 1 and not getattr(target, "requires_grad", True)
                index = _bool_index(below) if alone and type(below).__name__ == "IndexBackward0" else None
                if index is not None and isinstance(target, torch.Tensor) and target.numel() <= _MAX_CELLS:
                    found.append(_Term("index", index, selected=target.detach()))
                continue
            if name in _TOP:
                stack.extend(child for _, child in children)
        return found

    def _masked(self, node, mask, how, operand) -> _Term | None:
        shape = _shape(node)
        if operand is None or shape is None or not isinstance(mask, torch.Tensor):
            return None
        flat = mask.detach()
        if flat.dtype != torch.bool:
            if flat.is_complex() or not bool(((flat == 0) | (flat == 1)).all()):
                return None  # weights, not a mask
            flat = flat != 0
        try:
            counted = flat.expand(shape)
        except RuntimeError:
            return None
        target = self._target_below(operand)
        if target is None or tuple(target.shape[:len(shape)]) != shape:
            return None
        return _Term(how, counted, target=target)

    # -- the verdict -------------------------------------------------------------------------
    def _judge(self, term: _Term, entries) -> dict | None:
        counted = term.counted.cpu()
        positions = counted.numel()
        n = int(counted.sum())
        if n < _MIN_COUNTED or not _COUNTED[0] <= n / positions <= _COUNTED[1]:
            return None
        for entry in entries:
            verdict = _compare(term, counted, entry)
            if verdict is not None:
                return verdict
        return None

    def describe_loss(self, tensors) -> dict:
        if not self.active and not self._pending:
            return {}
        try:
            self._judge_pending()
            if self.active:
                self.loss_window.take()
                items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
                terms = []
                for root in [t.grad_fn for t in items[:4]
                             if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
                    terms += self._terms(root)
                entries, self._entries, self._outputs = self._entries, [], {}
                self._recent.clear()
                loc = self.rec.here()
                if terms and entries and loc is not None and (loc.path, loc.line) not in self._told:
                    for root in [t.grad_fn for t in items[:4]
                                 if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
                        _mark_mixed(root, entries)
                    self._pending.append((terms, entries, loc))
                    self.rec.resume(STEPPED, self.after_step)
                else:
                    _release(entries)
                if self.loss_window.closed:
                    self._close_hooks()
        except Exception as exc:
            self._stop()
            self.rec.internal_error("masked target visible", exc)
        return {}

    def _judge_pending(self) -> None:
        pending, self._pending = self._pending, []
        for terms, entries, loc in pending:
            try:
                if (loc.path, loc.line) in self._told:
                    continue
                for term in terms:
                    verdict = self._judge(term, entries)
                    if verdict is not None:
                        self._told.add((loc.path, loc.line))
                        self.rec.emit_aside(ev.masked_visible(**verdict), loc)
                        break
            finally:
                _release(entries)

    def after_step(self, opt, optimizer) -> None:
        """``STEPPED``: judge what the step's backward showed (its gradient hooks ran in it)."""
        try:
            self._judge_pending()
        except Exception as exc:
            self._stop()
            self.rec.internal_error("masked target visible", exc)
        if not self.active and not self._pending:
            self.rec.retire(STEPPED, self.after_step)

    # -- install -----------------------------------------------------------------------------
    def _close_hooks(self) -> None:
        self.active = False
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        _release(self._entries)
        self._entries, self._outputs = [], {}
        self._recent.clear()

    def _stop(self) -> None:
        self._ended = True
        self._close_hooks()
        for _, entries, _ in self._pending:
            _release(entries)
        self._pending = []

    def _before_compile(self) -> None:
        self._ended = True
        if self.active:
            self._stop()

    def install(self, patcher) -> None:
        close_before_compile(patcher, self._before_compile)
        self._patcher = patcher
        self._open()

    def _open(self) -> None:
        self._handles = register_module_hooks(self._patcher, None, self._post)
        self.active = True

    def _reopen(self) -> None:
        """A later phase (an optimizer given parameters after the window closed): read its first
        backwards too, unless torch.compile ran (it warns about global module hooks)."""
        if self.active or self._ended or self._patcher is None:
            return
        try:
            self._open()
        except Exception as exc:
            self._stop()
            self.rec.internal_error("masked target visible (reopen)", exc)


# graph nodes that mix a sequence's or a set's positions: attention's batched products, gathers
# and indexing, recurrent steps stacked, convolutions, reductions, products with another matrix
_MIXING = ("Bmm", "Gather", "Index", "Stack", "Cat", "Convolution", "ScaledDotProduct", "Mean",
           "Sum", "Cumsum", "Roll", "Sort", "MmBackward", "Scatter")


def _mark_mixed(root, entries, limit: int = 4000) -> None:
    """Set ``mixed`` on the entries whose output the loss reaches through a node that mixes
    positions (an MAE's gather and attention, an RNN): a position-wise model's output gets no
    gradient where its loss is masked out, which hides nothing."""
    wanted = {id(e.node): e for e in entries if e.node is not None}
    if not wanted:
        return
    stack, seen = [(root, False)], set()
    while stack and len(seen) < limit:
        node, mixed = stack.pop()
        if node is None or (node, mixed) in seen:
            continue
        seen.add((node, mixed))
        entry = wanted.get(id(node))
        if entry is not None and entry.node is node:
            entry.mixed = entry.mixed or mixed
            continue
        below = mixed or any(part in type(node).__name__ for part in _MIXING)
        stack.extend((child, below) for child, _ in node.next_functions if child is not None)


def _filler(rows: torch.Tensor) -> torch.Tensor:
    """Per row: does it hold one constant (padding: zeros, a fill value), not data?"""
    if rows.numel() == 0:
        return torch.zeros(rows.shape[0], dtype=torch.bool)
    return (rows == rows[:, :1]).all(1) if rows.shape[1] > 1 else rows[:, 0] == 0


def _release(entries) -> None:
    for entry in entries:
        if entry.handle is not None:
            entry.handle.remove()
            entry.handle = None


def _shows(x: torch.Tensor, t: torch.Tensor, counted: torch.Tensor | None) -> tuple[torch.Tensor, bool]:
    """Per position (rows of ``x`` and ``t``, (P, D)): does the input hold the target's values —
    exactly, through one affine map fitted on the ``counted`` rows, or (D >= 4) after each row's
    standardisation? And whether only the last two matched (a normalised target)."""
    x, t = x.double(), t.double()
    scale = float(t.abs().max()) if t.numel() else 0.0
    tol = 1e-4 * max(scale, 1e-3)
    exact = (x - t).abs().amax(1) <= tol
    rows = counted if counted is not None else torch.ones(x.shape[0], dtype=torch.bool)
    shown = exact.clone()
    xs, ts = x[rows].reshape(-1), t[rows].reshape(-1)
    if xs.numel() >= 2 and float(xs.std()) > 0:
        design = torch.stack([xs, torch.ones_like(xs)], 1)
        solution = torch.linalg.lstsq(design, ts[:, None]).solution[:, 0]
        a, b = float(solution[0]), float(solution[1])
        if abs(a) > 1e-6:
            shown |= (a * x + b - t).abs().amax(1) <= tol
    if x.shape[1] >= 4:
        sx, st = x.std(1, keepdim=True), t.std(1, keepdim=True)
        live = (sx[:, 0] > 1e-8) & (st[:, 0] > 1e-8)
        zx = (x - x.mean(1, keepdim=True)) / sx.clamp(min=1e-12)
        zt = (t - t.mean(1, keepdim=True)) / st.clamp(min=1e-12)
        shown |= live & ((zx - zt).abs().amax(1) <= 1e-3)
    return shown, bool(shown[rows].sum() > exact[rows].sum())


def _compare(term: _Term, counted: torch.Tensor, entry: _Entry) -> dict | None:
    """The verdict for one masked term against one first layer's input, or None."""
    x = entry.x.detach()
    shape = tuple(counted.shape)
    extra = None
    with torch.no_grad():
        if term.target is not None:
            target = term.target.cpu()
            if entry.patch and tuple(x.shape) != tuple(target.shape):
                for view in _patchified(x, entry.patch):
                    if tuple(view.shape) == tuple(target.shape):
                        verdict = _compare(_Term(term.how, term.counted, target=target), counted,
                                           _as_patches(entry, view))
                        if verdict is not None:
                            return verdict
                return None
            if tuple(x.shape) != tuple(target.shape):
                if not (x.dim() == target.dim() >= 3 and x.shape[0] == target.shape[0]
                        and tuple(x.shape[2:]) == tuple(target.shape[2:]) and x.shape[1] > target.shape[1]):
                    return None
                extra = x[:, target.shape[1]:]
                x = x[:, :target.shape[1]]
            rows = counted.numel()
            width = target.numel() // rows
            xp, tp = x.reshape(rows, width), target.reshape(rows, width)
            flat = counted.reshape(-1)
            shown, normalised = _shows(xp, tp, flat)
            reached = _reach(entry, shape, rows, xp)
            visible = shown & flat if reached is None else shown & reached & flat
            # a target unknown there (NaN where a value is missing) says nothing of hiding
            others = ~flat & torch.isfinite(tp.double()).all(1)
            hidden = ~shown & others if reached is None else (~shown | ~reached) & others
            channel = extra is not None and _mask_channel(extra, counted)
        else:
            selected = term.selected.cpu()
            if entry.patch:
                for view in _patchified(x, entry.patch):
                    if tuple(view.shape[:len(shape)]) == shape:
                        verdict = _compare(term, counted, _as_patches(entry, view))
                        if verdict is not None:
                            return verdict
                return None
            if tuple(x.shape[:len(shape)]) != shape or tuple(x[counted].shape) != tuple(selected.shape):
                return None
            rows = counted.numel()
            flat = counted.reshape(-1)
            reached = _reach(entry, shape, rows, x.reshape(rows, -1))
            if reached is None:
                return None  # the other positions' targets are unknown: only the gradient says
            k = int(flat.sum())
            shown_sel, normalised = _shows(x[counted].reshape(k, -1), selected.reshape(k, -1), None)
            shown = torch.zeros(rows, dtype=torch.bool)
            shown[flat] = shown_sel
            visible = shown & reached & flat
            others = ~flat
            hidden = ~reached & others
            channel = False
        n, m = int(flat.sum()), int(others.sum())
        share_visible = int(visible.sum()) / n
        share_hidden = int(hidden.sum()) / m if m else 0.0
    if share_visible < _VISIBLE or not (channel or share_hidden >= _HIDDEN):
        return None
    by = "channel" if channel and share_hidden < _HIDDEN else ("gradient" if reached is not None and
                                                               bool((~reached & others).any()) else "values")
    return {"how": term.how, "counted": round(n / rows, 4), "visible": round(share_visible, 4),
            "hidden": round(share_hidden, 4), "by": by, "positions": rows,
            "features": int(math.prod(x.shape)) // rows if rows else 0, "normalised": normalised,
            "input_at": [entry.loc.path, entry.loc.line] if channel and entry.loc is not None else None}


def _patch_embedding(module, x, out) -> bool:
    """A 2-D convolution over non-overlapping square patches (ViT's and MAE's patch embedding)."""
    return (isinstance(module, nn.Conv2d) and x.dim() == 4 and out.dim() == 4
            and tuple(module.kernel_size) == tuple(module.stride) and module.kernel_size[0] == module.kernel_size[1]
            and tuple(module.padding) == (0, 0) and module.groups == 1
            and int(x.shape[2]) % module.kernel_size[0] == 0 and int(x.shape[3]) % module.kernel_size[1] == 0)


def _patchified(x: torch.Tensor, p: int) -> list[torch.Tensor]:
    """An image batch (B, C, H, W) as (B, patches, values) in the orders scripts write: each
    patch's pixels with their channels last (MAE's ``patchify``), or channel by channel."""
    b, c, h, w = (int(s) for s in x.shape)
    grid = x.reshape(b, c, h // p, p, w // p, p)
    last = torch.einsum("nchpwq->nhwpqc", grid).reshape(b, (h // p) * (w // p), p * p * c)
    first = torch.einsum("nchpwq->nhwcpq", grid).reshape(b, (h // p) * (w // p), c * p * p)
    return [last, first]


def _as_patches(entry: _Entry, view: torch.Tensor) -> _Entry:
    patches = _Entry(view, entry.positions, False, entry.node, entry.loc)
    patches.reached, patches.mixed = entry.reached, entry.mixed
    return patches


def _reach(entry: _Entry, shape: tuple, rows: int, x: torch.Tensor):
    """Which positions the loss's gradient reached at the entry's output, as hiding evidence:
    None unless the output's positions are the mask's, the loss reads it through an op that
    mixes positions, and the unreached positions hold data (not one filler value: padding)."""
    if entry.positions != shape or entry.reached is None or entry.reached.numel() != rows \
            or not entry.mixed:
        return None
    unreached = ~entry.reached
    if bool(unreached.any()) and float(_filler(x[unreached]).float().mean()) >= 0.5:
        return None
    return entry.reached


def _mask_channel(extra: torch.Tensor, counted: torch.Tensor) -> bool:
    """Whether one of the input's extra channels is the loss's mask (or its complement)."""
    if counted.dim() != extra.dim():
        return False
    spots = counted.any(1) if counted.shape[1] > 1 else counted[:, 0]
    if counted.shape[1] > 1 and not bool((counted == counted[:, :1]).all()):
        return False
    for k in range(min(int(extra.shape[1]), 4)):
        channel = extra[:, k]
        if tuple(channel.shape) != tuple(spots.shape):
            return False
        ones = channel == 1
        if not bool(((channel == 0) | ones).all()):
            continue
        if bool((ones == spots).all()) or bool((ones == ~spots).all()):
            return True
    return False
