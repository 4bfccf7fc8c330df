from __future__ import annotations

from ..findings import Related, Severity
from ..trace import Location
from ..analysis.lr import LrWriter
from ..analysis.source import ROUNDS as _ROUNDS
from .base import Rule

# optimizers whose update is a multiple of the lr (torch.optim's own; Rprop's step sizes start
# at lr and only ever scale by etaminus/etaplus): lr 0 moves nothing
_LR_SCALED = frozenset({"SGD", "Adam", "AdamW", "Adamax", "RMSprop", "Adagrad", "Adadelta", "NAdam",
                        "RAdam", "ASGD", "Rprop", "SparseAdam", "LBFGS", "Adafactor"})
# schedulers that compute the lr from their own arguments (max_lr, base_lr), not from the
# optimizer's lr: a 0 there is not carried forward
_OWN_LR = frozenset({"OneCycleLR", "CyclicLR"})
_MIN_HAND = 3  # updates with a hand-written lr of 0 before a rounding behind it is reported


class ZeroLearningRate(Rule):
    """
    ## What it does
    Finds an optimizer that steps with a learning rate of exactly 0 in every param group at
    every update seen, where nothing can raise it later: the lr is the one it was constructed
    with, or a scheduler multiplies a base lr of 0. It points at the optimizer's construction.
    A param group with lr 0 next to groups that train (a way to freeze a backbone) is reported
    only when its lr is an expression that rounds to 0 (`base_lr * (bs // 256)`,
    `int(lr_scale) * lr`), pointing at that expression; an lr the script writes itself (a
    hand-written warm-up may start at 0) and schedulers that set the lr from their own
    arguments (`OneCycleLR`, `CyclicLR`) are not reported — unless the script writes lr 0 at
    every update seen (3 or more) and the statement behind the write rounds
    (`base_lr * (step // warmup_steps)`, in the line or in the function it calls): a warm-up an
    integer division holds at 0, reported at that statement.

    ## Why is this bad?
    Every torch optimizer scales its update by the lr: with lr 0 no parameter ever changes,
    while the loop runs, the loss is computed and the gradients look healthy. The usual cause is
    an integer division in a scaling rule (`base_lr * (batch_size // 256)` is 0 below 256) or a
    configuration value that never arrived.

    ## Example
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * (batch_size // 256))
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1 * batch_size / 256)
    ```

    ## Stays silent on
    A backbone frozen by a param group with lr 0 (written as 0, or a setting that is 0) next to
    a head that trains; a warm-up whose factor is 0 for a while; a hand-written warm-up that
    starts at lr 0 without rounding (`base_lr * epoch / warmup_epochs`); a hand-written
    schedule that rounds but leaves the lr above 0 (`0.5 ** (epoch // 3)`); a LambdaLR that
    zeroes one group for the first epochs.
    """

    code = "GD116"
    slug = "zero-learning-rate"
    severity = Severity.WARNING
    summary = ("an optimizer steps with lr=0 in every param group, or in one while the others train "
               "(an lr that rounds to 0): its parameters never change")
    fix = "give the optimizer a positive lr"

    def check(self, a):
        for opt, groups in a.lr_timeline.items():
            init = a.optimizers.get(opt)
            if init is None or init.get("cls") not in _LR_SCALED or not groups:
                continue
            points = [p for g in groups.values() for p in g]
            if points and any(p.lr != 0 for p in points):
                yield from self._groups(a, opt, init, groups)
                continue
            if not points:
                continue  # None (not a plain number) counts as unknown: not reported
            if all(p.writer.by_hand for p in points):
                yield from self._rounded_by_hand(a, opt, init, points)
                continue
            by_scheduler = []
            as_built = LrWriter("optimizer", init.loc)
            for p in points:
                w = p.writer
                if w == as_built:
                    continue
                if w.sched is not None and w.cls not in _OWN_LR and self._base_lrs_zero(a, w.sched):
                    by_scheduler.append(w)  # a scheduler's factor times a base lr of 0
                    continue
                break  # written by the script, or by a schedule that may still raise it
            else:
                if self._script_writes_lr(a, opt, init):
                    continue  # a 0 written back by the script's own schedule looks unchanged
                steps = a.count(e for e in a.by_kind.get("step", ())
                                if e.get("opt") == opt and not e.get("skipped"))
                yield self._finding(a, opt, init, steps, by_scheduler)

    def _groups(self, a, opt, init, groups):
        """Param groups at lr 0 at every update, as built, next to groups that train: reported
        when the group's lr in the source is an expression that rounds (to 0)."""
        trains = any(p.lr for pts in groups.values() for p in pts)
        as_built = LrWriter("optimizer", init.loc)
        zero = [g for g, pts in groups.items()
                if pts and all(p.lr == 0 and p.writer == as_built for p in pts)]
        if not trains or not zero:
            return
        inits = [e for e in a.by_kind.get("optimizer_init", ()) if e.get("opt") == opt]
        steps = a.count(e for e in a.by_kind.get("step", ())
                        if e.get("opt") == opt and not e.get("skipped"))
        for g in zero:
            event, index = _group_event(inits, g)
            if event is None or event.loc is None:
                continue
            found = a.source.group_lr(event.loc.path, event.loc.line, index)
            if found is None or not _ROUNDS.search(found[1]):
                continue
            line, text = found
            cls = init.get("cls")
            fix = (f"`//` rounds down to 0 in `{text}`: use `/` (true division) for the lr"
                   if "//" in text else f"`{text}` rounds down to 0: compute the lr without rounding")
            yield self.finding(
                f"param group {g} of {cls} is given lr `{text}`, which rounds to 0: it steps with "
                f"lr 0 at all {steps} updates seen while the other groups train, so its "
                f"parameters never change",
                Location(event.loc.path, line), fix=fix, step=1,
                evidence={"optimizer": cls, "argument": text, "updates": steps, "group": g,
                          "groups": len(groups), "scheduler": None})

    def _rounded_by_hand(self, a, opt, init, points):
        """Every lr the script wrote itself was 0, at ``_MIN_HAND`` updates or more, and the
        statement behind the write rounds (``base_lr * (step // warmup_steps)``): a warm-up or
        a schedule that an integer division keeps at 0."""
        steps = a.count(e for e in a.by_kind.get("step", ())
                        if e.get("opt") == opt and not e.get("skipped"))
        writers = {p.writer.loc for p in points if p.writer.loc is not None}
        if steps < _MIN_HAND or len(writers) != 1:
            return
        (writer,) = writers
        found = a.source.rounding_behind(writer.path, writer.line)
        if found is None:
            return
        line, text = found
        cls = init.get("cls")
        fix = (f"`//` rounds down to 0 in `{text}`: use `/` (true division), e.g. "
               f"`base_lr * (step + 1) / warmup_steps` for a warm-up" if "//" in text
               else f"`{text}` rounds down to 0: compute the lr without rounding")
        yield self.finding(
            f"the lr the script writes into {cls}'s param groups is 0 at all {steps} updates "
            f"seen: `{text}` rounds down to 0, so no parameter changes while it does (a warm-up "
            f"written this way stays at 0 until it ends, then jumps to the full lr)",
            Location(writer.path, line), fix=fix, step=1,
            related=(Related(writer, "the lr written here"),) if line != writer.line else (),
            evidence={"optimizer": cls, "argument": text, "updates": steps,
                      "groups": len(a.lr_timeline.get(opt, {})), "scheduler": None})

    @staticmethod
    def _script_writes_lr(a, opt, init) -> bool:
        paths = {e.loc.path for e in a.by_kind.get("step", ()) if e.get("opt") == opt and e.loc}
        if init.loc is not None:
            paths.add(init.loc.path)
        return any(a.source.lr_assignment_lines(path) for path in paths)

    @staticmethod
    def _base_lrs_zero(a, sched) -> bool:
        s = a.schedulers.get(sched)
        base = (s.init.get("base_lrs") if s is not None and s.init is not None else None) or []
        return bool(base) and all(b == 0 for b in base)

    def _finding(self, a, opt, init, steps: int, by_scheduler):
        cls = init.get("cls")
        loc = init.loc
        given = a.source.call_argument(loc.path, loc.line, cls, 1, "lr") if loc is not None else None
        try:
            literal = float(given) if given else None
        except ValueError:
            literal = None  # an expression: shown as the source of the 0
        shown = given if given and literal is None else None
        cause = (f"lr=0 (from {shown})" if shown else "lr=0" if literal in (0, None)
                 else "lr=0 in each param group")
        if by_scheduler:
            cause += f", which its {by_scheduler[0].cls} only multiplies"
        fix = self.fix
        if shown and "//" in shown:
            fix = f"`//` rounds down to 0 in `{shown}`: use `/` (true division) for the lr"
        elif shown:
            fix = f"give the optimizer a positive lr: `{shown}` is 0 in this run"
        return self.finding(
            f"{cls} is built with {cause} and steps with lr 0 in every param group at all "
            f"{steps} updates seen: no parameter it owns ever changes, although the loss and "
            f"its gradients are computed every step",
            loc, fix=fix, step=1,
            evidence={"optimizer": cls, "argument": given, "updates": steps,
                      "groups": len(a.lr_timeline.get(opt, {})),
                      "scheduler": by_scheduler[0].cls if by_scheduler else None})


def _group_event(inits, group: int):
    """The optimizer_init event that added param group ``group`` of an optimizer, and the
    group's index among those it added."""
    for e in inits:
        n = len(e.get("lrs") or ())
        if group < n:
            return e, group
        group -= n
    return None, 0
