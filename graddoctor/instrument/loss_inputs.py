"""Classification losses fed the wrong kind of score: probabilities where logits belong (a
softmax or sigmoid applied twice), or something else where log-probabilities belong.

Targets outside the domain a loss reads them in are lossdomain.py's (one table for every loss).

``cross_entropy`` and ``binary_cross_entropy_with_logits`` apply log_softmax / sigmoid
themselves; ``nll_loss``, ``kl_div`` and ``ctc_loss`` expect log-probabilities as input (the
last over the classes of its (T, N, C) input). Handing them the
output of ``softmax``/``sigmoid`` (an ``nn.Softmax`` closing the model is the classic) trains,
but towards a bounded target with shrinking gradients; ``nll_loss`` on raw logits minimises
``-logit[y]``, which has no lower bound.

The five functions in ``torch.nn.functional`` are patched (their ``nn`` modules call them). The
judgement reads the autograd graph, which costs no device work: the input's ``grad_fn``, past
operations that only move or select values (views, transposes, slices, dtype copies, clamps),
names the operation that made the scores. Only where the graph does not tell (a hand-written
normalisation, a score made by a layer) are values looked at: one small reduction and one
device-to-host read per call, for the first calls of each loss (on a GPU only those before the
first optimizer step: no host sync in the updates after it). Only losses a gradient flows
through are judged (a validation loss computed on probabilities is a metric's business). Each
call line is recorded at most once (a ``loss_input`` aside event).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import events as ev
from .graphpaths import saved
from .inlinable import watched
from .losscalls import LossCalls
from .pairlabels import pair_fault
from .recorder import Recorder

NAMES = ("cross_entropy", "nll_loss", "binary_cross_entropy_with_logits", "kl_div", "ctc_loss",
         "binary_cross_entropy")

# autograd nodes that keep the values they are given (reshape, select, reorder, cast, clamp):
# the scores behind them are what their input was
_PASS_THROUGH = ("View", "Reshape", "UnsafeView", "Squeeze", "Unsqueeze", "Permute", "Transpose",
                 "TBackward", "Clone", "ToCopy", "Slice", "Select", "Index", "Expand", "Clamp",
                 "Alias", "Narrow", "Flatten", "Contiguous", "Cat", "Stack", "Split", "Unbind",
                 "MaskedSelect", "Gather")
# losses that also differentiate their target, so that swapped arguments train without error
# (kl_div with a fixed distribution as input and the model's as target is KL(q || p): meant)
_SWAPPABLE = ("cross_entropy", "binary_cross_entropy_with_logits")
_DEPTH = 16  # pass-through nodes followed before giving up
_LOG_DEPTH = 6  # levels searched for a log op behind nll_loss's input (a weighted log-prob)


def _kind(node) -> str:
    name = type(node).__name__
    if name.startswith("SoftmaxBackward"):
        return "softmax"
    if name.startswith("SigmoidBackward"):
        return "sigmoid"
    if name.startswith(("LogSoftmaxBackward", "LogBackward", "LogSigmoidBackward")):
        return "log"
    if name.startswith("ReluBackward"):  # nothing below 0
        return "relu"
    if name.startswith(("ClampBackward", "ClampMinBackward")) and _floor_at_zero(node):
        return "clamp"  # a floor at 0 or above: nothing below 0 either
    if name.startswith(_PASS_THROUGH):
        return "pass"
    return "other"


def _floor_at_zero(node) -> bool:
    """Whether a clamp node's lower bound is a number at or above 0 (``x.clamp(0, 1)``,
    ``clamp_min(0)``); a clamp for stability (``clamp(-15, 15)``) keeps the scores' sign."""
    try:
        low = getattr(node, "_saved_min", None)
        return low is not None and not isinstance(low, torch.Tensor) and float(low) >= 0
    except (TypeError, ValueError, RuntimeError):
        return False


def producer(tensor) -> str | None:
    """What made ``tensor``'s values, seen through value-keeping operations: "softmax",
    "sigmoid", "log" (log_softmax, log, logsigmoid), "relu", "clamp" (a clamp whose floor is 0
    or more), or None (anything else, or no graph)."""
    return producer_node(tensor)[0]


def producer_node(tensor) -> tuple[str | None, object]:
    """``producer`` and the autograd node it names (None with it)."""
    return _made_by(tensor.grad_fn, _DEPTH)


def _made_by(node, depth: int) -> tuple[str | None, object]:
    while node is not None and depth > 0:
        kind = _kind(node)
        if kind == "clamp":  # a floor on what a softmax or sigmoid made keeps them that
            parents = [n for n, _ in node.next_functions if n is not None]
            below = _made_by(parents[0], depth - 1) if len(parents) == 1 else (None, None)
            return below if below[0] is not None else (kind, node)
        if kind != "pass":
            return (None, None) if kind == "other" else (kind, node)
        parents = [n for n, _ in node.next_functions if n is not None]
        if len(parents) != 1:  # a cat or stack: one answer only when all its parts agree
            made = [_made_by(n, depth - 1) for n in parents]
            kinds = {kind for kind, _ in made}
            return made[0] if len(kinds) == 1 else (None, None)
        node, depth = parents[0], depth - 1
    return None, None


def squashed_before(node) -> bool:
    """Whether the input of a sigmoid node is itself the output of a sigmoid or a softmax (seen
    through value-keeping operations): probabilities squashed a second time."""
    parents = [n for n, _ in node.next_functions if n is not None]
    return len(parents) == 1 and _made_by(parents[0], _DEPTH)[0] in ("sigmoid", "softmax")


def _softmax_under_log(node):
    """The softmax node whose probabilities a log node takes the log of, seen through an added
    constant (``log(softmax(x, dim) + 1e-8)``) and value-keeping operations (a clamp to a floor,
    reshapes), or None."""
    for _ in range(_LOG_DEPTH):
        parents = [n for n, _ in node.next_functions if n is not None]
        if len(parents) != 1:  # an addition of something with a gradient: not an epsilon
            return None
        node = parents[0]
        name = type(node).__name__
        if name.startswith("SoftmaxBackward"):
            return node
        if not (name.startswith("AddBackward") or _kind(node) in ("pass", "clamp")):
            return None
    return None


def normalised_size(node) -> int | None:
    """The size of the dimension a log_softmax normalised, or the softmax under a log
    (``log(softmax(x, dim) + eps)``), read from their autograd nodes (no device work); None for
    another node."""
    name = type(node).__name__
    if name.startswith("LogBackward"):
        node = _softmax_under_log(node)
        if node is None:
            return None
    elif not name.startswith("LogSoftmaxBackward"):
        return None
    dim = int(node._saved_dim)
    if dim >= 2 ** 63:  # saved as an unsigned 64-bit number: -1 reads as 2**64 - 1
        dim -= 2 ** 64
    result = saved(node, "_saved_result")
    return int(result.shape[dim]) if result is not None else None


_RESHAPES = ("ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward")


_MIN_ORDER = 8  # tokens a layout is judged on at least


def _reshaped_from(input) -> list[int] | None:
    """The shape ``input`` was viewed or reshaped from (its graph, past a log_softmax)."""
    node = input.grad_fn
    name = type(node).__name__
    if name.startswith(("LogSoftmaxBackward", "SoftmaxBackward")):
        node = node.next_functions[0][0] if node.next_functions else None
        name = type(node).__name__
    if node is None or not name.startswith(_RESHAPES):
        return None
    return [int(s) for s in getattr(node, "_saved_self_sym_sizes", ())] or None


def _tokens_of(ids, targets, ignore) -> bool:
    """``targets`` (laid out like ``ids``) are the tokens of ``ids`` shifted by at most one
    position along either dimension, at >= 90 % of the places the loss does not ignore."""
    for dim in (0, 1):
        a, b = (ids, targets) if dim == 1 else (ids.t(), targets.t())
        length = int(a.shape[1])
        for k in (1, 0, -1):
            lo, hi = max(0, -k), min(length, length - k)
            if hi - lo < 1:
                continue
            t, i = b[:, lo:hi], a[:, lo + k:hi + k]
            keep = t != ignore
            count = int(keep.sum())
            if count >= _MIN_ORDER and float(((t == i) & keep).sum()) / count >= _ORDER_MATCH:
                return True
    return False


def rows_cut_across(input) -> list[int] | None:
    """The shape an (N, C) loss input was reshaped from when its rows, C consecutive values of
    that tensor, cut across its dimensions: no dimension d of it has the values after it
    (the product of the later sizes) dividing C and C dividing the block it starts. A (B, C, T)
    output viewed as (-1, C) is one (each row holds C time steps of one class, or parts of
    two); (B, T, C), (B, C, 1) and a packed (B, K * C) of K heads split into (B * K, C) are
    not. None when the input was made otherwise (read from its graph, past log_softmax)."""
    sizes = _reshaped_from(input) or []
    classes = int(input.shape[1])
    if len(sizes) < 2 or classes < 2:
        return None
    after = 1
    for size in reversed(sizes):
        if classes % after == 0 and (after * size) % classes == 0:
            return None
        after *= size
    return sizes


def has_log_nearby(tensor) -> bool:
    """A log op within a few levels of ``tensor``'s graph (``log_softmax(x) * w``, a log-prob
    masked or weighted before nll_loss): the input is meant as log-probabilities."""
    level, seen = [tensor.grad_fn], set()
    for _ in range(_LOG_DEPTH):
        following = []
        for node in level:
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if _kind(node) == "log":
                return True
            following.extend(n for n, _ in node.next_functions if n is not None)
        level = following
    return False


def _class_dim(tensor, fn: str = "") -> int:
    if fn == "ctc_loss":  # (T, N, C) log-probabilities: the classes last
        return tensor.dim() - 1 if tensor.dim() else 0
    return 1 if tensor.dim() >= 2 else 0


_PADDING_SHARE = 0.25  # targets equal to the padding index: at least this share is reported
_SQUARE_MIN = 4  # a square cross_entropy input at least this large is looked at as a similarity matrix
_SELF_SHARE = 0.9  # rows whose maximum sits on the diagonal: at least this share
_FILL_READS = 8  # token batches of embeddings without padding_idx looked at for a fill id
_ORDER_READS = 8  # loss calls with flat token targets matched against the embedded ids' layout
_ORDER_MATCH = 0.9  # share of the targets that must be the ids, shifted by one position at most
_SMOOTHED_SHARE = 0.9  # rows of a soft target with a shared floor above 0: at least this share
_SMOOTHING_HIGH = 0.5  # label_smoothing from here on: the right class keeps at most half its mass
_PAIR_LOOKS = 64  # loss calls whose graph is followed to a similarity product (the first ones)
_VALUE_CHECKS = 8  # calls per function judged by their values (the first ones: every loss line of a loop)
# the losses whose per-class weights are read: (keyword, position) of the weight argument
_WEIGHTED = {"cross_entropy": ("weight", 2), "nll_loss": ("weight", 2),
             "binary_cross_entropy_with_logits": ("pos_weight", 6)}
_ORDINAL_ROWS = 256  # cumulative target rows read (over 2 calls or more) before a first level
# always on is judged: a rare lowest rank can miss one batch, not several
# the losses whose `weight` (argument 2) rebalances the classes or outputs
_UNIFORM_WEIGHTED = ("cross_entropy", "nll_loss", "binary_cross_entropy_with_logits",
                     "binary_cross_entropy")
_UNIFORM_CALLS = 2  # calls whose weight is one value before it is told
_WEIGHT_TARGETS = 64  # targets seen (summed over the first calls) before a weight is judged
_WEIGHT_KEYS = 8  # weight tensors counted for, at most
_ABSENT_TARGETS = 256  # targets counted before a down-weighted class's absence is judged
_WEIGHT_SPREAD = 2.0  # the largest weight at least this multiple of the smallest
_FREQUENCY_SPREAD = 3.0  # the most frequent class at least this multiple of the rarest seen


def fill_runs(same, column: int):
    """Per row of a (batch, length) mask of one id's positions, the run of it at the row's end
    (``column`` -1) or start (0), when those runs are how padding looks: at least half the rows
    (two at least) have one, of different lengths, the longest at least 2, none the whole row
    (the longest row needs none). None otherwise. Says nothing of the id elsewhere in the rows:
    a filler is also (nearly) absent from them (``infer_fill``)."""
    rows, length = same.shape
    ending = same[:, column]
    if int(ending.sum()) < max(2, (rows + 1) // 2):
        return None
    runs = (same.flip(1) if column == -1 else same).int().cumprod(1).sum(1)
    padded = runs[ending]
    if not (int(padded.max()) >= 2 and int(padded.min()) < int(padded.max())
            and int(runs.max()) < length):
        return None
    return runs


def infer_fill(tokens) -> int | None:
    """The id that fills up the shorter rows of a (batch, length) CPU token batch: most rows
    (the longest need none) end, or start, with it in runs of different lengths, and it is
    (nearly) absent from the rest of the batch; None when no id does."""
    rows, length = tokens.shape
    with torch.no_grad():
        for column in (-1, 0):  # right padding, left padding
            fill = int(tokens[:, column].mode().values)
            same = tokens == fill
            runs = fill_runs(same, column)
            if runs is None:
                continue
            content = length * rows - int(runs.sum())
            if int(same.sum()) - int(runs.sum()) > 0.02 * content:
                continue  # a word like any other (a small vocabulary), not a filler
            return fill
    return None


def weighted_class_absent(counts, weights) -> dict | None:
    """A class weight that singles one class out below all the others (a no-object or background
    class's ``eos_coef``, every other class at one shared weight) while none of the targets
    counted is that class: the targets fill their empty entries with another class. None
    otherwise. Returns the class, its weight, the others' weight, the targets counted, and the
    most frequent class with its share."""
    w = weights.reshape(-1).double()
    if w.numel() < 2 or counts.numel() != w.numel():
        return None
    others = torch.ones(w.numel(), dtype=torch.bool)
    low = int(w.argmin())
    others[low] = False
    rest = w[others]
    if not bool((rest == rest[0]).all()) or not float(w[low]) < float(rest[0]) or float(w[low]) < 0:
        return None
    if float(counts[low]) > 0:
        return None
    total = float(counts.sum())
    top = int(counts.argmax())
    return {"cls": low, "weight": round(float(w[low]), 6), "others": round(float(rest[0]), 6),
            "targets": int(total), "top": top, "top_share": round(float(counts[top]) / total, 4)}


def _inverted_weights(fn: str, counts, weights) -> dict | None:
    """The classes whose weights grow with their frequency, or None. ``counts``: targets per
    class (for binary_cross_entropy_with_logits, a (2, C) stack of positives and negatives per
    output, whose ``pos_weight`` should be about negatives / positives)."""
    if fn == "binary_cross_entropy_with_logits":
        pos, neg = counts[0], counts[1]
        w = weights if weights.numel() == pos.numel() else weights.expand(pos.numel())
        # outputs whose positives are rare, or the minority with pos_weight = positives /
        # negatives to within sampling (the inverse frequency computed upside down)
        ratio = pos / neg.clamp(min=1)
        upside_down = (pos > 0) & (pos < neg) & (w < 1) & (w <= 1.5 * ratio) & (w * 1.5 >= ratio)
        rare = ((pos > 0) & (pos * 3 <= neg)) | upside_down
        if not bool(rare.any()):
            return None
        low = rare & (w < 1) & ((w * 2 <= neg / pos.clamp(min=1)) | upside_down)
        if int(low.sum()) * 2 <= int(rare.sum()):
            return None  # most rare outputs weigh their positives up, as meant
        idx = [i for i in range(pos.numel()) if bool(low[i])][:4]
        return {"classes": idx, "shares": [round(float(pos[i] / (pos[i] + neg[i])), 4) for i in idx],
                "weights": [round(float(w[i]), 4) for i in idx]}
    present = counts > 0
    if int(present.sum()) < 2:
        return None
    c, w = counts[present], weights[present]
    if float(w.min()) <= 0 or float(c.max()) < _FREQUENCY_SPREAD * float(c.min()) \
            or float(w.max()) < _WEIGHT_SPREAD * float(w.min()):
        return None
    if int(present.sum()) == 2:
        if not (int(w.argmax()) == int(c.argmax()) and float(w.max()) > float(w.min())):
            return None
    else:
        rank_c = c.argsort().argsort().double()
        rank_w = w.argsort().argsort().double()
        rank_c, rank_w = rank_c - rank_c.mean(), rank_w - rank_w.mean()
        if float((rank_c * rank_w).sum() / (rank_c.norm() * rank_w.norm())) < 0.8:
            return None
    ids = [i for i in range(counts.numel()) if bool(present[i])]
    order = sorted(ids, key=lambda i: float(counts[i]))
    picked = [order[-1], order[0]]  # the most frequent and the rarest
    total = float(counts.sum())
    return {"classes": picked, "shares": [round(float(counts[i]) / total, 4) for i in picked],
            "weights": [round(float(weights[i]), 4) for i in picked]}


class LossInputWatcher:
    def __init__(self, rec: Recorder, calls: LossCalls | None = None, real_index=None):
        self.rec = rec
        self.calls = calls or LossCalls()  # the other watchers that hear of these calls
        # realindex.py's watcher: told of the losses' ignore_index and the embeddings'
        # padding_idx, with the pad ids known here (a token loss may ignore its pad id)
        self.real_index = real_index
        self._done: set = set()  # call lines recorded
        self._value_checks: dict[str, int] = {}  # fn -> calls judged by their values so far
        # (padding_idx, vocabulary size) of the embeddings the script ran: a loss over that
        # vocabulary (as many classes as the embedding has rows) predicts its tokens
        self._pads: set[tuple[int, int]] = set()
        # padding_idx -> sizes of the token batches embedded with it (a few): a target of one
        # label per embedded token (a tagger's) is token-level whatever its classes
        self._token_counts: dict[int, set[int]] = {}
        self._padded: set = set()  # call lines recorded as padded
        self._matched: set = set()  # call lines recorded with a self_match event
        self._paired: set = set()  # call lines recorded with a pair_labels event
        self._pair_looks = 0  # calls whose graph was looked at for a similarity (the first ones)
        self._smoothed: set = set()  # call lines recorded with a label_smoothing event
        self._smoothing_told: set = set()  # call lines recorded with a smoothing_high event
        # pads inferred from the token batches themselves (an embedding without padding_idx:
        # GPT-2 padded with its eos token): pad -> "fill"; token batches looked at so far
        self._fills: dict[int, str] = {}
        self._fill_reads = 0
        # (vocabulary size, (batch, length)) of the first 2-D token batches the embeddings ran:
        # a token loss's flattened targets are read back into rows of one of these shapes
        self._token_batches: set[tuple[int, tuple[int, int]]] = set()
        self._last_ids = None  # the latest 2-D token batch embedded (first loss calls only)
        self._class_counts: dict[tuple, object] = {}  # (fn, weight's data_ptr, numel) -> targets per class
        self._weights_told: set[str] = set()
        self._absent_told: set[str] = set()
        self._uniform_done: set[str] = set()  # functions whose weight was judged (or not uniform)
        self._uniform_seen: dict[str, list] = {}  # fn -> [calls, value, positives, targets]
        self._ordinal_done = False  # the ordinal-levels check answered (or never applies)
        self._ordinal_rows = 0
        self._ordinal_calls = 0
        self._ordinal_varies = False
        self._order_reads = 0

    def _wrap(self, original, fn: str):
        watcher, rec = self, self.rec
        heard = watcher.calls.heard

        def before(args, kwargs) -> None:
            input = args[0] if args else kwargs.get("input", kwargs.get("log_probs"))
            target = args[1] if len(args) > 1 else kwargs.get("target", kwargs.get("targets"))
            heard(fn, input, target, args, kwargs)
            if not (isinstance(input, torch.Tensor) and input.requires_grad and torch.is_grad_enabled()):
                if fn in _SWAPPABLE and isinstance(input, torch.Tensor) and torch.is_grad_enabled():
                    try:
                        watcher._swapped(fn, input, target)
                    except Exception as exc:
                        rec.internal_error(f"F.{fn}", exc)
                return  # no gradient flows: a metric, or a mistake torch reports itself
            try:
                watcher._check(fn, input)
                if watcher._pads and fn in ("cross_entropy", "nll_loss"):
                    watcher._padding(fn, input, target, args, kwargs)
                if watcher.real_index is not None and fn in ("cross_entropy", "nll_loss"):
                    watcher.real_index.loss_call(fn, input, target, args, kwargs, watcher._pads)
                if watcher._token_batches and fn in ("cross_entropy", "nll_loss"):
                    watcher._padded_targets(fn, input, target, args, kwargs)
                if watcher._last_ids is not None and fn in ("cross_entropy", "nll_loss"):
                    watcher._order(fn, input, target, args, kwargs)
                if fn == "cross_entropy" and input.dim() == 2 \
                        and input.shape[0] == input.shape[1] >= _SQUARE_MIN:
                    watcher._self_match(input, target)
                if fn in ("cross_entropy", "nll_loss") and input.dim() == 2 and input.shape[1] >= input.shape[0]:
                    watcher._pair_labels(fn, input, target)
                if fn == "cross_entropy" and (args[7] if len(args) > 7 else kwargs.get("label_smoothing")):
                    watcher._smoothed_twice(input, target, args, kwargs)
                    watcher._smoothing_high(input, args, kwargs)
                if fn in ("binary_cross_entropy_with_logits", "binary_cross_entropy") \
                        and not watcher._ordinal_done:
                    watcher._ordinal_levels(fn, target, args[2] if len(args) > 2 else kwargs.get("weight"))
                if fn in _WEIGHTED:
                    weight = args[_WEIGHTED[fn][1]] if len(args) > _WEIGHTED[fn][1] else kwargs.get(_WEIGHTED[fn][0])
                    if weight is not None:
                        watcher._class_weights(fn, input, target, weight, args, kwargs)
                if fn in _UNIFORM_WEIGHTED and fn not in watcher._uniform_done:
                    watcher._uniform_weight(fn, input, target, args, kwargs)
            except Exception as exc:
                rec.internal_error(f"F.{fn}", exc)

        loss = watched(original, before)  # torch.compile inlines it (inlinable.py)
        loss.__prepare_scriptable__ = lambda: original  # torch.jit.script compiles torch's own
        return loss

    def _check(self, fn: str, input) -> None:
        made, node = producer_node(input)
        classes = int(input.shape[_class_dim(input, fn)]) if input.dim() else 1
        problem, normalised = None, None
        if fn == "binary_cross_entropy":  # takes probabilities: only squashing them again is wrong
            if made == "sigmoid" and squashed_before(node):
                problem = "sigmoid-twice"
        elif made in ("softmax", "sigmoid"):
            problem = made  # probabilities: never what these four losses take
        elif made in ("relu", "clamp") and fn in ("cross_entropy", "binary_cross_entropy_with_logits"):
            problem = made  # logits that cannot go below 0
        elif made == "log" and fn in ("cross_entropy", "nll_loss", "ctc_loss") and input.dim() >= 2:
            normalised = normalised_size(node)
            if normalised is not None and normalised != classes:
                # log_softmax, or the log of a softmax, over another dimension than the classes
                problem = "dim" if type(node).__name__.startswith("LogSoftmax") else "log-dim"
        elif made in (None, "relu") and fn in ("cross_entropy", "nll_loss", "kl_div"):
            problem = self._by_values(fn, input)
        source = None
        if problem is None and fn in ("cross_entropy", "nll_loss") and input.dim() == 2:
            source = rows_cut_across(input)
            if source is not None:
                problem = "rows"
        if problem is None:
            return
        loc = self.rec.here()
        if loc in self._done:
            return
        self._done.add(loc)
        self.rec.emit_aside(ev.loss_input(fn=fn, problem=problem, classes=classes,
                                          normalised=normalised, source=source), loc)

    def _swapped(self, fn: str, input, target) -> None:
        """"swapped": the scores are passed as the target and the labels as the input
        (``criterion(labels, outputs)``): the input needs no gradient, the target does, both
        float and of one shape. torch differentiates the target, so this trains without error."""
        if not (isinstance(target, torch.Tensor) and target.requires_grad
                and input.is_floating_point() and target.shape == input.shape and input.dim()):
            return
        loc = self.rec.here()
        if loc in self._done:
            return
        self._done.add(loc)
        classes = int(input.shape[_class_dim(input)]) if input.dim() > 1 else 1
        self.rec.emit_aside(ev.loss_input(fn=fn, problem="swapped", classes=classes), loc)

    def _reads_left(self, key: str, tensor) -> bool:
        """Whether one more value read is allowed for ``key``: the first calls only, and on a
        device only before the first optimizer step (no host sync in the updates after it)."""
        done = self._value_checks.get(key, 0)
        if done >= _VALUE_CHECKS or (self.rec.progress.steps and tensor.device.type != "cpu"):
            return False
        self._value_checks[key] = done + 1
        return True

    def _by_values(self, fn: str, input) -> str | None:
        """For scores whose graph does not tell, the first calls only: "probabilities"
        (cross_entropy given rows in [0, 1] that sum to 1), "logits" (nll_loss or kl_div given
        rows that are not log-normalised, with no log op behind them), else None. kl_div has no
        class dimension of its own: its rows are read along the last one, the distillation
        convention (log_softmax(student_logits, dim=-1))."""
        if not self._reads_left(fn, input):
            return None
        dim = -1 if fn == "kl_div" else _class_dim(input)
        if input.dim() == 0 or input.numel() == 0 or input.shape[dim] < 2:
            return None
        if fn in ("nll_loss", "kl_div") and has_log_nearby(input):
            return None
        with torch.no_grad():
            values = input.detach().float()
            if fn == "cross_entropy":
                low, high, off = torch.stack(
                    [values.min(), values.max(), (values.sum(dim) - 1).abs().max()]).tolist()
                return "probabilities" if low >= 0 and high <= 1 and off < 1e-3 else None
            off = torch.logsumexp(values, dim).abs().max().item()
            return "logits" if math.isfinite(off) and off > 0.05 else None

    # -- a similarity matrix with its diagonal left in ------------------------------------------
    def _self_match(self, input, target) -> None:
        """A ``self_match`` aside when a square (N, N) cross_entropy input (a batch's similarity
        matrix, SimCLR's 2N views against each other) has its maximum on the diagonal in nearly
        every row while no label points there: each sample's similarity with itself is in the
        softmax and outweighs its positive. CLIP's ``arange`` labels (the diagonal is the
        positive) and a masked diagonal say nothing. First calls only, one small read."""
        if not (isinstance(target, torch.Tensor) and target.dim() == 1 and not target.is_floating_point()
                and target.shape[0] == input.shape[0]):
            return
        if not self._reads_left("self_match", target):
            return
        with torch.no_grad():
            n = input.shape[0]
            rows = torch.arange(n, device=input.device)
            on_diagonal, labelled = torch.stack([
                (input.detach().argmax(1) == rows).float().mean(),
                (target == rows).float().mean()]).tolist()
        if on_diagonal < _SELF_SHARE or labelled > 0:
            return
        loc = self.rec.here()
        if loc in self._matched:
            return
        self._matched.add(loc)
        self.rec.emit_aside(ev.self_match(size=int(n), on_diagonal=round(on_diagonal, 4)), loc)

    # -- the targets of a similarity matrix that miss each row's positive -------------------
    def _pair_labels(self, fn: str, input, target) -> None:
        """A ``pair_labels`` aside when the loss's logits are a similarity of two batches'
        embeddings and its targets do not point at each row's positive (pairlabels.py)."""
        if self._pair_looks >= _PAIR_LOOKS:
            return
        self._pair_looks += 1
        fault = pair_fault(fn, input, target, lambda: self._reads_left("pair_labels", target))
        if fault is None:
            return
        loc = self.rec.here()
        if loc in self._paired:
            return
        self._paired.add(loc)
        how, label, share, halves = fault
        self.rec.emit_aside(ev.pair_labels(how=how, fn=fn, rows=int(input.shape[0]),
                                           columns=int(input.shape[1]), label=label, share=share,
                                           halves=halves), loc)

    # -- label smoothing on smoothed targets ----------------------------------------------
    def _class_weights(self, fn: str, input, target, weight, args, kwargs) -> None:
        """A ``class_weights`` aside when a loss's per-class weights grow with how often each
        class is a target (``weight=counts / counts.sum()``, ``pos_weight=pos / neg``): meant as
        inverse frequencies, they make the frequent classes weigh more. The targets of the first
        calls are counted per class (one bincount and read each); judged once enough are seen."""
        if not (isinstance(weight, torch.Tensor) and isinstance(target, torch.Tensor)
                and weight.dim() <= 1 and weight.numel() >= 1):
            return
        key = (fn, weight.data_ptr(), weight.numel())  # one weight tensor: one count
        if key not in self._class_counts and len(self._class_counts) >= _WEIGHT_KEYS:
            return
        if not self._reads_left(f"{fn}:weights:{key[1]}:{key[2]}", target):
            return
        with torch.no_grad():
            if fn == "binary_cross_entropy_with_logits":
                if target.shape != input.shape or not target.is_floating_point():
                    return
                flat = target.detach().reshape(-1, weight.numel() if weight.numel() > 1 else 1).float()
                if flat.shape[-1] != weight.numel():
                    return
                counts = torch.stack([(flat > 0.5).sum(0), (flat <= 0.5).sum(0)]).double()
            else:
                if target.is_floating_point() or target.dtype == torch.bool:
                    return  # class probabilities: no counts to read
                ignore = args[4] if len(args) > 4 else kwargs.get("ignore_index", -100)
                flat = target.detach().reshape(-1)
                flat = flat[(flat != ignore) & (flat >= 0) & (flat < weight.numel())]
                counts = torch.bincount(flat, minlength=weight.numel())[:weight.numel()].double()
            weights = weight.detach().double().reshape(-1)
            seen = self._class_counts.get(key)
            counts = counts.cpu() if seen is None else seen + counts.cpu()
            self._class_counts[key] = counts
        total = float(counts.sum())
        if total >= _ABSENT_TARGETS and fn != "binary_cross_entropy_with_logits" \
                and fn not in self._absent_told:
            absent = weighted_class_absent(counts, weights.cpu())
            if absent is not None:
                self._absent_told.add(fn)
                self.rec.emit_aside(ev.weighted_class_absent(fn=fn, **absent), self.rec.here())
        if total < _WEIGHT_TARGETS or fn in self._weights_told:
            return
        found = _inverted_weights(fn, counts, weights.cpu())
        if found is None:
            return
        self._weights_told.add(fn)
        self.rec.emit_aside(ev.class_weights(fn=fn, **found), self.rec.here())

    def _uniform_weight(self, fn: str, input, target, args, kwargs) -> None:
        """A ``uniform_weight`` aside when a loss's ``weight`` holds one value other than 1 at
        each of its first ``_UNIFORM_CALLS`` calls: a scalar ``weight=`` given to a binary
        cross-entropy whose positives are the minority (pos_weight meant), or class weights of
        ``cross_entropy``/``nll_loss`` that are all equal. Either only rescales the loss."""
        binary = fn.startswith("binary_")
        weight = args[2] if len(args) > 2 else kwargs.get("weight")
        if not isinstance(weight, torch.Tensor) or weight.numel() < 1 or weight.is_complex():
            if weight is None:
                return  # no weight at this call: nothing to read yet
            self._uniform_done.add(fn)
            return
        if not self._reads_left(f"{fn}:uniform", weight):
            self._uniform_done.add(fn)
            return
        with torch.no_grad():
            flat = weight.detach().reshape(-1).double()
            first = float(flat[0])
            if not bool((flat == flat[0]).all()) or first == 1.0 or not math.isfinite(first) or first <= 0:
                self._uniform_done.add(fn)
                return
            if binary:
                if not isinstance(target, torch.Tensor) or not target.is_floating_point() \
                        or target.numel() == 0:
                    self._uniform_done.add(fn)
                    return
                positives = float((target.detach() > 0.5).double().sum())
                classes = int(input.shape[-1]) if input.dim() > 1 else 1
            else:
                classes = int(input.shape[1]) if input.dim() > 1 else int(input.shape[0])
                if weight.dim() != 1 or weight.numel() != classes or classes < 2:
                    self._uniform_done.add(fn)
                    return
                positives = 0.0
        seen = self._uniform_seen.get(fn)
        if seen is not None and seen[1] != first:
            self._uniform_done.add(fn)
            return
        if seen is None:
            seen = self._uniform_seen[fn] = [0, first, 0.0, 0]
        seen[0] += 1
        seen[2] += positives
        seen[3] += int(target.numel()) if binary else 0
        if seen[0] < _UNIFORM_CALLS:
            return
        self._uniform_done.add(fn)
        share = seen[2] / seen[3] if binary and seen[3] else None
        pos_weight = args[6] if len(args) > 6 else kwargs.get("pos_weight")
        if binary and (pos_weight is not None or share is None or share >= 0.5 or first < 1.0):
            return  # a scale beside a pos_weight, or no minority to weigh up
        self.rec.emit_aside(ev.uniform_weight(fn=fn, value=first, numel=int(weight.numel()),
                                              classes=classes, positives=share,
                                              pos_weight=pos_weight is not None), self.rec.here())

    def _ordinal_levels(self, fn: str, target, weight=None) -> None:
        """An ``ordinal_shifted`` aside, once, when a binary cross-entropy's 0/1 targets are a
        cumulative encoding (each row's ones a prefix of its columns: ordinal levels
        ``y > k``) whose first column is 1 in every row of the first calls (``_ORDINAL_ROWS``
        or more) while a later column varies: the comparison off by one (``y >= k`` from
        ``k = 0``). Any call that breaks the pattern ends the check, and so does a weight that
        masks out entries of a row: every sample answers every threshold of an ordinal scale,
        so masked columns are a padded list of items (word2vec's contexts then negatives, the
        positives first), not levels."""
        if not (isinstance(target, torch.Tensor) and target.dim() == 2 and target.shape[1] >= 2
                and target.shape[0] >= 2 and target.is_floating_point()):
            self._ordinal_done = True
            return
        if isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.shape[-1] == target.shape[1]:
            with torch.no_grad():
                masked = bool((weight.detach() == 0).any())
            if masked:
                self._ordinal_done = True
                return
        if not self._reads_left("ordinal", target):
            self._ordinal_done = True
            return
        with torch.no_grad():
            t = target.detach()
            binary = bool(((t == 0) | (t == 1)).all())
            cumulative = binary and bool((t[:, :-1] >= t[:, 1:]).all())
            first_on = cumulative and bool((t[:, 0] == 1).all())
            varies = first_on and bool((t[:, 1:].amin(0) != t[:, 1:].amax(0)).any())
        if not first_on:
            self._ordinal_done = True
            return
        self._ordinal_rows += int(t.shape[0])
        self._ordinal_calls += 1
        self._ordinal_varies = self._ordinal_varies or varies
        if self._ordinal_rows >= _ORDINAL_ROWS and self._ordinal_calls >= 2 and self._ordinal_varies:
            self._ordinal_done = True
            self.rec.emit_aside(ev.ordinal_shifted(fn=fn, levels=int(t.shape[1]),
                                                   rows=self._ordinal_rows), self.rec.here())

    def _smoothing_high(self, input, args, kwargs) -> None:
        """A ``smoothing_high`` aside, once per call line, when cross_entropy smooths its
        targets by ``_SMOOTHING_HIGH`` or more (a confidence given where the amount to take off
        the right class is meant)."""
        smoothing = args[7] if len(args) > 7 else kwargs.get("label_smoothing")
        if not (isinstance(smoothing, (int, float)) and smoothing >= _SMOOTHING_HIGH
                and input.dim() >= 2):
            return
        loc = self.rec.here()
        if loc in self._smoothing_told:
            return
        self._smoothing_told.add(loc)
        self.rec.emit_aside(ev.smoothing_high(label_smoothing=float(smoothing),
                                              classes=int(input.shape[1])), loc)

    def _smoothed_twice(self, input, target, args, kwargs) -> None:
        """A ``label_smoothing`` aside when cross_entropy smooths (``label_smoothing`` > 0)
        class-probability targets that are smoothed already: in (nearly) every row all classes
        but one or two hold one same floor value above 0 (``one_hot * (1 - e) + e / C``, or a
        mixup of such rows), the same in every row (first calls only, one small reduction and
        read each)."""
        smoothing = args[7] if len(args) > 7 else kwargs.get("label_smoothing")
        if not (isinstance(smoothing, (int, float)) and 0 < smoothing < 1
                and isinstance(target, torch.Tensor) and target.is_floating_point()
                and target.shape == input.shape and input.dim() >= 2 and input.shape[1] >= 3):
            return
        if not self._reads_left("cross_entropy:smoothing", target):
            return
        classes = int(input.shape[1])
        with torch.no_grad():
            t = target.detach().float().movedim(1, -1).reshape(-1, classes)
            floor = t.amin(1)  # not min(1): its (values, indices) kernel is slow on CPU
            at_floor = ((t - floor[:, None]).abs() <= 1e-6 + 1e-4 * floor[:, None]).sum(1)
            smoothed = (floor > 0) & (at_floor >= classes - 2)
            share, low, high = torch.stack([smoothed.float().mean(), floor.min(), floor.max()]).tolist()
        if share < _SMOOTHED_SHARE or not (0 < low and high - low <= 1e-5 + 1e-3 * high):
            return
        loc = self.rec.here()
        if loc in self._smoothed:
            return
        self._smoothed.add(loc)
        self.rec.emit_aside(ev.label_smoothing(label_smoothing=float(smoothing), classes=classes,
                                               floor=round(float(high), 6),
                                               target_smoothing=round(float(high) * classes, 4)), loc)

    # -- padded token batches --------------------------------------------------------------
    def _padding(self, fn: str, input, target, args, kwargs) -> None:
        """A ``loss_padding`` aside when most integer targets are the padding index of an
        embedding the script ran, the loss predicts that embedding's tokens (as many classes as
        it has rows: a sequence classifier's labels 0/1 are no tokens, whatever its embedding
        pads with) and does not ignore the index (first calls only, one small reduction and
        read each)."""
        if not (isinstance(target, torch.Tensor) and not target.is_floating_point()
                and target.numel() > 1 and target.dtype != torch.bool and input.dim() >= 1):
            return
        ignore = args[4] if len(args) > 4 else kwargs.get("ignore_index", -100)
        reduction = args[6] if len(args) > 6 else kwargs.get("reduction", "mean")
        classes, count = input.shape[_class_dim(input)], target.numel()
        pads = sorted({p for p, vocab in self._pads if p != ignore and (
            vocab == classes or count in self._token_counts.get(p, ()))})[:4]
        if not pads or reduction == "none":  # "none": the script may mask the positions itself
            return
        if not self._reads_left(f"padding:{fn}", target):
            return
        with torch.no_grad():
            t = target.detach().reshape(-1)
            fractions = torch.stack([(t == p).float().mean() for p in pads]).tolist()
        fraction, pad = max(zip(fractions, pads))
        self._report_padding(fn, int(pad), float(fraction), ignore, reduction,
                             self._fills.get(int(pad), "padding_idx"))

    def _report_padding(self, fn: str, pad: int, fraction: float, ignore, reduction,
                        source: str) -> None:
        """The ``loss_padding`` aside of a call line (once per line) when the padding makes up
        at least ``_PADDING_SHARE`` of the targets."""
        if fraction < _PADDING_SHARE:
            return
        loc = self.rec.here()
        if loc in self._padded:
            return
        self._padded.add(loc)
        self.rec.emit_aside(ev.loss_padding(
            fn=fn, pad=pad, fraction=round(fraction, 4),
            ignore_index=int(ignore) if isinstance(ignore, int) else None,
            reduction=str(reduction), source=source), loc)

    def _padded_targets(self, fn: str, input, target, args, kwargs) -> None:
        """A ``loss_padding`` aside (source ``targets``) when the token targets themselves are
        padded with an id the loss does not ignore: read back into rows of a token batch the
        script embedded (``(batch, length)``, or ``length - 1`` for next-token targets), most
        rows end in runs of one id of different lengths, absent from the rest (``infer_fill``),
        and the loss predicts that embedding's tokens (as many classes as it has rows). What the
        embedding's own inputs cannot tell: a T5's labels padded with 0, which is also its
        decoder start token, so the decoder inputs start with it as well."""
        if not (isinstance(target, torch.Tensor) and not target.is_floating_point()
                and target.dtype != torch.bool and target.numel() >= 8 and input.dim() >= 2
                and target.device.type == "cpu"):
            return
        ignore = args[4] if len(args) > 4 else kwargs.get("ignore_index", -100)
        reduction = args[6] if len(args) > 6 else kwargs.get("reduction", "mean")
        if reduction == "none":  # the script may mask the positions itself
            return
        classes, count = int(input.shape[_class_dim(input)]), target.numel()
        shapes = ([tuple(target.shape)] if target.dim() == 2 else
                  [(rows, n) for vocab, (rows, length) in sorted(self._token_batches)
                   if vocab == classes for n in (length, length - 1) if rows * n == count]
                  if target.dim() == 1 else [])
        if target.dim() == 2 and not any(vocab == classes for vocab, _ in self._token_batches):
            shapes = []
        if not shapes or not self._reads_left(f"padded targets:{fn}", target):
            return
        for rows, length in shapes[:2]:
            if rows < 2 or length < 4:
                continue
            fill = infer_fill(target.detach().reshape(rows, length))
            if fill is None or fill == ignore:
                continue
            self._report_padding(fn, int(fill), float((target == fill).float().mean()), ignore,
                                 reduction, "targets")
            return

    def _order(self, fn: str, input, target, args, kwargs) -> None:
        """A ``loss_input`` "order" when flattened (N, C) scores and their flat token targets
        are laid out in two orders: the scores reshaped from (S0, S1, C) where the script
        embedded an (S0, S1) token batch, and the targets the tokens of that batch shifted by
        at most one position when read as (S1, S0), not when read as (S0, S1) — a seq-first
        model's (T, B, C) output flattened against batch-first (B, T) targets, or the other way
        round. Each score row then meets the label of another sample and position."""
        ids, self._last_ids = self._last_ids, None
        if not (isinstance(target, torch.Tensor) and target.dim() == 1 and input.dim() == 2
                and not target.is_floating_point() and target.device.type == "cpu"):
            return
        self._order_reads += 1  # the first calls with flat token targets only
        source = _reshaped_from(input)
        if source is None or len(source) != 3 or source[2] != input.shape[1]:
            return
        s0, s1 = source[0], source[1]
        if s0 == s1 or s0 * s1 != target.numel() or tuple(ids.shape) != (s0, s1) \
                or ids.numel() < 2 * _MIN_ORDER:
            return
        ignore = args[4] if len(args) > 4 else kwargs.get("ignore_index", -100)
        with torch.no_grad():
            flat = target.detach()
            if _tokens_of(ids, flat.view(s0, s1), ignore):
                return
            if not _tokens_of(ids, flat.view(s1, s0).t(), ignore):
                return
        loc = self.rec.here(3)
        if loc in self._done:
            return
        self._done.add(loc)
        self.rec.emit_aside(ev.loss_input(fn=fn, problem="order", classes=int(input.shape[1]),
                                          source=list(source)), loc)

    def _infer_fill(self, args, kwargs) -> None:
        """An embedding without ``padding_idx`` given a (batch, length) batch whose shorter rows
        are filled up with one id: most rows (the longest need none) end, or start, with it in
        runs of different lengths, and it is (nearly) absent from the rest of the batch. That id
        pads the batch (``pad_sequence``; ``tokenizer.pad_token = tokenizer.eos_token``), and a
        loss predicting these tokens should ignore it. CPU token batches only (a few small
        reads), the first few embedding calls."""
        tokens = args[0] if args else kwargs.get("input")
        weight = args[1] if len(args) > 1 else kwargs.get("weight")
        if not (isinstance(tokens, torch.Tensor) and isinstance(weight, torch.Tensor)
                and tokens.dim() == 2 and tokens.shape[0] >= 2 and tokens.shape[1] >= 4
                and not tokens.is_floating_point() and tokens.device.type == "cpu"
                and weight.dim() == 2):
            return
        self._fill_reads += 1
        fill = infer_fill(tokens)
        if fill is None:
            return
        vocab = int(weight.shape[0])
        self._pads.add((fill, vocab))
        self._fills[fill] = "fill"
        counts = self._token_counts.setdefault(fill, set())
        if len(counts) < 8:
            counts.add(tokens.numel())

    def _wrap_embedding(self, original):
        watcher = self

        def before(args, kwargs) -> None:
            pad = args[2] if len(args) > 2 else kwargs.get("padding_idx")
            if watcher._order_reads < _ORDER_READS:
                tokens = args[0] if args else kwargs.get("input")
                if (isinstance(tokens, torch.Tensor) and tokens.dim() == 2
                        and not tokens.is_floating_point() and tokens.device.type == "cpu"):
                    watcher._last_ids = tokens
            if len(watcher._token_batches) < 8:
                tokens = args[0] if args else kwargs.get("input")
                weight = args[1] if len(args) > 1 else kwargs.get("weight")
                if (isinstance(tokens, torch.Tensor) and tokens.dim() == 2
                        and not tokens.is_floating_point() and isinstance(weight, torch.Tensor)
                        and weight.dim() == 2):
                    watcher._token_batches.add((int(weight.shape[0]), tuple(tokens.shape)))
            if pad is None and watcher._fill_reads < _FILL_READS:
                try:
                    watcher._infer_fill(args, kwargs)
                except Exception as exc:
                    watcher.rec.internal_error("F.embedding", exc)
            if pad is not None and watcher.real_index is not None:
                try:
                    watcher.real_index.embedded(args[0] if args else kwargs.get("input"),
                                                args[1] if len(args) > 1 else kwargs.get("weight"), pad)
                except Exception as exc:
                    watcher.rec.internal_error("F.embedding padding_idx", exc)
            if pad is not None:
                try:
                    weight = args[1] if len(args) > 1 else kwargs.get("weight")
                    if isinstance(pad, int) and isinstance(weight, torch.Tensor) and weight.dim() == 2:
                        vocab = int(weight.shape[0])
                        pad = pad + vocab if pad < 0 else pad
                        watcher._pads.add((pad, vocab))
                        tokens = args[0] if args else kwargs.get("input")
                        counts = watcher._token_counts.setdefault(pad, set())
                        if isinstance(tokens, torch.Tensor) and len(counts) < 8:
                            counts.add(tokens.numel())
                except Exception as exc:
                    watcher.rec.internal_error("F.embedding", exc)

        embedding = watched(original, before)
        embedding.__prepare_scriptable__ = lambda: original
        return embedding

    def install(self, patcher) -> None:
        patcher.patch(F, "embedding", self._wrap_embedding(F.embedding))
        for name in NAMES:
            original = getattr(F, name, None)
            if original is not None:
                patcher.patch(F, name, self._wrap(original, name))
