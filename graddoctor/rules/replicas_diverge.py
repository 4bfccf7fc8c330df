from __future__ import annotations

from dataclasses import replace

from ..findings import Severity, spans
from ..trace import Location
from .base import Rule

CHECKSUM_RTOL = 1e-5  # all-reduce results may differ in the last bits between ranks


def _close(a, b) -> bool:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return False
    return abs(a - b) <= CHECKSUM_RTOL * max(abs(a), abs(b), 1e-30)


class ReplicasDiverge(Rule):
    """
    ## What it does
    Compares the parameters of each optimizer across the ranks of a distributed run after its
    first optimizer steps (a checksum per rank: one batched norm pass, read at the end of the
    run) and points at the first step after which they differ. It compares processes, so it
    runs when the ranks' reports are merged (`check_processes`); one trace alone shows nothing.

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

    ## Stays silent on
    Every rank clipping and stepping alike while only rank 0 logs and evaluates under
    `no_grad`; gradients all-reduced by hand; without `DistributedDataParallel`, ranks whose
    parameters differ in shapes or start from different values (a pipeline's stages, each
    rank owning other layers; models seeded per rank): only ranks that train parameters of the
    same shapes from the same initial values are replicas. Without DDP, ranks that train the
    same model but never average their gradients drift apart, and that is reported. A model
    wrapped in `DistributedDataParallel` whose forward never runs (the loss computed through
    `model.module`) is left to `ddp-forward-bypassed`, which points at that call.
    """

    code = "GD403"
    slug = "replicas-diverge"
    severity = Severity.ERROR
    summary = "after an optimizer step the ranks' parameters differ: the replicas train different models"
    fix = ("make every rank apply the same update: nothing that changes gradients, parameters or "
           "the learning rate may run under a rank test")

    def check(self, a):
        return iter(())  # one trace cannot diverge from itself: see check_processes

    def check_processes(self, processes):
        """The first step after which an optimizer's parameters differ across ranks (the ranks'
        checksums, taken after each optimizer's first steps)."""
        sums: dict[tuple[int, int], dict[int, dict]] = {}
        for process in processes:
            if process.rank is None:
                continue
            for c in process.checksums:
                if isinstance(c.get("value"), (int, float)):
                    sums.setdefault((c["opt"], c["step"]), {})[process.rank] = c
        flagged = set()
        for (opt, step), by_rank in sorted(sums.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            if opt in flagged or len(by_rank) < 2:
                continue
            lead = min(by_rank)
            if any(c.get("bypassed") for c in by_rank.values()):
                continue  # a DDP built over them whose forward never ran: ddp-forward-bypassed
            unwrapped = "layout" in by_rank[lead]
            if unwrapped:  # no DDP: only ranks with the same parameter shapes and start values
                first = by_rank[lead]
                by_rank = {r: c for r, c in by_rank.items()
                           if c.get("layout") == first["layout"] and _close(c.get("initial"), first.get("initial"))}
                if len(by_rank) < 2:
                    continue
            ref = by_rank[lead]["value"]
            odd = sorted(r for r, c in by_rank.items() if abs(c["value"] - ref)
                         > CHECKSUM_RTOL * max(abs(ref), abs(c["value"]), 1e-30))
            if not odd:
                continue
            flagged.add(opt)
            c = by_rank[lead]
            loc = Location(c["path"], int(c["line"])) if c.get("path") and c.get("line") else None
            found = self.finding(
                f"after optimizer step {step} the parameters differ across ranks: rank "
                f"{spans(odd)} {'holds' if len(odd) == 1 else 'hold'} other values than rank "
                f"{lead} (parameter checksums {ref:.6g} vs {by_rank[odd[0]]['value']:.6g}), so "
                f"from here on every replica trains a different model"
                + (": they started from the same values with parameters of the same shapes, but "
                   "no DistributedDataParallel wraps the model, so each rank applies its own "
                   "gradient (a process group and collectives in the loss do not average "
                   "gradients)" if unwrapped else ""),
                loc, step=step,
                evidence={"optimizer": opt, "step": step, "differing_ranks": odd,
                          "checksums": {str(r): by_rank[r]["value"] for r in sorted(by_rank)}})
            if unwrapped:
                found = replace(found, fix=("wrap the model in DistributedDataParallel (or "
                                            "all-reduce and average the gradients before "
                                            "optimizer.step()) so that every rank applies the same "
                                            "update"), fixes={})
            yield replace(found, ranks=tuple(sorted(by_rank)))  # the ranks compared
