"""Token targets that are the recurrent model's own input ids, position for position: a language
model trained to copy the token it reads instead of predicting the next one.

``target-visible-to-model``'s dependency probe (dependency.py) reads batch-first models the
script trains with an optimizer. A word-level language model over ``batchify``'d data
(pytorch/examples: ``(T, B)`` tensors, seq-first) trained by a hand-written update is not
probed; there ``get_batch`` returning ``source[i:i + n]`` for both the inputs and the targets
(the ``+ 1`` of the targets' slice dropped) trains each position to output the token it reads.

How it is seen: at the first ``_LOOKED`` backwards of each backward line (``describe_loss``),
the loss's graph is walked (``_NODES`` nodes) to each ``NllLossBackward0`` (``nll_loss``, and
``cross_entropy``'s), whose saved target (CPU integer ids, ``_MIN_POSITIONS`` or more) is
compared with the ids every ``EmbeddingBackward0`` below it saved: equal at 99 % of the positions
the loss does not ignore (the same order, the same count), when the ids hold 3 values or more,
no lookup below the loss holds the targets one position later (a decoder fed the shifted
targets: an autoencoder's encoder reads the targets too), and a recurrent layer's node
(``MkldnnRnnLayerBackward0``, the cuDNN/fused RNN nodes) lies between them. One
``token_copy`` aside event per backward line (loc: the backward). The rule asks the script's
source that the recurrent layer is unidirectional.

Cost: a walk of the loss's graph and a comparison per embedding lookup, at the first backwards
of each line only; CPU tensors only.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import saved
from .lossterms import PerLine, loss_roots
from .recorder import Recorder

_LOOKED = 3  # backwards of each line looked at
_LINES = 16  # backward lines looked at, at most
_NODES = 4096  # nodes of the loss's graph walked
_MIN_POSITIONS = 16  # targets compared, at least
_SAME = 0.99  # share of the positions where the target is the id read there
_NEXT = 0.9  # share of the positions where the target is the id read one position later
_RECURRENT = ("MkldnnRnnLayerBackward", "CudnnRnnBackward", "MiopenRnnBackward", "RnnTanhBackward",
              "RnnReluBackward", "LstmCellBackward", "GruCellBackward", "ThnnFusedLstmCellBackward",
              "ThnnFusedGruCellBackward")


def nll_nodes(tensors, limit: int = _NODES) -> list | None:
    """The ``NllLossBackward0`` nodes of the loss's graph (``nll_loss``, and ``cross_entropy``
    over log_softmax), or None when the graph has more than ``limit`` nodes."""
    stack, seen, losses = list(loss_roots(tensors)), set(), []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if len(seen) > limit:
            return None
        if type(node).__name__ == "NllLossBackward0":
            losses.append(node)
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return losses


def token_ids(value) -> torch.Tensor | None:
    """``value`` when it is a CPU tensor of integer ids, else None."""
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu" \
            or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        return None
    return value


def _share(a: torch.Tensor, b: torch.Tensor, keep: torch.Tensor) -> float:
    count = int(keep.sum())
    return float(((a == b) & keep).sum()) / count if count else 0.0


def shifted_by_one(ids: torch.Tensor, target: torch.Tensor, ignore: int) -> bool:
    """Whether the target at each position is the id one position later, seq-first (``(T,
    B)``: along dim 0) or batch-first (along dim 1)."""
    if ids.dim() != 2 or ids.numel() != target.numel():
        return False
    t = target.reshape(ids.shape)
    for dim in (0, 1):
        if ids.shape[dim] < 2:
            continue
        a = t.narrow(dim, 0, ids.shape[dim] - 1)
        b = ids.narrow(dim, 1, ids.shape[dim] - 1)
        if _share(a, b, a != ignore) >= _NEXT:
            return True
    return False


def copies_input(lookups: list, target: torch.Tensor, ignore: int) -> bool:
    """Whether one lookup's ids are the target, position for position, and none holds the
    target one position later."""
    flat = target.reshape(-1)
    keep = flat != ignore
    if int(keep.sum()) < _MIN_POSITIONS:
        return False
    same = False
    for ids in lookups:
        if shifted_by_one(ids, target, ignore):
            return False
        if ids.numel() == flat.numel() and torch.unique(ids).numel() >= 3 \
                and _share(ids.reshape(-1), flat, keep) >= _SAME:
            same = True
    return same


class TokenCopyWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._lines = PerLine(_LOOKED, _LINES)
        self._told: set = set()

    def describe_loss(self, tensors) -> dict:
        if self._lines.exhausted:
            return {}
        try:
            loc = self.rec.here()
            if loc not in self._told and self._lines.admit(loc):
                self._judge(tensors, loc)
        except Exception as exc:
            self.rec.internal_error("token_copy", exc)
        return {}

    def _judge(self, tensors, loc) -> None:
        losses = nll_nodes(tensors)
        if losses is None:
            return
        for node in losses:
            target = token_ids(saved(node, "_saved_target"))
            ignore = saved(node, "_saved_ignore_index", -100)
            if target is None or target.numel() < _MIN_POSITIONS or not isinstance(ignore, int):
                continue
            lookups, recurrent = self._below(node)
            if recurrent and lookups and copies_input(lookups, target, ignore):
                self._told.add(loc)
                self.rec.emit_aside(ev.token_copy(positions=int(target.numel()),
                                                  lookups=len(lookups)), loc)
                return

    @staticmethod
    def _below(root) -> tuple[list, bool]:
        stack, seen, lookups, recurrent = [root], set(), [], False
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if len(seen) > _NODES:
                break
            name = type(node).__name__
            if name.startswith(_RECURRENT):
                recurrent = True
            elif name == "EmbeddingBackward0":
                ids = token_ids(saved(node, "_saved_indices"))
                if ids is not None:
                    lookups.append(ids)
            stack.extend(child for child, _ in node.next_functions if child is not None)
        return lookups, recurrent

    def install(self, patcher) -> None:
        """Nothing to patch: the loss's graph is read at the backward (DESCRIBE_LOSS)."""
