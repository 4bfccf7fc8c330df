"""Regression and distribution-matching losses whose *target* carries gradient into the
parameters that make their *input*: a stop-gradient left out.

``F.smooth_l1_loss(q(s).gather(1, a), r + gamma * q(s2).max(1)[0])`` (DQN's bootstrapped target
without ``torch.no_grad()``), ``F.kl_div(log_softmax(model(strong)), softmax(model(weak)))``
(a pseudo-label from the model itself, not detached), ``mse(pred, encoder(next_obs))`` (a latent
prediction target made by the encoder being trained): the loss's gradient flows into the target
as well, so the optimizer moves the target towards the prediction as much as the prediction
towards the target. The target chases the model (the Q-values drift, the pseudo-labels
collapse to whatever is easiest to predict).

The losses in ``torch.nn.functional`` that take a target of the input's kind (``mse_loss``,
``l1_loss``, ``smooth_l1_loss``, ``huber_loss``, ``kl_div``, ``binary_cross_entropy``,
``binary_cross_entropy_with_logits``, ``cross_entropy`` with probability targets) are patched
(their ``nn`` modules call them). Cost per call: a counter and two attribute reads (does the
target need a gradient at all?); only a target that does, under grad mode, in the losses of the
first ``_WINDOWS`` backwards that had such calls, has its graph and the input's walked (the leaves each reaches; a node budget). A call is
recorded (a ``target_grad`` aside event, once per call line) when

* target and input reach some tracked tensor in common (the same parameters), and
* the target is not made from the input or the input from the target (a Jensen-Shannon term
  compares each distribution with a mixture made of them: AugMix), and
* the pair is not a symmetric consistency: for ``mse``-like losses, both sides made by the
  same kind of op of the same layer, with one shape (a Π-model's ``mse(softmax(f(x1)),
  softmax(f(x2)))``; a latent prediction ``mse(dyn(enc(x)), enc(x2))`` is made by two layers); for the
  others, the same pair of branches seen the other way round in the same loss (R-Drop's
  ``kl(p1 || p2) + kl(p2 || p1)``). Those train both sides on purpose.

Candidates are held until the next backward (``describe_loss``), which decides the
symmetric pairs and emits the rest with their call line.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import events as ev
from .graphpaths import reached
from .inlinable import watched
from .recorder import Recorder

NAMES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "binary_cross_entropy",
         "binary_cross_entropy_with_logits", "cross_entropy")
# losses whose value is symmetric in (input, target): a consistency between two like outputs
_SYMMETRIC = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
_WINDOWS = 3  # backwards whose losses are judged (the calls since the previous backward)
_CALLS = 32  # calls judged per backward at most: past it the window's candidates are dropped
# (a symmetric pair may be cut in two)
_NODES = 20000  # nodes walked per side
# nodes that keep the values they are given: a producer is read past them
_PASS = ("View", "Reshape", "UnsafeView", "Squeeze", "Unsqueeze", "Permute", "Transpose",
         "TBackward", "Clone", "ToCopy", "Expand", "Alias", "Contiguous")


def _producer(node):
    """The first node below ``node`` that is no reshape or copy (None: no graph)."""
    for _ in range(16):
        if node is None or not type(node).__name__.startswith(_PASS):
            return node
        parents = [child for child, _ in node.next_functions if child is not None]
        if len(parents) != 1:
            return node
        node = parents[0]
    return node


def _base(node):
    """The node a (log-)softmax or sigmoid normalised (the logits), else the producer itself:
    what identifies a branch of the model for the reversed-pair test."""
    node = _producer(node)
    if node is not None and type(node).__name__.startswith(
            ("SoftmaxBackward", "LogSoftmaxBackward", "SigmoidBackward", "LogSigmoidBackward")):
        parents = [child for child, _ in node.next_functions if child is not None]
        if len(parents) == 1:
            return _producer(parents[0])
    return node


def _own_leaves(node) -> frozenset:
    """The leaf tensors an op reads directly (a linear layer's weight and bias, past the
    weight's transpose): which layer made a value."""
    found = set()
    level = [node]
    for _ in range(2):
        following = []
        for item in level:
            for child, _ in getattr(item, "next_functions", ()):
                if child is None:
                    continue
                variable = getattr(child, "variable", None)
                if variable is not None:
                    found.add(id(variable))
                else:
                    following.append(child)
        level = following
    return frozenset(found)


def _same_layer(base_in, base_target, nodes_in: set, nodes_target: set) -> bool:
    """Both sides made by one layer in two calls (a Π-model). When neither side's op reads a
    leaf directly (an index of a view of the layer's output: ``out[pos]``), the layer is not
    known from its weights: the two sides must then come from two separate forwards, which share
    no computed node (a target built from the very activations it is compared with,
    ``encode(gt, anchors + reg_out)[pos]`` against ``reg_out[pos]``, shares them)."""
    own_in, own_target = _own_leaves(base_in), _own_leaves(base_target)
    if own_in != own_target:
        return False
    if own_in:
        return True
    return not any(getattr(node, "variable", None) is None for node in nodes_in & nodes_target)


class TargetGradWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._windows = 0  # backwards whose losses were judged
        self._calls = 0  # calls judged since the last backward
        self._done: set = set()  # call lines recorded
        self._pending: list = []  # (fn, loc, input base, target base, event) until the next backward

    def _wrap(self, original, fn: str):
        watcher, rec = self, self.rec

        def before(args, kwargs) -> None:
            if watcher._windows >= _WINDOWS:
                return
            target = args[1] if len(args) > 1 else kwargs.get("target")
            if not (isinstance(target, torch.Tensor) and target.requires_grad
                    and target.grad_fn is not None and torch.is_grad_enabled()):
                return  # data, a detached target, or no gradient at all: the usual call
            input = args[0] if args else kwargs.get("input")
            if not (isinstance(input, torch.Tensor) and input.grad_fn is not None):
                return  # the swapped arguments are loss-input-mismatch's
            try:
                watcher._calls += 1
                if watcher._calls <= _CALLS:
                    watcher._check(fn, input, target)
            except Exception as exc:
                rec.internal_error(f"F.{fn}", exc)

        loss = watched(original, before)  # torch.compile inlines it (inlinable.py)
        loss.__prepare_scriptable__ = lambda: original  # torch.jit.script compiles torch's own
        return loss

    def _check(self, fn: str, input, target) -> None:
        if fn == "cross_entropy" and not target.is_floating_point():
            return
        walked_in = reached(input.grad_fn, _NODES)
        walked_target = reached(target.grad_fn, _NODES)
        if walked_in is None or walked_target is None:
            return
        nodes_in, leaves_in = walked_in
        nodes_target, leaves_target = walked_target
        if target.grad_fn in nodes_in or input.grad_fn in nodes_target:
            return  # one side is made from the other (a mixture against its parts: a JSD)
        common = leaves_in & leaves_target
        if not common:
            return  # a separate network makes the target (a target network, a peer model)
        tensors = self.rec.tensors
        pids = sorted(pid for i in common
                      if (pid := tensors.number.get(i)) is not None and id(tensors.refs[pid]()) == i)
        if not pids:
            return
        made_in, made_target = _producer(input.grad_fn), _producer(target.grad_fn)
        base_in, base_target = _base(input.grad_fn), _base(target.grad_fn)
        if (fn in _SYMMETRIC and type(made_in) is type(made_target) and input.shape == target.shape
                and _same_layer(base_in, base_target, nodes_in, nodes_target)):
            return  # two outputs of one layer made to agree (a Π-model): both sides train
        loc = self.rec.here()
        if loc in self._done:
            return
        made = ev.target_grad(fn=fn, params=pids[:64], input_op=type(made_in).__name__,
                              target_op=type(made_target).__name__)
        self._pending.append((loc, base_in, base_target, made))

    def describe_loss(self, tensors) -> dict:
        """At each backward: the candidates of the losses computed since the last one, less the
        pairs seen both ways round, become events."""
        if self._windows >= _WINDOWS:
            return {}
        calls, self._calls = self._calls, 0
        if calls:
            self._windows += 1
        pending, self._pending = self._pending, []
        if not pending or calls > _CALLS:
            return {}
        try:
            pairs = {(a, b) for _loc, a, b, _made in pending}
            for loc, a, b, made in pending:
                if (b, a) in pairs or loc in self._done:
                    continue  # R-Drop's kl(p1 || p2) + kl(p2 || p1): symmetric on purpose
                self._done.add(loc)
                self.rec.emit_aside(made, loc)
        except Exception as exc:
            self.rec.internal_error("target_grad", exc)
        return {}

    def install(self, patcher) -> None:
        for name in NAMES:
            original = getattr(F, name, None)
            if original is not None:
                patcher.patch(F, name, self._wrap(original, name))
