"""Backward calls and which parameters each one writes.

``Tensor.backward`` / ``torch.autograd.backward`` are wrapped: before the original runs we
walk the graph once (which leaves will it write? any that are not parameters, like FGSM's
input?) and give new leaves a gradient pre-hook; the hook tells, per parameter, whether the
gradient arrives on a cleared ``.grad`` (fresh) or onto the one we last saw (accumulated).
After the original returns we read each written ``.grad`` once and emit one ``backward`` event.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.parameter import is_lazy

from .recorder import Recorder

FRESH, ACCUMULATED, CLEARED_OUTSIDE = 0, 1, 2


@dataclass
class BackwardContext:
    bid: int
    state: dict = field(default_factory=dict)  # pid -> FRESH | ACCUMULATED | CLEARED_OUTSIDE
    extra_leaves: int = 0


# AccumulateGrad nodes are where a backward writes into a leaf's .grad
_ACCUMULATE_GRAD = getattr(getattr(torch._C, "_functions", None), "AccumulateGrad", None)


def _leaves(tensors, inputs) -> list:
    """Leaf tensors the backward will accumulate into (graph walk over ``next_functions``).

    Runs once per backward over every graph node, so it is kept lean: nodes go into ``seen``
    themselves (identity hash, no ``id()`` calls) and AccumulateGrad is told by its type, not
    by ``getattr(node, "variable", None)``, which raises and catches on every other node.
    """
    if inputs is not None:
        items = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
        return [t for t in items if isinstance(t, torch.Tensor) and t.is_leaf]
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    leaves = []
    seen = set()
    stack = []
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        if t.grad_fn is not None:
            stack.append(t.grad_fn)
        elif t.requires_grad:  # backward on a leaf itself
            leaves.append(t)
    accumulate_grad = _ACCUMULATE_GRAD
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if type(node) is accumulate_grad or (accumulate_grad is None and hasattr(node, "variable")):
            leaves.append(node.variable)
            continue
        for child, _ in node.next_functions:
            if child is not None and child not in seen:
                stack.append(child)
    return leaves


class BackwardWatcher:
    def __init__(self, rec: Recorder, owned: set[int]):
        self.rec = rec
        self.owned = owned  # id() of tensors some optimizer owns (kept by OptimizerWatcher)
        self.cpu_checks = True
        self._lazy: list[int] = []  # pids of UninitializedParameters waiting for their hook
        self.loss_describers: list = []  # callables(tensors) -> dict, added by other watchers
        rec.on_param_tracked.append(self._install_hook)

    # -- per-parameter hook (hot path: once per parameter per backward) ---------------
    def _install_hook(self, pid: int, tensor) -> None:
        rec = self.rec
        if is_lazy(tensor):  # a LazyModule's parameter takes hooks only once materialised
            self._lazy.append(pid)
            return
        ref = rec._tensor[pid]
        known, zeroed = rec.known_grad, rec.zeroed_grad

        def grad_pre_hook(_grad):
            ctx = rec.current_backward
            if ctx is None or pid in ctx.state:  # torch.autograd.grad, or a 2nd visit (checkpoint)
                return None
            try:
                grad = ref().grad
                if grad is None:
                    ctx.state[pid] = FRESH
                else:
                    key = (id(grad), grad._version)
                    if key == known.get(pid):
                        ctx.state[pid] = ACCUMULATED
                    elif key == zeroed.get(pid):
                        ctx.state[pid] = FRESH
                    else:
                        ctx.state[pid] = self._judge_changed(grad)
            except Exception as exc:
                rec.internal_error("gradient hook", exc)
            return None

        rec.hook_handles.append(tensor.register_hook(grad_pre_hook))

    def _judge_changed(self, grad) -> int:
        """The grad was changed behind our back (``p.grad.zero_()``, ``p.grad = zeros``,
        ``p.grad /= k``). On CPU look whether it is all zeros; on an accelerator we do not
        synchronise and assume a manual clear (the cautious verdict: no false alarm)."""
        if grad.device.type == "cpu" and self.cpu_checks:
            return CLEARED_OUTSIDE if not bool(grad.any()) else ACCUMULATED
        return CLEARED_OUTSIDE

    # -- wrappers ------------------------------------------------------------------------
    def _install_materialised(self) -> None:
        waiting, self._lazy = self._lazy, []
        for pid in waiting:
            tensor = self.rec.tensor(pid)
            if tensor is not None:
                self._install_hook(pid, tensor)  # still lazy: goes back on the list

    def begin(self, tensors, inputs) -> BackwardContext:
        rec = self.rec
        ctx = BackwardContext(bid=rec.backward_calls)
        rec.backward_calls += 1
        if self._lazy:
            self._install_materialised()
        for leaf in _leaves(tensors, inputs):
            if rec.pid(leaf) is not None:
                continue
            if isinstance(leaf, torch.nn.Parameter) or id(leaf) in self.owned:
                rec.track(leaf)
            else:
                ctx.extra_leaves += 1  # e.g. FGSM: the input's gradient is the point
        return ctx

    def end(self, ctx: BackwardContext, loc, extra: dict) -> None:
        rec = self.rec
        fresh, accumulated, cleared = [], [], []
        zeroed = rec.zeroed_grad
        for pid, state in ctx.state.items():
            (fresh if state == FRESH else accumulated if state == ACCUMULATED else cleared).append(pid)
            if zeroed:
                zeroed.pop(pid, None)
        rec.known_grad.update(rec.grad_states(ctx.state))
        rec.emit(
            "backward", loc, bid=ctx.bid, fresh=fresh, accumulated=accumulated,
            cleared_outside=cleared, extra_leaves=ctx.extra_leaves, in_step=rec.in_step, **extra,
        )

    def wrap(self, original, takes_self: bool):
        watcher = self
        rec = self.rec

        @functools.wraps(original)
        def backward(*args, **kwargs):
            if rec.current_backward is not None:  # nested: reentrant checkpointing, Tensor->autograd
                return original(*args, **kwargs)
            rec.maybe_stop()
            ctx = None
            try:
                tensors = args[0] if args else kwargs.get("tensors", kwargs.get("self"))
                inputs = kwargs.get("inputs")
                inputs_at = 4 if takes_self else 5  # Tensor.backward / autograd.backward
                if inputs is None and len(args) > inputs_at:
                    inputs = args[inputs_at]
                ctx = watcher.begin(tensors, inputs)
                loc = rec.here(2)
                extra = watcher.describe_loss(tensors)
            except Exception as exc:
                rec.internal_error("backward (before)", exc)
                ctx, loc, extra = None, None, {}
            rec.current_backward = ctx
            try:
                return original(*args, **kwargs)
            finally:
                rec.current_backward = None
                if ctx is not None:
                    try:
                        watcher.end(ctx, loc, extra)
                    except Exception as exc:
                        rec.internal_error("backward (after)", exc)

        return backward

    def describe_loss(self, tensors) -> dict:
        """Facts about the backward'ed loss that other watchers add (AMP scale, 1/k factor)."""
        extra: dict = {"scaled": False, "scale": None, "loss_scale_factor": None}
        for describe in self.loss_describers:
            extra.update(describe(tensors))
        return extra

    def install(self, patcher) -> None:
        patcher.patch(torch.Tensor, "backward", self.wrap(torch.Tensor.backward, takes_self=True))
        patcher.patch(torch.autograd, "backward", self.wrap(torch.autograd.backward, takes_self=False))
