from __future__ import annotations

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule

_UPDATES = 2  # updates in which it must be seen


class PerturbationNotUndone(Rule):
    """
    ## What it does
    Finds an optimizer step that starts from weights the script moved in place between two
    backwards of the same update and never moved back (SAM's ascent to `w + e` without the
    restore before the base step). The first backwards of the run sample the optimizer's CPU
    parameters; when most of them changed between the update's first backward and a later one,
    the step that ends the update samples them again: most still hold the moved values, not
    those of the first backward, in two updates. It points at the step.

    ## Why is this bad?
    SAM takes the gradient at the perturbed point `w + e` but applies it to `w`: the
    perturbation is only a probe. Without the restore the base optimizer updates `w + e`, so
    every update also adds `e = rho * g / ||g||`, a step of fixed length *up* the loss: a
    gradient ascent term the size of rho at every step. Nothing fails; the loss stalls or
    creeps up, and the gradient at the perturbed point looks normal.

    ## Example
    ```python
    loss_fn(model(x), y).backward()
    sam.first_step(zero_grad=True)        # w -> w + e
    loss_fn(model(x), y).backward()
    base_optimizer.step()                 # steps from w + e: e is never taken back
    ```

    ## Use instead
    ```python
    loss_fn(model(x), y).backward()
    sam.first_step(zero_grad=True)        # w -> w + e, e kept in the state
    loss_fn(model(x), y).backward()
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(sam.state[p]["e_w"])   # back to w
    base_optimizer.step()                 # the gradient at w + e applied to w
    ```

    ## Stays silent on
    SAM, ASAM and GSAM that restore the weights (by subtracting `e`, or from a clone) before the
    base step; weights moved between backwards by an optimizer step (a GAN's players, Lookahead's
    sync); a pruning mask re-applied to weights it already zeroed; a single update that keeps
    it (it must be seen in two); a restore from a copy that is the weights' own memory (`p.data
    = saved` where `saved` was `p.data`: `weight-copy-aliases-params` reports that copy).
    Not seen: GPU parameters (their values are not read).
    """

    code = "GD422"
    slug = "perturbation-not-undone"
    severity = Severity.WARNING
    summary = ("the optimizer steps from weights the script perturbed in place between two "
               "backwards and never restored (SAM's w + e kept)")
    fix = "restore the weights to w (subtract the perturbation, or copy back a clone) before the base optimizer's step"

    def check(self, a):
        hits: dict = {}  # step line -> [event]
        # weights the script writes back onto themselves: it meant to restore them, from a copy
        # that is their own memory (weight-copy-aliases-params reports that copy)
        self_copied = {pid for e in a.of_kind("self_copy") for pid in e.get("params") or ()}
        for e in a.of_kind("weights_edit_kept"):
            if e.loc is None or (self_copied and set(e["params"]) <= self_copied):
                continue
            hits.setdefault((e.loc.path, e.loc.line), []).append(e)
        for _key, seen in hits.items():
            updates = {a.next_step_number(e.seq) for e in seen}
            if len(updates) < _UPDATES:
                continue
            e = seen[0]
            related = []
            at = e.get("edited_at")
            if at:
                related.append(Related(Location(at[0], at[1]), "the backward at the perturbed weights"))
            yield self.finding(
                f"this step starts from weights that the script moved in place after the "
                f"update's first backward and had not moved back when the step began: "
                f"{a.names(e['params'])} still hold their perturbed values (in {len(updates)} "
                f"updates), so each update applies the gradient at w + e to w + e and keeps e, "
                f"a step up the loss of the perturbation's size",
                e.loc, step=a.next_step_number(e.seq), related=related,
                evidence={"params": e["params"][:16], "updates": len(updates)},
            )
