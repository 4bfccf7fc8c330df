"""A masked model's unshuffle that does not put the kept tokens back where they were taken from
(``restore-not-inverse``).

MAE-style random masking keeps ``k`` of ``L`` tokens per row by a gather with the first ``k``
entries of a random permutation (``ids_keep = ids_shuffle[:, :k]``), runs the encoder on them,
appends ``L - k`` mask tokens (``torch.cat([x, mask_tokens], dim=1)``) and gathers that back
into the original order with the inverse permutation (``ids_restore = argsort(ids_shuffle)``).
Written with the forward permutation instead (``ids_restore = ids_shuffle``, ``argsort(noise)``
again), the decoder gets each kept token at another position than the one it came from, its
positional embedding lies about every token, and the reconstruction loss still falls.

What the run shows, with no name read: at the first ``_LOOKED`` backwards of each backward line
the loss's graph is walked (``_NODES`` nodes) to each ``GatherBackward0`` along dim 1 whose
index is, in every row, a permutation of ``0..L-1`` and whose input is a ``CatBackward0`` along
dim 1; below the cat's first part (within ``_BELOW`` nodes) a ``GatherBackward0`` along dim 1
picked ``k < L`` distinct positions per row of as many rows. The unshuffle is right when it puts
the ``j``-th kept token at the position it was picked from (``restore[r, keep[r, j]] == j``);
one ``unshuffle_misplaced`` aside event (loc: the backward) when that holds for fewer than
``_PLACED`` of the kept tokens. Cost: a walk of the loss's graph at the first backwards of each
line among the run's first ``_WINDOW`` backwards (and a later phase's, ``LossWindow``), and a
comparison of two index tensors; CPU indices only; nothing after them.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import saved, signed
from .losswindow import LossWindow
from .lossterms import PerLine, loss_roots
from .recorder import Recorder

_LOOKED = 2  # backwards of each line looked at
_WINDOW = 8  # backwards of the run (and of each later phase) looked at, all lines together
_LINES = 8  # backward lines looked at, at most
_NODES = 4096  # nodes of the loss's graph walked
_BELOW = 4096  # nodes walked below the cat for the gather that kept the tokens
_PLACED = 0.5  # share of the kept tokens put back where they were taken from, at least


def _index(node, ndim_min: int = 2) -> tuple[torch.Tensor, int] | None:
    """A gather node's index as (rows, positions) and its dim, for a CPU integer index gathered
    along dim 1 (a trailing feature axis expanded: its first column)."""
    index = saved(node, "_saved_index")
    dim = saved(node, "_saved_dim")
    if not isinstance(index, torch.Tensor) or not isinstance(dim, int) or index.device.type != "cpu" \
            or index.dim() < ndim_min or index.is_floating_point():
        return None
    dim = signed(dim) % index.dim()
    if dim != 1:
        return None
    flat = index.reshape(index.shape[0], index.shape[1], -1)[:, :, 0]
    return flat, dim


def _below(root, limit: int) -> list:
    stack, seen, order = [root], set(), []
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        order.append(node)
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return order


def misplaced(restore: torch.Tensor, keep: torch.Tensor) -> float | None:
    """The share of the kept tokens that ``restore`` (rows of permutations of ``0..L-1``) puts
    back at the position ``keep`` (rows of ``k < L`` distinct positions) took them from; None
    when the indices do not have those shapes."""
    rows, length = restore.shape
    if keep.shape[0] != rows or not 2 <= keep.shape[1] < length or rows < 1:
        return None
    order = torch.arange(length, dtype=restore.dtype)
    if not bool((restore.sort(dim=1).values == order).all()):
        return None
    if int(keep.min()) < 0 or int(keep.max()) >= length \
            or bool((keep.sort(dim=1).values[:, 1:] == keep.sort(dim=1).values[:, :-1]).any()):
        return None
    put = restore.gather(1, keep.to(restore.dtype))
    wanted = torch.arange(keep.shape[1], dtype=restore.dtype).expand_as(put)
    return float((put == wanted).float().mean())


class UnshuffleWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._lines = PerLine(_LOOKED, _LINES)
        self._told: set = set()
        # the first backwards of the run (and of each later phase), then off the topic: no call
        # per backward in the steady state
        self.loss_window = LossWindow(rec, _WINDOW, self.describe_loss)

    def describe_loss(self, tensors) -> dict:
        if not self.loss_window.take() or self._lines.exhausted:
            return {}
        try:
            loc = self.rec.here()
            if loc in self._told or not self._lines.admit(loc):
                return {}
            self._judge(tensors, loc)
        except Exception as exc:
            self.rec.internal_error("unshuffle", exc)
        return {}

    def _judge(self, tensors, loc) -> None:
        nodes = []
        for root in loss_roots(tensors):
            nodes.extend(_below(root, _NODES))
        for node in nodes:
            if type(node).__name__ != "GatherBackward0":
                continue
            outer = _index(node)
            child = node.next_functions[0][0] if node.next_functions else None
            if outer is None or type(child).__name__ != "CatBackward0" \
                    or signed(saved(child, "_saved_dim", 0)) % outer[0].dim() != 1 \
                    or not child.next_functions:
                continue
            restore = outer[0]
            for inner in _below(child.next_functions[0][0], _BELOW):
                if type(inner).__name__ != "GatherBackward0":
                    continue
                kept = _index(inner)
                if kept is None:
                    continue
                with torch.no_grad():
                    share = misplaced(restore, kept[0])
                if share is None:
                    continue
                if share < _PLACED:
                    self._told.add(loc)
                    self.rec.emit_aside(ev.unshuffle_misplaced(
                        rows=int(restore.shape[0]), length=int(restore.shape[1]),
                        kept=int(kept[0].shape[1]), placed=round(share, 4)), loc)
                    return
                break

    def install(self, patcher) -> None:
        """Nothing to patch: the loss's graph is read at the backward (DESCRIBE_LOSS)."""
