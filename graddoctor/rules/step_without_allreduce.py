from __future__ import annotations

from ..analysis import written
from ..findings import Severity
from .base import Rule, plural, related


class StepWithoutAllreduce(Rule):
    """
    ## What it does
    Finds optimizer steps of a `DistributedDataParallel` model that apply gradients no DDP
    all-reduce produced: every backward of the update ran on a forward inside
    `model.no_sync()`, including the last micro-batch before `optimizer.step()`. Also the
    window whose synchronised backward comes before its last micro-batch (the `no_sync()`
    condition inverted: `model.no_sync() if last else nullcontext()`): what the backwards after
    the synchronised one add stays each rank's own; that finding points at the `no_sync()`.

    ## Why is this bad?
    Under `no_sync()` each rank keeps its own local gradients. When the step comes without one
    synchronised backward, every rank applies a different update: the replicas silently drift
    apart, and the model saved by rank 0 was trained on rank 0's data alone. Nothing fails.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        with model.no_sync():
            loss_fn(model(x), y).backward()
        if (i + 1) % k == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % k == 0
        with contextlib.nullcontext() if last else model.no_sync():
            loss_fn(model(x), y).backward()
        if last:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Stays silent on
    DDP's `no_sync()` on all but the last micro-batch of each window; a window whose
    gradients the script all-reduces by hand before the step.
    """

    code = "GD401"
    slug = "step-without-allreduce"
    severity = Severity.ERROR
    summary = "a DDP optimizer step applies gradients no all-reduce produced (every micro-batch under no_sync())"
    fix = ("run the last micro-batch before optimizer.step() outside model.no_sync(), so its "
           "backward all-reduces the accumulated gradients")

    def check(self, a):
        since: dict[int, list] = {}  # optimizer -> DDP backwards writing its params since its step
        by_hand: set = set()  # optimizers whose gradients the script all-reduced since their step
        last_no_sync = None
        groups: dict = {}
        for e in a.events:
            if e.kind == "ddp_no_sync":
                last_no_sync = e
            elif e.kind == "backward" and "allreduce" in e.data:
                for opt in {o for pid in written(e) for o in a.owners.get(pid, ())}:
                    since.setdefault(opt, []).append(e)
            elif e.kind == "grad_allreduce":
                by_hand.add(e.get("opt"))
            elif e.kind == "step" and not e.get("skipped"):
                backwards = since.pop(e.get("opt"), [])
                hand = e.get("opt") in by_hand
                by_hand.discard(e.get("opt"))
                if backwards and not backwards[-1].get("allreduce") and not hand:
                    partial = any(b.get("allreduce") for b in backwards)
                    groups.setdefault((partial, e.loc), []).append((e, backwards, last_no_sync))
        for (partial, loc), items in groups.items():
            step, backwards, no_sync = items[0]
            updates = a.count(s for s, _, _ in items)  # folded copies included
            first = a.step_number.get(step.seq)
            if not partial:
                yield self.finding(
                    f"this step applies gradients that were never all-reduced: all "
                    f"{plural(len(backwards), 'backward')} of the update ran under model.no_sync(), "
                    f"so every rank steps with its own local gradients and the replicas drift apart "
                    f"({plural(updates, 'update')} like this, first at step {first})",
                    loc,
                    related=(related(no_sync, "the no_sync() that covers the last micro-batch too"),
                             related(backwards[-1], "the update's last backward, not synchronised")),
                    step=first,
                    evidence={"backwards": len(backwards), "updates": updates},
                )
                continue
            trailing = 0
            for b in reversed(backwards):
                if b.get("allreduce"):
                    break
                trailing += 1
            where = no_sync.loc if no_sync is not None and no_sync.loc is not None else loc
            yield self.finding(
                f"the last {plural(trailing, 'micro-batch', 'micro-batches')} before this "
                f"optimizer step ran under model.no_sync(), after the window's synchronised "
                f"backward: DDP all-reduces the gradients accumulated up to a synchronised backward, "
                f"never what a later no_sync() backward adds, so every rank steps with its own "
                f"local part of the gradient and the replicas drift apart "
                f"({plural(updates, 'update')} like this, first at step {first})",
                where,
                related=tuple(r for r in (
                    related(backwards[-1], "the update's last backward, not synchronised"),
                    related(step, "the step that applies the rank's own gradients")) if r is not None),
                step=first,
                evidence={"backwards": len(backwards), "unsynchronised": trailing,
                          "updates": updates, "partial": True},
                fix=("use no_sync() for every micro-batch but the last of the window (the one "
                     "optimizer.step() follows): `model.no_sync() if not last else "
                     "contextlib.nullcontext()`"),
            )
