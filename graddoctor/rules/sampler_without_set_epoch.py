from __future__ import annotations

from dataclasses import replace

from ..findings import Severity
from .base import Rule, related


class SamplerWithoutSetEpoch(Rule):
    """
    ## What it does
    Finds a shuffling `DistributedSampler` that starts several epochs with the same epoch
    number: `sampler.set_epoch(epoch)` is never called (or always with the same value: then it
    points at that call, `set_epoch(0)` or a counter that never advances).

    ## Why is this bad?
    `DistributedSampler` seeds its shuffle with `seed + epoch`. Without `set_epoch`, every epoch
    replays exactly the same order on every rank, and each rank sees the same shard of the data
    in the same order every time: the data is not reshuffled, which hurts generalisation, and
    nothing warns about it.

    ## Example
    ```python
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        for x, y in loader:
            train_step(x, y)
    ```

    ## Use instead
    ```python
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            train_step(x, y)
    ```

    ## Stays silent on
    `set_epoch(epoch)` every epoch; an evaluation sampler with `shuffle=False`; a one-batch
    peek (`next(iter(loader))` to print the batch size) before `set_epoch`: an iteration that
    no optimizer step follows before the sampler starts again is not an epoch.
    """

    code = "GD402"
    slug = "sampler-without-set-epoch"
    severity = Severity.WARNING
    summary = "a shuffling DistributedSampler without set_epoch(): every epoch replays the same order"
    fix = "call sampler.set_epoch(epoch) at the start of every epoch, before iterating the DataLoader"

    def check(self, a):
        by_sampler: dict[int, list] = {}
        for e in a.of_kind("sampler_iter"):
            if e.get("shuffle"):
                by_sampler.setdefault(e.get("sampler"), []).append(e)
        for starts in by_sampler.values():
            # an epoch is an iteration that trains: one followed by an optimizer step before the
            # sampler starts again. A peek (next(iter(loader)) to print the batch size, as the
            # DDP tutorial does before set_epoch) starts no epoch.
            starts = [e for e, after in zip(starts, [*starts[1:], None])
                      if (step := a.next_step(e.seq)) is not None
                      and (after is None or step.seq < after.seq)]
            epochs = {e.get("epoch") for e in starts}
            started = a.count(starts)  # folded copies included
            if len(starts) < 2 or len(epochs) != 1:
                continue
            epoch = starts[0].get("epoch")
            set_at = {tuple(e.get("set_at") or ()) for e in starts}
            if len(set_at) == 1 and (at := next(iter(set_at))) and starts[1].loc is not None:
                # set_epoch is called, at one line, with the same value every epoch
                # (set_epoch(0), a counter that never advances): that call is the line to change
                yield self.finding(
                    f"this DistributedSampler started {started} epochs, and the set_epoch() "
                    f"call here set each of them to epoch {epoch}: its argument does not change "
                    f"from one epoch to the next, so every epoch shuffles with the same seed and "
                    f"replays the same order on every rank",
                    replace(starts[1].loc, path=at[0], line=int(at[1]), function="", via="", hook=""),
                    fix="pass the epoch loop's counter: sampler.set_epoch(epoch), a new value "
                        "at the start of every epoch",
                    related=(related(starts[1], "the second epoch, in the first one's order"),),
                    step=a.next_step_number(starts[1].seq),
                    evidence={"epochs_started": started, "epoch": epoch, "set_epoch_called": True},
                )
                continue
            yield self.finding(
                f"this DistributedSampler started {started} epochs, each with epoch {epoch}: "
                f"set_epoch() is never called with a new value, so every epoch shuffles with "
                f"the same seed and replays the same order on every rank",
                starts[1].loc,
                related=(related(starts[0], "the first epoch, in the same order"),),
                step=a.next_step_number(starts[1].seq),
                evidence={"epochs_started": started, "epoch": epoch},
            )
