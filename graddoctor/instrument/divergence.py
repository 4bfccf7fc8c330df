"""Updates that diverge: an optimizer whose total gradient norm grows several-fold from one
update to the next, over consecutive updates.

The optimizer watcher hands each measured update's per-parameter norms to ``Divergence.observe``
(its full path and its straight-line path alike), which keeps, per optimizer, the run of
consecutive updates whose total norm (``math.hypot`` of the norms, in C) grew ``GROWTH``-fold
or more each. One ``diverging`` aside event per optimizer records the run when it becomes
evidence — ``RUN`` such updates and ``TOTAL``-fold in all, or a non-finite norm right after two
or more (the NaN that divergence explains) — so the rules see it however the trace is folded
later (folded turns keep no norms). Cost per measured update: one call, one ``hypot`` and a few
comparisons; nothing once the optimizer's event is recorded. A skimmed update (no norms read)
breaks any run: the first of a stretch of them is told (``skim``), the others are counted from
``Progress.stepped`` when the optimizer's next update is observed (``observe``) or a closure
step of it begins (``settle``), so the updates keep their numbers.
"""

from __future__ import annotations

import math

from .. import events as ev
from .recorder import Recorder

GROWTH = 3.0  # a diverging update's total norm is at least this multiple of the one before
RUN = 3  # consecutive diverging updates
TOTAL = 1e3  # and this much growth over them in all


class Divergence:
    def __init__(self, rec: Recorder):
        self.rec = rec
        # opt -> [updates seen, last total, run start's total, run start's update, run length]
        self._state: dict[int, list] = {}
        self._done: set[int] = set()
        # the optimizers in a stretch of skimmed updates (the optimizer watcher tells only the
        # first of each stretch) -> their step count (Progress.stepped) before its first
        self.skimming: dict[int, int] = {}

    def skim(self, opt: int) -> None:
        """The first skimmed update of ``opt`` in a row (its norms not read): no run of growth
        spans it; the ones after it are counted when the stretch ends (``settle``)."""
        self.skimming[opt] = self.rec.progress.stepped(opt)
        self.observe(opt, None, settled=True)

    def settle(self, opt: int) -> None:
        """A step of ``opt`` that is not skimmed begins: the skimmed updates since ``skim``
        counted (each one's step was counted since, by the optimizer watcher's post hooks)."""
        since = self.skimming.pop(opt, None)
        if since is None:
            return
        state = self._state.get(opt)
        if state is not None:
            state[0] += self.rec.progress.stepped(opt) - since - 1  # the first is counted

    def observe(self, opt: int, norms, settled: bool = False) -> None:
        """One update of ``opt`` with these per-parameter norms (None: not measured)."""
        if not settled and self.skimming:
            self.settle(opt)
        if opt in self._done:
            return
        state = self._state.get(opt)
        if state is None:
            state = self._state[opt] = [0, None, None, 0, 0]
        state[0] += 1
        total = math.hypot(*norms) if norms else None
        last = state[1]
        if total is None or not math.isfinite(total):
            if total is not None and state[4] >= 2:  # a NaN/Inf after a diverging run
                self._emit(opt, state, last, nonfinite=True)
            state[1], state[4] = None, 0
            return
        if last is not None and last > 0 and total >= GROWTH * last:
            if state[4] == 0:
                state[2], state[3] = last, state[0] - 1
            state[4] += 1
            if state[4] >= RUN and total >= TOTAL * state[2]:
                self._emit(opt, state, total, nonfinite=False)
        else:
            state[4] = 0
        state[1] = total

    def _emit(self, opt: int, state: list, total: float, nonfinite: bool) -> None:
        self._done.add(opt)
        first, updates = state[2], state[4]
        rec = self.rec
        rec.emit_aside(ev.diverging(opt=opt, first=state[3], last=state[3] + updates,
                                    norms=[first, total],
                                    factor=(total / first) ** (1 / updates),
                                    nonfinite=nonfinite), None)
