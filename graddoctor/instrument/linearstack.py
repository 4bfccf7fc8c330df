"""Two linear layers with no nonlinearity between them (linear-layers-collapse).

``nn.Linear(a, h)`` followed by ``nn.Linear(h, c)`` computes ``W2 (W1 x + b1) + b2``: one linear
map of ``x``. With ``h`` at least ``min(a, c)`` the pair can represent nothing one
``nn.Linear(a, c)`` could not; the activation meant to sit between them (``nn.ReLU()`` left out
of an ``nn.Sequential``, ``self.fc2(self.fc1(x))``) is missing, and a "deep" MLP is a linear
model that cannot fit anything a linear model cannot.

Read at the forwards before the first ``WINDOW`` backwards, and before those of a later training
phase (``LossWindow``: an optimizer given parameters after the window closed, a fine-tuning
model's new head), from a global forward hook (removed with the window, registered again when it
reopens, never after torch.compile) on ``nn.Linear`` modules run under grad mode on the
script's thread:

* each such module's output ``grad_fn`` is noted (at most ``_NOTED`` per turn) with the module;
* each such module's input is followed back through the nodes that only move values (views,
  reshapes, transposes, slices, clones, casts) and the outputs of dropout modules (noted by the
  same hook: a product with a mask, where the same product in the script's own code may be a
  hand-written ReLU, ``x * (x > 0)``); when that reaches a noted output of
  another ``nn.Linear`` whose output width is at least the smaller of the first one's input
  width and the second one's output width (no bottleneck), and the first layer has a parameter
  that trains: a ``linear_stack`` aside, once per pair of modules, at the next backward (a
  forward no backward follows trains nothing), when no other linear layer of that turn read the
  same output (q, k and v projections of one tensor, a gate and its value: the product or the
  attention that combines them is the nonlinearity).

A stack is told (with the facts the rule weighs: whether the ``nn.Sequential`` that lists both
lists an activation module elsewhere, whether the outermost model holds one, how many linear
layers run in a row, whether the second layer's output is the prediction a loss function reads,
``cross_entropy``, ``mse_loss``... past views, as dropoutout's walk finds it) when it is listed
with an activation or ends in a loss function. A stack that feeds no loss function (a mechanics
demo's ``model(x).sum().backward()``) is left alone unless its list holds an activation.

Both layers must be children of the module whose code calls the second (its ``forward``, or
the ``nn.Sequential`` that lists both): a head applied to another model's output (a predictor
on an encoder's projection) composes two models on purpose.

Where it points: the line that calls the second layer when the script's own code calls it
(``forward``), its construction when torch's ``nn.Sequential`` does (the line that lists it),
nothing when a library's model does (its architecture, not the script's).

Silent: any op between the two that is not linear in the values (activations, norms, sums with
another tensor, products, concatenation, attention's matmuls); a low-rank factorisation
(``Linear(512, 64)`` then ``Linear(64, 512)``, LoRA's A and B); a first layer that does not train
(a linear probe on a frozen layer's output); layers a library's model places.
"""

from __future__ import annotations

import os
import sys
import weakref
from threading import get_ident

import torch
from torch import nn

from .. import events as ev
from .dependency import close_before_compile, register_module_hooks
from .dropoutout import backward_roots, loss_predictions, module_caller
from .losswindow import REOPENS, LossWindow
from .recorder import Recorder
from .topics import DESCRIBE_LOSS

WINDOW = 3  # backwards whose forwards are read, from the first one
_NOTED = 256  # linear outputs noted per turn at most
_MOVE_DEPTH = 8  # value-moving nodes walked back from a linear layer's input at most
_ROOT_FRAMES = 64  # frames looked through for the outermost module call
_TORCH_DIR = os.path.dirname(torch.__file__)
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# nodes that keep the values they are given (dropout rescales them: still linear)
_MOVE = ("ViewBackward", "ReshapeAliasBackward", "UnsafeViewBackward", "SqueezeBackward",
         "UnsqueezeBackward", "PermuteBackward", "TransposeBackward", "TBackward", "CloneBackward",
         "ToCopyBackward", "SliceBackward", "AliasBackward", "FlattenBackward",
         "NativeDropoutBackward", "ExpandBackward")


_ACTIVATIONS = nn.ReLU.__module__  # torch.nn.modules.activation: ReLU, GELU, Tanh, SiLU...


def _activation(module) -> bool:
    return type(module).__module__ == _ACTIVATIONS


def _base(name: str) -> str:
    return name.rstrip("0123456789")


def _core(node):
    """The node behind a layer's output past the views that only reshape it (a Linear on a
    (B, T, D) input ends in a view of its matmul): what a loss's prediction walk reaches."""
    for _ in range(_MOVE_DEPTH):
        name = _base(type(node).__name__)
        parents = [n for n, _ in node.next_functions if n is not None]
        if not name.startswith(_MOVE) or len(parents) != 1:
            return node
        node = parents[0]
    return node


class LinearStackWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.active = False
        self._handles: list = []
        self._patcher = None
        self._compiled = False
        self.loss_window = LossWindow(rec, WINDOW, on_reopen=self._reopen)
        # this turn's linear outputs: id of the grad_fn -> (grad_fn, module)
        self._outputs: dict[int, tuple] = {}
        self._dropped: dict[int, object] = {}  # this turn's dropout modules' output nodes
        self._pending: list = []  # stacks found in this turn's forwards: told if a backward follows
        self._readers: dict[int, set] = {}  # a noted output's node -> the linear layers that read it
        self._chained = 1
        self._told: set[tuple[int, int]] = set()
        self._sites: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> its construction

    def _stop(self) -> None:
        if self.active:
            self.rec.retire(DESCRIBE_LOSS, self.describe_loss)  # nothing more to read
        self.active = False
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._outputs, self._dropped, self._readers = {}, {}, {}

    # -- forwards ---------------------------------------------------------------------------
    def _post(self, module, args, output):
        linear = type(module) is nn.Linear
        if not self.active or not (linear or isinstance(module, nn.modules.dropout._DropoutNd)) \
                or not torch.is_grad_enabled() or get_ident() != self.rec.script_thread:
            return None
        try:
            node = getattr(output, "grad_fn", None) if isinstance(output, torch.Tensor) else None
            if node is None:
                return None
            if not linear:  # a dropout module's mask product: linear in what it is given
                # a dropout that passes its input through (p=0, as ViTs and x-transformers
                # default to) hands back the tensor it was given: its grad_fn is the op before
                # it (the activation), which is not the dropout's to vouch for
                if args and isinstance(args[0], torch.Tensor) and args[0].grad_fn is node:
                    return None
                if len(self._dropped) < _NOTED:
                    self._dropped[id(node)] = node
                return None
            self._chained = 1  # linear layers in a row ending here (set by _judge)
            if args and isinstance(args[0], torch.Tensor) and args[0].grad_fn is not None:
                self._judge(args[0].grad_fn, module, node)
            if len(self._outputs) < _NOTED:
                self._outputs[id(node)] = (node, module, self._chained)
            self._chained = 1
        except Exception as exc:
            self._stop()
            self._compiled = True  # never reopened after an internal error
            self.rec.internal_error("linear layers in a row", exc)
        return None

    def _judge(self, node, second, made) -> None:
        between = []
        for _ in range(_MOVE_DEPTH):
            noted = self._outputs.get(id(node))
            if noted is not None and noted[0] is node:
                self._readers.setdefault(id(node), set()).add(id(second))
                self._chained = noted[2] + 1
                self._pair(noted[1], second, between, id(node), made)
                return
            name = _base(type(node).__name__)
            dropped = self._dropped.get(id(node)) is node
            if dropped:
                name = "NativeDropoutBackward"
            elif not name.startswith(_MOVE):
                return
            parents = [n for n, _ in node.next_functions if n is not None]
            if len(parents) != 1:
                return
            between.append(name[:-len("Backward")] if name.endswith("Backward") else name)
            node = parents[0]

    def _pair(self, first, second, between: list, output: int, made) -> None:
        key = (id(first), id(second))
        if key in self._told or first is second:
            return
        a, h, c = first.in_features, first.out_features, second.out_features
        if h < min(a, c) or second.in_features != h:
            return  # a low-rank factorisation: a bottleneck on purpose
        if not any(p.requires_grad for p in first.parameters()):
            return  # a frozen layer's output read by a linear head: a probe
        caller, parent = module_caller(self.rec, second)
        if caller is None or not isinstance(parent, nn.Module) \
                or not any(child is first for child in parent.children()):
            return  # one model's output read by another's layer (an encoder, then a predictor head)
        loc = self.rec.here() if caller == "user" else self._sites.get(second)
        first_site = self._sites.get(first)
        if loc is None:
            return
        self._told.add(key)
        listed = caller == "container" and any(_activation(m) for m in parent.children())
        root = self._root(second) or parent
        in_model = any(_activation(m) for m in root.modules())
        self._pending.append((output, _core(made), dict(
            widths=[a, h, c], between=sorted(set(between)), called_by=caller,
            first_at=[first_site.path, first_site.line, first_site.function] if first_site else None,
            listed=listed, activations_in_model=in_model, chain=self._chained), loc))

    @staticmethod
    def _root(module):
        """The outermost module whose forward is running around this call of ``module``."""
        frame, root = sys._getframe(2), None
        for _ in range(_ROOT_FRAMES):
            if frame is None:
                break
            if frame.f_code.co_name == "_call_impl":
                candidate = frame.f_locals.get("self")
                if isinstance(candidate, nn.Module):
                    root = candidate
            frame = frame.f_back
        return root

    # -- constructions ----------------------------------------------------------------------
    def _wrap_init(self, original):
        watcher, rec = self, self.rec

        def __init__(module, *args, **kwargs):
            original(module, *args, **kwargs)
            if not watcher._noting_sites() or type(module) is not nn.Linear:
                return
            try:
                frame = sys._getframe(1)
                while frame is not None and frame.f_code.co_filename.startswith((_TORCH_DIR, _PKG_DIR)):
                    frame = frame.f_back
                if frame is not None and rec.finder.is_user_file(frame.f_code.co_filename):
                    watcher._sites[module] = rec.finder.location(frame)
            except Exception as exc:
                rec.internal_error("nn.Linear.__init__", exc)

        __init__.__wrapped__ = original
        __init__.__name__ = original.__name__
        __init__.__qualname__ = original.__qualname__
        return __init__

    # -- backwards --------------------------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        if self.active:
            self.loss_window.take()
            pending, self._pending = self._pending, []
            if pending:
                predictions = {id(node) for root in backward_roots(tensors) for _, node in loss_predictions(root)}
                for output, core, facts, loc in pending:
                    if len(self._readers.get(output, ())) != 1:
                        continue  # q, k, v or a gate and its value read one output: no stack
                    ends = id(core) in predictions
                    if facts["listed"] or ends:
                        self.rec.emit_aside(ev.linear_stack(**facts, ends_in_loss=ends), loc)
            self._outputs, self._dropped, self._readers = {}, {}, {}
            if self.loss_window.closed:
                self._stop()
        return {}

    def _noting_sites(self) -> bool:
        """Whether a new layer's construction is noted: while the window is open, and while it
        can still reopen (a later phase's head is built before the optimizer that reopens it)."""
        return self.active or (not self._compiled and self._patcher is not None
                               and self.loss_window.reopened < REOPENS)

    def _before_compile(self) -> None:
        self._compiled = True
        if self.active:
            self._stop()

    def install(self, patcher) -> None:
        close_before_compile(patcher, self._before_compile)
        self._patcher = patcher
        patcher.patch(nn.Linear, "__init__", self._wrap_init(nn.Linear.__init__))
        self._open()

    def _open(self) -> None:
        self._handles = register_module_hooks(self._patcher, None, self._post, with_kwargs=False,
                                              always_call=False,
                                              classes=(nn.Linear, nn.modules.dropout._DropoutNd))
        self.active = True

    def _reopen(self) -> None:
        """A later phase (an optimizer given parameters after the window closed): read its first
        forwards too, unless torch.compile ran (it warns about global module hooks)."""
        if self.active or self._compiled or self._patcher is None:
            return
        try:
            self._open()
            self.rec.resume(DESCRIBE_LOSS, self.describe_loss)
        except Exception as exc:
            self._stop()
            self._compiled = True  # never reopened after an internal error
            self.rec.internal_error("linear layers in a row (reopen)", exc)
