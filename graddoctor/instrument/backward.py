"""Backward calls and which parameters each one writes.

``Tensor.backward`` / ``torch.autograd.backward`` are wrapped. Before the original runs, every
tracked parameter's ``.grad`` is read once (hot path): absent or left by zero_grad means the
gradient will arrive fresh, the one graddoctor last saw means it accumulates. After the original
returns, a parameter whose ``.grad`` is another tensor or has a new version was written by this
backward, and its new grad is noted. That covers backwards nested in the running one (reentrant
activation checkpointing backpropagates each segment on its own) and ``inputs=``.

The graph is walked (``_leaves``) only to find leaves graddoctor does not track yet: parameters
no optimizer owns, and leaves that are not parameters at all (FGSM's input, whose gradient is
the point of that backward). A walk costs more than the rest of a backward's bookkeeping on a
small model, so it runs on each call line's first backwards, whenever parameters were
registered on a module since, on every backward of a line that showed non-parameter leaves,
and otherwise on a line's 16th call, then at gaps that double up to every 256th (a walk visits
every graph node: a long run's walks cost a bounded share); an unwalked backward repeats its
line's last count.

A non-parameter leaf is only counted, unless a later walk meets the very same tensor again: one
that lives across backwards (a learnable temperature made with ``requires_grad=True`` and left
out of the optimizer) is then tracked like a parameter (``_seen_leaf``); a fresh input each step
(FGSM, a gradient penalty's interpolate) never is.

No per-parameter hooks: on the tiny MLP of the overhead benchmark, 20 Python tensor hooks alone
cost about 17 us per step, more than these two passes.

Carried history (hidden-state-not-detached). A backward called with ``retain_graph=True`` (or
``create_graph=True``) keeps its graph, so a later backward can go through it again: an RNN's
hidden state carried from chunk to chunk without ``detach()`` makes every backward re-walk all
earlier chunks. On those backwards only, and only when its line is due for a walk anyway, the walk
is ``_history_walk``: it also counts the graph's interior nodes and marks each node that feeds a
leaf (a parameter) in the node's own ``metadata`` dict with this backward's cell (a one-item list
that ``end`` fills with its event's seq). Meeting a node an earlier backward marked means this one
reaches that backward's graph: the event lists, per such backward, the tracked leaves fed through
it (``history``). The mark lives and dies with the autograd node (no id reuse, nothing held), and
Python wrappers of nodes are not stable between walks, which is why it is not a set of ours.
Backwards without retain_graph (normal loops) run exactly the walk described above.

Deep graphs: a walked node keeps a Python object as long as it lives, and such nodes are freed by
recursion; the walks hold one node in every ``graphkeep.KEEP_EVERY`` (see instrument/graphkeep.py)
and each backward first lets go of the held nodes the script has dropped since.

Threads: a backward is nested (its writes are the outer one's) when its thread already runs one,
or when it comes from a thread Python did not start (autograd's device threads run reentrant
checkpoints) while any runs (``Recorder.in_backward``). A backward another thread of the script
calls meanwhile is its own, and recorded. A backward reads and judges only the tensors its
thread owns (``Recorder.owner``: the thread that tracked a tensor, or whose walk last reached it;
each thread walks its own first backwards of a line): autograd writes a leaf's ``.grad`` without
the GIL, so reading a tensor another thread's running backward writes would race with that write
and crash. A tensor that several threads have owned (one model trained from several threads) is
not read while another thread's backward runs.
"""

from __future__ import annotations

import functools
import math
import sys
import weakref
from collections.abc import Sequence
from itertools import compress, islice, repeat
from operator import eq, is_, is_not
from threading import get_ident

import torch

from .. import events as ev
from ..location import same_chain
from .fold import Folder, exact, plain_data
from .graphkeep import HELD, KEEP_EVERY, hold, sweep
from .handstep import HandStepDirection
from .gradstate import Tensor, grads_of, local, states_of
from .identities import call

_has_torch_function_unary = torch._C._has_torch_function_unary
from .recorder import SAME_LIST_MIN, Recorder
from .topics import DESCRIBE_LOSS, LEAF_TRACKED
from .gradstate import version as grad_version

FRESH, ACCUMULATED, CLEARED_OUTSIDE = 0, 1, 2
_ROOT_MARK = "graddoctor.backward"  # key of the mark a retained backward leaves on its loss node


def _among(pids: list, written: list) -> list | None:
    """The pids of ``pids`` that are in ``written``, None when there are none."""
    if not pids:
        return None
    keep = set(written)
    return [pid for pid in pids if pid in keep] or None


class BackwardContext:
    __slots__ = ("pids", "tensors", "before", "held", "extra_leaves", "cell", "graph_nodes",
                 "history", "repeats", "root_cell", "kept", "updated_by_hand", "applied_by_hand",
                 "hand_step_cosine", "hand_step_scale", "rescaled")
    cell: list | None  # its nodes' mark: [seq of its event once emitted, session]
    graph_nodes: int | None  # interior nodes, when walked with _history_walk
    history: list | None  # [[seq of an earlier backward, [pid]]], see events.backward
    repeats: int | None  # seq of a retained backward of the same loss tensor
    root_cell: list | None  # the mark left on its loss's node: [its event's seq]

    def __init__(self):
        # the tracked tensors this backward judges, as parallel lists (``read_before``): their
        # pids, the tensors (None: died), their grads before it (None: none). The grads are
        # held only while the backward runs, so that a replacement cannot reuse their id.
        self.pids: Sequence[int] = ()
        self.tensors: list = []
        self.before: list = []
        self.held: dict[int, tuple[int, int]] = {}  # index of a grad before -> (version, verdict)
        self.extra_leaves = 0
        self.cell = self.graph_nodes = self.history = self.repeats = self.root_cell = None
        # hand-written updates (BackwardWatcher._hand_updates): the indices of the tensors whose
        # grad before is the one a backward wrote (read_before); then the pids of the tensors
        # no optimizer owns that changed since a backward last wrote them, and of those the
        # ones whose grad this backward adds onto (_written)
        self.kept: list[int] = []
        self.updated_by_hand: list[int] = []
        self.applied_by_hand: list[int] = []
        # the cosine between the last hand-written update and the gradient it applied, measured
        # after the first few such updates (instrument/handstep.py); None otherwise
        self.hand_step_cosine: float | None = None
        self.hand_step_scale: float | None = None  # its step size, when plain SGD (handstep.py)
        # pids whose grad the script changed in place, not to zero, after a step applied it
        # (``p.grad *= momentum``: a hand-written momentum keeps a decayed sum on purpose)
        self.rescaled: list[int] = []

    def verdicts(self) -> dict[int, int]:
        """pid -> verdict of each tensor that had a grad before the backward."""
        pids = self.pids
        return {pids[i]: verdict for i, (_version, verdict) in self.held.items()}


WALK_FIRST = 3  # backwards of a call line that are always walked
# after those, the WALK_EVERY-th, then at gaps that double up to WALK_MOST: a walk costs one
# visit per graph node, so a long run's walks cost a bounded share of its steps, while a leaf
# that is new late in a run (not a registered parameter: those trigger a walk) is still found
WALK_EVERY = 16
WALK_MOST = 256


class _Line:
    """What the graph walks of one backward call line found."""

    __slots__ = ("calls", "extra_leaves", "registrations", "next_walk", "gap")

    def __init__(self) -> None:
        self.calls = 0
        self.extra_leaves = 0
        self.registrations = -1  # parameter registrations counted at its last walk
        self.next_walk = WALK_EVERY  # the call count of the next periodic walk
        self.gap = WALK_EVERY

    def periodic_walk_due(self) -> bool:
        if self.calls < self.next_walk:
            return False
        self.gap = min(self.gap * 2, WALK_MOST)
        self.next_walk = self.calls + self.gap
        return True


# keys of a backward event that only its context writes (none on the straight-line path)
_SKIM = object()  # _steady_before's answer on a skimmed turn (Folder.skimming)
_CTX_KEYS = frozenset({"repeats", "updated_by_hand", "applied_by_hand", "hand_step_cosine",
                       "hand_step_scale",
                       "thread"})

_PLAIN = (Tensor, torch.nn.Parameter)  # tensors whose own version and values are read


def _cpu_norms(tensors: list) -> list:
    """The L2 norm of each dense tensor on the CPU (one batched op), None for one elsewhere
    (reading it would synchronise the host), sparse, a subclass, or of a dtype without a norm."""
    norms: list = [None] * len(tensors)
    cpu = [i for i, t in enumerate(tensors) if t.device.type == "cpu" and t.is_floating_point()
           and t.layout == torch.strided and type(t) in _PLAIN]
    if cpu:
        with torch.no_grad():
            values = torch._foreach_norm([tensors[i].detach() for i in cpu])
        for i, value in zip(cpu, values):
            norms[i] = value.item()
    return norms


_SAMPLE = 64  # values per tensor compared with its gradient (hand-written updates)
_FOLLOWS = 0.45  # |cosine| of a change with the gradient it applied: hand-written SGD ~1, Adam ~0.65;
# a target network copied from the model it serves ~0.2-0.3 (their gradients are related)


def _sample(tensor) -> Tensor | None:
    """A copy of the first values of a CPU tensor (its change is compared with its grad)."""
    if tensor.device.type != "cpu" or not tensor.is_floating_point() \
            or tensor.layout != torch.strided:
        return None
    with torch.no_grad():
        return tensor.detach().reshape(-1)[:_SAMPLE].float().clone()


def _follows_gradients(moves: list[tuple]) -> bool:
    """Whether the changes of the tensors (together) lie along or against the gradients they
    held: descent, or an attack's ascent; a copy from another model does neither."""
    with torch.no_grad():
        change = torch.cat([m[0] for m in moves])
        grad = torch.cat([m[1] for m in moves])
        scale = float(change.norm()) * float(grad.norm())
        if scale == 0.0 or not math.isfinite(scale):
            return True  # nothing to tell by: as before
        return abs(float(change @ grad)) / scale >= _FOLLOWS


def _moved(before: float | None, now: float | None) -> bool:
    """Two norms of one tensor tell it changed (NaN stays NaN; unknown tells nothing)."""
    return (before is not None and now is not None and before != now
            and not (math.isnan(before) and math.isnan(now)))


# AccumulateGrad nodes are where a backward writes into a leaf's .grad
_ACCUMULATE_GRAD = getattr(getattr(torch._C, "_functions", None), "AccumulateGrad", None)

LEAVES_REMEMBERED = 256  # non-parameter leaves remembered from one walk to the next

HISTORY_KEY = "graddoctor.walked_by"  # the mark a history walk leaves in a node's metadata
HISTORY_LIMIT = 100_000  # nodes a history walk marks; past them it only counts and finds leaves
HISTORY_ENTRIES = 8  # earlier backwards listed per event: the 4 first and the 4 last


def _leaves(tensors, inputs) -> list:
    """Leaf tensors the backward will accumulate into (graph walk over ``next_functions``).

    Runs once per backward over every graph node, so it is kept lean: nodes go into ``seen``
    themselves (identity hash, no ``id()`` calls) and AccumulateGrad is told by its type, not
    by ``getattr(node, "variable", None)``, which raises and catches on every other node.
    """
    if inputs is not None:
        items = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
        return [t for t in items if isinstance(t, torch.Tensor) and t.is_leaf]
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    leaves = []
    seen = set()
    stack = []
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        if t.grad_fn is not None:
            if t.grad_fn not in seen:
                seen.add(t.grad_fn)
                stack.append(t.grad_fn)
        elif t.requires_grad:  # backward on a leaf itself
            leaves.append(t)
    accumulate_grad = _ACCUMULATE_GRAD
    add, push, pop, found = seen.add, stack.append, stack.pop, leaves.append
    countdown = KEEP_EVERY  # every KEEP_EVERY-th node is held (graphkeep: deep graphs)
    while stack:  # each node is marked seen when first pushed, so it is expanded once
        for child, _ in pop().next_functions:
            if child is None or child in seen:
                continue
            add(child)
            if type(child) is accumulate_grad or (accumulate_grad is None and hasattr(child, "variable")):
                found(child.variable)
            else:
                push(child)
                countdown -= 1
                if not countdown:
                    countdown = KEEP_EVERY
                    hold(child)
    return leaves


def _history_walk(tensors, cell: list, limit: int = HISTORY_LIMIT):
    """``_leaves`` (without ``inputs``) that also counts the interior nodes and looks for the
    graphs of earlier backwards: each node feeding a leaf gets ``cell`` ([seq, session]) as its
    mark unless it has one of this session; a mark of another backward of this session means this
    graph reaches that backward's nodes.

    Returns (leaves, interior node count, shared, complete): ``shared`` maps id(earlier cell) to
    (that cell, {id(leaf): leaf fed through its nodes}); ``complete`` is False when the marks were
    not all looked at (more than ``limit`` nodes, or a node without ``metadata``). Iterative: a
    chain of any depth is fine.
    """
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    leaves: list = []
    seen: set = set()
    stack: list = []
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        if t.grad_fn is not None:
            if t.grad_fn not in seen:
                seen.add(t.grad_fn)
                stack.append(t.grad_fn)
        elif t.requires_grad:
            leaves.append(t)
    accumulate_grad = _ACCUMULATE_GRAD
    add, push, pop, found = seen.add, stack.append, stack.pop, leaves.append
    shared: dict = {}
    nodes = 0
    countdown = KEEP_EVERY
    checking, complete = True, True
    while stack:
        node = pop()
        nodes += 1
        if checking and nodes > limit:
            checking = complete = False
        looked = not checking  # its mark: read (and set) at its first leaf child
        earlier = None
        for child, _ in node.next_functions:
            if child is None:
                continue
            if type(child) is accumulate_grad or (accumulate_grad is None and hasattr(child, "variable")):
                if not looked:
                    looked = True
                    try:
                        marks = node.metadata
                        mark = marks.get(HISTORY_KEY)
                        if mark is None or mark[-1] is not cell[-1]:  # unmarked, or by another run
                            marks[HISTORY_KEY] = cell
                        elif mark is not cell:
                            earlier = mark
                    except Exception:  # no metadata on this node (or this torch): stop looking
                        checking = complete = False
                if earlier is not None:
                    variable = child.variable
                    entry = shared.get(id(earlier))
                    if entry is None:
                        entry = shared[id(earlier)] = (earlier, {})
                    entry[1][id(variable)] = variable
                if child not in seen:
                    add(child)
                    found(child.variable)
            elif child not in seen:
                add(child)
                push(child)
                countdown -= 1
                if not countdown:  # graphkeep: every KEEP_EVERY-th node is held (deep graphs)
                    countdown = KEEP_EVERY
                    hold(child)
    return leaves, nodes, shared, complete


class BackwardWatcher:
    def __init__(self, rec: Recorder, optimizers, aside=None):
        self.rec = rec
        self.optimizers = optimizers  # the optimizer watcher: ``closure_step``
        self.cpu_checks = True
        self._describe_loss = rec.subscribers(DESCRIBE_LOSS)
        self._leaf_tracked = rec.subscribers(LEAF_TRACKED)
        # writes outside .grad (FSDP2 without gradient sync; the DDP watcher): an object with
        # ``fsdp_seen``, ``is_shadow(leaf)``, ``unsynced`` (true while some are possible) and
        # ``written_aside()`` (pids); and the pids set aside since their .grad was last written
        self.aside = aside
        self.aside_pending: set[int] = set()
        self._lines: dict = {}  # (path, line) of a backward call -> _Line
        self.registrations = 0  # parameters registered on any module (a global module hook)
        self._always_walk = False  # torch without that hook: nothing tells when to walk again
        self._roots_marked = False  # a retained backward has marked its loss node
        # (torch's own ``torch.autograd.backward``, our wrapper of it): a skimmed
        # ``loss.backward()`` calls the first itself, as torch's ``Tensor.backward`` would, when
        # the second is still the one torch's would call (``_skim_backward``); None: not installed
        self._autograd_direct: tuple | None = None
        self._session = object()  # in the marks of this run's walks (a graph may outlive a run)
        self._leaf_once: dict[int, weakref.ref] = {}  # non-parameter leaves walked once
        self._persistent: set[int] = set()  # pids of non-parameter leaves walked again later
        # tracked tensors no optimizer owns (a hand-written update's): pid -> (version, norm or
        # None) of the tensor when a backward last wrote its grad (see _hand_updates)
        self._owned = optimizers.owned_pids()
        # pid -> (version, norm, value sample, grad sample) after the last backward writing it
        self._marks: dict[int, tuple] = {}
        self._direction = HandStepDirection()  # which way the first hand-written updates go
        self._step_cosine: float | None = None
        self._step_scale: float | None = None
        self._steps_at_backward = 0  # rec.progress.steps when the latest backward ended

    # -- graph walks ---------------------------------------------------------------------------
    def _walk_due(self, loc) -> tuple[_Line, bool]:
        """The line's record, and whether this backward's graph should be walked."""
        key = (loc.path, loc.line, get_ident()) if loc is not None else None
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = _Line()
        calls = line.calls = line.calls + 1
        return line, (key is None or self._always_walk or calls <= WALK_FIRST
                      or line.extra_leaves or line.registrations != self.registrations
                      or (calls >= line.next_walk and line.periodic_walk_due()))

    def _walk(self, ctx: BackwardContext, line: _Line | None, tensors, inputs,
              history: bool = False) -> None:
        """Track the new parameters among the leaves this backward writes; count the others.
        ``history`` (a retained graph): walk with ``_history_walk`` and note what it found."""
        rec = self.rec
        pid_of, refs = rec.tensors.number, rec.tensors.refs
        if line is not None:
            line.registrations = self.registrations
        shared = None
        if history and inputs is None:
            ctx.cell = [None, self._session]
            leaves, ctx.graph_nodes, shared, complete = _history_walk(tensors, ctx.cell)
            if not complete and not shared:
                shared = None  # not looked at everywhere: unknown, not "nothing shared"
        else:
            leaves = _leaves(tensors, inputs)
        aside = self.aside if self.aside is not None and self.aside.fsdp_seen else None
        persistent = self._persistent
        owner, me = rec.owner, get_ident()
        # the usual walk (every leaf a tensor this thread tracks already: a model of thousands
        # of parameters, all its optimizer's): the loop below would only count the persistent
        # leaves, so the same tests run as ``map``s in C; anything else takes the loop
        pids = list(map(pid_of.get, map(id, leaves)))
        if (None not in pids and all(map(is_, map(call, map(refs.__getitem__, pids)), leaves))
                and all(map(eq, map(owner.get, pids), repeat(me)))):
            if persistent:
                ctx.extra_leaves += sum(map(persistent.__contains__, pids))
            leaves = ()
        for leaf in leaves:
            pid = pid_of.get(id(leaf))
            if pid is not None and refs[pid]() is leaf:  # tracked already (rec.pid, inlined)
                if owner.get(pid) != me:  # another thread's until now (rec.claim, inlined test)
                    rec.claim(pid)
                if pid in persistent:
                    ctx.extra_leaves += 1
                continue
            if aside is not None and aside.is_shadow(leaf):  # FSDP's unsharded copy of a param
                continue
            if isinstance(leaf, torch.nn.Parameter):  # an optimizer's tensors are tracked already
                rec.track(leaf)
            else:
                ctx.extra_leaves += 1  # e.g. FGSM: the input's gradient is the point
                self._seen_leaf(leaf)
        if line is not None:
            line.extra_leaves = ctx.extra_leaves
        if shared is not None:
            ctx.history = self._history(shared)

    def _seen_leaf(self, leaf) -> None:
        """A leaf that is no parameter: tracked once a second walk meets the same tensor (one
        that lives across backwards, a learnable tensor made with requires_grad=True), never on
        its first sight (a fresh input each step, FGSM's, a gradient penalty's, is never
        tracked). It still counts among the walk's extra leaves."""
        once = self._leaf_once
        ref = once.get(id(leaf))
        if ref is not None and ref() is leaf:
            del once[id(leaf)]
            self._persistent.add(self.rec.track(leaf))
            for subscriber in self._leaf_tracked.now:
                subscriber()
            return
        if len(once) >= LEAVES_REMEMBERED:  # fresh inputs each step: forget the dead ones
            for key in [k for k, r in once.items() if r() is None]:
                del once[key]
            if len(once) >= LEAVES_REMEMBERED:
                once.clear()
        try:
            once[id(leaf)] = weakref.ref(leaf)
        except TypeError:  # a tensor type without weak references: not followed
            pass

    def _history(self, shared: dict) -> list:
        """[[seq of an earlier backward, [pid of the tracked leaves fed through its nodes]]], in
        seq order; the first and last ``HISTORY_ENTRIES // 2`` of them. A mark of another run
        (a graph that outlived it) or of a backward whose event failed is left out."""
        pid = self.rec.pid
        entries = []
        for cell, leaves in shared.values():
            if cell[0] is None or cell[1] is not self._session:  # never emitted; another run's
                continue
            pids = sorted({p for p in map(pid, leaves.values()) if p is not None})
            entries.append([cell[0], pids])
        entries.sort(key=lambda entry: entry[0])
        half = HISTORY_ENTRIES // 2
        return entries if len(entries) <= HISTORY_ENTRIES else entries[:half] + entries[-half:]

    # -- grads before and after (hot path: twice per tracked tensor per backward) ---------------
    # Each pass over the tensors is a few ``map``s that run in C (reading ``.grad`` of every
    # tensor, comparing the grads before with those after); Python code runs per tensor only for
    # the tensors that had a grad before (an accumulation) and, at the end, for the written
    # tensors of such a backward. A loop whose clear sets the grads to None pays no Python work
    # per tensor at all.
    def read_before(self, ctx: BackwardContext) -> None:
        """Judge the ``.grad`` of every tracked tensor this thread owns (``Recorder.readable``) as
        it is before the backward: absent or left by zero_grad (fresh), the one we last saw
        (accumulated), or changed behind our back."""
        rec = self.rec
        pids, refs = rec.readable(rec.others_in_backward())
        ctx.pids = pids
        ctx.tensors = tensors = list(map(call, refs))
        ctx.before = grads = grads_of(tensors)
        if all(map(is_, grads, repeat(None))):  # every grad cleared to None (or no tensor)
            return
        known, zeroed = rec.grads.known, rec.grads.zeroed
        held = ctx.held
        marks = self._marks
        # a step ran since the last backward: grads it applied and nothing cleared (or cleared
        # through ``.data``, which the version counter does not see) are about to be added to
        crossed = rec.progress.steps != self._steps_at_backward
        looked: list[int] = []  # indices of such grads, and of marked tensors' (hand updates)
        for i in compress(range(len(grads)), map(is_not, grads, repeat(None))):
            grad = grads[i]
            pid = pids[i]
            version = grad._version if type(grad) is Tensor else grad_version(grad)
            key = (id(grad), version)
            if key == known.get(pid):
                verdict = ACCUMULATED
                if crossed or (marks and pid in marks):
                    looked.append(i)
            elif key == zeroed.get(pid):
                verdict = FRESH
            else:
                verdict = self._judge_changed(grad)
                if crossed and verdict == ACCUMULATED:
                    ctx.rescaled.append(pid)
            held[i] = (version, verdict)
        if looked and self.cpu_checks:
            try:
                ctx.kept = self._still_written(ctx, looked)
            except Exception as exc:  # loses these facts only, not the backward's event
                rec.internal_error("backward (grads kept across a step)", exc)

    def _still_written(self, ctx: BackwardContext, looked: list[int]) -> list[int]:
        """Of the grads at ``looked`` (the very tensors, at the very versions, a backward wrote),
        the ones zeroed through ``.data`` (``p.grad.data.zero_()``: no version moves) get the
        verdict of a clear by hand; returns the rest that belong to marked tensors (see
        ``_hand_updates``). CPU grads only, in one batched op; an accelerator's are not read
        (that would synchronise the host): they are taken as written, and not as kept."""
        grads, pids, held, marks = ctx.before, ctx.pids, ctx.held, self._marks
        kept: list[int] = []
        for i, norm in zip(looked, _cpu_norms([grads[i] for i in looked])):
            if norm == 0.0:
                held[i] = (held[i][0], CLEARED_OUTSIDE)
            elif norm is not None and pids[i] in marks:
                kept.append(i)
        return kept

    # -- hand-written updates --------------------------------------------------------------------
    # A tensor no optimizer owns is updated by the script's own code (``w -= lr * w.grad`` under
    # no_grad, ``p.data.add_(...)``): graddoctor sees no step, only that the tensor changed
    # between two backwards that write its grad. A backward that adds onto the very grad an
    # earlier backward wrote (not one cleared, zeroed or rescaled since) after the tensor
    # changed adds onto gradients an update already applied: nothing zeroes them.
    def _hand_updates(self, pids, tensors, written, kept: list[int]) -> tuple[list[int], list[int]]:
        """After a backward: the pids of the tensors it wrote that no optimizer owns and that
        changed since a backward last wrote them — their version counter moved (an in-place
        update) or, on the CPU, their norm (``p.data`` edits bypass the counter; on an
        accelerator reading it would synchronise the host) — and of those the ones among
        ``kept`` (indices: the grad before was the one that backward wrote). Marks each such
        tensor for the next backward. Nothing is read while optimizers own every tracked tensor."""
        owned = self._owned
        if len(owned) >= len(self.rec.tensors.refs):
            return [], []
        chosen = [i for i, (pid, tensor, wrote) in enumerate(zip(pids, tensors, written))
                  if wrote and pid not in owned and type(tensor) in _PLAIN]
        if not chosen:
            return [], []
        norms = _cpu_norms([tensors[i] for i in chosen])
        marks, kept = self._marks, set(kept)
        updated: list[int] = []
        applied: list[int] = []
        moves: list[tuple] = []  # (the value change, the grad it followed) of applied tensors
        for i, norm in zip(chosen, norms):
            tensor = tensors[i]
            pid, version = pids[i], tensor._version
            mark = marks.get(pid)
            values = _sample(tensor) if norm is not None else None
            if mark is not None and (version != mark[0] or _moved(mark[1], norm)) and not (
                    norm is not None and norm == mark[1] and values is not None
                    and mark[2] is not None and values.shape == mark[2].shape
                    and torch.equal(values, mark[2])):
                # (an in-place op that left every value as it was, a clamp_ within range, is
                # no update: only its version moved)
                updated.append(pid)
                if i in kept:
                    applied.append(pid)
                    if values is not None and mark[2] is not None and mark[3] is not None \
                            and values.shape == mark[2].shape == mark[3].shape:
                        moves.append((values - mark[2], mark[3]))
            grad = tensor.grad
            marks[pid] = (version, norm, values,
                          _sample(grad) if values is not None and isinstance(grad, Tensor) else None)
        if applied and moves and len(moves) == len(applied) and not _follows_gradients(moves):
            # the tensors changed, but not along the gradients they held (a target network
            # loaded from or blended toward another model): no update applied them
            applied = []
        if not self._direction.done:  # the first hand-written updates: which way they go
            self._step_cosine = self._direction.observe(
                [pids[i] for i in chosen], [tensors[i] for i in chosen], set(updated))
            self._step_scale = self._direction.scale
        return sorted(updated), sorted(applied)

    def _judge_changed(self, grad) -> int:
        """The grad was changed behind our back (``p.grad.zero_()``, ``p.grad = zeros``,
        ``p.grad /= k``). On CPU look whether it is all zeros; on an accelerator we do not
        synchronise and assume a manual clear (the cautious verdict: no false alarm)."""
        if grad.device.type == "cpu" and self.cpu_checks:
            return CLEARED_OUTSIDE if not bool(local(grad).any()) else ACCUMULATED
        return CLEARED_OUTSIDE

    def begin(self, tensors, inputs, loc, retained: bool = False) -> BackwardContext:
        """``retained``: called with retain_graph (or create_graph) true."""
        rec = self.rec
        ctx = BackwardContext()
        rec.progress.count_backward()
        if HELD:  # nodes of deep graphs held by earlier walks: free those the script dropped
            sweep()
        if inputs is not None:  # the leaves are given: no walk needed
            self._walk(ctx, None, tensors, inputs)
        else:
            line, due = self._walk_due(loc)
            if due:
                self._walk(ctx, line, tensors, inputs, history=retained)
            else:
                ctx.extra_leaves = line.extra_leaves
        self.read_before(ctx)
        if retained or self._roots_marked:  # else nothing to look at (see _mark_root)
            self._mark_root(ctx, tensors, retained)
        return ctx

    def _mark_root(self, ctx: BackwardContext, tensors, retained: bool) -> None:
        """The same loss backpropagated twice (``loss.backward(retain_graph=True)`` and again
        before any step) adds its gradients twice. A retained backward leaves a mark in its loss
        node's ``metadata`` (a dict that lives with the node); a later backward from that node
        finds it. Nothing is read until a retained backward has run."""
        if not (retained or self._roots_marked) or not isinstance(tensors, torch.Tensor):
            return
        node = tensors.grad_fn
        if node is None:
            return
        mark = node.metadata.get(_ROOT_MARK)
        if mark is not None:
            ctx.repeats = mark[0]
        if retained:
            ctx.root_cell = node.metadata[_ROOT_MARK] = [None]
            self._roots_marked = True

    def end(self, ctx: BackwardContext, loc, extra: dict):
        """The tensors whose ``.grad`` this backward wrote (another tensor, or a new version),
        sorted by their verdict; their new grads become the ones graddoctor has seen."""
        rec = self.rec
        self._steps_at_backward = rec.progress.steps
        fresh, accumulated, cleared = self._written(ctx)
        if self.aside_pending or (self.aside is not None and self.aside.unsynced):
            self._aside(ctx, fresh, accumulated)  # FSDP2 without gradient sync
        ctx.before = ctx.tensors = []  # let go of the grads held since the start
        ctx.held = {}
        if len(fresh) >= SAME_LIST_MIN:  # held once where equal to a list the trace holds
            fresh = rec.same_list(fresh)
        event = rec.emit(ev.backward(fresh=fresh, accumulated=accumulated, cleared_outside=cleared,
                                     extra_leaves=ctx.extra_leaves, in_step=self.optimizers.closure_step,
                                     graph_nodes=ctx.graph_nodes, history=ctx.history,
                                     repeats=ctx.repeats, updated_by_hand=ctx.updated_by_hand or None,
                                     applied_by_hand=ctx.applied_by_hand or None,
                                     hand_step_cosine=ctx.hand_step_cosine,
                                     hand_step_scale=ctx.hand_step_scale,
                                     rescaled=_among(ctx.rescaled, accumulated),
                                     **extra), loc)
        if ctx.cell is not None:
            ctx.cell[0] = event.seq  # later backwards that meet its marks name this event
        if ctx.root_cell is not None:
            ctx.root_cell[0] = event.seq
        return event

    def _written(self, ctx: BackwardContext) -> tuple[list, list, list]:
        """(fresh, accumulated, cleared): the pids whose grad the backward wrote, in pid order,
        by their verdict before it; hands their new grads' states to the recorder."""
        rec = self.rec
        pids, before, held, tensors = ctx.pids, ctx.before, ctx.held, ctx.tensors
        if rec.shared and rec.others_in_backward():  # see rec.readable: not read now
            skip = rec.shared
            tensors = [None if pid in skip else tensor for pid, tensor in zip(pids, tensors)]
            before = [None if pid in skip else grad for pid, grad in zip(pids, before)]
            held = {i: state for i, state in held.items() if pids[i] not in skip}
        after = grads_of(tensors)
        written = list(map(is_not, after, before))  # another grad tensor (or a new one)
        for i, (version, _verdict) in held.items():  # the same tensor, added to in place
            if not written[i]:
                grad = after[i]
                written[i] = grad is not None and (grad._version if type(grad) is Tensor
                                                   else grad_version(grad)) != version
        fresh: list = []
        accumulated: list = []
        cleared: list = []
        # the pids' own int objects (``Identities.ints``), not one new int per pid and backward
        numbers = rec.tensors.ints if type(pids) is range else pids
        if not held:  # every grad was None before: whatever was written is fresh
            fresh = list(compress(numbers, written))
        else:
            for i in compress(range(len(written)), written):
                verdict = held[i][1] if i in held else FRESH
                (fresh if verdict == FRESH else accumulated if verdict == ACCUMULATED
                 else cleared).append(numbers[i])
        try:
            self._step_cosine = self._step_scale = None
            ctx.updated_by_hand, ctx.applied_by_hand = self._hand_updates(pids, tensors, written,
                                                                          ctx.kept)
            ctx.hand_step_cosine = self._step_cosine
            ctx.hand_step_scale = self._step_scale
        except Exception as exc:  # loses this fact only, not the backward's event
            rec.internal_error("backward (hand-written updates)", exc)
        grads = list(compress(after, written))
        written_pids = fresh if not held else list(compress(pids, written))
        if held and not all(map(is_not, grads, repeat(None))):  # set to None during the backward
            kept = list(map(is_not, grads, repeat(None)))
            grads, written_pids = list(compress(grads, kept)), list(compress(written_pids, kept))
        rec.grads.backward_wrote(written_pids if not held else [*fresh, *accumulated, *cleared],
                                 written_pids, list(states_of(grads)))
        factors = self.optimizers.edit_factors
        if not factors.done:  # the first backwards: what a hand edit before the step scales
            try:
                factors.observe(rec.progress.backward_calls, written_pids, grads)
            except Exception as exc:
                rec.internal_error("backward (edit factor samples)", exc)
        return fresh, accumulated, cleared

    def _aside(self, ctx: BackwardContext, fresh: list, accumulated: list) -> None:
        """Parameters written outside their ``.grad`` (FSDP2's unsharded accumulation while
        gradient sync is off): fresh when their ``.grad`` was empty and nothing was set aside
        since, else accumulated; the backward that finally writes their ``.grad`` (the reduce)
        adds onto what was set aside."""
        pending = self.aside_pending
        written = set(fresh) | set(accumulated)
        for pid in [p for p in fresh if p in pending]:  # the reduce of the set-aside sum
            fresh.remove(pid)
            accumulated.append(pid)
        pending.difference_update(written)
        aside = self.aside.written_aside() if self.aside is not None else []
        if not aside:
            return
        verdicts = ctx.verdicts()
        for pid in aside:
            if pid in written:
                continue
            if pid in pending or verdicts.get(pid) == ACCUMULATED:
                accumulated.append(pid)
            else:
                fresh.append(pid)
            pending.add(pid)

    @staticmethod
    def _arguments(args, kwargs, takes_self: bool):
        """(tensors, inputs, retained): retained is whether the graph outlives the call
        (retain_graph, which defaults to create_graph, as torch reads them)."""
        tensors = args[0] if args else kwargs.get("tensors", kwargs.get("self"))
        inputs = kwargs.get("inputs")
        inputs_at = 4 if takes_self else 5  # Tensor.backward / autograd.backward
        if inputs is None and len(args) > inputs_at:
            inputs = args[inputs_at]
        # retain_graph and create_graph are the 3rd and 4th arguments of both
        retain = kwargs["retain_graph"] if "retain_graph" in kwargs else (args[2] if len(args) > 2 else None)
        if retain is None:
            retain = kwargs["create_graph"] if "create_graph" in kwargs else (args[3] if len(args) > 3 else False)
        return tensors, inputs, bool(retain)

    def wrap(self, original, takes_self: bool):
        watcher = self
        rec = self.rec

        running = rec.running_backwards  # read only: the recorder marks the running ones
        in_backward, began, ended = rec.in_backward, rec.backward_began, rec.backward_ended
        finder = rec.finder
        describers = self._describe_loss  # the topic's subscribers (their ``now``)
        Tensor_, autograd = torch.Tensor, torch.autograd

        armed = [None]  # the straight-line path's reads (_arm_backward), for this wrapper

        @functools.wraps(original)
        def backward(*args, **kwargs):
            # nested in a running backward (Tensor -> autograd, checkpointing; on an accelerator
            # autograd's own threads, which Python sees as dummy threads, run the inner one): its
            # writes are seen by the outer one. A backward of another thread of the script is not.
            if running and (get_ident() in running or in_backward()):
                return original(*args, **kwargs)
            if armed[0] is not None and not kwargs and len(args) == 1:
                try:
                    before = watcher._steady_before(args[0], sys._getframe(1), armed[0])
                except Exception:  # the full path below (its own errors recorded there)
                    before = None
                if before is _SKIM:
                    return watcher._skim_backward(original, args, armed, takes_self)
                if before is not None:
                    return watcher._steady_backward(original, args, before, armed)
            armed[0] = None
            rec.progress.maybe_stop()
            try:
                if kwargs or len(args) != 1:
                    tensors, inputs, retained = watcher._arguments(args, kwargs, takes_self)
                else:  # loss.backward(), torch.autograd.backward(loss): what _arguments reads
                    tensors, inputs, retained = args[0], None, False
                # the script's own replacements of the backward calling this one (_script_wrappers)
                frame = sys._getframe(1)
                codes = (getattr(Tensor_.backward, "__code__", None),
                         getattr(autograd.backward, "__code__", None))
                wrappers = _script_wrappers(frame, codes) if frame.f_code in codes else 0
                # here(1) starts the search at this frame; past the script's wrappers: their caller
                try:
                    loc = finder.here(2 + wrappers if wrappers else 1)
                except Exception:  # as Recorder.here: the location lookup never breaks the run
                    loc = None
                ctx = watcher.begin(tensors, inputs, loc, retained)
                # facts about the backward'ed loss that other watchers add (AMP scale, 1/k
                # factor, batch): keyword arguments of ``events.backward``, whose defaults fill
                # in the rest
                extra = {}
                rec.describing(True)  # one location lookup for the describers' ``here()``
                try:
                    for describe in describers.now:
                        extra.update(describe(tensors))
                finally:
                    rec.describing(False)
            except Exception as exc:
                rec.internal_error("backward (before)", exc)
                ctx, loc, extra = None, None, {}
            began(ctx)
            try:
                return original(*args, **kwargs)
            finally:
                ended()
                if ctx is not None:
                    try:
                        held = bool(ctx.held)
                        event = watcher.end(ctx, loc, extra)
                        if (not held and not wrappers and not kwargs and len(args) == 1
                                and loc is not None and rec.folder is not None):
                            armed[0] = watcher._arm_backward(ctx, event, frame, loc, extra)
                    except Exception as exc:
                        rec.internal_error("backward (after)", exc)

        return backward

    # -- the steady state: the straight-line path (see OptimizerWatcher._arm_clear) ------------
    def _arm_backward(self, ctx: BackwardContext, event, frame, loc, extra: dict) -> tuple | None:
        """What the straight-line path compares with, after a backward whose event went onto
        the steady path: a plain ``loss.backward()`` of one thread that found every grad None
        and walked nothing more, whose event holds nothing but its written pids and the loss
        describers' facts."""
        rec = self.rec
        place = rec.folder.place_of(event)
        if place is None:
            return None
        ident = get_ident()
        data = event.data
        refs = rec.tensors.refs
        if (ident != rec.script_thread or type(ctx.pids) is not range or len(ctx.pids) != len(refs)
                or ctx.cell is not None or ctx.root_cell is not None or ctx.repeats is not None
                or data["accumulated"] or data["cleared_outside"] or data["extra_leaves"]
                or data["in_step"] is not None or data["graph_nodes"] is not None
                or data["history"] is not None or self._roots_marked or rec.shared
                or not _CTX_KEYS.isdisjoint(data)):
            return None
        line = self._lines.get((loc.path, loc.line, ident))
        chain = rec.finder.chain(frame)
        if line is None or chain is None or not plain_data(extra):
            return None
        user = same_chain(frame, chain)
        if user is None or rec.finder.instruction_location(user) is not loc:
            return None
        fresh = list(data["fresh"])
        written = [False] * len(refs)
        for pid in fresh:
            written[pid] = True
        # a DataLoader's batch: the next one each turn (the event's only value that changes)
        loader = extra["batch"][0] if Folder.batch_varies(place[0], place[1], extra.get("batch")) \
            else None
        return (*place, chain, line, ident, len(refs), written, fresh, dict(extra), loader, data,
                loc)

    def _steady_before(self, tensors, frame, armed: tuple):
        """The reads before a backward on the straight-line path (nothing changed yet): the
        tracked tensors and their grads, all None, when the backward would be the armed one's
        so far; else None (the full path)."""
        steady, j, chain, line, ident, count, *_ = armed
        rec = self.rec
        folder = rec.folder
        calls = line.calls + 1
        if (folder is None or folder.steady is not steady
                or (rec.holder is not None and not rec.release_onto_steady("backward", armed[-1]))
                or rec.progress.stop_requested or get_ident() != ident or HELD
                or self._roots_marked or self._always_walk or line.extra_leaves
                or line.registrations != self.registrations or calls >= line.next_walk
                or calls <= WALK_FIRST or rec.shared or len(rec.owned_by) != 1
                or ident not in rec.owned_by):
            return None
        refs = rec.tensors.refs
        if len(refs) != count:
            return None
        codes, code, lasti = chain  # same_chain(frame, chain), inlined (a frame per turn)
        user = frame
        for expected in codes:
            if user is None or user.f_code is not expected:
                return None
            user = user.f_back
        if user is None or user.f_code is not code or user.f_lasti != lasti:
            return None
        # (a skimmed place but the first is one steady_take takes: steady_ready)
        if armed[9] is None and self.optimizers.step_armed and (
                (j and steady.skim_answer and steady.skim_turn == steady.closed
                 and len(steady.open) == j)
                or (folder.skimming(steady, j) and (j or folder.steady_ready(steady, j)))):
            # (a DataLoader's backward is never skimmed: its batch is read each turn; nor one
            # whose step goes the full path: a skimmed backward's grads are caught up unread,
            # which would hide an edit between it and that step)
            return _SKIM
        if not folder.steady_ready(steady, j):
            return None
        tensors_ = list(map(call, refs))
        before = grads_of(tensors_)
        if not all(map(is_, before, repeat(None))):
            return None
        return tensors_, before

    def _steady_backward(self, original, args, before, armed_cell: list):
        """A backward on the straight-line path: what ``begin``, the describers and ``end`` do
        for the armed kind of backward, its event taken as the armed one's when what it wrote
        and the describers' facts are the same (else ``end`` records it in full)."""
        rec = self.rec
        tensors_, grads_before = before
        steady, j, chain, line, ident, count, written, fresh, extra0, loader, base, loc = armed_cell[0]
        tensors = args[0]
        try:
            rec.progress.count_backward()  # begin(), as it runs for this backward
            line.calls += 1
            extra_leaves = line.extra_leaves
            extra = {}
            rec.describing(True)  # one location lookup for the describers' ``here()``
            try:
                for describe in self._describe_loss.now:
                    extra.update(describe(tensors))
            finally:
                rec.describing(False)
            ok = True
        except Exception as exc:
            rec.internal_error("backward (before)", exc)
            ok = False
        rec.backward_began(None)
        try:
            return original(*args)
        finally:
            rec.backward_ended()
            if ok:
                try:
                    self._steady_end(tensors_, grads_before, extra_leaves, extra, armed_cell)
                except Exception as exc:
                    rec.internal_error("backward (after)", exc)

    def _steady_end(self, tensors_, grads_before, extra_leaves, extra, armed_cell) -> None:
        rec = self.rec
        steady, j, chain, line, ident, count, written, fresh, extra0, loader, base, loc = armed_cell[0]
        folder = rec.folder
        after = grads_of(tensors_)
        changes = None
        # the describers' facts: the same types first (no value of another kind compared)
        typed = list(map(type, extra.values())) == list(map(type, extra0.values()))
        same = typed and exact(extra, extra0)
        if not same and typed and loader is not None:  # the next batch of the same loader
            batch = extra.get("batch")
            if (type(batch) is list and len(batch) == 3 and all(type(v) is int for v in batch)
                    and batch[0] == loader):
                extra["batch"] = extra0["batch"]
                same = exact(extra, extra0)
                extra["batch"] = batch
                changes = {"batch": batch}
        if (same and folder is not None and folder.steady_ready(steady, j)
                and list(map(is_not, after, repeat(None))) == written
                and self.optimizers.closure_step is None and not self.aside_pending
                and (self.aside is None or not self.aside.unsynced) and not rec.shared
                and len(self._owned) >= len(rec.tensors.refs) == count):
            # _written's path for grads that were all None: fresh, nothing judged by hand
            self._steps_at_backward = rec.progress.steps
            self._step_cosine = None
            grads = list(compress(after, written))
            rec.grads.backward_wrote(fresh, fresh, list(states_of(grads)))
            if not self.optimizers.edit_factors.done:
                try:
                    self.optimizers.edit_factors.observe(rec.progress.backward_calls, fresh, grads)
                except Exception as exc:
                    rec.internal_error("backward (edit factor samples)", exc)
            with rec.lock:
                if folder.steady_take(steady, j, "backward", loc, base, changes):
                    return
            rec.emit(ev.backward(fresh=list(fresh), accumulated=[], cleared_outside=[],
                                 extra_leaves=extra_leaves, **extra), loc)
            return
        armed_cell[0] = None
        ctx = BackwardContext()  # as begin() made it for this backward
        ctx.pids, ctx.tensors, ctx.before = range(count), tensors_, grads_before
        ctx.extra_leaves = extra_leaves
        self.end(ctx, loc, extra)

    def _skim_backward(self, original, args, armed_cell: list, takes_self: bool):
        """A backward on a skimmed turn (``Folder.skimming``): what ``_steady_before`` tested
        (the same thread, call site, walk schedule, tracked tensors) and nothing read: no loss
        describer runs, the grads it writes are left to ``GradState.catch_up``, its event is
        the armed one (taken after the backward if nothing has changed meanwhile what the
        straight-line path's end tests; else ``end`` records it in full). A plain tensor's
        ``loss.backward()`` runs torch's ``torch.autograd.backward(loss)`` directly, as torch's
        ``Tensor.backward`` would (no ``__torch_function__`` to honour, ``torch.autograd.backward``
        still our wrapper, which would only pass it on: two frames fewer)."""
        rec = self.rec
        armed = armed_cell[0]
        steady, j, chain, line, ident, count, written, fresh, extra0, loader, base, loc = armed
        try:
            rec.progress.count_backward()  # begin(), as it runs for this backward
            line.calls += 1
            ok = True
        except Exception as exc:
            rec.internal_error("backward (before)", exc)
            ok = False
        rec.backward_began(None)
        try:
            direct = self._autograd_direct
            loss = args[0]
            if (takes_self and direct is not None and type(loss) is Tensor
                    and torch.autograd.backward is direct[1]
                    and not _has_torch_function_unary(loss)):
                return direct[0](loss)
            return original(*args)
        finally:
            rec.backward_ended()
            if ok:
                try:
                    folder = rec.folder
                    if (folder is not None and folder.steady is steady
                            and (len(steady.open) == j if j else folder.steady_ready(steady, j))
                            and self.optimizers.closure_step is None and not self.aside_pending
                            and (self.aside is None or not self.aside.unsynced) and not rec.shared
                            and len(self._owned) >= len(rec.tensors.refs) == count):
                        self._steps_at_backward = rec.progress.steps
                        self._step_cosine = None
                        rec.grads.skimmed_backward(fresh)
                        with rec.lock:  # (no return in a finally: it would drop the result)
                            turn = steady.open  # Folder.skim_take, its first branch inlined
                            if folder.steady is steady and len(turn) == j and j:
                                trace = folder.trace
                                turn.append((trace.next_seq, "backward", loc, base, None))
                                trace.next_seq += 1
                                taken = True
                            else:
                                taken = folder.steady_take(steady, j, "backward", loc, base, None)
                        if not taken:
                            rec.emit(ev.backward(fresh=list(fresh), accumulated=[],
                                                 cleared_outside=[],
                                                 extra_leaves=line.extra_leaves, **extra0), loc)
                    else:
                        armed_cell[0] = None
                        # as begin() made it for this backward (its grads None before; the
                        # ``count`` tracked tensors it would have read, read now: the tracked
                        # tensors are only ever added to, and a backward frees none of them)
                        ctx = BackwardContext()
                        ctx.pids = range(count)
                        ctx.tensors = list(map(call, islice(rec.tensors.refs, count)))
                        ctx.before = [None] * count
                        ctx.extra_leaves = line.extra_leaves
                        self.end(ctx, loc, dict(extra0))
                except Exception as exc:
                    rec.internal_error("backward (after)", exc)

    def _count_registration(self, module, name, param) -> None:
        self.registrations += 1

    def install(self, patcher) -> None:
        register = getattr(torch.nn.modules.module, "register_module_parameter_registration_hook", None)
        if register is not None:  # new parameters: walk the next graphs again
            patcher.handle(register(self._count_registration))
        else:
            self._always_walk = True
        tensor_backward, autograd_backward = torch.Tensor.backward, torch.autograd.backward
        patcher.patch(torch.Tensor, "backward", self.wrap(tensor_backward, takes_self=True))
        wrapper = self.wrap(autograd_backward, takes_self=False)
        patcher.patch(torch.autograd, "backward", wrapper)
        if _torch_own(tensor_backward, "torch._tensor") and _torch_own(autograd_backward, "torch.autograd"):
            self._autograd_direct = (autograd_backward, wrapper)


def _torch_own(function, module: str) -> bool:
    """Whether ``function`` is torch's own (defined in ``module``), not a replacement made
    before graddoctor was installed."""
    return getattr(function, "__module__", None) == module and getattr(
        function, "__qualname__", "").rsplit(".", 1)[-1] == "backward"


def _script_wrappers(frame, codes=None) -> int:
    """How many frames, from ``frame`` (our wrapper's caller) outward, are the script's own
    replacement of ``Tensor.backward`` / ``torch.autograd.backward`` (``torch.Tensor.backward =
    logged_backward``, which calls the one it replaced): a finding belongs at the loop's
    ``loss.backward()``, the line the user changes, not inside the wrapper. Two attribute
    reads per backward (``codes``: the wrapper has read them already)."""
    if codes is None:
        codes = (getattr(torch.Tensor.backward, "__code__", None),
                 getattr(torch.autograd.backward, "__code__", None))
    skipped = 0
    while frame is not None and frame.f_code in codes:
        skipped += 1
        frame = frame.f_back
    return skipped

