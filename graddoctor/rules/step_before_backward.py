from __future__ import annotations

import bisect
from dataclasses import dataclass

from ..analysis import written
from ..findings import Role, Safety, Severity
from ..trace import Event, Location
from .base import Rule, related
from .source import move_after, related_line


class StepBeforeBackward(Rule):
    """
    ## What it does
    Finds an `optimizer.step()` that runs before the `loss.backward()` of its own pass of the
    loop, after the gradients were cleared: in every update the step applies no gradient, and
    the gradients backward() computes afterwards are cleared by the next `zero_grad()` before
    any step uses them. Read from the order of the calls in the loop body (the update
    timeline) together with the gradients each clear drops. Silent when the backward's
    gradients do reach a step: a step at the top of the loop with the clear right after it
    (`step → zero_grad → forward → backward`, an update delayed by one pass), the closure of
    `optimizer.step(closure)` (L-BFGS), gradient accumulation, a GAN's two updates.

    ## Why is this bad?
    Nothing trains: each step sees `None` (or zero) gradients, so the weights do not move
    (or only weight decay and stale momentum move them), while the loss is computed and
    backpropagated as if they did. Moving the clear instead (after the step) does not help:
    the step then changes the weights in place between the forward and the backward that
    still needs them, which autograd refuses, or applies the previous pass's gradient.

    ## Example
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        optimizer.step()
        loss.backward()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Stays silent on
    A step first in the loop body with the clear right after it (step → zero_grad → forward
    → backward: applied one pass later, also with an inner accumulation loop); the ordinary
    order with the step written after a logging line; `zero_grad` at the end of the
    iteration; L-BFGS's `step(closure)`; a GAN's two updates; a WGAN-GP penalty; AMP with
    accumulation.
    """

    code = "GD117"
    slug = "step-before-backward"
    severity = Severity.ERROR
    summary = "optimizer.step() runs before backward(): every step applies cleared gradients"
    fix = "move optimizer.step() after loss.backward()"

    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """Move the step statement to right after the backward statement, or after the call of
        the script's helper that runs it, when both sit in the same block after the step (a
        step inside an ``if`` of its own is left to a person)."""
        step = src.statement_at(finding.location.line)
        if step is None:
            return None
        back_line = related_line(finding, Role.BACKWARD)
        backward = src.statement_at(back_line) if back_line else None
        if backward is not None and (backward.parent is not step.parent or backward.block != step.block):
            backward = _helper_call_after(src, step, finding.evidence.get("backward_function"))
        if backward is None or backward is step or backward.line <= step.end_line \
                or step.parent is not backward.parent or step.block != backward.block:
            return None
        moved = move_after(src, step, backward)
        return self.edit("move the step after the backward", *moved) if moved else None

    def check(self, a):
        for claim in step_before_backward(a).values():
            step, backward, clear = claim.step, claim.backward, claim.clear
            opt = step.get("opt")
            pids = claim.pids
            none = set(pids) <= set(step.get("without_grad") or ())
            applies = ("no gradient at all (every .grad is None, so the optimizer skips the "
                       "parameters)" if none else
                       "zeroed gradients (only momentum or weight decay move the weights)")
            clear_line = clear.loc.line if clear.loc else "?"
            back_line = backward.loc.line if backward.loc else "?"
            yield self.finding(
                f"this optimizer.step() of {a.optimizer_name(opt)} runs before the backward() at "
                f"line {back_line} in every update, after the clear at line {clear_line} has emptied "
                f"the gradients of {a.names(pids)}: each step applies {applies} and the model does "
                f"not train, while the gradients the backward computes are cleared before any "
                f"step uses them",
                step.loc,
                related=(related(backward, "the backward whose gradients no step uses", Role.BACKWARD),
                         related(clear, "the clear that discards them before the next step")),
                fix=_fix_text(a, step, backward),
                step=claim.step_index,
                evidence={"params": [a.param_name(p) for p in pids[:8]],
                          "updates": claim.updates, "grads_none": none,
                          "backward_function": None if _same_body(step.loc, backward.loc)
                          or backward.loc is None else backward.loc.function},
            )


def _fix_text(a, step: Event, backward: Event) -> str | None:
    """The fix in the script's names: ``move opt.step() after loss.backward() (line 12)``."""
    if step.loc is None or backward.loc is None:
        return None
    opt = a.source.called_object(step.loc.path, step.loc.line, "step")
    loss = a.source.called_object(backward.loc.path, backward.loc.line, "backward")
    if not opt:
        return None
    after = f"{loss}.backward()" if loss else "the backward()"
    if not _same_body(step.loc, backward.loc) and backward.loc.function \
            and backward.loc.function != "<module>":
        after = f"the call of {backward.loc.function}() that runs {after} (line {backward.loc.line})"
    else:
        after += f" (line {backward.loc.line})"
    return f"move {opt}.step() after {after}, so that it applies the gradients of this update"


@dataclass
class Claim:
    """One step-before-backward layout: the clear at ``clear.loc`` drops what the backward at
    ``backward.loc`` wrote, and the step at ``step.loc`` that follows the clear applied nothing
    fresh; ``updates``: how many updates showed it."""

    clear: Event
    step: Event
    backward: Event
    step_index: int | None
    pids: list[int]
    updates: int


def _key(loc: Location | None):
    return None if loc is None else (loc.path, loc.line)


def step_before_backward(a) -> dict:
    """Clear location -> ``Claim``, for each clear whose every discard (analysis/ledger.py) is
    the step-before-backward layout: the step after the clear applied nothing fresh for the
    dropped parameter (no backward wrote it in between), and the dropped backward ran after the
    previous step of that optimizer at the same line, later in the same turn of the loop
    (analysis/turns.py): clear → step → backward (or step → backward → clear). misplaced-zero-grad
    leaves these clears to this rule: there the step, not the clear, is what must move."""
    groups: dict = {}
    for d in a.ledger.discards:
        groups.setdefault(_key(d.clear.loc), []).append(d)
    if not groups:
        return {}
    steps_of: dict = {}
    for s in a.steps:
        steps_of.setdefault(s.get("opt"), []).append(s)
    turn_of = {n: t for t in a.turns for n in t.steps}
    judged: dict = {}
    first_steps: dict = {}

    def fits(d) -> Event | None:
        """The step before the dropped backward, when ``d`` has the layout."""
        step = d.later_step
        backward = d.contributions[-1].backward
        key = (d.clear.seq, step.seq, backward.seq, d.pid)
        if key in judged:
            return judged[key]
        judged[key] = None
        if any(e.kind == "backward" and d.pid in written(e) for e in a.span(d.clear.seq, step.seq)):
            return None  # the step applies a fresh gradient: not an empty step
        mine = steps_of.get(step.get("opt"), [])
        i = bisect.bisect_left([s.seq for s in mine], backward.seq) - 1
        if i < 0:
            return None  # no step before the backward (a clear between backward and step)
        before = mine[i]
        if _key(before.loc) != _key(step.loc):
            return None
        if _same_body(step.loc, backward.loc):
            turn = turn_of.get(a.step_number.get(before.seq))
            if turn is None or not _step_then_backward(turn.items, step.loc, backward.loc):
                return None
        elif not _first_step_empty(a, step, d.pid, first_steps):
            # a backward in the script's helper: the turns cut at its earlier line, so read the
            # loop's first pass instead, which ran its step before any backward
            return None
        judged[key] = before
        return before

    claims: dict = {}
    for loc, discards in groups.items():
        if loc is None or not all(fits(d) is not None for d in discards):
            continue
        first = discards[0]
        pids = list(dict.fromkeys(d.pid for d in discards if d.clear is first.clear))
        updates = a.count({d.later_step.seq: d.later_step for d in discards}.values())
        claims[loc] = Claim(first.clear, first.later_step, first.contributions[-1].backward,
                            first.later_step_index, pids, updates)
    return claims


def _helper_call_after(src, step, function: str | None):
    """The statement after ``step`` in its block that calls ``function`` (the script's helper
    that runs the backward), when exactly one does."""
    if not function or function.startswith("<"):
        return None
    cst = src.cst
    siblings = [s for s in src.statements if s.parent is step.parent and s.block == step.block
                and s.line > step.end_line]
    found = []
    for s in siblings:
        for call in src.nodes(cst.Call, within=s):
            func = call.func
            name = func.attr.value if isinstance(func, cst.Attribute) else \
                func.value if isinstance(func, cst.Name) else None
            if name == function:
                found.append(s)
                break
    return found[0] if len(found) == 1 else None


def _same_body(step_loc: Location | None, backward_loc: Location | None) -> bool:
    return (step_loc is not None and backward_loc is not None and step_loc.path == backward_loc.path
            and step_loc.function == backward_loc.function)


def _first_step_empty(a, step: Event, pid: int, cache: dict) -> bool:
    """The first step at ``step``'s line (of its optimizer) ran before any backward wrote
    ``pid``: the loop's first pass stepped before it backpropagated."""
    key = (step.get("opt"), _key(step.loc))
    if key not in cache:
        first = next((s for s in a.steps if (s.get("opt"), _key(s.loc)) == key), None)
        written_before: set = set()
        if first is not None:
            for e in a.span(-1, first.seq):
                if e.kind == "backward":
                    written_before.update(written(e))
        cache[key] = written_before
    return pid not in cache[key]


def _step_then_backward(items, step_loc, backward_loc) -> bool:
    """In one turn's calls: the step at ``step_loc`` comes before the backward at
    ``backward_loc``."""
    step_key, back_key = _key(step_loc), _key(backward_loc)
    seen_step = False
    for item in items:
        key = _key(item.loc)
        if "step" in item.kinds and key == step_key:
            seen_step = True
        elif "backward" in item.kinds and key == back_key:
            return seen_step
    return False
