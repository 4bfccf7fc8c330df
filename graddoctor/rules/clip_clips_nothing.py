from __future__ import annotations

from ..findings import Role, Severity
from .base import Rule, related


class ClipClipsNothing(Rule):
    """
    ## What it does
    Finds a gradient clip that receives no parameters at all while the optimizer step after it
    applies gradients. The classic cause: `params = model.parameters()` is a *generator*; the
    optimizer's constructor reads it to the end, and `clip_grad_norm_(params, 1.0)` later gets
    the same, now empty, generator. The clip runs without an error and clips nothing.

    graddoctor records whether the iterable a clip was given is a generator (or a `filter` /
    `map` over one) that had already been iterated: then the finding is an `error`. An empty
    iterator it cannot look into (`itertools.chain`, a custom one) gives a `warning`. A clip
    given an empty list or a fresh generator that yields nothing (a filter over a frozen
    sub-module) was asked to clip nothing and is left alone, as is
    `clip_grad_norm_(params, inf)`, which only measures the norm.

    ## Why is this bad?
    The update is never clipped: the exploding gradients and loss spikes the clip was written
    against go straight into the weights, and the returned norm is 0, so a logged gradient norm
    looks perfectly healthy.

    ## Example
    ```python
    params = model.parameters()               # a generator
    optimizer = torch.optim.SGD(params, lr=0.1)  # reads it to the end
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)  # an empty generator: clips nothing
        optimizer.step()
    ```

    ## Use instead
    ```python
    params = list(model.parameters())         # a list can be iterated again
    optimizer = torch.optim.SGD(params, lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
    ```

    ## Stays silent on
    A clip over a list of parameters that can be iterated again; a fresh generator per clip;
    clipping only a part of the model, or a sub-module whose parameters are frozen for a
    while; `clip_grad_norm_(..., inf)` that only measures the norm; Lightning's clip hooks.
    """

    code = "GD208"
    slug = "clip-clips-nothing"
    severity = Severity.ERROR
    summary = "a gradient clip receives no parameters (a used-up generator): the update is unclipped"
    fix = ("pass the clip a list (`params = list(model.parameters())`), or call "
           "`model.parameters()` again at the clip")

    def check(self, a):
        groups: dict = {}
        for clip in a.of_kind("clip"):
            if clip.get("norm_only") or clip.get("params") or clip.get("untracked"):
                continue  # only measures the norm, or it did receive tensors
            spent = clip.get("spent")
            if spent is False:
                continue  # an empty list or a fresh generator: nothing was asked for
            step = a.next_step(clip.seq)
            if step is None or step.get("skipped") or self._clipped_later(a, clip, step):
                continue
            without = set(step.get("without_grad") or ())
            applied = [p for p in dict.fromkeys(a.opt_params.get(step["opt"], ())) if p not in without]
            if not applied:
                continue  # the step applies no gradient: nothing goes unclipped
            key = (clip.loc.path, clip.loc.line) if clip.loc else None
            groups.setdefault(key, []).append((clip, step, applied, spent))
        for items in groups.values():
            clip, step, applied, spent = items[0]
            yield self._finding(a, clip, step, applied, spent, a.count(i[0] for i in items))

    @staticmethod
    def _clipped_later(a, clip, step) -> bool:
        """Another clip of the step's parameters runs between this one and the step."""
        owned = set(a.opt_params.get(step["opt"], ()))
        return any(e.kind == "clip" and not e.get("norm_only") and owned.intersection(e.get("params") or ())
                   for e in a.after(clip.seq) if e.seq < step.seq)

    def _finding(self, a, clip, step, applied, spent, occurrences):
        opt = step["opt"]
        name = a.optimizer_name(opt)
        via = clip.get("via") or "the clip"
        if spent:
            cause = ("the iterable it is given had already been read to the end (a generator "
                     "like `params = model.parameters()`, handed to the optimizer first or to an "
                     "earlier clip)")
            severity = None
        else:
            cause = ("the iterator it is given yields nothing (a one-shot iterator such as "
                     "itertools.chain, already used up?)")
            severity = Severity.WARNING
        message = (f"this {via}() receives no parameters: {cause}, so it clips nothing and "
                   f"{name} steps the unclipped gradients of {a.names(applied)}")
        if occurrences > 1:
            message += f" ({occurrences} times in the replay)"
        init = a.optimizers.get(opt)
        return self.finding(
            message, clip.loc, severity=severity, step=a.step_number.get(step.seq),
            related=(related(step, "the step that applies the unclipped gradients", Role.STEP),
                     related(init, "the optimizer's construction, which reads a generator given "
                                   "to it to the end") if spent else None),
            evidence={"clip": via, "spent": spent, "optimizer": opt,
                      "params": a.param_names(applied, limit=8), "occurrences": occurrences},
        )
