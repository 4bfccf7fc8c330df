from __future__ import annotations

from ..events import MODEL_STATIC_AFTER
from ..findings import Role, Severity
from .base import Rule, one_or_many, related


class TeacherInTrainMode(Rule):
    """
    ## What it does
    Finds a frozen model — a distillation teacher, a fixed target network — that makes the
    training targets under `torch.no_grad()` inside the training update with its dropout
    layers in train mode. It points at that no-grad forward call. The model is frozen and
    static: no optimizer trains its parameters, and they did not change from one of its
    forwards to the next over the first optimizer steps (an EMA or momentum teacher changes
    every step and is left alone). When the run ended before enough steps told, it is an
    `info` that says so. A frozen encoder run under `no_grad` inside the training forward
    gets the same finding: the head trains on features noised by dropout that evaluation
    will not add.

    ## Why is this bad?
    Dropout in train mode zeroes a random part of the teacher's activations at every call:
    the soft targets are a different noisy draw at each step, and the student is trained to
    reproduce that noise instead of the teacher's predictions (a BatchNorm teacher also
    writes each batch into its running statistics). Nothing crashes and the loss still
    falls; the distilled student is just worse. A frozen teacher is meant to be run as it is
    evaluated: in eval mode.

    ## Example
    ```python
    teacher = load_teacher()  # nn.Dropout inside, left in train mode
    for x, y in loader:
        with torch.no_grad():
            soft = F.softmax(teacher(x) / T, dim=1)
        loss = F.kl_div(F.log_softmax(student(x) / T, dim=1), soft, reduction="batchmean")
        ...
    ```

    ## Use instead
    ```python
    teacher = load_teacher()
    teacher.eval().requires_grad_(False)
    for x, y in loader:
        with torch.no_grad():
            soft = F.softmax(teacher(x) / T, dim=1)
        ...
    ```

    ## Stays silent on
    A teacher in eval mode; a Mean Teacher, MoCo, BYOL or DINO momentum model run in train
    mode on purpose and updated after every step (in place, through `.data`, or by swapping
    `p.data`); Monte Carlo dropout or an uncertainty pass after training or between epochs
    (outside the update); the student's own dropout, also when the same trained model runs
    twice (R-Drop, consistency losses) or makes its own pseudo-labels under `no_grad`; a
    frozen teacher without dropout, or with `p=0`; frozen layers inside a reentrant gradient
    checkpoint (its no-grad forward runs again with gradients in the backward).
    """

    code = "GD306"
    slug = "teacher-in-train-mode"
    severity = Severity.WARNING
    summary = ("a frozen teacher makes the training targets under no_grad with its dropout in train "
               "mode: the student learns noisy targets")
    fix = "call teacher.eval() once before training (and teacher.requires_grad_(False))"

    def check(self, a):
        tl = a.modes
        # dropout layers a gradient flows through in some forward: a model that trains (the
        # student's own dropout, R-Drop's two passes, UDA's pseudo-labels by the same model)
        trained = {m for f in tl.forwards if f.grad for m in f.grad_modules}
        # per model: changed between its forwards (EMA), and over how many steps it stayed as it was
        changed: set[str] = set()
        unchanged: dict[str, int] = {}
        for state in tl.final_states.values():
            model = state.get("model")
            if state.get("layer") != "dropout" or not model:
                continue
            if state.get("model_changed"):
                changed.add(model)
            unchanged[model] = max(unchanged.get(model, 0), state.get("model_unchanged") or 0)
        groups: dict = {}
        for f in tl.forwards:
            if f.context != "training" or not f.training or f.grad:
                continue
            if any((f.states.get(m) or {}).get("updated") for m in f.modules):
                continue  # its BatchNorm layers' weights change by hand: an EMA copy
            for mid in f.modules:
                state = tl.final_states.get(mid) or {}
                model = state.get("model")
                if (state.get("layer") != "dropout" or not state.get("p") or not model
                        or model in changed or mid in trained):
                    continue
                group = groups.setdefault((f.event.loc, model), {"forward": f, "mids": []})
                if mid not in group["mids"]:
                    group["mids"].append(mid)
        for (where, model), group in groups.items():
            f, mids = group["forward"], group["mids"]
            steps = unchanged.get(model, 0)
            norms = [m for m in f.modules if (tl.final_states.get(m) or {}).get("layer") == "batchnorm"
                     and (tl.final_states.get(m) or {}).get("track_running_stats")]
            count = len(mids)
            under = "torch.inference_mode()" if f.event.get("inference") else "torch.no_grad()"
            how = (f"inside this forward, {model} runs under {under}" if f.event.get("nested")
                   else f"this forward runs {model} under {under}")
            message = (f"{how} inside the training update (a backward follows) with "
                       f"{one_or_many(count, 'a dropout layer', f'{count} dropout layers')} in "
                       f"train mode ({tl.names(mids)}), while no optimizer trains {model}: every "
                       f"step computes its outputs (the targets the update learns from) with a "
                       f"fresh random dropout mask, so training chases that noise instead of the "
                       f"frozen model's predictions")
            if norms:
                message += (f", and {one_or_many(len(norms), 'its BatchNorm layer', 'its BatchNorm layers')} "
                            f"({tl.names(norms)}) {one_or_many(len(norms), 'writes', 'write')} every "
                            f"batch into {one_or_many(len(norms), 'its', 'their')} running statistics")
            severity = None
            if steps >= MODEL_STATIC_AFTER:
                message += (f"; its parameters stayed unchanged over {steps} optimizer steps: a frozen "
                            f"teacher, not an EMA / momentum copy")
            elif steps:
                severity = Severity.INFO
                message += (f"; its parameters were seen unchanged over only {steps} "
                            f"{one_or_many(steps, 'step', 'steps')} before the run ended: if something "
                            f"updates them less often (an EMA every few steps, a target network "
                            f"synced now and then), train mode may be meant")
            else:
                severity = Severity.INFO
                message += ("; the run ended before a later step could tell whether something updates "
                            "its parameters (an EMA / momentum teacher runs in train mode on purpose)")
            cause = next((c for c in (f.set_by.get(m) for m in mids) if c is not None and c.get("mode")), None)
            if cause is not None and cause.loc is not None and set(cause.get("modules", ())) - set(f.modules):
                # a train() of a model that holds the teacher (a distillation module) undoes its eval()
                fix = (f"call {model}.eval() right after the train() at line {cause.loc.line}, which "
                       f"puts it back in train mode (or override train() in the module holding it "
                       f"to keep {model} in eval mode)")
            else:
                fix = f"call {model}.eval() once before training (and {model}.requires_grad_(False))"
            yield self.finding(
                message, where, severity=severity, fix=fix,
                related=(related(cause, "train() here left it in train mode", Role.TRAIN_CALL),
                         related(f.step, "the optimizer step of that update", Role.STEP)),
                step=f.step_index,
                evidence={"model": model, "layers": [tl.name(m) for m in mids],
                          "unchanged_steps": steps, "nested": bool(f.event.get("nested")),
                          "inference_mode": bool(f.event.get("inference"))},
            )
