"""A penalty that pulls parameters towards an anchor which is the live parameters themselves:
an EWC, L2-SP or FedProx term ``sum(F * (p - anchor) ** 2)`` whose anchor was stored as a
reference, not a copy.

``anchor = {n: p for n, p in model.named_parameters()}`` (or ``list(model.parameters())``,
``dict(model.named_parameters())``) keeps the parameter objects: ``p - anchor[n]`` is ``p - p``,
zero at every step with a zero gradient. ``anchor = {n: p.detach() ...}`` or ``p.data`` shares
the parameters' memory: the optimizer's in-place update moves the anchor with them, and the
difference is again zero after every step. The penalty silently does nothing: the model forgets
the first task (EWC), drifts from the pretrained weights (L2-SP), from the global model
(FedProx).

At the first ``_LOOKED`` backwards of each backward line and form of the loss's top (the
root's node and its inputs' kinds: a penalty phase that starts after a first task or a warm-up
adds a term, so it is looked at even on the backward line of the first phase; ``_LINES`` of
them at most), the loss's graph is walked (the first ``_NODES`` nodes breadth first, level by
level in C: ``graphpaths.nodes_below``) for

* a ``SubBackward0`` both of whose inputs are the same parameter's ``AccumulateGrad`` node
  (``p - p``): recorded at once (``how="same"``);
* a square, absolute value or norm of a difference ``p - c`` of a parameter and a tensor with no
  graph (``PowBackward0`` of an even exponent, ``MulBackward0`` of the difference by itself or by
  the same difference written twice, ``AbsBackward0``, ``NormBackward``; ``mse_loss(p, c)`` /
  ``l1_loss(p, c)`` / ``torch.dist(p, c)``): the saved
  difference (or input and target) is read. Exactly zero at two backwards with an optimizer
  step between them, after which the parameter itself had moved (a few of its values differ:
  a parameter that lr 0 or no gradient keeps still keeps a copied anchor's difference at 0
  too), and never anything else, the anchor follows the parameter (``how="shared"``;
  accumulated micro-batches count once per step). A difference seen non-zero once clears the
  parameter for good (an anchor copied at the start of each FedProx round is equal to the
  parameters at the round's first step only).

An ``anchor_alias`` aside event names the parameters, once (loc: the backward).

Cost: one graph walk per backward at the first ``_LOOKED`` backwards of each backward line, a
reduction per difference found; a frame lookup per backward until ``_SEEN`` backwards, nothing
after them.
"""

from __future__ import annotations

from itertools import compress

import torch

from .. import events as ev
from .graphpaths import nodes_below, saved
from .lossterms import PerLine, loss_root
from .recorder import Recorder
from .topics import DESCRIBE_LOSS, STEPPED

_LOOKED = 4  # backwards of each backward line looked at
_LINES = 16  # backward lines looked at, at most
_NODES = 20000  # nodes walked per backward
_SEEN = 512  # backwards seen at most: past them nothing is looked up
_ZEROS = 1  # zero differences after the parameter moved that make the anchor a follower


# the nodes ``_difference`` takes: the losses of a parameter and a target, a square, a product
# of a difference by itself, an absolute value or a norm
_DIFFERENCE_NODES = frozenset({"MseLossBackward0", "L1LossBackward0", "SmoothL1LossBackward0",
                               "HuberLossBackward0", "DistBackward0", "PowBackward0",
                               "MulBackward0"})
_DIFFERENCE_PREFIXES = ("AbsBackward", "NormBackward", "LinalgVectorNormBackward")


def _top(root) -> tuple:
    """What the loss's graph is at its top: the root's kind and its inputs' kinds."""
    return (type(root).__name__,
            tuple(type(child).__name__ for child, _ in root.next_functions))


class _LookedInto(dict):
    """node class -> whether ``_judge`` looks into its nodes (a ``p - p``, or one that
    ``_difference`` takes), decided once per class by its name."""

    def __missing__(self, cls) -> bool:
        name = cls.__name__
        taken = name == "SubBackward0" or name in _DIFFERENCE_NODES \
            or name.startswith(_DIFFERENCE_PREFIXES)
        self[cls] = taken
        return taken


_looked_into = _LookedInto().__getitem__


def _leaf(node):
    return getattr(node, "variable", None) if type(node).__name__ == "AccumulateGrad" else None


class AnchorAliasWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._lines = PerLine(_LOOKED, _LINES)
        self._steps = 0
        self._zeros: dict[int, int] = {}  # pid -> zero differences seen after a step
        self._moved: set[int] = set()  # pids whose difference was seen non-zero
        self._counted: dict[int, int] = {}  # pid -> the step count when its zero was last counted
        self._prints: dict[int, torch.Tensor] = {}  # pid -> a few of its values at the last zero
        self._told = False
        self._backwards = 0  # backwards seen (a line lookup each, until _SEEN)

    def after_step(self, opt, optimizer) -> None:
        self._steps += 1

    def describe_loss(self, tensors) -> dict:
        if self._told or self._backwards >= _SEEN:
            # done for good: its step count is read nowhere from now on
            self.rec.retire(STEPPED, self.after_step)
            self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
            return {}
        self._backwards += 1
        if self._lines.exhausted:
            return {}
        root = loss_root(tensors)
        if root is None:
            return {}
        try:
            # keyed by the loss's top as well: a penalty switched on later (EWC's second task, a
            # regulariser after a warm-up) on the same backward line is looked at again
            if not self._lines.admit((self.rec.here(), _top(root))):
                return {}
            with torch.no_grad():
                self._judge(root)
        except Exception as exc:
            self.rec.internal_error("anchor_alias", exc)
        return {}

    def _pid(self, variable):
        if variable is None:
            return None
        tensors = self.rec.tensors
        pid = tensors.number.get(id(variable))
        if pid is None or id(tensors.refs[pid]()) != id(variable):
            return None
        return pid

    def _difference(self, node, name: str | None = None, children: list | None = None):
        """``(pid, saved difference or (input, target), the parameter)`` when ``node`` squares (or takes the
        absolute value or norm of) a difference of a tracked parameter and a constant. ``name``
        and ``children``: the node's class name and next functions, when the caller has them."""
        if name is None:
            name = type(node).__name__
        if children is None:
            children = [child for child, _ in node.next_functions]
        if name in ("MseLossBackward0", "L1LossBackward0", "SmoothL1LossBackward0", "HuberLossBackward0",
                    "DistBackward0"):
            if len(children) >= 1 and children[0] is not None and all(c is None for c in children[1:]):
                pid = self._pid(_leaf(children[0]))
                if pid is not None:
                    other = "_saved_other" if name == "DistBackward0" else "_saved_target"
                    return pid, (saved(node, "_saved_self"), saved(node, other)), _leaf(children[0])
            return None
        if name == "PowBackward0":
            exponent = saved(node, "_saved_exponent")
            if not (isinstance(exponent, (int, float)) and exponent > 0 and float(exponent) == 2.0):
                return None
        elif name == "MulBackward0":
            if len(children) != 2 or children[0] is None or children[1] is None:
                return None
            if children[0] is not children[1]:  # (p - c) * (p - c) written twice: the same square
                leaf = self._sub_leaf(children[0])
                if leaf is None or leaf is not self._sub_leaf(children[1]):
                    return None
        elif not name.startswith(("AbsBackward", "NormBackward", "LinalgVectorNormBackward")):
            return None
        if not children or children[0] is None or type(children[0]).__name__ != "SubBackward0":
            return None
        sub = children[0]
        parts = [child for child, _ in sub.next_functions]
        graphed = [part for part in parts if part is not None]
        if len(parts) != 2 or len(graphed) != 1:
            return None  # p - c or c - p: the anchor has no graph
        pid = self._pid(_leaf(graphed[0]))
        if pid is None:
            return None
        return pid, saved(node, "_saved_self"), _leaf(graphed[0])

    @staticmethod
    def _sub_leaf(node):
        """The leaf tensor of ``p - c`` / ``c - p`` (``c`` without a graph), or None."""
        if node is None or type(node).__name__ != "SubBackward0":
            return None
        graphed = [child for child, _ in node.next_functions if child is not None]
        return _leaf(graphed[0]) if len(node.next_functions) == 2 and len(graphed) == 1 else None

    def _judge(self, root) -> None:
        same: list[int] = []
        # the graph's nodes level by level in C (the first _NODES), then only the nodes of the
        # classes this looks into (a p - p, a difference test's): no Python per other node
        nodes, _ = nodes_below([root], _NODES)
        for node in compress(nodes, map(_looked_into, map(type, nodes))):
            children = [child for child, _ in node.next_functions]
            name = type(node).__name__
            if name == "SubBackward0":
                if len(children) == 2 and children[0] is not None and children[0] is children[1]:
                    pid = self._pid(_leaf(children[0]))
                    if pid is not None and pid not in same:
                        same.append(pid)
                continue
            found = self._difference(node, name, children)
            if found is not None and self._steps > 0:
                pid, kept, _variable = found
                if isinstance(kept, tuple):
                    a, b = kept
                    zero = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) \
                        and a.shape == b.shape and bool(torch.equal(a, b))
                elif isinstance(kept, torch.Tensor):
                    zero = not bool(kept.any())
                else:
                    continue
                if zero:
                    if self._counted.get(pid, -1) < self._steps:  # once per step in between
                        self._counted[pid] = self._steps
                        self._moved_too(pid, found[2])
                else:
                    self._moved.add(pid)
        if same:
            self._tell(sorted(same), "same")
            return
        shared = sorted(pid for pid, n in self._zeros.items() if n >= _ZEROS and pid not in self._moved)
        if shared:
            self._tell(shared, "shared")

    def _moved_too(self, pid: int, variable) -> None:
        """A zero difference counts when the parameter itself moved since the last one (a few of
        its values differ): a parameter the optimizer leaves as it is (lr 0, no gradient) keeps
        a copied anchor's difference at 0 too."""
        values = variable.detach().reshape(-1)[:16].clone()
        before = self._prints.get(pid)
        self._prints[pid] = values
        if before is None:
            self._zeros.setdefault(pid, 0)
            return
        if not torch.equal(before, values):
            self._zeros[pid] = self._zeros.get(pid, 0) + 1

    def _tell(self, pids, how: str) -> None:
        self._told = True
        self.rec.emit_aside(ev.anchor_alias(params=list(pids)[:64], how=how), self.rec.here())

    def install(self, patcher) -> None:
        pass
