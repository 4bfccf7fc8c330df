"""Where the gradient of parameters that get exactly zero stops on its way from the loss.

The optimizer watcher measures every update's gradient norms (one batched ``_foreach_norm``,
``STEP_NORMS``). A norm of exactly 0.0 for a gradient a backward wrote is rare in a healthy
loop: the loss does not depend on that parameter at this point (an op with a zero derivative
such as ``round`` on the way, a clamp or a ReLU that is saturated for every sample, dropout with
p=1, a loss multiplied by 0). Seeing one only costs ``0.0 in norms`` per update.

When a measured update holds such zeros, the next backward from a CPU loss is diagnosed once:
its graph is walked from the loss to those parameters, and every node on a path between them
gets a hook (``Node.register_hook``) that notes the node whose incoming gradient is non-zero
while every gradient it passes on toward those parameters is zero. That node is where the
gradient stops. The hooks return None (nothing the backward computes changes) and are removed
when the backward ends (``queue_callback`` of autograd's engine), and a ``grad_stops`` aside
event names the nodes. A product whose other factor leads to no parameter and is all zero (a
gate kept as a plain tensor at 0) is marked ``MulBackward0:zero_constant``. Only a few backwards of a run are diagnosed (``_DIAGNOSES``); on an
accelerator nothing is read (a host sync per node).
"""

from __future__ import annotations

import weakref

import torch

from .. import events as ev
from .patcher import check_hook
from .graphpaths import paths_to, saved
from .recorder import Recorder

_DIAGNOSES = 3  # backwards walked per run
_NODES = 20000  # graph nodes walked at most (a larger graph is not diagnosed)
_STOPS = 5  # nodes named per event


def _nonzero(grad) -> bool:
    return grad is not None and grad.layout == torch.strided and bool(grad.any())


class GradStopWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._wanted: dict[int, weakref.ref] = {}  # pid -> param whose gradient was zero
        self._asked: set[int] = set()  # pids a diagnosis was asked for already
        self._diagnosed = 0
        self._handles: list = []

    # -- STEP_NORMS: zero norms ask for a diagnosis --------------------------------------------
    def step_norms(self, norm_pids, norms) -> None:
        if not norms or self._diagnosed >= _DIAGNOSES or 0.0 not in norms:
            return
        try:
            tensor = self.rec.tensor
            for pid, norm in zip(norm_pids, norms):
                if norm == 0.0 and pid not in self._asked:
                    self._asked.add(pid)
                    param = tensor(pid)
                    if param is not None and param.device.type == "cpu":
                        self._wanted[pid] = weakref.ref(param)
        except Exception as exc:
            self._diagnosed = _DIAGNOSES
            self.rec.internal_error("zero gradients (step)", exc)

    # -- DESCRIBE_LOSS: the diagnosed backward -------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        if not self._wanted or self._diagnosed >= _DIAGNOSES or self._handles:
            return {}
        try:
            self._diagnose(tensors)
        except Exception as exc:
            self._diagnosed = _DIAGNOSES
            self._remove()
            self.rec.internal_error("zero gradients (diagnosis)", exc)
        return {}

    def _diagnose(self, tensors) -> None:
        if not isinstance(tensors, torch.Tensor) or tensors.grad_fn is None \
                or tensors.device.type != "cpu" or tensors.numel() != 1:
            return
        wanted = {}
        for pid, ref in self._wanted.items():
            param = ref()
            if param is not None:
                wanted[id(param)] = pid
        self._wanted = {}
        self._diagnosed += 1
        relevant, reached = _paths_to(tensors.grad_fn, wanted)
        if not relevant:
            return
        stops: list[str] = []
        loss_zero = bool(tensors.detach() == 0)
        for node, inputs in relevant.items():
            saved = _WEIGHTS.get(node.name())
            zero: list = []  # a matmul's weight (then its input) all zero, read before the node frees them
            if saved is None and node.name() == "MulBackward0" and len(inputs) == 2:
                # a product of two factors that both lead to the parameters (matrix
                # factorisation's user * item): both all zero, each one's gradient is the other
                saved = _FACTORS
            elif saved is None and node.name() == "MulBackward0" and len(inputs) == 1 and inputs[0] < 2:
                # a product whose other factor leads to no parameter: that factor all zero at
                # every update (a gate kept as a plain tensor at 0) stops the gradient for good
                other = _OTHER_FACTOR[inputs[0]]
                saved = (other, other)
            if saved is not None:
                self._handles.append(check_hook(node.register_prehook(_weight_check(node, saved, zero))))
            self._handles.append(check_hook(node.register_hook(_stop_hook(node, inputs, stops, zero))))
        loc = self.rec.here()
        rec = self.rec

        def finish():
            self._remove()
            if stops:
                names = list(dict.fromkeys(stops))[:_STOPS]
                rec.emit_aside(ev.grad_stops(params=sorted(reached), stops=names,
                                             loss_zero=loss_zero), loc)

        # the first hook to fire (the loss's node) queues the removal for the backward's end
        root = tensors.grad_fn

        def queue(grad_outputs):
            try:
                torch.autograd.Variable._execution_engine.queue_callback(_guarded(finish, rec))
            except Exception as exc:
                rec.internal_error("zero gradients (diagnosis end)", exc)
            return None

        self._handles.append(check_hook(root.register_prehook(queue)))

    def _remove(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    def install(self, patcher) -> None:
        patcher.handle(_Cleanup(self._remove))  # a diagnosis cut short: its hooks go at the end


class _Cleanup:
    """A patcher entry that removes a diagnosis's hooks on the script's graph when the run ends
    (a backward that raised never reached its end-of-backward callback)."""

    # no hook of its own: nothing to take out while benchmarks/overhead.py suspends the patches
    follows_a_patch = True

    def __init__(self, remove) -> None:
        self.remove = remove


def _guarded(fn, rec):
    def call():
        try:
            fn()
        except Exception as exc:
            rec.internal_error("zero gradients (diagnosis end)", exc)
    return call


# matmul-like nodes and the saved tensors that hold the layer's weight and its input: a gradient
# that stops there because the weight is all zero (every layer initialised to 0) says so, and
# so does one whose weight gets none because the layer's input is all zero (the data multiplied
# by a mask of zeros, a tensor of zeros fed instead of the batch)
_FACTORS = ("_saved_self", "_saved_other")  # a product's two factors, both read as "weights"
# the factor of a product on the other side from the parameters, by the input that leads to them
_OTHER_FACTOR = ("_saved_other", "_saved_self")
_WEIGHTS = {"AddmmBackward0": ("_saved_mat2", "_saved_mat1"), "MmBackward0": ("_saved_mat2", "_saved_self"),
            "ConvolutionBackward0": ("_saved_weight", "_saved_input")}


def _all_zero(node, attr: str) -> bool | None:
    # a tensor saved under saved-tensor hooks (non-reentrant checkpointing) is not read:
    # unpacking it here would use up the one unpack the checkpoint allows
    value = saved(node, attr)
    if isinstance(value, torch.Tensor) and value.layout == torch.strided:
        return not bool(value.any())
    return None


# the input of each of those nodes that carries the weight (its ``next_functions`` index): the
# parameter itself is read there when its saved copy cannot be
_WEIGHT_INPUT = {"AddmmBackward0": 2, "MmBackward0": 1, "ConvolutionBackward0": 1}
_WEIGHT_VIEWS = ("TBackward0", "TransposeBackward0", "PermuteBackward0", "ViewBackward0",
                 "ExpandBackward0", "UnsafeViewBackward0")


def _parameter_all_zero(node) -> bool | None:
    """Whether the parameter a matmul-like node reads as its weight (past a transpose or view)
    is all zero; None when the weight is no parameter (an activation, a product of two: LoRA's
    ``x @ A.t() @ B.t()`` reads ``B`` here)."""
    index = _WEIGHT_INPUT.get(type(node).__name__)
    functions = node.next_functions
    if index is None or index >= len(functions):
        return None
    edge = functions[index][0]
    for _ in range(4):
        if edge is None:
            return None
        variable = getattr(edge, "variable", None)
        if variable is not None:
            return not bool(variable.any()) if variable.layout == torch.strided else None
        if type(edge).__name__ not in _WEIGHT_VIEWS or len(edge.next_functions) != 1:
            return None
        edge = edge.next_functions[0][0]
    return None


def _weight_check(node, attrs: tuple[str, str], zero: list):
    weight, data = attrs

    def prehook(grad_outputs):
        try:
            weight_zero = _all_zero(node, weight)
            if weight_zero is None:  # saved under checkpointing: read the parameter itself
                weight_zero = _parameter_all_zero(node)
            zero.append((weight_zero, _all_zero(node, data)))
        except Exception:
            pass  # a diagnosis never breaks the backward
        return None

    return prehook


def _stop_hook(node, inputs: tuple[int, ...], stops: list, zero: list):
    name = node.name()

    def hook(grad_inputs, grad_outputs):
        try:
            if any(_nonzero(g) for g in grad_outputs) and \
                    not any(_nonzero(grad_inputs[i]) for i in inputs if i < len(grad_inputs)):
                weight, data = zero[-1] if zero else (None, None)
                if len(inputs) == 2 and name == "MulBackward0":
                    stops.append(f"{name}:zero_factors" if weight and data else name)
                elif name == "MulBackward0":
                    stops.append(f"{name}:zero_constant" if weight else name)
                else:
                    stops.append(f"{name}:zero_weights" if weight else f"{name}:zero_input" if data else name)
        except Exception:
            pass  # a diagnosis never breaks the backward
        return None

    return hook


def _paths_to(root, wanted: dict[int, int]) -> tuple[dict, set]:
    """``({node: indices of its inputs that lead to a wanted leaf}, wanted pids reached)`` over
    the graph below ``root``; nothing when it has more than ``_NODES`` nodes."""
    reached: set = set()

    def is_wanted(node) -> bool:
        variable = getattr(node, "variable", None) if node.name() == "torch::autograd::AccumulateGrad" else None
        pid = wanted.get(id(variable)) if variable is not None else None
        if pid is not None:
            reached.add(pid)
        return pid is not None

    relevant = paths_to(root, is_wanted, _NODES)
    return (relevant, reached) if relevant is not None else ({}, set())
