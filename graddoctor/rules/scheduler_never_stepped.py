from __future__ import annotations

from ..analysis.lr import epoch_began_after, stepped
from ..findings import Severity
from .base import Rule, plural, related


def _pct(x: float) -> str:
    return f"{x * 100:.3g} %"


class SchedulerNeverStepped(Rule):
    """
    ## What it does
    Finds a learning-rate scheduler that is built but whose `step()` is never called (neither
    directly nor through a `SequentialLR`/`ChainedScheduler` holding it) while its optimizer
    trains. Judged when the replay passed an epoch boundary or ran to its end, so a scheduler
    stepped once per epoch has had its chance, and at the end of a replay cut short (the step
    budget, a loop without a DataLoader) when the source never calls its `step()`; not when
    the source calls its `step()` somewhere, under any name the object is handed on as
    (`self.scheduler.step()` in a trainer given `scheduler=scheduler`), while graddoctor's
    replay cut the run short: the SWA recipe steps `SWALR` only from `swa_start` on, SimCLR
    its cosine schedule only from epoch 10 on. When another
    scheduler of the same optimizer is stepped, the message says that one moves the lr.

    ## Why is this bad?
    Building a scheduler already applies its first value: `LinearLR(start_factor=0.01)`,
    a `LambdaLR` warm-up or transformers' `get_linear_schedule_with_warmup` set the lr to its
    first, tiny factor at construction. Never stepped, the warm-up never ends: the whole run
    trains at 1 % (or 0 %) of the learning rate you chose. A scheduler that does not change the
    lr at construction (cosine, step decay) is simply never applied (reported as `info`).

    ## Example
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.01, total_iters=100)
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()          # lr stays 1e-5
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        warmup.step()
    ```

    ## Stays silent on
    Schedulers stepped per batch or per epoch as sized (`OneCycleLR` / cosine sized in
    batches per batch, `T_max=epochs` per epoch); `SequentialLR`/`ChainedScheduler`
    children; transformers' schedules per update under accumulation; SWA's recipe; an
    optimizer rebuilt with its scheduler; a hand-written warm-up; a scheduler handed to a
    trainer under another name and stepped from a later epoch than the replay reached
    (SimCLR's `self.scheduler.step()` from epoch 10); a scheduler a framework drives without its
    `step()`, advancing `last_epoch` and reading `get_lr()` (PyTorch Ignite's `LRScheduler`
    handler).
    """

    code = "GD220"
    slug = "scheduler-never-stepped"
    severity = Severity.WARNING
    summary = "a learning-rate scheduler is built but never stepped: its first factor stays forever"
    fix = "call scheduler.step() after each optimizer.step() (or once per epoch, as the schedule counts)"
    fixes = {
        "lightning": ("under manual optimization (self.automatic_optimization = False) Lightning "
                      "never steps the schedulers: call self.lr_schedulers().step() in training_step "
                      "after opt.step() (or in on_train_epoch_end for a per-epoch schedule); under "
                      "automatic optimization, return the scheduler from configure_optimizers"),
    }

    def check(self, a):
        all_s = a.schedulers
        cut = _cut_short(a)
        for s in all_s.values():
            if s.init is None or not s.positional or s.opt is None or stepped(all_s, s):
                continue
            if s.parent is not None:
                continue  # its container is the one to report
            after = [st for st in a.steps if st["opt"] == s.opt and st.seq > s.init.seq]
            n = a.count(after)
            if n < 2:
                continue
            loc = s.init.loc
            called = (a.source.method_called_on_assigned(loc.path, loc.line, "step", s.cls)
                      if cut and loc is not None else None)
            if called:
                continue  # the script does step it, later than the replay went (SWALR from swa_start)
            if not (a.status == "completed" or epoch_began_after(a, after[0].seq) or called is False):
                continue  # cut before any epoch end, and the source cannot say: not judged
            others = sorted({o.cls for o in all_s.values()
                             if o is not s and o.opt == s.opt and o.positional and stepped(all_s, o)})
            factor = s.first_factor
            lrs = s.init.get("lrs") or []
            lr = lrs[0] if lrs else None
            name = a.optimizer_name(s.opt)
            if factor is not None and factor < 0.999:
                shown = f"lr {lr:.3g}, " if lr is not None else ""
                if others:
                    message = (f"{s.cls} is built here but its step() is never called: it set "
                               f"{name}'s lr to its first value ({shown}{_pct(factor)} of the lr it "
                               f"was given) and the warm-up never ends; only {' and '.join(others)} "
                               f"moves the lr from there")
                else:
                    message = (f"{s.cls} is built here but its step() is never called: {name} takes "
                               f"all {plural(n, 'step')} at the schedule's first value ({shown}"
                               f"{_pct(factor)} of the lr it was given), and the warm-up never ends")
                severity = None
            else:
                if others:
                    message = (f"{s.cls} is built here but its step() is never called: {name}'s "
                               f"lr follows {' and '.join(others)} alone, this schedule is never applied")
                else:
                    message = (f"{s.cls} is built here but its step() is never called: {name} takes "
                               f"all {plural(n, 'step')} at a constant lr, the schedule is never applied")
                severity = Severity.INFO
            yield self.finding(
                message, loc, severity=severity,
                related=(related(after[0], f"{name} steps here without the scheduler"),),
                evidence={"scheduler": s.cls, "optimizer": s.opt, "factor": factor, "steps": n,
                          "stepped_with": others},
            )


def _cut_short(a) -> bool:
    """graddoctor's replay, not the script, ended the run or shortened its epochs: a step()
    the script makes later (from a given epoch or step on) had no chance to run."""
    if a.status != "completed":
        return True
    return any(e.get("real_len") is not None and e.get("replay_len") is not None
               and e["replay_len"] < e["real_len"] for e in a.of_kind("epoch_start"))
