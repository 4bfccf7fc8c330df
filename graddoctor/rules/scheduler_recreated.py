from __future__ import annotations

import math

from ..analysis.lr import length
from ..findings import Severity
from .base import Rule, related


def _same(a, b) -> bool:
    return bool(a) and bool(b) and len(a) == len(b) and all(
        x is not None and y is not None and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-15)
        for x, y in zip(a, b))


class SchedulerRecreated(Rule):
    """
    ## What it does
    Finds a learning-rate scheduler built again and again over the same optimizer inside the
    training loop (`scheduler = LambdaLR(optimizer, warmup)` at the top of every epoch or
    batch), where each new scheduler's construction changes the lr the previous one had
    reached (a `LambdaLR` sets it back to its first factor, a `LinearLR` multiplies it by its
    start factor again) before that schedule ran its course. It points at the constructor. It
    judges by the learning rates the run saw, so a rebuild that continues from the current lr
    (`StepLR`, `ExponentialLR`) stays silent.

    ## Why is this bad?
    A warm-up that is rebuilt every step stays at its first factor forever (lr × 1/warmup); a
    decay rebuilt every epoch never decays. Training runs at a learning rate nobody chose, and
    `get_last_lr()` of each short-lived scheduler looks plausible.

    ## Example
    ```python
    for epoch in range(epochs):
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 500))
        for x, y in loader:
            ...
            optimizer.step()
            scheduler.step()
    ```

    ## Use instead
    ```python
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 500))
    for epoch in range(epochs):
        for x, y in loader:
            ...
            optimizer.step()
            scheduler.step()
    ```

    ## Stays silent on
    A scheduler built once; a new scheduler per training stage (a different line or other
    arguments); a rebuilt scheduler that continues from the current lr (`StepLR`,
    `ExponentialLR`, `last_epoch=` resumes); a cycle that completes before it is rebuilt (a
    `CosineAnnealingLR(T_max=len(loader))` built every epoch: warm restarts on purpose); a
    scheduler rebuilt together with its optimizer (`optimizer-recreated` judges that).
    """

    code = "GD226"
    slug = "scheduler-recreated"
    severity = Severity.WARNING
    summary = ("a scheduler is rebuilt inside the loop and each new one changes the lr instead "
               "of continuing: the schedule restarts every epoch or step")
    fix = "build the scheduler once, before the training loop, and only step it inside"

    def check(self, a):
        scheds = a.schedulers
        by_line: dict[tuple, list] = {}
        for s in sorted(scheds.values(), key=lambda s: s.init.seq if s.init is not None else -1):
            if s.init is None or s.opt is None or s.init.loc is None or s.parent is not None:
                continue
            key = (s.opt, s.init.loc.path, s.init.loc.line, s.cls)
            by_line.setdefault(key, []).append(s)
        for (opt, _path, _line, cls), built in by_line.items():
            restarts = []
            for before, after in zip(built, built[1:]):
                if not self._restarted(a, opt, before, after):
                    restarts = []
                    continue
                restarts.append((before, after))
            if len(restarts) >= 2:
                yield self._finding(a, opt, cls, built, restarts)

    @staticmethod
    def _restarted(a, opt, before, after) -> bool:
        """``after`` was built after ``before`` had been stepped with a step of ``opt`` between,
        before ``before``'s schedule had run its course, and its construction changed the lr
        that ``before`` had left (a rebuild that continues from the current lr leaves it)."""
        moved = [st for st in before.steps if st.seq < after.init.seq]
        if not moved or not any(st["opt"] == opt for st in a.steps
                                if before.init.seq < st.seq < after.init.seq):
            return False
        if _same(after.init.get("lrs"), moved[-1].get("lrs")) or not after.init.get("lrs"):
            return False
        total = length(before)
        return total is None or a.count(moved) < total

    def _finding(self, a, opt, cls, built, restarts):
        first = built[0]
        before, after = restarts[0]
        left = [st for st in before.steps if st.seq < after.init.seq][-1].get("lrs") or [None]
        set_to = after.init.get("lrs") or [None]
        lives = [a.count([st for st in b.steps if st.seq < n.init.seq]) for b, n in restarts]
        each = f"{min(lives)}" if min(lives) == max(lives) else f"{min(lives)}-{max(lives)}"
        total = length(first)
        of = f" of its {total}" if total is not None else ""
        jump = (f" (the schedule had reached lr {left[0]:.3g}; the next {cls} sets {set_to[0]:.3g})"
                if left[0] is not None and set_to[0] is not None else "")
        return self.finding(
            f"a new {cls} over {a.optimizer_name(opt)} is built here {len(built)} times in the "
            f"loop, and each one changes the lr the previous one had reached instead of "
            f"continuing the schedule{jump}: every scheduler gets {each} step(s){of} before the "
            f"next replaces it, so the schedule restarts and never gets further",
            first.init.loc,
            related=(related(before.steps[-1] if before.steps else None,
                             "the schedule had moved the lr here"),
                     related(after.init, "the rebuild that changes it")),
            step=a.next_step_number(after.init.seq),
            evidence={"scheduler": cls, "built": len(built), "steps_per_scheduler": lives,
                      "lr_reached": left[0], "lr_rebuilt": set_to[0]})
