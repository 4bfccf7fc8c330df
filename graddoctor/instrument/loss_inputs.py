"""Classification losses fed the wrong kind of score: probabilities where logits belong (a
softmax or sigmoid applied twice), or something else where log-probabilities belong.

``cross_entropy`` and ``binary_cross_entropy_with_logits`` apply log_softmax / sigmoid
themselves; ``nll_loss`` and ``kl_div`` expect log-probabilities as input. Handing them the
output of ``softmax``/``sigmoid`` (an ``nn.Softmax`` closing the model is the classic) trains,
but towards a bounded target with shrinking gradients; ``nll_loss`` on raw logits minimises
``-logit[y]``, which has no lower bound.

The four functions in ``torch.nn.functional`` are patched (their ``nn`` modules call them). The
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
from .inlinable import watched
from .recorder import Recorder

NAMES = ("cross_entropy", "nll_loss", "binary_cross_entropy_with_logits", "kl_div")

# autograd nodes that keep the values they are given (reshape, select, reorder, cast, clamp):
# the scores behind them are what their input was
_PASS_THROUGH = ("View", "Reshape", "UnsafeView", "Squeeze", "Unsqueeze", "Permute", "Transpose",
                 "TBackward", "Clone", "ToCopy", "Slice", "Select", "Index", "Expand", "Clamp",
                 "Alias", "Narrow", "Flatten", "Contiguous", "Cat", "Stack", "Split", "Unbind",
                 "MaskedSelect", "Gather")
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
    if name.startswith(_PASS_THROUGH):
        return "pass"
    return "other"


def producer(tensor) -> str | None:
    """What made ``tensor``'s values, seen through value-keeping operations: "softmax",
    "sigmoid", "log" (log_softmax, log, logsigmoid), or None (anything else, or no graph)."""
    return _made_by(tensor.grad_fn, _DEPTH)


def _made_by(node, depth: int) -> str | None:
    while node is not None and depth > 0:
        kind = _kind(node)
        if kind != "pass":
            return None if kind == "other" else kind
        parents = [n for n, _ in node.next_functions if n is not None]
        if len(parents) != 1:  # a cat or stack: one answer only when all its parts agree
            kinds = {_made_by(n, depth - 1) for n in parents}
            return kinds.pop() if len(kinds) == 1 else None
        node, depth = parents[0], depth - 1
    return None


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


def _class_dim(tensor) -> int:
    return 1 if tensor.dim() >= 2 else 0


_VALUE_CHECKS = 8  # calls per function judged by their values (the first ones: every loss line of a loop)


class LossInputWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._done: set = set()  # call lines recorded
        self._value_checks: dict[str, int] = {}  # fn -> calls judged by their values so far

    def _wrap(self, original, fn: str):
        watcher, rec = self, self.rec

        def before(args, kwargs) -> None:
            input = args[0] if args else kwargs.get("input")
            if not (isinstance(input, torch.Tensor) and input.requires_grad and torch.is_grad_enabled()):
                return  # no gradient flows: a metric, or a mistake torch reports itself
            try:
                watcher._check(fn, input)
            except Exception as exc:
                rec.internal_error(f"F.{fn}", exc)

        loss = watched(original, before)  # torch.compile inlines it (inlinable.py)
        loss.__prepare_scriptable__ = lambda: original  # torch.jit.script compiles torch's own
        return loss

    def _check(self, fn: str, input) -> None:
        made = producer(input)
        if made in ("softmax", "sigmoid"):
            problem = made  # probabilities: never what these four losses take
        elif made is None and fn in ("cross_entropy", "nll_loss"):
            problem = self._by_values(fn, input)
        else:
            return
        if problem is None:
            return
        loc = self.rec.here()
        if loc in self._done:
            return
        self._done.add(loc)
        classes = input.shape[_class_dim(input)] if input.dim() else 1
        self.rec.emit_aside(ev.loss_input(fn=fn, problem=problem, classes=int(classes)), loc)

    def _by_values(self, fn: str, input) -> str | None:
        """For scores whose graph does not tell, the first calls only: "probabilities"
        (cross_entropy given rows in [0, 1] that sum to 1), "logits" (nll_loss given rows that
        are not log-normalised, with no log op behind them), else None."""
        done = self._value_checks.get(fn, 0)
        if done >= _VALUE_CHECKS or (self.rec.steps and input.device.type != "cpu"):
            return None  # on a device, reads only in the first update: no sync per step later
        self._value_checks[fn] = done + 1
        if input.dim() == 0 or input.numel() == 0 or input.shape[_class_dim(input)] < 2:
            return None
        if fn == "nll_loss" and has_log_nearby(input):
            return None
        dim = _class_dim(input)
        with torch.no_grad():
            values = input.detach().float()
            if fn == "cross_entropy":
                low, high, off = torch.stack(
                    [values.min(), values.max(), (values.sum(dim) - 1).abs().max()]).tolist()
                return "probabilities" if low >= 0 and high <= 1 and off < 1e-3 else None
            off = torch.logsumexp(values, dim).abs().max().item()
            return "logits" if math.isfinite(off) and off > 0.05 else None

    def install(self, patcher) -> None:
        for name in NAMES:
            original = getattr(F, name, None)
            if original is not None:
                patcher.patch(F, name, self._wrap(original, name))
