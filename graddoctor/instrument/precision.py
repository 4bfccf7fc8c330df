"""Optimizers over half-precision parameters (``model.half()``, ``.to(torch.bfloat16)``): does
the update survive the parameters' dtype?

Two causes are knowable without waiting for a NaN:

* **eps** — an optimizer constant that rounds to 0 in the parameters' dtype: Adam's
  ``eps=1e-8`` is below float16's smallest number (6e-8), so where ``exp_avg_sq`` underflows
  the update divides by zero. Checked at each optimizer's first step with such parameters
  (the dtype comes from the parameters, not from a guess).
* **frozen** — an update below the dtype's resolution: bfloat16 keeps 8 bits of mantissa, so a
  weight of 1.0 only moves by steps of 0.0039; with a small learning rate almost every weight
  keeps its exact value and training does nothing. For updates 2 to 4 of each such optimizer
  (the first is left out: a warm-up may start at 0), a sample of each half-precision
  parameter (at most ``_SAMPLE`` elements, at most ``_PARAMS`` parameters) is copied before
  the step and compared after it, where its gradient is non-zero. The counts stay on the
  device (``Deferred``: no host sync on a GPU); one ``low_precision`` event per optimizer
  carries the share that did not move, read at the end of the run.

The **frozen** comparison runs on float32 parameters too: an update below float32's resolution
(a weight of 0.1 moves in steps of 7e-9) is a learning rate typed a few orders of magnitude too
small (``lr=1e-10``), or gradients scaled down to nothing; there only an optimizer whose lrs
stay the same over the compared updates is judged (a warm-up ramps from near 0 on purpose), and
only with every lr below ``_FLOAT32_LR`` (above it, weights that keep their values have
vanishing gradients, which is not this check's business).

Installed through torch's global optimizer step hooks. The copies are made for three steps
only; once every optimizer registered so far is done (float32 ones included), both hooks are
taken out of torch's hook dicts (the pre hook from the post hook, the post hook at the next
``STEP_BEGINS``: never from a loop torch is running over that dict) and put back at their
place in torch's order when a new optimizer is registered (``PARAMS_ADDED``).
"""

from __future__ import annotations

import threading
from itertools import compress, repeat

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from .. import events as ev
from .recorder import Deferred, Recorder
from .topics import PARAMS_ADDED, STEP_BEGINS

_HALF = (torch.float16, torch.bfloat16)
_COMPARED = (*_HALF, torch.float32)  # dtypes whose updates are compared with their resolution
# float32 is judged only below this lr: above it, weights that keep their values have vanishing
# gradients (a deep net from a tiny initialisation), which is not what this check reports
_FLOAT32_LR = 1e-6
_SAMPLE = 65536  # elements of each parameter compared
_PARAMS = 16  # parameters compared per optimizer
_FIRST, _LAST = 2, 4  # the updates compared (1-based, per optimizer)


class _GlobalHook:
    """One of torch's global optimizer step hooks, which can be taken out of torch's dict and
    put back at its place (after the hooks registered before it, before those after it)."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.taken = None  # the hook while it is out

    def take_out(self) -> None:
        """Only where torch is not looping over this hook's dict."""
        hooks = self.handle.hooks_dict_ref()
        if hooks is not None and self.taken is None:
            self.taken = hooks.pop(self.handle.id, None)

    def put_back(self) -> None:
        hooks, hook = self.handle.hooks_dict_ref(), self.taken
        self.taken = None
        if hooks is None or hook is None:
            return
        key = self.handle.id
        hooks[key] = hook
        for later in [k for k in hooks if k > key]:  # handle ids grow: registered after this one
            hooks[later] = hooks.pop(later)


class PrecisionWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        # opt -> [steps seen, done, counts, copies, the lrs of its first compared update or
        # False once they changed]
        self._state: dict[int, list] = {}
        self._hooks: tuple[_GlobalHook, _GlobalHook] | None = None  # (pre, post) once installed
        # the threads that stepped an optimizer: torch's global hook dicts are left alone when
        # another one may be looping over them (a dict changed under its loop raises there)
        self._threads: set[int] = set()
        rec.subscribe(PARAMS_ADDED, self.params_added)
        rec.subscribe(STEP_BEGINS, self._take_out_post)
        rec.retire(STEP_BEGINS, self._take_out_post)  # resumed when the post hook is to go

    def _all_done(self) -> bool:
        state = self._state
        return all(entry[1] for entry in state.values()) and all(opt in state for opt in self.rec.opt_params)

    def _leave(self) -> None:
        """From the post hook: every optimizer is done. The pre hook goes now (torch loops over
        the post hooks), the post hook at the next step's ``STEP_BEGINS``."""
        if self._hooks is not None and self._threads == {threading.get_ident()}:
            self._hooks[0].take_out()
            self.rec.resume(STEP_BEGINS, self._take_out_post)

    def _take_out_post(self, opt, optimizer) -> None:
        self.rec.retire(STEP_BEGINS, self._take_out_post)
        if self._hooks is not None and self._hooks[0].taken is not None:
            self._hooks[1].take_out()

    def params_added(self, opt: int, pids) -> None:
        """``PARAMS_ADDED``: an optimizer not checked yet: both hooks back in torch's order."""
        entry = self._state.get(opt)
        if self._hooks is not None and (entry is None or not entry[1]):
            self.rec.retire(STEP_BEGINS, self._take_out_post)
            for hook in self._hooks:
                hook.put_back()

    def _half_params(self, optimizer, dtypes=_HALF):
        """``(group, parameter)`` of each parameter of one of ``dtypes``, in group order (``map``s
        in C: no Python per parameter)."""
        found = []
        for group in optimizer.param_groups:
            params = group["params"]
            kinds = map(getattr, params, repeat("dtype"), repeat(None))
            found.extend(zip(repeat(group), compress(params, map(dtypes.__contains__, kinds))))
        return found

    @staticmethod
    def _comparable(p) -> bool:
        """A plain dense tensor with a dense grad (no DTensor shard, no sparse embedding grad)."""
        grad = p.grad
        return (grad is not None and type(p.data) is torch.Tensor and p.layout == torch.strided
                and grad.layout == torch.strided and type(grad) is torch.Tensor)

    def _pre(self, optimizer, args, kwargs) -> None:
        try:
            self._threads.add(threading.get_ident())
            opt = self.rec.optimizer_id(optimizer)
            state = self._state.get(opt)
            if state is None:
                half = self._half_params(optimizer)
                state = self._state[opt] = [0, not self._half_params(optimizer, _COMPARED), None,
                                            None, None]
                if half:
                    self._check_eps(opt, optimizer, half)
            if state[1]:
                return
            state[0] += 1
            lrs = [lr if isinstance(lr := g.get("lr"), (int, float)) else None
                   for g in optimizer.param_groups]  # a tensor lr is never judged
            if state[4] is None:
                state[4] = lrs
            elif state[4] is not False and lrs != state[4]:
                state[4] = False  # a schedule moves the lr: float32 updates are not judged
            if state[0] < _FIRST:
                return
            copies = []
            for group, p in self._half_params(optimizer, _COMPARED):
                lr = group.get("lr")
                if not self._comparable(p) or not isinstance(lr, (int, float)) or not lr > 0:
                    continue
                flat = p.detach().reshape(-1)[:_SAMPLE]
                copies.append((p, flat.clone(), p.grad.detach().reshape(-1)[:_SAMPLE] != 0))
                if len(copies) >= _PARAMS:
                    break
            state[3] = copies
        except Exception as exc:
            self.rec.internal_error("half-precision update check", exc)

    def _post(self, optimizer, args, kwargs) -> None:
        try:
            opt = self.rec.optimizer_id(optimizer)
            state = self._state.get(opt)
            if state is None or state[1] or not state[3]:
                if state is not None and state[1] and self._all_done():
                    self._leave()
                return
            with torch.no_grad():
                for p, before, moving in state[3]:
                    after = p.detach().reshape(-1)[:before.numel()]
                    same = ((after == before) & moving).sum()
                    total = moving.sum()
                    counts = torch.stack([same, total]).to(torch.float64)
                    state[2] = counts if state[2] is None else state[2] + counts.to(state[2].device)
            state[3] = None
            if state[0] >= _LAST:
                state[1] = True
                self._emit_frozen(opt, optimizer, state[2], state[4])
                if self._all_done():
                    self._leave()
        except Exception as exc:
            self.rec.internal_error("half-precision update check", exc)

    def _check_eps(self, opt, optimizer, half) -> None:
        dtypes = {p.dtype for _, p in half}
        for group in optimizer.param_groups:
            eps = group.get("eps")
            if not isinstance(eps, float) or eps <= 0:
                continue
            for dtype in sorted(dtypes, key=str):
                if torch.tensor(eps, dtype=dtype).item() == 0.0:
                    lr = group.get("lr")
                    self.rec.emit_aside(ev.low_precision(
                        opt=opt, cls=type(optimizer).__name__, dtype=str(dtype).replace("torch.", ""),
                        what="eps", eps=eps, lr=float(lr) if isinstance(lr, (int, float)) else None,
                        unchanged=None, params=sum(1 for _, p in half if p.dtype == dtype)),
                        self.rec.here(3))
                    return

    def _emit_frozen(self, opt, optimizer, counts, lrs) -> None:
        if counts is None:
            return
        half = self._half_params(optimizer)
        if not half and (lrs is False or max((lr for lr in lrs if lr), default=0.0) >= _FLOAT32_LR):
            return  # float32 weights under a moving lr (a warm-up's first updates are tiny on
            # purpose), or with an lr that is not the cause
        dtype = str(half[0][1].dtype).replace("torch.", "") if half else "float32"
        share = counts[0] / counts[1].clamp_min(1)
        value = float(share) if share.device.type == "cpu" else Deferred(share)
        lr = optimizer.param_groups[0].get("lr")
        self.rec.emit_aside(ev.low_precision(
            opt=opt, cls=type(optimizer).__name__, dtype=dtype, what="frozen",
            eps=None, lr=float(lr) if isinstance(lr, (int, float)) else None,
            unchanged=value, params=len(half)), self.rec.here(3))

    def install(self, patcher) -> None:
        self._hooks = (_GlobalHook(patcher.handle(register_optimizer_step_pre_hook(self._pre))),
                       _GlobalHook(patcher.handle(register_optimizer_step_post_hook(self._post))))
