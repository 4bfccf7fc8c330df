"""A loss that is nothing but the spread of one batch of network outputs around their own batch
mean (loss-is-batch-spread).

A one-class objective pulls the embeddings of normal data towards a centre: Deep SVDD's
``((z - c) ** 2).sum(1).mean()`` with ``c`` computed once, under ``no_grad``, from the initial
network and then held fixed. Written with the centre taken from the live batch with its
gradient (``z - z.mean(0)``), or as the batch variance of the outputs (``z.var(0).sum()``), the
whole loss measures only how far the outputs are from each other: any constant output
(all weights 0) reaches its minimum 0, so training drives the network to collapse and the
anomaly score no longer depends on the input.

The invariant, over the loss's graph at the first ``_LOOKED`` backwards of each backward line
(``_LINES`` lines at most: a later phase, Deep SVDD after its autoencoder's pretraining, has a
line of its own; ``DESCRIBE_LOSS``, unsubscribed after ``_SEEN`` backwards or once every line
is looked at): from the loss, through its reductions (``mean``, ``sum``) and
constant positive factors only (no other term added), a ``var``/``std`` over axis 0 of a 2-D
(samples, features) tensor with a graph, or a square (``** 2``, ``x * x``) or a norm of a
difference ``z - z.mean(0)`` (either order, ``keepdim`` or not) whose mean is taken over axis 0
of the same tensor ``z``; ``_ROWS`` samples at least.

Silent: a fixed centre (a tensor without gradient), a spread that is one term of several (a
classification or reconstruction term beside it), a spread the loss maximises (negated:
VICReg's variance hinge), a centred tensor used any other way (standardised features fed on),
a centred residual of the outputs against data (``err = model(x) - y``; ``((err -
err.mean(0)) ** 2).mean()`` fits the targets up to one constant per batch).

Only node names, saved dims, exponents and shapes are read: no tensor's values. One
``spread_minimised`` aside event per backward line, at that backward; the rule finds the
centring's line in the source.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import reached, saved
from .lossterms import PerLine
from .recorder import Recorder
from .topics import DESCRIBE_LOSS

_LOOKED = 3  # backwards of each backward line looked at
_LINES = 8  # backward lines looked at
_SEEN = 512  # backwards after which the watcher unsubscribes
_TOP = 12  # reductions and constant factors followed from the loss down
_ROWS = 4  # samples a batch needs
_LEAVES = 20000  # graph nodes walked for the tensors below the spread
_LABEL = "loss is batch spread"
_REDUCE = ("MeanBackward0", "MeanBackward1", "SumBackward0", "SumBackward1")
_THROUGH = ("ExpandBackward0", "UnsqueezeBackward0", "ViewBackward0", "UnsafeViewBackward0",
            "SqueezeBackward0", "SqueezeBackward1", "SqueezeBackward2")


def _name(node) -> str:
    return type(node).__name__


def _shape(node, output: int):
    try:
        return tuple(int(s) for s in node._input_metadata[output].shape)
    except Exception:
        return None


def _dims(value, ndim: int):
    if value is None:
        return None
    values = [value] if isinstance(value, int) else list(value)
    try:
        return tuple(sorted(int(d) % ndim for d in values))
    except Exception:
        return None


def _positive_constant(node):
    """The input a ``MulBackward0``/``DivBackward0`` scales by a positive constant number, or
    None (a factor with a graph, a tensor of another size, a negative or unreadable one)."""
    children = [(child, at) for child, at in node.next_functions]
    live = [c for c in children if c[0] is not None]
    if len(live) != 1:
        return None
    name = _name(node)
    value = saved(node, "_saved_other")
    if name.startswith("MulBackward") and live[0] is children[1]:
        value = saved(node, "_saved_self")
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.requires_grad or value.device.type != "cpu":
            return None
        value = float(value)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        return None
    return live[0]


def _core(root):
    """The node below the loss's reductions and positive constant factors, or None when
    anything else (an added term, a negation) is on the way."""
    node = root
    for _ in range(_TOP):
        name = _name(node)
        if name in _REDUCE:
            child = node.next_functions[0][0] if node.next_functions else None
        elif name.startswith(("MulBackward0", "DivBackward0")):
            follow = _positive_constant(node)
            if follow is None:
                return node  # perhaps x * x: the caller judges it
            child = follow[0]
        else:
            return node
        if child is None:
            return None
        node = child
    return None


def _below(node, output: int = 0):
    """``(node, output)`` under shape-only operations."""
    for _ in range(6):
        if node is None or _name(node) not in _THROUGH:
            return node, output
        node, output = node.next_functions[0]
    return node, output


def _centred(sub):
    """``(z node, z output)`` when ``sub`` is ``z - z.mean(0)`` or ``z.mean(0) - z``."""
    if not _name(sub).startswith("SubBackward0") or len(sub.next_functions) != 2:
        return None
    (a, ia), (b, ib) = sub.next_functions
    for (x, ix), (m, im) in (((a, ia), (b, ib)), ((b, ib), (a, ia))):
        if x is None or m is None:
            continue
        m, im = _below(m, im)
        if m is None or _name(m) != "MeanBackward1" or not m.next_functions:
            continue
        inner, at = m.next_functions[0]
        shape = _shape(x, ix)
        if inner is not x or at != ix or shape is None or len(shape) != 2:
            continue
        if _dims(saved(m, "_saved_dim"), 2) == (0,):
            return x, ix
    return None


def _against_data(node) -> bool:
    """Whether the centred tensor is the outputs' residual against a tensor without graph
    (``err = model(x) - y``): a fit to the targets up to one constant per batch (energies known
    up to an offset), which the targets keep from collapsing, not the outputs' own spread."""
    node, _ = _below(node)
    if node is None or not _name(node).startswith(("SubBackward0", "AddBackward0", "RsubBackward1")):
        return False
    edges = node.next_functions
    return len(edges) == 2 and (edges[0][0] is None) != (edges[1][0] is None)


def spread_of(root):
    """``(form, shape, node below)`` when the loss ``root`` is, through reductions and positive
    constant factors, a batch's spread around its own mean: ``form`` "var" (``var``/``std`` over
    axis 0) or "centred" (a square or norm of ``z - z.mean(0)``); else None."""
    core = _core(root)
    if core is None:
        return None
    name = _name(core)
    if name in ("VarBackward0", "StdBackward0"):
        child = core.next_functions[0] if core.next_functions else (None, 0)
        shape = _shape(*child) if child[0] is not None else None
        if shape is None or len(shape) != 2 or shape[0] < _ROWS:
            return None
        if _dims(saved(core, "_saved_dim"), 2) != (0,):
            return None
        return "var", shape, child[0]
    inner = None
    if name == "PowBackward0" and saved(core, "_saved_exponent") in (2, 2.0):
        inner = core.next_functions[0][0]
    elif name == "MulBackward0" and len(core.next_functions) == 2 \
            and core.next_functions[0] == core.next_functions[1] and core.next_functions[0][0] is not None:
        inner = core.next_functions[0][0]
    elif name.startswith(("LinalgVectorNormBackward", "NormBackward")):
        inner = core
    if inner is not None and _name(inner).startswith(("LinalgVectorNormBackward", "NormBackward")):
        inner = inner.next_functions[0][0] if inner.next_functions else None
    if inner is None:
        return None
    found = _centred(inner)
    if found is None or _against_data(found[0]):
        return None
    shape = _shape(*found)
    if shape is None or shape[0] < _ROWS:
        return None
    return "centred", shape, found[0]


class SpreadLossWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._lines = PerLine(_LOOKED, _LINES)
        self._backwards = 0
        self._told: set = set()

    def install(self, patcher) -> None:  # subscribed at construction
        pass

    def describe_loss(self, tensors) -> dict:
        self._backwards += 1
        if self._backwards > _SEEN or self._lines.exhausted:
            self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
            return {}
        try:
            self._look(tensors)
        except Exception as exc:
            self.rec.internal_error(_LABEL, exc)
        return {}

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        roots = [t for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None
                 and t.numel() == 1]
        if not roots:
            return
        loc = self.rec.here()
        if not self._lines.admit(loc):
            return
        for t in roots:
            found = spread_of(t.grad_fn)
            if found is None:
                continue
            form, shape, below = found
            key = (loc.path, loc.line) if loc is not None else None
            if key in self._told:
                continue
            self._told.add(key)
            self.rec.emit_aside(ev.spread_minimised(form=form, shape=list(shape),
                                                    params=self._params(below)), loc)

    def _params(self, node) -> list:
        tensors = self.rec.tensors
        walked = reached(node, _LEAVES, truncate=True)
        if walked is None:
            return []
        pids = sorted(pid for i in walked[1]
                      if (pid := tensors.number.get(i)) is not None and id(tensors.refs[pid]()) == i)
        return pids[:64]
