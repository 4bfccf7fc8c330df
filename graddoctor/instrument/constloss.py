"""Loss functions called, with gradients on, on values that carry no graph: a term that may be
added to the loss and then changes its value but not one gradient.

``F.smooth_l1_loss(decode(deltas.detach(), anchors)[pos], gt[pos])`` (a ``.detach()`` left
from a logging helper), a loss on a head run under ``torch.no_grad()``, on predictions sent
through NumPy (``torch.from_numpy(pred.detach().numpy())``), on ``prob.data``: the loss is a
plain number. Added to the loss that is backpropagated, it changes the printed value and no
gradient, so the branch it was meant to train never learns from it; torch says nothing, since
the other terms keep the sum differentiable.

The loss watchers' wrappers (``losses.py``: ``mse_loss``, ``l1_loss``, ``smooth_l1_loss``,
``huber_loss``; ``loss_inputs.py``: ``cross_entropy``, ``nll_loss``,
``binary_cross_entropy_with_logits``, ``kl_div``, ``ctc_loss``; their ``nn`` modules call them)
tell ``loss_call`` of each call whose input needs no gradient while grad mode is on. Cost per
such call: a few attribute reads (does any tensor argument need a gradient?); nothing for a call
whose input has a graph (the usual one). A call whose tensor arguments all lack gradients is
held, with its line, until the next backward (``describe_loss``), at the first ``_WINDOWS``
backwards that follow such calls, and again at those of a later training phase (``LossWindow``:
an optimizer given parameters after the window closed; the wrappers stay, nothing is put back);
there the loss's linear top (sums, differences, means,
views, products and quotients by a constant: ``lossterms.signed_walk``) is walked and its
operands with no graph counted (a ``None`` among an addition's inputs: the constant term, or
the wrapped 0 that Python's ``sum()`` starts from, or a number added). Each held call becomes a
``loss_no_graph`` aside event at its line with that count and the backward's line; the rule
asks the source whether the call's result flows into that backward's loss, and where its input
was cut from the graph. A loss computed for a log only (``F.l1_loss(pred.detach(), y)`` printed)
is recorded too and left alone by the rule: it reaches no backward.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .lossterms import loss_root, signed_walk
from .losswindow import LossWindow
from .recorder import Recorder

_WINDOWS = 4  # backwards (after such calls) whose held calls are recorded
_CALLS = 8  # calls held per window at most
_NODES = 256  # nodes of the loss's linear top walked


def _needs_grad(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.requires_grad
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, torch.Tensor) and v.requires_grad for v in value)
    return False


def constant_operands(root) -> int:
    """How many operands of the sums in the loss's linear top have no graph."""
    count = 0

    def visit(node, sign, name, children) -> bool:
        nonlocal count
        if name in ("AddBackward0", "SubBackward0"):
            count += sum(1 for child, _ in node.next_functions if child is None)
        return False

    signed_walk(root, _NODES, visit)
    return count


class ConstantLossWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        # backwards whose held calls were recorded (a loss logged on detached values each step
        # fills it in the first phase: a later phase's term is read when it reopens)
        self.loss_window = LossWindow(rec, _WINDOWS)
        self._held: list = []  # (fn, loc) since the last backward

    def install(self, patcher) -> None:  # the loss wrappers (LossCalls) call it; subscribed at construction
        pass

    def loss_call(self, fn: str, args, kwargs) -> None:
        """A wrapped loss function called with an input that needs no gradient, grad mode on."""
        if self.loss_window.closed or len(self._held) >= _CALLS:
            return
        try:
            if any(map(_needs_grad, args)) or any(map(_needs_grad, kwargs.values())):
                return  # a target or weight with a graph: the loss has one
            loc = self.rec.here()
            if loc is not None:
                self._held.append((fn, loc))
        except Exception as exc:
            self.rec.internal_error(f"F.{fn} without graph", exc)

    def describe_loss(self, tensors) -> dict:
        if not self._held:
            return {}
        held, self._held = self._held, []
        try:
            root = loss_root(tensors)
            if root is None:
                return {}  # several tensors, or no graph: torch raises or nothing trains anyway
            self.loss_window.take()
            here = self.rec.here()
            backward = here.line if here is not None else None
            constants = constant_operands(root)
            done = set()
            for fn, loc in held:
                if loc in done:
                    continue
                done.add(loc)
                self.rec.emit_aside(ev.loss_no_graph(fn=fn, constants=constants, backward=backward), loc)
        except Exception as exc:
            self.rec.internal_error("loss_no_graph", exc)
        return {}
