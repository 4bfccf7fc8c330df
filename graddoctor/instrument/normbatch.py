"""A per-sample norm taken over the batch and pulled toward a fixed value (norm-over-batch).

WGAN-GP's penalty is ``(||grad_x D(x_i)|| - 1)^2`` for each sample ``i``; written with
``g.norm(2, dim=0)`` on a (batch, features) gradient it is the norm of each feature *across the
samples*, and with ``g.norm(2)`` the norm of the whole batch's gradient. Either way the value
mixes the samples, grows with the square root of the batch size, and the penalty pulls that
batch-dependent number toward 1: no sample's gradient norm is constrained. The same holds for
a ring loss (feature norms pulled to a radius), a one-sided Lipschitz penalty, a unit-norm
constraint — any norm meant per sample, reduced over axis 0 instead, and compared with a target.

The invariant, over the loss's graph: a vector norm (``norm``, ``linalg.norm``,
``linalg.vector_norm``, or ``sqrt`` of a sum of squares) whose reduced axes include axis 0 of a
tensor whose axis 0 holds the samples (at least 2, as long as the leading axis of a tensor
without gradient the graph below it read, and the DataLoader's batch when there is one:
softmaxbatch's test), whose result is then shifted by a constant or a scalar (``- 1``, ``-
R``) and fed to a penalty (a square or other power, ``abs``, ``relu``, a clamp), or given to a
regression loss against a target. A norm divided by nothing is no average: unlike a standard
deviation over the batch (VICReg's variance term, meant over the batch, a mean inside the
root) it scales with the batch size, so a fixed target for it is never meant.

Silent: a norm per sample (over the other axes); a norm over the batch that is not compared
with a target (the loss itself: a PINN's residual norm; a normaliser: ``F.normalize(z,
dim=0)`` in Barlow Twins, which divides and then contracts over the batch); a standard
deviation or RMS over the batch (a mean inside the root); a norm of a weight (nothing below it
is data, even when its axis 0 is as long as the batch).

How, and what it costs: ``Tensor.norm``, ``torch.norm``, ``torch.linalg.norm``,
``torch.linalg.vector_norm``, ``torch.sqrt`` and ``Tensor.sqrt`` are wrapped until ``_WINDOWS``
backwards have run (then put back): a call from the user's code whose result has a graph notes
that node with its line. At each of those backwards (``DESCRIBE_LOSS``), when a node was noted,
the loss's graph is walked once (``_NODES`` at most); a noted node in it is judged from saved
attributes and node metadata (shapes only: no tensor's values are read, nothing is unpacked
under saved-tensor hooks) and becomes a ``norm_batch`` aside event at the call's line.

A later training phase (``LossWindow``: an optimizer given parameters after the window closed)
is read from the graph alone: torch's norms and ``sqrt`` are not wrapped again (scripts hold
them as values), so every norm node of its first backwards' losses is judged, and a finding is
placed at the backward (``at_backward``), the rule finding the norm's call in the source.
"""

from __future__ import annotations

import sys

import torch

from .. import events as ev
from .dependency import close_before_compile
from .graphpaths import post_order, saved
from .inlinable import watched_call
from .losswindow import LossWindow
from .recorder import Recorder
from .softmaxbatch import _BELOW, _data_leading
from .topics import DESCRIBE_LOSS
from .patcher import put_back

_WINDOWS = 3  # backwards whose losses are looked at; the wrappers go at the last one
_NODES = 20000  # graph nodes walked per backward
_NOTED = 256  # norm calls noted between two backwards, at most
_LABEL = "norm over the batch"
_NORMS = ("LinalgVectorNormBackward", "NormBackward")
_VIEWS = ("ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward", "SqueezeBackward",
          "UnsqueezeBackward", "CloneBackward", "ToCopyBackward")
_SHIFTS = ("SubBackward", "AddBackward", "RsubBackward")
_PENALTIES = {"AbsBackward0": "abs", "ReluBackward0": "relu", "ClampMinBackward0": "clamp",
              "ClampBackward0": "clamp", "ClampBackward1": "clamp", "SoftplusBackward0": "softplus",
              "SquareBackward0": "square"}
_LOSSES = {"MseLossBackward0": "mse_loss", "SmoothL1LossBackward0": "smooth_l1_loss",
           "HuberLossBackward0": "huber_loss", "L1LossBackward0": "l1_loss"}
_WRAPPED = ((torch.Tensor, "norm"), (torch, "norm"), (torch.linalg, "norm"),
            (torch.linalg, "vector_norm"), (torch, "sqrt"), (torch.Tensor, "sqrt"))


def _name(node) -> str:
    return type(node).__name__


def _out_shape(node, nr: int = 0) -> tuple | None:
    try:
        return tuple(int(s) for s in node._input_metadata[nr].shape)
    except Exception:  # a node without metadata
        return None


def _dims(value, ndim: int):
    """Saved reduction dims as non-negative ints (None: every axis)."""
    if value is None:
        return None
    dims = value if isinstance(value, (tuple, list)) else (value,)
    out = []
    for d in dims:
        if not isinstance(d, int):
            return False
        if d >= 1 << 63:
            d -= 1 << 64  # a negative dim, saved unsigned
        out.append(d % ndim if ndim else 0)
    return tuple(out) if out else None


def _square(node) -> bool:
    name = _name(node)
    if name == "PowBackward0":
        return saved(node, "_saved_exponent") == 2
    if name == "MulBackward0":
        kids = [c for c, _ in node.next_functions]
        return len(kids) == 2 and kids[0] is not None and kids[0] is kids[1]
    return name == "SquareBackward0"


def reduced(node) -> tuple[tuple, object] | None:
    """``(shape of the reduced tensor, dims)`` for a norm node, or for a ``sqrt`` of a sum of
    squares (an epsilon added between them); None for anything else."""
    name = _name(node)
    if name.startswith(_NORMS):
        child = node.next_functions[0] if node.next_functions else (None, 0)
        shape = _out_shape(*child) if child[0] is not None else None
        if shape is None:
            return None
        dims = _dims(saved(node, "_saved_dim"), len(shape))
        return None if dims is False else (shape, dims)
    if name != "SqrtBackward0":
        return None
    below = node.next_functions[0][0] if node.next_functions else None
    for _ in range(2):  # an epsilon: sqrt(sum + 1e-12)
        if below is not None and _name(below).startswith("AddBackward"):
            kids = [c for c, _ in below.next_functions if c is not None]
            below = kids[0] if len(kids) == 1 else None
    if below is None or _name(below) not in ("SumBackward0", "SumBackward1"):
        return None
    sizes = saved(below, "_saved_self_sym_sizes")
    if sizes is None:
        return None
    shape = tuple(int(s) for s in sizes)
    square = below.next_functions[0][0] if below.next_functions else None
    if square is None or not _square(square):
        return None
    dims = _dims(saved(below, "_saved_dim"), len(shape)) if _name(below) == "SumBackward1" else None
    return None if dims is False else (shape, dims)


def _constant_side(node, branch) -> bool:
    """Whether the other operand of a sum/difference ``node`` beside ``branch`` is a constant
    or a single number (a radius parameter): the norm is compared with a target."""
    others = [(c, nr) for c, nr in node.next_functions if c is not branch]
    if len(node.next_functions) == 1:
        return True  # a Python number: ``norm - 1``, ``1 - norm``
    if len(others) != 1:
        return False
    child, nr = others[0]
    if child is None:
        return True
    shape = _out_shape(child, nr)
    return shape is not None and all(s == 1 for s in shape)


def pulled_to_target(node, parents: dict) -> str | None:
    """How the loss pulls the value ``node`` makes toward a fixed target: a penalty's name
    ("square", "abs", "relu", ...) of a shift by a constant, or a regression loss's; None when
    the value goes anywhere else."""
    current = node
    for _ in range(4):
        ups = parents.get(current, ())
        if len(ups) != 1:
            return None
        up = ups[0]
        name = _name(up)
        if name in _LOSSES:
            return _LOSSES[name]
        if name.startswith(_VIEWS):
            current = up
            continue
        if not name.startswith(_SHIFTS) or not _constant_side(up, current):
            return None
        above = parents.get(up, ())
        if len(above) != 1:
            return None
        penalty = above[0]
        if _name(penalty) == "PowBackward0":
            exponent = saved(penalty, "_saved_exponent")
            return "square" if isinstance(exponent, (int, float)) and exponent >= 2 else None
        if _square(penalty):
            return "square"
        return _PENALTIES.get(_name(penalty))
    return None


class NormBatchWatcher:
    def __init__(self, rec: Recorder, loader=None):
        self.rec = rec
        self.loader = loader  # the DataLoaderWatcher: ``batch_size()`` of the batch it served last
        self._open = True
        self._graph_only = False  # a later phase's backwards: every norm node of the graph
        self._ended = False  # torch.compile ran or the watcher failed: never reopened
        self.loss_window = LossWindow(rec, _WINDOWS, on_reopen=self._reopen)
        self._noted: dict = {}  # id(node) -> (node, the user's Location of the call)
        self._told: set = set()
        self._restore: list = []

    def install(self, patcher) -> None:
        for owner, name in _WRAPPED:
            original = getattr(owner, name, None)
            if original is None:
                continue
            wrapper = patcher.patch(owner, name, watched_call(original, self._after))
            self._restore.append((owner, name, original, wrapper))
        close_before_compile(patcher, self._before_compile)

    def _before_compile(self) -> None:
        self._ended = True
        self._graph_only = False
        self._close()

    def _after(self, args, kwargs, result) -> None:
        if not self._open or not isinstance(result, torch.Tensor) or result.grad_fn is None:
            return
        try:
            if len(self._noted) >= _NOTED:
                return
            caller = sys._getframe(2)  # after <- wrapper <- the code that called
            if not self.rec.finder.is_user_file(caller.f_code.co_filename):
                return
            loc = self.rec.here()
            if loc is not None:
                node = result.grad_fn
                self._noted[id(node)] = (node, loc)
        except Exception as exc:
            self._open = False
            self._ended = True
            self.rec.internal_error(_LABEL, exc)

    def _reopen(self) -> None:
        if not self._open and not self._ended:
            self._graph_only = True
            self.rec.resume(DESCRIBE_LOSS, self.describe_loss)

    def describe_loss(self, tensors) -> dict:
        if not (self._open or self._graph_only):
            return {}
        self.loss_window.take()
        noted, self._noted = self._noted, {}
        try:
            if noted:
                self._look(tensors, noted)
            elif self._graph_only:
                self._look(tensors, None)
        except Exception as exc:
            self.rec.internal_error(_LABEL, exc)
        if self.loss_window.closed:
            if self._open:
                self._close()
            elif self._graph_only:
                self._graph_only = False
                self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
        return {}

    def _close(self) -> None:
        if not self._open:
            return
        self._open = False
        self._noted = {}
        self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
        for owner, name, original, wrapper in self._restore:
            try:  # not from under another watcher's wrapper
                put_back(owner, name, original, wrapper)
            except Exception as exc:
                self.rec.internal_error(_LABEL, exc)

    def _loader_batch(self) -> int | None:
        if self.loader is None:
            return None
        try:
            return self.loader.batch_size()
        except Exception:
            return None

    def _look(self, tensors, noted: dict | None) -> None:
        """``noted``: the norm calls the wrappers saw, with their lines; None for a later
        phase's graph read alone (its norm nodes, placed at the backward)."""
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        loader_batch = self._loader_batch()
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            nodes = post_order(root, _NODES)
            if not nodes:
                continue
            if noted is None:
                here = self.rec.here()
                if here is None:
                    return
                noted = {id(n): (n, here) for n in nodes
                         if _name(n).startswith(_NORMS) or _name(n) == "SqrtBackward0"}
                at_backward = True
            else:
                at_backward = False
            found = [n for n in nodes if id(n) in noted and noted[id(n)][0] is n]
            if not found:
                continue
            parents: dict = {}
            for node in nodes:
                for child, _ in node.next_functions:
                    if child is not None:
                        parents.setdefault(child, []).append(node)
            for node in found:
                loc = noted[id(node)][1]
                key = (loc.path, loc.line)
                if key in self._told:
                    continue
                what = reduced(node)
                if what is None:
                    continue
                shape, dims = what
                if not shape or (dims is not None and 0 not in dims):
                    continue
                batch = shape[0]
                if batch < 2 or (loader_batch is not None and loader_batch != batch):
                    continue
                penalty = pulled_to_target(node, parents)
                if penalty is None or batch not in _data_leading(node, _BELOW):
                    continue
                self._told.add(key)
                self.rec.emit_aside(ev.norm_batch(shape=list(shape), dims=None if dims is None else list(dims),
                                                  batch=batch, penalty=penalty,
                                                  at_backward=at_backward), loc)
