"""DistributedDataParallel and DistributedSampler: what a single-process trace cannot show.

* ``DistributedDataParallel.forward``: whether the backward of this forward will all-reduce
  the gradients. DDP decides it at forward time (``require_backward_grad_sync``, which
  ``no_sync()`` turns off, and grad mode on); the next backward event carries the decision as
  ``allreduce`` (through the backward watcher's loss describers). No comm hook is registered:
  a Python hook would replace DDP's built-in all-reduce (and a model takes only one hook).
* ``DistributedDataParallel.no_sync``: the user's ``with model.no_sync():`` line (``ddp_no_sync``).
* ``DistributedDataParallel.__init__``: the wrapped module's trainable parameters (``ddp_init``),
  once per construction: a backward that writes them with no DDP forward since the last one
  (the loss computed through ``model.module``) all-reduces nothing.
* ``DistributedSampler.__iter__``: the epoch and shuffle flag each time it starts an epoch
  (``sampler_iter``), to see ``set_epoch`` never called.

* after an optimizer's first ``CHECKSUM_STEPS`` steps, then at steps 4, 8, 16, ... (a
  divergence that starts later is still seen, at a cost that grows with the log of the run)
  and at the step budget, in a process group of more than one rank: a checksum of those of its
  parameters that are meant to be replicated (``replica_checksum``): the parameters of
  ``DistributedDataParallel``-wrapped modules, the only ones every rank holds by contract. A
  pipeline stage's own layers differ across ranks by design, as do sharded (DTensor)
  parameters: both are left out. One batched ``torch._foreach_norm`` and a ``Deferred`` read at
  the end of the run (no host sync while it runs); rank 0 compares the ranks' checksums when it
  merges their reports (replicas-diverge).
  Without any DistributedDataParallel module (ranks that train one model by hand: the process
  group up, an ``all_gather`` in the loss, no wrapper), the ranks may still be replicas: every
  parameter an optimizer steps is checksummed, with the layout of those parameters (their
  shapes) and their checksum when the optimizer was built (``params_added``, while the process
  group is up), so that the merge compares only ranks that train parameters of the same shapes
  from the same initial values; a pipeline's ranks, each owning other layers, never are.

* ``torch.distributed.all_reduce`` (and ``all_reduce_coalesced``) called by the script itself:
  hand-written data parallelism, which must average what it sums. For the first
  ``ALLREDUCE_UPDATES`` updates that all-reduce gradients, a call from the user's code whose
  tensor is a tracked parameter's ``.grad`` (itself, a view of all of it, its ``.data``) or,
  otherwise, a buffer of more than one element (a flat ``torch.cat`` of the gradients) gets the
  L2 norm of what the all-reduce produced (a device scalar: no host sync); for a gradient also
  whether it was changed in place since the backward wrote it (divided before the all-reduce:
  its version), for a buffer its norm before the call and that of every gradient as the
  backward left them. The next optimizer step that applies those gradients compares (one host
  read): the gradients it is about to apply against what the all-reduce made (``scale``: 1.0 when
  nothing divided them afterwards, ``1 / world`` when the script averaged them), a buffer's
  against the step's gradients as a whole when it held as many elements as they do (a metric
  all-reduced matches none). One ``grad_allreduce`` event per all-reduce line and update, at
  that line. The gradients of ``DistributedDataParallel`` modules are judged too (DDP has
  averaged them already: summed again, they are N times the mean); async calls (their result
  is not there when the call returns) and closure steps are left alone.
  Nothing of the script's is held: gradients are looked up by their pids again.

* ``FSDPModule.set_requires_gradient_sync`` (FSDP2's ``no_sync``): while a parameter group
  does not reduce, a backward accumulates into FSDP's unsharded gradient, not into the sharded
  ``.grad`` the optimizer steps; ``written_aside`` tells the backward watcher which parameters
  such a backward wrote (their unsharded gradient changed), so that accumulation windows read
  as they do without FSDP.

Per forward this costs one attribute read; nothing per parameter. An all-reduce called by the
script costs a frame check once its first updates are judged.
"""

from __future__ import annotations

import functools
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .. import events as ev
from .identities import Identities
from .gradstate import Tensor
from .optim import _has_closure
from .recorder import Deferred, Recorder
from .topics import STEPPED

CHECKSUM_STEPS = 3
ALLREDUCE_UPDATES = 3  # the updates whose hand-written gradient all-reduces are judged
_SAME = 1e-4  # relative: two norms of the same values (a buffer's and its pieces': 1e-3)
_HALF = (torch.float16, torch.bfloat16)


def checksum_due(n: int, budget: int | None) -> bool:
    """Whether an optimizer's ``n``-th step gets a replica checksum: the first
    ``CHECKSUM_STEPS``, every power of two, and the last one of the step budget."""
    return n <= CHECKSUM_STEPS or n & (n - 1) == 0 or (budget is not None and n == budget)


def _checksum(params):
    """A weighted sum of the tensors' norms (one batched ``_foreach_norm``), as a device tensor."""
    with torch.no_grad():
        norms = torch.stack(torch._foreach_norm(params)).double()
        weights = torch.arange(1, len(params) + 1, dtype=torch.float64, device=norms.device)
        return (norms * weights).sum()


def _norm(tensor):
    """The L2 norm of a tensor's values as a float64 device scalar (no host sync; half
    precision is summed in float32)."""
    with torch.no_grad():
        return torch.linalg.vector_norm(
            tensor.detach(), dtype=torch.float32 if tensor.dtype in _HALF else None).double()


def _host(scalars: list) -> list[float]:
    """Device scalars as floats: one read per device."""
    out: list = [None] * len(scalars)
    by_device: dict = {}
    for i, s in enumerate(scalars):
        by_device.setdefault(s.device, []).append(i)
    for indices in by_device.values():
        for i, value in zip(indices, torch.stack([scalars[i] for i in indices]).tolist()):
            out[i] = value
    return out


def _op_name(op) -> str:
    """``ReduceOp.SUM`` -> "sum" (a ReduceOp object, e.g. a premultiplied sum: its type)."""
    name = getattr(op, "name", None)
    return name.lower() if isinstance(name, str) else type(op).__name__.lower()


def _agree(values: list[float]) -> float | None:
    """The value of ratios that agree (rounded), or None."""
    if not values:
        return None
    low, high = min(values), max(values)
    if high - low > _SAME * max(abs(high), 1e-30):
        return None
    return float(f"{sum(values) / len(values):.6g}")


class DDPWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._ddp_id = Identities()  # DistributedDataParallel module -> its number
        self._sampler_id = Identities()  # DistributedSampler -> its number
        self._set_epoch_at: dict[int, tuple] = {}  # id(DistributedSampler) -> (path, line) of set_epoch
        self._pending: bool | None = None  # the DDP forwards since the last backward: any synced?
        self._stepping = True  # subscribed to STEPPED (after_step) and not retired
        # ids of the parameters of the DistributedDataParallel modules seen (what DDP keeps
        # replicated); ids only: nothing of the user's model is kept alive by graddoctor
        self._replicated: set[int] = set()
        # optimizer -> (layout, initial checksum) of its parameters when built, in a process
        # group of several ranks (the ranks that may be replicas without DDP)
        self._initial: dict[int, tuple[int, object]] = {}
        self._ddp_seen: set[int] = set()
        # ids of the parameters of every DistributedDataParallel built (its forward run or not)
        self._built: set[int] = set()
        self._fsdp_modules: list = []  # FSDP2 modules whose gradient sync was turned off or on
        # (sharded parameter, FSDPParam) of the groups that do not reduce now, and the state
        # of each one's unsharded gradient when last seen: id(FSDPParam) -> (id, _version)
        self.unsynced: list = []
        self._aside_seen: dict[int, tuple[int, int]] = {}
        # ids of FSDP's unsharded parameters: the graph's leaves while the sharded ones are
        # gathered, never stepped themselves (the backward watcher does not track them)
        self.shadows: set[int] = set()
        # all-reduces the script calls itself (hand-written data parallelism)
        # updates (optimizer steps' intervals) in which the script all-reduced a floating
        # tensor, and the step count of the latest: the first ALLREDUCE_UPDATES are looked at
        self._ar_updates = 0
        self._ar_update = -1
        # (backward_calls, steps) when the lookups were built, {id(grad): pid},
        # {(data_ptr, numel, dtype): pid}: pids only, nothing of the script's held
        self._ar_lookup: tuple | None = None
        # pid -> (location, op, world, norm after the all-reduce, changed before it)
        self._ar_grads: dict[int, tuple] = {}
        # (path, line) -> [location, op, world, elements, [norm before], [norm after]]
        self._ar_flat: dict[tuple, list] = {}
        # the gradients as the backward left them, read at the first buffer all-reduced after
        # it: optimizer -> (elements, sum of squares); None: not read yet
        self._ar_raw: dict | None = None

    def after_step(self, opt: int, optimizer) -> None:
        """The checksum of the replicated parameters an optimizer just stepped (at the steps
        ``checksum_due`` names)."""
        rec = self.rec
        if not (self._replicated or self._initial):
            # nothing to checksum: off ``STEPPED`` until a DDP forward or an optimizer built in
            # a process group of several ranks gives it something (``_steps_wanted``); the
            # steps are counted by ``Progress.stepped`` meanwhile
            self._stepping = False
            rec.retire(STEPPED, self.after_step)
            return
        done = rec.progress.stepped(opt)
        unwrapped = not self._replicated and not self.fsdp_seen and opt in self._initial
        if not (self._replicated or unwrapped) or not checksum_due(done, rec.progress.step_budget):
            return
        try:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
                return
            replicated = self._replicated
            params = [p.detach() for group in optimizer.param_groups for p in group["params"]
                      if (type(p) is Tensor or type(p) is torch.nn.Parameter)
                      and (unwrapped or id(p) in replicated)]
            if not params:
                return
            checksum = _checksum(params)
            extra = {}
            if unwrapped:
                layout, initial = self._initial[opt]
                extra = {"layout": layout, "initial": Deferred(initial),
                         "bypassed": bool(self._built) and any(
                             id(p) in self._built for group in optimizer.param_groups
                             for p in group["params"])}
            rec.emit(ev.replica_checksum(opt=opt, step=rec.progress.steps, value=Deferred(checksum),
                                         params=len(params), **extra), rec.here(2))
        except Exception as exc:
            rec.internal_error("replica checksum", exc)

    def _steps_wanted(self) -> None:
        """Back on ``STEPPED`` (at its place in the order) once there is something to
        checksum."""
        if not self._stepping:
            self._stepping = True
            self.rec.resume(STEPPED, self.after_step)

    def params_added(self, opt: int, pids) -> None:
        """An optimizer was given parameters: in a process group of several ranks, their layout
        and checksum as built (what tells replicas trained without DDP)."""
        try:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
                return
            tensors = [self.rec.tensor(pid) for pid in pids]
            params = [t.detach() for t in tensors
                      if t is not None and (type(t) is Tensor or type(t) is torch.nn.Parameter)]
            if not params:
                return
            layout, initial = self._initial.get(opt, (0, None))
            shapes = tuple(tuple(p.shape) for p in params)
            checksum = _checksum(params)  # a later param group's weighs in after the earlier ones'
            self._initial[opt] = (hash((layout, shapes)) & 0xFFFFFFFF,
                                  checksum if initial is None else initial * 3 + checksum)
            self._steps_wanted()
        except Exception as exc:
            self.rec.internal_error("replica checksum", exc)

    # -- FSDP2: accumulation without gradient sync ------------------------------------------
    def _wrap_set_sync(self, original):
        watcher = self

        @functools.wraps(original)
        def set_requires_gradient_sync(module, *args, **kwargs):
            result = original(module, *args, **kwargs)
            try:
                if not any(m is module for m in watcher._fsdp_modules):
                    watcher._fsdp_modules.append(module)
                watcher._refresh_unsynced()
            except Exception as exc:
                watcher.rec.internal_error("set_requires_gradient_sync", exc)
            return result

        return set_requires_gradient_sync

    def _refresh_unsynced(self) -> None:
        from torch.distributed.fsdp import FSDPModule

        out, seen = [], set()
        for root in self._fsdp_modules:
            for module in root.modules():
                if not isinstance(module, FSDPModule):
                    continue
                for group in module._get_fsdp_state()._fsdp_param_groups:
                    if id(group) in seen:
                        continue
                    seen.add(id(group))
                    for fp in group.fsdp_params:
                        shadow = getattr(fp, "_unsharded_param", None)
                        if shadow is not None:
                            self.shadows.add(id(shadow))
                    if not getattr(group, "reduce_grads", True):
                        out += [(fp.sharded_param, fp) for fp in group.fsdp_params]
        self.unsynced = out

    @property
    def fsdp_seen(self) -> bool:
        return bool(self._fsdp_modules)

    def is_shadow(self, leaf) -> bool:
        """Whether a graph leaf is FSDP's unsharded copy of a parameter (created lazily at the
        first forward: looked up again when an unknown leaf shows up; walks are rare)."""
        if id(leaf) not in self.shadows:
            self._refresh_unsynced()
        return id(leaf) in self.shadows

    @staticmethod
    def _unsharded_grad(fp):
        grad = getattr(fp, "unsharded_accumulated_grad", None)
        if grad is None:
            param = getattr(fp, "_unsharded_param", None)
            grad = getattr(param, "grad", None) if param is not None else None
        return grad

    def written_aside(self) -> list:
        """The tracked parameters whose unsharded FSDP gradient the backward that just ran wrote
        (groups without gradient sync only; empty and free otherwise)."""
        if not self.unsynced:
            return []
        rec, seen, out = self.rec, self._aside_seen, []
        for param, fp in self.unsynced:
            grad = self._unsharded_grad(fp)
            if grad is None:
                continue
            state = (id(grad), grad._version)
            if seen.get(id(fp)) != state:
                seen[id(fp)] = state
                pid = rec.pid(param)
                if pid is not None:
                    out.append(pid)
        return out

    def describe_loss(self, tensors) -> dict:
        """For the backward event: ``allreduce`` when a DDP forward ran since the last backward.
        A backward adds onto what an all-reduce made: nothing is left to compare."""
        if self._ar_grads or self._ar_flat or self._ar_raw is not None:
            self._ar_grads, self._ar_flat, self._ar_raw = {}, {}, None
        pending, self._pending = self._pending, None
        return {} if pending is None else {"allreduce": pending}

    # -- hand-written data parallelism: the script's own all-reduce of the gradients ---------
    def _wrap_all_reduce(self, original, many: bool):
        watcher = self
        is_user_file = self.rec.finder.is_user_file
        progress = self.rec.progress

        @functools.wraps(original)
        def all_reduce(*args, **kwargs):
            caller = sys._getframe(1)
            if (watcher._ar_updates >= ALLREDUCE_UPDATES and progress.steps != watcher._ar_update) \
                    or not is_user_file(caller.f_code.co_filename):
                return original(*args, **kwargs)
            seen = None
            try:
                seen = watcher._ar_before(args, kwargs, many, caller)
            except Exception as exc:
                watcher.rec.internal_error("torch.distributed.all_reduce", exc)
            result = original(*args, **kwargs)
            if seen is not None:
                try:
                    watcher._ar_after(*seen)
                except Exception as exc:
                    watcher.rec.internal_error("torch.distributed.all_reduce", exc)
            return result

        return all_reduce

    def _ar_before(self, args, kwargs, many: bool, caller):
        """What an all-reduce call from the script is given: None when there is nothing to
        judge, else (location, op, world, [("grad", tensor, pid, changed) | ("flat", tensor,
        norm before)])."""
        import torch.distributed as dist

        def arg(position: int, name: str, default=None):
            return args[position] if len(args) > position else kwargs.get(name, default)

        given = arg(0, "tensors" if many else "tensor")
        if arg(3, "async_op", False):
            return None  # the result comes at wait(): not judged
        tensors = list(given) if many and isinstance(given, (list, tuple)) else [given]
        rec = self.rec
        entries = []
        for t in tensors:
            if type(t) is not Tensor or not t.is_floating_point() or t.requires_grad:
                continue
            pid, grad = self._ar_grad_of(t)
            if pid is not None:
                if rec.in_backward():  # a gradient hook: the backward has just written it
                    changed = False
                else:
                    changed = (rec.grads.known.get(pid) != (id(grad), grad._version)
                               or (t is not grad and t._base is None and t._version > 0))
                entries.append(("grad", t, pid, changed))
            elif not many and t.numel() > 1:
                entries.append(("flat", t, _norm(t)))
        if not entries:
            return None
        op = arg(1, "op", dist.ReduceOp.SUM)
        world = dist.get_world_size(arg(2, "group"))
        return self.rec.finder.location(caller), _op_name(op), world, entries

    def _ar_after(self, loc, op: str, world: int, entries) -> None:
        steps = self.rec.progress.steps
        if steps != self._ar_update:  # the first all-reduce of an update
            self._ar_update = steps
            self._ar_updates += 1
        for entry in entries:
            if entry[0] == "grad":
                _kind, t, pid, changed = entry
                self._ar_grads[pid] = (loc, op, world, _norm(t), changed)
                continue
            _kind, t, before = entry
            if self._ar_raw is None:
                self._ar_raw = self._ar_raw_grads()
            flat = self._ar_flat.get((loc.path, loc.line))
            if flat is None:
                flat = self._ar_flat[(loc.path, loc.line)] = [loc, op, world, 0, [], []]
            flat[3] += t.numel()
            flat[4].append(before)
            flat[5].append(_norm(t))

    def _ar_tracked(self):
        """(pid, grad) of the tracked tensors with a plain gradient (a DDP module's too: an
        all-reduce of gradients DDP has averaged is judged, by ddp-average-redone)."""
        rec = self.rec
        pids, refs = rec.readable(rec.others_in_backward())
        for pid, ref in zip(pids, refs):
            tensor = ref()
            if tensor is None:
                continue
            grad = tensor.grad
            if grad is not None and type(grad) is Tensor:
                yield pid, grad

    def _ar_grad_of(self, t):
        """``(pid, grad)`` when ``t`` is a tracked gradient, a view of all of it or its
        ``.data``; else ``(None, None)``. The lookups are built again after a backward or a
        step, when a tensor is not found in them."""
        progress = self.rec.progress
        now = (progress.backward_calls, progress.steps)
        for attempt in (0, 1):
            lookup = self._ar_lookup
            if lookup is not None:
                pid = lookup[1].get(id(t))
                if pid is None:
                    pid = lookup[2].get((t.data_ptr(), t.numel(), t.dtype))
                if pid is not None:
                    tensor = self.rec.tensor(pid)
                    grad = tensor.grad if tensor is not None else None
                    if grad is not None and (grad is t or (
                            grad.data_ptr() == t.data_ptr() and grad.numel() == t.numel()
                            and grad.dtype == t.dtype)):
                        return pid, grad
            if attempt or (lookup is not None and lookup[0] == now):
                break
            by_id, by_ptr = {}, {}
            for pid, grad in self._ar_tracked():
                by_id[id(grad)] = pid
                by_ptr[(grad.data_ptr(), grad.numel(), grad.dtype)] = pid
            self._ar_lookup = (now, by_id, by_ptr)
        return None, None

    def _ar_raw_grads(self) -> dict:
        """Per optimizer, (elements, sum of squares as a device scalar) of the gradients of its
        parameters as they are now."""
        rec, out = self.rec, {}
        for opt, pids in rec.opt_params.items():
            grads = []
            for pid in pids:
                tensor = rec.tensor(pid)
                grad = tensor.grad if tensor is not None else None
                if grad is not None and type(grad) is Tensor:
                    grads.append(grad)
            if grads and len({g.device for g in grads}) == 1:
                out[opt] = (sum(g.numel() for g in grads),
                            torch.stack([_norm(g) for g in grads]).square().sum())
        return out

    def _ar_step(self, optimizer, args, kwargs) -> None:
        """Before an optimizer step: the gradients it applies against what the script's
        all-reduces made of them (one ``grad_allreduce`` per all-reduce line)."""
        if not (self._ar_grads or self._ar_flat):
            return
        rec = self.rec
        try:
            if _has_closure(args, kwargs):
                return
            opt = rec.optimizer_id(optimizer)
            owned = rec.opt_params.get(opt, ())
            lines: dict[tuple, list] = {}  # (path, line) -> [loc, op, world, [(now, after, changed)]]
            grads = self._ar_grads
            for pid in owned:
                entry = grads.pop(pid, None)
                if entry is None:
                    continue
                loc, op, world, after, changed = entry
                tensor = rec.tensor(pid)
                grad = tensor.grad if tensor is not None else None
                if grad is None or type(grad) is not Tensor:
                    continue
                line = lines.setdefault((loc.path, loc.line), [loc, op, world, []])
                line[3].append((_norm(grad), after, changed))
            flats = []
            raw = (self._ar_raw or {}).get(opt)
            if self._ar_flat and raw is not None:
                applied = [g for g in (getattr(rec.tensor(pid), "grad", None) for pid in owned)
                           if g is not None and type(g) is Tensor]
                size = sum(g.numel() for g in applied)
                if applied and size == raw[0]:
                    for key, flat in list(self._ar_flat.items()):
                        if flat[3] == size:
                            flats.append((self._ar_flat.pop(key), len(applied)))
                    if flats:
                        now = torch.stack([_norm(g) for g in applied]).square().sum()
            if not lines and not flats:
                return
            scalars = [s for line in lines.values() for item in line[3] for s in item[:2]]
            if flats:
                scalars.append(raw[1])
                scalars.append(now)
                for flat, _n in flats:
                    scalars.append(torch.stack(flat[4]).square().sum())
                    scalars.append(torch.stack(flat[5]).square().sum())
            values = iter(_host(scalars))
            for loc, op, world, items in lines.values():
                ratios = []
                for _now, _after, _changed in items:
                    now_value, after_value = next(values), next(values)
                    if after_value > 0:
                        ratios.append(now_value / after_value)
                rec.emit(ev.grad_allreduce(opt=opt, op=op, world=world, params=len(items),
                                           via="grad", scale=_agree(ratios),
                                           before=any(item[2] for item in items)), loc)
            if flats:
                raw_sq, applied_sq = next(values), next(values)
                for (loc, op, world, _size, _before, _after), n in flats:
                    before_sq, after_sq = next(values), next(values)
                    unchanged = abs(before_sq - raw_sq) <= 10 * _SAME * max(raw_sq, 1e-30)
                    scale = (float(f"{(applied_sq / after_sq) ** 0.5:.6g}")
                             if after_sq > 0 else None)
                    rec.emit(ev.grad_allreduce(opt=opt, op=op, world=world, params=n, via="flat",
                                               scale=scale, before=not unchanged), loc)
        except Exception as exc:
            rec.internal_error("optimizer step (all-reduced gradients)", exc)

    def _wrap_forward(self, original):
        watcher = self

        @functools.wraps(original)
        def forward(module, *args, **kwargs):
            try:
                if id(module) not in watcher._ddp_seen:
                    watcher._ddp_seen.add(id(module))
                    watcher._replicated.update(id(p) for p in module.parameters())
                    watcher._steps_wanted()
                if torch.is_grad_enabled():
                    sync = bool(getattr(module, "require_backward_grad_sync", True))
                    watcher._pending = sync or bool(watcher._pending)
            except Exception as exc:
                watcher.rec.internal_error("DistributedDataParallel.forward", exc)
            return original(module, *args, **kwargs)

        return forward

    def _wrap_init(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def __init__(module, *args, **kwargs):
            original(module, *args, **kwargs)
            try:
                watcher._init_seen(module)
            except Exception as exc:
                rec.internal_error("DistributedDataParallel.__init__", exc)

        return __init__

    def _init_seen(self, module) -> None:
        """A ``ddp_init`` event: the wrapped module's parameters (what a forward that goes
        around the wrapper leaves unreduced), once per construction."""
        rec = self.rec
        inner = getattr(module, "module", None)
        if not isinstance(inner, torch.nn.Module):
            return
        params = [p for p in inner.parameters() if p.requires_grad]
        self._built.update(map(id, params))
        world = None
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                world = dist.get_world_size()
        except Exception:
            world = None
        rec.emit(ev.ddp_init(ddp=self._ddp_id(module), params=[rec.track(p) for p in params],
                             world=world), rec.here(2))

    def _wrap_no_sync(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def no_sync(module, *args, **kwargs):
            try:
                rec.emit(ev.ddp_no_sync(ddp=watcher._ddp_id(module)), rec.here(2))
            except Exception as exc:
                rec.internal_error("DistributedDataParallel.no_sync", exc)
            return original(module, *args, **kwargs)

        return no_sync

    def _wrap_sampler_iter(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def __iter__(sampler, *args, **kwargs):
            try:
                epoch = getattr(sampler, "epoch", None)
                set_at = watcher._set_epoch_at.get(id(sampler))
                rec.emit(ev.sampler_iter(sampler=watcher._sampler_id(sampler),
                                         epoch=epoch if isinstance(epoch, int) else None,
                                         shuffle=bool(getattr(sampler, "shuffle", False)),
                                         set_at=list(set_at) if set_at else None),
                         _epoch_loop(rec, sampler))
            except Exception as exc:
                rec.internal_error("DistributedSampler.__iter__", exc)
            return original(sampler, *args, **kwargs)

        return __iter__

    def _wrap_set_epoch(self, original):
        """Where the user's code calls ``set_epoch`` (once per epoch: nothing per step), so that
        a sampler set to the same epoch every time is pointed at that call."""
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def set_epoch(sampler, *args, **kwargs):
            try:
                loc = rec.here(2)
                if loc is not None:
                    watcher._set_epoch_at[id(sampler)] = (loc.path, loc.line)
            except Exception as exc:
                rec.internal_error("DistributedSampler.set_epoch", exc)
            return original(sampler, *args, **kwargs)

        return set_epoch

    def install(self, patcher) -> None:
        try:
            from torch.nn.parallel import DistributedDataParallel
        except Exception:  # a build without distributed support
            DistributedDataParallel = None
        if DistributedDataParallel is not None:
            patcher.patch(DistributedDataParallel, "__init__",
                          self._wrap_init(DistributedDataParallel.__init__))
            patcher.patch(DistributedDataParallel, "forward",
                          self._wrap_forward(DistributedDataParallel.forward))
            patcher.patch(DistributedDataParallel, "no_sync",
                          self._wrap_no_sync(DistributedDataParallel.no_sync))
        try:
            from torch.distributed.fsdp import FSDPModule
        except Exception:  # no FSDP2 in this build
            FSDPModule = None
        if FSDPModule is not None and hasattr(FSDPModule, "set_requires_gradient_sync"):
            patcher.patch(FSDPModule, "set_requires_gradient_sync",
                          self._wrap_set_sync(FSDPModule.set_requires_gradient_sync))
        from torch.utils.data.distributed import DistributedSampler

        patcher.patch(DistributedSampler, "__iter__",
                      self._wrap_sampler_iter(DistributedSampler.__iter__))
        patcher.patch(DistributedSampler, "set_epoch",
                      self._wrap_set_epoch(DistributedSampler.set_epoch))
        import torch.distributed as dist

        if dist.is_available():
            patcher.patch(dist, "all_reduce", self._wrap_all_reduce(dist.all_reduce, many=False))
            if hasattr(dist, "all_reduce_coalesced"):
                patcher.patch(dist, "all_reduce_coalesced",
                              self._wrap_all_reduce(dist.all_reduce_coalesced, many=True))
        patcher.handle(register_optimizer_step_pre_hook(self._ar_step))


def _holds(value, sampler) -> bool:
    """``value`` is the sampler, or a DataLoader (or batch sampler) drawing from it."""
    if value is sampler:
        return True
    inner = getattr(value, "batch_sampler", None) if hasattr(value, "sampler") else None
    return (getattr(value, "sampler", None) is sampler
            or getattr(inner, "sampler", None) is sampler)


def _epoch_loop(rec, sampler):
    """Where an epoch of ``sampler`` starts, as the user would fix it: the innermost user frame
    that does not merely receive the loader as an argument. A helper that iterates what it is
    handed (MAE's ``MetricLogger.log_every``: ``for obj in iterable``, a ``train_one_epoch(model,
    loader)``) is not where ``set_epoch`` goes; the frame that owns the loader is (its epoch
    loop's call). Once per epoch: the argument lookups cost nothing per step."""
    try:
        chosen = None
        for frame in rec.finder.user_frames(sys._getframe(2)):
            chosen = frame
            code = frame.f_code
            names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount
                                     + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)]
            values = frame.f_locals
            passed = False
            for name in names:
                value = values.get(name)
                if isinstance(value, (tuple, list)):
                    passed = any(_holds(v, sampler) for v in value)
                elif isinstance(value, dict):
                    passed = any(_holds(v, sampler) for v in value.values())
                else:
                    passed = _holds(value, sampler)
                if passed:
                    break
            if not passed:
                break
        if chosen is not None:
            return rec.finder.location(chosen)
    except Exception as exc:
        rec.internal_error("DistributedSampler.__iter__ (location)", exc)
    return rec.here(3)

