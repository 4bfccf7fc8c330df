"""A sample without gradient used where the reparameterised one is meant: ``z = q.sample()`` for
``q.rsample()`` (``sample-not-reparameterised``).

``sample()`` of a distribution that has ``rsample()`` returns a value cut from the distribution's
parameters. A VAE's decoder loss on ``q.sample()``, SAC's actor loss ``q(s, pi.sample())``, a
relaxed (Gumbel) policy's ``sample()`` fed to a differentiable critic or world model: the loss
depends on the sample, and the sample on the parameters, but no gradient flows along that path;
the parameters learn only from the other terms (the KL, the entropy), and nothing fails. A
score-function estimator (REINFORCE, A2C, PPO) is the one right use of such a sample in a loss
that trains those parameters: ``log_prob(sample)`` weighted by a per-sample return.

How, and what it costs:

* ``sample`` of ``torch.distributions``' classes is wrapped. An outermost call with gradients on,
  of a distribution with ``has_rsample`` whose parameters (the tensors it holds, and those of
  the distributions it holds) need a gradient, notes its result (an *origin*: class, line, the
  parameters weakly) and opens a window, at most ``_WINDOWS`` in a run and ``_SAMPLES`` origins
  in one.
* In a window a ``TorchFunctionMode`` (pushed on the sampling thread's stack) follows the
  origins: an op with an input derived from one marks its outputs; an op that meets such a
  derived input without gradient and makes an output with gradient is a *use* of that origin
  (its autograd node noted: where the sample enters the loss's graph as a constant). Ops inside
  ``log_prob`` are not followed: the log-probability of a sample is how a score function uses it
  (each ``log_prob`` result is noted with the origin of its value). At ``_OPS`` ops the window
  stops following.
* At the next backward (``DESCRIBE_LOSS``) the mode is popped and the loss's graph walked
  (``_NODES``). An origin is reported when the loss reaches one of its uses, reaches the
  parameters of its distribution (the loss is meant to train it), and holds no score-function
  term of it: no product of a ``log_prob`` of that origin's value and a weight derived from the
  sample or of more than one element. A ``reparam_cut`` aside event at the ``sample()`` call,
  once.

A hand-written reparameterisation is followed the same way: ``torch.randn_like(t)`` of a ``t``
that needs a gradient is an origin (the noise of ``mu + eps * std``), and the window notes
``.detach()`` results of tensors with gradient. The noise multiplied by (a *scale*) or added to (a
*location*, the noise already scaled by a tensor with gradient) such a detached tensor of its own
shape (or a no-gradient tensor on ``t``'s storage: ``mu.detach()`` taken before
``torch.randn_like(mu)``) is a cut at that line; reported when the loss reaches a use of that
noise and trains the detached tensor's parameters.

Nothing is followed under ``no_grad`` (a target, a generation), after ``torch.compile`` is
called (the window closes before it runs), or for distributions without ``rsample``
(``Categorical``'s samples have no reparameterised form: a score function or a relaxation is the
fix, not ``rsample``).
"""

from __future__ import annotations

import weakref

import torch
import torch.distributions as D

from .. import events as ev
from .follow import FollowMode, push_mode, remove_mode, tensors_in, tensors_out, wrap_distribution_calls
from .graphpaths import nearest, reached, saved
from .lossterms import loss_roots
from .recorder import Recorder

_WINDOWS = 8  # windows opened in a run, at most
_SAMPLES = 16  # origins followed in one window
_OPS = 100000  # ops followed in one window
_TAINTED = 65536  # tensors derived from origins kept in one window
_NODES = 20000  # nodes of the loss's graph walked
_NEAR = 6  # levels below a product's factor searched for a log-probability
_DEPTH = 3  # levels of distributions held by a distribution searched for parameters
_DETACH = torch.Tensor.detach
# ops that combine a noise value with a location or a scale (their ``__name__``)
_COMBINE = {"mul": "scale", "__mul__": "scale", "__rmul__": "scale", "add": "location",
            "__add__": "location", "__radd__": "location", "sub": "location", "__sub__": "location",
            "__rsub__": "location"}


def _learnable(dist, depth: int = _DEPTH) -> list:
    """The tensors ``dist`` holds (and the distributions it holds) that need a gradient."""
    found = []
    for value in vars(dist).values():
        if isinstance(value, torch.Tensor):
            if value.requires_grad:
                found.append(value)
        elif isinstance(value, D.Distribution) and depth > 1:
            found.extend(_learnable(value, depth - 1))
    return found


class ReparamWatcher:
    def __init__(self, rec: Recorder, owned):
        self.rec = rec
        self.owned = owned  # OptimizerWatcher.owned_pids(): a read-only live view
        self.following = False  # the mode marks derived values
        self.inside = 0  # log_prob / sample calls running (their ops are not followed)
        self._mode: FollowMode | None = None
        self._thread: int | None = None
        self._origins: list = []  # [(class or None for noise, Location, [weak parameter])]
        self._detached: dict = {}  # id(a .detach() of a tensor with gradient) -> (weak, source)
        self._cuts: list = []  # (origin, "scale" | "location", source, Location)
        self._tainted: dict = {}  # id(tensor) -> (weak tensor, origin index)
        self._uses: dict = {}  # autograd node -> origin index
        self._scores: dict = {}  # autograd node of a log_prob -> origin index of its value
        self._ops = 0
        self._windows = 0
        self.closed = False  # torch.compile called, or reported: nothing more is noted
        self._calls: list = []

    # -- the wrapped calls -------------------------------------------------------------------
    def sampled(self, dist, result) -> None:
        if self.closed or not isinstance(result, torch.Tensor) or not torch.is_grad_enabled() \
                or result.requires_grad or not getattr(dist, "has_rsample", False):
            return
        params = _learnable(dist)
        if params:
            self._note(type(dist).__name__, params, result)

    def noise(self, like, result) -> None:
        """``torch.randn_like(t)`` of a ``t`` that needs a gradient: a reparameterisation's noise
        (``mu + std * eps``), followed for a detached location or scale."""
        if self.closed or not isinstance(result, torch.Tensor) or not torch.is_grad_enabled() \
                or not isinstance(like, torch.Tensor) or not like.requires_grad:
            return
        self._note(None, [like], result)

    def _note(self, cls, params, result) -> None:
        if len(self._origins) >= _SAMPLES or (not self._origins and self._windows >= _WINDOWS):
            return
        if not self._origins:
            if not self._open():
                return
        index = len(self._origins)
        self._origins.append((cls, self.rec.here(), [weakref.ref(p) for p in params]))
        self._tainted[id(result)] = (weakref.ref(result), index)

    def scored(self, value, result) -> None:
        if not self._origins:
            return
        node = getattr(result, "grad_fn", None)
        origin = self._origin_of(value) if isinstance(value, torch.Tensor) else None
        if node is not None and origin is not None:
            self._scores[node] = origin

    def _origin_of(self, tensor) -> int | None:
        entry = self._tainted.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            return entry[1]
        return None

    # -- the mode ----------------------------------------------------------------------------
    def follow(self, func, args, kwargs, out) -> None:
        self._ops += 1
        if self._ops > _OPS:
            self.following = False
            return
        if func is _DETACH and args and isinstance(out, torch.Tensor) and args[0].requires_grad:
            source = args[0].grad_fn if args[0].grad_fn is not None else args[0]
            if len(self._detached) < _TAINTED:
                self._detached[id(out)] = (weakref.ref(out), source)
        origin = cut = None
        for tensor in tensors_in(args, kwargs):
            found = self._origin_of(tensor)
            if found is not None:
                origin = found
                if not tensor.requires_grad:
                    cut = found
                    break
        if origin is None:
            return
        if self._origins[origin][0] is None:
            self._detached_operand(func, args, kwargs, origin)
        tainted, uses = self._tainted, self._uses
        for tensor in tensors_out(out):
            if len(tainted) < _TAINTED:
                tainted[id(tensor)] = (weakref.ref(tensor), origin)
            node = tensor.grad_fn
            if cut is not None and node is not None:
                uses[node] = cut

    def _detached_operand(self, func, args, kwargs, origin) -> None:
        """A noise value multiplied by (a scale) or added to (a location) a detached copy of a
        tensor with gradient of the noise's own shape: ``mu + eps * std.detach()``."""
        via = _COMBINE.get(getattr(func, "__name__", ""))
        if via is None or len(self._cuts) >= _SAMPLES:
            return
        shape = None
        for tensor in tensors_in(args, kwargs):
            if self._origin_of(tensor) == origin:
                shape = tensor.shape
                if via == "location" and not tensor.requires_grad:
                    return  # plain noise added to a detached value (an augmentation), no scale learnt
        likes = [p() for p in self._origins[origin][2]]
        for tensor in tensors_in(args, kwargs):
            if tensor.shape != shape or tensor.requires_grad:
                continue
            entry = self._detached.get(id(tensor))
            if entry is not None and entry[0]() is tensor:
                self._cuts.append((origin, via, entry[1], self.rec.here()))
                return
            for like in likes:  # detached before the noise was drawn: ``mu.detach() + eps * std``
                if like is not None and like.data_ptr() == tensor.data_ptr() \
                        and like.shape == tensor.shape and like.dtype == tensor.dtype:
                    self._cuts.append((origin, via, like.grad_fn if like.grad_fn is not None else like,
                                       self.rec.here()))
                    return

    def _open(self) -> bool:
        mode = FollowMode(self, "reparam_cut")
        thread = push_mode(mode, self.rec, "reparam_cut")
        if thread is None:
            return False
        self._mode, self._thread = mode, thread
        self._windows += 1
        self._ops = 0
        self.following = True
        return True

    def _close(self) -> None:
        """Stop following and pop the mode when it is on top of this thread's stack (a mode the
        script pushed after it and still holds: left there, passing every call through)."""
        self.following = False
        self._origins, self._tainted, self._uses, self._scores = [], {}, {}, {}
        self._detached, self._cuts = {}, []
        self.inside = 0
        self._calls.clear()  # a call that raised left its entry
        if remove_mode(self._mode, self._thread, self.rec, "reparam_cut"):
            self._mode = None

    # -- DESCRIBE_LOSS -----------------------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        if self._mode is None:
            return {}
        try:
            if self._origins and not self.closed:
                self.following = False
                self._judge(tensors)
        except Exception as exc:
            self.rec.internal_error("reparam_cut", exc)
        finally:
            self._close()
        return {}

    def _judge(self, tensors) -> None:
        roots = loss_roots(tensors)
        seen: set = set()
        stack = list(roots)
        used: dict = {}  # origin -> its first use reached
        products = []
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if len(seen) > _NODES:
                return
            stack.extend(child for child, _ in node.next_functions if child is not None)
            origin = self._uses.get(node)
            if origin is not None:
                used.setdefault(origin, node)
            if type(node).__name__ in ("MulBackward0", "DivBackward0"):
                products.append(node)
        if not used:
            return
        trained: set | None = None
        for origin, via, source, where in self._cuts:
            if origin not in used:
                continue
            pids = self._pids([source]) if isinstance(source, torch.Tensor) else self._pids_below(source)
            if trained is None:
                trained = set().union(*(self._pids_below(root) for root in roots))
            if pids & trained:
                self.closed = True
                self.rec.emit_aside(ev.reparam_cut(dist=None, params=sorted(pids)[:64],
                                                   op=type(used[origin]).__name__, via=via,
                                                   backward=getattr(self.rec.here(), "line", None)),
                                    where)
                return
        scored = self._scored(products)
        for origin in sorted(used):
            if origin in scored:
                continue
            cls, where, weak = self._origins[origin]
            if cls is None:
                continue  # noise: judged by its cuts
            pids = self._pids([p() for p in weak if p() is not None])
            if not pids:
                continue
            if trained is None:
                trained = set().union(*(self._pids_below(root) for root in roots))
            if not pids & trained:
                continue  # the loss does not train this distribution (a critic on its samples)
            self.closed = True
            self.rec.emit_aside(ev.reparam_cut(dist=cls, params=sorted(pids)[:64],
                                               op=type(used[origin]).__name__, via="sample",
                                               backward=getattr(self.rec.here(), "line", None)),
                                where)
            return

    def _scored(self, products) -> set:
        """The origins the loss holds a score-function term of: a product of a log_prob of
        the origin's value and a weight derived from it (the product is one of its uses) or of
        more than one element."""
        out: set = set()
        if not self._scores:
            return out
        for node in products:
            for index, (child, _) in enumerate(node.next_functions):
                if child is None:
                    continue
                origin = self._near(child)
                if origin is None:
                    continue
                if self._uses.get(node) == origin:
                    out.add(origin)
                    continue
                try:
                    other = saved(node, "_saved_other" if index == 0 else "_saved_self")
                except Exception:
                    other = None
                if isinstance(other, torch.Tensor) and other.numel() > 1:
                    out.add(origin)
        return out

    def _near(self, node):
        """The sample a few levels below ``node`` came from (the nearest), or None."""
        return nearest(node, self._scores, _NEAR)

    def _pids_below(self, node) -> set:
        found = reached(node, _NODES, truncate=True)
        return self._owned(found[1]) if found else set()

    def _pids(self, params) -> set:
        ids = set()
        for p in params:
            if p.grad_fn is None:
                ids.add(id(p))
            else:
                found = reached(p.grad_fn, _NODES, truncate=True)
                if found:
                    ids |= found[1]
        return self._owned(ids)

    def _owned(self, ids) -> set:
        tensors, owned = self.rec.tensors, self.owned
        return {pid for i in ids if (pid := tensors.number.get(i)) is not None
                and pid in owned and id(tensors.refs[pid]()) == i}

    # -- install -----------------------------------------------------------------------------
    def before_compile(self) -> None:
        # a graph traced with a mode on the stack would trace the mode's handler (graddoctor's
        # code, on Dynamo's skip list): the window is closed and the mode popped first
        self.closed = True
        self._close()

    def install(self, patcher) -> None:
        self._calls = wrap_distribution_calls(
            patcher, self, "reparam_cut",
            {"sample": self.sampled, "noise": self.noise, "log_prob": self.scored}, base_sample=True)

    def uninstall(self) -> None:
        self.closed = True
        self._close()

