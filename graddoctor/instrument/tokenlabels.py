"""Token-classification labels laid one position off the tokens they label: the label list built
without the slot of the sequence's [CLS] (``word_ids`` missing its leading None), or with one slot
too many, so every label sits on its neighbour's token.

How it is seen: at the first ``_LOOKED`` backwards of each backward line (``describe_loss``), the
loss's graph is walked (``_NODES`` nodes) to each ``NllLossBackward0`` over 2-D scores (``(N,
C)``: ``cross_entropy``'s and ``nll_loss``'s) whose saved integer target (CPU) has as many
elements as the ids an ``EmbeddingBackward0`` below it saved, a right-padded batch-first
``(B, T)`` batch of ``_MIN_ROWS`` rows or more with fewer classes than the embedding has rows (a
tagger, not a language model). The padding (the embedding's ``padding_idx``, else the id that
fills the ends of two rows or more) must be ignored by the loss at every padded position (the
labels are laid out on the ids), and no lookup below may hold the targets one position later (a
decoder fed its shifted targets). Then the first column, and each row's last real position,
are looked at: one id in every row there (a [CLS] / [SEP]), yet the loss counts a target at
``_COUNTED`` of the rows, with two values or more among them: a label that changes from row to
row on a token that never does is the neighbouring word's. One ``token_labels_shifted`` aside
event per backward line (loc: the backward).

Cost: a walk of the loss's graph and a few small reductions per candidate lookup, at the first
backwards of each line only; CPU tensors only.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import saved, signed
from .lossterms import PerLine
from .recorder import Recorder
from .tokencopy import nll_nodes, shifted_by_one, token_ids

_LOOKED = 3  # backwards of each line looked at
_LINES = 16  # backward lines looked at, at most
_NODES = 4096  # nodes of the loss's graph walked
_MIN_ROWS = 4  # rows of the batch, at least
_COUNTED = 0.9  # share of the rows whose target at the constant token is counted


def _pad_id(ids: torch.Tensor, padding_idx) -> int | None:
    """The padding id: the embedding's padding_idx, else the id that ends two rows or more
    where other rows end in another id (a right-padded batch)."""
    if isinstance(padding_idx, int) and padding_idx >= 0:
        return padding_idx
    last = ids[:, -1]
    values, counts = torch.unique(last, return_counts=True)
    best = int(counts.argmax())
    if int(counts[best]) < 2:
        return None
    return int(values[best])


def real_lengths(ids: torch.Tensor, pad: int) -> torch.Tensor:
    """Each row's length before its trailing run of ``pad``."""
    trailing = (ids == pad).flip(1).long().cumprod(1).sum(1)
    return ids.shape[1] - trailing


def shifted_end(ids: torch.Tensor, target: torch.Tensor, ignore: int, padding_idx=None) -> tuple | None:
    """``(end, rows, values)`` where a right-padded (B, T) batch holds one id in every row at
    its first position (end "first") or its last real one ("last") while the target there is
    counted in nearly every row and varies; None otherwise (also where the padding is not
    ignored, or no row is padded: the labels are not laid out on these ids)."""
    if ids.dim() != 2 or ids.shape[0] < _MIN_ROWS or ids.shape[1] < 3 or target.numel() != ids.numel():
        return None
    pad = _pad_id(ids, padding_idx)
    if pad is None:
        return None
    t = target.reshape(ids.shape)
    lengths = real_lengths(ids, pad)
    if int((lengths < ids.shape[1]).sum()) < 2 or int(lengths.min()) < 2:
        return None
    padded = torch.arange(ids.shape[1]).unsqueeze(0) >= lengths.unsqueeze(1)
    if not bool((t[padded] == ignore).all()):
        return None
    rows = torch.arange(ids.shape[0])
    for end, column in (("first", torch.zeros_like(lengths)), ("last", lengths - 1)):
        tokens, labels = ids[rows, column], t[rows, column]
        if not bool((tokens == tokens[0]).all()):
            continue
        counted = labels[labels != ignore]
        if counted.numel() >= _COUNTED * ids.shape[0] and torch.unique(counted).numel() >= 2:
            return end, int(ids.shape[0]), int(torch.unique(counted).numel())
    return None


class TokenLabelsWatcher:
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
            self.rec.internal_error("token_labels_shifted", exc)
        return {}

    def _judge(self, tensors, loc) -> None:
        losses = nll_nodes(tensors, _NODES)
        if losses is None:
            return
        for node in losses:
            target = token_ids(saved(node, "_saved_target"))
            scores = saved(node, "_saved_self")
            ignore = saved(node, "_saved_ignore_index", -100)
            if target is None or not isinstance(scores, torch.Tensor) or scores.dim() != 2 \
                    or not isinstance(ignore, int):
                continue
            ignore = signed(ignore)  # read back unsigned: -100 as 2 ** 64 - 100
            classes = int(scores.shape[1])
            lookups = self._below(node)
            if any(shifted_by_one(ids, target, ignore) for ids, _, _ in lookups):
                continue
            for ids, rows, padding_idx in lookups:
                if not isinstance(rows, int) or classes >= rows:
                    continue
                found = shifted_end(ids, target, ignore, padding_idx)
                if found is not None:
                    self._told.add(loc)
                    end, batch, values = found
                    self.rec.emit_aside(ev.token_labels_shifted(end=end, rows=batch, values=values,
                                                                classes=classes, vocab=rows), loc)
                    return

    @staticmethod
    def _below(root) -> list:
        """The (ids, embedding rows, padding_idx) of the lookups below the loss."""
        stack, seen, lookups = [root], set(), []
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if len(seen) > _NODES:
                break
            if type(node).__name__ == "EmbeddingBackward0":
                ids = token_ids(saved(node, "_saved_indices"))
                if ids is not None:
                    lookups.append((ids, saved(node, "_saved_weight_sym_argsize_0"),
                                    saved(node, "_saved_padding_idx")))
            stack.extend(child for child, _ in node.next_functions if child is not None)
        return lookups

    def install(self, patcher) -> None:
        """Nothing to patch: the loss's graph is read at the backward (DESCRIBE_LOSS)."""
