from __future__ import annotations

from ..analysis.frozen_role_source import role_values_from_trained_model
from ..findings import Severity
from ..trace import Location
from .base import Rule


class ReferenceFromTrainedModel(Rule):
    """
    ## What it does
    Finds a value named for a frozen model's output — the reference model's log-probabilities
    of DPO, IPO or an RLHF KL penalty (`ref_chosen_logps`, `ref_logprobs`), a distillation
    teacher's logits (`teacher_logits`) — computed inside the training loop (or a step function
    that calls `backward`) by a call on the model the optimizer trains, while the script keeps a model of that role (it assigns a
    `ref_model`, `ref`, `teacher`). Read from the script's source, in the
    files whose backwards ran; the trained models are those whose `.parameters()` an optimizer
    is built on.

    ## Why is this bad?
    The reference is what the update is measured against: DPO's loss is a logistic loss on
    `(log π(y_w) - log π_ref(y_w)) - (log π(y_l) - log π_ref(y_l))`, and the KL penalty of RLHF
    pulls the policy back to the reference. Computed by the policy itself, the reference moves
    with every step: its term of the log-ratio is exactly the policy's own value (under
    `no_grad`), the ratio is zero at every step, and the regularisation towards the starting
    model is gone — the loss sits at `log 2`, the KL reads 0, and the policy drifts as far as
    the other terms push it. A teacher's logits computed by the student teach the student its
    own predictions. Nothing fails; the run just trains something else.

    ## Example
    ```python
    ref = copy.deepcopy(policy).requires_grad_(False)
    ...
    with torch.no_grad():
        ref_chosen = sequence_logps(policy, chosen_ids, chosen_mask)
        ref_rejected = sequence_logps(ref, rejected_ids, rejected_mask)
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        ref_chosen = sequence_logps(ref, chosen_ids, chosen_mask)
        ref_rejected = sequence_logps(ref, rejected_ids, rejected_mask)
    ```

    ## Stays silent on
    Reference values computed by the trained model with its adapter switched off (a `with`
    block other than `no_grad`/`inference_mode`/`autocast`: PEFT's `disable_adapter()`, TRL's
    `null_ref_context()`; or a call such as `disable_adapter_layers()` before it in its block); reference log-probabilities precomputed from the policy before the
    training loop (the policy is the reference then); scripts that keep no reference (teacher)
    model (reference-free SimPO, self-distillation); PPO's old
    log-probabilities computed by the policy under `no_grad`, which are not named a reference;
    values a training function computes before its own training loop.
    """

    code = "GD354"
    slug = "reference-from-trained-model"
    severity = Severity.WARNING
    summary = ("a value named for the frozen reference (or teacher) is computed by the model being "
               "trained: the reference moves with the policy")
    fix = "compute the reference's (teacher's) values with the frozen reference (teacher) model"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, role, value, trained, frozen in role_values_from_trained_model(a.source.full(path)):
                if role == "reference":
                    what = (f"`{value}` is named for the reference model's output but is computed by "
                            f"`{trained}`, the model the optimizer trains, while the script keeps the "
                            f"frozen `{frozen}` for it: this reference moves with the policy, "
                            f"its log-ratio is 0 at every step and the pull back to the starting model "
                            f"is gone")
                else:
                    what = (f"`{value}` is named for the teacher's output but is computed by "
                            f"`{trained}`, the model the optimizer trains, while the script keeps "
                            f"`{frozen}` for it: the student is fitted to its own predictions")
                yield self.finding(
                    what, Location(path, line, None),
                    fix=f"compute `{value}` with `{frozen}`, not `{trained}`",
                    evidence={"role": role, "value": value, "trained": trained, "frozen": frozen})
