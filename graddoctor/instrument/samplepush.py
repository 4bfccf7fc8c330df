"""A loss that rises as its hardest samples' base loss rises (hard-samples-pushed-up).

A per-sample loss (``F.cross_entropy(..., reduction="none")`` and the other torch losses) is
usually turned into the training loss by a weighted mean whose weights do not depend on it, or
by a function of it that grows with it: a correct focal loss ``(1 - pt) ** gamma * ce``, a
topk of the hardest, a mean plus a variance penalty. Written ``pt ** gamma * ce``, or with
weights computed from the loss and left attached (``w = torch.exp(-ce)``, ``softmax(-ce / T)``,
``(1 - ce / lam).clamp(min=0)``), the training loss is no longer increasing in the base loss:
above some value, raising a sample's base loss lowers the training loss, so the optimizer pushes
exactly the samples the model gets most wrong further wrong. Nothing fails, and the mean base
loss may even look fine for a while on the easy samples.

The invariant, read from the gradient the backward hands the per-sample loss: its sign is
negative on the samples with the highest base loss (all samples, or every sample above a value
and none below it), on a loss tensor whose value feeds the training loss through two paths or
more (the term and a weight made from it). A gradient whose sign does not follow the base loss
(REINFORCE's advantages times a per-sample cross-entropy), one negative only on the easiest
samples (a mean-plus-variance penalty pulls them up toward the mean; per-sample flooding) and a
loss used once (``-bce(...)``: a subtracted term, ``loss-maximised``'s to judge) are not it.

How, and what it costs: the torch losses in ``_NODES_OF`` get a see-through ``watched`` wrapper
(one frame with the other watchers' wrappers of the same function; after the window its test is
taken out of that frame: ``inlinable.unwatch``). Until ``_WINDOWS`` backwards have run, a call from the script with a gradient,
``reduction="none"`` and a CPU input (at most ``_MAX_VALUES`` values) has its per-sample values
computed once more by torch's own function under ``no_grad`` (losses draw no random numbers).
Before each backward (``DESCRIBE_LOSS``) the loss's graph is walked once (``_NODES`` at most):
the paths from the loss to each node are counted, and the loss node made from a noted input gets
a pre-hook that reads the gradient it receives and compares its signs with the values (a few
reductions). Twice at one line: a ``samples_pushed_up`` aside at the loss call.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from .. import events as ev
from .patcher import check_hook
from .dependency import close_before_compile
from .graphpaths import post_order
from .inlinable import unwatch, watched
from .recorder import Recorder
from .topics import DESCRIBE_LOSS

_WINDOWS = 4  # backwards looked at; the 4th one's describe closes the window
_NODES = 20000  # graph nodes walked per backward
_KEPT = 32  # per-sample loss calls noted between two backwards, at most
_MAX_VALUES = 1 << 16  # values per call, at most
_MIN_PUSHED = 2  # samples with a negative gradient, at least
_MIN_SHARE = 0.05  # ... and this share of those with a non-zero gradient
_NEED = 2  # backwards at one line that show it
_PATHS = 16  # paths from the loss to a node counted, at most
_LABEL = "per-sample loss gradient"
# the losses whose unreduced result is one autograd node of theirs (l1_loss and kl_div are not)
_NODES_OF = {"cross_entropy": "NllLossBackward", "nll_loss": "NllLossBackward",
             "binary_cross_entropy": "BinaryCrossEntropyBackward",
             "binary_cross_entropy_with_logits": "BinaryCrossEntropyWithLogitsBackward",
             "mse_loss": "MseLossBackward", "smooth_l1_loss": "SmoothL1LossBackward",
             "huber_loss": "HuberLossBackward"}


def _reduction_index(original) -> int | None:
    try:
        return list(inspect.signature(original).parameters).index("reduction")
    except (ValueError, TypeError):
        return None


class SamplePushWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._open = True
        self._windows = 0
        self._noted: dict = {}  # id(input's grad_fn) -> entry: input node, fn, loc, values
        self._hooked: list = []  # the entries whose loss node got a pre-hook this backward
        self._hits: dict = {}  # (path, line) -> backwards that showed it
        self._told: set = set()
        self._befores: list = []  # (name, this watcher's before in F.<name>'s wrapper)

    def install(self, patcher) -> None:
        for name in _NODES_OF:
            original = getattr(F, name, None)
            if original is not None:
                before = self._before_for(name, original)
                patcher.patch(F, name, watched(original, before))
                self._befores.append((name, before))
        close_before_compile(patcher, self._close)

    def _before_for(self, fn: str, original):
        index = _reduction_index(original)

        def before(args, kwargs) -> None:
            if self._open:
                self._before(fn, original, index, args, kwargs)
        return before

    def _before(self, fn, original, index, args, kwargs) -> None:
        input = args[0] if args else kwargs.get("input")
        if not isinstance(input, torch.Tensor) or input.grad_fn is None \
                or not torch.is_grad_enabled():
            return
        reduction = kwargs.get("reduction", args[index] if index is not None and len(args) > index else "mean")
        if reduction != "none" or input.device.type != "cpu" or not input.is_floating_point() \
                or input.numel() > _MAX_VALUES or len(self._noted) >= _KEPT:
            return
        try:
            loc = self.rec.here()
            if loc is None or (loc.path, loc.line) in self._told:
                return
            with torch.no_grad():
                values = original(*args, **kwargs)
            if not isinstance(values, torch.Tensor) or values.dim() == 0 or values.numel() < 2:
                return
            self._noted[id(input.grad_fn)] = {"below": input.grad_fn, "fn": fn, "loc": loc,
                                              "values": values.detach().reshape(-1).float()}
        except Exception as exc:
            self._open = False
            self.rec.internal_error(_LABEL, exc)

    def describe_loss(self, tensors) -> dict:
        if not self._open:
            return {}
        self._windows += 1
        try:
            for entry in self._hooked:  # the previous backward's: run by now, or never
                entry["handle"].remove()
            self._hooked = []
            noted, self._noted = self._noted, {}
            if noted:
                self._hook_losses(tensors, noted)
        except Exception as exc:
            self.rec.internal_error(_LABEL, exc)
        if self._windows >= _WINDOWS:
            self._close()
        return {}

    def _hook_losses(self, tensors, noted: dict) -> None:
        """Each loss node made from a noted input, with the number of paths from the loss to
        it (two or more: its value is used twice, also past a view used twice), gets a pre-hook
        that reads the gradient it receives."""
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            nodes = post_order(root, _NODES)
            if not nodes:
                continue
            paths: dict = {id(root): 1}
            for node in reversed(nodes):  # the root first, each node before its inputs
                here = paths.get(id(node), 0)
                if here:
                    for child, _ in node.next_functions:
                        if child is not None:
                            paths[id(child)] = min(paths.get(id(child), 0) + here, _PATHS)
            for node in nodes:
                entry = self._made_from(node, noted)
                if entry is None or paths.get(id(node), 0) < 2:
                    continue
                entry = dict(entry, paths=paths[id(node)])
                entry["handle"] = check_hook(node.register_prehook(
                    lambda grad_outputs, entry=entry: self._judge(entry, grad_outputs)))
                self._hooked.append(entry)

    @staticmethod
    def _made_from(node, noted: dict):
        name = type(node).__name__
        for fn_node in set(_NODES_OF.values()):
            if name.startswith(fn_node):
                break
        else:
            return None
        children = [c for c, _ in node.next_functions if c is not None]
        if not children:
            return None
        child = children[0]
        entry = noted.get(id(child))
        if entry is None and type(child).__name__.startswith("LogSoftmaxBackward"):
            below = [c for c, _ in child.next_functions if c is not None]
            entry = noted.get(id(below[0])) if below else None
            child = below[0] if below else None
        if entry is None or entry["below"] is not child or not name.startswith(_NODES_OF[entry["fn"]]):
            return None
        return entry

    def _judge(self, entry, grad_outputs) -> None:
        if not self._open:
            return
        try:
            grad = grad_outputs[0] if grad_outputs else None
            values = entry["values"]
            if not isinstance(grad, torch.Tensor) or grad.numel() != values.numel():
                return
            g = grad.detach().reshape(-1).float()
            finite = torch.isfinite(g) & torch.isfinite(values)
            pushed = (g < 0) & finite
            pulled = (g > 0) & finite
            n_pushed, n_pulled = int(pushed.sum()), int(pulled.sum())
            if n_pushed < _MIN_PUSHED or n_pushed < _MIN_SHARE * (n_pushed + n_pulled):
                return
            lowest_pushed = float(values[pushed].min())
            if n_pulled and lowest_pushed < float(values[pulled].max()):
                return  # the sign does not follow the base loss: weights of another origin
            loc = entry["loc"]
            key = (loc.path, loc.line)
            self._hits[key] = self._hits.get(key, 0) + 1
            if self._hits[key] < _NEED or key in self._told:
                return
            self._told.add(key)
            self.rec.emit_aside(ev.samples_pushed_up(
                fn=entry["fn"], samples=n_pushed + n_pulled, pushed=n_pushed,
                above=round(lowest_pushed, 4), consumers=entry["paths"]), loc)
        except Exception as exc:
            self._open = False
            self.rec.internal_error(_LABEL, exc)

    def _close(self) -> None:
        """The window ends: the noted calls are let go of, and this watcher's test is taken
        out of the wrappers it shares with the other watchers of the same functions."""
        if not self._open:
            return
        self._open = False
        self._noted = {}
        self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
        for name, before in self._befores:
            try:
                unwatch(F, name, before)
            except Exception as exc:
                self.rec.internal_error(_LABEL, exc)
