"""A module call inside the model's forward whose output never reaches the loss (discarded-
module-output).

``hypo = self.encode(hypothesis)`` followed by ``torch.cat([prem, prem], 1)``, ``output2 =
self.forward_once(input2)`` followed by ``torch.cat((output1, output1), 1)``, a bare
``self.dropout(x)``: the module runs, builds its part of the graph, and what it computed is
dropped. The tensor the script meant is replaced by another one (usually a copy-pasted name),
so the model trains on less than it was written to see, and nothing fails.

Read from the autograd graph, at the first ``WINDOW`` backwards only:

* A global forward hook (removed with the window) notes the output of every module call made
  by the script's own code (not torch's containers, not a library's model) from inside another
  module's forward (the calling frame's ``self`` is an ``nn.Module``), under grad mode, on the
  script's thread: the ``grad_fn`` of its tensors (at most ``_TENSORS``), the module's class,
  whether it has children, and the script's frames from the call outward while they run inside
  a module's forward (at most ``_FRAMES``).
* Before each backward (``DESCRIBE_LOSS``) the loss's graph is walked (at most ``_NODES``
  nodes, level by level in C: ``graphpaths.nodes_below``). A noted output whose nodes it reaches is dropped; one it does not reach is kept for
  one more backward (a GAN's generator output is reached by the generator's backward, after the
  discriminator's); still unreached then, it becomes an ``output_discarded`` aside at the
  call's line, once per line.

Which of those the script really threw away is for the rule to read in the source (a name
assigned and never read, a bare call); the watcher only says what the graph never used.
"""

from __future__ import annotations

import sys
from threading import get_ident

import torch
from torch import nn

from .. import events as ev
from ..trace import Location
from .dependency import close_before_compile, register_module_hooks
from .dropoutout import backward_roots, module_caller
from .graphpaths import nodes_below
from .recorder import Recorder

WINDOW = 4  # backwards judged, from the first one
_NOTED = 128  # module outputs noted per backward at most
_TENSORS = 4  # tensors of one output looked at
_FRAMES = 4  # the script's frames kept per call
_NODES = 20000  # graph nodes walked per backward at most
_STACK = 16  # frames looked through for the script's


def _nodes(output) -> list:
    """The ``grad_fn`` of the first tensors of a module's output (a tensor, a tuple or list)."""
    items = output if isinstance(output, (tuple, list)) else (output,)
    return [t.grad_fn for t in items[:_TENSORS]
            if isinstance(t, torch.Tensor) and t.grad_fn is not None]


def reached_nodes(roots, limit: int = _NODES) -> set[int] | None:
    """The ids of the graph nodes reached from ``roots``; None when the graph is larger than
    ``limit`` (nothing can be said then)."""
    nodes, complete = nodes_below(roots, limit)  # level by level in C
    return set(map(id, nodes)) if complete else None


class DiscardedOutputWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.active = False
        self._handles: list = []
        self._backwards = 0
        self._new: list[tuple] = []  # (nodes, cls, leaf, frames) noted since the last backward
        self._pending: list[tuple] = []  # unreached by the last backward: one more chance
        self._told: set = set()

    def _stop(self) -> None:
        self.active = False
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._new, self._pending = [], []

    def _post(self, module, args, output):
        if not self.active or len(self._new) >= _NOTED or not torch.is_grad_enabled() \
                or get_ident() != self.rec.script_thread:
            return None
        try:
            nodes = _nodes(output)
            if not nodes:
                return None
            who, parent = module_caller(self.rec, module)
            if who != "user" or not isinstance(parent, nn.Module):
                return None
            frames = self._frames()
            if frames and frames[0] not in self._told:
                leaf = next(iter(module.children()), None) is None
                self._new.append((nodes, type(module).__name__, leaf, frames))
        except Exception as exc:
            self._stop()
            self.rec.internal_error("discarded module output", exc)
        return None

    def _frames(self) -> tuple:
        """The script's frames from the module's call outward, while they run inside a module's
        forward (their ``self`` is an nn.Module): ``((path, line, function), ...)``."""
        finder = self.rec.finder
        frame = sys._getframe(2)
        for _ in range(_STACK):
            if frame is None or finder.is_user_file(frame.f_code.co_filename):
                break
            frame = frame.f_back
        found = []
        for user in finder.user_frames(frame):
            if not isinstance(user.f_locals.get("self"), nn.Module) or len(found) >= _FRAMES:
                break
            loc = finder.location(user)
            found.append((loc.path, user.f_lineno, loc.function))
        return tuple(found)

    def describe_loss(self, tensors) -> dict:
        if not self.active:
            return {}
        try:
            self._backwards += 1
            new, self._new = self._new, []
            pending, self._pending = self._pending, []
            if new or pending:
                reached = reached_nodes(backward_roots(tensors))
                if reached is None:
                    self._stop()
                    return {}
                for nodes, cls, leaf, frames in pending:
                    if frames[0] not in self._told and not any(id(n) in reached for n in nodes):
                        self._told.add(frames[0])
                        path, line, function = frames[0]
                        self.rec.emit_aside(
                            ev.output_discarded(module=cls, leaf=leaf,
                                                frames=[[p, n] for p, n, _ in frames]),
                            Location(path, line, function))
                self._pending = [note for note in new if not any(id(n) in reached for n in note[0])]
            if self._backwards >= WINDOW:
                self._stop()
        except Exception as exc:
            self._stop()
            self.rec.internal_error("discarded module output", exc)
        return {}

    def _before_compile(self) -> None:
        if self.active:
            self._stop()

    def install(self, patcher) -> None:
        close_before_compile(patcher, self._before_compile)
        self._handles = register_module_hooks(patcher, None, self._post, with_kwargs=False,
                                              always_call=False)
        self.active = True
