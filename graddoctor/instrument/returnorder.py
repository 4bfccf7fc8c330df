"""Per-step policy-gradient weights (discounted returns) in the reverse of the episode's order:
``log_prob_t`` multiplied by ``G_{T-1-t}``.

A return computed by the backward recursion ``G = r + gamma * G`` and appended as it goes comes
out last step first; unless the list is reversed again, ``zip(log_probs, returns)`` (or
``torch.stack(log_probs) * returns``) pairs the first action with the last step's return.
Nothing fails: the policy learns from returns that belong to other steps.

How it is seen: ``log_prob`` of ``torch.distributions``' classes is wrapped; each result's
autograd node is noted with its call's rank since the last backward (its step in the episode).
At the first ``_WINDOWS`` backwards that follow log-probabilities, the loss's graph is walked for
products of a noted log-probability (alone, negated, or a ``stack``/``cat`` of them) and a
weight without gradient; the weights put in the steps' order make a sequence ``w``. A return
sequence satisfies ``w_t - gamma * w_{t+1} = r_t`` (an affine normalisation,
``(w - mean) / std``, keeps this up to a scale and a shift of ``r``). For gammas in a grid of
common values and two fitted to ``w`` itself, the implied rewards are computed in both
directions: rewards of at most three values (a reward per step, a cost, a sparse success) in the
reversed direction and in no gamma in the episode's direction is recorded as a
``returns_order`` aside event at the backward's line, with the name the script's frames give
the weights' tensor. Returns from a reward with many values (a continuous reward, GAE
advantages made of a critic's values) say nothing in either direction and are left alone.
"""

from __future__ import annotations

import inspect
import sys

import torch
import torch.distributions as D

from .. import events as ev
from .graphpaths import saved
from .inlinable import watched_result
from .lossterms import loss_roots
from .recorder import Recorder
from .topics import DESCRIBE_LOSS

_LISTEN = 8  # backwards listened to at most
_WINDOWS = 3  # backwards with log-probabilities judged
_NODES = 20000  # nodes walked from a loss
_NOTED = 4096  # log-probability nodes noted between two backwards
_MIN_STEPS = 8  # steps a sequence must have
_MAX_STEPS = 4096
_GAMMAS = (0.5, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999, 1.0)
_VALUES = 3  # distinct implied rewards that make a reward "simple"
_UNARY = {"NegBackward0", "SqueezeBackward0", "SqueezeBackward1", "UnsqueezeBackward0",
          "ViewBackward0", "ReshapeAliasBackward0", "CloneBackward0", "MulBackward1",
          "DivBackward1", "ToCopyBackward0"}


def _distributions() -> list[type]:
    return [value for value in vars(D).values()
            if inspect.isclass(value) and issubclass(value, D.Distribution)
            and "log_prob" in vars(value) and value is not D.Distribution]


def _inputs(node) -> list:
    return [child for child, _ in node.next_functions if child is not None]


def _strip(node, noted):
    """Below negations, reshapes and constant factors, down to a noted log-probability."""
    for _ in range(6):
        if node is None or node in noted or type(node).__name__ not in _UNARY:
            return node
        kids = _inputs(node)
        if len(kids) != 1:
            return node
        node = kids[0]
    return node


def _clusters(values: list, tol: float) -> list:
    """The sizes of the groups of ``values`` no wider than ``tol`` (each from its smallest value
    on: a slow drift is never one group), largest first."""
    values = sorted(values)
    sizes, start, size = [], values[0], 0
    for v in values:
        if v - start > tol:
            sizes.append(size)
            start, size = v, 0
        size += 1
    sizes.append(size)
    return sorted(sizes, reverse=True)


def _gammas(seq: list) -> list:
    """The grid, and two gammas fitted to ``seq`` read as returns of a constant reward: the
    regression of ``w_t`` on ``w_{t+1}``, the median ratio of consecutive differences."""
    out = list(_GAMMAS)
    x, y = seq[1:], seq[:-1]
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    var = sum((a - mx) ** 2 for a in x)
    if var > 0:
        out.append(sum((a - mx) * (b - my) for a, b in zip(x, y)) / var)
    diffs = [a - b for a, b in zip(seq, seq[1:])]
    ratios = sorted(d0 / d1 for d0, d1 in zip(diffs, diffs[1:]) if d1 != 0)
    if ratios:
        out.append(ratios[len(ratios) // 2])
    return [g for g in out if 0.0 < g <= 1.0 + 1e-9]


def simple_rewards(seq: list) -> float | None:
    """The gamma under which ``seq`` reads as discounted returns (``w_t - g * w_{t+1}``) of a
    reward with at most ``_VALUES`` values on nearly every step (an episode boundary or two
    aside), or None."""
    scale = max(abs(v) for v in seq)
    if scale == 0:
        return None
    tol = 2e-4 * scale + 1e-9
    steps = len(seq) - 1
    allowed = max(1, steps // 10)
    for g in _gammas(seq):
        implied = [a - g * b for a, b in zip(seq, seq[1:])]
        sizes = _clusters(implied, tol)
        if steps - sum(sizes[:_VALUES]) <= allowed and sizes[0] >= steps // 3:
            return g
    return None


def judge(seq: list) -> float | None:
    """The gamma of the reversed reading when ``seq`` reads as returns backwards and not
    forwards; None otherwise."""
    if len(seq) < _MIN_STEPS or max(seq) - min(seq) <= 1e-6 * max(abs(v) for v in seq):
        return None
    if simple_rewards(seq) is not None:
        return None  # returns in the episode's order (or an order nothing tells)
    return simple_rewards(seq[::-1])


class ReturnOrderWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.active = True
        self._noted: dict = {}  # log-probability node -> its rank since the last backward
        self._judged = 0
        self._backwards = 0
        self._done: set = set()

    def _note(self, result) -> None:
        if not self.active or len(self._noted) >= _NOTED:
            return
        node = getattr(result, "grad_fn", None)
        if node is not None and node not in self._noted:
            self._noted[node] = len(self._noted)

    def describe_loss(self, tensors) -> dict:
        """Judges the backwards after noted calls; off the backwards after ``_WINDOWS`` judged
        or ``_LISTEN`` in all."""
        self._backwards += 1
        noted, self._noted = self._noted, {}
        try:
            if noted:
                self._judged += 1
                self._judge(tensors, noted)
        except Exception as exc:
            self.rec.internal_error("returns_order", exc)
        if self._judged >= _WINDOWS or self._backwards >= _LISTEN:
            self.active = False
            self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
        return {}

    def _pairs(self, node, noted: dict):
        """``[(position, weight value)]`` of one product of log-probabilities and a weight."""
        kids = _inputs(node)
        if len(kids) != 1:
            return None
        weight = saved(node, "_saved_other")
        if not isinstance(weight, torch.Tensor):
            weight = saved(node, "_saved_self")
        if not isinstance(weight, torch.Tensor) or weight.requires_grad \
                or weight.device.type != "cpu" or not weight.is_floating_point():
            return None
        lp = _strip(kids[0], noted)
        name = type(lp).__name__ if lp is not None else ""
        if lp in noted:
            rank = noted[lp]
            if weight.numel() == 1:
                return [((rank, 0), float(weight.reshape(-1)[0]))], weight
            if weight.dim() == 1 and _MIN_STEPS <= weight.numel() <= _MAX_STEPS:
                return [((rank, i), v) for i, v in enumerate(weight.tolist())], weight
            return None
        if name in ("StackBackward0", "CatBackward0"):
            parts = [_strip(k, noted) for k in _inputs(lp)]
            if not parts or any(p not in noted for p in parts) or weight.numel() != len(parts):
                return None
            return [((noted[p], 0), v) for p, v in zip(parts, weight.reshape(-1).tolist())], weight
        return None

    def _judge(self, tensors, noted: dict) -> None:
        seen: set = set()
        stack = list(loss_roots(tensors))
        pairs: dict = {}
        weights: list = []
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            if len(seen) > _NODES:
                return
            kids = _inputs(node)
            stack.extend(kids)
            if type(node).__name__ == "MulBackward0":
                found = self._pairs(node, noted)
                if found is not None:
                    for position, value in found[0]:
                        pairs[position] = value
                    weights.append(found[1])
        if len(pairs) < _MIN_STEPS:
            return
        seq = [pairs[k] for k in sorted(pairs)]
        gamma = judge(seq)
        if gamma is None:
            return
        loc = self.rec.here()
        if loc is None or loc in self._done:
            return
        self._done.add(loc)
        self.rec.emit_aside(ev.returns_order(steps=len(seq), gamma=round(gamma, 4),
                                             name=self._name(weights)), loc)

    def _name(self, weights: list) -> str | None:
        """The script's name for the weights' tensor (or the tensor they are views of)."""
        wanted = []
        for w in weights:
            base = getattr(w, "_base", None)
            if base is not None:
                wanted.append(base)
            if w.numel() > 1:
                wanted.append(w)
        if not wanted:
            return None
        for depth, frame in enumerate(self.rec.finder.user_frames(sys._getframe(1))):
            if depth >= 2:
                break
            for name, value in list(frame.f_locals.items()):
                if isinstance(value, torch.Tensor) and any(value is w for w in wanted):
                    return name
        return None

    def install(self, patcher) -> None:
        watcher = self

        def note(result) -> None:
            watcher._note(result)

        for cls in _distributions():
            patcher.patch(cls, "log_prob", watched_result(vars(cls)["log_prob"], note))
