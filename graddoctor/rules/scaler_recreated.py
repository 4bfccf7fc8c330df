from __future__ import annotations

from ..findings import Severity
from .base import Rule, related

USES = ("unscale", "scaler_step", "scaler_update", "backward")  # the calls that use a scaler
RESTARTS_AT_LEAST = 2  # rebuilds in a row (three scalers at the line) before it is the loop's


class ScalerRecreated(Rule):
    """
    ## What it does
    Finds a `GradScaler` constructed again and again at the same line inside the training loop:
    each new scaler takes over after the previous one was used for a single optimizer step of
    the same optimizer, so no scaler lives longer than one update. It points at the
    constructor.

    ## Why is this bad?
    A GradScaler's whole job is the state it keeps across steps: the loss scale backs off when
    a step overflows and grows again after `growth_interval` clean steps. A fresh scaler starts
    at its initial scale (65536 by default) every step and forgets it at once: the scale never
    adapts. If the loss overflows in float16 at that scale, every step is skipped and the
    optimizer never updates; if it does not, the growth and back-off that keep small
    gradients representable never happen, and `scaler.update()` updates a scaler that is
    thrown away.

    ## Example
    ```python
    for x, y in loader:
        scaler = torch.amp.GradScaler("cuda")
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    ```

    ## Use instead
    ```python
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    ```

    ## Stays silent on
    A scaler built once before the loop; a scaler rebuilt at each epoch or stage (it keeps its
    state over many steps; it only loses the growth it would have made); a rebuilt scaler whose
    state is loaded from a checkpoint (`load_state_dict`); a scaler disabled on purpose
    (`enabled=False`); a new scaler per training run (each over its own optimizer). A
    `torch.cuda.amp.GradScaler()` that turned itself off for want of CUDA is still reported:
    on the GPU it runs enabled.
    """

    code = "GD158"
    slug = "scaler-recreated"
    severity = Severity.WARNING
    summary = ("a GradScaler is rebuilt every update: its loss scale restarts at the initial "
               "value each step and never adapts")
    fix = ("build the GradScaler once, before the training loop, and keep calling "
           "scaler.update() each step")

    def check(self, a):
        inits = a.of_kind("scaler_init")
        if len(inits) <= RESTARTS_AT_LEAST:
            return
        loaded = {e.get("scaler") for e in a.of_kind("scaler_load")}
        uses: dict[int, list] = {}
        for e in a.of_kind(*USES):
            if e.get("scaler") is not None:
                uses.setdefault(e["scaler"], []).append(e)
        by_line: dict[tuple, list] = {}
        for init in inits:
            if init.loc is None:
                continue
            by_line.setdefault((init.loc.path, init.loc.line, init.get("cls")), []).append(init)
        for built in by_line.values():
            restarts = []
            for before, after in zip(built, built[1:]):
                if self._restarted(a, before, after, uses, loaded):
                    restarts.append((before, after))
                elif len(restarts) < RESTARTS_AT_LEAST:
                    restarts = []
                else:
                    break
            if len(restarts) >= RESTARTS_AT_LEAST:
                yield self._finding(a, built, restarts, uses)

    @staticmethod
    def _on(init) -> bool:
        """Enabled, or turned off only because this machine lacks its device."""
        return bool(init.get("enabled")) or init.get("requested") is True

    @classmethod
    def _restarted(cls, a, before, after, uses, loaded) -> bool:
        """``after`` replaced ``before`` one optimizer step after ``before`` was made: ``before``
        was used, exactly one step of each optimizer it served ran in between, ``after`` serves
        one of them, and ``after`` starts from its construction, not from a loaded state."""
        if not (cls._on(before) and cls._on(after)) or after.get("scaler") in loaded:
            return False
        lo, hi = before.seq, after.seq
        used = [e for e in uses.get(before.get("scaler"), ()) if lo < e.seq < hi]
        if not used:
            return False
        steps = [s for s in a.steps if lo < s.seq < hi]
        if a.steps_before(hi) - a.steps_before(lo) != len(steps):
            return False  # steps folded out between: a long-lived scaler
        per_opt: dict[int, int] = {}
        for s in steps:
            per_opt[s.get("opt")] = per_opt.get(s.get("opt"), 0) + 1
        served = {e.get("opt") for e in used if e.get("opt") is not None} or set(per_opt)
        if not served or any(per_opt.get(opt, 0) != 1 for opt in served):
            return False
        later = {e.get("opt") for e in uses.get(after.get("scaler"), ()) if e.get("opt") is not None}
        return not later or bool(later & served)  # a scaler of another training run is no restart

    def _finding(self, a, built, restarts, uses):
        first = built[0]
        scalers = {b.get("scaler") for pair in restarts for b in pair}
        stepped = [e for s in scalers for e in uses.get(s, ()) if e.kind == "scaler_step"]
        skipped = sum(1 for e in stepped if e.get("skipped"))
        updates = [e for e in uses.get(restarts[0][0].get("scaler"), ()) if e.kind == "scaler_update"]
        if stepped and skipped == len(stepped):
            outcome = (f"all {len(stepped)} steps overflowed at that fresh scale and were skipped: "
                       f"the optimizer never updated")
        elif skipped:
            outcome = (f"{skipped} of {len(stepped)} steps overflowed at that fresh scale and were "
                       f"skipped, and each next scaler tries the same scale again")
        else:
            outcome = ("the scale never grows or backs off, and each scaler.update() updates a "
                       "scaler that is thrown away")
        off = ("" if first.get("enabled") else
               " (it turned itself off in this run for want of CUDA; on the GPU it runs enabled)")
        cls = first.get("cls") or "GradScaler"
        init = first.get("init_scale")
        start = (f" ({init:.0f})" if isinstance(init, (int, float)) and init == int(init) and init < 1e15
                 else f" ({init:g})" if isinstance(init, (int, float)) else "")
        return self.finding(
            f"a new {cls} is built here {len(built)} times in the training loop, and each one "
            f"is used for a single optimizer step before the next replaces it{off}: every step "
            f"starts again from the initial loss scale{start} with no history, so {outcome}",
            first.loc,
            related=(related(updates[-1] if updates else None,
                             "the scale this update sets is dropped with the scaler"),
                     related(restarts[0][1], "the next scaler, built from scratch")),
            step=a.next_step_number(first.seq),
            evidence={"scaler": cls, "constructions": len(built), "restarts": len(restarts),
                      "steps_skipped": skipped, "scaler_steps": len(stepped),
                      "enabled_in_run": bool(first.get("enabled"))})
