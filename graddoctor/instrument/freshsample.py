"""A policy-gradient loss that takes the log-probability of a fresh sample, not of the action the
script acted on: ``action = dist.sample(); env.step(action); loss = -(dist.log_prob(dist.sample())
* G)`` (``log-prob-of-fresh-sample``).

A score-function gradient ``log_prob(a) * G`` is unbiased only when ``G`` is the return of ``a``.
A second draw ``x`` that is used for nothing but ``log_prob`` is independent of every weight the
script computes, and ``E[grad log_prob(x)] = 0``: the term's gradient is noise around zero,
whatever the returns. The invariant, per step (between two backwards):

* a ``sample()`` ``x`` (gradients on, of a distribution whose tensors need a gradient) is drawn
  *after* another sample ``y`` of a distribution of the same class with equal parameters (the
  same object, or one built again from the same logits) — the only time ``x`` is followed;
* from its draw to the next backward, no op outside ``log_prob``/``sample`` reads ``x`` (it
  never reaches an environment, a reward, a buffer's stack: ``.item()``, ``.numpy()``,
  indexing and every other op are ops);
* the loss holds a product of a ``log_prob`` of ``x`` (a few levels down) and a weight that is
  not derived from that log-probability (a return, an advantage; ``lp * (1 + lp.detach())``,
  a Monte-Carlo entropy gradient, is derived from it);
* the loss holds no ``log_prob`` of ``y``'s value (a policy-gradient term on the action taken
  with a Monte-Carlo entropy bonus ``-log_prob(dist.sample())`` beside it is the look-alike);
* the log-probability reaches parameters an optimizer owns.

How, and what it costs: ``sample`` and ``log_prob`` of ``torch.distributions``' classes are
wrapped. Each outermost ``sample`` that qualifies is noted (class, its tensors weakly, the value
weakly; the last ``_DRAWN`` of a step); a new one is compared with them (class, shapes, then
``torch.equal`` under ``no_grad``). Only a match opens a window (at most ``_WINDOWS`` in a run):
a ``TorchFunctionMode`` that notes reads of the followed samples and marks values derived from
their log-probabilities (``_OPS`` ops at most). ``log_prob`` results are noted with their value's
storage and shape (``_NOTED`` per step). At the next backward (``DESCRIBE_LOSS``) the loss's
graph is walked (``_NODES``) and the window closed; a ``fresh_sample_scored`` aside event at the
``log_prob`` call, once per line.
"""

from __future__ import annotations

import weakref

import torch

from .. import events as ev
from .follow import FollowMode, push_mode, remove_mode, tensors_in, tensors_out, wrap_distribution_calls
from .graphpaths import reached, saved
from .lossterms import loss_roots
from .recorder import Recorder

_WINDOWS = 8  # windows opened in a run, at most
_DRAWN = 8  # samples of a step a new sample is compared with (the latest)
_FOLLOWED = 16  # samples followed in one window
_OPS = 100000  # ops followed in one window
_DERIVED = 65536  # values derived from followed log-probabilities kept in one window
_NOTED = 4096  # log_prob results noted in one step
_NODES = 20000  # nodes of the loss's graph walked
_NEAR = 6  # levels below a product's factor searched for a log-probability
_PRODUCTS = ("MulBackward0", "MulBackward1", "DivBackward0", "DivBackward1")
# calls that read a tensor's metadata, not its values (attributes: ``__get__`` of a getset)
_METADATA = frozenset({"__get__", "data_ptr", "size", "dim", "ndimension", "numel", "nelement",
                       "stride", "storage_offset", "is_contiguous", "element_size",
                       "untyped_storage", "is_floating_point", "is_complex", "get_device",
                       "is_pinned", "__hash__"})


def _own_tensors(dist) -> dict:
    """The tensors ``dist`` holds by attribute name (its parameters, as given or normalised)."""
    return {name: value for name, value in vars(dist).items() if isinstance(value, torch.Tensor)}


def _key(value):
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return (value.data_ptr(), tuple(value.shape), value.dtype)
    except Exception:  # a tensor without storage (a fake, a functional wrapper)
        return None


class _Drawn:
    """A sample noted in this step: its distribution's class and tensors (detached), and the
    value (weakly)."""

    __slots__ = ("cls", "shape", "tensors", "value", "key", "where", "scored")

    def __init__(self, dist, value, where):
        self.cls = type(dist)
        self.shape = tuple(getattr(dist, "batch_shape", ()))
        # detached: the values stay comparable after a temporary distribution is let go of,
        # without keeping its autograd graph alive (no torch function mode sees the detach)
        with torch._C.DisableTorchFunction():
            self.tensors = {name: t.detach() for name, t in _own_tensors(dist).items()}
        self.value = weakref.ref(value)
        self.key = _key(value)
        self.where = where
        self.scored: set = set()  # autograd nodes of log_prob results of this value

    def matches(self, dist) -> bool:
        """Whether ``dist`` is of this sample's class with equal parameters."""
        if type(dist) is not self.cls or tuple(getattr(dist, "batch_shape", ())) != self.shape:
            return False
        mine = _own_tensors(dist)
        common = [name for name in mine if name in self.tensors]
        if not common:
            return False
        with torch.no_grad(), torch._C.DisableTorchFunction():
            for name in common:
                theirs, ours = self.tensors[name], mine[name]
                if theirs.data_ptr() == ours.data_ptr() and theirs.stride() == ours.stride() \
                        and theirs.shape == ours.shape:
                    continue
                if theirs.shape != ours.shape or theirs.dtype != ours.dtype \
                        or theirs.device != ours.device or not torch.equal(theirs, ours):
                    return False
        return True


class FreshSampleWatcher:
    def __init__(self, rec: Recorder, owned):
        self.rec = rec
        self.owned = owned  # OptimizerWatcher.owned_pids(): a read-only live view
        self.following = False
        self.inside = 0  # sample / log_prob calls running (their ops are not reads)
        self._drawn: list = []  # _Drawn of this step, the latest _DRAWN
        self._fresh: list = []  # [weak x, _Drawn of the earlier y, Location of x, read?]
        self._followed: dict = {}  # id(x) -> index in _fresh
        self._derived: dict = {}  # id(a value derived from a followed log_prob) -> weak value
        self._scores: dict = {}  # log_prob's autograd node -> (value key, index in _fresh or None, Location)
        self._mode: FollowMode | None = None
        self._thread: int | None = None
        self._windows = 0
        self._ops = 0
        self._done: set = set()  # log_prob lines reported
        self.closed = False
        self._calls: list = []

    # -- the wrapped calls -------------------------------------------------------------------
    def sampled(self, dist, result) -> None:
        if self.closed or not isinstance(result, torch.Tensor) or result.requires_grad \
                or not torch.is_grad_enabled():
            return
        if self._windows >= _WINDOWS and not self._fresh:
            return
        if not any(t.requires_grad for t in _own_tensors(dist).values()):
            return
        where = self.rec.here()
        earlier = next((d for d in reversed(self._drawn)
                        if d.value() is not result and d.matches(dist)), None)
        drawn = _Drawn(dist, result, where)
        self._drawn.append(drawn)
        del self._drawn[:-_DRAWN]
        if earlier is None or len(self._fresh) >= _FOLLOWED:
            return
        if not self._fresh and not self._open():
            return
        self._followed[id(result)] = len(self._fresh)
        self._fresh.append([weakref.ref(result), earlier, where, False])

    def scored(self, value, result) -> None:
        node = getattr(result, "grad_fn", None)
        if node is None or len(self._scores) >= _NOTED or not isinstance(value, torch.Tensor) \
                or (self._windows >= _WINDOWS and not self._fresh):
            return
        for drawn in self._drawn:
            if drawn.value() is value and len(drawn.scored) < _NOTED:
                drawn.scored.add(node)
        index = self._index_of(value)
        self._scores[node] = (_key(value), index, self.rec.here() if index is not None else None)
        if index is not None and self.following and len(self._derived) < _DERIVED:
            self._derived[id(result)] = weakref.ref(result)

    def _index_of(self, tensor) -> int | None:
        index = self._followed.get(id(tensor))
        if index is not None and self._fresh[index][0]() is tensor:
            return index
        return None

    # -- the mode ----------------------------------------------------------------------------
    def follow(self, func, args, kwargs, out) -> None:
        self._ops += 1
        if self._ops > _OPS:
            self.following = False
            return
        derived = False
        for tensor in tensors_in(args, kwargs):
            index = self._index_of(tensor)
            if index is not None:
                self._fresh[index][3] = True  # read outside log_prob: the sample is used
            entry = self._derived.get(id(tensor))
            if entry is not None and entry() is tensor:
                derived = True
        if derived:
            for tensor in tensors_out(out):
                if len(self._derived) < _DERIVED:
                    self._derived[id(tensor)] = weakref.ref(tensor)

    def _is_derived(self, tensor) -> bool:
        entry = self._derived.get(id(tensor))
        return entry is not None and entry() is tensor

    def _open(self) -> bool:
        if self._windows >= _WINDOWS:
            return False
        mode = FollowMode(self, "fresh_sample_scored", _METADATA)
        thread = push_mode(mode, self.rec, "fresh_sample_scored")
        if thread is None:
            return False
        self._mode, self._thread = mode, thread
        self._windows += 1
        self._ops = 0
        self.following = True
        return True

    def _close(self) -> None:
        """Forget the step; pop the mode when it is on top of this thread's stack (a mode the
        script pushed after it and still holds: left there, passing every call through)."""
        self.following = False
        if self._drawn or self._fresh or self._followed or self._derived or self._scores:
            # (new containers only when there is something to forget: this runs at every
            # backward of the run, and a turn's allocations add up to garbage collections)
            self._drawn, self._fresh, self._followed, self._derived, self._scores = [], [], {}, {}, {}
        self.inside = 0
        if self._calls:
            self._calls.clear()  # a call that raised left its entry
        if self._mode is not None and remove_mode(self._mode, self._thread, self.rec,
                                               "fresh_sample_scored"):
            self._mode = None

    # -- DESCRIBE_LOSS -----------------------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        try:
            if self._fresh and not self.closed:
                self.following = False
                self._judge(tensors)
        except Exception as exc:
            self.rec.internal_error("fresh_sample_scored", exc)
        finally:
            self._close()
        return {}

    def _judge(self, tensors) -> None:
        roots = loss_roots(tensors)
        seen: set = set()
        stack = list(roots)
        products = []
        keys_scored: set = set()  # value keys of the log-probabilities the loss holds
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if len(seen) > _NODES:
                return
            stack.extend(child for child, _ in node.next_functions if child is not None)
            score = self._scores.get(node)
            if score is not None and score[0] is not None and score[1] is None:
                keys_scored.add(score[0])
            if type(node).__name__ in _PRODUCTS:
                products.append(node)
        for node in products:
            found = self._weighted_score(node)
            if found is None:
                continue
            lp_node, (_, index, where) = found
            x, earlier, sampled_at, read = self._fresh[index]
            if read or earlier.scored & seen or (earlier.value() is not None
                                                 and earlier.key in keys_scored):
                continue  # the fresh sample is used, or the loss also scores the action taken
            if where is None or (where.path, where.line) in self._done:
                continue
            pids = self._pids_below(lp_node)
            if not pids:
                continue
            self._done.add((where.path, where.line))
            self.rec.emit_aside(ev.fresh_sample_scored(
                dist=earlier.cls.__name__, params=sorted(pids)[:64],
                acted=getattr(earlier.where, "line", None), sampled=getattr(sampled_at, "line", None),
                backward=getattr(self.rec.here(), "line", None)), where)

    def _weighted_score(self, node):
        """``(log_prob node, its note)`` when ``node`` multiplies (or divides) a log-probability
        of a followed sample by a weight not derived from it; else None."""
        children = list(node.next_functions)
        name = type(node).__name__
        for index, (child, _) in enumerate(children):
            if child is None:
                continue
            lp_node = _nearest_node(child, self._scores, _NEAR)
            if lp_node is None:
                continue
            note = self._scores[lp_node]
            if note[1] is None:
                continue
            if name.startswith("Div") and index != 0:
                continue  # a log-probability in the divisor weights nothing
            others = [c for i, (c, _) in enumerate(children) if i != index]
            other = others[0] if others else None
            if other is not None:
                if _nearest_node(other, self._scores, _NEAR) is not None:
                    continue  # log-probabilities on both sides: an entropy's p * log p
                return lp_node, note
            weight = None
            if name in ("MulBackward0", "DivBackward0"):
                weight = saved(node, ("_saved_other" if index == 0 else "_saved_self")
                               if name == "MulBackward0" else "_saved_other")
            if isinstance(weight, torch.Tensor) and self._is_derived(weight):
                continue  # weighted by its own log-probability (a Monte-Carlo entropy gradient)
            return lp_node, note
        return None

    def _pids_below(self, node) -> set:
        found = reached(node, _NODES, truncate=True)
        if not found:
            return set()
        tensors, owned = self.rec.tensors, self.owned
        return {pid for i in found[1] if (pid := tensors.number.get(i)) is not None
                and pid in owned and id(tensors.refs[pid]()) == i}

    # -- install -----------------------------------------------------------------------------
    def before_compile(self) -> None:
        # a graph traced with a mode on the stack would trace the mode's handler
        self.closed = True
        self._close()

    def install(self, patcher) -> None:
        self._calls = wrap_distribution_calls(patcher, self, "fresh_sample_scored",
                                              {"sample": self.sampled, "log_prob": self.scored})

    def uninstall(self) -> None:
        self.closed = True
        self._close()


def _nearest_node(root, noted: dict, levels: int):
    """The node of ``noted`` nearest ``root`` (breadth first, ``root`` included, at most
    ``levels`` levels down), or None."""
    level, seen = [root], set()
    for _ in range(levels):
        following = []
        for node in level:
            if node is None or node in seen:
                continue
            if node in noted:
                return node
            seen.add(node)
            following.extend(child for child, _ in node.next_functions if child is not None)
        level = following
    return None

