from __future__ import annotations

import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from .params_reset_every_step import _BACK, _HOME, _MEASURED, _SHARE

_PULL = 0.99  # cosine of the model's hand edit with the way to its copy: moved toward the copy
_PULLS = 2  # intervals with such an edit, at least
_STEPS = 2  # steps of the model's optimizer while the copy made targets, at least
# names of a copy meant to follow the model, and of one meant to stay as it was made
_FOLLOWER = re.compile(r"ema|teacher|target|momentum|mean|shadow|avg|average|polyak|slow|swa|tgt"
                       r"|(^|_)k($|_)|key")
_FIXED = re.compile(r"ref|frozen|old|init|anchor|base|orig|prior|pretrain|prev|fixed|snapshot|best"
                    r"|backup|initial")


def _leaf(name: str) -> str:
    """The attribute or variable a module is held in: ``agent.target_net`` -> ``target_net``
    (``model.blocks.0`` -> ``blocks``)."""
    parts = [p for p in name.split(".") if not p.isdigit()]
    return parts[-1] if parts else name


class CopyNeverFollows(Rule):
    """
    ## What it does
    Finds a copy of the trained model that is meant to follow it — an EMA or mean teacher, a
    BYOL target or MoCo key encoder, a DQN/TD3 target network — that never does, or that the
    model follows instead. The copy is a module no optimizer trains with the trained model's
    parameter shapes, equal to it at the first step (`copy.deepcopy(model)`, a second instance
    loaded with `model.state_dict()`), and it makes targets in the update (under `no_grad`, or
    an output without gradient). Two forms:

    - the copy is never written during the run, and the script cannot write it: its update
      function is defined and never called (reported at the definition), or no code of the
      script reaches the copy while a copy of that name is meant to follow (`ema`, `teacher`,
      `target`, `momentum`, `key`...) and its setting (a decay, a sync period) is set and never
      read, or another copy of the same model is updated instead (reported where the copy is
      made, as a warning); with no such sign, an `info`;
    - the update runs the wrong way round: at least twice, between two steps, the script's own
      code moves the trained model's parameters toward the copy (`p.data.copy_(tp.data)` in a
      sync written backwards), while the copy never changes (reported at that write).

    ## Why is this bad?
    A copy that never follows stays the initial, random network: the targets it makes (a
    bootstrap target, a self-distillation target, the keys of a contrastive loss) never
    improve, and the model learns to match noise. Written backwards, the update drags the
    trained model back to its initial copy at every sync: nothing is learnt for longer than
    one period. Nothing fails; the loss just stops going down.

    ## Example
    ```python
    target_net = copy.deepcopy(q_net)
    SYNC_EVERY = 100  # never read
    for step in range(steps):
        with torch.no_grad():
            y = r + gamma * target_net(s2).max(1).values
        loss = F.smooth_l1_loss(q_net(s).gather(1, a), y)
        ...
        if step % SYNC_EVERY == 0:
            for p, tp in zip(q_net.parameters(), target_net.parameters()):
                p.data.copy_(tp.data)  # the trained net reset to the target
    ```

    ## Use instead
    ```python
        if step % SYNC_EVERY == 0:
            target_net.load_state_dict(q_net.state_dict())  # the target follows the trained net
    ```

    ## Stays silent on
    A copy updated in place after the step (an EMA, a Polyak average, `load_state_dict` of the
    model's state); a target network synced every N steps by code that exists but did not run
    in the check; a frozen pretrained teacher (not equal to the student at the start); a
    frozen reference copy (DPO's or a KL penalty's `ref_model`); Lookahead's slow weights
    (they move toward the model before the model is reset to them); an EMA model swapped in
    for evaluation and swapped out before the next step; weight clipping, normalisation and
    pruning; an update written the wrong way round at every step that `params-reset-every-step`
    or `reload-discards-training` already reports.
    """

    code = "GD153"
    slug = "copy-never-follows"
    severity = Severity.WARNING
    summary = ("a copy of the model meant to follow it (EMA teacher, target network) is never "
               "updated, or the model is pulled toward the copy instead")
    fix = ("update the copy from the trained model after each step (`ema_p.mul_(d).add_(p, "
           "alpha=1 - d)`, or `target.load_state_dict(model.state_dict())` every N steps)")

    def check(self, a):
        copies = list(a.by_kind.get("model_copy", ()))
        written = {(e["model"]) for e in copies if e["written"]}
        for event in copies:
            finding = self._backwards(a, event)
            if finding is None:
                finding = self._never(a, event, written)
            if finding is not None:
                yield finding

    # -- the model pulled toward the copy -------------------------------------------------
    def _backwards(self, a, event):
        pulls = [row for row in event.get("pulls") or ()
                 if row[1] is not None and row[1] >= _PULL and row[2] and not row[3]]
        if event["written"] or len(pulls) < _PULLS:
            return None
        opt = event["opt"]
        if self._reported_elsewhere(a, opt):
            return None
        where = self._write_line(a, event)
        if where is None:
            return None
        copy, model = event["copy"], event["model"]
        share = sorted(r[2] for r in pulls)[len(pulls) // 2]
        how = "sets it to the copy" if share >= 0.999 else f"moves it {share:.0%} of the way to the copy"
        return self.finding(
            f"between steps, this line changes the trained {model} toward {copy}, a copy of it that "
            f"itself never changes: {len(pulls)} times in the run it {how}, so the model is dragged "
            f"back to its starting point instead of the copy following the model (the update is "
            f"written the wrong way round)",
            where, evidence={"copy": copy, "model": model, "pulls": len(pulls), "share": share},
            fix=(f"write the copy, not the model: `{_leaf(copy)}.load_state_dict({_leaf(model)}."
                 f"state_dict())` or, per parameter, `tp.data.copy_(p.data)` / "
                 f"`tp.mul_(d).add_(p, alpha=1 - d)` with tp from {_leaf(copy)}"))

    @staticmethod
    def _reported_elsewhere(a, opt) -> bool:
        """params-reset-every-step's reading of the same edits (every measured update undone or
        pulled home), or a reload by load_state_dict (reload-discards-training's)."""
        for edit in a.by_kind.get("step_edit", ()):
            if edit["opt"] != opt or len(edit["back"]) < _MEASURED:
                continue
            back, share, home, home_share = edit["back"], edit["share"], edit["home"], edit["home_share"]
            if all(b is not None and b >= _BACK for b in back) and all(s is not None and s >= _SHARE for s in share):
                return True
            if all(h is not None and h >= _HOME for h in home) and all(s is not None and s > 0 for s in home_share):
                return True
        owned = set(a.opt_params.get(opt, ()))
        return any(e["via"] == "load_state_dict" and owned.intersection(e.get("params") or ())
                   for e in a.by_kind.get("param_reset", ()))

    @staticmethod
    def _write_line(a, event) -> Location | None:
        """The hand write of the model that names the copy (or, in a loop, is bound to it)."""
        path = event.loc.path if event.loc is not None else None
        if path is None:
            return None
        copy, model = _leaf(event["copy"]), _leaf(event["model"])
        for line, _root, text, bound in a.source.param_writes(path):
            loop = a.source.innermost_loop(path, line)
            header = a.source.line_text(path, loop[0]) if loop is not None else ""
            both = f"{text} {bound or ''} {header}"
            if copy in both and model in both and model in (bound or text.split("(")[0]):
                return Location(path, line)
        return None

    # -- the copy never written ------------------------------------------------------------
    def _never(self, a, event, written_models):
        if event["written"] or not event["equal"] or not event["targets"] or event.loc is None:
            return None
        if any(row[1] is not None and row[1] >= _PULL for row in event.get("pulls") or ()):
            return None  # an update is there, written the other way round (the form above, or GD123's)
        opt = event["opt"]
        if a.count([s for s in a.steps if s.get("opt") == opt and not s.get("skipped")]) < _STEPS:
            return None
        leaf = _leaf(event["copy"])
        path = event.loc.path
        said = a.source.copy_writers(path, leaf)
        if said is None:
            return None
        # what made the copy equal to the model ran before the first step (a load at set-up)
        first = next((s.loc for s in a.steps if s.loc is not None and s.loc.path == path), None)
        if first is None or [w for w in said["writers"]
                             if not (w in said["setup"] and w < first.line)]:
            return None
        copy, model = event["copy"], event["model"]
        head = (f"{copy}, a copy of the trained {model} that makes targets in the update "
                f"({event['targets']} no-grad forwards), was never changed over the run")
        if said["uncalled"]:
            line, name = said["uncalled"][0]
            return self.finding(
                f"{name}() writes parameters by hand (a copy's update) but nothing in the script "
                f"calls it: {head}, so its targets come from the initial weights for the whole "
                f"training", Location(path, line),
                evidence={"copy": copy, "model": model, "function": name, "targets": event["targets"]},
                fix=f"call {name}() after each optimizer step (or every N steps)")
        name_says = bool(_FOLLOWER.search(leaf.lower())) and not _FIXED.search(leaf.lower())
        if not name_says:
            return None
        made = Location(path, said["made"][0]) if said["made"] is not None else event.loc
        other = event["model"] in written_models
        unused = said["unused"]
        if other:
            sign = f"another copy of {model} is updated during the run, not this one"
        elif unused:
            sign = f"its update's setting {unused[0][1]} (line {unused[0][0]}) is set and never read"
        else:
            sign = None
        message = (f"{head}, and no code in the script writes it (no update, no load_state_dict "
                   f"reaches it): it stays the initial network, and so do its targets")
        if sign is not None:
            message += f"; {sign}"
        else:
            message += ("; if it is meant to stay fixed (a reference model), name it so or "
                        "silence this line")
        return self.finding(
            message, made, severity=None if sign is not None else Severity.INFO,
            evidence={"copy": copy, "model": model, "targets": event["targets"],
                      "other_copy_updated": other, "unused_setting": unused[0][1] if unused else None},
            fix=(f"update {leaf} from {_leaf(model)} after the optimizer step: "
                 f"`{leaf}.load_state_dict({_leaf(model)}.state_dict())` every N steps, or an EMA "
                 f"(`for t, p in zip({leaf}.parameters(), {_leaf(model)}.parameters()): "
                 f"t.mul_(d).add_(p, alpha=1 - d)`)"))
