from __future__ import annotations

import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from .copy_never_follows import _leaf

_TARGETS = 2  # the trained model's no-grad forwards in training mode, at least
_STEPS = 2  # steps with the copy kept in step, at least
# names of a copy kept to make the targets of the update: a target network, a momentum (key)
# encoder, a teacher. Averages kept to evaluate or to save (ema, swa, avg, shadow) are left out:
# a script may rightly make its pseudo-labels with the model and evaluate with its average.
_TARGET_COPY = re.compile(r"target|tgt|targ(_|$)|(^|_)t$|_t\d*$|momentum|(^|_)k($|_)|key|teacher")
_EVAL_AVERAGE = re.compile(r"ema|swa|avg|average|shadow|eval|best|ref|frozen|old|init|anchor"
                           r"|prev|snapshot|backup")


class TargetsFromTrainedModel(Rule):
    """
    ## What it does
    Finds a target network (or momentum encoder, or teacher) that the script keeps in step with
    the trained model — a Polyak/EMA blend or a sync after the steps — but never calls, while
    the trained model itself, under `no_grad` in training mode, makes the targets of its own
    update. The copy is a module no optimizer trains, equal to the trained model at the first
    step (`copy.deepcopy`), that moves toward the model between steps and runs no forward in
    the run; the trained model runs at least two forwards whose output carries no gradient. It
    is reported at the first such forward, and only for a copy named as a target maker
    (`target`, `tgt`, `q1_t`, `key`, `momentum`, `teacher`).

    ## Why is this bad?
    The target network exists to hold the targets still while the model moves: DQN, DDPG, TD3
    and SAC bootstrap from it, BYOL and MoCo regress onto it. Computing the targets with the
    trained model instead chases a target that moves with every update — the instability the
    copy was made to remove — and the copy's updates are work for nothing. Nothing fails: the
    loss still goes down, then training diverges or collapses.

    ## Example
    ```python
    q1_t = copy.deepcopy(q1)
    with torch.no_grad():
        y = r + gamma * (1 - d) * q1(torch.cat([s2, a2], -1))
    loss = F.mse_loss(q1(torch.cat([s, a], -1)), y)
    ...
    for p, pt in zip(q1.parameters(), q1_t.parameters()):
        pt.mul_(1 - tau).add_(p, alpha=tau)
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        y = r + gamma * (1 - d) * q1_t(torch.cat([s2, a2], -1))
    ```

    ## Stays silent on
    Target networks that are called (DQN, TD3, double DQN, whose online network picks the
    action under `no_grad` while the target network scores it); an EMA or SWA average kept to
    evaluate or save while the model makes pseudo-labels under `no_grad` (FixMatch with an EMA);
    a frozen reference model (DPO, a KL penalty); a copy that is never updated (that is
    `copy-never-follows`); the trained model run under `no_grad` in eval mode (validation).
    """

    code = "GD184"
    slug = "targets-from-trained-model"
    severity = Severity.WARNING
    summary = ("a target network kept in step with the trained model is never called: the "
               "trained model makes its own targets under no_grad")
    fix = "make the targets with the target network, not with the model being trained"

    def check(self, a):
        seen: set[tuple] = set()
        for event in a.by_kind.get("model_copy", ()):
            finding = self._judge(event)
            if finding is None:
                continue
            key = (finding.location.path, finding.location.line) if finding.location else None
            if key in seen:
                continue  # two copies of one model (SAC's twin critics) read at one line
            seen.add(key)
            yield finding

    def _judge(self, event):
        at = event.get("model_target_at")
        if (not event["equal"] or not event["written"] or event["forwards"]
                or event.get("model_targets", 0) < _TARGETS or at is None):
            return None
        moves = [row for row in event.get("follows") or () if row[1] > 0]
        if len(moves) < _STEPS:
            return None
        leaf = _leaf(event["copy"]).lower()
        if not _TARGET_COPY.search(leaf) or _EVAL_AVERAGE.search(leaf):
            return None
        copy, model = _leaf(event["copy"]), _leaf(event["model"])
        return self.finding(
            f"{model} makes the targets of its own update here ({event['model_targets']} forwards "
            f"without gradient in training mode), while {copy}, a copy of it kept in step after "
            f"the optimizer steps ({len(moves)} updates seen), is never called in the run: the "
            f"targets move with every update, which is what the target network is there to "
            f"prevent, and its updates are wasted",
            Location(at[0], at[1]),
            evidence={"copy": event["copy"], "model": event["model"],
                      "model_targets": event["model_targets"], "copy_updates": len(moves)},
            fix=f"call {copy} here instead of {model} (`{copy}(...)` under `torch.no_grad()`)")
