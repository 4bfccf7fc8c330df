"""Copies of a trained model that are meant to follow it: an EMA or mean teacher, a momentum
(key) encoder, a DQN/TD3 target network. Does the copy follow the model, and does the model
stay where its optimizer put it?

At the first optimizer step the modules the user's frames hold (their variables, submodules,
and modules one attribute deep in other objects: ``agent.target_net``) are paired: a module
none of whose parameters an optimizer owns (the copy) with one whose parameters are all owned
(the trained model), of the same parameter shapes in the same order; ``equal`` when a strided
sample of each of their first tensors holds the same values (a ``copy.deepcopy``, a second
instance loaded from the model's state; a pretrained teacher of the same architecture differs;
values are read on the CPU only, so a GPU run's copies are never ``equal``: ``--emulate-cuda``).
Then, for each pair:

* the copy's forwards: a forward hook on the copy and its direct children counts them, and
  those that give targets (grad mode off, or an output that carries no gradient); and over the
  first ``MEASURED`` steps, the trained model's own forwards in training mode that give targets
  (the copy's job done by the model), with the line of the first;
* whether anything writes the copy: its parameters' versions and storages at each step, and a
  sample of their values (``p.data.mul_`` moves no version);
* what the script's own code does to the trained model between two of its optimizer's steps
  (the first ``MEASURED`` of them; any optimizer that owns the model's parameters counts, so
  the base optimizer of a wrapper that never steps itself, SAM's, is the model's): the change Δh from after one step to before the next, its
  cosine with the way to the copy (the copy's values minus the model's, after the step) and
  its length over that way, and whether the copy moved in that interval. An update written the
  wrong way round moves the model toward a copy that stays put;
* over the same intervals, how the copy itself moved: the share of the way from the copy to
  the model (after the step) it covered (its move projected on that way, over the way's
  length), the cosine of its move with that way, and whether it landed on the model's values
  exactly (a hard sync). A blend whose weights are swapped covers most of the way each time.

* the copy's BatchNorm statistics: each BatchNorm with running statistics of the copy and the
  model's at the same place, their batch counts and a sample of the copy's running mean at the
  pairing; at the end, the copy's layers whose statistics never moved while the model's counted
  batches (``stale_norms``: weights averaged over ``parameters()`` only, the buffers left as
  they were made).

One ``model_copy`` event per pair at the end of the run (rules/copy_never_follows.py,
rules/averaged_copy_stale_norms.py).

Cost: one walk over the user's modules at the first step; per step, a version read per
parameter of each copy, and over the first ``MEASURED`` steps two small samples per pair; per
forward of a copy, one hook call.
"""

from __future__ import annotations

import weakref

import torch

from .. import events as ev
from .names import user_variables
from .recorder import Recorder
from .topics import STEP_BEGINS, STEPPED

MAX_PAIRS = 8
MAX_MODULES = 4000  # modules looked at in the user's variables
MEASURED = 24  # intervals between two steps of the model's optimizer measured
VALUE_CHECKS = 64  # steps at which the copy's sampled values are compared
_TENSORS = 16
_SAMPLE = 256
_MIN_ELEMENTS = 16  # a copy holds at least this many values (not a lone temperature)


def _params(module) -> list:
    seen, out = set(), []
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _sample(tensors) -> torch.Tensor | None:
    parts = []
    with torch.no_grad():
        for t in tensors[:_TENSORS]:
            if t.device.type != "cpu" or not t.is_floating_point() or t.layout != torch.strided:
                return None
            flat = t.detach().reshape(-1)
            stride = max(1, flat.numel() // _SAMPLE)
            parts.append(flat[::stride][:_SAMPLE].to(torch.float64, copy=True))
    return torch.cat(parts) if parts else None


def _marks(tensors) -> tuple:
    return tuple((p._version, p.data_ptr()) for p in tensors)


def _first_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (list, tuple)):
        for item in output:
            if isinstance(item, torch.Tensor):
                return item
    if isinstance(output, dict):
        for item in output.values():
            if isinstance(item, torch.Tensor):
                return item
    return None


def _norm_pairs(copy, model, copy_name) -> list:
    """``[name, copy layer, model layer, copy's count, model's count, copy's mean sample]`` for
    each BatchNorm with running statistics of the copy and the model's at the same place."""
    norm = torch.nn.modules.batchnorm._NormBase
    out = []
    # in order, not by name: AveragedModel holds its copy one level down (``module.1``)
    layers = [(sub, m) for sub, m in copy.named_modules() if isinstance(m, norm)]
    twins = [m for m in model.modules() if isinstance(m, norm)]
    if len(layers) != len(twins):
        return out
    for (sub, layer), twin in zip(layers, twins):
        if not layer.track_running_stats or layer.num_batches_tracked is None \
                or twin.num_batches_tracked is None:
            continue
        mean = _sample([layer.running_mean]) if layer.running_mean is not None else None
        if mean is None:
            continue
        out.append([f"{copy_name}.{sub}" if sub else copy_name, weakref.ref(layer), weakref.ref(twin),
                    int(layer.num_batches_tracked), int(twin.num_batches_tracked), mean])
        if len(out) >= _TENSORS:
            break
    return out


def _stale_norms(norms) -> list[str]:
    """The copy's BatchNorm layers whose statistics never moved while the model's counted
    batches."""
    stale = []
    for name, layer_ref, twin_ref, count, twin_count, mean in norms:
        layer, twin = layer_ref(), twin_ref()
        if layer is None or twin is None or twin.num_batches_tracked is None \
                or int(twin.num_batches_tracked) <= twin_count:
            continue
        now = _sample([layer.running_mean]) if layer.running_mean is not None else None
        if layer.num_batches_tracked is not None and int(layer.num_batches_tracked) == count \
                and now is not None and torch.equal(now, mean):
            stale.append(name)
    return stale


def _followed(copy_before, copy_after, model) -> list | None:
    """``[share, cos, exact]`` of the copy's move over one interval: the share of the way from
    the copy to the model it covered, the cosine of its move with that way, and whether it now
    holds the model's values exactly; None when it did not move or was already the model."""
    move = copy_after - copy_before
    if not bool(move.any()):
        return None
    way = model - copy_before
    length = float(way @ way)
    if length <= 0.0:
        return None
    along = float(move @ way)
    scale = float(move.norm()) * length ** 0.5
    return [round(along / length, 6), round(along / scale, 6) if scale > 0.0 else None,
            bool(torch.equal(copy_after, model))]


class _Pair:
    __slots__ = ("copy", "model", "copy_name", "model_name", "opt", "owners", "equal", "copy_params",
                 "model_params", "marks", "base", "written", "written_step", "forwards",
                 "targets", "target_loc", "handles", "depth", "post", "rows", "measured", "params",
                 "follows", "model_targets", "model_target_loc", "model_handle", "norms")

    def __init__(self, copy, model, copy_name, model_name, opt, equal):
        self.copy = weakref.ref(copy)
        self.model = weakref.ref(model)
        self.copy_name, self.model_name, self.opt, self.equal = copy_name, model_name, opt, equal
        # every optimizer that owns the model's parameters: a wrapper (SAM, Lookahead built as
        # an Optimizer) owns them too but never steps; its base optimizer's steps are the model's
        self.owners: frozenset = frozenset() if opt is None else frozenset((opt,))
        self.copy_params = _params(copy)
        self.model_params = _params(model)
        self.params = len(self.copy_params)
        self.marks = _marks(self.copy_params)
        self.base = _sample(self.copy_params)
        self.written = False
        self.written_step: int | None = None
        self.forwards = 0
        self.targets = 0
        self.target_loc = None
        self.handles: list = []
        self.depth = 0  # inside the copy's own forward (its children's hooks then count nothing)
        self.post: tuple | None = None  # (model sample, copy sample) after a step
        self.rows: list[list] = []
        self.follows: list[list] = []
        self.measured = 0
        # the trained model's own forwards in training mode that give targets: the work the
        # copy is kept for, done by the model (counted over the first MEASURED steps only)
        self.model_targets = 0
        self.model_target_loc = None
        self.model_handle = None
        self.norms = _norm_pairs(copy, model, copy_name)


class CopyWatcher:
    def __init__(self, rec: Recorder, owned):
        self.rec = rec
        self.owned = owned  # OptimizerWatcher.owned_pids(): a live view
        self._looked = False
        self._pairs: list[_Pair] = []
        self._checks = 0
        rec.subscribe(STEP_BEGINS, self.before_step)
        rec.subscribe(STEPPED, self.after_step)

    def install(self, patcher) -> None:  # subscribed at construction
        pass

    # -- the pairs ------------------------------------------------------------------------
    def _user_modules(self) -> list[tuple[str, torch.nn.Module]]:
        found: dict[int, tuple[str, torch.nn.Module]] = {}

        def add(name, module):
            if len(found) >= MAX_MODULES:
                return
            for sub, m in module.named_modules():
                if id(m) not in found and len(found) < MAX_MODULES:
                    found[id(m)] = (f"{name}.{sub}" if sub else name, m)

        for var, value in user_variables(self.rec).items():
            if var.startswith("_"):
                continue
            try:
                if isinstance(value, torch.nn.Module):
                    add(var, value)
                elif not isinstance(value, type) and type(value).__name__ != "module":
                    attrs = getattr(value, "__dict__", None)  # an agent holding its networks
                    if isinstance(attrs, dict):
                        for attr, inner in list(attrs.items())[:64]:
                            if isinstance(inner, torch.nn.Module) and not attr.startswith("_"):
                                add(f"{var}.{attr}", inner)
            except Exception:  # an object whose attributes cannot be read: not ours to judge
                continue
        return list(found.values())

    def _find(self) -> None:
        rec, owned = self.rec, self.owned
        copies, trained = [], {}
        for name, module in self._user_modules():
            params = _params(module)
            if len(params) < 2 or sum(p.numel() for p in params) < _MIN_ELEMENTS \
                    or any(p.is_meta for p in params):
                continue
            pids = [rec.pid(p) for p in params]
            mine = [pid is not None and pid in owned for pid in pids]
            key = tuple((tuple(p.shape), p.dtype) for p in params)
            if all(mine):
                trained.setdefault(key, (name, module, pids[0]))
            elif not any(mine) and all(p.is_floating_point() for p in params):
                copies.append((len(params), name, module, key))
        taken: set[int] = set()
        for _, name, module, key in sorted(copies, key=lambda c: (-c[0], len(c[1]))):
            if id(module) in taken or key not in trained or len(self._pairs) >= MAX_PAIRS:
                continue
            taken.update(id(m) for m in module.modules())
            model_name, model, pid = trained[key]
            opt = next((o for o, pids in rec.opt_params.items() if pid in pids), None)
            a, b = _sample(_params(module)), _sample(_params(model))
            equal = a is not None and b is not None and a.shape == b.shape and bool(torch.equal(a, b))
            pair = _Pair(module, model, name, model_name, opt, equal)
            pair.owners = frozenset(o for o, pids in rec.opt_params.items() if pid in pids)
            self._hook(pair, module)
            self._pairs.append(pair)

    def _hook(self, pair: _Pair, module) -> None:
        rec = self.rec

        def enter(mod, args):
            pair.depth += 1

        def forward_hook(mod, args, output):
            try:
                if mod is module:
                    pair.depth = max(0, pair.depth - 1)
                elif pair.depth:
                    return  # a child run by the copy's own forward: counted there
                if not rec.progress.steps:
                    return
                pair.forwards += 1
                out = _first_tensor(output)
                if not torch.is_grad_enabled() or (out is not None and not out.requires_grad):
                    pair.targets += 1
                    if pair.target_loc is None:
                        pair.target_loc = rec.here(2)
            except Exception as exc:
                rec.internal_error("model copies (forward)", exc)

        pair.handles.append(module.register_forward_pre_hook(enter))
        for m in (module, *module.children()):
            pair.handles.append(m.register_forward_hook(forward_hook))

        def model_hook(mod, args, output):
            try:
                if not mod.training or not rec.progress.steps:
                    return
                out = _first_tensor(output)
                if not torch.is_grad_enabled() or (out is not None and not out.requires_grad):
                    pair.model_targets += 1
                    if pair.model_target_loc is None:
                        pair.model_target_loc = rec.here(2)
            except Exception as exc:
                rec.internal_error("model copies (trained model's forward)", exc)

        model = pair.model()
        if model is not None:
            pair.model_handle = model.register_forward_hook(model_hook)

    def _drop_model_hooks(self) -> None:
        """The trained models' forwards are counted over the first steps only: a hook on a
        module the script calls at every step is not left for the whole run."""
        for pair in self._pairs:
            if pair.model_handle is not None:
                pair.model_handle.remove()
                pair.model_handle = None

    # -- each step ------------------------------------------------------------------------
    def before_step(self, opt: int, optimizer) -> None:
        try:
            if not self._looked:
                self._looked = True
                self._find()
                return
            self._checks += 1
            if self._checks == MEASURED:
                self._drop_model_hooks()
            steps = self.rec.progress.steps
            for pair in self._pairs:
                self._check_written(pair, steps, values=self._checks <= VALUE_CHECKS)
                if opt in pair.owners and pair.post is not None:
                    self._measure(pair, steps)
        except Exception as exc:
            self._pairs = []
            self.rec.internal_error("model copies", exc)
        finally:
            if not self._pairs or all(pair.written and pair.measured >= MEASURED
                                      for pair in self._pairs):
                # no copy (the pairs are found once), or each one's facts complete: the steps
                # have nothing left to tell
                self._drop_model_hooks()
                self.rec.retire(STEP_BEGINS, self.before_step)
                self.rec.retire(STEPPED, self.after_step)

    def after_step(self, opt: int, optimizer) -> None:
        try:
            for pair in self._pairs:
                if opt in pair.owners and pair.measured < MEASURED:
                    model, copy = _sample(pair.model_params), _sample(pair.copy_params)
                    pair.post = (model, copy) if model is not None and copy is not None \
                        and model.shape == copy.shape else None
        except Exception as exc:
            self._pairs = []
            self.rec.internal_error("model copies", exc)

    def _check_written(self, pair: _Pair, steps: int, values: bool) -> None:
        if pair.written:
            return
        if _marks(pair.copy_params) != pair.marks:
            pair.written, pair.written_step = True, steps
            return
        if values and pair.base is not None:
            now = _sample(pair.copy_params)
            if now is None or not torch.equal(now, pair.base):
                pair.written, pair.written_step = True, steps

    def _measure(self, pair: _Pair, steps: int) -> None:
        model_post, copy_post = pair.post
        pair.post = None
        model, copy = _sample(pair.model_params), _sample(pair.copy_params)
        if model is None or copy is None:
            return
        pair.measured += 1
        follow = _followed(copy_post, copy, model_post)
        if follow is not None:
            pair.follows.append([steps, *follow])
        edit = model - model_post
        if not bool(edit.any()):
            return
        way = copy_post - model_post
        scale = float(edit.norm() * way.norm())
        cos = round(float(edit @ way) / scale, 6) if scale > 0.0 else None
        den = float(way.norm())
        share = round(float(edit.norm()) / den, 6) if den > 0.0 else None
        pair.rows.append([steps, cos, share, bool((copy - copy_post).any())])

    # -- the end --------------------------------------------------------------------------
    def close(self) -> None:
        rec = self.rec
        for pair in self._pairs:
            try:
                for handle in pair.handles:
                    handle.remove()
                if pair.model_handle is not None:
                    pair.model_handle.remove()
                    pair.model_handle = None
                made_at = pair.model_target_loc
                if pair.copy() is not None:
                    self._check_written(pair, rec.progress.steps, values=True)
                stale = _stale_norms(pair.norms) if pair.written else []
                rec.emit(ev.model_copy(
                    copy=pair.copy_name, model=pair.model_name, opt=pair.opt, params=pair.params,
                    equal=pair.equal, forwards=pair.forwards, targets=pair.targets,
                    written=pair.written, written_step=pair.written_step,
                    measured=pair.measured, pulls=pair.rows, follows=pair.follows,
                    model_targets=pair.model_targets,
                    model_target_at=[made_at.path, made_at.line] if made_at is not None else None,
                    norms=len(pair.norms), stale_norms=stale),
                    pair.target_loc)
            except Exception as exc:
                rec.internal_error("model copies", exc)
        self._pairs = []
