"""Where the parameters that never get a gradient are used (for param-without-grad).

No global module hook: the optimizer watcher's post-step pass already returns, every step, the
owned parameters whose ``.grad`` is None. Once a parameter (that requires grad) has had none at
every step of its optimizer so far, and at 2 steps at least, the modules that directly own such
parameters are found (one ``gc`` pass, only in a run that has some) and get a forward pre-hook:
a handful of modules, nothing for every other forward. The hook records the first forward of
each call line and grad mode as an ``idle_forward`` aside event at the user's line that called
the module: a forward under ``torch.no_grad()`` there is the cause; a forward with gradients on
means its output was cut from the loss. Such a forward's output also gets a marker in its
autograd node's ``metadata`` (the first ``_MARKED_FORWARDS`` forwards of each module), and the
loss functions the loss watchers wrap (``mse_loss``, ``cross_entropy``...) ask ``loss_call``
whether their input's graph reaches a marker (a walk of ``_LOSS_NODES`` nodes at most, only once
a module is watched): a loss computed from the idle module's output, which no backward reached —
left out of the loss that is backpropagated, or cut by ``.item()`` — is recorded once per module
and loss line as an ``idle_loss`` aside event. Once a module is watched, ``Tensor.detach`` is
wrapped for its next ``_DETACHES`` calls: a detach of a tensor whose graph reaches a marker is
where that output is cut from the loss (``critic_loss = advantage.detach().pow(2)``), an
``idle_detach`` aside once per module and line. Cost on a healthy run: nothing per step (a step
that leaves no parameter without a grad is not published to it; ``Progress.stepped`` counts the
steps) and one ``if`` per loss call.
"""

from __future__ import annotations

import sys
from itertools import compress, islice, repeat
from operator import add, ge, itemgetter, not_

import os
import weakref

import torch
import torch.utils.checkpoint

from .. import events as ev
from ..location import site_key
from .identities import Identities
from .inlinable import watched
from .names import live_modules
from .recorder import Recorder

MIN_STEPS = 2  # as the rule's: steps without a gradient before the modules are watched
_MAX_SEARCHES = 4  # gc passes per run, at most
_MAX_FRAMES = 64
_OUTER = 4  # callers' lines kept with each forward recorded
# a reentrant torch.utils.checkpoint runs its function under no_grad in this frame; when none of
# its inputs requires grad its output has no graph and nothing inside ever gets a gradient
_REENTRANT = getattr(getattr(torch.utils.checkpoint, "CheckpointFunction", None), "forward", None)
_REENTRANT = getattr(_REENTRANT, "__code__", None)
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_MARKED_FORWARDS = 32  # forwards of each watched module whose output is marked for loss_call
_LOSS_NODES = 32  # nodes walked from a loss's input towards a marked output
_USES_NODES = 4096  # nodes walked below a marked output for the idle parameters (first forwards only)
_KEY = "graddoctor_idle"
_DETACHES = 512  # Tensor.detach calls looked at once a module is watched, then put back
_ALIVE_KEY = "graddoctor_idle_alive"


class _Alive:
    """Put beside a marker in a node's ``metadata``, which lives as long as the node. ``_LIVE``
    holds a weak reference to each, which leaves the set when its node is freed (the callback is
    the set's own ``discard``: no Python frame per marker made or freed). While ``_LIVE`` is
    empty no marked node is alive (a module's marked forwards are its first
    ``_MARKED_FORWARDS``, and their graphs are freed after their backward): no walk can find a
    marker, and none is made. Shared by every watcher, as the key is."""

    __slots__ = ("__weakref__",)


_LIVE: set = set()


class IdleParamWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.patcher = None
        self._missing: dict[int, int] = {}  # pid -> steps without a gradient
        self._looked: set[int] = set()  # pids whose module was searched for
        self._hooked = Identities()  # module -> mid, for the modules hooked
        self._done: set[tuple] = set()  # (mid, site_key, grad, inference) recorded
        self._codes: dict[int, object] = {}  # the code objects whose ids are in those keys
        self._searches = 0
        self.watching = False  # a module is watched: loss_call walks its input's graph
        self._losses: set[tuple] = set()  # (mid, loss location) recorded
        self._detaches = 0  # Tensor.detach calls left to look at (the wrapper goes at 0)
        self._detach_wrapper = None
        self._detach_original = None

    def after_step(self, opt: int, without: list[int]) -> None:
        """Called by the optimizer watcher after a real step that left some parameters without
        a grad, with their pids (the steps where every one had a grad are only counted, by
        ``Progress.stepped``)."""
        missing, looked = self._missing, self._looked
        if looked.issuperset(without):  # each searched for already: their counts are done with
            return
        # ``map``s in C: a mixture of experts leaves most parameters without a grad each step
        counts = list(map(add, map(missing.get, without, repeat(0)), repeat(1)))
        missing.update(zip(without, counts))
        due = list(compress(zip(without, counts), map(ge, counts, repeat(MIN_STEPS))))
        if not due or looked.issuperset(map(itemgetter(0), due)):
            return
        # the ones not searched for yet, picked in C: Python runs once per parameter in the run,
        # not once per idle parameter and step (a mixture of experts has many idle each step)
        fresh = list(compress(due, map(not_, map(looked.__contains__, map(itemgetter(0), due)))))
        ready = []
        steps = self.rec.progress.stepped(opt)
        for pid, n in fresh:
            if pid not in looked:
                looked.add(pid)
                if n == steps:  # never had a gradient so far
                    ready.append(pid)
        if ready:
            self._watch(ready)

    def _watch(self, pids: list[int]) -> None:
        rec = self.rec
        if self._searches >= _MAX_SEARCHES or self.patcher is None:
            return
        wanted = {}
        for pid in pids:
            tensor = rec.tensor(pid)
            if tensor is not None and tensor.requires_grad:  # frozen ones are meant to be idle
                wanted[id(tensor)] = pid
        if not wanted:
            return
        self._searches += 1
        for obj in live_modules():
            if self._hooked.get(obj) is not None:
                continue
            own = obj.__dict__.get("_parameters")
            if not own:
                continue
            mine = [wanted[id(p)] for p in own.values() if p is not None and id(p) in wanted]
            if mine:
                self._hook(obj, mine)

    def _hook(self, module, pids: list[int]) -> None:
        watcher, rec = self, self.rec
        mid = self._hooked(module)
        cls = type(module).__name__
        done, codes = self._done, self._codes
        user_frames = rec.finder.user_frames

        def pre_hook(mod, args):
            try:
                grad = torch.is_grad_enabled()
                inference = torch.is_inference_mode_enabled()
                start = sys._getframe(1)
                checkpoint = None
                if not grad and _REENTRANT is not None:
                    start, checkpoint = watcher._checkpoint_caller(start)
                frames = user_frames(start)
                frame = next(frames, None)
                if frame is None:
                    return None
                key = (mid, site_key(frame, codes), grad, inference)
                if key in done:
                    return None
                done.add(key)
                # the callers' lines: under no_grad the `with torch.no_grad()` may be in one;
                # with grad on, the `.data`/`.detach()` that cuts an outer module's output
                outer = [[loc.path, loc.line] for f in islice(frames, _OUTER)
                         if (loc := rec.finder.location(f)) is not None]
                rec.emit_aside(ev.idle_forward(mid=mid, cls=cls, params=list(pids), grad=grad,
                                               inference=inference, training=bool(mod.training),
                                               checkpoint=checkpoint,
                                               library=watcher._library_caller(start), outer=outer),
                               rec.finder.location(frame))
            except Exception as exc:
                rec.internal_error("idle module forward", exc)
            return None

        self.patcher.handle(module.register_forward_pre_hook(pre_hook))
        marked = [0]
        tag = (mid, cls, tuple(pids), False)
        unused_tag = (mid, cls, tuple(pids), True)

        def post_hook(mod, args, output):
            if marked[0] >= _MARKED_FORWARDS or not torch.is_grad_enabled():
                return None
            try:
                marked[0] += 1
                outputs = output if isinstance(output, (tuple, list)) else (output,)
                for out in outputs[:4]:
                    node = getattr(out, "grad_fn", None) if isinstance(out, torch.Tensor) else None
                    if node is not None:
                        metadata = node.metadata
                        metadata[_KEY] = tag if watcher._uses(node, pids) else unused_tag
                        metadata[_ALIVE_KEY] = alive = _Alive()
                        _LIVE.add(weakref.ref(alive, _LIVE.discard))
            except Exception as exc:
                rec.internal_error("idle module output", exc)
            return None

        self.patcher.handle(module.register_forward_hook(post_hook))
        self.watching = True
        if self._detach_wrapper is None:
            self._watch_detaches()

    def _watch_detaches(self) -> None:
        """``Tensor.detach`` wrapped for its next ``_DETACHES`` calls: a detach of a tensor whose
        graph reaches a marked output is where that output is cut from the loss."""
        original = torch.Tensor.detach
        self._detaches = _DETACHES
        self._detach_original = original
        self._detach_wrapper = watched(original, self._detach_call)
        self.patcher.patch(torch.Tensor, "detach", self._detach_wrapper)

    def _detach_call(self, args, kwargs) -> None:
        self._detaches -= 1
        if self._detaches < 0:
            if torch.Tensor.__dict__.get("detach") is self._detach_wrapper:
                torch.Tensor.detach = self._detach_original
            return
        tensor = args[0] if args else None
        if getattr(tensor, "grad_fn", None) is None:
            return
        # the script's own detach: not torch's or a watcher's inside the module call
        if not self.rec.finder.is_user_file(sys._getframe(2).f_code.co_filename) or not _LIVE:
            return
        tag = self._marker_below(getattr(tensor, "grad_fn", None) if isinstance(tensor, torch.Tensor) else None)
        if tag is None:
            return
        mid, cls, pids, unused = tag
        if unused:
            return  # a detach cannot be what leaves parameters the forward never uses idle
        rec = self.rec
        loc = rec.here()
        if loc is not None and ("detach", mid, loc) not in self._losses:
            self._losses.add(("detach", mid, loc))
            rec.emit_aside(ev.idle_detach(mid=mid, cls=cls, params=list(pids)), loc)

    def _uses(self, node, pids) -> bool:
        """Does the graph below a module's output reach one of the idle parameters? False only
        when the walk saw all of it (within ``_USES_NODES`` nodes) without them: the module's
        forward does not use them (a parameter left out of forward, a parametrization that
        ignores its original), so no loss of its output can be what leaves them without a grad."""
        try:
            wanted = {id(t) for pid in pids if (t := self.rec.tensor(pid)) is not None}
            todo, seen = [node], set()
            while todo:
                if len(seen) >= _USES_NODES:
                    return True  # not walked to its end: not told
                node = todo.pop()
                if node is None or id(node) in seen:
                    continue
                seen.add(id(node))
                if id(getattr(node, "variable", None)) in wanted:
                    return True
                todo.extend(child for child, _ in node.next_functions)
            return False
        except Exception as exc:
            self.rec.internal_error("idle module marker", exc)
            return True

    def _marker_below(self, node):
        """The marker of a watched module's output within ``_LOSS_NODES`` nodes below ``node``."""
        try:
            todo, seen = [node], set()
            while todo and len(seen) < _LOSS_NODES:
                node = todo.pop()
                if node is None or id(node) in seen:
                    continue
                seen.add(id(node))
                tag = node.metadata.get(_KEY)
                if tag is not None:
                    return tag
                todo.extend(child for child, _ in node.next_functions)
        except Exception as exc:
            self.rec.internal_error("idle module marker", exc)
        return None

    def loss_call(self, fn: str, input) -> None:
        """A wrapped loss function's call (only once a module is watched): an ``idle_loss`` aside
        when ``input``'s graph reaches a watched module's marked output (see the module docs)."""
        node = getattr(input, "grad_fn", None) if isinstance(input, torch.Tensor) else None
        if node is None or not _LIVE:
            return
        rec = self.rec
        tag = self._marker_below(node)
        if tag is None:
            return
        try:
            mid, cls, pids, unused = tag
            loc = rec.here()
            if (mid, loc) not in self._losses:
                self._losses.add((mid, loc))
                rec.emit_aside(ev.idle_loss(mid=mid, cls=cls, params=list(pids), fn=fn,
                                            unused=unused), loc)
        except Exception as exc:
            rec.internal_error("idle module loss", exc)

    def _library_caller(self, frame) -> bool:
        """Is the code that called the module (the first frame outside torch) a library's, not
        the user's: ``BertModel.forward`` calling its pooler? Once per call line and mode."""
        f = frame
        for _ in range(_MAX_FRAMES):
            if f is None or not f.f_code.co_filename.startswith(_TORCH_DIR):
                break
            f = f.f_back
        return f is not None and not self.rec.finder.is_user_file(f.f_code.co_filename)

    def _checkpoint_caller(self, frame):
        """Inside a reentrant checkpoint's no-grad forward: (the frame that called
        ``checkpoint()``, who did: 'user', 'transformers' or 'library'); else (frame, None).
        Once per call line of an idle module, not per forward."""
        f = frame
        for _ in range(_MAX_FRAMES):
            if f is None:
                return frame, None
            if f.f_code is _REENTRANT:
                break
            f = f.f_back
        else:
            return frame, None
        while f is not None and f.f_code.co_filename.startswith(_TORCH_DIR):
            f = f.f_back  # Function.apply, checkpoint(), torch's dynamo-disable wrapper
        if f is None:
            return frame, "library"
        filename = f.f_code.co_filename
        if self.rec.finder.is_user_file(filename):
            return f, "user"
        return f, "transformers" if f"{os.sep}transformers{os.sep}" in filename else "library"

    def install(self, patcher) -> None:
        self.patcher = patcher
