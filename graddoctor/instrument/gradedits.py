"""Gradients changed in place by code graddoctor does not watch.

``p.grad /= k``, a hand-written unscale or clip, or a manual all-reduce change a ``.grad``
between the last backward and the step. graddoctor notices it from the grad tensor's identity
and version counter (never its values): right before each optimizer step, and before each clip.
Rules use it to stay quiet where the user rescaled gradients by hand.
"""

from __future__ import annotations

from torch.optim.optimizer import register_optimizer_step_pre_hook

from .recorder import Recorder


def edited_pids(rec: Recorder, pids) -> list[int]:
    """Params whose ``.grad`` is no longer what graddoctor last saw, nor what zero_grad left."""
    known, zeroed = rec.known_grad, rec.zeroed_grad
    return [pid for pid, state in rec.grad_states(pids)
            if state != known.get(pid) and state != zeroed.get(pid)]


class GradEditWatcher:
    """Emits ``grad_edit`` (opt, params) before a step whose gradients were edited by hand."""

    def __init__(self, rec: Recorder):
        self.rec = rec

    def _pre_step(self, optimizer, args, kwargs) -> None:
        rec = self.rec
        if rec.in_step is not None or (len(args) > 1 and args[1] is not None) or kwargs.get("closure"):
            return  # L-BFGS-style closures recompute the gradients themselves
        try:
            opt = rec.optimizer_id(optimizer)
            edited = edited_pids(rec, rec.opt_params.get(opt, ()))
            if edited:
                rec.emit("grad_edit", rec.here(2), opt=opt, params=edited)
        except Exception as exc:
            rec.internal_error("optimizer step (gradient edits)", exc)

    def install(self, patcher) -> None:
        patcher.handle(register_optimizer_step_pre_hook(self._pre_step))
