"""A pairwise loss whose gradient pulls different-label pairs together or pushes same-label
pairs apart (pair-pull-reversed).

Metric learning, contrastive and Siamese losses read a batch's pairwise distances or
similarities together with which pairs share a label, and exist to shrink the distances of
the same-label pairs and grow those of the different-label ones. One flipped mask or label
convention reverses that while the loss still falls: batch-hard mining that takes its
"hardest negative" among the same-label pairs (the sample itself, at distance 0), a
contrastive loss written for y=1 "similar" fed y=1 "dissimilar" (`1 - same`), SupCon with
its positives mask inverted (`!=`), a pairwise BCE whose target is 1 for different labels,
a positive mined among the other labels.

The invariant, over what the run observes at its first ``_WINDOWS`` backwards:

* **Pairs.** A pairwise matrix of embeddings made from the script's code and carrying
  gradient: ``torch.cdist`` and ``F.pairwise_distance`` (distances), a 2-D matrix product
  (``@``, ``mm``, ``matmul``) of two tensors that are not parameters, ``F.cosine_similarity``
  (similarities); the row-wise forms (``pairwise_distance(a, b)`` of two (N, D) batches) are
  pairs too. A tensor gradient hook on it (torch's own ``register_hook``: it reads and never
  changes the gradient) reads dL/d(matrix).
* **Labels.** An ``==`` or ``!=`` (``eq``, ``ne``) between integer tensors that makes every
  pair of a batch (``y[:, None] == y[None, :]``) or compares two batches row by row
  (``y1 == y2``) is a label comparison; what the script makes from its result without gradient
  (``~``, ``1 - m``, casts, ``&`` with a mask of no labels, ``torch.where`` to numbers) stays
  one. It counts only where it *meets* a value with gradient of the matrix's shape (a
  product, ``masked_fill``, ``torch.where``, a loss function's target): the loss reads the
  pairs through those labels. Which pairs share a label is computed here, from the compared
  labels, whatever the script's mask says. A ``cross_entropy`` whose input (N, M) is made from
  the matrix by a few elementwise ops (a sign, a scale, a square) and whose target holds class
  indices labels the pairs too: row i and column ``target[i]`` are its same-label pair (a
  prototypical network's query and its class's prototype, a retrieval's positive candidate).
* **Verdict.** In distance orientation (a similarity's gradient negated), the gradient's
  negative part pushes a pair apart and its positive part pulls it together. Reversed when
  (``judge``): a distance's self-pairs (the diagonal of ``cdist(z, z)``) are pushed apart, for
  at least ``_SHARE`` of the gradient's mass (a sample cannot move away from itself: its
  "negative" was picked among its own label); or, on net, the same-label pairs are pushed
  apart and the different-label ones pulled together; or only same-label pairs are pushed
  (no different-label pair is), or only different-label pairs pulled (no same-label pair is),
  for at least ``_SHARE`` of the mass. A similarity's self-pairs are left out (a
  self-similarity in a softmax's denominator is similarity-diagonal-unmasked's). Reported
  when every judged backward of the matrix's line says reversed, at ``_JUDGED`` backwards at
  least: a ``pair_pull`` aside event, once per line.

Where it points: each meeting's carrier (the value with gradient it made, or a loss's input)
gets a gradient hook too, and the pairs where its gradient is nonzero are its *support*. A
meeting whose support holds the reversed pairs is wrong; one whose support holds only pairs
pushed or pulled the right way is right. Some right and some wrong: the wrong meeting's line
(the mask applied the other way there). All wrong: the line where the mask they share got its
meaning flipped (``!=``, ``~``, ``1 - m``) when there is one, else the one wrong meeting's
line, else the comparison.

Silent on batch-hard mining done right, a contrastive loss with either label convention
applied consistently, SupCon with self-pairs removed, NT-Xent whose positive mask comes from
other labels than the classes (the two masks combined are labels of neither), a margin on
same-label pairs already satisfied (no gradient), a distance regressed toward a label-made
target. Not seen: distances written by hand from broadcasts (``(z[:, None] -
z[None]).norm(dim=-1)``: no matrix op), losses that compute their distance inside
(``cosine_embedding_loss``, ``triplet_margin_loss``), labels compared by a one-hot product,
a center loss (no pair of samples). CPU tensors only, at most ``_ELEMENTS`` entries.
"""

from __future__ import annotations

import sys
import weakref

import torch
import torch.nn.functional as F

from .. import events as ev
from .dependency import close_before_compile
from .inlinable import unwatch, watched, watched_call
from .recorder import Recorder
from .topics import DESCRIBE_LOSS, STEPPED
from .patcher import check_hook, put_back

_WINDOWS = 3  # backwards whose forward is watched
_MIN_ROWS = 4  # pairs of fewer rows (or columns) say nothing
_ELEMENTS = 1 << 22  # entries of a matrix read at most
_PER_FORWARD = 32  # matrices, and meetings, noted per forward at most
_MARKS = 4096  # label masks held at most
_SHARE = 0.1  # the reversed part's mass, over the gradient's whole mass, at least
_JUDGED = 2  # backwards that must each say reversed
_LABEL = "pair pull"

_tensor_register_hook = torch.Tensor.register_hook  # torch's own: dependency.py wraps the script's calls


def _register_hook(tensor, hook):
    return check_hook(_tensor_register_hook(tensor, hook))  # removed when the check ends

_COMPARE = ((torch.Tensor, "__eq__", False), (torch.Tensor, "__ne__", True),
            (torch.Tensor, "eq", False), (torch.Tensor, "ne", True),
            (torch, "eq", False), (torch, "ne", True))
# ops that carry a label mask on (without gradient) or meet it with a value with gradient;
# the flag: the op flips the mask's meaning. Not ``Tensor.to``: --emulate-cuda's mode knows
# torch's own ``to`` by identity, and torch hands a mode the patched name
_CARRY = ((torch.Tensor, "__invert__", True), (torch.Tensor, "logical_not", True),
          (torch, "logical_not", True), (torch.Tensor, "__rsub__", True),
          (torch.Tensor, "float", False), (torch.Tensor, "double", False),
          (torch.Tensor, "half", False), (torch.Tensor, "long", False), (torch.Tensor, "int", False),
          (torch.Tensor, "bool", False), (torch.Tensor, "type_as", False),
          (torch.Tensor, "clone", False), (torch.Tensor, "__and__", False),
          (torch.Tensor, "__or__", False), (torch.Tensor, "logical_and", False),
          (torch, "logical_and", False), (torch.Tensor, "__sub__", False),
          (torch.Tensor, "__mul__", False), (torch.Tensor, "__rmul__", False),
          (torch.Tensor, "mul", False), (torch, "mul", False),
          (torch.Tensor, "masked_fill", False), (torch.Tensor, "masked_fill_", False),
          (torch, "where", False), (torch.Tensor, "where", False))
# loss functions whose target can be a label mask over the pairs of their input
_TARGETED = ("binary_cross_entropy_with_logits", "binary_cross_entropy", "mse_loss",
             "cross_entropy", "soft_margin_loss", "l1_loss", "smooth_l1_loss")
_DISTANCES = ((torch, "cdist"), (F, "pairwise_distance"))
_SIMILARITIES = ((F, "cosine_similarity"), (torch, "mm"), (torch, "matmul"),
                 (torch.Tensor, "mm"), (torch.Tensor, "matmul"), (torch.Tensor, "__matmul__"))


def _is_param(t) -> bool:
    """A parameter or a view of one (``W.T``): a product with it is a layer, not pairs."""
    base = getattr(t, "_base", None)
    for x in (t, base):
        if isinstance(x, torch.Tensor) and x.is_leaf and x.requires_grad:
            return True
    return False


def _cpu(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.layout == torch.strided


class _Labels:
    """The labels a comparison saw: ``rows``/``cols`` (1-D, CPU copies) of every pair
    (``outer``) or of the rows compared one to one."""

    __slots__ = ("rows", "cols", "outer", "classes")

    def __init__(self, rows, cols, outer: bool, classes: bool = False):
        self.rows, self.cols, self.outer, self.classes = rows, cols, outer, classes

    def same(self):
        if self.outer:
            return self.rows[:, None] == self.cols[None, :]
        return self.rows == self.cols

    def shape(self) -> tuple:
        return (len(self.rows), len(self.cols)) if self.outer else (len(self.rows),)

    def self_pairs(self) -> bool:
        if self.classes:
            return False  # rows are samples, columns classes: no sample meets itself
        return self.outer and len(self.rows) == len(self.cols) and bool(torch.equal(self.rows, self.cols))


class _Mark:
    """A mask made from a label comparison: its labels, and each line that made it (with
    whether that line flipped its meaning)."""

    __slots__ = ("labels", "chain", "matrix")

    def __init__(self, labels: _Labels, chain: tuple, matrix: int | None = None):
        # ``matrix``: the id of the autograd node of the one matrix these labels are for (a
        # cross_entropy's class targets), None for a comparison's labels (any matrix they meet)
        self.labels, self.chain, self.matrix = labels, chain, matrix


class _Meeting:
    __slots__ = ("mark", "loc", "shape", "support", "__weakref__")

    def __init__(self, mark: _Mark, loc, shape):
        self.mark, self.loc, self.shape, self.support = mark, loc, shape, None


class _Forward:
    """What one forward made: its meetings, in order."""

    __slots__ = ("meetings", "carriers", "matrices", "window", "nodes")

    def __init__(self, window: int):
        self.meetings: list = []
        # the autograd nodes of the matrices made (kept: their ids stay theirs meanwhile)
        self.nodes: dict = {}
        # ids of the carriers met and ("matrix", id) of the matrices hooked (alive while their
        # hooks are: an id is not reused meanwhile)
        self.carriers: set = set()
        self.matrices = 0
        self.window = window


def judge(grad, same, distance: bool, diagonal: bool):
    """The verdict on one matrix's gradient (in distance orientation when ``distance``; a
    similarity's is negated here), ``same`` telling the same-label pairs; ``diagonal``: the
    matrix is a batch with itself, whose diagonal holds self-pairs (kept for a distance, left
    out for a similarity). None when it says nothing, else (how, sides, wrong), ``how`` None
    when the pairs move the right way, ``sides`` the push and pull per pair of each side and
    ``wrong`` the mask of the pairs moved the wrong way. Reversed when:

    * "self": a distance's self-pairs are pushed apart (a sample cannot move away from itself:
      its "negative" was picked among its own label), for at least ``_SHARE`` of the mass;
    * "both": on net, the same-label pairs are pushed apart and the different-label ones pulled
      together;
    * "push_same": only same-label pairs are pushed (none of the others), or "pull_diff": only
      different-label pairs are pulled (none of the same label), for at least ``_SHARE`` of the
      mass: a negative mined among the same labels, a positive among the others."""
    g = grad.detach().to(torch.float64)
    if not distance:
        g = -g
    valid = torch.ones_like(same)
    eye = torch.zeros_like(same)
    if diagonal and same.dim() == 2:
        eye = torch.eye(same.shape[0], dtype=torch.bool)
        if not distance:
            valid = ~eye
    s, d = same & valid, ~same & valid
    if int((s & ~eye).sum()) < 2 or int(d.sum()) < 2:
        return None
    total = float(g[valid].abs().sum())
    if not total > 0:
        return None
    push, pull = (-g).clamp(min=0), g.clamp(min=0)
    sides = (float(push[s].mean()), float(push[d].mean()), float(pull[s].mean()),
             float(pull[d].mean()))
    net_same, net_diff = float(g[s].sum()), float(g[d].sum())
    tiny = 1e-6 * total
    pushed_same, pulled_diff = s & (push > 0), d & (pull > 0)
    if distance and bool(eye.any()) and float(push[eye & s].sum()) >= _SHARE * total:
        return "self", sides, eye & s & (push > 0)
    if net_same < -tiny and net_diff > tiny:
        return "both", sides, pushed_same | pulled_diff
    if float(push[s].sum()) >= _SHARE * total and not bool((push[d] > 0).any()):
        return "push_same", sides, pushed_same
    if float(pull[d].sum()) >= _SHARE * total and not bool((pull[s] > 0).any()):
        return "pull_diff", sides, pulled_diff
    return None, sides, None


def pointed(meetings, wrong_pairs, right_pairs):
    """The location to change: ``meetings`` (each with its support, or None), the pairs moved
    the wrong way and those moved the right way. Returns a Location or None."""
    wrong, right = [], []
    for m in meetings:
        if m.support is None or m.support.shape != wrong_pairs.shape:
            continue
        if bool((m.support & wrong_pairs).any()):
            wrong.append(m)
        elif bool((m.support & right_pairs).any()):
            right.append(m)
    if not wrong:
        return None
    if right:
        return wrong[0].loc
    chains = [m.mark.chain for m in wrong]
    shared = []
    for links in zip(*chains):
        if all(link == links[0] for link in links):
            shared.append(links[0])
        else:
            break
    flips = [loc for loc, flipped in shared if flipped and loc is not None]
    if flips:
        return flips[-1]
    locs = {(m.loc.path, m.loc.line) for m in wrong if m.loc is not None}
    if len(locs) == 1:
        return wrong[0].loc
    return shared[0][0] if shared else None


# elementwise ops a cross_entropy's input may pass through from the matrix: a sign, a scale, a
# power, a shift, a clamp, a root, a copy or a reshape (the columns stay the matrix's)
_ELEMENTWISE = ("NegBackward", "MulBackward", "DivBackward", "PowBackward", "SqrtBackward",
                "AddBackward", "SubBackward", "RsubBackward", "ClampBackward", "ClampMinBackward",
                "CloneBackward", "ViewBackward", "ReshapeAliasBackward", "UnsafeViewBackward",
                "ToCopyBackward", "ExpandBackward")
_STEPS = 6  # ops between the matrix and the loss's input, at most


def _from_matrix(node, matrices: dict, steps: int = _STEPS):
    """The node of ``matrices`` that autograd node ``node`` is, or reaches through at most
    ``steps`` elementwise ops; None when there is none."""
    if node is None:
        return None
    if id(node) in matrices and matrices[id(node)] is node:
        return node
    if steps <= 0 or not type(node).__name__.rstrip("0123456789").startswith(_ELEMENTWISE):
        return None
    for parent, _ in node.next_functions:
        found = _from_matrix(parent, matrices, steps - 1) if parent is not None else None
        if found is not None:
            return found
    return None


class PairPullWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._open = True
        self._busy = False
        self._windows = 0
        self._forward = _Forward(0)
        self._marks: dict = {}  # id(mask) -> (weak mask, _Mark)
        self._verdicts: dict = {}  # the matrix's line -> {forward's window: reversed or not}
        self._ready: list = []  # (line key, made, loc) found in a backward, emitted after it
        self._told: set = set()
        self._restore: list = []  # (owner, name, original, this watcher's wrapper)

    def install(self, patcher) -> None:
        def wrap(owner, name, after, make=watched_call):
            original = getattr(owner, name, None)
            if original is None:
                return
            wrapper = make(original, after)
            patcher.patch(owner, name, wrapper)
            # (a ``watched`` test is taken out of the wrapper it may share: ``unwatch``)
            self._restore.append((owner, name, original, wrapper, after if make is watched else None))

        for owner, name, flips in _COMPARE:
            wrap(owner, name, self._compared(flips))
        for owner, name, flips in _CARRY:
            wrap(owner, name, self._carried(name, flips))
        # the losses are watched ahead of the call (only their arguments are read): the other
        # watchers that keep a loss function wrapped for the whole run then call this one's test
        # from their own frame (``watched`` merges them) instead of through a frame of its own
        for name in _TARGETED:
            wrap(F, name, self._targeted(name), watched)
        for owner, name in _DISTANCES:
            wrap(owner, name, self._made(name, True))
        for owner, name in _SIMILARITIES:
            wrap(owner, name, self._made(name, False))
        close_before_compile(patcher, self._close)

    # -- windows -----------------------------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        try:
            if not self._open and self._restore:
                self._unwrap()
            self._emit_ready()
            if self._open:
                self._windows += 1
                self._forward = _Forward(self._windows)
                self._marks = {}
                if self._windows >= _WINDOWS:
                    self._close()
        except Exception as exc:
            self._close()
            self.rec.internal_error(_LABEL, exc)
        return {}

    def after_step(self, opt, optimizer) -> None:
        try:
            if not self._open and self._restore:
                self._unwrap()
            self._emit_ready()
        except Exception as exc:
            self.rec.internal_error(_LABEL, exc)

    def _close(self) -> None:
        if self._open:
            self._open = False
            self._marks = {}
        self._unwrap()

    def _unwrap(self) -> None:
        """Put torch's own functions back where this watcher's wrapper is the one installed. A
        wrapper another watcher stacked over it is left to that watcher (``put_back``: retired,
        skipped when that one's window ends); where that wrapper calls this watcher's test
        itself (one frame for both), the test is taken out of it."""
        restore, self._restore = self._restore, []
        for owner, name, original, wrapper, before in restore:
            try:
                if not put_back(owner, name, original, wrapper) and before is not None:
                    unwatch(owner, name, before)
            except Exception as exc:
                self.rec.internal_error(_LABEL, exc)

    def _emit_ready(self) -> None:
        ready, self._ready = self._ready, []
        for key, made, loc in ready:
            if key in self._told:
                continue
            verdicts = self._verdicts.get(key, {})
            if len(verdicts) >= _JUDGED and all(verdicts.values()):
                self._told.add(key)
                self.rec.emit_aside(made, loc)
        if not self._open and not self._ready and not self._restore:
            self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
            self.rec.retire(STEPPED, self.after_step)

    # -- marks -------------------------------------------------------------------------------
    def _mark_of(self, value):
        if not isinstance(value, torch.Tensor):
            return None
        entry = self._marks.get(id(value))
        if entry is not None and entry[0]() is value:
            return entry[1]
        return None

    def _keep(self, value, mark: _Mark) -> None:
        if len(self._marks) >= _MARKS:
            self._marks = {k: v for k, v in self._marks.items() if v[0]() is not None}
            if len(self._marks) >= _MARKS:
                return
        try:
            self._marks[id(value)] = (weakref.ref(value), mark)
        except TypeError:
            pass

    def _user_loc(self, depth: int = 3):
        """The user's location when the code ``depth`` frames up (from the caller of this
        method) is the script's, else None."""
        caller = sys._getframe(depth + 1)
        while caller is not None and caller.f_code.co_filename.startswith("<graddoctor"):
            caller = caller.f_back  # another watcher's wrapper stacked over this one
        if caller is None:
            return None
        if not self.rec.finder.is_user_file(caller.f_code.co_filename):
            return None
        return self.rec.here()

    # -- comparisons -------------------------------------------------------------------------
    def _compared(self, flips: bool):
        def after(args, kwargs, result) -> None:
            if not self._open or self._busy or not isinstance(result, torch.Tensor) \
                    or result.dtype != torch.bool or result.dim() not in (1, 2) or len(args) < 2:
                return
            a, b = args[0], args[1]
            if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a is b:
                return
            if a.is_floating_point() or b.is_floating_point() or a.dtype == torch.bool \
                    or b.dtype == torch.bool or a.is_complex() or not (_cpu(a) and _cpu(b)):
                return
            self._busy = True
            try:
                labels = self._labels(a, b, result)
                if labels is not None:
                    loc = self._user_loc(2)  # after <- wrapper <- the code
                    if loc is not None:
                        self._keep(result, _Mark(labels, ((loc, flips),)))
            except Exception as exc:
                self._close()
                self.rec.internal_error(_LABEL, exc)
            finally:
                self._busy = False
        return after

    @staticmethod
    def _labels(a, b, result) -> _Labels | None:
        if result.dim() == 1:
            if a.dim() != 1 or b.dim() != 1 or a.shape != b.shape or len(a) < _MIN_ROWS:
                return None
            return _Labels(a.detach().clone(), b.detach().clone(), False)
        n, m = result.shape
        if n < _MIN_ROWS or m < _MIN_ROWS or result.numel() > _ELEMENTS:
            return None
        shapes = []
        for t in (a, b):
            if t.dim() == 1:
                shapes.append((1, t.shape[0]))
            elif t.dim() == 2:
                shapes.append(tuple(t.shape))
            else:
                return None
        if shapes[0] == (n, 1) and shapes[1] == (1, m):
            rows, cols = a, b
        elif shapes[0] == (1, m) and shapes[1] == (n, 1):
            rows, cols = b, a
        else:
            return None
        return _Labels(rows.detach().reshape(n).clone(), cols.detach().reshape(m).clone(), True)

    # -- masks carried on, and met ---------------------------------------------------------
    def _carried(self, name: str, flips: bool):
        def after(args, kwargs, result) -> None:
            if not self._open or self._busy or not self._marks or not isinstance(result, torch.Tensor):
                return
            self._busy = True
            try:
                self._carry(name, flips, args, kwargs, result)
            except Exception as exc:
                self._close()
                self.rec.internal_error(_LABEL, exc)
            finally:
                self._busy = False
        return after

    def _carry(self, name, flips, args, kwargs, result) -> None:
        operands = [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)]
        marks = [mark for mark in map(self._mark_of, operands) if mark is not None]
        if not marks:
            return
        labels = marks[0].labels
        if any(mark.labels is not labels for mark in marks[1:]):
            return  # a mask of two comparisons: labels of neither
        mark = marks[0]
        gradient = [x for x in operands if x.requires_grad and self._mark_of(x) is None]
        if gradient:
            if result.requires_grad and torch.is_grad_enabled() and tuple(result.shape) == labels.shape():
                self._meet(mark, result, 3)  # _carry <- after <- wrapper
            return
        if tuple(result.shape) != labels.shape():
            return
        if name == "__sub__":
            flips = len(args) > 1 and self._mark_of(args[1]) is mark  # ones - mask
        elif name in ("where",):
            flips = self._where_flips(args, kwargs, mark)
        if name in ("masked_fill_",) and self._mark_of(result) is not None:
            return
        loc = self._user_loc(3) if flips or name == "where" else None  # _carry <- after <- wrapper
        chain = mark.chain + ((loc, True),) if flips and loc is not None else mark.chain
        if name == "where" and not flips and loc is not None:
            chain = mark.chain + ((loc, False),)
        self._keep(result, _Mark(labels, chain))

    def _where_flips(self, args, kwargs, mark) -> bool:
        """``torch.where(mask, a, b)`` to two numbers flips the mask when ``a < b`` (1 for the
        pairs it does not select)."""
        cond, a, b = (args + (None, None, None))[:3]
        if self._mark_of(cond) is not mark:
            return False
        values = []
        for x in (a, b):
            if isinstance(x, (int, float)) and not isinstance(x, bool):
                values.append(float(x))
            elif isinstance(x, torch.Tensor) and x.numel() == 1:
                values.append(float(x))
            else:
                return False
        return values[0] < values[1]

    def _meet(self, mark: _Mark, carrier, depth: int) -> None:
        forward = self._forward
        if len(forward.meetings) >= _PER_FORWARD or id(carrier) in forward.carriers:
            return  # a wrapper stacked over another's sees the same call twice
        forward.carriers.add(id(carrier))
        loc = self._user_loc(depth + 1) or self.rec.here()
        meeting = _Meeting(mark, loc, tuple(carrier.shape))
        forward.meetings.append(meeting)
        watcher = self

        def hook(grad, meeting_ref=weakref.ref(meeting)):
            meeting = meeting_ref()
            try:
                if meeting is not None and _cpu(grad) and watcher.rec.in_backward():
                    meeting.support = (grad.detach() != 0).cpu()
            except Exception as exc:
                watcher.rec.internal_error(_LABEL, exc)
            return None

        _register_hook(carrier, hook)

    def _targeted(self, fn: str):
        def before(args, kwargs) -> None:
            if not self._open or self._busy or not (self._marks or (
                    fn == "cross_entropy" and self._forward.nodes)):
                return
            self._busy = True
            try:
                x = args[0] if args else kwargs.get("input")
                target = args[1] if len(args) > 1 else kwargs.get("target")
                mark = self._mark_of(target)
                if mark is None and fn == "cross_entropy":
                    mark = self._class_mark(x, target)
                if mark is not None and isinstance(x, torch.Tensor) and x.requires_grad \
                        and torch.is_grad_enabled() and tuple(x.shape) == mark.labels.shape():
                    self._meet(mark, x, 2)  # before <- wrapper
            except Exception as exc:
                self._close()
                self.rec.internal_error(_LABEL, exc)
            finally:
                self._busy = False
        return before

    def _class_mark(self, x, target):
        """The pairs a ``cross_entropy`` over the matrix labels by its class targets: row i's
        same-label pair is column ``target[i]``. Only when its input comes from a matrix of this
        forward through a few elementwise ops (``-d``, ``d ** 2``, ``d / tau``)."""
        if not (isinstance(x, torch.Tensor) and isinstance(target, torch.Tensor)) \
                or x.dim() != 2 or target.dim() != 1 or target.is_floating_point() \
                or target.dtype == torch.bool or not (_cpu(x) and _cpu(target)) \
                or x.shape[0] != target.shape[0] or x.shape[0] < _MIN_ROWS or x.shape[1] < _MIN_ROWS \
                or x.numel() > _ELEMENTS or not x.requires_grad:
            return None
        node = _from_matrix(x.grad_fn, self._forward.nodes)
        if node is None:
            return None
        labels = _Labels(target.detach().reshape(-1).clone(), torch.arange(x.shape[1]), True,
                         classes=True)
        return _Mark(labels, ((None, False),), matrix=id(node))

    # -- the pairwise matrices ---------------------------------------------------------------
    def _made(self, fn: str, distance: bool):
        def after(args, kwargs, result) -> None:
            if not self._open or self._busy or not isinstance(result, torch.Tensor) \
                    or not result.requires_grad or not torch.is_grad_enabled():
                return
            self._busy = True
            try:
                self._matrix(fn, distance, args, kwargs, result)
            except Exception as exc:
                self._close()
                self.rec.internal_error(_LABEL, exc)
            finally:
                self._busy = False
        return after

    def _matrix(self, fn, distance, args, kwargs, result) -> None:
        if len(args) < 2 or not _cpu(result) or result.dim() not in (1, 2) \
                or result.numel() > _ELEMENTS or not result.is_floating_point():
            return
        a, b = args[0], args[1]
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return
        if result.shape[0] < _MIN_ROWS or (result.dim() == 2 and result.shape[1] < _MIN_ROWS):
            return
        if fn in ("mm", "matmul", "__matmul__"):
            if a.dim() != 2 or b.dim() != 2 or _is_param(a) or _is_param(b):
                return
            itself = (a.data_ptr() == b.data_ptr() and tuple(b.shape) == (a.shape[1], a.shape[0])
                      and tuple(b.stride()) == (a.stride(1), a.stride(0)))
        elif fn == "cdist":
            if a.dim() != 2 or b.dim() != 2:
                return
            itself = a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape)
        else:
            if result.dim() == 1 and (a.dim() != 2 or a.shape != b.shape):
                return
            if _is_param(a) or _is_param(b):
                return
            itself = result.dim() == 2 and a.data_ptr() == b.data_ptr()
        forward = self._forward
        if forward.matrices >= _PER_FORWARD or ("matrix", id(result)) in forward.carriers:
            return
        loc = self._user_loc(3)  # _matrix <- after <- wrapper <- the code
        if loc is None:
            return  # torch's own call inside the script's (``@`` calls torch.matmul)
        forward.carriers.add(("matrix", id(result)))
        forward.matrices += 1
        if result.grad_fn is not None and result.dim() == 2:
            forward.nodes[id(result.grad_fn)] = result.grad_fn
        watcher = self
        key = (loc.path, loc.line)
        spec = (fn, distance, bool(itself), loc, key, forward,
                id(result.grad_fn) if result.grad_fn is not None else None)

        def hook(grad, spec=spec):
            try:
                if watcher.rec.in_backward() and _cpu(grad):
                    watcher._judge(spec, grad)
            except Exception as exc:
                watcher.rec.internal_error(_LABEL, exc)
            return None

        _register_hook(result, hook)

    def _judge(self, spec, grad) -> None:
        fn, distance, itself, loc, key, forward, node = spec
        if key in self._told:
            return
        shape = tuple(grad.shape)
        # a cross_entropy's class targets label only the matrix its input was made from
        meetings = [m for m in forward.meetings if m.shape == shape
                    and (m.mark.matrix is None or m.mark.matrix == node)]
        if not meetings:
            return
        labels = meetings[0].mark.labels
        same = labels.same()
        for m in meetings[1:]:
            if m.mark.labels is not labels and not torch.equal(m.mark.labels.same(), same):
                return  # two sets of labels over these pairs: which one the loss means is unclear
        diagonal = itself or labels.self_pairs()
        verdict = judge(grad, same, distance, diagonal)
        if verdict is None:
            return
        how, (push_same, push_diff, pull_same, pull_diff), wrong_pairs = verdict
        # one verdict per forward: a matrix seen through two wrappers is judged once
        self._verdicts.setdefault(key, {})[forward.window] = how is not None
        if how is None:
            return
        g = grad.detach().to(torch.float64) * (1.0 if distance else -1.0)
        right_pairs = (same & (g > 0)) | (~same & (g < 0))
        at = pointed(meetings, wrong_pairs, right_pairs) or meetings[0].mark.chain[0][0] or loc
        made = ev.pair_pull(how=how, fn=fn, distance=distance, shape=list(shape),
                            same_pairs=int(same.sum()), push_same=push_same, push_diff=push_diff,
                            pull_same=pull_same, pull_diff=pull_diff, matrix_line=loc.line,
                            classes=labels.classes)
        self._ready.append((key, made, at))
        self.rec.resume(STEPPED, self.after_step)
