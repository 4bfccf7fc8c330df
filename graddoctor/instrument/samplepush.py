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

How, and what it costs: the torch losses in ``_NAMES`` are wrapped until ``_WINDOWS`` backwards
have run (then put back when still the outermost wrapper, else left disabled). A call from the
script with a gradient and an unreduced result (one value or more per sample, CPU, at most
``_MAX_VALUES``) keeps a copy of its values and hooks its gradient. Before each backward
(``DESCRIBE_LOSS``) the loss's graph is walked once (``_NODES`` at most) to count the paths
from the loss to each kept result; in the backward the hook compares the signs with the values (one sort-free
pass: a few reductions). Twice at one line: a ``samples_pushed_up`` aside at the loss call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import events as ev
from .dependency import close_before_compile
from .graphpaths import post_order
from .inlinable import watched_call
from .recorder import Recorder
from .topics import DESCRIBE_LOSS

_WINDOWS = 4  # backwards looked at; the wrappers go at the last one
_NODES = 20000  # graph nodes walked per backward
_KEPT = 32  # per-sample loss results kept between two backwards, at most
_MAX_VALUES = 1 << 16  # values copied per result, at most
_MIN_PUSHED = 2  # samples with a negative gradient, at least
_MIN_SHARE = 0.05  # ... and this share of those with a non-zero gradient
_NEED = 2  # backwards at one line that show it
_PATHS = 16  # paths from the loss to a result counted, at most
_LABEL = "per-sample loss gradient"
_NAMES = ("cross_entropy", "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
          "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "soft_margin_loss",
          "multilabel_soft_margin_loss", "poisson_nll_loss", "gaussian_nll_loss",
          "margin_ranking_loss", "hinge_embedding_loss", "cosine_embedding_loss",
          "triplet_margin_loss", "multi_margin_loss")


class SamplePushWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._open = True
        self._windows = 0
        self._kept: dict = {}  # id(node) -> entry: node, loc, fn, values, handle, consumers
        self._hits: dict = {}  # (path, line) -> backwards that showed it
        self._told: set = set()
        self._wrapped: list = []  # (owner, name, the function replaced, our wrapper)

    def install(self, patcher) -> None:
        for name in _NAMES:
            original = getattr(F, name, None)
            if original is None:
                continue
            wrapper = watched_call(original, self._after_for(name))
            patcher.patch(F, name, wrapper)
            self._wrapped.append((F, name, original, wrapper))
        close_before_compile(patcher, self._close)

    def _after_for(self, fn: str):
        def after(args, kwargs, result) -> None:
            if self._open:
                self._after(fn, result)
        return after

    def _after(self, fn: str, result) -> None:
        if not isinstance(result, torch.Tensor) or result.grad_fn is None or result.dim() == 0:
            return
        try:
            if len(self._kept) >= _KEPT or result.device.type != "cpu" \
                    or not result.is_floating_point() or not 2 <= result.numel() <= _MAX_VALUES:
                return
            node = result.grad_fn
            if id(node) in self._kept:
                return
            loc = self.rec.here()
            if loc is None or (loc.path, loc.line) in self._told:
                return
            entry = {"node": node, "loc": loc, "fn": fn, "consumers": None,
                     "values": result.detach().reshape(-1).float().clone()}
            entry["handle"] = result.register_hook(lambda grad, entry=entry: self._judge(entry, grad))
            self._kept[id(node)] = entry
        except Exception as exc:
            self._open = False
            self.rec.internal_error(_LABEL, exc)

    def describe_loss(self, tensors) -> dict:
        if not self._open:
            return {}
        self._windows += 1
        try:
            # a kept result whose backward already ran (or never will) is let go of
            for key, entry in list(self._kept.items()):
                if entry["consumers"] is not None:
                    self._drop(key)
            if self._kept:
                self._count_consumers(tensors)
        except Exception as exc:
            self.rec.internal_error(_LABEL, exc)
        if self._windows >= _WINDOWS:
            self._close()
        return {}

    def _count_consumers(self, tensors) -> None:
        """How many paths lead from the loss to each kept result (capped): two or more when the
        value is used twice, also past a view (``.squeeze(1)``) that is used twice."""
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            nodes = post_order(root, _NODES)
            if not nodes:
                continue
            paths: dict = {id(root): 1}
            for node in reversed(nodes):  # the root first, each node before its inputs
                here = paths.get(id(node), 0)
                if not here:
                    continue
                for child, _ in node.next_functions:
                    if child is not None:
                        paths[id(child)] = min(paths.get(id(child), 0) + here, _PATHS)
            for key, entry in self._kept.items():
                count = paths.get(key, 0)
                if count:
                    entry["consumers"] = max(entry["consumers"] or 0, count)

    def _judge(self, entry, grad) -> None:
        if not self._open or not entry["consumers"] or entry["consumers"] < 2:
            return
        try:
            values = entry["values"]
            g = grad.detach().reshape(-1).float()
            if g.numel() != values.numel():
                return
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
                above=round(lowest_pushed, 4), consumers=entry["consumers"]), loc)
        except Exception as exc:
            self._open = False
            self.rec.internal_error(_LABEL, exc)

    def _drop(self, key) -> None:
        entry = self._kept.pop(key, None)
        if entry is not None:
            try:
                entry["handle"].remove()
            except Exception:
                pass

    def _close(self) -> None:
        if not self._open:
            return
        self._open = False
        self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
        # the hooks of the last backward have run by the time its describe is over only when the
        # backward is over; a hook left on a kept tensor does nothing once closed
        for key in list(self._kept):
            self._drop(key)
        for owner, name, original, wrapper in self._wrapped:
            try:
                if getattr(owner, name, None) is wrapper:  # another wrapper on top stays
                    setattr(owner, name, original)
            except Exception as exc:
                self.rec.internal_error(_LABEL, exc)
