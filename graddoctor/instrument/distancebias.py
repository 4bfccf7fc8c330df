"""Causal attention that prefers the farthest keys at the first steps: a fixed distance bias
added with the wrong sign (attention-prefers-distant-keys).

ALiBi adds ``-m * (i - j)`` to the score of query ``i`` on key ``j``: a penalty that grows with
the distance, so each head looks mostly at recent tokens (BLOOM writes it ``m * j``, the same up
to a per-row constant). Written with the sign flipped (``m * (i - j)``, ``-m * j``,
``-(m * (j - i))``), the bias rewards distance: every head's weights grow toward the first
tokens, steeply for the heads with large slopes, and the model has to learn against its own
positional prior. Nothing fails; the loss falls, slower, and length extrapolation breaks.

How it is seen: at the first ``_WINDOWS`` backwards (``DESCRIBE_LOSS``), the loss's graph is
walked (at most ``_NODES`` nodes) for ``SoftmaxBackward0`` over the last axis of a square
(..., T, T) result, T >= ``_MIN_T``, with nothing above the diagonal (a causal mask), on the CPU.
Its saved weights are averaged over the batch (one (T, T) map per head): a head prefers the
distant keys when, in the rows of the second half (the query sees ``T / 2`` keys or more; key 0
left out, an attention sink may sit there), the weights rise with the distance (rank correlation
above ``_RISE``) and the farthest key kept holds twice the weight of the query's own position, in
``_ROWS`` of the rows. One aside ``distance_bias`` per softmax shape (loc: the backward's line;
the rule finds the bias in the source).

Silent: ALiBi with its penalty (weights falling with the distance), RoPE or learned positions
(no trend at the first steps), attention sinks on the first key, non-causal attention, heads
whose content scores dominate (the batch mean has no trend).
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import post_order, saved, saved_dims
from .losswindow import LossWindow
from .recorder import Recorder

_WINDOWS = 3
_NODES = 20000
_MIN_T = 8
_RISE = 0.9  # rank correlation of weight with distance, per row
_RATIO = 2.0  # farthest kept key against the query's own position
_ROWS = 0.9  # share of the judged rows
_JUDGED = 16  # rows judged per head
_HEADS = 64  # heads judged per map


def _ranks(x: torch.Tensor) -> torch.Tensor:
    return x.argsort(dim=-1).argsort(dim=-1).float()


def distant_heads(weights: torch.Tensor) -> tuple[list[int], float] | None:
    """The heads of a (H, T, T) batch-mean causal attention map whose rows prefer distant
    keys, and the median ratio of the farthest kept key's weight to the diagonal's."""
    H, T, _ = weights.shape
    flagged, ratios = [], []
    # at most _JUDGED rows of the second half, spread evenly: a long sequence costs no more
    judged = sorted({int(i) for i in torch.linspace(T // 2, T - 1, min(_JUDGED, T - T // 2))})
    for h in range(min(H, _HEADS)):
        good, rows = 0, 0
        for i in judged:
            keys = weights[h, i, 1:i + 1]  # keys 1..i, key 0 left out
            if keys.numel() < 3:
                continue
            rows += 1
            distance = torch.arange(i - 1, -1, -1, dtype=torch.float32)  # key j at distance i - j
            r = torch.corrcoef(torch.stack([_ranks(distance), _ranks(keys.float())]))[0, 1]
            diag = float(keys[-1])
            ratio = float(keys[0]) / diag if diag > 0 else float("inf")
            if bool(r > _RISE) and ratio > _RATIO:
                good += 1
                ratios.append(ratio)
        if rows and good >= _ROWS * rows:
            flagged.append(h)
    if not flagged:
        return None
    ratios.sort()
    return flagged, ratios[len(ratios) // 2]


class DistanceBiasWatcher:
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
            self.rec.internal_error("distance bias", exc)
        return {}

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        loc = None
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            for node in post_order(root, _NODES) or ():
                if type(node).__name__ != "SoftmaxBackward0":
                    continue
                result = saved(node, "_saved_result")
                if not isinstance(result, torch.Tensor) or result.device.type != "cpu" \
                        or result.dim() < 3 or not result.is_floating_point():
                    continue
                T = int(result.shape[-1])
                dim = saved_dims(node)
                if T < _MIN_T or int(result.shape[-2]) != T or dim not in (-1, result.dim() - 1):
                    continue
                key = tuple(result.shape)
                if key in self._told:
                    continue
                self._told.add(key)
                with torch.no_grad():
                    w = result.detach().float()
                    if bool(w.triu(1).abs().amax() > 0):
                        continue  # not causal
                    maps = w.mean(dim=0) if w.dim() >= 4 else w.mean(dim=0, keepdim=True)
                    maps = maps.reshape(-1, T, T)
                    found = distant_heads(maps)
                if found is None:
                    continue
                heads, ratio = found
                if loc is None:
                    loc = self.rec.here()
                self.rec.emit_aside(ev.distance_bias(shape=[int(s) for s in result.shape],
                                                     heads=heads, of=int(maps.shape[0]),
                                                     ratio=round(ratio, 2)), loc)
