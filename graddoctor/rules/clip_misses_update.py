from __future__ import annotations

from ..findings import Role, Severity
from .base import Rule, related, times


def _windows(a):
    """Each stretch between two backwards: the clips that ran after the backward and, after
    them, the optimizer steps (not skipped, no closure), and the params whose gradients
    unwatched code changed in place after the first clip (``grad_edit``)."""
    clips: list = []
    steps: list = []
    edited: set = set()
    for e in a.events:
        kind = e.kind
        if kind == "backward":
            if clips and steps:
                yield clips, steps, edited
            clips, steps, edited = [], [], set()
        elif kind == "clip":
            if not e.get("norm_only") and (e.get("params") or e.get("untracked")) and not steps:
                clips.append(e)  # an empty call is clip-clips-nothing's; after a step, another bug
        elif kind == "grad_edit" and clips:
            edited.update(e["params"])
        elif kind == "step" and clips and not e.get("skipped") and not e.get("closure"):
            steps.append(e)
    if clips and steps:
        yield clips, steps, edited


class ClipMissesUpdate(Rule):
    """
    ## What it does
    Finds gradient clipping that covers none of the gradients the optimizer steps right after
    it: every tensor handed to the clip either has no gradient (an EMA or teacher copy, a
    frozen module, an old model the loss no longer reaches) or belongs to no optimizer that
    steps. The clips between a backward and the steps after it are judged together, so
    clipping a part of the model on purpose (only the encoder), per-group clips, and a clip
    over `model.parameters()` where some are frozen stay silent: some clipped gradient is
    applied. A step whose gradients were changed in place after the clip (copied from the
    clipped ones into fp32 master weights) is left alone.

    ## Why is this bad?
    The update is not clipped at all: the spikes the clip was written against go straight
    into the weights, while the clip runs every step and returns a norm (often 0) that makes
    the logs look healthy.

    ## Example
    ```python
    ema = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(ema.parameters(), 1.0)   # the EMA copy: no gradients
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the model the optimizer steps
        optimizer.step()
    ```

    ## Stays silent on
    Clipping only a part of the model on purpose; per-group clips; clipped gradients copied
    into fp32 master weights; hand-written clipping (`p.grad.mul_`, seen as in-place edits);
    a clip over `model.parameters()` while the backbone is frozen.
    """

    code = "GD215"
    slug = "clip-misses-update"
    severity = Severity.WARNING
    summary = "a gradient clip covers none of the gradients the optimizer step after it applies"
    fix = "clip the parameters the optimizer steps (the trained model's parameters()), between backward() and the step"

    def check(self, a):
        groups: dict = {}
        for clips, steps, edited in _windows(a):
            clipped = set().union(*(c.get("with_grad") or () for c in clips))
            applied: dict[int, None] = {}
            for step in steps:
                without = set(step.get("without_grad") or ())
                applied.update(dict.fromkeys(p for p in a.opt_params.get(step["opt"], ())
                                             if p not in without))
            if not applied or clipped & applied.keys() or edited & applied.keys():
                continue
            groups.setdefault(clips[0].loc, []).append((clips, steps, list(applied), clipped))
        for loc, items in groups.items():
            clips, steps, applied, clipped = items[0]
            clip, step = clips[0], steps[0]
            given = sum(len(c.get("params") or ()) + (c.get("untracked") or 0) for c in clips)
            owned = [p for p in clipped if p in a.owners]
            if not clipped:
                why = (f"none of the {given} tensors it is given has a gradient (a frozen module, "
                       f"or a copy the loss does not reach, such as an EMA or an old model)")
            elif owned:
                why = (f"the gradients it clips ({a.names(sorted(clipped))}) are not the ones "
                       f"this update applies")
            else:
                why = (f"the gradients it clips ({a.names(sorted(clipped))}) belong to "
                       f"parameters no optimizer steps")
            names = sorted({a.optimizer_name(s["opt"]) for s in steps})
            occurrences = a.count(i[1][0] for i in items)
            opt_var = (a.source.called_object(step.loc.path, step.loc.line, "step") if step.loc else None)
            fix = self.fix
            if opt_var and opt_var.isidentifier():
                fix = (f"clip the parameters {opt_var} steps (the trained model's parameters(), "
                       f"not a copy's or a frozen module's), between backward() and "
                       f"{opt_var}.step()")
            yield self.finding(
                f"this {clip.get('via') or 'clip'}() clips nothing the update applies: {why}, so "
                f"{' and '.join(names)} steps the unclipped gradients of {a.names(applied)} "
                f"(seen {times(occurrences)})",
                loc, step=a.step_number.get(step.seq), fix=fix,
                related=(related(step, "the step that applies the unclipped gradients", Role.STEP),),
                evidence={"clip": clip.get("via"), "given": given,
                          "clipped": a.param_names(sorted(clipped), limit=8),
                          "applied": a.param_names(applied, limit=8),
                          "occurrences": occurrences},
            )
