"""Policy-gradient losses whose weight on the log-probability carries gradient into other
parameters: an advantage (or baseline, or return) not detached.

``-(dist.log_prob(action) * (returns - value))`` with ``value`` from the critic: the actor's
loss also trains the critic, along ``log_prob``, which has nothing to do with how well the value
predicts the return. The advantage is meant as a constant weight (``.detach()``, ``.item()``).

``log_prob`` of ``torch.distributions``' classes is wrapped: each call notes its result's
autograd node (one set insertion; the set is emptied at every backward). At the first
``_WINDOWS`` backwards of a line that follow log-probabilities (``describe_loss``), the loss's
graph is walked
(a node budget) for products of two computed factors of which one has a noted log-probability
a few levels down and the other none; the parameters the other factor reaches and the
log-probability does not, among those an optimizer owns, make an ``advantage_grad`` aside
event at the backward's line. A weight that reaches no such parameter is left alone: a
detached advantage, an entropy's ``probs * log_prob`` (the same parameters), a temperature
the optimizer does not own. When both factors hold log-probabilities (variational inference's
score function: ``(log p(x, z) - log q(z | x) - baseline) * log q(z | x)``), the score is the
factor made of log-probabilities alone (sums, differences, views, constant factors) and the
other is its weight; an ``exp`` of one (``q * (log q - log p)``) is no score.
"""

from __future__ import annotations

import inspect

import torch
import torch.distributions as D

from .. import events as ev
from .graphpaths import reached
from .inlinable import watched_result
from .lossterms import loss_roots
from .recorder import Recorder

_WINDOWS = 3  # backwards with log-probabilities judged per backward line
_LINES = 16  # backward lines judged at most
_NODES = 20000  # nodes walked from a loss, and from each factor
_NEAR = 6  # levels below a factor searched for a log-probability (a negation, a sum, a stack)
_NOTED = 4096  # log-probability nodes noted at most between two backwards
_PURE_NODES = 64  # nodes walked to tell a score made of log-probabilities alone
# ops a score keeps a log-probability's meaning through (sums over latents or steps, views)
_PURE_OPS = frozenset({
    "SumBackward0", "SumBackward1", "MeanBackward0", "MeanBackward1", "NegBackward0",
    "AddBackward0", "SubBackward0", "MulBackward0", "MulBackward1", "DivBackward0",
    "DivBackward1", "ViewBackward0",
    "UnsafeViewBackward0", "ReshapeAliasBackward0", "SqueezeBackward0", "SqueezeBackward1",
    "SqueezeBackward2", "UnsqueezeBackward0", "ExpandBackward0", "CloneBackward0",
    "SelectBackward0", "SliceBackward0", "CatBackward0", "StackBackward0", "TBackward0",
    "TransposeBackward0", "PermuteBackward0",
})


def _distributions() -> list[type]:
    """torch's distribution classes that define their own ``log_prob``."""
    found = []
    for value in vars(D).values():
        if inspect.isclass(value) and issubclass(value, D.Distribution) \
                and "log_prob" in vars(value) and value is not D.Distribution:
            found.append(value)
    return found


def _children(node) -> list:
    return [child for child, _ in node.next_functions if child is not None]


class AdvantageGradWatcher:
    def __init__(self, rec: Recorder, owned):
        self.rec = rec
        self.owned = owned  # OptimizerWatcher.owned_pids(): a read-only live view
        self._judged: dict = {}  # backward line -> its backwards judged
        self._noted: set = set()  # autograd nodes of log-probabilities since the last backward
        self._done: set = set()  # backward lines recorded

    def _note(self, result) -> None:
        if len(self._noted) < _NOTED:
            node = getattr(result, "grad_fn", None)
            if node is not None:
                self._noted.add(node)

    def _near(self, node) -> bool:
        level, seen = [node], set()
        for _ in range(_NEAR):
            following = []
            for item in level:
                if item in self._noted:
                    return True
                if item in seen:
                    continue
                seen.add(item)
                following.extend(_children(item))
            level = following
        return False

    def _pure(self, node) -> bool:
        """Whether ``node`` is made of noted log-probabilities alone, through sums, means,
        differences, negations, constant factors and views (a score ``log q(z).sum(-1)``);
        an ``exp`` or a computed factor on the way makes it something else."""
        stack, seen = [node], set()
        while stack:
            item = stack.pop()
            if item in self._noted or item in seen:
                continue
            seen.add(item)
            if len(seen) > _PURE_NODES or type(item).__name__ not in _PURE_OPS:
                return False
            children = _children(item)
            if not children:
                return False
            if type(item).__name__ in ("MulBackward0", "DivBackward0") and len(children) != 1:
                return False  # a product of two computed factors
            stack.extend(children)
        return True

    def describe_loss(self, tensors) -> dict:
        if not self._noted:
            return {}
        try:
            loc = self.rec.here()
            judged = self._judged.get(loc, 0)
            if judged < _WINDOWS and (judged or len(self._judged) < _LINES):
                self._judged[loc] = judged + 1
                self._judge(tensors, loc)
        except Exception as exc:
            self.rec.internal_error("advantage_grad", exc)
        finally:
            self._noted = set()
        return {}

    def _judge(self, tensors, loc) -> None:
        roots = loss_roots(tensors)
        seen: set = set()
        stack = list(roots)
        found: set = set()
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            if len(seen) > _NODES:
                return
            children = _children(node)
            stack.extend(children)
            if type(node).__name__ != "MulBackward0" or len(children) != 2:
                continue
            a, b = children
            near_a, near_b = self._near(a), self._near(b)
            if not near_a and not near_b:
                continue
            if near_a and near_b:
                # A log-probability on both sides: an entropy's p * log p, or a variational
                # learning signal (log p(x, z) - log q(z | x) - baseline) weighting the score
                # log q(z | x). The score is the side made of log-probabilities alone.
                pairs = [(lp, w) for lp, w in ((a, b), (b, a)) if self._pure(lp)]
            else:
                pairs = [(a, b) if near_a else (b, a)]
            for logp, weight in pairs:
                weight_reached, logp_reached = reached(weight, _NODES), reached(logp, _NODES)
                if weight_reached is None or logp_reached is None:
                    continue
                found.update(weight_reached[1] - logp_reached[1])
        if not found:
            return
        tensors_ = self.rec.tensors
        owned = self.owned
        pids = sorted(pid for i in found if (pid := tensors_.number.get(i)) is not None
                      and pid in owned and id(tensors_.refs[pid]()) == i)
        if not pids:
            return
        if loc is None or loc in self._done:
            return
        self._done.add(loc)
        self.rec.emit_aside(ev.advantage_grad(params=pids[:64]), loc)

    def install(self, patcher) -> None:
        watcher = self

        def note(result) -> None:  # a plain function: Dynamo wraps no bound method in a closure
            watcher._note(result)

        for cls in _distributions():
            # torch.compile inlines the wrapper and traces only the original (inlinable.py)
            patcher.patch(cls, "log_prob", watched_result(vars(cls)["log_prob"], note))
