from __future__ import annotations

from ..findings import Severity
from .base import Rule


class ReplicasDiverge(Rule):
    """
    ## What it does
    Compares the parameters of each optimizer across the ranks of a distributed run after its
    first optimizer steps (a checksum per rank: one batched norm pass, read at the end of the
    run) and points at the first step after which they differ. It is decided when the ranks'
    reports are merged (report/merge.py), so this rule's own `check` of one trace finds
    nothing.

    ## Why is this bad?
    Data-parallel training relies on every replica applying the same update to the same
    parameters. When one rank clips, scales, skips or edits something the others do not, the
    replicas silently train different models: the checkpoint saved by rank 0 is not what the
    other ranks evaluate, and the all-reduced gradients average models that drift apart.

    ## Example
    ```python
    loss.backward()
    if dist.get_rank() == 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # only rank 0 clips
    optimizer.step()
    ```

    ## Use instead
    ```python
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # every rank, same gradients
    optimizer.step()
    if dist.get_rank() == 0:
        log(loss.item())  # only what has no effect on the update goes under a rank test
    ```
    """

    code = "GD403"
    slug = "replicas-diverge"
    severity = Severity.ERROR
    summary = "after an optimizer step the ranks' parameters differ: the replicas train different models"
    fix = ("make every rank apply the same update: nothing that changes gradients, parameters or "
           "the learning rate may run under a rank test")

    def check(self, a):
        return iter(())  # decided across ranks, when their reports are merged
