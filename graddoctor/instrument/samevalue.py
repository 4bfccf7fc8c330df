"""A loss that compares a value with itself: two views that are the same view, negatives that
are the positives, a teacher that is the student.

A contrastive, ranking, metric or distillation loss learns from the *difference* between two
things: two augmentations of one sample (SimCLR, InfoNCE, SimSiam), a positive and a negative
item (BPR), an anchor, a positive and a negative (triplet), a student and a teacher. When a
one-line slip makes both sides the same value (``v2 = v1``, an augmentation with no randomness,
``neg = pos``, ``net(xa), net(xa)``, ``teacher = student``), the comparison is of a value with
itself: a difference that is exactly 0 (a constant loss whose gradients cancel), a positive pair
that is the sample with itself (an invariance never learned), a KL or MSE term that is 0 with a
zero gradient. Nothing fails.

The invariant, read from the loss's graph at the first ``_LOOKED`` backwards of each backward
line (``_LINES`` lines at most, ``_NODES`` nodes at most):

* **Twins.** Two different nodes of the graph that computed the same value from the same
  inputs: the same op over the same parameters (the same ``AccumulateGrad`` leaves) and the same
  saved tensors, to the last bit, all the way down (a module called twice on identical inputs
  without dropout, two lookups of the same rows of one embedding). A structural hash over the
  graph (op, inputs, the shapes and non-tensor values of what each node saved) finds the
  candidates; ``torch.equal`` on every saved tensor of the two subgraphs, top down, confirms
  them. A twin pair counts only where it meets in an op that compares its operands
  (``_COMPARE``: a difference, a product or matrix product, a concatenation, a loss function
  with both operands carrying gradient), each operand a function of its twin alone
  (``_THROUGH``: views, softmax / log_softmax, exp / log, normalisation, a scalar factor: no
  dropout, no added noise, no other input) — not where the two meet in a sum of separate loss
  terms (``ce(model(x), y) + 1e-3 * model(x).pow(2).mean()``). A product meets its twins as a
  comparison only where its result reaches the loss through no matrix product or convolution
  (``_loss_level``): inside the model a product of one value with itself is a Gram matrix or
  shared-QK attention's scores. A concatenation or stack meets them only where a product of its
  rows follows it (``_joined``: SimCLR's ``cat``, then ``z @ z.T``; not REINFORCE's stack of the
  log-probabilities of a state met twice, weighted by returns and summed). A factor that is one number (a constant, or a learned
  temperature such as CLIP's ``logit_scale.exp()``) is passed through. Dropout in train mode (SimCSE,
  R-Drop), random augmentations, sampled negatives that collide in a few rows: the saved masks
  or inputs differ, no twins. A difference under ``exp`` is an importance ratio's
  (``exp(logp - logp_old)``), importance-ratio-wrong's: not looked at. Nor is a product or a
  difference of two *different* functions of twins: ``p * log_p`` (an entropy) and
  ``exp(d) - d`` (the k3 estimator of a KL, its log-ratio ``d`` written twice).
* **A constant twin.** A loss function with one operand carrying gradient and one without (a
  teacher's output under ``no_grad``) whose two operands are the same values: ``mse_loss``,
  ``l1_loss``, ``smooth_l1_loss``, ``huber_loss``, ``binary_cross_entropy`` (and
  ``gaussian_nll_loss``, and ``l1_loss`` where torch builds it of plain ops, read from its
  top node through ``lossnodes.loss_of``) with the target equal to the input to the last bit, or the product ``p * log_q`` of ``kl_div`` /
  ``cross_entropy`` with soft targets whose probabilities are ``exp(log_q)`` to float
  precision. Counted once per optimizer step, and only when it holds at two steps and never
  fails at that loss (a copied or EMA teacher equals the student before the first step only).

A ``same_compared`` aside event (loc: the backward), once per backward line.

Cost: at the first ``_LOOKED`` backwards of each backward line, one walk of the loss's graph
reading each node's saved values (shapes only), and ``torch.equal`` over the candidate twins'
saved tensors (a graph with a tensor saved under saved-tensor hooks, non-reentrant
checkpointing or offloading, is left alone: reading it would recompute the forward; a custom
``autograd.Function`` in a twin's subgraph ends the comparison: what it
keeps on its ``ctx`` is not seen); nothing after them (a frame lookup per backward until ``_SEEN`` backwards).
"""

from __future__ import annotations

import weakref

import torch

from .. import events as ev
from .graphpaths import post_order
from .lossnodes import loss_of
from .lossterms import PerLine, loss_root
from .recorder import Recorder
from .topics import DESCRIBE_LOSS, STEPPED

_LOOKED = 3  # backwards of each backward line looked at
_LINES = 8  # backward lines looked at, at most
_NODES = 20000  # nodes walked per backward
_SEEN = 512  # backwards seen at most
_VERIFY = 4000  # node pairs compared per candidate
_TWINS = 2  # backwards of a line that show twins before it is told
_STEPS = 2  # optimizer steps at which a constant twin is seen before it is told
_MIN_NUMEL = 2  # a twin of fewer values says nothing

# ops that compare their operands (a sum of separate terms does not)
_COMPARE = {
    "SubBackward0": "difference", "MulBackward0": "product", "MmBackward0": "matrix product",
    "BmmBackward0": "matrix product", "DotBackward0": "dot product", "CatBackward0": "concatenation",
    "StackBackward0": "stack", "CdistBackward0": "cdist", "MseLossBackward0": "mse_loss",
    "L1LossBackward0": "l1_loss", "SmoothL1LossBackward0": "smooth_l1_loss",
    "HuberLossBackward0": "huber_loss", "BinaryCrossEntropyBackward0": "binary_cross_entropy",
    "KlDivBackward0": "kl_div", "XlogyBackward0": "kl_div",
}
# ops an operand may pass through and stay a function of its twin alone
_THROUGH = {
    "TBackward0", "TransposeBackward0", "TransposeBackward1", "PermuteBackward0", "ViewBackward0",
    "ReshapeAliasBackward0", "UnsafeViewBackward0", "UnsqueezeBackward0", "UnsqueezeBackward1",
    "SqueezeBackward0", "SqueezeBackward1", "SqueezeBackward2", "SqueezeBackward3", "ExpandBackward0",
    "CloneBackward0", "ToCopyBackward0", "AliasBackward0", "SoftmaxBackward0", "LogSoftmaxBackward0",
    "ExpBackward0", "LogBackward0", "SigmoidBackward0", "TanhBackward0", "LogSigmoidBackward0",
    "NegBackward0", "MulBackward1", "DivBackward1", "AddBackward1", "SubBackward1", "RsubBackward1",
    "PowBackward0", "LinalgVectorNormBackward0", "NormBackward0", "NormBackward1", "ClampMinBackward0",
    "SqrtBackward0",
}
_SCALED = {"MulBackward0", "DivBackward0"}  # through them when the other operand is one constant
# products are also how a model mixes its own values (a Gram matrix, shared-QK attention scores
# q @ k.T with q and k one projection of one input): a comparison of the loss only where the
# product reaches the loss through no matrix product or convolution. A difference of twins is 0
# anywhere; twins concatenated are compared by whatever follows (SimCLR's cat, then z @ z.T)
_MIXING = {"product", "matrix product", "dot product"}
_LAYERS = {"MmBackward0", "BmmBackward0", "AddmmBackward0", "AddbmmBackward0", "BaddbmmBackward0",
           "MvBackward0", "AddmvBackward0", "DotBackward0", "ConvolutionBackward0",
           "LinearBackward0", "EmbeddingBackward0"}
_LOSSES = {"MseLossBackward0": "mse_loss", "L1LossBackward0": "l1_loss",
           "SmoothL1LossBackward0": "smooth_l1_loss", "HuberLossBackward0": "huber_loss",
           "BinaryCrossEntropyBackward0": "binary_cross_entropy"}

# the losses torch builds of plain ops (no node of their own) that compare an input with a
# target of its values, read from their top node (``lossnodes.loss_of``)
_COMPOSITE_LOSSES = frozenset({"l1_loss", "gaussian_nll_loss"})

# the saved-tensor attributes of each node class; weak: a custom autograd.Function's node class
# is the script's and holds its namespace
_saved_names: "weakref.WeakKeyDictionary[type, tuple]" = weakref.WeakKeyDictionary()
_CUSTOM = (torch.autograd.function.BackwardCFunction,)  # custom autograd.Functions, compiled graphs


class _Hooked(Exception):
    """A saved tensor with an unpack hook (non-reentrant checkpointing, CPU offloading): reading
    it would run the hook (recompute the forward): the graph is left alone."""


def _saved(node) -> list:
    """``[(name, value)]`` of what the node saved for its backward; ``_Hooked`` when one of them
    was saved under saved-tensor hooks (read without unpacking: ``_raw_saved_*.unpack_hook``)."""
    names = _saved_names.get(type(node))
    if names is None:
        listed = set(dir(node))
        names = tuple((n, "_raw" + n if "_raw" + n in listed else None) for n in sorted(listed)
                      if n.startswith("_saved_"))
        _saved_names[type(node)] = names
    out = []
    for name, raw_name in names:
        if raw_name is not None:
            raw = getattr(node, raw_name, None)
            for r in raw if isinstance(raw, (list, tuple)) else (raw,):
                if r is not None and getattr(r, "unpack_hook", None) is not None:
                    raise _Hooked
        try:
            out.append((name, getattr(node, name)))
        except Exception:
            out.append((name, None))
    return out


def _sig(value):
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), str(value.dtype))
    if isinstance(value, (list, tuple)):
        return tuple(_sig(v) for v in value[:64])
    if isinstance(value, (int, float, bool, str)) or value is None:
        return value
    return type(value).__name__


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape \
            and a.dtype == b.dtype and a.device == b.device and bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:
        return False


def _children(node) -> list:
    return [child for child, _ in node.next_functions]


def _way(node, core, cores: dict) -> tuple:
    """The ops from an operand down to its core (``("DivBackward0", "SoftmaxBackward0")``)."""
    names = []
    for _ in range(64):
        if node is core or node is None:
            break
        names.append(type(node).__name__)
        node = next((c for c in _children(node) if c is not None and cores.get(c, c) is core), None)
    return tuple(names)


def _param_view(x, y) -> bool:
    """Two nodes of one view op over one parameter (each call's ``W.t()`` in a linear layer)."""
    if type(x) is not type(y) or type(x).__name__ not in _THROUGH:
        return False
    kx, ky = _children(x), _children(y)
    return len(kx) == 1 and len(ky) == 1 and kx[0] is ky[0] and type(kx[0]).__name__ == "AccumulateGrad"


_ROWS = {"MmBackward0", "BmmBackward0", "CdistBackward0", "DotBackward0", "MvBackward0"}


def _joined(order: list) -> set:
    """The nodes a product of rows (a matrix product, cdist) reads through views, normalisation
    and scalar factors: a concatenation of twins compares them only there (SimCLR's
    ``z = cat([z1, z2])``, then ``z @ z.T``); a stack of per-step values weighted and summed
    (REINFORCE's log-probabilities of a state met twice) compares nothing."""
    seen: set = set()
    pending = [c for node in order if type(node).__name__ in _ROWS for c in _children(node)]
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ in _THROUGH or type(node).__name__ in _SCALED:
            pending.extend(_children(node))
    return seen


def _loss_level(root, order: list) -> set:
    """The nodes that reach the loss by at least one path through no matrix product or
    convolution (``_LAYERS``): the loss's own arithmetic, not the model's layers. ``order``
    has each node after its inputs, so reversed it has each node before them."""
    level = {root}
    for node in reversed(order):
        if node in level and type(node).__name__ not in _LAYERS:
            level.update(c for c, _ in node.next_functions if c is not None)
    return level


def verify_twins(a, b, saved) -> list | None:
    """Whether the subgraphs under ``a`` and ``b`` computed the same values: the same ops
    over the same leaves with equal saved tensors (top down, so that the values that differ
    near the output are found first). When they did: the ops where the two computations
    start (their inputs all shared: the same leaves, or constants), e.g. two
    ``EmbeddingBackward0`` lookups of the same rows or a module's first layer given equal
    inputs; None when they did not. ``saved.get(node)``: what the node saved (``_saved``), or
    None when it cannot be read."""
    starts: list = []
    done: set = set()
    queue = [(a, b)]
    k = 0
    while k < len(queue):
        x, y = queue[k]
        k += 1
        if x is y or (x, y) in done:
            continue
        done.add((x, y))
        if len(done) > _VERIFY:
            return None
        if type(x) is not type(y) or len(x.next_functions) != len(y.next_functions) \
                or isinstance(x, _CUSTOM):
            return None  # a custom Function may keep what differs (a mask) on its ctx: unseen
        if type(x).__name__ == "AccumulateGrad":
            if getattr(x, "variable", None) is not getattr(y, "variable", None):
                return None
            continue
        sx, sy = saved.get(x), saved.get(y)
        if sx is None or sy is None or len(sx) != len(sy):
            return None
        if not all(nx == ny and _same(vx, vy) for (nx, vx), (ny, vy) in zip(sx, sy)):
            return None
        shared = True
        for (cx, nx), (cy, ny) in zip(x.next_functions, y.next_functions):
            if (cx is None) != (cy is None) or nx != ny:
                return None
            if cx is not None:
                queue.append((cx, cy))
                shared = shared and (cx is cy or _param_view(cx, cy))
        if shared and not _param_view(x, y) and type(x).__name__ not in starts and len(starts) < 8:
            starts.append(type(x).__name__)
    return starts


class LazySaved:
    """``saved.get(node)`` for ``verify_twins`` read on demand: what a node saved, None when a
    tensor of it went through saved-tensor hooks (reading it would run them)."""

    def __init__(self):
        self._read: dict = {}

    def get(self, node):
        if node not in self._read:
            try:
                self._read[node] = _saved(node)
            except _Hooked:
                self._read[node] = None
        return self._read[node]


class SameValueWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._lines = PerLine(_LOOKED, _LINES)
        self._told: set = set()  # backward locations told
        self._twins: dict = {}  # backward location -> backwards that showed twins
        self._rollouts: dict = {}  # backward location -> backwards that showed repeated twins
        # (loc, op, shape, input op) -> (steps at which it was equal, pids its input reaches)
        self._const: dict = {}
        self._failed: set = set()  # those keys seen unequal once
        self._steps = 0
        self._backwards = 0

    def after_step(self, opt, optimizer) -> None:
        self._steps += 1

    def describe_loss(self, tensors) -> dict:
        if self._backwards >= _SEEN:
            # done for good: its step count is read nowhere from now on
            self.rec.retire(STEPPED, self.after_step)
            self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
            return {}
        self._backwards += 1
        if self._lines.exhausted:
            return {}
        root = loss_root(tensors)
        if root is None:
            return {}
        try:
            loc = self.rec.here()
            if loc in self._told or not self._lines.admit(loc):
                return {}
            with torch.no_grad():
                self._judge(root, loc)
        except _Hooked:
            pass
        except Exception as exc:
            self.rec.internal_error("same_compared", exc)
        return {}

    # -- the walk ----------------------------------------------------------------------------
    def _judge(self, root, loc) -> None:
        order = post_order(root, _NODES)
        if order is None:
            return
        shash: dict = {}
        saved: dict = {}
        for node in order:
            if type(node).__name__ == "AccumulateGrad":
                shash[node] = ("leaf", id(getattr(node, "variable", None)))
                continue
            values = _saved(node)
            saved[node] = values
            shash[node] = hash((type(node).__name__,
                                tuple(None if c is None else (shash.get(c), nr) for c, nr in node.next_functions),
                                tuple((n, _sig(v)) for n, v in values)))
        cores: dict = {}
        found = None
        # the products of kl_div (xlogy(p, p) - p * log_q): a product of two different functions
        # of twins (p and log_q) compares them there only, not in an entropy -(p * log_p)
        kl = {c for node in order if type(node).__name__ == "SubBackward0"
              for c in _children(node) if type(c).__name__ == "MulBackward0"
              and any(type(o).__name__ == "XlogyBackward0" for o in _children(node))}
        # exp(logp - logp_old): an importance ratio, importance-ratio-wrong's (instrument/ratios.py)
        ratios = {c for node in order if type(node).__name__ == "ExpBackward0" for c in _children(node)}
        at_loss = _loss_level(root, order)
        joined = None
        for node in order:
            name = type(node).__name__
            op = _COMPARE.get(name)
            if op is None:
                call = loss_of(node)  # l1_loss, gaussian_nll_loss: torch builds them of plain ops
                if call is not None and call.fn in _COMPOSITE_LOSSES:
                    self._constant_call(call, loc)
                continue
            if node in ratios or (op in _MIXING and node not in at_loss):
                continue
            if op in ("concatenation", "stack"):
                joined = _joined(order) if joined is None else joined
                if node not in joined:
                    continue
            kids = [c for c in _children(node) if c is not None]
            if len(kids) >= 2 and found is None:
                found = self._twin(node, op, kids[:16], shash, saved, cores, node in kl)
            if len(kids) == 1:
                self._constant(node, name, loc, saved)
        if found is not None:
            n = self._twins.get(loc, 0) + 1
            self._twins[loc] = n
            if n >= _TWINS:
                op, core, shape, pids, starts = found
                self._tell(loc, "twins", op, core, shape, pids, starts)
                return
        for key, (steps, pids) in self._const.items():
            if key[0] == loc and len(steps) >= _STEPS and key not in self._failed:
                self._tell(loc, "constant", key[1], key[3], list(key[2]), pids, [])
                return
        repeated = self._repeated(order, shash, saved)
        if repeated is not None:
            n = self._rollouts.get(loc, 0) + 1
            self._rollouts[loc] = n
            if n >= _TWINS:
                op, core, shape, pids, starts = repeated
                self._tell(loc, "repeated", op, core, shape, pids, starts)

    def _repeated(self, order, shash, saved):
        """Twins each fitted to a different constant target by the same comparison (a
        difference or a loss function with one operand carrying gradient): a rollout whose
        every step predicts from the initial state again (``state = model(x)`` in the loop),
        the same prediction compared with the targets of successive steps."""
        parents: dict = {}
        for node in order:
            for child, _ in node.next_functions:
                if child is not None:
                    parents.setdefault(child, []).append(node)
        groups: dict = {}
        for node in order:
            name = type(node).__name__
            above = parents.get(node, ())
            if name == "AccumulateGrad" or name in _THROUGH or len(above) != 1:
                continue
            compare = above[0]
            cname = type(compare).__name__
            if not (cname == "SubBackward0" or cname in _LOSSES) \
                    or sum(c is not None for c in _children(compare)) != 1:
                continue
            groups.setdefault((shash.get(node), cname), []).append((node, compare))
        for members in groups.values():
            if len(members) < 2:
                continue
            (a, ca), (b, cb) = members[0], members[1]
            if not self._targets_differ(ca, cb, parents, saved):
                continue
            starts = self._verify(a, b, saved)
            if starts is None:
                continue
            shape, numel = self._shape(a, saved)
            if numel is not None and numel < _MIN_NUMEL:
                continue
            op = _LOSSES.get(type(ca).__name__, "difference")
            return op, type(a).__name__, shape, self._pids(a), starts
        return None

    @staticmethod
    def _targets_differ(ca, cb, parents, saved) -> bool:
        """Whether two comparisons of equal predictions are made against different targets:
        a loss function's saved targets differ, or the differences (saved by the op above
        each, a square's input) do."""
        if type(ca).__name__ in _LOSSES:
            x = dict(saved.get(ca, ())).get("_saved_target")
            y = dict(saved.get(cb, ())).get("_saved_target")
        else:
            above_a, above_b = parents.get(ca, ()), parents.get(cb, ())
            if len(above_a) != 1 or len(above_b) != 1 or type(above_a[0]) is not type(above_b[0]):
                return False
            x = dict(saved.get(above_a[0], ())).get("_saved_self")
            y = dict(saved.get(above_b[0], ())).get("_saved_self")
        return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape \
            and not bool(torch.equal(x, y))

    def _core(self, node, cores: dict, saved: dict):
        """The node an operand is a function of alone: down through views, softmax, exp/log,
        normalisation and scalar factors (``_THROUGH``), and through a node all of whose inputs
        lead to one core (``x / x.norm()``)."""
        hit = cores.get(node)
        if hit is not None:
            return hit
        path = []
        current = node
        for _ in range(64):
            if current in cores:
                current = cores[current]
                break
            path.append(current)
            name = type(current).__name__
            kids = [c for c in _children(current) if c is not None]
            if not kids:
                break
            if name in _THROUGH and len(kids) == 1:
                current = kids[0]
                continue
            if name in _SCALED and len(kids) == 1:
                # the constant operand is the saved tensor that is not the graph input's value
                consts = [v for _, v in saved.get(current, ()) if isinstance(v, torch.Tensor)]
                if any(v.numel() == 1 for v in consts):
                    current = kids[0]
                    continue
                break
            if name in _SCALED and len(current.next_functions) == 2:
                # one operand a single number with a graph of its own: a learned temperature
                # (CLIP's logit_scale.exp() * z1 @ z2.T), a scale as a constant is
                values = dict(saved.get(current, ()))
                first, second = values.get("_saved_self"), values.get("_saved_other")
                scalar = [isinstance(v, torch.Tensor) and v.numel() == 1 for v in (first, second)]
                if scalar.count(True) == 1 and current.next_functions[1 - scalar.index(True)][0] is not None:
                    current = current.next_functions[1 - scalar.index(True)][0]
                    continue
            if len(kids) >= 2 and (name not in _COMPARE or name in _SCALED):
                under = {self._core(k, cores, saved) for k in kids}
                if len(under) == 1:
                    current = under.pop()
                    break
            break
        for p in path:
            cores[p] = current
        return current

    def _twin(self, node, op, kids, shash, saved, cores, kl: bool):
        for i in range(len(kids)):
            for j in range(i + 1, len(kids)):
                a, b = self._core(kids[i], cores, saved), self._core(kids[j], cores, saved)
                if a is b or type(a).__name__ == "AccumulateGrad" or shash.get(a) != shash.get(b):
                    continue
                if op in ("product", "difference") and not kl \
                        and _way(kids[i], a, cores) != _way(kids[j], b, cores):
                    # p * log_p of a value computed twice: an entropy; exp(d) - d of a log-ratio
                    # written twice: the k3 estimator of a KL (GRPO); no comparison either way
                    continue
                starts = self._verify(a, b, saved)
                if starts is not None:
                    shape, numel = self._shape(a, saved)
                    if numel is not None and numel < _MIN_NUMEL:
                        continue
                    return ("kl_div" if kl else op), type(a).__name__, shape, self._pids(a), starts
        return None

    def _verify(self, a, b, saved) -> list | None:
        return verify_twins(a, b, saved)

    @staticmethod
    def _shape(node, saved):
        """The shape of a node's output where it saved it (its result), else of its first saved tensor."""
        values = dict(saved.get(node, ()))
        for name in ("_saved_result",):
            v = values.get(name)
            if isinstance(v, torch.Tensor):
                return list(v.shape), v.numel()
        return None, None

    def _pids(self, node) -> list:
        """The tracked tensors (parameters) the twin's subgraph reaches."""
        pids: list = []
        order = post_order(node, _NODES) or []
        for n in order:
            if type(n).__name__ == "AccumulateGrad":
                pid = self.rec.pid(getattr(n, "variable", None))
                if pid is not None and pid not in pids:
                    pids.append(pid)
                    if len(pids) >= 64:
                        break
        return pids

    def _constant(self, node, name, loc, saved) -> None:
        """A loss function whose one operand carries gradient and whose other (a constant) has
        the same values."""
        kids = _children(node)
        values = dict(saved.get(node, ()))
        if name in _LOSSES:
            if len(kids) < 2 or kids[0] is None or kids[1] is not None:
                return
            a, b = values.get("_saved_self"), values.get("_saved_target")
            if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.numel() < 8:
                return
            equal = a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
            op, graph = _LOSSES[name], kids[0]
        elif name == "MulBackward0":
            if len(kids) != 2 or (kids[0] is None) == (kids[1] is None):
                return
            graph = kids[0] if kids[0] is not None else kids[1]
            # the product of kl_div / soft cross_entropy: probabilities (saved: the constant)
            # times log-probabilities (the graph's log_softmax, whose result it saved)
            if type(graph).__name__ != "LogSoftmaxBackward0":
                return
            p = values.get("_saved_self" if kids[0] is None else "_saved_other")
            a = logq = dict(saved.get(graph, ())).get("_saved_result")
            if not (isinstance(p, torch.Tensor) and isinstance(logq, torch.Tensor)) \
                    or logq.shape != p.shape or logq.numel() < 8 or not p.is_floating_point():
                return
            equal = bool(torch.allclose(logq.exp(), p, rtol=1e-5, atol=1e-7))
            op = "kl_div"
        else:
            return
        self._count_constant(loc, op, a, graph, equal)

    def _constant_call(self, call, loc) -> None:
        """A loss torch builds of plain ops (``lossnodes.loss_of``) whose input carries gradient
        and whose target (a constant) has the same values."""
        a, b, graph = call.input, call.target, call.input_node
        if graph is None or not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) \
                or b.requires_grad or a.numel() < 8:
            return
        equal = a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
        self._count_constant(loc, call.fn, a, graph, equal)

    def _count_constant(self, loc, op: str, a, graph, equal: bool) -> None:
        key = (loc, op, tuple(a.shape), type(graph).__name__)
        if not equal:
            self._failed.add(key)
            return
        if key not in self._const:
            self._const[key] = (set(), self._pids(graph))
        self._const[key][0].add(self._steps)

    def _tell(self, loc, how: str, op: str, core: str, shape, pids, starts) -> None:
        self._told.add(loc)
        self.rec.emit_aside(ev.same_compared(how=how, op=op, core=core, shape=shape,
                                             params=list(pids or [])[:64], starts=starts), loc)

    def install(self, patcher) -> None:
        pass
