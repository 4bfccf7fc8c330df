"""The same loss term twice in one objective: a loss function called again on the same
prediction and the same target, with the same options, and both terms backpropagated.

``lam * criterion(pred, y_a) + (1 - lam) * criterion(pred, y_a)`` (mixup's second term meant on
``y_b``), ``(F.cross_entropy(logits, labels) + F.cross_entropy(logits, labels)) / 2`` (the
symmetric term meant on ``logits.t()``), an auxiliary loss computed on the main head's output:
the sum is one term with its weight changed, the operand the second term was written for never
reaches the loss, and nothing fails.

What is judged: each call of a wrapped loss (``LossCalls``: cross_entropy, nll_loss, the binary
cross-entropies) with a gradient, between two backwards, keyed by the prediction tensor itself
(and its version), the target's storage, shape, strides and version, and every other argument
(tensors by storage, the rest by value). A second call with the key of an earlier one is held
with its line. Per-element losses (``reduction="none"``) are not judged: their terms are often
weighted apart afterwards.

How it is confirmed: at the backward (``DESCRIBE_LOSS``), the loss's graph is walked once (at
most ``_NODES`` nodes) and the nodes that start that loss function on the held prediction
(cross_entropy's log_softmax, nll_loss's and the binary cross-entropies' own nodes) are
counted. Only when there are as many as the calls of that function on that prediction (with
any options) did every call reach the loss, the repeat included; fewer, and one of them was
only logged (``.item()``) without telling which: silent. Only the first ``_WINDOWS`` backwards are looked at; then the watcher
closes and costs nothing.
"""

from __future__ import annotations

import inspect
import weakref

import torch

from .. import events as ev
from .graphpaths import post_order, reached
from .recorder import Recorder

_WINDOWS = 3  # backwards whose loss calls are compared
_CALLS = 64  # loss calls keyed per window at most
_NODES = 20000  # graph nodes walked per backward
_LEAVES = 20000  # nodes walked below the prediction to name the parameters that made it
# the node each loss function puts on its prediction
_STARTS = {"cross_entropy": ("LogSoftmaxBackward",),
           "nll_loss": ("NllLossBackward", "NllLoss2DBackward"),
           "binary_cross_entropy_with_logits": ("BinaryCrossEntropyWithLogitsBackward",),
           "binary_cross_entropy": ("BinaryCrossEntropyBackward",)}


def _value_key(value):
    """What identifies one argument of a loss call: a tensor by its storage, offset, shape,
    strides, dtype and version (the same labels, not equal ones), anything else by value."""
    if isinstance(value, torch.Tensor):
        try:
            return ("tensor", value.untyped_storage().data_ptr(), value.storage_offset(),
                    tuple(value.shape), value.stride(), str(value.dtype), value._version)
        except Exception:  # a tensor without storage (a subclass, a meta tensor)
            return ("object", id(value))
    if isinstance(value, (int, float, str, bool, type(None))):
        return ("value", value)
    return ("object", id(value))


_SIGNATURES: dict = {}


def _options(fn: str, args, kwargs) -> dict | None:
    """The options of a loss call past its input and target, by name, without those left at
    their defaults: ``nn.CrossEntropyLoss`` passes every option, ``F.cross_entropy(out, y)``
    none, and the two calls are the same term."""
    signature = _SIGNATURES.get(fn)
    if signature is None:
        signature = _SIGNATURES[fn] = inspect.signature(getattr(torch.nn.functional, fn))
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    out = {}
    for name, value in list(bound.arguments.items())[2:]:
        default = signature.parameters[name].default
        if value is None and default is None:
            continue
        if isinstance(value, (int, float, str, bool)) and not isinstance(default, torch.Tensor) \
                and value == default:
            continue
        out[name] = value
    return out


def call_key(fn: str, input, target, args, kwargs) -> tuple | None:
    """The key of a loss call: equal for two calls on the same prediction and target with the
    same options; None for a call not judged (a function without a start node, per-element
    losses, arguments not understood)."""
    if fn not in _STARTS or not isinstance(input, torch.Tensor) or input.grad_fn is None:
        return None
    options = _options(fn, args, kwargs)
    if options is None or options.get("reduction") == "none" or options.get("reduce") is False:
        return None
    return (fn, id(input), input._version, _value_key(target),
            tuple(sorted((k, _value_key(v)) for k, v in options.items())))


def starts_on(nodes, prediction_node, fn: str) -> int:
    """How many of ``nodes`` start ``fn`` on the output of ``prediction_node``."""
    names = _STARTS.get(fn, ())
    count = 0
    for node in nodes:
        if type(node).__name__.startswith(names) and node.next_functions \
                and node.next_functions[0][0] is prediction_node:
            count += 1
    return count


class RepeatedLossWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._windows = 0
        self._calls = 0
        self._first: dict = {}  # key -> the line of its first call
        self._held: dict = {}  # key -> (weak prediction, line of the repeat, line of the first, fn)
        self._made: dict = {}  # (fn, prediction, its version) -> calls of fn on it, any options
        self._told: set = set()

    def install(self, patcher) -> None:  # told by LossCalls and DESCRIBE_LOSS (instrument/__init__.py)
        pass

    @property
    def open(self) -> bool:
        return self._windows < _WINDOWS

    def loss_call(self, fn: str, input, target, args=(), kwargs=None) -> None:
        """A wrapped loss function called with a gradient (``LossCalls``)."""
        if self._calls >= _CALLS:
            return
        self._calls += 1
        try:
            if fn not in _STARTS or not isinstance(input, torch.Tensor) or input.grad_fn is None:
                return
            made = (fn, id(input), input._version)
            self._made[made] = self._made.get(made, 0) + 1
            key = call_key(fn, input, target, args, kwargs or {})
            if key is None or key in self._held:
                return
            loc = self.rec.here()
            if loc is None:
                return
            first = self._first.get(key)
            if first is None:
                self._first[key] = loc
                return
            self._held[key] = (weakref.ref(input), loc, first, fn)
        except Exception as exc:
            self.rec.internal_error("repeated loss", exc)

    def describe_loss(self, tensors) -> dict:
        if self._windows >= _WINDOWS:
            return {}
        self._windows += 1
        try:
            if self._held:
                self._look(tensors)
        except Exception as exc:
            self.rec.internal_error("repeated loss", exc)
        self._first, self._held, self._made, self._calls = {}, {}, {}, 0
        return {}

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        roots = [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        nodes = []
        for root in roots:
            found = post_order(root, _NODES)
            if found is not None:
                nodes.extend(found)
        for key, (prediction_ref, loc, first, fn) in self._held.items():
            prediction = prediction_ref()
            if prediction is None or prediction.grad_fn is None or loc in self._told:
                continue
            if starts_on(nodes, prediction.grad_fn, fn) < self._made.get(key[:3], 0):
                continue  # some call on it does not reach the loss: which one is not told
            self._told.add(loc)
            walked = reached(prediction.grad_fn, _LEAVES, truncate=True)
            tracked = self.rec.tensors
            pids = sorted(pid for i in walked[1] if (pid := tracked.number.get(i)) is not None
                          and id(tracked.refs[pid]()) == i)
            self.rec.emit_aside(ev.loss_repeated(fn=fn, first_line=first.line, params=pids[:64]),
                                loc)
