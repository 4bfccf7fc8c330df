from __future__ import annotations

import ast

from ..analysis.lr import SPENT_SHARE, schedule_misfit
from ..findings import Severity
from ..trace import Location
from .base import Rule, related
from .scheduler_period_mismatch import period_verdict
from ..analysis.source import walk

_PER_EPOCH = "step the scheduler once per epoch (after the batch loop), or "
_SPENT_FIXES = {
    "step_size": _PER_EPOCH + "give step_size in optimizer steps (step_size={v} * len(loader))",
    "milestones": _PER_EPOCH + "give the milestones in optimizer steps "
                               "(milestones=[m * len(loader) for m in {v}])",
    "gamma": _PER_EPOCH + "take gamma per step (gamma={v} ** (1 / len(loader)) for the same decay "
                          "per epoch)",
    "T_max": "count T_max in the unit the scheduler is stepped in (T_max=epochs * len(loader) "
             "stepped per batch), or step it once per epoch",
    "warmup": "count the warm-up in optimizer steps (total_iters={v} * len(loader)), or step "
              "the warm-up once per epoch",
    "total_iters": "count total_iters in optimizer steps (total_iters=epochs * len(loader)), or "
                   "step the scheduler once per epoch",
    "total_steps": "give OneCycleLR the run's optimizer steps (total_steps=epochs * len(loader), "
                   "or epochs=epochs, steps_per_epoch=len(loader))",
    "num_training_steps": "count num_training_steps in optimizer steps "
                          "(num_training_steps=epochs * len(loader))",
}
_STILL_FIX = ("step the scheduler after every optimizer.step() (inside the batch loop), or count "
              "its {arg} in epochs")


def _call(s, m=None) -> str:
    if m is not None and m.arg == "lr_lambda":
        return f"LambdaLR (its lr_lambda falls to 0 after {m.value:,} steps)"
    keys = [k for k in ("step_size", "milestones", "T_max", "total_iters", "total_steps",
                        "num_training_steps",
                        "gamma") if k in s.args]
    return f"{s.cls}({', '.join(f'{k}={s.args[k]}' for k in keys)})"


def _hand_loop_fix(fix: str, plan) -> str:
    """A fix written for a DataLoader (``len(loader)``) told for a loop without one."""
    if plan.hand is None or "len(loader)" not in fix:
        return fix
    where = f" at line {plan.hand.line.line}" if plan.hand.line is not None else ""
    return (fix.replace("len(loader)", "steps_per_epoch") +
            f" (steps_per_epoch: the {plan.hand.per_pass:,} updates of one pass of the loop{where})")


def _epoch_of(plan, unit: int) -> str:
    if plan.hand is None:
        return f"the DataLoader's {unit} batches per epoch"
    where = f" at line {plan.hand.line.line}" if plan.hand.line is not None else ""
    return f"the {unit} batches of one pass of the loop{where}"


def _share(x: float) -> str:
    return f"{x:.0%}" if x >= 0.01 else f"{x:.1g}"


class ScheduleMisfitsRun(Rule):
    """
    ## What it does
    Projects each learning-rate schedule over the run the script plans (the loop around its
    DataLoader loop, `for epoch in range(epochs)`, times the batches of a real epoch when the
    scheduler is stepped after every optimizer step; the epochs when it is stepped once per
    epoch) and finds a schedule whose length is in the other unit:

    * stepped after every batch, it has done its work within the first 10% of the run: a
      `StepLR(step_size=30)` / `MultiStepLR(milestones=[30, 60])` / `ExponentialLR(gamma=0.95)`
      decayed 100×, a `CosineAnnealingLR(T_max=epochs)` at its minimum (then cycling), a
      `LinearLR` / `PolynomialLR` / transformers decay at its end, a `OneCycleLR(total_steps=
      epochs)` at its end (where torch raises at the next step), a `LinearLR` warm-up whose
      `total_iters` the script names in epochs (`warmup_epochs`) over within the first epoch,
      while none of its lengths is a multiple of the DataLoader's length; a length the script
      writes as a count of epochs (`milestones=[int(epochs * 0.6)]`, `step_size=num_epochs // 3`,
      no batch, step or iteration word in it) is judged so at any share of the run and whatever
      it is a multiple of;
    * stepped after every batch, a decay to 0 (transformers' linear or polynomial schedule, a
      `PolynomialLR`, a `LambdaLR` that reaches 0) sized in whole epochs of batches
      (`num_training_steps=len(loader)`) but fewer epochs than the loop around the DataLoader
      runs: from its end on the lr is 0, and every later epoch (one at least) applies no update.
      Under accumulation over k batches the same for a decay sized in one epoch's optimizer
      steps (`num_training_steps=len(train_dl) // accum_steps`, `math.ceil(len(loader) / k)`).
      A length the construction takes from a name computed above it with `len()`
      (`num_update_steps = len(train_dl) // accum_steps`) is reported at that line, where the
      length is written, with the line rewritten over the run in the fix;
    * stepped once per epoch with a length that is a multiple of the DataLoader's length (a
      count of batches: `T_max=epochs * len(loader)`), it covers at most 20% of it by the run's
      last epoch: the lr hardly moves. A length written as a bare number (`step_size=640`)
      counts as batches only when all its values are multiples of an epoch of 20 batches or
      more: over 8 or 10 batches, `milestones=[16, 22]` is as likely a count of epochs. When the construction sizes it from the loader's length
      (`len(train_loader)`, `steps_per_epoch=`) in a loop the script writes, it is meant per
      batch: the finding points at the `step()` call, in the wrong loop, and names the
      construction beside it (a framework steps it: the construction, as before);
    * stepped once per optimizer step under gradient accumulation of k batches (a hand-written
      window, `accelerator.accumulate`, Lightning's `accumulate_grad_batches`, the Trainer's
      `gradient_accumulation_steps`) with a length that counts the run's batches
      (`total_steps=epochs * len(loader)`, `num_training_steps=len(train_dataloader) * epochs`):
      it is stepped 1/k as often as its length says and never finishes;
    * stepped once per epoch with a length equal to the optimizer steps the run stops at
      (Lightning's `max_steps`, often as `T_max=self.trainer.max_steps`): a schedule meant per
      step returned from `configure_optimizers` without `"interval": "step"`, which Lightning
      then steps once per epoch. Reported at the `return` of `configure_optimizers`;
    * stepped after every batch with a `CosineAnnealingLR` whose `T_max` counts batches but at
      most half the run (`T_max=len(loader)` in a 20-epoch run): past `T_max` torch's cosine
      climbs back to its maximum, so the lr cycles instead of decaying once.

    The planned run of Lightning and the Trainer is read from their loops (`max_epochs`,
    `num_train_epochs`, or Lightning's `max_steps` when it alone ends the run); that of a loop
    without a DataLoader (batches sliced from tensors or taken from a list) from the `range` of the loop around it and the updates of its first
    pass, which the replay runs to its end. A hand-written `LambdaLR` that falls on a straight
    line (`lambda e: 1 - e / total`) has the length at which it reaches 0.

    graddoctor runs a few steps only; the projection needs no long run.

    ## Why is this bad?
    The lr the optimizer applies is not the schedule you designed. A decay meant over 90 epochs
    that is done in the first one trains the other 89 at a lr 100× to 10^180× too small (the
    model stops learning early, and nothing fails); a cosine that restarts every few dozen
    batches swings between its maximum and its minimum all run long; a schedule counted in
    batches and stepped per epoch never decays at all.

    ## Example
    ```python
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    for epoch in range(90):
        for x, y in loader:
            ...
            optimizer.step()
            scheduler.step()        # per batch: step_size=30 means 30 batches
    ```

    ## Use instead
    ```python
    for epoch in range(90):
        for x, y in loader:
            ...
            optimizer.step()
        scheduler.step()            # once per epoch
    ```

    ## Stays silent on
    A per-batch schedule sized in steps (`epochs * len(loader)`, milestones in steps; under
    accumulation `epochs * math.ceil(len(loader) / k)`, Lightning's
    `self.trainer.estimated_stepping_batches`); a schedule stepped every micro-batch; a
    per-epoch schedule sized in epochs, a bare number of epochs that divides by a short epoch
    included (`milestones=[16, 22]` over 8 batches); `ReduceLROnPlateau`; a warm-up (however short);
    `CyclicLR` and warm restarts (cycles by design); a decay sized in one epoch's batches in a
    one-epoch run (`num_train_epochs = ceil(max_train_steps / len(loader))`); a `LinearLR` that
    decays to a floor (`end_factor`) within the first epoch and holds it; a run whose length
    graddoctor cannot read from the source; a schedule resumed from a checkpoint
    (`last_epoch`); one that `scheduler-period-mismatch`, `lr-collapsed`,
    `scheduler-per-micro-batch` or `scheduler-stepped-twice` already reports. A schedule of
    `max_steps` length returned with `"interval": "step"`; a schedule in epochs stepped once
    per epoch under `max_steps`.
    """

    code = "GD276"
    slug = "schedule-misfits-run"
    severity = Severity.WARNING
    summary = ("a learning-rate schedule sized in epochs is stepped per batch (done within the "
               "first 10% of the planned run), or sized in batches and stepped per epoch or per "
               "accumulated update (it never finishes)")
    fix = ("size the schedule in the unit it is stepped in: optimizer steps "
           "(epochs * len(loader)) when stepped per batch, epochs when stepped per epoch")

    def check(self, a):
        collapsed = {c.writer.sched for c in a.lr_collapses if c.writer.scheduled}
        for s in a.schedulers.values():
            m = schedule_misfit(a, s)
            if m is None:
                continue
            if (s.sched in collapsed or s.parent in collapsed) and m.side != "ends":
                continue  # seen collapsing in the replay: lr-collapsed says it (a decay to 0
                # that ends before the planned run is this rule's: lr-collapsed leaves it)
            told = period_verdict(a, s)
            if told is not None and told[1] is not Severity.INFO:
                continue  # scheduler-period-mismatch says it as a warning
            yield self._finding(a, s, m)

    def _finding(self, a, s, m):
        plan = m.plan
        if m.side == "micro":
            return self._micro(a, s, m)
        if m.side == "cycles":
            return self._cycles(a, s, m)
        if m.side == "ends":
            return self._ends(a, s, m)
        if m.side == "spent":
            if plan.per_epoch and m.at <= plan.per_epoch:
                where = f"in the first epoch ({m.at:,} of its {plan.per_epoch:,} steps)"
            elif plan.per_epoch and plan.epochs:
                where = (f"in epoch {-(-m.at // plan.per_epoch)} of {plan.epochs} "
                         f"({m.at / plan.steps:.1%} of the run)")
            else:
                where = f"{m.at / plan.steps:.1%} of the way into the run"
            if m.cycles is not None:
                after = (f"then climbs back: about {m.cycles:,.0f} full cycles over the run, the lr "
                         f"swinging between its maximum and eta_min")
            elif s.cls == "OneCycleLR":
                after = "long before the run's end"
            elif m.left is not None and m.left < 1:
                after = f"and ends the run at {_share(m.left)} of its start"
            else:
                after = "and stays there for the rest of the run"
            through = ""
            if s.parent is not None and s.parent in a.schedulers:
                through = f" (through its {a.schedulers[s.parent].cls})"
            message = (f"{_call(s, m)} is stepped after every batch{through}, but its {m.arg} looks like a "
                       f"count of epochs: over the run the script plans ({plan.described}), its lr "
                       f"{m.what} by step {m.at:,}, {where}, {after}")
            v = m.value if not isinstance(m.value, float) else f"{m.value:g}"
            fix = _SPENT_FIXES.get(m.arg, self.fix).format(v=v)
            if a.framework == "lightning":  # Lightning steps it: the config says how often
                fix = (f"return the scheduler with \"interval\": \"epoch\" in the lr_scheduler "
                       f"config of configure_optimizers, or give its {m.arg} in optimizer steps "
                       f"(self.trainer.estimated_stepping_batches counts the run's)")
            elif a.framework == "transformers":  # the Trainer steps it once per optimizer step
                fix = (f"give its {m.arg} in the Trainer's optimizer steps ({m.arg}=math.ceil("
                       f"len(train_dataset) / (per_device_train_batch_size * "
                       f"gradient_accumulation_steps)) * num_train_epochs), or let the Trainer "
                       f"build the schedule (lr_scheduler_type, warmup_steps or warmup_ratio)")
            if m.what == "ends its warm-up":
                message = (f"{_call(s, m)} is stepped after every batch{through}, but its total_iters "
                           f"is `{m.value}`, a count of epochs: the warm-up ends after {m.at:,} "
                           f"batches, in the first epoch ({plan.per_epoch:,} batches), instead of "
                           f"after {m.at:,} epochs, and the model trains at the full lr from then on")
                fix = _SPENT_FIXES["warmup"].format(v=m.value)
        elif m.by_updates:
            return self._still_in_updates(a, s, m)
        else:
            n, real = m.at, m.real_length or m.at
            unit = next(x for x in (plan.real_len, plan.replay_len) if x and n % x == 0)
            scale = f" ({real:,} in a real run)" if real != n else ""
            covered = plan.steps / real
            left = m.left
            end = f"; the lr ends the run at {_share(left)} of its start" if left is not None else ""
            message = (f"{_call(s, m)} is stepped once per epoch, but its {m.arg} counts batches "
                       f"({n:,} = {n // unit} × {_epoch_of(plan, unit)}{scale}): "
                       f"over the {plan.steps:,} epochs the script plans it covers "
                       f"{_share(covered)} of its length{end}, so the schedule barely acts")
            fix = _STILL_FIX.format(arg=m.arg if m.arg != "lr_lambda" else "lr_lambda's length")
        fix = _hand_loop_fix(fix, plan)
        stepper = a.schedulers.get(s.parent) if s.parent is not None else s
        first = stepper.steps[0] if stepper is not None and stepper.steps else None
        where, rel = s.init.loc, ((related(first, "its step() call"),) if first is not None else ())
        if (not a.framework and m.side != "spent" and plan.unit == "epoch" and first is not None
                and first.loc is not None and _sized_by_loader(a, s.init.loc)):
            # the construction counts the loader's batches on purpose: the step() call is what
            # sits in the wrong loop
            where, rel = first.loc, (related(s.init, "the scheduler's construction, sized in batches"),)
            fix = (f"step the scheduler after every optimizer.step(), inside the batch loop: its "
                   f"{m.arg} counts batches")
        return self.finding(
            message, where, fix=fix, related=rel,
            evidence={"scheduler": s.cls, "args": dict(s.args), "side": m.side,
                      "stepped": plan.unit, "planned_steps": plan.steps, "at": m.at,
                      "left": m.left, "spent_share": SPENT_SHARE})

    def _ends(self, a, s, m):
        """A decay to 0 sized in whole epochs of batches, fewer than the run plans: the lr is 0
        for every epoch after it."""
        plan = m.plan
        epochs_in = m.at // plan.per_epoch
        idle = plan.steps - m.at
        count = "one epoch" if epochs_in == 1 else f"{epochs_in} epochs"
        name = str(s.args.get("lr_lambda", ""))
        if s.cls == "LambdaLR" and name.endswith("_lr_lambda") and "schedule" in name:
            name = name.strip("_")[:-len("_lr_lambda")]  # transformers' get_*_schedule_with_warmup
        else:
            name = s.cls
        if m.accumulated > 1:
            k = m.accumulated
            counted = (f"the optimizer steps of {count} ({plan.per_epoch:,} per epoch: "
                       f"{plan.real_len or plan.per_epoch * k:,} batches, {k} accumulated per step)")
            size = {"accelerate": "math.ceil(len(loader) / gradient_accumulation_steps)",
                    "lightning": None, "transformers": None}.get(a.framework, f"math.ceil(len(loader) / {k})")
            fix = (f"count {m.arg} over every epoch of the run: {m.arg}=num_epochs * {size}"
                   if size else f"count {m.arg} over every epoch of the run's optimizer steps")
            written = _whole_run_length(a, s, m.arg)
            if written is not None:
                fix = f"count {m.arg} over every epoch of the run: {written}"
            fix = _hand_loop_fix(fix, plan)
        else:
            counted = f"the batches of {count} ({_epoch_of(plan, plan.per_epoch)})"
            fix = _hand_loop_fix(_SPENT_FIXES.get(m.arg, self.fix).format(v=m.value), plan)
        message = (f"{name} is stepped after every batch and its {m.arg} counts "
                   f"{counted}, but the run the script plans "
                   f"is {plan.described}: the lr {m.what} after step {m.at:,} and is 0 from then "
                   f"on, so the last {idle:,} optimizer steps ({idle / plan.steps:.0%} of the run) "
                   f"apply no update")
        stepper = a.schedulers.get(s.parent) if s.parent is not None else s
        first = stepper.steps[0] if stepper is not None and stepper.steps else None
        where = s.init.loc
        rel = (related(first, "its step() call"),) if first is not None else ()
        sized = _length_assignment(a, s, m.arg)
        if sized is not None and m.accumulated > 1 and _named_per_epoch(a, sized):
            sized = None  # `updates_per_epoch` is right: the call should multiply it by the epochs
            epochs = _epochs_name(a, s.init.loc)
            if epochs is not None:
                fix = (f"count {m.arg} over every epoch of the run: {m.arg}={epochs} * "
                       f"{_keyword_name(a, s, m.arg)}")
        if sized is not None:  # `num_training_steps=num_update_steps`: the length is written there
            where = sized
            rel = (related(s.init, "the scheduler, built here"), *rel)
        return self.finding(
            message, where, fix=fix,
            related=rel,
            evidence={"scheduler": s.cls, "args": dict(s.args), "side": "ends",
                      "stepped": plan.unit, "planned_steps": plan.steps, "at": m.at,
                      "left": 0.0})

    def _still_in_updates(self, a, s, m):
        """Sized in the run's optimizer steps (Lightning's ``max_steps``), stepped once per
        epoch: Lightning's default ``"interval": "epoch"`` for a schedule meant per step."""
        plan = m.plan
        covered = plan.steps / m.at
        end = (f"; the lr ends the run at {_share(m.left)} of its start" if m.left is not None
               else "")
        stepper = a.schedulers.get(s.parent) if s.parent is not None else s
        first = stepper.steps[0] if stepper is not None and stepper.steps else None
        message = (f"{_call(s)} is sized in the run's optimizer steps ({m.at:,}, the "
                   f"max_steps the run stops at), but it is stepped once per epoch: over the "
                   f"{plan.described} it is stepped {plan.steps:,} times, {_share(covered)} of its "
                   f"length{end}, so the schedule barely acts")
        if a.framework == "lightning":
            message += (" (Lightning steps a scheduler once per epoch unless its lr_scheduler "
                        "config says \"interval\": \"step\")")
            fix = ("return the scheduler in a config with \"interval\": \"step\" from "
                   "configure_optimizers: {\"optimizer\": opt, \"lr_scheduler\": "
                   "{\"scheduler\": sched, \"interval\": \"step\"}}")
            where = first.loc if first is not None and first.loc is not None else s.init.loc
            rel = (related(s.init, "the scheduler's construction"),) if where is not s.init.loc else ()
        else:
            fix = _STILL_FIX.format(arg=m.arg)
            where, rel = s.init.loc, ((related(first, "its step() call"),) if first is not None else ())
        return self.finding(
            message, where, fix=fix, related=rel,
            evidence={"scheduler": s.cls, "args": dict(s.args), "side": "still",
                      "stepped": plan.unit, "planned_steps": plan.steps, "at": m.at,
                      "sized_in": "optimizer_steps", "left": m.left})

    def _cycles(self, a, s, m):
        """A cosine sized in batches, but over a part of the run: it comes back up and cycles."""
        plan = m.plan
        per = plan.per_epoch or 0
        span = (f"{m.at // per:,} epoch{'s' if m.at // per != 1 else ''} of batches"
                if per and m.at % per == 0 else f"{m.at:,} batches")
        every = (f", back at its maximum every {2 * m.at // per:,} epochs"
                 if per and (2 * m.at) % per == 0 else "")
        message = (f"CosineAnnealingLR(T_max={m.value}) is stepped after every batch and its T_max "
                   f"counts {span}, but the run the script plans is longer ({plan.described}): "
                   f"past T_max torch's cosine climbs back up, so the lr reaches eta_min and returns "
                   f"to its maximum {m.cycles:,.3g} times over the run{every}, instead of decaying "
                   f"once")
        fix = ("count T_max over the whole run (T_max=epochs * len(loader) stepped per batch); for "
               "restarts by design, CosineAnnealingWarmRestarts(T_0=len(loader)) restarts at the "
               "maximum instead of climbing back")
        if a.framework == "lightning":
            fix = ("give T_max the run's optimizer steps (T_max=self.trainer.estimated_stepping_batches), "
                   "or step it per epoch (\"interval\": \"epoch\") with T_max=self.trainer.max_epochs")
        stepper = a.schedulers.get(s.parent) if s.parent is not None else s
        first = stepper.steps[0] if stepper is not None and stepper.steps else None
        return self.finding(
            message, s.init.loc, fix=_hand_loop_fix(fix, plan),
            related=(related(first, "its step() call"),) if first is not None else (),
            evidence={"scheduler": s.cls, "args": dict(s.args), "side": "cycles",
                      "stepped": plan.unit, "planned_steps": plan.steps, "length": m.at,
                      "cycles": round(m.cycles, 3)})

    def _micro(self, a, s, m):
        """The schedule counts the run's DataLoader batches, but it is stepped once per
        optimizer step, each of which accumulates ``k`` of them."""
        plan, k = m.plan, m.plan.k
        covered = plan.steps / m.real_length
        per = m.at // plan.epochs
        end = (f"; the lr ends the run at {_share(m.left)} of its start" if m.left is not None
               and m.left > 0.005 else "")
        message = (f"{_call(s, m)} is sized in DataLoader batches ({m.at:,} = {plan.epochs} epochs × "
                   f"{per:,} batches), but it is stepped once per optimizer step and each step "
                   f"accumulates {k} batches: over the run the script plans ({plan.described}) it "
                   f"is stepped {plan.steps:,} times, {_share(covered)} of its length, so the "
                   f"schedule never finishes{end}")
        framework = a.framework
        size = {"lightning": "self.trainer.estimated_stepping_batches (it counts optimizer steps, "
                             "accumulate_grad_batches included)",
                "accelerate": f"epochs * math.ceil(len(loader) / gradient_accumulation_steps)",
                "transformers": "epochs * math.ceil(len(train_dataloader) / "
                                "args.gradient_accumulation_steps), or let the Trainer build the "
                                "scheduler (lr_scheduler_type, warmup_steps)"}.get(
                    framework, f"epochs * math.ceil(len(loader) / {k}) (the accumulation steps)")
        fix = _hand_loop_fix(f"count its {m.arg} in optimizer steps, not batches: {m.arg}={size}", plan)
        stepper = a.schedulers.get(s.parent) if s.parent is not None else s
        first = stepper.steps[0] if stepper is not None and stepper.steps else None
        return self.finding(
            message, s.init.loc, fix=fix, fixes={},
            related=(related(first, "its step() call, once per optimizer step"),)
            if first is not None else (),
            evidence={"scheduler": s.cls, "args": dict(s.args), "side": "micro", "k": k,
                      "stepped": plan.unit, "planned_steps": plan.steps, "length": m.at,
                      "covered": round(covered, 4), "left": m.left})


def _sized_by_loader(a, loc) -> bool:
    """Whether the scheduler's construction at ``loc`` sizes it from a DataLoader's length
    (``steps_per_epoch=len(train_loader)``, ``total_steps=epochs * len(loader)``): it is meant
    to be stepped per batch."""
    tree = a.source.tree(loc.path) if loc is not None else None
    if tree is None:
        return False
    statement = next((n for n in walk(tree) if isinstance(n, (ast.Assign, ast.Expr, ast.AnnAssign))
                      and n.lineno <= loc.line <= (n.end_lineno or n.lineno)), None)
    if statement is None:
        return False
    for n in walk(statement):
        if isinstance(n, ast.keyword) and n.arg == "steps_per_epoch":
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "len" and n.args:
            arg = n.args[0]
            name = arg.id if isinstance(arg, ast.Name) else arg.attr if isinstance(arg, ast.Attribute) else ""
            if any(w in name.lower() for w in ("loader", "batches", "dl")):
                return True
    return False


def _whole_run_length(a, s, arg) -> str | None:
    """The script's own length line rewritten over the whole run:
    ``num_update_steps = len(train_dl) // accum_steps`` becomes
    ``num_update_steps = num_epochs * math.ceil(len(train_dl) / accum_steps)`` (the epochs named by
    the ``range()`` of a loop whose name says epochs). None when it is not that shape."""
    loc = _length_assignment(a, s, arg)
    tree = a.source.tree(loc.path) if loc is not None else None
    if tree is None:
        return None
    node = next((n for n in walk(tree) if isinstance(n, ast.Assign) and n.lineno == loc.line), None)
    value = node.value if node is not None else None
    if node is None or len(node.targets) != 1:
        return None
    if (isinstance(value, ast.BinOp) and isinstance(value.op, ast.FloorDiv)
            and isinstance(value.left, ast.Call) and isinstance(value.left.func, ast.Name)
            and value.left.func.id == "len"):
        per_epoch = f"math.ceil({ast.unparse(value.left)} / {ast.unparse(value.right)})"
    elif isinstance(value, ast.Call) and ast.unparse(value.func) in ("math.ceil", "ceil"):
        per_epoch = ast.unparse(value)
    else:
        return None
    epochs = _epochs_name(a, loc)
    if epochs is None:
        return None
    return f"{ast.unparse(node.targets[0])} = {epochs} * {per_epoch}"


def _epochs_name(a, loc) -> str | None:
    """The name in the ``range()`` of a loop whose name says epochs (``for epoch in
    range(num_epochs)``), else None."""
    tree = a.source.tree(loc.path) if loc is not None else None
    if tree is None:
        return None
    return next((n.iter.args[0].id for n in walk(tree) if isinstance(n, ast.For)
                 and isinstance(n.iter, ast.Call) and isinstance(n.iter.func, ast.Name)
                 and n.iter.func.id == "range" and len(n.iter.args) == 1
                 and isinstance(n.iter.args[0], ast.Name) and "epoch" in n.iter.args[0].id.lower()),
                None)


def _named_per_epoch(a, loc) -> bool:
    """Whether the name assigned at ``loc`` says it counts one epoch (``updates_per_epoch``)."""
    tree = a.source.tree(loc.path)
    node = next((n for n in walk(tree) if isinstance(n, ast.Assign) and n.lineno == loc.line),
                None) if tree is not None else None
    return node is not None and any(isinstance(t, ast.Name) and "epoch" in t.id.lower()
                                    for t in node.targets)


def _keyword_name(a, s, arg) -> str | None:
    """The variable the scheduler's construction passes as ``arg=`` (``num_update_steps`` in
    ``num_training_steps=num_update_steps``), else None."""
    loc = s.init.loc if s.init is not None else None
    tree = a.source.tree(loc.path) if loc is not None else None
    if tree is None:
        return None
    calls = [n for n in walk(tree) if isinstance(n, ast.Call)
             and n.lineno <= loc.line <= (n.end_lineno or n.lineno)]
    value = next((k.value for c in calls for k in c.keywords if k.arg == arg), None)
    return value.id if isinstance(value, ast.Name) else None


def _length_assignment(a, s, arg):
    """Where the script computes the length it hands the scheduler by name
    (``num_update_steps = len(train_dl) // accum_steps`` above
    ``num_training_steps=num_update_steps``): the one assignment of that name above the
    construction, in its function or at module level, when it reads a loader's length. None for
    a length written in the call itself."""
    loc = s.init.loc if s.init is not None else None
    tree = a.source.tree(loc.path) if loc is not None else None
    name = _keyword_name(a, s, arg)
    if tree is None or name is None:
        return None
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
              and n.lineno <= loc.line <= (n.end_lineno or n.lineno)]
    scope = min(scopes, key=lambda n: (n.end_lineno or n.lineno) - n.lineno) if scopes else tree
    assigned = [n for n in walk(scope) if isinstance(n, ast.Assign) and n.lineno < loc.line
                and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    if len(assigned) != 1:
        return None
    reads_length = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "len"
                       for n in walk(assigned[0].value))
    if not reads_length:
        return None
    return Location(loc.path, assigned[0].lineno)
