from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule
from .copy_never_follows import _leaf


class AveragedCopyStaleNorms(Rule):
    """
    ## What it does
    Finds an averaged copy of the trained model (an EMA or SWA model, a mean teacher) whose
    weights follow the model but whose BatchNorm statistics never move: the average is taken
    over `parameters()` only (`zip(ema.parameters(), model.parameters())`, a mean teacher's
    `t.data = a * t.data + (1 - a) * s.data`), so the copy keeps the running mean and variance
    it was made with (0 and 1 for a copy made before training) while the model's count every
    batch. Observed at the end of the run: a copy no optimizer
    trains, of the model's parameter shapes, whose weights changed, and each of its BatchNorm
    layers with running statistics against the model's at the same place (their batch counts
    and a sample of the running mean at the first step).

    ## Why is this bad?
    In eval mode a BatchNorm normalises with its running statistics. The averaged weights were
    trained under the model's statistics; with the copy's initial ones every activation is
    shifted and scaled wrongly, so the EMA/SWA model you evaluate, select on or save scores far
    below the model it averages, while training itself looks fine.

    ## Example
    ```python
    ema = copy.deepcopy(model)
    with torch.no_grad():
        for ema_p, p in zip(ema.parameters(), model.parameters()):
            ema_p.mul_(decay).add_(p, alpha=1 - decay)
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        for ema_v, v in zip(ema.state_dict().values(), model.state_dict().values()):
            if ema_v.dtype.is_floating_point:
                ema_v.mul_(decay).add_(v, alpha=1 - decay)
            else:
                ema_v.copy_(v)
    # or torch's AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay)), which keeps
    # the buffers in step with the model (or averages them with use_buffers=True)
    ```

    ## Stays silent on
    Averages that take the buffers too (over `state_dict()`, a second loop over `buffers()`,
    torch's `AveragedModel`, which copies them), statistics re-estimated with `update_bn` or a
    forward in train mode, a copy synced with `load_state_dict`; a copy run in train mode (BYOL's
    target, MoCo's key encoder: its own statistics move); models without BatchNorm or with
    `track_running_stats=False`; a copy whose weights never change within the run seen.
    """

    code = "GD281"
    slug = "averaged-copy-stale-norms"
    severity = Severity.WARNING
    summary = ("an EMA/SWA copy averages the model's weights but not its BatchNorm statistics: "
               "evaluated, it normalises with the statistics it was made with")
    fix = ("average the buffers too: iterate state_dict() instead of parameters(), copy the "
           "model's buffers() into the copy's, or call swa_utils.update_bn before evaluating")

    def check(self, a):
        for event in a.by_kind.get("model_copy", ()):
            stale = event.get("stale_norms") or []
            if not stale or not event.get("written"):
                continue
            copy, model = event["copy"], event["model"]
            at, library = self._where(a, event)
            if at is None or a.source.calls_named(at.path, {"update_bn"}):
                continue  # statistics re-estimated later (SWA's update_bn after training)
            if library:
                fix = (f"pass use_buffers=True where {_leaf(copy)} is made, so the average "
                       f"covers the BatchNorm statistics, or call "
                       f"torch.optim.swa_utils.update_bn(loader, {_leaf(copy)}) before "
                       f"evaluating it")
            else:
                fix = (f"average the buffers too: loop over {_leaf(copy)}.state_dict().values() "
                       f"and {_leaf(model)}.state_dict().values() (copy_ the integer ones), or "
                       f"add a loop copying {_leaf(model)}.buffers() into "
                       f"{_leaf(copy)}.buffers()")
            yield self.finding(
                f"{copy} follows {model}'s weights (written from step {event.get('written_step')}) "
                f"but not its BatchNorm statistics: {', '.join(stale[:3])}"
                f"{' and more' if len(stale) > 3 else ''} kept the running mean and variance "
                f"{copy} was made with while {model}'s counted every batch, so in eval mode "
                f"{copy} normalises its averaged weights with the wrong statistics and whatever "
                f"you evaluate or save from it is far worse than {model}",
                at, fix=fix,
                evidence={"copy": copy, "model": model, "stale_norms": stale[:8],
                          "norms": event.get("norms"), "library": library})

    @staticmethod
    def _where(a, event) -> tuple[Location | None, bool]:
        """The loop that averages over ``parameters()`` (hand-written), else the line that
        makes the copy (a library average: AveragedModel); ``library`` tells which."""
        init = a.optimizers.get(event.get("opt"))
        path = event.loc.path if event.loc is not None else (
            init.loc.path if init is not None and init.loc is not None else None)
        if path is None:
            return None, False
        copy = _leaf(event["copy"])
        loops = []
        for line, _root, _text, bound in a.source.param_writes(path):
            if bound is None or "parameters(" not in bound:
                continue
            loop = a.source.innermost_loop(path, line)
            if loop is not None:
                loops.append((copy in bound, loop[0]))
        if loops:
            named = [line for mine, line in loops if mine] or [line for _, line in loops]
            return Location(path, named[0]), False
        said = a.source.copy_writers(path, copy)
        if said is not None and said["made"] is not None:
            return Location(path, said["made"][0]), "AveragedModel" in said["made"][1]
        return None, False
