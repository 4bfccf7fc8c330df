from __future__ import annotations

from ..trace import Location
from ..findings import Severity
from .base import Rule
from .copy_never_follows import _PULL, _leaf

_TAIL = 5  # the copy's latest moves judged (after any warm-up of its decay)
_MOVES = 3  # moves toward the model judged, at least
_FAR = 0.8  # share of the way to the model moved at each of them, at least
_FULL = 2e-5  # a share this close to 1 is a full copy (a hard sync), not a blend
_LETTING_GO = 5e-5  # a fall of the share over the tail this large is a decay warming up
_ALONG = 0.9  # cosine of the copy's change with the way to the model: it moved toward it


class EmaDecaySwapped(Rule):
    """
    ## What it does
    Finds a copy of the trained model meant to lag behind it — an EMA or mean teacher, a BYOL
    target or MoCo key encoder, an EMA of the weights kept for evaluation, a Polyak-averaged
    target network — whose update moves it most of the way onto the model at every step: the
    decay is given to the model's weights instead of the copy's (`t = d * p + (1 - d) * t`,
    `t.lerp_(p, d)`, `t.mul_(1 - d).add_(p, alpha=d)`). What is measured, between two steps of
    the model's optimizer: how far the copy moved along the way from it to the model, as a share
    of that way. An EMA of decay `d` moves `1 - d` of it; this one moves 80% or more at each of
    its latest moves (at least three), without being a full copy and without the share falling
    as a decay that warms up makes it fall.

    ## Why is this bad?
    The copy is meant to average the model over many steps (`d = 0.99` to `0.9999`): that slow
    average is what makes the targets of BYOL, MoCo, DINO or a mean teacher stable, and what
    makes EMA weights generalise. With the weights swapped the copy is the model of one step
    ago: self-distillation targets are the student's own outputs (the loss has nothing to
    learn from, and BYOL/DINO collapse), MoCo's keys drift with the query encoder, and the EMA
    weights evaluated or saved are no average at all. Nothing fails; the loss curve even looks
    fine.

    ## Example
    ```python
    tau = 0.99
    with torch.no_grad():
        for po, pt in zip(online.parameters(), target.parameters()):
            pt.data = tau * po.data + (1 - tau) * pt.data  # the copy keeps 1% of itself
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        for po, pt in zip(online.parameters(), target.parameters()):
            pt.data = tau * pt.data + (1 - tau) * po.data  # or pt.mul_(tau).add_(po, alpha=1 - tau)
    ```

    ## Stays silent on
    An EMA whose copy moves `1 - d` of the way (`d` near 1), and one whose decay warms up from
    0 (ultralytics' `ModelEMA`, the `(1 + n) / (10 + n)` ramp, a mean teacher's `1 - 1 / (n +
    1)`: the share falls from 1 step by step); a target network copied in full (a hard sync every
    step or every N steps, `tau = 1`); `AveragedModel` (SWA: a running mean moves 1/n);
    Lookahead's slow weights and Reptile's meta weights (the model is then reset to the copy,
    which `copy-never-follows` reads); a copy that never changes; a copy whose changes do not
    point at the model (noise, weight normalisation).
    """

    code = "GD184"
    slug = "ema-decay-swapped"
    severity = Severity.WARNING
    summary = ("an EMA copy of the model (teacher, target or key encoder, EMA weights) moves most "
               "of the way onto the model at every update: the decay weights the model, not the copy")
    fix = ("give the decay to the copy's own weights: `t.mul_(d).add_(p, alpha=1 - d)`, "
           "`t.lerp_(p, 1 - d)`, or `t = d * t + (1 - d) * p`")

    def check(self, a):
        for event in a.by_kind.get("model_copy", ()):
            finding = self._judge(a, event)
            if finding is not None:
                yield finding

    def _judge(self, a, event):
        if any(row[1] is not None and row[1] >= _PULL and row[2] for row in event.get("pulls") or ()):
            return None  # the model is reset to the copy: Lookahead, Reptile (or GD153's sync)
        moves = [row for row in event.get("follows") or () if row[2] is not None and row[2] >= _ALONG]
        tail = [row[1] for row in moves[-_TAIL:]]
        if len(tail) < _MOVES or min(tail) < _FAR or max(tail) >= 1.0 - _FULL:
            return None
        if tail[-1] - tail[0] < -_LETTING_GO:
            return None  # a decay warming up: the copy lets go of the model step by step
        where = self._update_line(a, event)
        if where is None:
            return None
        copy, model = event["copy"], event["model"]
        share = sorted(tail)[len(tail) // 2]
        use = (f"the targets it makes ({event['targets']} no-grad forwards) are the model's own "
               f"outputs of one step ago" if event["targets"] else
               "the weights it holds are no average of the model, only its last step")
        return self.finding(
            f"{copy}, a copy of the trained {model} meant to lag behind it, moved {share:.1%} of the "
            f"way onto {model} at each of its last {len(tail)} updates: an EMA of decay d keeps d "
            f"of its own weights and moves 1 - d toward the model, and this update gives d to the "
            f"model's weights instead, so {use}",
            where, evidence={"copy": copy, "model": model, "share": share, "moves": len(tail),
                             "shares": tail},
            fix=(f"swap the two weights of this update so that {_leaf(copy)} keeps the decay: "
                 f"`t.mul_(d).add_(p, alpha=1 - d)` / `t.lerp_(p, 1 - d)` / `t = d * t + (1 - d) * p` "
                 f"with t from {_leaf(copy)} and p from {_leaf(model)}"))

    @staticmethod
    def _update_line(a, event) -> Location | None:
        """The statement that writes the copy's values inside the training (not while it is
        built): an in-place write or ``.data =`` reaching it, else a call that updates it."""
        path = event.loc.path if event.loc is not None else None
        if path is None:
            path = next((s.loc.path for s in a.steps if s.loc is not None), None)
        if path is None:
            return None
        said = a.source.copy_writers(path, _leaf(event["copy"]))
        if said is None:
            return None
        running = [line for line in said["writers"] if line not in said["setup"]]
        if not running:
            # the multi-tensor form (timm's, torch's own EMA helpers): torch._foreach_lerp_(...)
            foreach = a.source.foreach_writes(path, _leaf(event["copy"]))
            return Location(path, foreach[0]) if foreach else None
        writes = {row[0] for row in a.source.param_writes(path)}
        line = next((line for line in running if line in writes), running[0])
        return Location(path, line)
