"""What the script's own code does to the parameters between two optimizer steps: does it undo
the update the step just applied?

A script may edit its stepped parameters by hand between steps (an EMA, weight clipping, a
max-norm or unit-norm projection, Lookahead's pull toward its slow weights). Written the wrong
way, such an edit sets the parameters back to where they were: the trained model is overwritten
by its EMA copy (``p.lerp_(ema_p, 0.999)`` where ``ema_p.lerp_(p, 0.001)`` was meant), the
initial weights are copied back at the top of the loop, a projection maps every update back
onto the initial point. Edits through ``p.data`` move no version counter, so values are compared.

For each optimizer's first ``MEASURED`` updates (outermost, not closure steps, CPU parameters),
a strided sample of its parameters' values (``_SAMPLE`` elements of at most ``_TENSORS``
tensors, float64 copies) is taken before the step, after it, and before its next step: Δs, the
change the step made, and Δh, the change made by anything else before the next step. Once
measured ``MEASURED`` times, one ``step_edit`` event gives, per update: ``back``, the cosine
between Δh and -Δs (1: the edit takes the step back), ``share`` |Δh| / |Δs|, ``home``, the
cosine between Δh and the way back to the values before the first step, and ``home_share``,
|Δh| over the distance to them, and ``redrawn``, the parameters whose values the edit replaced
by values unrelated to them (a re-initialisation by hand, ``w.data.normal_()`` or ``b.data.zero_()``:
the cosine between a tensor's sample before and after the edit within ±``_UNRELATED``, the
edit at least as large as the step's change). Nothing is emitted when no edit changed anything. Once every
optimizer registered so far is done, the watcher leaves ``STEP_BEGINS`` and ``STEPPED`` until a
new optimizer is registered (``PARAMS_ADDED``).
"""

from __future__ import annotations

import math

import torch

from .. import events as ev
from .recorder import Recorder
from .topics import PARAMS_ADDED, STEP_BEGINS, STEPPED

MEASURED = 4  # updates measured per optimizer
_TENSORS = 16  # parameters sampled
_SAMPLE = 256  # elements of each (strided)
_UNRELATED = 0.3  # |cosine| of a tensor's values before and after an edit that replaced them


def _cos(a: torch.Tensor, b: torch.Tensor) -> float | None:
    scale = float(a.norm() * b.norm())
    return round(float(a @ b) / scale, 6) if scale > 0.0 else None


def _ratio(a: torch.Tensor, b: torch.Tensor) -> float | None:
    den = float(b.norm())
    return round(float(a.norm()) / den, 6) if den > 0.0 else None


class StepEditWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        # opt -> {"pids", "first", "pre", "post", "rows", "edited"}; None once done
        self._state: dict[int, dict | None] = {}
        rec.subscribe(STEP_BEGINS, self.before_step)
        rec.subscribe(STEPPED, self.after_step)
        rec.subscribe(PARAMS_ADDED, self.params_added)

    def install(self, patcher) -> None:  # subscribed at construction
        pass

    def params_added(self, opt: int, pids) -> None:
        """``PARAMS_ADDED``: an optimizer not measured yet: back on the step topics."""
        if self._state.get(opt, {}) is not None:
            self.rec.resume(STEP_BEGINS, self.before_step)
            self.rec.resume(STEPPED, self.after_step)

    def _retire_when_done(self, opt: int) -> None:
        state, rec = self._state, self.rec
        if opt in state and state[opt] is None \
                and all(state.get(other, {}) is None for other in rec.opt_params):
            rec.retire(STEP_BEGINS, self.before_step)  # every optimizer measured
            rec.retire(STEPPED, self.after_step)

    def _sample(self, pids, sizes: list | None = None) -> torch.Tensor | None:
        parts = []
        tensor = self.rec.tensor
        with torch.no_grad():
            for pid in pids:
                t = tensor(pid)
                if t is None:
                    return None  # a parameter gone: the samples no longer line up
                flat = t.detach().reshape(-1)
                stride = max(1, flat.numel() // _SAMPLE)
                parts.append(flat[::stride][:_SAMPLE].to(torch.float64, copy=True))
        if sizes is not None:
            sizes.extend(len(part) for part in parts)
        return torch.cat(parts) if parts else None

    @staticmethod
    def _redrawn(pids, sizes, post, now, step) -> list[int]:
        """The parameters whose sampled values the edit replaced by unrelated ones."""
        found, start = [], 0
        for pid, size in zip(pids, sizes):
            before, after = post[start:start + size], now[start:start + size]
            change = step[start:start + size]
            start += size
            edit, size_before = float((after - before).norm()), float(before.norm())
            # non-finite values (a NaN update) tell nothing of where the values came from
            if not (math.isfinite(edit) and math.isfinite(size_before)) or edit == 0.0 \
                    or edit < float(change.norm()) or size_before == 0.0:
                continue
            kept = _cos(before, after)
            if kept is None or abs(kept) < _UNRELATED:  # None: set to zero
                found.append(pid)
        return found

    def _pids(self, opt: int) -> list[int]:
        tensor = self.rec.tensor
        pids = []
        for pid in self.rec.opt_params.get(opt, ()):
            t = tensor(pid)
            if t is not None and t.device.type == "cpu" and t.is_floating_point() \
                    and t.layout == torch.strided and t.numel() > 0:
                pids.append(pid)
                if len(pids) >= _TENSORS:
                    break
        return pids

    def before_step(self, opt: int, optimizer) -> None:
        state = self._state.get(opt, {})
        if state is None:
            return
        try:
            if not state:
                pids = self._pids(opt)
                if not pids:
                    self._state[opt] = None
                    return
                sizes: list[int] = []
                now = self._sample(pids, sizes)
                if now is None:
                    self._state[opt] = None
                    return
                self._state[opt] = {"pids": pids, "sizes": sizes, "first": now, "pre": now,
                                    "post": None, "rows": [], "edited": False}
                return
            now = self._sample(state["pids"])
            if now is None:
                self._state[opt] = None
                return
            pre, post = state["pre"], state["post"]
            if post is not None:
                step = post - pre
                edit = now - post
                if bool(step.any()):
                    edited = bool(edit.any())
                    state["edited"] = state["edited"] or edited
                    home = state["first"] - post
                    state["rows"].append(
                        [self.rec.progress.steps, _cos(edit, -step) if edited else None,
                         _ratio(edit, step), _cos(edit, home) if edited else None,
                         _ratio(edit, home) if edited else None,
                         self._redrawn(state["pids"], state["sizes"], post, now, step)
                         if edited else []])
            state["pre"], state["post"] = now, None
            if len(state["rows"]) >= MEASURED:
                rows = state["rows"]
                self._state[opt] = None
                if state["edited"]:
                    self.rec.emit_aside(ev.step_edit(
                        opt=opt, steps=[r[0] for r in rows], back=[r[1] for r in rows],
                        share=[r[2] for r in rows], home=[r[3] for r in rows],
                        home_share=[r[4] for r in rows], redrawn=[r[5] for r in rows]),
                        self.rec.here(3))
        except Exception as exc:
            self._state[opt] = None
            self.rec.internal_error("step edits", exc)
        finally:
            self._retire_when_done(opt)

    def after_step(self, opt: int, optimizer) -> None:
        state = self._state.get(opt)
        if not state or state["pre"] is None:
            return
        try:
            state["post"] = self._sample(state["pids"])
            if state["post"] is None:
                self._state[opt] = None
        except Exception as exc:
            self._state[opt] = None
            self.rec.internal_error("step edits", exc)
        self._retire_when_done(opt)
