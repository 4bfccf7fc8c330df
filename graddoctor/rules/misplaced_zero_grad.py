from __future__ import annotations

import ast
import math

from ..findings import Role, Safety, Severity
from .base import Rule, helper_call, related
from .source import move_after, related_line
from .step_before_backward import step_before_backward
from ..analysis.source import walk


class MisplacedZeroGrad(Rule):
    """
    ## What it does
    Finds a clear (`zero_grad`, or `p.grad = None` through `model.zero_grad()`) that throws away
    gradients of the current update before the optimizer step that should use them: zero_grad
    between backward and step, between two losses, or before every micro-batch of an
    accumulation loop, or a second clear at the start of each pass that drops the micro-batches
    the previous pass left over after its last step (YOLOv5's `optimizer.zero_grad()` before
    the batch loop, beside the `zero_grad()` after each step: the fix removes it). Silent when the dropped backward had another purpose: an input gradient
    (FGSM adversarial examples) or the closure of `optimizer.step(closure)` (L-BFGS); and when
    the script skipped that update on purpose: a `clip_grad_norm_` saw the dropped gradients
    non-finite (`if not torch.isfinite(norm): continue`), the dropped gradient moved the weights
    by hand before a second backward (SAM's ascent step), or the clear usually runs after a step
    and drops a backward only in a minority of the updates (a conditional skip, not a clear in
    the wrong place). A clear that drops the backward of a loop whose `optimizer.step()` runs
    before `backward()` is left to step-before-backward: there the step must move, not the
    clear.

    ## Why is this bad?
    The step then applies zero or only the last micro-batch's gradient: training silently does
    nothing, or uses 1/k of the batch you think it uses.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        (loss_fn(model(x), y) / k).backward()
        if (i + 1) % k == 0:
            optimizer.step()
    ```

    ## Use instead
    ```python
    for i, (x, y) in enumerate(loader):
        (loss_fn(model(x), y) / k).backward()
        if (i + 1) % k == 0:
            optimizer.step()
            optimizer.zero_grad()   # clear after the step, at the window's end
    ```

    ## Stays silent on
    A backward whose gradients serve another purpose: FGSM's input gradient, SAM's first
    pass at the perturbed point, a WGAN-GP penalty through `autograd.grad`, MAML's
    functional inner steps; L-BFGS's `step(closure)`; an update skipped on purpose (a loss
    spike, a non-finite norm) and dropped by the next clear; the step first in the loop body
    (step → zero_grad → forward → backward); the optimizer stepped inside the backward; a
    GAN's discriminator part of the generator's backward; gradients collected by a loop that
    reads `.grad` into something and steps nothing (an EWC Fisher information: `zero_grad`,
    backward, `fisher[n] += p.grad ** 2` per batch); a side pass whose backward line never
    feeds a step while another line's backward does, whose gradients the lines before the
    clear read into something (a validation backward for a gradient-norm log, then
    `zero_grad()`).
    """

    code = "GD104"
    slug = "misplaced-zero-grad"
    severity = Severity.ERROR
    summary = "zero_grad() discards gradients before the step that should use them"
    fix = "move the clear after optimizer.step() (or before the first backward of the update)"

    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """Move the clear to right after the step that should have used the gradients (in an
        accumulation window: into the step's ``if``); a clear inside the script's helper moves
        with the helper's call in the loop."""
        helper_line = related_line(finding, Role.HELPER_CALL)
        clear = src.statement_at(helper_line or finding.location.line)
        if clear is not None and helper_line is None and (finding.evidence or {}).get("cleared_after_step_at"):
            # the update already clears after its step: this clear only drops a leftover window
            return self.edit("remove the clear that drops the leftover gradients", src.delete(clear))
        step_line = related_line(finding, Role.STEP)
        step = src.statement_at(step_line) if step_line else None
        if clear is None or step is None or step is clear:
            return None
        moved = move_after(src, clear, step)
        return self.edit("move the clear after the step", *moved) if moved else None

    def check(self, a):
        groups: dict = {}
        for d in a.ledger.discards:
            if not _seen_nonfinite(a, d) and not _weights_perturbed(a, d) and not _gradients_read(a, d) \
                    and not _side_pass(a, d):
                groups.setdefault(d.clear.loc, []).append(d)
        # clear → step → backward: the step, not the clear, is misplaced (step-before-backward)
        claimed = step_before_backward(a) if groups else {}
        for loc, discards in groups.items():
            if _skipped_update(a, loc, discards) or (loc is not None and (loc.path, loc.line) in claimed):
                continue
            first = discards[0]
            pids = [d.pid for d in discards]
            dropped = first.contributions[0].backward
            helper = helper_call(a, first.clear)
            fix = None
            after_step = _cleared_after_step(a, first, loc)
            if helper is not None:  # the line to move is the helper's call in the loop
                fix = (f"move the call of {loc.function}() at line {helper.location.line} after "
                       f"optimizer.step() (or before the first backward of the update)")
            elif after_step is not None:
                fix = (f"remove this clear: the update already clears after its step (line "
                       f"{after_step}), so the batches left over at the end of a pass would join "
                       f"the next update (or step on them before the pass ends)")
            yield self.finding(
                f"this clear discards the gradients of {a.names(pids)} from a backward that no "
                f"step has used yet; the next optimizer step (step {first.later_step_index}) then "
                f"misses them",
                loc,
                fix=fix,
                related=(helper,
                         related(dropped, "the backward whose gradients are discarded", Role.BACKWARD),
                         related(first.later_step, "the step that should have used them", Role.STEP)),
                step=first.later_step_index,
                evidence={"params": [a.param_name(p) for p in dict.fromkeys(pids)],
                          "discarded_backward_calls": len(first.contributions),
                          **({"cleared_after_step_at": after_step} if after_step is not None else {})},
            )


def _cleared_after_step(a, d, loc) -> int | None:
    """The line of another clear of the same optimizer that runs right after its step (an
    accumulation window's ``step(); zero_grad()``), when the discarding clear at ``loc`` is a
    second one: a clear at the start of each pass (YOLOv5's ``optimizer.zero_grad()`` before
    the batch loop) that drops the micro-batches a pass left over. None otherwise."""
    opt = d.clear.get("opt")
    if opt is None or loc is None:
        return None
    after_step = False
    for e in a.of_kind("step", "clear"):
        if e.get("opt") != opt:
            continue
        if e.kind == "step":
            after_step = True
            continue
        if after_step and e.loc is not None and e.loc != loc and e.loc.path == loc.path:
            return e.loc.line
        after_step = False
    return None


def _nonfinite(value) -> bool:
    if isinstance(value, str):
        return value.lower() in ("inf", "-inf", "nan")
    return isinstance(value, float) and not math.isfinite(value)


def _seen_nonfinite(a, d) -> bool:
    """A clip_grad_norm_ between the dropped backward and the clear returned a non-finite total
    norm for this parameter's gradient: the script skipped a step on NaN/Inf gradients (``if not
    torch.isfinite(norm): continue``) and the clear drops them on purpose."""
    since, until = d.contributions[-1].backward.seq, d.clear.seq
    for e in a.span(since, until):
        if e.kind == "clip" and d.pid in e["params"] and _nonfinite(e.get("total_norm")):
            return True
    return False


def _gradients_read(a, d) -> bool:
    """The dropped backward sits in a loop of the script that reads ``.grad`` into something
    and never steps an optimizer: the gradients are statistics the script collects (an EWC
    Fisher information, per-sample gradient norms), cleared before each batch or before the
    training that follows on purpose, and no step was meant to use them."""
    backward = d.contributions[-1].backward.loc
    if backward is None:
        return False
    loop = a.source.innermost_loop(backward.path, backward.line)
    if loop is None:
        return False
    tree = a.source.tree(backward.path)
    if tree is None:
        return False
    reads = False
    for node in walk(tree):
        line = getattr(node, "lineno", None)
        if line is None or not loop[0] <= line <= loop[1]:
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step":
            return False  # an optimizer (or scheduler) steps in this loop: a training loop
        value = node.value if isinstance(node, (ast.Assign, ast.AugAssign)) else \
            node.args[0] if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("append", "extend", "add_", "copy_") and node.args else None
        if value is not None and any(isinstance(n, ast.Attribute) and n.attr == "grad"
                                     for n in walk(value)):
            reads = True
    return reads


def _side_pass(a, d) -> bool:
    """The dropped backward is a side pass whose gradients the script reads and then clears on
    purpose: no backward from its line ever reached a step (every one was dropped), another
    line's backward is the one the steps use for this parameter, and the lines from the dropped
    backward to the clear read ``.grad`` into something (a validation pass's gradient norm for a
    log: ``val_loss.backward(); gn = sum(p.grad.norm() ...); opt.zero_grad()``)."""
    dropped = d.contributions[-1].backward
    here, clear = dropped.loc, d.clear.loc
    if here is None or clear is None or clear.path != here.path or clear.line <= here.line:
        return False
    pid = d.pid
    discarded = {c.backward.seq for x in a.ledger.discards if x.pid == pid for c in x.contributions}
    other = False
    for e in a.of_kind("backward"):
        if pid not in (*e.get("fresh", ()), *e.get("accumulated", ())) or e.loc is None:
            continue
        if (e.loc.path, e.loc.line) == (here.path, here.line):
            if e.seq not in discarded:
                return False  # this line's backward fed a step once: the clear is misplaced
        elif e.seq not in discarded:
            other = True  # another line's backward that a step used
    if not other:
        return False
    tree = a.source.tree(here.path)
    if tree is None:
        return False
    for node in walk(tree):
        line = getattr(node, "lineno", None)
        if line is None or not here.line < line < clear.line:
            continue
        value = node.value if isinstance(node, (ast.Assign, ast.AugAssign)) else \
            node.args[0] if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("append", "extend") and node.args else None
        if value is not None and any(isinstance(n, ast.Attribute) and n.attr == "grad"
                                     for n in walk(value)):
            return True
    return False


def _skipped_update(a, loc, discards) -> bool:
    """The clear at ``loc`` runs after a step in most updates and drops a backward only in a
    minority of them: the script skipped those updates on a condition of its own (a loss spike,
    a non-finite check on CUDA where graddoctor does not read the norm), which is not a clear in
    the wrong place. A misplaced clear drops gradients every update or every micro-batch."""
    clears = [e for e in a.of_kind("clear") if e.loc == loc]
    dropping = {d.clear.seq for d in discards}
    dropped = a.count(e for e in clears if e.seq in dropping)
    return dropped * 2 < a.count(clears) - dropped


def _weights_perturbed(a, d) -> bool:
    """Sharpness-aware minimization: the dropped backward's gradient perturbed the weights in
    place (``p.add_(e)`` under no_grad), the clear makes room for the backward at the perturbed
    point, and the step applies that one. Seen as: a backward between the clear and the step,
    and the step found this parameter changed in place by hand since its previous step."""
    step = d.later_step
    backward = begin = None
    edited = False  # the weights' sampled values changed between the two backwards (instrument/weightedits.py)
    for e in a.span(d.clear.seq, step.seq):
        if e.kind == "backward" and d.pid in (*e.get("fresh", ()), *e.get("accumulated", ())):
            backward = e
        elif e.kind == "step_begin" and e.get("opt") == step.get("opt"):
            begin = e
        elif e.kind == "weights_edited" and backward is None:
            edited = True  # most sampled weights moved: those not sampled (past 16) did too
    return backward is not None and (edited or begin is not None
                                     and d.pid in (begin.get("edited_params") or ()))
