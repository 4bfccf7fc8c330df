"""Importance ratios and clipped surrogates of policy-gradient losses (PPO, TRPO-like) that cut
or flip the policy's gradient: ``ratio-gradient-lost`` and ``surrogate-minimised``.

A ratio ``exp(logp - old_logp)`` (or ``p / p_old``) is meant to carry the gradient of the
current policy's log-probability (the numerator) and none of the old one's (the denominator, a
constant from the rollout). Three ways it does not, each an invariant of the loss's graph:

* **cancels** — numerator and denominator are one value (``old_logp = logp``, not a detached
  copy from the rollout): the ratio is identically 1 and its gradient exactly 0, so the clipped
  objective gives the policy no gradient (an entropy bonus alone trains it).
* **denominator** — the subtracted log-probability is another evaluation of the same
  distribution at the same actions that carries gradient into the parameters the numerator
  reaches (the rollout's log-probability kept with its graph): at the parameters it was taken
  at, its gradient is the numerator's, and the ratio's gradient is again 0.
* **inverted** — only the subtracted side carries gradient (``exp(old_logp - logp)``,
  ``p_old / p``): the policy is pushed away from the actions the advantage rewards. A logged
  propensity divided by a probability gathered from a ``softmax`` (an off-policy bandit's
  ``propensity / probs.gather(1, a)``) is the same fault.

The clipped surrogate is PPO's pessimistic bound: ``min(r * A, clip(r) * A)`` maximised, which
is ``-min(...)`` or ``max(-r * A, -clip(r) * A)`` minimised. A ``min`` of such a pair reached
by the minimised loss with a positive sign (``loss = torch.min(surr1, surr2).mean()``) or a
``max`` reached with a negative sign minimises the bound: the sign is flipped, or the bound is
the optimistic one (**minimised**).

``log_prob`` of ``torch.distributions``' classes is wrapped: each call with a result that needs
a gradient notes its autograd node with its class, its line and its value (the actions: the
tensor's storage and shape when it needs no gradient). Token log-probabilities of a language
model's policy (PPO, GRPO on tokens), ``log_softmax(logits).gather(-1, tokens)``, are noted the
same way: ``torch.gather`` and ``Tensor.gather`` are wrapped, and a result whose input was made
by ``log_softmax`` (directly or past a view) is noted as ``log_softmax`` with the index as its
value, until ``_GATHER_CALLS`` such calls were noted (nothing after them); a gather of a
``softmax`` output is noted as ``softmax`` (a probability, the divisor of a quotient). At the first ``_LOOKED`` backwards of
each backward line that follow such a note (``describe_loss``), the loss's graph is walked
(``_NODES`` nodes) for ``exp`` and quotient nodes and the linear top (``lossterms.signed_walk``)
for ``minimum``/``maximum`` nodes; a fault makes a ``ratio_fault`` aside event at the
numerator's ``log_prob`` call (the one with gradient), once per fault.
"""

from __future__ import annotations

import inspect

import torch
import torch.distributions as D

from .. import events as ev
from .graphpaths import nearest, packed, reached
from .inlinable import watched, watched_result
from .lossterms import PerLine, signed_walk
from .recorder import Recorder

_LOOKED = 3  # backwards of each line looked at
_LINES = 16  # backward lines looked at, at most
_NODES = 20000  # nodes of the loss's graph walked (and below each side of a ratio)
_TOP = 256  # nodes of the linear top walked for a min / max
_NEAR = 6  # levels below a side searched for a noted log-probability
_NOTED = 4096  # log-probabilities noted at most between two backwards
_SAME = 8  # levels compared when two nodes are tested for the same value
_GATHER_CALLS = 256  # gathers of log_softmax outputs noted, at most (the first ones)
# ops that keep a value as it is (the same numbers, laid out again)
_IDENTITY = ("ViewBackward", "ReshapeAlias", "UnsafeViewBackward", "CloneBackward",
             "ToCopyBackward", "AliasBackward", "SqueezeBackward", "UnsqueezeBackward",
             "ExpandBackward", "PermuteBackward", "TransposeBackward")
_CLAMPS = ("ClampBackward", "ClampMinBackward", "ClampMaxBackward", "HardtanhBackward")


def _classes() -> list[type]:
    return [value for value in vars(D).values()
            if inspect.isclass(value) and issubclass(value, D.Distribution)
            and "log_prob" in vars(value) and value is not D.Distribution]


def _strip(node):
    """``node`` past the ops that keep its values (views, clones, dtype copies)."""
    for _ in range(16):
        if node is None or not type(node).__name__.startswith(_IDENTITY):
            return node
        children = [child for child, _ in node.next_functions if child is not None]
        if len(children) != 1:
            return node
        node = children[0]
    return node


def _attrs(node) -> dict:
    """A node's saved non-tensor arguments (dims, exponents, alphas): part of its identity."""
    out = {}
    for name in dir(node):
        if name.startswith("_saved_") and not name.endswith("_raw") and not packed(node, name):
            try:
                value = getattr(node, name)
            except Exception:
                continue
            if isinstance(value, torch.Tensor):
                out[name] = (value.data_ptr(), tuple(value.shape), value.stride())
            elif isinstance(value, (int, float, bool, str, tuple, type(None))):
                out[name] = value
    return out


def same(a, b, depth: int = _SAME) -> bool:
    """Whether two autograd nodes compute one value: the same node, or the same op with the same
    arguments over inputs that are the same (up to ``depth`` levels)."""
    a, b = _strip(a), _strip(b)
    if a is b:
        return a is not None
    if a is None or b is None or depth <= 0 or type(a) is not type(b):
        return False
    if hasattr(a, "variable") or len(a.next_functions) != len(b.next_functions):
        return False
    for (ca, na), (cb, nb) in zip(a.next_functions, b.next_functions):
        if (ca is None) != (cb is None) or na != nb:
            return False
        if ca is not None and not same(ca, cb, depth - 1):
            return False
    try:
        return _attrs(a) == _attrs(b)
    except Exception:
        return False


def _difference(node):
    """``(plus, minus, constant_minuend)`` when ``node`` (past views) is ``a - b``, ``-(a - b)``
    or ``a + b``...: the two sides of a log-space difference (None: a constant tensor); else
    None. ``constant_minuend``: the left side is a constant tensor (``old - logp``), not a
    negation of one value (``-logp``)."""
    node = _strip(node)
    flip = False
    while node is not None and type(node).__name__ == "NegBackward0":
        flip = not flip
        node = _strip(node.next_functions[0][0])
    if node is None or type(node).__name__ != "SubBackward0":
        return None
    alpha = getattr(node, "_saved_alpha", 1)
    if not isinstance(alpha, (int, float)) or alpha != 1:
        return None
    (left, _), (right, _) = node.next_functions
    if flip:
        return right, left, right is None
    return left, right, left is None


class RatioWatcher:
    def __init__(self, rec: Recorder, owned):
        self.rec = rec
        self.owned = owned  # OptimizerWatcher.owned_pids(): a read-only live view
        self._noted: dict = {}  # autograd node of a log_prob -> (class, Location, value key)
        self._lines = PerLine(_LOOKED, _LINES)
        self._done: set = set()  # faults recorded
        self._calls: list = []
        self._gathers = 0  # gathers of log_softmax outputs noted so far

    # -- the wrapped call --------------------------------------------------------------------
    def log_prob(self, dist, value, result) -> None:
        node = getattr(result, "grad_fn", None)
        if node is None or len(self._noted) >= _NOTED or len(self._done) >= 4:
            return
        key = None
        if isinstance(value, torch.Tensor) and not value.requires_grad:
            key = (value.data_ptr(), tuple(value.shape), value.dtype)
        self._noted[node] = (type(dist).__name__, self.rec.here(), key)

    def gathered(self, source, index, result) -> None:
        """A ``gather`` of ``source`` at ``index``: noted as a token log-probability when
        ``source`` was made by ``log_softmax`` (past views) and the result needs a gradient."""
        node = getattr(result, "grad_fn", None)
        made = _strip(getattr(source, "grad_fn", None))
        if node is None or made is None:
            return
        kind = type(made).__name__
        if kind.startswith("LogSoftmaxBackward"):
            kind = "log_softmax"
        elif kind.startswith("SoftmaxBackward"):
            kind = "softmax"  # a probability: an importance weight's side written p / p_old
        else:
            return
        if len(self._noted) >= _NOTED or len(self._done) >= 4:
            return
        self._gathers += 1
        key = None
        if isinstance(index, torch.Tensor) and not index.requires_grad:
            key = (index.data_ptr(), tuple(index.shape), index.dtype)
        self._noted[node] = (kind, self.rec.here(), key)

    # -- DESCRIBE_LOSS -----------------------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        if not self._noted:
            return {}
        try:
            loc = self.rec.here()
            if self._lines.admit(loc):
                self._judge(tensors)
        except Exception as exc:
            self.rec.internal_error("ratio_fault", exc)
        finally:
            self._noted = {}
            self._calls.clear()  # a call that raised left its entry
        return {}

    def _near(self, node):
        """The noted log-probability a few levels below ``node`` (the nearest), or None."""
        return nearest(node, self._noted, _NEAR)

    def _pids(self, node) -> set:
        found = reached(node, _NODES, truncate=True)
        if not found:
            return set()
        tensors, owned = self.rec.tensors, self.owned
        return {pid for i in found[1] if (pid := tensors.number.get(i)) is not None
                and pid in owned and id(tensors.refs[pid]()) == i}

    def _sides(self, node):
        """``(plus, minus, constant_minuend)`` of a ratio node: ``exp(a - b)`` or ``exp(a) /
        exp(b)`` (``a / b`` of two probabilities); else None."""
        name = type(node).__name__
        if name == "ExpBackward0":
            return _difference(node.next_functions[0][0])
        if name == "DivBackward0":
            (top, _), (bottom, _) = node.next_functions
            top, bottom = _strip(top), _strip(bottom)
            if top is not None and bottom is not None and same(top, bottom):
                return top, bottom, False
            if top is None and bottom is not None and type(bottom).__name__ == "GatherBackward0" \
                    and (noted := self._noted.get(bottom)) is not None and noted[0] == "softmax":
                return None, bottom, True  # p_logged / p: a probability gathered from a softmax
            exps = [n is None or type(n).__name__ == "ExpBackward0" for n in (top, bottom)]
            if not all(exps):
                return None
            plus = None if top is None else top.next_functions[0][0]
            minus = None if bottom is None else bottom.next_functions[0][0]
            return plus, minus, top is None
        return None

    def _ratio_fault(self, node):
        """``(fault, noted log_prob, pids)`` of a ratio node, or None."""
        sides = self._sides(node)
        if sides is None:
            return None
        plus, minus, constant_minuend = sides
        if plus is not None and minus is not None and same(plus, minus):
            noted = self._near(plus)
            pids = self._pids(plus)
            return ("cancels", noted, pids) if pids else None
        if plus is not None and minus is not None:
            top, bottom = self._near(plus), self._near(minus)
            if top is None or bottom is None or top[2] is None or top[2] != bottom[2] \
                    or top[0] != bottom[0]:
                return None  # not two evaluations of one distribution at the same actions
            common = self._pids(plus) & self._pids(minus)
            return ("denominator", bottom, common) if common else None
        if plus is None and minus is not None and constant_minuend:
            bottom = self._near(minus)
            if bottom is None or bottom[2] is None or bottom[0] == "log_softmax":
                # token log-probabilities: exp(ref_logp - logp) is also the k3 estimator of a
                # KL penalty against a frozen reference (GRPO), not a ratio
                return None
            pids = self._pids(minus)
            return ("inverted", bottom, pids) if pids else None
        return None

    def _clipped_pair(self, node):
        """The ratio node of a ``min``/``max`` of ``r * w`` and ``clamp(r) * w``, or None."""
        sides = [_strip(child) for child, _ in node.next_functions]
        if len(sides) != 2 or any(s is None or type(s).__name__ != "MulBackward0" for s in sides):
            return None
        factors = []
        for s in sides:
            computed = [_strip(child) for child, _ in s.next_functions if child is not None]
            factors.append(computed)
        for ratio in factors[0]:
            for other in factors[1]:
                for plain, clamped in ((ratio, other), (other, ratio)):
                    if clamped is not None and type(clamped).__name__.startswith(_CLAMPS) \
                            and same(clamped.next_functions[0][0], plain) \
                            and self._sides(plain) is not None:
                        return plain
        return None

    def _judge(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        for tensor in items:
            root = getattr(tensor, "grad_fn", None) if isinstance(tensor, torch.Tensor) else None
            if root is None:
                continue
            self._judge_ratios(root)
            self._judge_surrogate(root)

    def _emit(self, fault, noted, pids) -> None:
        if fault in self._done or not pids or noted is None:
            return  # a ratio of no torch.distributions log_prob: its line is not known
        self._done.add(fault)
        cls, where, _ = noted
        self.rec.emit_aside(ev.ratio_fault(fault=fault, dist=cls, params=sorted(pids)[:64],
                                           backward=_line_of(self.rec.here())),
                            where if where is not None else self.rec.here())

    def _judge_ratios(self, root) -> None:
        seen: set = set()
        stack = [root]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if len(seen) > _NODES:
                return
            stack.extend(child for child, _ in node.next_functions if child is not None)
            if type(node).__name__ in ("ExpBackward0", "DivBackward0"):
                found = self._ratio_fault(node)
                if found is not None:
                    self._emit(*found)

    def _judge_surrogate(self, root) -> None:
        found = []

        def visit(node, sign, name, children) -> bool:
            if name in ("MinimumBackward0", "MaximumBackward0"):
                if (name == "MinimumBackward0") == (sign > 0):
                    ratio = self._clipped_pair(node)
                    if ratio is not None:
                        found.append(ratio)
                return True
            return False

        signed_walk(root, _TOP, visit)
        for ratio in found[:1]:
            sides = self._sides(ratio)
            side = sides[0] if sides[0] is not None else sides[1]
            noted = self._near(side) if side is not None else None
            self._emit("minimised", noted, self._pids(ratio))

    # -- install -----------------------------------------------------------------------------
    def install(self, patcher) -> None:
        watcher = self
        calls: list = []  # (distribution, value) of the log_prob calls running, innermost last

        # plain functions: Dynamo wraps no bound method in a closure; torch.compile inlines the
        # wrappers and traces only the original (inlinable.py)
        def after(result) -> None:
            call = calls.pop() if calls else None
            if call is None:
                return
            try:
                watcher.log_prob(call[0], call[1], result)
            except Exception as exc:
                watcher.rec.internal_error("ratio_fault", exc)

        def enter(args, kwargs) -> None:
            if len(calls) < 64:
                calls.append((args[0] if args else None,
                              args[1] if len(args) > 1 else kwargs.get("value")))

        for cls in _classes():
            patcher.patch(cls, "log_prob", watched(watched_result(vars(cls)["log_prob"], after), enter))
        self._calls = calls

        gathers: list = []  # (source, index) of the gather calls running, innermost last

        def gather_enter(args, kwargs) -> None:
            if watcher._gathers < _GATHER_CALLS and len(gathers) < 64 and torch.is_grad_enabled():
                source = args[0] if args else kwargs.get("input")
                if getattr(source, "grad_fn", None) is not None:
                    gathers.append((source, args[2] if len(args) > 2 else kwargs.get("index")))
                    return
            gathers.append(None)

        def gather_after(result) -> None:
            call = gathers.pop() if gathers else None
            if call is None:
                return
            try:
                watcher.gathered(call[0], call[1], result)
            except Exception as exc:
                watcher.rec.internal_error("ratio_fault", exc)

        for owner in (torch.Tensor, torch):
            patcher.patch(owner, "gather", watched(watched_result(owner.gather, gather_after), gather_enter))


def _line_of(loc) -> int | None:
    return getattr(loc, "line", None)
