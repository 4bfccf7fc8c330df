"""Autograd graphs of earlier backwards that the script keeps alive.

A backward frees the buffers its graph saved, but the graph's nodes live as long as a tensor
refers to them: ``total += loss`` (instead of ``loss.item()``), ``history.append(loss)``, a list
of model outputs kept for a metric. Each such reference keeps one more graph per step — the
nodes, and whatever the forward saved when the backward did not run over that part — so the
memory grows step after step until the run dies of it.

The roots of the graphs of the first backward of each of the first ``_MARKED`` updates (the
loss node and a few nodes below it) get a small marker object in their ``metadata``, held here
by a weak reference only: the marker lives exactly as long as the node. From backward
``_CHECK_AT`` on, once two optimizer steps have gone by since the last marked backward
(gradient accumulation may keep a window's losses until its step), a marker still alive means
an earlier graph is still referenced; the script's variables (the frames of the user's code on
the stack and their globals, one level into lists, dicts and plain objects) are then searched
for the variable whose graphs reach marked nodes of two updates or more, and a ``graph_kept``
aside event names that variable. One update's graphs kept in a variable are not memory that
grows: a loss computed once per several updates and kept until its next computation (WGAN-GP's
``g_loss``, computed every ``n_critic`` critic updates), or a sum of that update's losses
(DCGAN's ``errD = errD_real + errD_fake``). A backward that reaches an earlier graph on purpose
(a hidden state carried across steps) is left to ``hidden-state-not-detached``.

Cost: a counter per backward; a few nodes touched at the first backwards; one search, once.
"""

from __future__ import annotations

import sys
import weakref
from collections import deque
from itertools import compress
from operator import itemgetter

import torch

from .. import events as ev
from .recorder import Recorder

_MARKED = 4  # updates whose first backward's graph is marked (a GAN alternates two losses)
_KEPT_UPDATES = 2  # marked updates one variable must keep to be memory that grows
_CHECK_AT = 6  # the first backward before which the markers are looked at
_STEPS_BETWEEN = 2  # optimizer steps after the marked backwards before looking (accumulation
# keeps a window's losses until its step: those are let go of then)
_GIVE_UP = 200  # backwards after which no look is taken any more
_NODES = 8  # nodes marked per graph
_FIRST = itemgetter(0)


class _NotALeaf(dict):
    """node class -> whether it is not torch's AccumulateGrad (decided once per class)."""

    def __missing__(self, cls) -> bool:
        self[cls] = taken = cls.__name__ != "AccumulateGrad"
        return taken


_not_a_leaf = _NotALeaf().__getitem__
_KEY = "graddoctor_alive"
_SEARCH_NODES = 4000  # nodes walked per candidate variable


class _Marker:
    __slots__ = ("__weakref__", "backward")

    def __init__(self, backward: int):
        self.backward = backward


class GraphLivenessWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._backwards = 0
        self._markers: list = []  # weak references to the markers
        self._steps_at_mark = -1  # optimizer steps counted when the last graph was marked
        self._marked = 0  # graphs marked so far (one per update)
        self._done = False

    def describe_loss(self, tensors) -> dict:
        if self._done:
            return {}
        self._backwards += 1
        n = self._backwards
        try:
            steps = self.rec.progress.steps
            if self._marked < _MARKED and steps != self._steps_at_mark:
                self._marked += 1  # the first backward of a new update
                self._mark(tensors, n)
                self._steps_at_mark = steps
            elif (n >= _CHECK_AT and self._marked >= _KEPT_UPDATES
                    and steps - self._steps_at_mark >= _STEPS_BETWEEN):
                self._done = True  # updates went by since: what is still alive is kept for good
                self._look()
            elif n > _GIVE_UP:
                self._done = True
        except Exception as exc:
            self._done = True
            self.rec.internal_error("graphs kept alive", exc)
        return {}

    def _mark(self, tensors, n: int) -> None:
        items = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
        todo = deque(t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None)
        seen, count = set(), 0
        while todo and count < _NODES:
            node = todo.popleft()
            if node is None or id(node) in seen or type(node).__name__ == "AccumulateGrad":
                continue
            seen.add(id(node))
            marker = _Marker(n)
            try:
                node.metadata[_KEY] = marker
            except Exception:
                continue
            self._markers.append(weakref.ref(marker))
            count += 1
            # the inputs but the leaves' AccumulateGrad nodes, picked in C: a node fed by
            # thousands of parameters (a stack of them) costs no Python per parameter
            children = list(map(_FIRST, node.next_functions))
            todo.extend(compress(children, map(_not_a_leaf, map(type, children))))

    def _look(self) -> None:
        alive = [m() for m in self._markers]
        alive = [m for m in alive if m is not None]
        self._markers = []
        if not alive:
            return
        rec = self.rec
        frames = list(rec.finder.user_frames(sys._getframe(1)))
        if not frames:
            return
        found = None
        for frame in frames:
            found = _holder(frame.f_locals) or _holder(frame.f_globals)
            if found is not None:
                break
        if found is None:
            return
        name, holder, steps = found
        rec.emit_aside(ev.graph_kept(name=name, holder=holder, steps=steps),
                       rec.finder.location(frames[0]))


def _reaches_marker(tensor) -> set:
    """The backwards whose marked nodes ``tensor``'s graph reaches."""
    node = getattr(tensor, "grad_fn", None)
    if node is None:
        return set()
    found, todo, seen = set(), [node], set()
    while todo and len(seen) < _SEARCH_NODES:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        try:
            marker = node.metadata.get(_KEY)
        except Exception:
            marker = None
        if marker is not None:
            found.add(marker.backward)
        todo.extend(child for child, _ in node.next_functions)
    return found


def _tensors_in(value, depth: int = 0):
    """(how it holds them, tensors with a graph) in a variable: itself, a list/tuple/deque/dict's
    items, a plain object's attributes (one level, then their containers)."""
    if isinstance(value, torch.Tensor):
        if value.grad_fn is not None:
            yield "tensor", value
        return
    if depth > 1:
        return
    if isinstance(value, (list, tuple, deque)):
        items = list(value)  # the marked updates' items sit near the start (accumulation: apart)
        for item in items[:64] + items[-4:]:
            if isinstance(item, torch.Tensor) and item.grad_fn is not None:
                yield "list", item
        return
    if isinstance(value, dict):
        for item in list(value.values())[:16]:
            for how, t in _tensors_in(item, depth + 1):
                yield ("dict" if how == "tensor" else how), t
        return
    if depth == 0 and type(value).__module__ not in ("builtins",) and hasattr(value, "__dict__") \
            and not isinstance(value, (torch.nn.Module, type)) and not callable(value):
        for item in list(vars(value).values())[:16]:
            for how, t in _tensors_in(item, depth + 1):
                yield "attribute", t


def _holder(variables: dict):
    for name, value in list(variables.items())[:400]:
        if name.startswith("__"):
            continue
        kept, held = set(), None
        for how, tensor in _tensors_in(value):
            reached = _reaches_marker(tensor)
            if reached:
                kept |= reached
                held = held or how
        if len(kept) >= _KEPT_UPDATES:
            return name, held, len(kept)
    return None
