"""Backward calls and which parameters each one writes.

``Tensor.backward`` / ``torch.autograd.backward`` are wrapped. Before the original runs we walk
the graph once: its AccumulateGrad nodes are exactly the leaves this backward will write. New
parameters among them are tracked; leaves that are not parameters (FGSM's input) are counted.
For each parameter we then read its ``.grad`` once, which tells whether the gradient will
arrive on a cleared ``.grad`` (fresh) or on the one we last saw (accumulated). After the
original returns we read each written ``.grad`` once more and emit one ``backward`` event.

No per-parameter hooks: on the tiny MLP of the overhead benchmark, 20 Python tensor hooks
alone cost about 17 us per step, more than this whole pass. A backward started from inside
another one (reentrant activation checkpointing recomputes a segment and backpropagates it
with ``torch.autograd.backward``) is walked the same way, so the parameters of a checkpointed
segment, which are not in the outer graph, are read before their gradients arrive.
"""

from __future__ import annotations

import functools
import torch

from .recorder import Recorder

FRESH, ACCUMULATED, CLEARED_OUTSIDE = 0, 1, 2


class BackwardContext:
    __slots__ = ("bid", "state", "extra_leaves", "root")

    def __init__(self, bid: int, state: dict | None = None, root=None):
        self.bid = bid
        self.state: dict = {} if state is None else state  # pid -> FRESH | ACCUMULATED | CLEARED_OUTSIDE
        self.extra_leaves = 0
        self.root = root  # the tensors the outermost call was given (told apart from nested calls)


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
            if t.grad_fn not in seen:
                seen.add(t.grad_fn)
                stack.append(t.grad_fn)
        elif t.requires_grad:  # backward on a leaf itself
            leaves.append(t)
    accumulate_grad = _ACCUMULATE_GRAD
    add, push, pop, found = seen.add, stack.append, stack.pop, leaves.append
    while stack:  # each node is marked seen when first pushed, so it is expanded once
        for child, _ in pop().next_functions:
            if child is None or child in seen:
                continue
            add(child)
            if type(child) is accumulate_grad or (accumulate_grad is None and hasattr(child, "variable")):
                found(child.variable)
            else:
                push(child)
    return leaves


class BackwardWatcher:
    def __init__(self, rec: Recorder, owned: set[int]):
        self.rec = rec
        self.owned = owned  # id() of tensors some optimizer owns (kept by OptimizerWatcher)
        self.cpu_checks = True
        self.loss_describers: list = []  # callables(tensors) -> dict, added by other watchers

    # -- the leaves a backward is about to write (hot path: once per leaf per backward) --------
    def read_before(self, ctx: BackwardContext, leaves) -> None:
        """Track new parameters, count non-parameter leaves, and judge each parameter's
        ``.grad`` as it is before the backward writes it: absent or left by zero_grad (fresh),
        the one we last saw (accumulated), or changed behind our back."""
        rec = self.rec
        state = ctx.state
        pid_of, refs = rec._pid_of, rec._tensor
        known, zeroed = rec.known_grad, rec.zeroed_grad
        for leaf in leaves:
            pid = pid_of.get(id(leaf))
            if pid is None or refs[pid]() is not leaf:  # not tracked yet (rec.pid, inlined)
                if isinstance(leaf, torch.nn.Parameter) or id(leaf) in self.owned:
                    pid = rec.track(leaf)
                else:
                    ctx.extra_leaves += 1  # e.g. FGSM: the input's gradient is the point
                    continue
            if pid in state:  # a checkpointed segment's second pass over the same parameter
                continue
            grad = leaf.grad
            if grad is None:
                state[pid] = FRESH
            else:
                key = (id(grad), grad._version)
                if key == known.get(pid):
                    state[pid] = ACCUMULATED
                elif key == zeroed.get(pid):
                    state[pid] = FRESH
                else:
                    state[pid] = self._judge_changed(grad)

    def _judge_changed(self, grad) -> int:
        """The grad was changed behind our back (``p.grad.zero_()``, ``p.grad = zeros``,
        ``p.grad /= k``). On CPU look whether it is all zeros; on an accelerator we do not
        synchronise and assume a manual clear (the cautious verdict: no false alarm)."""
        if grad.device.type == "cpu" and self.cpu_checks:
            return CLEARED_OUTSIDE if not bool(grad.any()) else ACCUMULATED
        return CLEARED_OUTSIDE

    def begin(self, tensors, inputs) -> BackwardContext:
        rec = self.rec
        ctx = BackwardContext(rec.backward_calls, root=tensors)
        rec.backward_calls += 1
        self.read_before(ctx, _leaves(tensors, inputs))
        return ctx

    def end(self, ctx: BackwardContext, loc, extra: dict) -> None:
        rec = self.rec
        ctx.root = None
        fresh, accumulated, cleared = [], [], []
        refs, known, zeroed = rec._tensor, rec.known_grad, rec.zeroed_grad
        for pid, state in ctx.state.items():  # one pass: sort the verdicts, note each new grad
            (fresh if state == FRESH else accumulated if state == ACCUMULATED else cleared).append(pid)
            if zeroed:
                zeroed.pop(pid, None)
            tensor = refs[pid]()
            grad = tensor.grad if tensor is not None else None
            if grad is not None:
                known[pid] = (id(grad), grad._version)
        rec.emit(
            "backward", loc, bid=ctx.bid, fresh=fresh, accumulated=accumulated,
            cleared_outside=cleared, extra_leaves=ctx.extra_leaves, in_step=rec.in_step, **extra,
        )

    @staticmethod
    def _arguments(args, kwargs, takes_self: bool):
        tensors = args[0] if args else kwargs.get("tensors", kwargs.get("self"))
        inputs = kwargs.get("inputs")
        inputs_at = 4 if takes_self else 5  # Tensor.backward / autograd.backward
        if inputs is None and len(args) > inputs_at:
            inputs = args[inputs_at]
        return tensors, inputs

    def _nested(self, ctx: BackwardContext, args, kwargs, takes_self: bool) -> None:
        """A backward inside a running one. ``Tensor.backward`` handing its own tensor on to
        ``torch.autograd.backward`` is the same call; anything else (reentrant checkpointing)
        writes leaves of its own graph, read here before it runs."""
        tensors, inputs = self._arguments(args, kwargs, takes_self)
        if tensors is ctx.root:
            return
        self.read_before(ctx, _leaves(tensors, inputs))

    def wrap(self, original, takes_self: bool):
        watcher = self
        rec = self.rec

        @functools.wraps(original)
        def backward(*args, **kwargs):
            ctx = rec.current_backward
            if ctx is not None:
                try:
                    watcher._nested(ctx, args, kwargs, takes_self)
                except Exception as exc:
                    rec.internal_error("backward (nested)", exc)
                return original(*args, **kwargs)
            rec.maybe_stop()
            try:
                tensors, inputs = watcher._arguments(args, kwargs, takes_self)
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
