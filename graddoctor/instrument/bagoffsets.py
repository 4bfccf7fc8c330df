"""``F.embedding_bag`` offsets that are no running start positions (bag-offsets-not-cumulative).

An ``nn.EmbeddingBag`` (a recommender's history, a bag of words) reads a flat 1-D input and the
start of each bag in it: ``offsets[i]`` is where bag ``i`` begins, so the offsets are the
exclusive running sum of the bag lengths, starting at 0 and never decreasing. Written as the
lengths themselves (``cat([0], lengths[:-1])``), or as an inclusive running sum shifted wrong,
the bags read other rows' items: a start that goes back makes torch read an empty bag there (no
error on CPU), the last bag swallows the rest of the input, and every row's pooled embedding
is some other mixture of items. Nothing raises and the loss still falls.

What is judged: the first ``_CALLS`` calls of ``F.embedding_bag`` under grad mode from the script's
thread with a 1-D CPU input and 1-D CPU offsets (``nn.EmbeddingBag`` calls it): ``decreasing``,
the offsets go down somewhere; ``empty``, with ``_MIN_BAGS`` bags or more, at least ``_EMPTY``
of them are empty after the first bag that holds items (leading empty bags are rows without
items under a correct running sum) while the last one holds ``_SWALLOW`` of the input or more. One ``bag_offsets``
aside event per call line (loc: the user's line of the call).

Silent: offsets from an exclusive cumulative sum (``F.pad(lengths.cumsum(0)[:-1], (1, 0))``),
bags of one length (``arange(B) * L``), a few empty bags, empty bags that lead the batch
(``[0, 0, 0, 0, 0, 1, 3]``: rows without items first), 2-D inputs (no offsets).

Cost: ``F.embedding_bag`` wrapped until ``_CALLS`` calls have been judged or ``WINDOW`` backwards
have run, then put back.
"""

from __future__ import annotations

from threading import get_ident

import torch
import torch.nn.functional as F

from .. import events as ev
from .inlinable import watched
from .patcher import put_back
from .recorder import Recorder
from .topics import DESCRIBE_LOSS

WINDOW = 3  # backwards after which the wrapper is put back
_CALLS = 8  # calls judged, at most
_MIN_BAGS = 4  # bags an "empty" fault needs, at least
_EMPTY = 0.5  # share of empty bags for "empty"
_SWALLOW = 0.5  # share of the input the last bag holds for "empty"


def judge_offsets(input: torch.Tensor, offsets: torch.Tensor) -> dict | None:
    """The offsets' fault (the event's data but its location fields), or None."""
    if not isinstance(offsets, torch.Tensor) or not isinstance(input, torch.Tensor):
        return None
    if input.dim() != 1 or offsets.dim() != 1 or offsets.numel() < 2 or offsets.is_floating_point() \
            or input.device.type != "cpu" or offsets.device.type != "cpu":
        return None
    n = int(input.numel())
    o = offsets.detach().to(torch.int64)
    ends = torch.cat([o[1:], torch.tensor([n])])
    sizes = ends - o
    bags = int(o.numel())
    drops = int((sizes < 0).sum())
    if drops:
        how = "decreasing"
    else:
        # the bags left empty after the first that holds items: lengths given for offsets empty
        # the bags between two equal lengths, while a correct running sum starting with rows
        # that have no items (users without history) leaves its leading bags empty
        filled = (sizes > 0).nonzero()
        first = int(filled[0]) if filled.numel() else bags
        empty = int((sizes[first:] == 0).sum())
        if bags < _MIN_BAGS or empty < _EMPTY * bags or int(sizes[-1]) < _SWALLOW * n:
            return None
        how = "empty"
    return {"how": how, "bags": bags, "items": n, "drops": drops,
            "empty": int((sizes <= 0).sum()), "last": int(max(int(sizes[-1]), 0))}


class BagOffsetsWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._open = True
        self._calls = 0
        self._backwards = 0
        self._told: set = set()
        self._restore: list = []

    def install(self, patcher) -> None:
        original = getattr(F, "embedding_bag", None)
        if original is None:
            return
        wrapper = patcher.patch(F, "embedding_bag", watched(original, self._before))
        self._restore.append((F, "embedding_bag", original, wrapper))

    def _before(self, args, kwargs) -> None:
        if not self._open or not torch.is_grad_enabled() or get_ident() != self.rec.script_thread:
            return
        try:
            input = args[0] if args else kwargs.get("input")
            offsets = args[2] if len(args) > 2 else kwargs.get("offsets")
            if offsets is None:
                return
            self._calls += 1
            if self._calls > _CALLS:
                self._close()
                return
            found = judge_offsets(input, offsets)
            if found is None:
                return
            loc = self.rec.here()
            if loc in self._told:
                return
            self._told.add(loc)
            self.rec.emit_aside(ev.bag_offsets(**found), loc)
        except Exception as exc:
            self._close()
            self.rec.internal_error("bag offsets", exc)

    def describe_loss(self, tensors) -> dict:
        """``DESCRIBE_LOSS``: the wrapper is put back after ``WINDOW`` backwards."""
        self._backwards += 1
        if self._open and self._backwards >= WINDOW:
            self._close()
        return {}

    def _close(self) -> None:
        if not self._open:
            return
        self._open = False
        self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
        for owner, name, original, wrapper in self._restore:
            try:
                put_back(owner, name, original, wrapper)
            except Exception as exc:
                self.rec.internal_error("bag offsets", exc)
