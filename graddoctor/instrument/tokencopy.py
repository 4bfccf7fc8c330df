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

A decoder that runs its own loop over the steps (show-attend-tell's ``LSTMCell``, a GRU cell
fed one token a step) makes one ``(B,)`` lookup per step and no recurrent node: there the
lookups, as many as the target has columns, are each matched with a column of the targets
(``(B, steps)`` flattened row by row, or seq-first) at 99 % of its counted positions, every
lookup its own column. The start token's lookup matched too is the copy: a decoder fed the
previous token has the start token among its inputs and never among its targets
(``targets = caps[:, :-1]`` for ``caps[:, 1:]``). The event says ``stepwise``.

The same walk reads a masked language model whose mask id went into the labels instead of the
inputs (``labels[masked] = MASK`` for ``inputs[masked] = MASK``, or BERT's 80/10/10 replacement
written into the labels): the model is given every original token and asked for the mask id.
At the ``nll_loss`` of a token prediction over the input's own vocabulary (as many classes as
an embedding below it has rows), the counted targets that differ from the id that lookup read at
their position hold one id, ``_MASK_SHARE`` of the counted targets or more (at least
``_MASK_MIN``), that the lookup's ids never hold anywhere, on ``_SPREAD`` sequence positions or
more of two rows or more (a language model's end token sits where each row ends), over input
ids of 3 values or more there; and no lookup holds the other targets one position later (a
language model, a decoder fed its shifted targets). A ``masked_visible`` aside event (``by``:
``mask_id``) per backward line, for masked-target-visible, whatever the model's layers.

Cost: a walk of the loss's graph and a comparison per embedding lookup, at the first backwards
of each line only; CPU tensors only.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import saved, signed
from .lossterms import PerLine, loss_roots
from .recorder import Recorder

_LOOKED = 3  # backwards of each line looked at
_LINES = 16  # backward lines looked at, at most
_NODES = 4096  # nodes of the loss's graph walked
_MIN_POSITIONS = 16  # targets compared, at least
_SAME = 0.99  # share of the positions where the target is the id read there
_NEXT = 0.9  # share of the positions where the target is the id read one position later
_MASK_SHARE = 0.1  # share of the counted targets holding the one id the input never holds
_MASK_MIN = 8  # such targets, at least
_SPREAD = 3  # sequence positions they fall on, at least
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


def copies_stepwise(lookups: list, target: torch.Tensor, ignore: int) -> bool:
    """Whether a decoder loop's per-step lookups (one ``(B,)`` ids tensor per step, as many as
    the target has columns) are the target's columns, each lookup its own column: the start
    token's lookup too, which a decoder fed the previous token never has among its targets."""
    # (an encoder's (B, S) lookup of the source below the same loss is not a step)
    steps = [ids for ids in lookups if ids.dim() == 1]
    if len(steps) < 2:
        return False
    rows = steps[0].numel()
    if any(ids.numel() != rows for ids in steps) or target.numel() != rows * len(steps):
        return False
    if torch.unique(torch.stack(steps)).numel() < 3:
        return False
    flat = target.reshape(-1)
    if int((flat != ignore).sum()) < _MIN_POSITIONS:
        return False
    for cols in (target.reshape(rows, len(steps)), target.reshape(len(steps), rows).t()):
        keep = cols != ignore
        free = [c for c in range(len(steps)) if bool(keep[:, c].any())]
        matched = True
        for ids in steps:
            if bool((ids == ignore).all()):
                continue  # a step that reads padding only (past every row's end) judges nothing
            hit = next((c for c in free if _share(ids, cols[:, c], keep[:, c]) >= _SAME), None)
            if hit is None:
                matched = False
                break
            free.remove(hit)
        if matched:
            return True
    return False


def mask_id_in_labels(ids: torch.Tensor, lookups: list, target: torch.Tensor, ignore: int,
                      classes: int) -> dict | None:
    """The fields of a ``masked_visible`` event when the counted targets that differ from the
    ids ``ids`` (a lookup over a vocabulary of ``classes`` rows) read at their positions hold
    one id, often, spread over the positions, that ``ids`` never hold; None else."""
    if ids.dim() != 2 or ids.numel() != target.numel():
        return None
    flat, seen = target.reshape(-1), ids.reshape(-1)
    keep = flat != ignore
    counted = int(keep.sum())
    if counted < _MIN_POSITIONS:
        return None
    differ = keep & (seen != flat)
    if not bool(differ.any()):
        return None
    values, counts = torch.unique(flat[differ], return_counts=True)
    top = int(counts.argmax())
    mask_id, n = int(values[top]), int(counts[top])
    if n < _MASK_MIN or n < _MASK_SHARE * counted or not 0 <= mask_id < classes \
            or bool((seen == mask_id).any()):
        return None
    at = keep & (flat == mask_id)
    where = at.reshape(ids.shape).nonzero()
    if torch.unique(where[:, 1]).numel() < _SPREAD or torch.unique(where[:, 0]).numel() < 2 \
            or torch.unique(seen[at]).numel() < 3:
        return None
    rest = torch.where(at, torch.full_like(flat, ignore), flat).reshape(target.shape)
    if int((rest != ignore).sum()) >= _MIN_POSITIONS \
            and any(shifted_by_one(other, rest, ignore) for other in lookups):
        return None  # a language model's (or a decoder's) shifted targets beside an end token
    return {"how": "ignore_index" if counted < flat.numel() else "labels",
            "counted": counted / flat.numel(),
            "visible": float(((seen == flat) & keep).sum()) / counted,
            "hidden": n / counted, "by": "mask_id", "positions": int(flat.numel()), "features": 1,
            "normalised": False, "ignore_index": ignore if counted < flat.numel() else None,
            "mask_id": mask_id}


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
            ignore = signed(ignore)  # read back unsigned: -100 as 2 ** 64 - 100
            lookups, rows, recurrent = self._below(node)
            if recurrent and lookups and copies_input(lookups, target, ignore):
                self._told.add(loc)
                self.rec.emit_aside(ev.token_copy(positions=int(target.numel()),
                                                  lookups=len(lookups)), loc)
                return
            if lookups and copies_stepwise(lookups, target, ignore):
                self._told.add(loc)
                steps = sum(1 for ids in lookups if ids.dim() == 1)
                self.rec.emit_aside(ev.token_copy(positions=int(target.numel()),
                                                  lookups=steps, stepwise=True), loc)
                return
            scores = saved(node, "_saved_self")
            classes = int(scores.shape[-1]) if isinstance(scores, torch.Tensor) and scores.dim() == 2 else None
            for ids, size in zip(lookups, rows):
                found = mask_id_in_labels(ids, lookups, target, signed(ignore), classes) \
                    if classes is not None and size == classes else None
                if found is not None:
                    self._told.add(loc)
                    self.rec.emit_aside(ev.masked_visible(**found), loc)
                    return

    @staticmethod
    def _below(root) -> tuple[list, list, bool]:
        """The ids of the embedding lookups below ``root``, their tables' rows, and whether a
        recurrent layer lies between."""
        stack, seen, lookups, rows, recurrent = [root], set(), [], [], False
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
                    size = saved(node, "_saved_weight_sym_argsize_0")
                    rows.append(int(size) if isinstance(size, int) else None)
            stack.extend(child for child, _ in node.next_functions if child is not None)
        return lookups, rows, recurrent

    def install(self, patcher) -> None:
        """Nothing to patch: the loss's graph is read at the backward (DESCRIBE_LOSS)."""
