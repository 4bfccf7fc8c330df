"""An entropy bonus with the wrong sign: a policy's entropy minimised instead of maximised.

An actor-critic or PPO loss adds an entropy bonus to keep the policy exploring:
``loss = policy_loss - c * dist.entropy().mean()``. Written with ``+`` (or with the entropy
negated twice), the optimizer drives the policy to a deterministic one as fast as it can: it
stops exploring and collapses on whatever action looked best early. SAC's actor minimises
``alpha * log_prob(a) - Q`` for ``a = dist.rsample()``: ``-alpha * log_prob`` is the same
mistake.

``entropy``, ``rsample`` and ``log_prob`` of ``torch.distributions``' classes are wrapped: each
call notes its result's autograd node (a set insertion; ``rsample``'s result by id, to tell
``dist.log_prob(dist.rsample())``, an estimate of the negative entropy, from a score-function
``log_prob(actions)``). At the first ``_LOOKED`` backwards of each backward line that follow such
a note (``describe_loss``), the loss's linear top is walked from its root with each term's sign
(sums, means, views, negations, constant factors: as in lossterms.py). An entropy reached with a
positive sign (minimised), or a log-probability of the distribution's own reparameterised sample
reached with a negative sign, in a loss that also holds a score-function log-probability
(an entropy) or a reparameterised sample's (SAC), is an ``entropy_sign`` aside at the call that
made the term.
"""

from __future__ import annotations

import inspect
import weakref

import torch
import torch.distributions as D

from .. import events as ev
from .inlinable import watched, watched_result
from .lossterms import PerLine, signed_walk
from .recorder import Recorder

_LOOKED = 3  # backwards of each line looked at
_LINES = 16  # backward lines looked at, at most
_NODES = 256  # nodes of the linear top walked
_GRAPH = 20000  # nodes walked for a score-function log-probability
_NOTED = 4096  # results noted at most between two backwards


def _classes(method: str) -> list[type]:
    return [value for value in vars(D).values()
            if inspect.isclass(value) and issubclass(value, D.Distribution)
            and method in vars(value) and value is not D.Distribution]


def signed(root, targets, limit: int = _NODES) -> dict:
    """``{node: sign}`` for the nodes of ``targets`` the loss's linear top reaches from ``root``
    with a known sign (+1: minimised, -1: maximised; a node reached with both: left out)."""
    found: dict = {}

    def visit(node, sign, name, children) -> bool:
        if node in targets:
            found[node] = sign if found.get(node, sign) == sign else 0.0
            return True
        return False

    signed_walk(root, limit, visit)
    return {node: s for node, s in found.items() if s}


def _reaches(root, nodes, limit: int = _GRAPH) -> bool:
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        if node in nodes:
            return True
        seen.add(node)
        if len(seen) > limit:
            return False
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return False


class EntropySignWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._entropies: dict = {}  # autograd node of an entropy() result -> (class, Location)
        self._own: dict = {}  # ... of a log_prob of the distribution's own rsample -> (class, Location)
        self._scores: set = set()  # ... of the other log_prob results (score function)
        self._samples: dict = {}  # id of an rsample result -> (weak result, weak distribution)
        self._lines = PerLine(_LOOKED, _LINES)
        self._done = False
        self._calls: list = []

    def _clear(self) -> None:
        self._entropies, self._own, self._scores, self._samples = {}, {}, set(), {}

    # -- the wrapped calls -------------------------------------------------------------------
    def _noted(self) -> int:
        return len(self._entropies) + len(self._own) + len(self._scores) + len(self._samples)

    def entropy(self, dist, result) -> None:
        node = getattr(result, "grad_fn", None)
        if node is not None and not self._done and self._noted() < _NOTED:
            self._entropies[node] = (type(dist).__name__, self.rec.here())

    def rsample(self, dist, result) -> None:
        if isinstance(result, torch.Tensor) and result.requires_grad and not self._done \
                and self._noted() < _NOTED:
            self._samples[id(result)] = (weakref.ref(result), weakref.ref(dist))

    def log_prob(self, dist, value, result) -> None:
        node = getattr(result, "grad_fn", None)
        if node is None or self._done or self._noted() >= _NOTED:
            return
        sample = self._samples.get(id(value))
        if sample is not None and sample[0]() is value and sample[1]() is dist:
            self._own[node] = (type(dist).__name__, self.rec.here())
        else:
            self._scores.add(node)

    # -- DESCRIBE_LOSS -----------------------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        if not (self._entropies or self._own):
            self._clear()
            return {}
        try:
            loc = self.rec.here()
            if not self._done and self._lines.admit(loc):
                self._judge(tensors)
        except Exception as exc:
            self.rec.internal_error("entropy_sign", exc)
        finally:
            self._clear()
            self._calls.clear()  # a call that raised left its entry
        return {}

    def _judge(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        for tensor in items:
            root = getattr(tensor, "grad_fn", None) if isinstance(tensor, torch.Tensor) else None
            if root is None:
                continue
            signs = signed(root, set(self._entropies) | set(self._own))
            for node, sign in signs.items():
                if node in self._entropies and sign > 0 and self._scores \
                        and _reaches(root, self._scores):
                    cls, where = self._entropies[node]
                    term = "entropy"
                elif node in self._own and sign < 0:
                    cls, where = self._own[node]
                    term = "log_prob"
                else:
                    continue
                self._done = True
                self.rec.emit_aside(ev.entropy_sign(term=term, dist=cls), where)
                return

    # -- install -----------------------------------------------------------------------------
    def install(self, patcher) -> None:
        watcher = self
        calls: list = []  # (distribution, value) of the log_prob calls running, innermost last

        # plain functions: Dynamo wraps no bound method in a closure; torch.compile inlines the
        # wrappers and traces only the original (inlinable.py)
        def entropy(result) -> None:
            watcher._safely(watcher.entropy, calls.pop() if calls else None, result)

        def rsample(result) -> None:
            watcher._safely(watcher.rsample, calls.pop() if calls else None, result)

        def log_prob(result) -> None:
            call = calls.pop() if calls else None
            if call is not None:
                watcher._safely(watcher.log_prob, call, result)

        def enter(args, kwargs) -> None:
            if len(calls) < 64:
                calls.append((args[0] if args else None,
                              args[1] if len(args) > 1 else kwargs.get("value")))

        for method, after in (("entropy", entropy), ("rsample", rsample), ("log_prob", log_prob)):
            for cls in _classes(method):
                patcher.patch(cls, method, watched(watched_result(vars(cls)[method], after), enter))
        self._calls = calls

    def _safely(self, note, call, result) -> None:
        if call is None:
            return
        dist, value = call
        try:
            if note == self.log_prob:
                note(dist, value, result)
            else:
                note(dist, result)
        except Exception as exc:
            self.rec.internal_error("entropy_sign", exc)
