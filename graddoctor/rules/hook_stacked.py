from __future__ import annotations

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule, plural

_WHAT = {  # api -> (the hook, the value it transforms)
    "register_hook": ("gradient hook", "the gradient"),
    "register_forward_hook": ("forward hook", "the output"),
    "register_forward_pre_hook": ("forward pre-hook", "the input"),
    "register_full_backward_hook": ("backward hook", "the gradient"),
    "register_full_backward_pre_hook": ("backward pre-hook", "the output gradient"),
    "register_post_accumulate_grad_hook": ("post-accumulate-grad hook", "the gradient"),
}


class HookStacked(Rule):
    """
    ## What it does
    Finds a hook registered again and again on the same parameter or module during training,
    at one line, without removing the earlier ones: `p.register_hook(...)`,
    `module.register_forward_hook(...)`, `register_forward_pre_hook`,
    `register_full_backward_hook`, `register_full_backward_pre_hook` or
    `register_post_accumulate_grad_hook` called inside the training loop, once per epoch, in a
    step helper or in `forward`, where the handle is never removed. It reports only when a
    later copy, run after the earlier ones, still changed the value it was given (returned
    another, or edited it in place): the copies compound.

    ## Why is this bad?
    Each call adds one more hook; torch keeps every earlier one until its handle is removed.
    At the k-th update the gradient (or output, or input) passes through k copies of the
    transform: a hook that scales the gradient by 0.5 scales it by 0.5**k, a noise hook adds k
    draws, a temperature divides the logits by T**k, a normalising pre-hook normalises an
    already normalised input again. The update drifts further from the intended one at every
    step and nothing fails.

    ## Example
    ```python
    for step in range(steps):
        model.emb.weight.register_hook(lambda g: g * 0.1)   # one more copy every update
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    model.emb.weight.register_hook(lambda g: g * 0.1)       # once, before the loop
    for step in range(steps):
        ...
    ```
    or keep the handle and remove it after the backward (`handle.remove()`).

    ## Stays silent on
    A hook registered once; a hook registered at every step on a fresh tensor (an activation
    of this forward: Grad-CAM, a gradient capture); hooks removed through their handles before
    the next registration; re-registered hooks that return nothing (a feature capture that
    stores the output) or whose later copies return the value unchanged (a clamp applied
    twice is a clamp applied once); hooks registered by libraries; repeats within one update
    only. Not seen: copies registered after `torch.compile` ran (a compiled graph must call the
    user's function itself), and copies that only checked changing nothing 32 times.
    """

    code = "GD188"
    slug = "hook-stacked"
    severity = Severity.WARNING
    summary = ("a hook is registered again on the same parameter or module at every update and "
               "the earlier copies are never removed: the transform compounds")
    fix = ("register the hook once, before the training loop, or keep its handle and call "
           "handle.remove() after the backward")

    def check(self, a):
        for event in a.by_kind.get("hook_stacked", ()):
            if (event.get("updates") or 0) < 2 or event.loc is None:
                continue  # repeats within one update: a helper called twice, not a pile-up
            api = event.get("api")
            hook, value = _WHAT.get(api, ("hook", "the value"))
            pid = event.get("pid")
            if event.get("target") == "tensor":
                name = a.param_name(pid) if pid in a.params else None
                shape = event.get("shape")
                what = name or (f"a tensor of shape {tuple(shape)}" if shape is not None else "a tensor")
            else:
                name = a.param_name(pid) if pid in a.params else None
                owner = name.rsplit(".", 1)[0] if name and "." in name else None
                what = f"{owner} ({event.get('cls')})" if owner else f"a {event.get('cls')} module"
            copies = event.get("copies") or 2
            caller = event.get("caller")
            related = ()
            if caller and event.loc.function not in (None, "<module>"):
                related = (Related(Location(str(caller[0]), int(caller[1]), str(caller[2])),
                                   "the call that registers it again"),)
            step = a.next_step_number(event.seq)
            fix = None
            if event.loc.function == "forward":
                fix = ("register the hook once, in the module's __init__ (or before the training "
                       "loop), not in forward; or keep its handle and call handle.remove() after "
                       "the backward")
            yield self.finding(
                f"{api}() adds another {hook} to {what} each time this line runs during training, "
                f"and the earlier ones are never removed ({plural(copies, 'copy', 'copies')} live "
                f"at step {step}, registered at {event.get('updates')} different steps): "
                f"{value} goes through every copy, and the last one still changed {value} the "
                "others had already transformed, so the effect compounds with each registration",
                event.loc, related=related, step=step, fix=fix,
                evidence={"api": api, "copies": copies, "updates": event.get("updates"),
                          "target": event.get("target"), "name": name},
            )
