"""A term of the loss computed twice: two terms summed into the loss that are the same ops, with
the same arguments, on the same inputs, where the second copy was meant to take another operand.

Copy-pasted terms of a hand-written loss: a Chamfer distance whose second direction repeats the
first (``d.min(2)`` twice where ``d.min(1)`` was meant), a smoothness term whose vertical
gradient repeats the horizontal slicing, a bidirectional photometric or cycle loss whose second
direction warps or maps the same images again, a deep-supervision loop that upsamples
``preds[0]`` at every scale. The sum is one term with its weight changed; the operand the copy
was written for never reaches the loss. Loss functions called twice on the same operands are
watched at their calls too (repeatedloss.py); this watcher reads any term, hand-written ones
included, from the graph.

What is judged: at the backward (``DESCRIBE_LOSS``) that follows a window, the loss's linear top
is walked from its root through the nodes that only sum or scale what reaches them (additions,
subtractions, negations, products or quotients by a number, sums and means, views); the first
other node on each path is a term. Two distinct terms are the same computation when, walked
down together, each pair of nodes has the same type, the same inputs (the same node, or again
the same computation) and the same saved arguments: numbers equal, tensors equal in value (two
outputs of one op made twice hold equal values, a random op's do not: dropout, sampling never
match). Two copies with a random draw of the script's between them (counted by the window's mode)
are two Monte-Carlo passes: the part of each pass that took no draw repeats by design (each weight
sample's -log sigma in a variational log q(w)). A node reached only through saved-tensor hooks (checkpointing, offloading) is never
unpacked: the terms are then not told.

Where: the window (a ``TorchFunctionMode``, opened after an optimizer step and closed at the next
backward, ``_WINDOWS`` times) notes, for each op output with a graph, the user's frames that made
it (outermost first: each frame with its line, the frames kept alive for the window so that two
calls of one helper are told apart). The earliest-made pair of nodes of the two copies is
compared frame by frame from the outside in: the first frame that differs names the line to
change: the same frame at two lines, the later line (the copy); two calls of a helper, the line
that called it twice; no difference (one expression twice, a loop), the innermost line.
"""

from __future__ import annotations

import os
import sys

import torch

from .. import events as ev
from .dependency import close_before_compile
from torch.overrides import TorchFunctionMode

from .follow import UninstallHandle, push_mode, remove_mode, tensors_out
from .graphpaths import packed, reached, saved
from .lossfactor import python_number
from .patcher import Originals
from .recorder import Recorder
from .topics import DESCRIBE_LOSS, STEPPED

_WINDOWS = 2  # forwards followed (each from an optimizer step to the next backward)
_PLACED = 20000  # op outputs placed per window at most
_TOP = 512  # nodes of the loss's linear top walked
_TERMS = 64  # terms compared at most
_PAIRS = 5000  # node pairs compared per backward at most (all term pairs together)
_NUMEL = 1 << 24  # saved tensors larger than this are not compared by value (the terms: not told)
_LEAVES = 20000  # nodes walked below a term to name the parameters that made it
# nodes that only pass on (a multiple of) what reaches them: the terms lie below them
_PASS = ("ViewBackward", "ReshapeAlias", "UnsafeViewBackward", "SqueezeBackward", "UnsqueezeBackward",
         "PermuteBackward", "TransposeBackward", "TBackward", "CloneBackward", "ToCopyBackward",
         "ExpandBackward", "AliasBackward", "SumBackward", "MeanBackward", "NegBackward",
         "AddBackward", "SubBackward", "RsubBackward")
_SCALE = ("MulBackward", "DivBackward")
# ops that draw random numbers: two draws are never the same computation
_RANDOM = ("NativeDropout", "FusedDropout", "Dropout", "Bernoulli", "Normal", "Uniform", "Multinomial",
           "RandomSample", "Rrelu", "Poisson", "Exponential", "Geometric", "Cauchy", "LogNormal")
# torch functions and tensor methods that draw random numbers, by name: a draw made between the
# two copies makes them two Monte-Carlo passes (a sample's noise often enters the graph as a saved
# constant, randn_like's output times sigma, so the graph alone does not show the draw)
_DRAWS = frozenset((
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "normal",
    "normal_", "bernoulli", "bernoulli_", "uniform_", "multinomial", "poisson", "exponential_",
    "geometric_", "cauchy_", "log_normal_", "random_", "dropout", "dropout_", "alpha_dropout",
    "feature_alpha_dropout", "feature_dropout", "native_dropout", "rrelu", "rrelu_"))
_MISSING = object()
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _scale_child(node):
    """The input of a product or quotient by a number (a Python number or a 0-d CPU tensor),
    else None."""
    children = [(i, child) for i, (child, _) in enumerate(node.next_functions) if child is not None]
    if len(children) != 1:
        return None
    index, child = children[0]
    if type(node).__name__.startswith("DivBackward") and index != 0:
        return None  # a number divided by the term
    factor = saved(node, "_saved_other" if index == 0 else "_saved_self", _MISSING)
    if isinstance(factor, (int, float)) and not isinstance(factor, bool):
        return child  # by a Python number (some builds save it as one)
    return child if factor is not _MISSING and python_number(factor) is not None else None


def linear_terms(root, limit: int = _TOP, most: int = _TERMS) -> list:
    """The terms of the loss (see the module's docs), in the order the walk meets them."""
    terms: list = []
    seen: set = set()
    stack = [root]
    while stack and len(seen) < limit and len(terms) < most:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        name = type(node).__name__
        if name.startswith(_PASS):
            stack.extend(reversed([child for child, _ in node.next_functions if child is not None]))
        elif name.startswith(_SCALE) and (child := _scale_child(node)) is not None:
            stack.append(child)
        elif name != "AccumulateGrad":
            terms.append(node)
    return terms


def _saved_names(node) -> list[str]:
    return [name for name in dir(node) if name.startswith("_saved_")]


def _same_value(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return False
        if a is b:
            return True
        if a.numel() > _NUMEL or a.layout != torch.strided or b.layout != torch.strided:
            return False
        with torch.no_grad():
            return bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if not (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple))) or len(a) != len(b):
            return False
        return all(_same_value(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:
        return False


def _same_saved(a, b) -> bool:
    names = _saved_names(a)
    if names != _saved_names(b):
        return False
    for name in names:
        if packed(a, name) or packed(b, name):
            return False  # never unpacked: a checkpoint would run its forward again
        va, vb = saved(a, name, _MISSING), saved(b, name, _MISSING)
        if va is _MISSING or vb is _MISSING or not _same_value(va, vb):
            return False
    return True


def same_computation(a, b, budget: list) -> list | None:
    """The pairs of nodes (one from below ``a``, one from below ``b``) that make ``a`` and ``b``
    the same computation, ``a`` and ``b`` first; None when they are not (or when ``budget[0]``
    pairs ran out)."""
    pairs: list = []
    seen: set = set()
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if x is y or (x, y) in seen:
            continue
        seen.add((x, y))
        budget[0] -= 1
        if budget[0] < 0 or type(x) is not type(y):
            return None
        name = type(x).__name__
        if name == "AccumulateGrad" or name.startswith(_RANDOM):
            return None  # two leaves, or two random draws
        nx, ny = x.next_functions, y.next_functions
        if len(nx) != len(ny):
            return None
        for (cx, ix), (cy, iy) in zip(nx, ny):
            if (cx is None) != (cy is None) or ix != iy:
                return None
            if cx is not None and cx is not cy:
                stack.append((cx, cy))
        if not _same_saved(x, y):
            return None
        pairs.append((x, y))
    return pairs


_READS = ("IndexBackward", "SelectBackward", "SliceBackward", "UnsqueezeBackward", "SqueezeBackward",
          "ViewBackward", "ReshapeAlias", "TBackward", "PermuteBackward", "ExpandBackward")


def _table_read(pairs) -> bool:
    """Whether the two terms only read entries of a parameter (or other leaf): a transition score
    or an embedding row picked at data-given positions, which a sequence may pick twice (a CRF's
    gold path through the same transition): the same entry, not a computation written twice."""
    for x, _ in pairs:
        if not type(x).__name__.startswith(_READS):
            return False
        if any(child is not None and type(child).__name__ not in ("AccumulateGrad",)
               and not type(child).__name__.startswith(_READS) for child, _ in x.next_functions):
            return False
    return True


def _sequence(node) -> int:
    try:
        return int(node._sequence_nr())
    except Exception:
        return -1


def line_to_change(first: tuple, second: tuple):
    """``(the location to change, the line of the first copy)`` from the frames that made a
    node of each copy (outermost first, ``(frame id, Location)``): see the module's docs."""
    for depth, ((fa, la), (fb, lb)) in enumerate(zip(first, second)):
        if fa != fb:
            if depth == 0:
                return lb, la.line
            return second[depth - 1][1], second[depth - 1][1].line  # one line called a helper twice
        if la != lb:
            return lb, la.line
    if not second:
        return None, None
    return second[-1][1], first[-1][1].line if first else None


class _PlaceMode(TorchFunctionMode):
    """Hands each call's result to ``watcher.follow`` while the window is open. A function
    graddoctor wraps reaches the mode from inside its wrapper (torch looks the public name up
    again): the original is called, so that the wrapper's own watchers hear of the call once."""

    def __init__(self, watcher, originals: Originals):
        super().__init__()
        self.watcher, self.originals = watcher, originals

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = self.originals.original_of(func)(*args, **(kwargs or {}))
        watcher = self.watcher
        if watcher.following:
            if getattr(func, "__name__", None) in _DRAWS:
                try:
                    watcher.note_draw()
                except Exception as exc:
                    watcher.following = False
                    watcher.rec.internal_error("repeated_term", exc)
                    return out
            try:
                watcher.follow(func, args, kwargs, out)
            except Exception as exc:
                watcher.following = False
                watcher.rec.internal_error("repeated_term", exc)
        return out


class RepeatedTermWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.following = False
        self.closed = False
        self._mode: _PlaceMode | None = None
        self._patcher = None
        self._thread: int | None = None
        self._windows = 0
        self._placed: dict = {}  # autograd node -> ((frame id, Location), ...) outermost first
        self._drawn: dict = {}  # autograd node -> random draws made in the window before it
        self.draws = 0
        self._frames: dict = {}  # id(frame) -> frame, kept for the window: ids are not reused
        self._told: set = set()

    # -- the window --------------------------------------------------------------------------
    def after_step(self, opt, optimizer) -> None:
        if self.closed or self._windows >= _WINDOWS:
            if self._mode is None:  # nothing left to follow: off the steps and backwards
                self.rec.retire(STEPPED, self.after_step)
                self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
            return
        if self._mode is not None:
            return
        mode = _PlaceMode(self, self._patcher.originals() if self._patcher is not None else Originals())
        thread = push_mode(mode, self.rec, "repeated_term")
        if thread is None:
            self.closed = True
            return
        self._mode, self._thread = mode, thread
        self._windows += 1
        self.following = True

    def follow(self, func, args, kwargs, out) -> None:
        if len(self._placed) >= _PLACED:
            return
        stack = None
        for tensor in tensors_out(out):
            node = tensor.grad_fn
            if node is None or node in self._placed:
                continue
            if stack is None:
                stack = self._stack()
            self._placed[node] = stack
            self._drawn[node] = self.draws

    def note_draw(self) -> None:
        """Counts a random draw the script made. graddoctor's own probes draw too (with their
        own generator): a draw called from graddoctor's code is left out, other than from a
        watcher's mode passing the call on or a wrapper (its code is ``<graddoctor: ...>``)."""
        frame = sys._getframe(2)
        finder = self.rec.finder
        while frame is not None:
            code = frame.f_code
            if code.co_filename.startswith(_PACKAGE) and code.co_name != "__torch_function__":
                return
            filename = code.co_filename
            if finder.is_user_file(filename):
                break
            frame = frame.f_back
        self.draws += 1

    def _stack(self) -> tuple:
        finder, frames = self.rec.finder, self._frames
        out = []
        for frame in finder.user_frames(sys._getframe(1)):
            frames.setdefault(id(frame), frame)
            out.append((id(frame), finder.location(frame)))
        out.reverse()
        return tuple(out)

    def _close(self) -> None:
        self.following = False
        self._placed, self._frames, self._drawn = {}, {}, {}
        self.draws = 0
        if remove_mode(self._mode, self._thread, self.rec, "repeated_term"):
            self._mode = None

    # -- DESCRIBE_LOSS -----------------------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        if self._mode is None:
            return {}
        try:
            self.following = False
            if not self.closed:
                self._judge(tensors)
        except Exception as exc:
            self.rec.internal_error("repeated_term", exc)
        finally:
            self._close()
        return {}

    def _judge(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        roots = [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        if len(roots) != 1:
            return
        terms = linear_terms(roots[0])
        budget = [_PAIRS]
        for i, a in enumerate(terms):
            for b in terms[i + 1:]:
                if type(a) is not type(b) or budget[0] <= 0:
                    continue
                pairs = same_computation(a, b, budget)
                if pairs and not _table_read(pairs) and self._tell(a, b, pairs):
                    return

    def _tell(self, a, b, pairs) -> bool:
        if _sequence(a) > _sequence(b):
            pairs = [(y, x) for x, y in pairs]
            a, b = b, a
        placed = [(x, y) for x, y in pairs if x in self._placed and y in self._placed]
        if not placed:
            return False
        x, y = min(placed, key=lambda pair: _sequence(pair[1]))
        if max(self._drawn.get(n, 0) for n, _ in placed) < max(self._drawn.get(n, 0) for _, n in placed):
            # a random draw between the copies: two Monte-Carlo passes (a variational posterior's
            # log sigma in each sample's log q), whose other terms took the fresh draw
            return False
        loc, first_line = line_to_change(self._placed[x], self._placed[y])
        if loc is None or loc in self._told:
            return False
        tracked = self.rec.tensors
        walked = reached(b, _LEAVES, truncate=True)[1]
        pids = sorted(pid for i in walked if (pid := tracked.number.get(i)) is not None
                      and id(tracked.refs[pid]()) == i)
        if not pids:
            return False
        self._told.add(loc)
        self.rec.emit_aside(ev.term_repeated(op=type(b).__name__, first_line=first_line,
                                             params=pids[:64]), loc)
        return True

    # -- install -----------------------------------------------------------------------------
    def before_compile(self) -> None:
        # a graph traced with the mode on the stack would trace graddoctor's handler
        self.closed = True
        self._close()

    def install(self, patcher) -> None:
        self._patcher = patcher
        close_before_compile(patcher, self.before_compile)
        patcher.handle(UninstallHandle(self))

    def uninstall(self) -> None:
        self.closed = True
        self.following = False
        self._placed, self._frames, self._drawn = {}, {}, {}
        if remove_mode(self._mode, self._thread, self.rec, "repeated_term"):
            self._mode = None
