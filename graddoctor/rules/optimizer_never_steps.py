from __future__ import annotations

from ..findings import Safety, Severity
from .base import Rule, one_or_many, related
from .source import call_bare_method

# A replay that ended this way saw the whole loop (or enough of it) to say "never".
JUDGED = ("completed", "step-limit", "backward-limit")
# a run graddoctor cut short: an optimizer whose parameters only the last few backwards filled
# may step right after them (a loop of its own that starts late: d2l's train_concise_ch11 after
# 900 backwards of hand-written optimizers)
CUT = ("step-limit", "backward-limit")
FED_AT_THE_CUT = 8  # backwards into its parameters below which a cut run says nothing


class OptimizerNeverSteps(Rule):
    """
    ## What it does
    Finds an optimizer whose parameters receive gradients from `backward()` while the optimizer
    itself is never stepped: `optimizer.step` written without parentheses, a `scaler.step(opt)`
    deleted, a step left behind a condition that is never true. Where other optimizers step
    and this one's `zero_grad()` still runs every update (the step of one of two optimizers
    dropped: a GAN's discriminator, an actor-critic's critic), it points at the backward that
    fills its gradients, after which its step belongs; otherwise at its construction.

    ## Why is this bad?
    Nothing updates the parameters: the loss is computed, gradients pile up in `.grad`, and the
    model never changes. The script runs to its end without an error, and a loss that does not
    move is easily blamed on the learning rate.

    ## Example
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step          # a reference to the method, never called
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    ```

    ## Stays silent on
    An optimizer stepped rarely (a GAN's generator once per 20 critic steps); the step taken
    as a bound method or from a helper; a Lookahead wrapper stepping its inner optimizer;
    optimizers stepped inside the backward; a script with no torch optimizer; a Lightning
    `training_step` that skips batches; an optimizer whose loop starts late, filled by fewer
    than 8 backwards when graddoctor stopped the run at its step or backward budget (after 900
    backwards of hand-written updates, d2l's `train_concise_ch11`).
    """

    code = "GD107"
    slug = "optimizer-never-steps"
    severity = Severity.ERROR
    summary = "backward() fills the gradients of an optimizer that is never stepped"
    fix = "call optimizer.step() (or scaler.step(optimizer)) once per update, after the backward"

    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """Call a bare ``optimizer.step`` (the statement only names the method)."""
        bare = call_bare_method(src, finding.location.line, ("step",))
        return self.edit("call the step the statement only names", bare) if bare else None

    def check(self, a):
        if a.status not in JUDGED:
            return  # crashed or timed out: the script may not have reached its step yet
        stepped = {s["opt"] for s in a.steps}
        for opt, init in a.optimizers.items():
            if opt in stepped:
                continue
            fed = [pid for pid in dict.fromkeys(a.opt_params.get(opt, ())) if pid in a.ledger.first_contribution]
            if not fed:
                continue  # its parameters got no gradient: nothing was meant to be applied
            if all(stepped.intersection(a.owners.get(pid, ())) for pid in fed):
                continue  # a stepped optimizer owns them all: a wrapper (Lookahead) steps this one
            first = min((a.ledger.first_contribution[pid] for pid in fed), key=lambda e: e.seq)
            feeding = set(fed)
            recorded = a.by_kind.get("backward", ())
            backwards = sum(1 for b in recorded if feeding.intersection(
                (*b.get("fresh", ()), *b.get("accumulated", ()), *b.get("cleared_outside", ()))))
            if a.status in CUT and backwards < FED_AT_THE_CUT:
                continue  # the run was stopped right after its first backwards: not judged
            if backwards == len(recorded):  # every backward filled them (folded ones too)
                backwards = a.backward_calls
            if stepped:
                others = ", ".join(sorted({a.optimizer_name(o) for o in stepped}))
                message = (f"this {a.optimizer_name(opt)} is never stepped while {others} "
                           f"{one_or_many(len(stepped), 'is', 'are')} ({a.step_count} steps): "
                           f"backward() fills the gradients of {a.names(fed)}, and nothing applies "
                           f"them; if it is meant for a later stage of training, ignore this")
                severity = Severity.WARNING
            else:
                message = (f"this {a.optimizer_name(opt)} is never stepped: {backwards} backward() "
                           f"calls filled the gradients of {a.names(fed)}, and no optimizer step "
                           f"ever applied them (is `optimizer.step` missing its parentheses?)")
                severity = None
            loc, fix, rel = init.loc, None, ()
            cleared = [c for c in a.of_kind("clear") if c.get("opt") == opt and c.loc is not None]
            if stepped and len(cleared) >= 2 and first.loc is not None:
                # its zero_grad() runs every update and its backward fills it, like the other
                # optimizers' whose step follows: a deleted `opt.step()` of one of two optimizers
                # (a GAN's discriminator), not a later stage's optimizer built ahead of time. The
                # step belongs after the backward that fills its gradients
                message = (f"this backward fills the gradients of {a.names(fed)}, which "
                           f"{a.optimizer_name(opt)} clears at every update "
                           f"({a.count(cleared)} zero_grad() calls) but never steps, while "
                           f"{others} {one_or_many(len(stepped), 'steps', 'step')} "
                           f"({a.step_count} steps): its parameters never change")
                loc, severity = first.loc, Severity.WARNING
                var = a.optimizer_variable(opt)
                fix = (f"call {var}.step() after this backward" if var else
                       f"step {a.optimizer_name(opt)} after this backward") + \
                    ", as the other optimizers are stepped after theirs"
                rel = (related(init, "the optimizer that never steps"),)
            bare = _bare_step(a, first)
            if bare is not None:  # `optimizer.step` named, not called: that statement is the bug
                loc, text = bare
                message = (f"`{text}` names the method without calling it: the statement does "
                           f"nothing, so {a.optimizer_name(opt)} never steps: {backwards} backward() "
                           f"calls filled the gradients of {a.names(fed)}, and nothing applied them")
                fix, severity = f"call it: {text}()", None
                rel = (related(init, "the optimizer that never steps"),)
            yield self.finding(
                message, loc, severity=severity, fix=fix,
                related=rel + (related(first, "a backward that fills its parameters' gradients"),),
                evidence={"optimizer": opt, "params": a.param_names(fed, limit=8),
                          "backward_calls": backwards, "steps": a.step_count},
            )


def _bare_step(a, backward):
    """``(location, text)`` of a ``something.step`` statement without parentheses in the loop
    around this backward (a no-op the trace cannot show), or None. A scheduler's is not ours."""
    loc = backward.loc
    if loc is None or loc.via:
        return None
    from dataclasses import replace


    lines = [(line, text) for line, text in a.source.bare_method_lines(loc.path, loc.line, "step")
             if "sched" not in text.lower()]
    return (replace(loc, line=lines[0][0]), lines[0][1]) if lines else None
