from __future__ import annotations

from collections import Counter

from ..findings import Severity
from .base import Rule, plural, related

MIN_RUN = 2  # consecutive updates at which a parameter was found edited by hand
MIN_EDITED = 2  # a teacher copies a whole model; one hand-edited tensor is a projection


class EmaTeacherTrained(Rule):
    """
    ## What it does
    Finds a mean-teacher / EMA / momentum-encoder setup whose teacher is also in the
    optimizer and gets gradients: parameters that the optimizer steps with a gradient at each
    update and that are overwritten in place between the updates (an EMA), while the optimizer
    also holds an untouched copy of each of them (the student).

    ## Why is this bad?
    The teacher is supposed to be an exponential moving average of the student. Here the
    optimizer moves it along its own gradients as well, and the EMA update then blends that
    trained state with the student: the teacher is neither the average it should be nor a
    trained model, and consistency or self-distillation losses lose their target. Nothing
    fails; the teacher's metrics just drift.

    ## Example
    ```python
    model = MeanTeacher(student, teacher)          # holds both
    optimizer = torch.optim.AdamW(model.parameters())
    for x in loader:
        loss = consistency(model.student(x), model.teacher(x))  # the teacher gets grads
        optimizer.zero_grad(); loss.backward(); optimizer.step()
        with torch.no_grad():
            for t, s in zip(model.teacher.parameters(), model.student.parameters()):
                t.mul_(0.99).add_(s, alpha=0.01)
    ```

    ## Use instead
    ```python
    teacher.requires_grad_(False)
    optimizer = torch.optim.AdamW(student.parameters())
    for x in loader:
        with torch.no_grad():
            target = teacher(x)
        loss = consistency(student(x), target)
        optimizer.zero_grad(); loss.backward(); optimizer.step()
        with torch.no_grad():
            for t, s in zip(teacher.parameters(), student.parameters()):
                t.mul_(0.99).add_(s, alpha=0.01)
    ```

    ## Stays silent on
    An EMA teacher, BYOL target or MoCo momentum encoder owned by no optimizer, or frozen,
    run under `no_grad` and updated in place after the step; a teacher under `no_grad` that
    is not in the optimizer; SWA's averaged model; a Lookahead wrapper's slow weights; WGAN
    weight clipping (a projection after the step, not an EMA).
    """

    code = "GD111"
    slug = "ema-teacher-trained"
    severity = Severity.WARNING
    summary = "an EMA teacher is also stepped by the optimizer: trained and overwritten"
    fix = ("keep the teacher out of the optimizer (build it over the student's parameters only; "
           "teacher.requires_grad_(False)) and run the teacher's forward under torch.no_grad()")

    def check(self, a):
        begins: dict[int, list] = {}
        for event in a.of_kind("step_begin"):
            if not event.get("closure"):
                begins.setdefault(event["opt"], []).append(event)
        for opt, events in begins.items():
            run: dict[int, int] = {}
            teacher: dict[int, int] = {}  # pid -> seq of the step_begin that confirmed it
            ever_edited: set[int] = set()
            for event in events:
                edited = set(event.get("edited_params") or ())
                ever_edited |= edited
                run = {pid: run.get(pid, 0) + 1 for pid in edited}
                for pid, count in run.items():
                    if count >= MIN_RUN:
                        teacher.setdefault(pid, event.seq)
            if len(teacher) < MIN_EDITED:
                continue
            owned = list(dict.fromkeys(a.opt_params.get(opt, ())))
            untouched = [pid for pid in owned if pid not in ever_edited]
            if not self._has_twin(a, list(teacher), untouched):
                continue  # no copy among the optimizer's other params: a projection (clipping)
            pids = sorted(teacher, key=lambda pid: (teacher[pid], pid))
            stepped = self._first_step_with_grad(a, opt, set(pids))
            init = a.optimizers.get(opt)
            name = a.optimizer_name(opt)
            message = (f"this {name} trains {a.names(pids)} ({plural(len(pids), 'parameter')}), "
                       f"which are also overwritten in place after each step (an EMA teacher): "
                       f"they get gradients and {name} steps them, then the EMA update blends "
                       f"that trained state with the student, so the teacher is no longer an "
                       f"average of the student")
            yield self.finding(
                message, init.loc if init is not None else None,
                related=(related(stepped, "a step that applies gradients to the teacher"),),
                step=a.step_number.get(stepped.seq) if stepped is not None else None,
                evidence={"optimizer": opt, "params": a.param_names(pids, limit=8),
                          "edited": len(pids), "student_params": len(untouched)},
            )

    @staticmethod
    def _has_twin(a, edited: list[int], untouched: list[int]) -> bool:
        """Every edited param's shape is matched by a distinct untouched one (multisets)."""
        def shape(pid):
            event = a.params.get(pid)
            value = event.get("shape") if event is not None else None
            return tuple(value) if value is not None else None

        need = Counter(shape(pid) for pid in edited)
        if None in need:
            return False
        have = Counter(shape(pid) for pid in untouched)
        return all(have[s] >= n for s, n in need.items())

    @staticmethod
    def _first_step_with_grad(a, opt: int, pids: set[int]):
        for step in a.steps:
            if step.get("opt") == opt and not step.get("skipped") \
                    and not pids.intersection(step.get("without_grad") or ()):
                return step
        return None
