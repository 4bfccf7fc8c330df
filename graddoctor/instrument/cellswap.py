"""A dense prediction map read at the transposed cells of the positives its own loss marks
(cells-read-transposed).

A centre-matched detector (FCOS, CenterNet, YOLO's grid) marks each object's cell in a
classification target, ``obj[b, gy, gx] = 1``, and reads the box regression at the same cells,
``reg_map[b, :, gy, gx]``. Written ``reg_map[b, :, gx, gy]``, the regression is read at the
mirrored cell: on a square grid nothing fails, the box loss trains the outputs of cells that
hold no object, and the boxes the detector predicts at its positives never learn.

How it is seen: at the first ``_WINDOWS`` backwards (``DESCRIBE_LOSS``), the loss's graph is
walked (at most ``_NODES`` nodes) for the binary cross-entropy targets (``_saved_target`` of
``binary_cross_entropy[_with_logits]``: (N, H, W), or (N, C, H, W) / (N, H, W, C) with the
classes folded) and for advanced indexings (``IndexBackward0``) of a map of the same batch and
last two sizes by three index tensors (batch, row, column; a slice between them allowed). The
cells it reads (swapped back when the indexed map is that map with its last two axes
transposed) are compared with the target's positive cells: read at none or few of them
(``_INSIDE`` at most) but every one of them a positive once row and column are swapped, and
off the diagonal, and no other target of the loss marking them, one ``cells_transposed`` aside event per indexed shape (loc: the backward's
line; the rule finds the subscript in the source).

Silent: cells read where the target marks them; a map transposed before it is read
(``reg.permute(0, 1, 3, 2)[b, :, gx, gy]``); reads through a boolean mask; cells on the
diagonal only (a transposition moves nothing).
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import post_order, saved, signed
from .losswindow import LossWindow
from .recorder import Recorder

_WINDOWS = 3  # backwards whose losses are looked at
_NODES = 20000  # graph nodes walked per backward
_INSIDE = 0.5  # share of the read cells that are positives at or under which a read is off
_CELLS = 65536  # positive cells a target may mark to be compared (sets of Python tuples)
_TARGETS = ("BinaryCrossEntropyWithLogitsBackward0", "BinaryCrossEntropyBackward0")


def _positives(target: torch.Tensor, n: int, h: int, w: int) -> set | None:
    """The (batch, row, column) cells a binary target marks, its classes folded; None when its
    shape is not the map's."""
    shape = tuple(target.shape)
    hot = target >= 0.5
    if shape == (n, h, w):
        cells = hot
    elif len(shape) == 4 and shape[0] == n and shape[2:] == (h, w):
        cells = hot.any(1)
    elif len(shape) == 4 and shape[0] == n and shape[1:3] == (h, w):
        cells = hot.any(3)
    else:
        return None
    if int(cells.sum()) > _CELLS:
        return None  # a dense mask, not matched centres
    return {tuple(int(v) for v in row) for row in cells.nonzero().tolist()}


def _transposed_last_two(node, k: int) -> bool | None:
    """Whether the indexed tensor is its input with the last two axes swapped (True), the input
    itself (False), or another permutation (None)."""
    name = type(node).__name__ if node is not None else ""
    if name == "PermuteBackward0":
        dims = tuple(signed(d) % k for d in (saved(node, "_saved_dims") or ()))
        if dims == tuple(range(k)):
            return False
        if dims == tuple(range(k - 2)) + (k - 1, k - 2):
            return True
        return None
    if name == "TransposeBackward0":
        d0, d1 = saved(node, "_saved_dim0"), saved(node, "_saved_dim1")
        if not isinstance(d0, int) or not isinstance(d1, int):
            return None
        pair = {signed(d0) % k, signed(d1) % k}
        return True if pair == {k - 2, k - 1} else (False if len(pair) == 1 else None)
    return False


def read_cells(node) -> tuple[tuple, set] | None:
    """``(indexed sizes, cells)`` of an ``IndexBackward0`` that reads (batch, row, column) cells
    of a map with three index tensors, in the map's own layout; None otherwise."""
    indices = saved(node, "_saved_indices")
    sizes = saved(node, "_saved_self_sym_sizes")
    if not isinstance(indices, (tuple, list)) or not isinstance(sizes, (tuple, list)):
        return None
    try:
        sizes = tuple(int(s) for s in sizes)
    except (TypeError, ValueError):
        return None
    k = len(sizes)
    if k < 3 or len(indices) != k:
        return None
    batch, rows, cols = indices[0], indices[k - 2], indices[k - 1]
    tensors = (batch, rows, cols)
    if not all(isinstance(t, torch.Tensor) and not t.is_floating_point() and t.dtype != torch.bool
               and not t.is_cuda for t in tensors):
        return None
    if any(t is not None for t in indices[1:k - 2]):
        return None  # only slices between the batch and the two spatial axes
    try:
        b, r, c = torch.broadcast_tensors(batch, rows, cols)
    except RuntimeError:
        return None
    if b.numel() > _CELLS:
        return None
    parents = [n for n, _ in node.next_functions if n is not None]
    swapped = _transposed_last_two(parents[0], k) if parents else False
    if swapped is None:
        return None
    if swapped:
        r, c = c, r
        sizes = sizes[:-2] + (sizes[-1], sizes[-2])
    cells = set(zip(b.reshape(-1).tolist(), r.reshape(-1).tolist(), c.reshape(-1).tolist()))
    return sizes, cells


class CellSwapWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.loss_window = LossWindow(rec, _WINDOWS, self.describe_loss)
        self._told: set = set()

    def install(self, patcher) -> None:
        """Nothing to patch: the graph is read at the first backwards."""

    def describe_loss(self, tensors) -> dict:
        if not self.loss_window.take():
            return {}
        try:
            self._look(tensors)
        except Exception as exc:
            self.rec.internal_error("cells read against the positives", exc)
        return {}

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        loc = None
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            nodes = post_order(root, _NODES) or ()
            targets = []
            for node in nodes:
                if type(node).__name__ in _TARGETS:
                    target = saved(node, "_saved_target")
                    if isinstance(target, torch.Tensor) and not target.is_cuda and target.dim() >= 3:
                        targets.append(target.detach())
            if not targets:
                continue
            for node in nodes:
                if type(node).__name__ != "IndexBackward0":
                    continue
                read = read_cells(node)
                if read is None:
                    continue
                sizes, cells = read
                off_diagonal = {cell for cell in cells if cell[1] != cell[2]}
                if len(off_diagonal) < 2:
                    continue
                marked = [p for p in (_positives(t, sizes[0], sizes[-2], sizes[-1])
                                      for t in targets) if p]
                if not marked or any(len(cells & p) > _INSIDE * len(cells) for p in marked):
                    continue  # read where some target marks its positives
                mirrored = {(b, c, r) for b, r, c in cells}
                positives = next((p for p in marked if mirrored <= p), None)
                if positives is None or sizes in self._told:
                    continue
                self._told.add(sizes)
                if loc is None:
                    loc = self.rec.here()
                self.rec.emit_aside(ev.cells_transposed(
                    shape=list(sizes), cells=len(cells), inside=len(cells & positives),
                    positives=len(positives)), loc)
