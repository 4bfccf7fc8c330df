"""DistributedDataParallel and DistributedSampler: what a single-process trace cannot show.

* ``DistributedDataParallel.forward``: whether the backward of this forward will all-reduce
  the gradients. DDP decides it at forward time (``require_backward_grad_sync``, which
  ``no_sync()`` turns off, and grad mode on); the next backward event carries the decision as
  ``allreduce`` (through the backward watcher's loss describers). No comm hook is registered:
  a Python hook would replace DDP's built-in all-reduce (and a model takes only one hook).
* ``DistributedDataParallel.no_sync``: the user's ``with model.no_sync():`` line (``ddp_no_sync``).
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

* ``FSDPModule.set_requires_gradient_sync`` (FSDP2's ``no_sync``): while a parameter group
  does not reduce, a backward accumulates into FSDP's unsharded gradient, not into the sharded
  ``.grad`` the optimizer steps; ``written_aside`` tells the backward watcher which parameters
  such a backward wrote (their unsharded gradient changed), so that accumulation windows read
  as they do without FSDP.

Per forward this costs one attribute read; nothing per parameter.
"""

from __future__ import annotations

import functools
import sys

import torch

from .. import events as ev
from .identities import Identities
from .gradstate import Tensor
from .recorder import Deferred, Recorder

CHECKSUM_STEPS = 3


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


class DDPWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._ddp_id = Identities()  # DistributedDataParallel module -> its number
        self._sampler_id = Identities()  # DistributedSampler -> its number
        self._pending: bool | None = None  # the DDP forwards since the last backward: any synced?
        self._checksums: dict[int, int] = {}  # optimizer -> steps seen
        # ids of the parameters of the DistributedDataParallel modules seen (what DDP keeps
        # replicated); ids only: nothing of the user's model is kept alive by graddoctor
        self._replicated: set[int] = set()
        # optimizer -> (layout, initial checksum) of its parameters when built, in a process
        # group of several ranks (the ranks that may be replicas without DDP)
        self._initial: dict[int, tuple[int, object]] = {}
        self._ddp_seen: set[int] = set()
        self._fsdp_modules: list = []  # FSDP2 modules whose gradient sync was turned off or on
        # (sharded parameter, FSDPParam) of the groups that do not reduce now, and the state
        # of each one's unsharded gradient when last seen: id(FSDPParam) -> (id, _version)
        self.unsynced: list = []
        self._aside_seen: dict[int, tuple[int, int]] = {}
        # ids of FSDP's unsharded parameters: the graph's leaves while the sharded ones are
        # gathered, never stepped themselves (the backward watcher does not track them)
        self.shadows: set[int] = set()

    def after_step(self, opt: int, optimizer) -> None:
        """The checksum of the replicated parameters an optimizer just stepped (at the steps
        ``checksum_due`` names)."""
        rec = self.rec
        done = self._checksums.get(opt, 0) + 1
        self._checksums[opt] = done
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
                extra = {"layout": layout, "initial": Deferred(initial)}
            rec.emit(ev.replica_checksum(opt=opt, step=rec.progress.steps, value=Deferred(checksum),
                                         params=len(params), **extra), rec.here(2))
        except Exception as exc:
            rec.internal_error("replica checksum", exc)

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
        """For the backward event: ``allreduce`` when a DDP forward ran since the last backward."""
        pending, self._pending = self._pending, None
        return {} if pending is None else {"allreduce": pending}

    def _wrap_forward(self, original):
        watcher = self

        @functools.wraps(original)
        def forward(module, *args, **kwargs):
            try:
                if id(module) not in watcher._ddp_seen:
                    watcher._ddp_seen.add(id(module))
                    watcher._replicated.update(id(p) for p in module.parameters())
                if torch.is_grad_enabled():
                    sync = bool(getattr(module, "require_backward_grad_sync", True))
                    watcher._pending = sync or bool(watcher._pending)
            except Exception as exc:
                watcher.rec.internal_error("DistributedDataParallel.forward", exc)
            return original(module, *args, **kwargs)

        return forward

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
                rec.emit(ev.sampler_iter(sampler=watcher._sampler_id(sampler),
                                         epoch=epoch if isinstance(epoch, int) else None,
                                         shuffle=bool(getattr(sampler, "shuffle", False))),
                         _epoch_loop(rec, sampler))
            except Exception as exc:
                rec.internal_error("DistributedSampler.__iter__", exc)
            return original(sampler, *args, **kwargs)

        return __iter__

    def install(self, patcher) -> None:
        try:
            from torch.nn.parallel import DistributedDataParallel
        except Exception:  # a build without distributed support
            DistributedDataParallel = None
        if DistributedDataParallel is not None:
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

