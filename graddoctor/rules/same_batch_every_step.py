from __future__ import annotations

from ..findings import Severity
from .base import Rule

_MIN_UPDATES = 3  # updates that must all have used one batch


class SameBatchEveryStep(Rule):
    """
    ## What it does
    Finds training that draws a batch from a DataLoader but then trains every update on the
    same one: a batch fetched once before the loop (`x, y = next(iter(loader))`) and used by
    every update, or a new iterator made before every update (`next(iter(loader))` inside the
    loop) over a loader that does not shuffle, which serves its first batch every time.

    ## Why is this bad?
    The model fits one batch: the training loss falls fast and nothing generalises. Making an
    iterator restarts the epoch, so `next(iter(loader))` in the loop always gets batch 0 of an
    unshuffled loader (and pays for starting its workers every step).

    ## Example
    ```python
    for step in range(num_steps):
        x, y = next(iter(train_loader))      # batch 0, every step
        loss = criterion(model(x), y)
        ...
    ```

    ## Use instead
    ```python
    batches = iter(train_loader)
    for step in range(num_steps):
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(train_loader)
            x, y = next(batches)
        ...
    ```

    ## Stays silent on
    A loop over the loader; a batch peeked at to print shapes while the loop reads the
    loader; `next(iter(loader))` per step over a shuffled loader (a random batch each time);
    full-batch training on tensors. An intentional overfit-one-batch check gets at most `info`,
    which says so.
    """

    code = "GD233"
    slug = "same-batch-every-step"
    severity = Severity.WARNING
    summary = "every update trains on the same DataLoader batch"
    fix = "draw a new batch per update: loop over the loader, or keep one iterator and call next() on it"

    def check(self, a):
        backwards = [e for e in a.of_kind("backward") if e.get("in_step") is None]
        steps = [e for e in a.of_kind("step") if not e.get("skipped")]
        if len(steps) < _MIN_UPDATES or not backwards:
            return
        batches = [e.get("batch") for e in backwards]
        if any(b is None for b in batches):
            return
        loaders = {b[0] for b in batches}
        if len(loaders) != 1:
            return
        loader = next(iter(loaders))
        sampler = next((e for e in a.of_kind("loader_sampler") if e.get("loader") == loader), None)
        starts = {(e.get("loader"), e.get("epoch")): e for e in a.of_kind("epoch_start")}
        keys = {tuple(b) for b in batches}
        if len(keys) == 1:
            yield from self._fetched_once(a, batches[0], starts, backwards)
            return
        # a fresh iterator before every update, one batch from each
        if all(b[2] == 0 for b in batches) and len({b[1] for b in batches}) == len(batches) \
                and sampler is not None and sampler.get("shuffle") is False:
            start = starts.get((loader, batches[-1][1]))
            if start is None or start.loc is None or not _several_batches(start):
                return  # a loader of one batch: full-batch training, one epoch per update
            yield self.finding(
                f"a new iterator over this DataLoader is made before every update and only its "
                f"first batch is drawn; the loader does not shuffle, so all {a.count(steps)} updates "
                "trained on the same batch (batch 0)",
                start.loc, step=a.next_step_number(start.seq),
                evidence={"updates": a.count(steps), "loader": loader},
            )

    def _fetched_once(self, a, batch, starts, backwards):
        start = starts.get((batch[0], batch[1]))
        if start is None or start.loc is None or batch[2] != 0 or not _several_batches(start):
            return
        last = backwards[-1]
        if last.loc is None or last.loc.path != start.loc.path:
            return
        use = a.source.batch_use(start.loc.path, start.loc.line, last.loc.line)
        if not use or not use["used"]:
            return  # the fetched batch is not what the loop trains on (a peek at its shapes)
        steps = a.count(e for e in a.of_kind("step") if not e.get("skipped"))
        names = ", ".join(use["names"]) or "the batch"
        if use["counts_loader"]:
            yield self.finding(
                f"{names} are fetched once, before the loop, and every one of the {steps} updates "
                f"trains on that one batch, while the loop counts the loader's batches "
                f"(len({use['loader']})): the rest of the data is never seen",
                start.loc, evidence={"updates": steps, "names": use["names"]},
                fix=f"loop over the loader: for {names} in {use['loader']}: ...")
        else:
            yield self.finding(
                f"{names} are fetched once, before the loop, and every one of the {steps} updates "
                "trains on that one batch (fine for a deliberate overfit-one-batch check; "
                "otherwise the rest of the data is never seen)",
                start.loc, severity=Severity.INFO,
                evidence={"updates": steps, "names": use["names"]})


def _several_batches(start) -> bool:
    """The loader serves more than one batch per epoch (None: a stream, assumed so)."""
    length = start.get("real_len")
    return length is None or length > 1
