"""DistributedDataParallel and DistributedSampler: what a single-process trace cannot show.

* ``DistributedDataParallel.forward``: whether the backward of this forward will all-reduce
  the gradients. DDP decides it at forward time (``require_backward_grad_sync``, which
  ``no_sync()`` turns off, and grad mode on); the next backward event carries the decision as
  ``allreduce`` (through the backward watcher's loss describers). No comm hook is registered:
  a Python hook would replace DDP's built-in all-reduce (and a model takes only one hook).
* ``DistributedDataParallel.no_sync``: the user's ``with model.no_sync():`` line (``ddp_no_sync``).
* ``DistributedSampler.__iter__``: the epoch and shuffle flag each time it starts an epoch
  (``sampler_iter``), to see ``set_epoch`` never called.

* after each of an optimizer's first ``CHECKSUM_STEPS`` steps, in a process group of more
  than one rank: a checksum of the parameters it owns (``replica_checksum``), one batched
  ``torch._foreach_norm`` and a ``Deferred`` read at the end of the run (no host sync while it
  runs); rank 0 compares the ranks' checksums when it merges their reports (replicas-diverge).
  Sharded (DTensor) parameters differ across ranks by design and are left out.

Per forward this costs one attribute read; nothing per parameter.
"""

from __future__ import annotations

import functools

import torch

from .. import events as ev
from .recorder import Deferred, Recorder, Tensor

CHECKSUM_STEPS = 3


class DDPWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._ids: dict[int, int] = {}
        self._samplers: dict[int, int] = {}
        self._pending: bool | None = None  # the DDP forwards since the last backward: any synced?
        self._checksums: dict[int, int] = {}  # optimizer -> checksums taken

    def _id(self, obj, table: dict) -> int:
        return table.setdefault(id(obj), len(table))

    def after_step(self, opt: int, optimizer) -> None:
        """The checksum of the parameters an optimizer just stepped (first steps only)."""
        rec = self.rec
        done = self._checksums.get(opt, 0)
        if done >= CHECKSUM_STEPS:
            return
        self._checksums[opt] = done + 1
        try:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
                return
            params = [p.detach() for group in optimizer.param_groups for p in group["params"]
                      if type(p) is Tensor or type(p) is torch.nn.Parameter]
            if not params:
                return
            with torch.no_grad():
                norms = torch.stack(torch._foreach_norm(params)).double()
                weights = torch.arange(1, len(params) + 1, dtype=torch.float64,
                                       device=norms.device)
                checksum = (norms * weights).sum()
            rec.emit(ev.replica_checksum(opt=opt, step=rec.steps, value=Deferred(checksum),
                                         params=len(params)), rec.here(2))
        except Exception as exc:
            rec.internal_error("replica checksum", exc)

    def describe_loss(self, tensors) -> dict:
        """For the backward event: ``allreduce`` when a DDP forward ran since the last backward."""
        pending, self._pending = self._pending, None
        return {} if pending is None else {"allreduce": pending}

    def _wrap_forward(self, original):
        watcher = self

        @functools.wraps(original)
        def forward(module, *args, **kwargs):
            try:
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
                rec.emit(ev.ddp_no_sync(ddp=watcher._id(module, watcher._ids)), rec.here(2))
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
                rec.emit(ev.sampler_iter(sampler=watcher._id(sampler, watcher._samplers),
                                         epoch=epoch if isinstance(epoch, int) else None,
                                         shuffle=bool(getattr(sampler, "shuffle", False))),
                         rec.here(2))
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
        from torch.utils.data.distributed import DistributedSampler

        patcher.patch(DistributedSampler, "__iter__",
                      self._wrap_sampler_iter(DistributedSampler.__iter__))
