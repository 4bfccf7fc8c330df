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
|Δh| over the distance to them. Nothing is emitted when no edit changed anything. Once every
optimizer registered so far is done, the watcher leaves ``STEP_BEGINS`` and ``STEPPED`` until a
new optimizer is registered (``PARAMS_ADDED``).
"""

from __future__ import annotations

import torch

from .. import events as ev
from .recorder import Recorder
from .topics import PARAMS_ADDED, STEP_BEGINS, STEPPED

MEASURED = 4  # updates measured per optimizer
_TENSORS = 16  # parameters sampled
_SAMPLE = 256  # elements of each (strided)


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

    def _sample(self, pids) -> torch.Tensor | None:
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
        return torch.cat(parts) if parts else None

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
                now = self._sample(pids)
                if now is None:
                    self._state[opt] = None
                    return
                self._state[opt] = {"pids": pids, "first": now, "pre": now, "post": None,
                                    "rows": [], "edited": False}
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
                         _ratio(edit, home) if edited else None])
            state["pre"], state["post"] = now, None
            if len(state["rows"]) >= MEASURED:
                rows = state["rows"]
                self._state[opt] = None
                if state["edited"]:
                    self.rec.emit_aside(ev.step_edit(
                        opt=opt, steps=[r[0] for r in rows], back=[r[1] for r in rows],
                        share=[r[2] for r in rows], home=[r[3] for r in rows],
                        home_share=[r[4] for r in rows]), self.rec.here(3))
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
