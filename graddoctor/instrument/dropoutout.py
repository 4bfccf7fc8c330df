"""A loss that reads a dropout layer's output directly (dropout-on-output).

Dropout belongs before a layer that learns from what survives it. Placed after the model's
last layer (``nn.Sequential(..., nn.Linear(h, C), nn.Dropout(p))``, ``return
self.drop(self.out(h))``), it zeroes a share p of the logits or predictions the loss reads at
every training step and scales the rest by 1 / (1 - p): a logit set to 0, a regression output
set to 0, is a target the model is punished for at random. It trains, towards a worse model,
and the evaluation (dropout off) sees outputs on another scale.

Read from the autograd graph, at the first ``WINDOW`` backwards only:

* A global forward hook (removed with the window) notes the output of every dropout module
  (``nn.Dropout`` and its 1d/2d/3d and alpha variants, torch's ``_DropoutNd``) run in training
  mode with p > 0 under grad mode, on the script's thread: its ``grad_fn`` (kept until the next
  backward, at most ``_NOTED`` per turn), its class, p, the user's line that ran it, and
  whether the user's code called the module itself or torch's ``nn.Sequential`` did (the frame
  that called ``Module._call_impl``). A dropout a library's model calls (T5's after its final
  norm) is not noted: its place is the library's design, not the script's.
* Before each backward (``DESCRIBE_LOSS``), the loss's graph is walked from its root through the
  operations that combine loss terms (sums, means, products, divisions, negations) to the loss
  functions' nodes (``cross_entropy``/``nll_loss``, ``mse_loss``, ``smooth_l1_loss``,
  ``huber_loss``, ``binary_cross_entropy(_with_logits)``, and the ones torch builds of plain
  ops, ``l1_loss``, ``kl_div``, ``poisson_nll_loss``..., through ``lossnodes.loss_of``); from
  each, the node that made its prediction is found past the operations that only move values
  (views, reshapes, slices, casts) and, for ``cross_entropy`` and ``kl_div``, a ``log_softmax``. When that node is a noted dropout's
  output: a ``dropout_on_output`` aside at the dropout's line, once per run.

Silent: dropout before the last layer (the loss reads that layer's output); dropout inside an
encoder whose output is normalised, pooled or projected before the loss (SimCSE's dropout
augmentation, R-Drop); a dropout's output used as a target (no gradient: not in the loss's
graph as a prediction); ``F.dropout`` called by hand (no module: not noted); a dropout placed
by a library's model (transformers, timm); evaluation mode.
"""

from __future__ import annotations

import os
import sys
from threading import get_ident

import torch
from torch import nn

from .. import events as ev
from .dependency import close_before_compile, register_module_hooks
from .losswindow import LossWindow
from .recorder import Recorder
from .lossnodes import COMPOSITE_FNS, loss_of

WINDOW = 4  # backwards judged, from the first one
_NOTED = 64  # dropout outputs noted per turn at most
_COMBINE_NODES = 64  # loss-combining nodes walked from the root at most
_MOVE_DEPTH = 12  # value-moving nodes walked back from a loss's prediction at most
_STACK = 12  # frames looked through for the dropout's own call
_CONTAINERS = (os.path.join("torch", "nn", "modules", "container.py"),)

_LOSSES = {"NllLossBackward": "cross_entropy", "MseLossBackward": "mse_loss",
           "SmoothL1LossBackward": "smooth_l1_loss", "HuberLossBackward": "huber_loss",
           "BinaryCrossEntropyWithLogitsBackward": "binary_cross_entropy_with_logits",
           "BinaryCrossEntropyBackward": "binary_cross_entropy"}
# nodes through which loss terms are summed, averaged and weighted
_COMBINE = ("AddBackward", "SubBackward", "MulBackward", "DivBackward", "MeanBackward",
            "SumBackward", "NegBackward", "StackBackward", "CatBackward", "ViewBackward",
            "SqueezeBackward", "UnsqueezeBackward", "IndexBackward", "SelectBackward")
# nodes that keep the values they are given: the prediction behind them is what their input was
_MOVE = ("ViewBackward", "ReshapeAliasBackward", "UnsafeViewBackward", "SqueezeBackward",
         "UnsqueezeBackward", "PermuteBackward", "TransposeBackward", "TBackward", "CloneBackward",
         "ToCopyBackward", "SliceBackward", "SelectBackward", "ExpandBackward", "AliasBackward",
         "IndexBackward", "FlattenBackward")


def backward_roots(tensors) -> list:
    """The ``grad_fn`` of each tensor a backward starts from (one tensor, or a sequence)."""
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    if not isinstance(tensors, (list, tuple)):
        return []
    return [t.grad_fn for t in tensors if isinstance(t, torch.Tensor) and t.grad_fn is not None][:4]


def _parents(node) -> list:
    return [n for n, _ in node.next_functions if n is not None]


def _base(name: str) -> str:
    return name.rstrip("0123456789")


def loss_predictions(root, limit: int = _COMBINE_NODES) -> list[tuple[str, object]]:
    """``(loss function, node that made its prediction)`` for each loss node reached from
    ``root`` (a loss tensor's ``grad_fn``) through the operations that combine loss terms; the
    prediction's node seen past ``log_softmax`` (for ``cross_entropy``) and value-moving nodes."""
    found, queue, seen = [], [root], set()
    while queue and len(seen) < limit:
        node = queue.pop(0)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        name = _base(type(node).__name__)
        fn = _LOSSES.get(name)
        composite = loss_of(node) if fn is None else None  # l1_loss, kl_div...: built of plain ops
        if composite is not None and composite.fn in COMPOSITE_FNS:
            fn = composite.fn
        if fn is not None:
            if composite is not None:
                prediction = composite.input_node
            else:
                parents = [n for n, _ in node.next_functions]
                prediction = parents[0] if parents else None
            if prediction is not None and fn in ("cross_entropy", "kl_div") \
                    and _base(type(prediction).__name__) == "LogSoftmaxBackward":
                prediction = next(iter(_parents(prediction)), None)
            for _ in range(_MOVE_DEPTH):
                if prediction is None or not _base(type(prediction).__name__).startswith(_MOVE):
                    break
                parents = _parents(prediction)
                prediction = parents[0] if len(parents) == 1 else None
            if prediction is not None:
                found.append((fn, prediction))
            continue
        if name.startswith(_COMBINE):
            queue.extend(_parents(node))
    return found


def module_caller(rec: Recorder, module) -> tuple[str | None, object]:
    """``(who, parent)`` for a module running now: who called it — "user" (the script's own
    code, ``self.drop(h)``), "container" (torch's ``nn.Sequential``/``ModuleList`` code, in a
    model the script put together), or None (a library's model, or the stack does not tell) —
    and the ``self`` of the calling frame (the module whose forward or Sequential runs it)."""
    frame = sys._getframe(1)
    for _ in range(_STACK):
        if frame is None:
            return None, None
        if frame.f_code.co_name == "_call_impl" and frame.f_locals.get("self") is module:
            caller = frame.f_back
            while caller is not None and caller.f_code.co_name == "_wrapped_call_impl":
                caller = caller.f_back
            if caller is None:
                return None, None
            name, parent = caller.f_code.co_filename, caller.f_locals.get("self")
            if rec.finder.is_user_file(name):
                return "user", parent
            return ("container" if name.endswith(_CONTAINERS) else None), parent
        frame = frame.f_back
    return None, None


class DropoutOutputWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.active = False
        self._handles: list = []
        self._patcher = None
        self._compiled = False
        # a window closed early by a finding is not reopened: the later phase's first dropout
        # outputs are read only when this one's window ran out
        self.loss_window = LossWindow(rec, WINDOW, on_reopen=self._reopen)
        # this turn's dropout outputs: id of the grad_fn -> (grad_fn, class, p, location)
        self._outputs: dict[int, tuple] = {}

    def _stop(self) -> None:
        self.active = False
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._outputs = {}

    def _post(self, module, args, output):
        if not self.active or not isinstance(module, nn.modules.dropout._DropoutNd):
            return None
        if not module.training or not module.p or len(self._outputs) >= _NOTED \
                or not torch.is_grad_enabled() or get_ident() != self.rec.script_thread:
            return None
        node = getattr(output, "grad_fn", None) if isinstance(output, torch.Tensor) else None
        if node is None:
            return None
        caller = self._caller(module)
        if caller is None:
            return None  # a library's model placed it (T5's dropout after its last norm): not the script's
        self._outputs[id(node)] = (node, type(module).__name__, float(module.p), self.rec.here(),
                                   caller == "user")
        return None

    def _caller(self, module) -> str | None:
        return module_caller(self.rec, module)[0]

    def describe_loss(self, tensors) -> dict:
        if not self.active:
            return {}
        try:
            self.loss_window.take()
            outputs, self._outputs = self._outputs, {}
            if outputs:
                for root in backward_roots(tensors):
                    for fn, node in loss_predictions(root):
                        noted = outputs.get(id(node))
                        if noted is not None and noted[0] is node:
                            _, cls, p, loc, direct = noted
                            self._stop()
                            self.rec.emit_aside(ev.dropout_on_output(module=cls, p=p, fn=fn,
                                                                     direct=direct), loc)
                            return {}
            if self.loss_window.closed:
                self._stop()
        except Exception as exc:
            self._stop()
            self._compiled = True  # never reopened after an internal error
            self.rec.internal_error("dropout on output", exc)
        return {}

    def _before_compile(self) -> None:
        self._compiled = True
        if self.active:
            self._stop()

    def install(self, patcher) -> None:
        close_before_compile(patcher, self._before_compile)
        self._patcher = patcher
        self._open()

    def _open(self) -> None:
        self._handles = register_module_hooks(self._patcher, None, self._post, with_kwargs=False,
                                              always_call=False,
                                              classes=nn.modules.dropout._DropoutNd)
        self.active = True

    def _reopen(self) -> None:
        """A later phase (an optimizer given parameters after the window closed): read its first
        backwards too, unless torch.compile ran (it warns about global module hooks)."""
        if self.active or self._compiled or self._patcher is None:
            return
        try:
            self._open()
        except Exception as exc:
            self._stop()
            self.rec.internal_error("dropout on output (reopen)", exc)
