"""A loss target that is the corrupted input the model was given, not the clean value it was
corrupted from (``target-is-corrupted-input``).

``noisy = x + 0.1 * torch.randn_like(x); loss = mse(model(noisy), noisy)``: a denoising
autoencoder asked to reproduce its noisy input learns the identity; ``ids[mask] = MASK_ID;
labels = ids.clone()``: masked language modelling whose labels hold ``[MASK]`` where the original
tokens belong learns to copy ``[MASK]``. The loss falls, nothing fails, and the model learns
nothing about the clean data.

How it is seen, from the instrumentation's start to the ``_WINDOWS``-th backward (then every
hook is removed):

* a ``TorchFunctionMode`` (pushed on the script's thread at install) follows the values without
  gradient on the CPU:

  - *randomness*: each random draw (``torch.rand``, ``randn_like``, ``bernoulli``, ``dropout``,
    ``uniform_``...) is numbered in the order drawn; a value computed from tensors that carry
    draws carries the newest of their numbers (an index only selects: ``x[perm]`` carries
    ``x``'s, not ``perm``'s);
  - *a corruption* is an op that mixes a random draw newer than every draw its data came from
    into that data, elementwise: ``T + noise`` / ``T - noise`` (the noise of more than one value
    per sample), ``T * m`` with ``m`` a 0/1 mask, ``T.masked_fill(m, c)``, ``T[m] = c`` (also
    ``index_put_``, ``masked_fill_``, ``+=``), ``torch.where(m, c, T)``, and ``F.dropout(T)``
    — the mask or noise drawn after ``T`` (so that ``x[x < 0] = 0`` of random data, or
    synthetic data made as ``clean + noise``, is not one). Its result gets a *root*: a copy of
    ``T``'s values (taken before the op for an in-place one), the line, the kind; for an
    out-of-place op a weak reference to ``T`` (the clean value must still be there to be used
    instead). Writing -100 (``cross_entropy``'s ignore index) marks labels, it corrupts nothing.
  - the root's *members* are the results of value-keeping ops on a member (``view``, ``reshape``,
    indexing, ``clone``, casts...), each with its clean values made by the same op on the
    root's copy; a copy (``clone``, a cast, ``detach``) notes its line, where a target is taken.

* global module forward hooks mark the roots of members given to a module that has
  parameters (not a loss module): the model saw the corruption. While such a module's forward
  runs the mode is left (corruptions are the data's, made around the model; inside, the mode
  would cost time and stand between torch's C++ warnings and the script's line); a target that
  is a contiguous view of a member made there (``labels.view(-1)``) is still found;
* the first ``_CALLS`` calls with a gradient of the wrapped loss functions (``losses.py``,
  ``loss_inputs.py``, through ``losscalls.py``) look up their target: a member of a root the
  model saw, whose clean value is still alive (or was overwritten in place), and whose values
  differ from the clean ones at some position the loss reads (not ``ignore_index``) is a
  ``target_corrupted`` aside event, at the line of the copy that made the target or else at
  the loss call, once per line.

A denoiser whose target is the clean tensor, a plain autoencoder (no corruption), labels
cloned before masking, a diffusion loss's noise target, a VAE (values with gradient are not
followed) are not members of a root the model saw. Cost: a Python handler per torch op outside
the models' forwards, one copy per corruption and per value-keeping op on a member, until the
``_WINDOWS``-th backward or ``_OPS`` ops, whichever comes first; tensors on a GPU are not
followed. A C++ warning raised by an op the mode dispatches names the mode's line, not the
script's (Python warnings are put right by ``warnsource.py``).
"""

from __future__ import annotations

import os
import weakref
from threading import get_ident

import torch
from torch.overrides import TorchFunctionMode

from .. import events as ev
from .dependency import close_before_compile, register_module_hooks
from .follow import UninstallHandle, pop_mode, push_mode, remove_mode, tensors_in, tensors_out
from .graphpaths import reached
from .inlinable import in_transform
from .recorder import Recorder

_WINDOWS = 3  # backwards after which the window closes
_CALLS = 8  # loss calls with a gradient whose target is looked up
_OPS = 200000  # torch calls followed, at most
_TRACKED = 65536  # tensors carrying draws, and members, kept at most
_MAX_NUMEL = 1 << 24  # larger values are not copied
_MIN_DIFFER = 2  # positions where the target must carry the corruption, at least
_NODES = 20000  # nodes of the prediction's graph walked for its parameters, once per finding
_IGNORE = -100  # cross_entropy's default ignore_index: writing it marks labels, not inputs

# random draws: each call's result is a new origin
_DRAWS = frozenset({"rand", "rand_like", "randn", "randn_like", "randint", "randint_like",
                    "randperm", "bernoulli", "normal", "multinomial", "poisson", "bernoulli_",
                    "normal_", "uniform_", "random_", "exponential_", "geometric_",
                    "log_normal_", "cauchy_"})
_DROPOUTS = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                       "feature_alpha_dropout"})
# indexing: the result carries the source's draw, not the index's
_SELECTS = frozenset({"__getitem__", "index_select", "gather", "take", "take_along_dim"})
_ADDS = frozenset({"add", "__add__", "__radd__", "sub", "__sub__", "__rsub__", "subtract"})
_MULS = frozenset({"mul", "__mul__", "__rmul__", "multiply"})
_INPLACE_ADDS = frozenset({"add_", "sub_", "__iadd__", "__isub__"})
_INPLACE_MULS = frozenset({"mul_", "__imul__"})
_WRITES = frozenset({"__setitem__", "index_put_", "index_fill_", "masked_fill_"})
# ops whose result holds the values of their first argument (reordered, selected, cast)
_KEEPS = frozenset({"view", "reshape", "flatten", "unflatten", "clone", "contiguous", "to",
                    "float", "double", "half", "bfloat16", "long", "int", "short", "detach",
                    "squeeze", "unsqueeze", "__getitem__", "permute", "transpose", "t",
                    "view_as", "reshape_as", "cpu", "type", "expand", "expand_as", "narrow",
                    "select", "movedim", "swapaxes", "chunk", "split", "unbind", "masked_fill"})
# of those, the copies: where a script takes a target from the corrupted value
_COPIES = frozenset({"clone", "to", "float", "double", "half", "bfloat16", "long", "int",
                     "short", "detach", "type", "cpu"})


class _Root:
    """One corruption: its kind and line, whether a model was given it, and (out of place) the
    clean value it was made from, weakly."""

    __slots__ = ("kind", "line", "source", "fed")

    def __init__(self, kind: str, line, source):
        self.kind, self.line, self.source, self.fed = kind, line, source, False

    def clean_alive(self) -> bool:
        return self.source is None or self.source() is not None


class _Member:
    __slots__ = ("ref", "clean", "root", "copied_at")

    def __init__(self, tensor, clean, root: _Root, copied_at):
        self.ref, self.clean, self.root, self.copied_at = weakref.ref(tensor), clean, root, copied_at


def _followed(t) -> bool:
    return (isinstance(t, torch.Tensor) and not t.requires_grad and t.device.type == "cpu"
            and t.layout == torch.strided and not t.is_complex())


def _per_element(noise, out) -> bool:
    """The noise varies inside a sample (not one value per sample: a brightness, a scale)."""
    if out.dim() >= 2:
        return noise.numel() > out.shape[0]
    return noise.numel() == out.numel() and out.numel() > 1


def _binary_mask(m) -> bool:
    """0/1 values with at least one 0."""
    with torch.no_grad():
        if m.dtype == torch.bool:
            return not bool(m.all())
        return bool(((m == 0) | (m == 1)).all()) and bool((m == 0).any())


def _is_ignore_value(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return value == _IGNORE
    return isinstance(value, torch.Tensor) and value.numel() == 1 and float(value) == _IGNORE


_is_compiling = torch.compiler.is_compiling
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _unwrapped(func, patcher=None):
    """``func`` without graddoctor's patches and wrappers around it. A Python function of
    torch's (``F.mse_loss``, ``Tensor.register_hook``) hands its call to the mode under its
    public name, which is graddoctor's patch while a check runs: calling that would run every
    wrapper a second time (counting each call twice), and a call graddoctor made to the
    original would reach a wrapper meant for the script's calls."""
    while True:
        original = patcher.replaced(func) if patcher is not None else None
        if original is not None:
            func = original
            continue
        inner = getattr(func, "__wrapped__", None)
        code = getattr(func, "__code__", None)
        if inner is None or code is None:
            return func
        filename = code.co_filename
        if not (filename.startswith(_OWN_DIR) or filename.startswith("<graddoctor")):
            return func
        func = inner


class _CorruptionMode(TorchFunctionMode):
    """Hands each call to the watcher, before it runs (in-place corruptions keep the values they
    overwrite) and after."""

    def __init__(self, watcher):
        super().__init__()
        self.watcher = watcher

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _is_compiling():
            # Dynamo traces a mode on the stack: a function compiled before the check began
            # (no torch.compile call to close the window first) sees only the call itself
            return func(*args, **(kwargs or {}))
        kwargs = kwargs or {}
        watcher = self.watcher
        try:
            func = _unwrapped(func, watcher.patcher)
            follow = watcher.following and not watcher.inside and in_transform() is None \
                and torch._C._get_tracing_state() is None
        except Exception as exc:
            follow = False
            watcher.fail(exc)
        if not follow:
            # also a torch.func transform's wrapped tensors (not read), and a graph being traced
            # (torch.jit.trace must not record graddoctor's copies)
            return func(*args, **kwargs)
        pending = None
        try:
            pending = watcher.before(func, args, kwargs)
        except Exception as exc:
            watcher.fail(exc)
        out = func(*args, **kwargs)
        if watcher.following:
            try:
                watcher.after(func, args, kwargs, out, pending)
            except Exception as exc:
                watcher.fail(exc)
        return out


class CorruptedTargetWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.following = False
        self.inside = 0  # graddoctor's own calls running (not followed)
        self.closed = False
        self.patcher = None  # the instrumentation's: what each of its patches replaced
        self._mode = None
        self._thread = None
        self._handles: list = []
        self._running: list = []  # the forwards of models with parameters running, outermost first
        self._suspended = False  # the mode left while they run
        self._ops = 0
        self._calls = 0
        self._backwards = 0
        self._next_origin = 0
        self._origins: dict[int, tuple] = {}  # id -> (weakref, the newest draw it comes from)
        self._members: dict[int, _Member] = {}
        self._told: set = set()

    @property
    def open(self) -> bool:
        return self.following and self._calls < _CALLS

    # -- origins ---------------------------------------------------------------------------
    def _drawn(self, t) -> int:
        """The number of the newest random draw ``t`` was computed from; 0 for none."""
        entry = self._origins.get(id(t))
        if entry is None or entry[0]() is not t:
            return 0
        return entry[1]

    def _newest(self, tensors) -> int:
        return max(map(self._drawn, tensors), default=0)

    def _carry(self, t, origins: int) -> None:
        if not origins or not _followed(t):
            return
        if len(self._origins) >= _TRACKED:
            self._purge()
            if len(self._origins) >= _TRACKED:
                return
        self._origins[id(t)] = (weakref.ref(t), origins)

    def _draw(self) -> int:
        self._next_origin += 1
        return self._next_origin

    def _purge(self) -> None:
        self._origins = {k: v for k, v in self._origins.items() if v[0]() is not None}
        self._members = {k: m for k, m in self._members.items() if m.ref() is not None}

    # -- members ---------------------------------------------------------------------------
    def _member(self, t) -> _Member | None:
        if not isinstance(t, torch.Tensor):
            return None
        member = self._members.get(id(t))
        if member is None or member.ref() is not t:
            return None
        return member

    def _join(self, t, clean, root: _Root, copied_at) -> None:
        if len(self._members) >= _TRACKED:
            self._purge()
            if len(self._members) >= _TRACKED:
                return
        self._members[id(t)] = _Member(t, clean, root, copied_at)

    def _corrupted(self, out, clean_values, kind: str, source) -> None:
        """``out`` holds a corruption of ``clean_values`` (already a copy, or the clean tensor)."""
        if not _followed(out) or out.numel() > _MAX_NUMEL or out.numel() < 2:
            return
        clean = clean_values.detach().clone() if source is not None else clean_values
        if clean.shape != out.shape:
            return
        root = _Root(kind, self.rec.here(), None if source is None else weakref.ref(source))
        self._join(out, clean, root, None)

    # -- the mode's calls ------------------------------------------------------------------
    def fail(self, exc) -> None:
        self.following = False
        self.rec.internal_error("target_corrupted (following values)", exc)

    def before(self, func, args, kwargs):
        """For an in-place corruption: a copy of the values it overwrites."""
        name = getattr(func, "__name__", None)
        if name not in _WRITES and name not in _INPLACE_ADDS and name not in _INPLACE_MULS:
            return None
        if not args or not _followed(args[0]) or args[0].numel() > _MAX_NUMEL:
            return None
        dest = args[0]
        if get_ident() != self._thread:
            return None
        newest = self._drawn(dest)
        if name in _WRITES:
            if name == "index_fill_":  # (dim, index, value)
                key, value = (args[2] if len(args) > 2 else kwargs.get("index")), \
                    (args[3] if len(args) > 3 else kwargs.get("value"))
            else:  # __setitem__ (key, value), index_put_ (indices, values), masked_fill_ (mask, value)
                key = args[1] if len(args) > 1 else kwargs.get("mask", kwargs.get("indices"))
                value = args[2] if len(args) > 2 else kwargs.get("value", kwargs.get("values"))
            if _is_ignore_value(value):
                return None
            if self._newest(tensors_in((key,), None)) <= newest:
                return None
            return ("mask", dest.detach().clone())
        other = args[1] if len(args) > 1 else kwargs.get("other")
        if not isinstance(other, torch.Tensor) or self._drawn(other) <= newest:
            return None
        if name in _INPLACE_ADDS:
            if not _per_element(other, dest):
                return None
            return ("noise", dest.detach().clone())
        if not _binary_mask(other) or not _per_element(other, dest):
            return None
        return ("mask", dest.detach().clone())

    def after(self, func, args, kwargs, out, pending) -> None:
        if get_ident() != self._thread:
            return
        self._ops += 1
        if self._ops > _OPS:
            self.following = False
            return
        name = getattr(func, "__name__", None)
        outs = [t for t in tensors_out(out) if _followed(t)]
        if pending is not None:
            kind, clean = pending
            dest = args[0]
            self._corrupted(dest, clean, kind, None)
            self._carry(dest, max(self._drawn(dest), self._newest(tensors_in(args[1:], kwargs))))
            return
        if name in _WRITES and args and isinstance(args[0], torch.Tensor):
            # a write that is no corruption: the destination carries what was written in
            self._carry(args[0], max(self._drawn(args[0]), self._newest(tensors_in(args[1:], kwargs))))
            return
        if not outs:
            return
        # randomness
        if name in _DRAWS or name in _DROPOUTS:
            drawn = self._draw()
            for t in outs:
                self._carry(t, drawn)
            if name in _DROPOUTS:
                self._dropout(name, args, kwargs, out)
            return
        if name in _SELECTS:
            carried = self._drawn(args[0]) if args else 0
        else:
            carried = self._newest(tensors_in(args, kwargs))
        if carried:
            for t in outs:
                self._carry(t, carried)
        # corruptions
        if name in _ADDS or name in _MULS:
            if self._mixed(name, args, kwargs, out):
                return
        elif name == "masked_fill":
            if self._masked_fill(args, kwargs, out):
                return
        elif name == "where":
            if self._where(args, kwargs, out):
                return
            self._keep_where(func, args, kwargs, out)
            return
        # members: values kept from a member
        if name in _KEEPS and args:
            member = self._member(args[0])
            if member is not None:
                self._keep(name, func, member, args, kwargs, out)

    def _mixed(self, name, args, kwargs, out) -> bool:
        """``T + noise``, ``T - noise``, ``T * mask``: True when ``out`` became a root."""
        if len(args) < 2 or not isinstance(out, torch.Tensor) or not _followed(out):
            return False
        a, b = args[0], args[1]
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        for clean, noise in ((a, b), (b, a)):
            if not _followed(clean) or clean.shape != out.shape:
                continue
            if self._drawn(noise) <= self._drawn(clean) or not _per_element(noise, out):
                continue
            if name in _MULS:
                if not _binary_mask(noise):
                    continue
                self._corrupted(out, clean, "mask", clean)
            else:
                self._corrupted(out, clean, "noise", clean)
            return True
        return False

    def _masked_fill(self, args, kwargs, out) -> bool:
        """``T.masked_fill(m, c)``: True when ``out`` became a root."""
        source = args[0] if args else kwargs.get("input")
        mask = args[1] if len(args) > 1 else kwargs.get("mask")
        value = args[2] if len(args) > 2 else kwargs.get("value")
        if not (_followed(source) and isinstance(mask, torch.Tensor)) or _is_ignore_value(value):
            return False  # labels set to -100 where nothing is predicted: a member stays one
        if self._drawn(mask) <= self._drawn(source):
            return False
        self._corrupted(out, source, "mask", source)
        return True

    def _where(self, args, kwargs, out) -> bool:
        """``torch.where(m, c, T)``: True when ``out`` became a root. The clean side is the one
        of the result's shape drawn before the mask; of two (a constant made like ``T``: a
        ``full_like``), the one that is not one value throughout."""
        cond = args[0] if args else kwargs.get("condition")
        if not isinstance(cond, torch.Tensor) or not isinstance(out, torch.Tensor) or len(args) < 3:
            return False
        drawn = self._drawn(cond)
        candidates = [t for t in args[1:3] if _followed(t) and t.shape == out.shape
                      and self._drawn(t) < drawn]
        others = [t for t in args[1:3] if not any(t is c for c in candidates)]
        if any(_is_ignore_value(t) for t in (*others, *candidates)):
            return False  # labels made with -100 outside a mask: no corruption
        if len(candidates) == 2:
            with torch.no_grad():
                candidates = [t for t in candidates if t.numel() and not bool((t == t.reshape(-1)[0]).all())]
        if len(candidates) != 1:
            return False
        self._corrupted(out, candidates[0], "mask", candidates[0])
        return True

    def _keep_where(self, func, args, kwargs, out) -> None:
        """``torch.where(m, M, c)`` of a member ``M`` and a constant (labels kept where masked,
        -100 elsewhere): the result keeps ``M``'s values where it takes them."""
        if len(args) < 3 or not _followed(out):
            return
        sides = [self._member(t) for t in args[1:3]]
        if sum(m is not None for m in sides) != 1:
            return
        member = sides[0] or sides[1]
        other = args[2] if sides[0] is not None else args[1]
        if isinstance(other, torch.Tensor) and self._member(other) is None and other.numel() > 1 \
                and not bool((other == other.reshape(-1)[0]).all()):
            return  # a mix of two values, not a member's values kept
        clean_args = (args[0], member.clean, other) if sides[0] is not None else (args[0], other, member.clean)
        clean = func(*clean_args)
        if isinstance(clean, torch.Tensor) and clean.shape == out.shape:
            self._join(out, clean, member.root, member.copied_at)

    def _dropout(self, name, args, kwargs, out) -> None:
        source = args[0] if args else kwargs.get("input")
        training = args[2] if len(args) > 2 else kwargs.get("training", kwargs.get("train", True))
        inplace = args[3] if len(args) > 3 else kwargs.get("inplace", False)
        p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
        if not _followed(source) or not training or inplace or not p:
            return
        self._corrupted(out, source, "dropout", source)

    def _keep(self, name, func, member: _Member, args, kwargs, out) -> None:
        outs = list(tensors_out(out))
        if not outs or not all(_followed(t) for t in outs):
            return
        rest = tuple(args[1:])
        clean = func(member.clean, *rest, **kwargs)
        cleans = list(tensors_out(clean))
        if len(cleans) != len(outs) or any(c.shape != t.shape for c, t in zip(cleans, outs)):
            return
        copied_at = self.rec.here() if name in _COPIES else member.copied_at
        for t, c in zip(outs, cleans):
            if t is member.ref():
                continue
            self._join(t, c, member.root, copied_at)

    # -- the model is given a member; its forward is not followed ---------------------------
    def _pre(self, module, args):
        """Before a forward: a loss computed inside it (``model(ids, labels=labels)``) comes
        after its layers were given the ids. The mode is left while a model with parameters
        runs: corruptions are the data's, made around the model, and inside a forward the mode
        would only cost time and stand between torch's warnings and the script's line."""
        if self._mode is None or get_ident() != self._thread:
            return None
        self._given(module, args, None)
        try:
            if isinstance(module, torch.nn.modules.loss._Loss) \
                    or next(iter(module.parameters()), None) is None:
                return None
            self._running.append(module)
            if len(self._running) == 1 and not self._suspended:
                self._suspended = pop_mode(self._mode, self._thread, self.rec, "target_corrupted")
        except Exception as exc:
            self.fail(exc)
        return None

    def _post(self, module, args, *rest):
        """After a forward: the arguments passed by keyword (the pre hook has no kwargs); the
        mode back once the outermost model's forward ended."""
        if self._mode is None or get_ident() != self._thread:
            return None
        kwargs = rest[0] if len(rest) == 2 and isinstance(rest[0], dict) else None
        if kwargs:
            self._given(module, (), kwargs)
        if self._running and self._running[-1] is module:
            self._running.pop()
            if not self._running and self._suspended:
                self._suspended = False
                if push_mode(self._mode, self.rec, "target_corrupted") is None:
                    self._mode = None
                    self.following = False
        return None

    def _given(self, module, args, kwargs) -> None:
        if not self.following or get_ident() != self._thread:
            return
        self.inside += 1
        try:
            if isinstance(module, torch.nn.modules.loss._Loss):
                return
            members = [m for t in tensors_in(args, kwargs) if (m := self._member(t)) is not None]
            if members and next(iter(module.parameters()), None) is not None:
                for member in members:
                    member.root.fed = True
        except Exception as exc:
            self.fail(exc)
        finally:
            self.inside -= 1

    # -- the loss ---------------------------------------------------------------------------
    def loss_call(self, fn: str, input, target, args=(), kwargs=None) -> None:
        """A wrapped loss function called with a gradient: its prediction and target."""
        self._calls += 1
        if get_ident() != self._thread:
            return
        self.inside += 1
        try:
            self._judge(fn, input, target, args, kwargs or {})
        except Exception as exc:
            self.rec.internal_error(f"F.{fn} target corrupted", exc)
        finally:
            self.inside -= 1

    def _target_member(self, target) -> _Member | None:
        """The member the target is, or whose contiguous view it is (``labels.view(-1)`` made
        inside a forward, which the mode does not follow)."""
        member = self._member(target)
        if member is not None or not isinstance(target, torch.Tensor):
            return member
        base = target._base
        member = self._member(base)
        if member is None or not (base.is_contiguous() and target.is_contiguous()) \
                or base.numel() != target.numel() or target.storage_offset() != base.storage_offset():
            return None
        return _Member(target, member.clean.reshape(target.shape), member.root, member.copied_at)

    def _judge(self, fn, input, target, args, kwargs) -> None:
        member = self._target_member(target)
        if member is None or not member.root.fed or not member.root.clean_alive():
            return
        if not isinstance(input, torch.Tensor) or input.grad_fn is None:
            return
        with torch.no_grad():
            values, clean = target.detach(), member.clean
            if values.shape != clean.shape:
                return
            if values.is_floating_point() or clean.is_floating_point():
                v, c = values.to(torch.float64), clean.to(torch.float64)
                differ = (v - c).abs() > 1e-6 * (1.0 + c.abs())
            else:
                differ = values != clean
            if fn in ("cross_entropy", "nll_loss"):
                ignore = args[4] if len(args) > 4 else kwargs.get("ignore_index", _IGNORE)
                if isinstance(ignore, int):
                    differ &= values != ignore
            count = int(differ.sum())
        if count < _MIN_DIFFER:
            return
        loc = member.copied_at or self.rec.here()
        if loc in self._told:
            return
        self._told.add(loc)
        tensors = self.rec.tensors
        walked = reached(input.grad_fn, _NODES, truncate=True)
        pids = sorted(pid for i in walked[1]
                      if (pid := tensors.number.get(i)) is not None and id(tensors.refs[pid]()) == i)
        root = member.root
        self.rec.emit_aside(ev.target_corrupted(
            fn=fn, how=root.kind, corrupted_line=getattr(root.line, "line", None),
            copied=member.copied_at is not None, positions=count, numel=int(values.numel()),
            params=pids[:64]), loc)

    # -- the window --------------------------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        if self._mode is None and not self._handles:
            return {}
        self._backwards += 1
        if self._backwards >= _WINDOWS:
            self._close()
        else:
            self._purge()
        return {}

    def _close(self) -> None:
        self.following = False
        self._origins, self._members = {}, {}
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._running = []
        if self._suspended or remove_mode(self._mode, self._thread, self.rec, "target_corrupted"):
            self._mode = None
        self._suspended = False

    def before_compile(self) -> None:
        self.closed = True
        self._close()

    def install(self, patcher) -> None:
        if get_ident() != self.rec.script_thread:
            return
        self.patcher = patcher
        close_before_compile(patcher, self.before_compile)
        patcher.handle(UninstallHandle(self))
        self._handles = register_module_hooks(patcher, self._pre, self._post)
        mode = _CorruptionMode(self)
        thread = push_mode(mode, self.rec, "target_corrupted")
        if thread is None:
            return
        self._mode, self._thread = mode, thread
        self.following = True

    def uninstall(self) -> None:
        self.closed = True
        self._close()
