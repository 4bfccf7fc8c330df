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
source that the recurrent layer is unidirectional. A decoder unrolled by hand embeds one id per
row at each step: one table's lookups of equal size, in the order they ran, are stacked into a
``(B, T)`` (and a ``(T, B)``) lookup and compared the same way (``stepwise``: a decoder that
reads one token at a time is never bidirectional, whatever its encoder is).

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
            lookups, rows, recurrent, steps = self._below(node)
            if recurrent and lookups and copies_input(lookups, target, ignore):
                self._told.add(loc)
                self.rec.emit_aside(ev.token_copy(positions=int(target.numel()),
                                                  lookups=len(lookups)), loc)
                return
            # (torch's CPU GRU/LSTM cells may leave no recurrent node: the rule reads the source)
            if steps and copies_input([*steps, *lookups], target, ignore):
                self._told.add(loc)
                self.rec.emit_aside(ev.token_copy(positions=int(target.numel()),
                                                  lookups=len(lookups), stepwise=True), loc)
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
    def _below(root) -> tuple[list, list, bool, list]:
        """The ids of the embedding lookups below ``root``, their tables' rows, whether a
        recurrent layer lies between, and the lookups of a decoder unrolled step by step: one
        table's lookups of one id per row, in the order they ran, stacked batch-first and
        seq-first (a loop that embeds ``inp[:, t]`` at step t)."""
        stack, seen, lookups, rows, recurrent = [root], set(), [], [], False
        per_table: dict = {}  # the table's gradient node -> [(order, ids)] of 1-D lookups
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
                    table = node.next_functions[0][0] if node.next_functions else None
                    if ids.dim() == 1 and table is not None:
                        per_table.setdefault(table, []).append((node._sequence_nr(), ids))
            stack.extend(child for child, _ in node.next_functions if child is not None)
        steps = []
        for found in per_table.values():
            if len(found) >= 2 and len({ids.numel() for _, ids in found}) == 1:
                ordered = [ids for _, ids in sorted(found, key=lambda pair: pair[0])]
                steps += [torch.stack(ordered, dim=1), torch.stack(ordered, dim=0)]
        return lookups, rows, recurrent, steps

    def install(self, patcher) -> None:
        """Nothing to patch: the loss's graph is read at the backward (DESCRIBE_LOSS)."""
