from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule


class ZippedBatchUnread(Rule):
    """
    ## What it does
    Finds a training loop that draws the batches of two (or more) DataLoaders in lockstep,
    `for (x, y), (xv, yv) in zip(train_loader, val_loader)`, where nothing reads the batch of
    one of them: its unpacked names are never used in the loop (nor after it), while the other
    loader's are. Seen at run time: the loaders each start an epoch at that `for` and optimizer
    steps run inside it; the names are read from the source.

    ## Why is this bad?
    A loader is zipped in because a second stream of data is meant to reach the update: the
    validation batches of a bilevel step (DARTS's architecture step, a learned loss weight or
    hyper-parameter tuned on held-out data), the unlabeled or target-domain batches of
    semi-supervised learning and domain adaptation, a second task's data. When the code that
    should read it reads the other loader's names instead (`model(xt)` copied into the
    architecture step), that stream never reaches the model: the architecture or weights are
    fitted to the training batches, the unlabeled loss sees labeled data. Training runs and the
    loss falls.

    ## Example
    ```python
    for (xt, yt), (xv, yv) in zip(train_loader, val_loader):
        arch_opt.zero_grad()
        F.cross_entropy(model(xt), yt).backward()   # the validation batch was meant
        arch_opt.step()
        w_opt.zero_grad()
        F.cross_entropy(model(xt), yt).backward()
        w_opt.step()
    ```

    ## Use instead
    ```python
    for (xt, yt), (xv, yv) in zip(train_loader, val_loader):
        arch_opt.zero_grad()
        F.cross_entropy(model(xv), yv).backward()
        arch_opt.step()
        ...
    ```

    ## Stays silent on
    A zipped batch bound to `_` names (`for (x, y), _ in zip(...)`, drawn only to limit the
    epoch's length); a batch whose names are read anywhere in the loop or after it (logged,
    used every k steps); a zip of a loader with something that is no DataLoader (`range`,
    a list of weights); loops that step no optimizer (evaluation).
    """

    code = "GD411"
    slug = "zipped-batch-unread"
    severity = Severity.WARNING
    summary = ("a training loop zips two DataLoaders but never reads one loader's batch: the "
               "validation (or unlabeled) stream meant for part of the update never reaches it")
    fix = "read the zipped batch where it was meant (the architecture step's, or the unlabeled loss's, input)"

    def check(self, a):
        lines: dict[tuple[str, int], set] = {}
        first: dict[tuple[str, int], int] = {}
        for e in a.of_kind("epoch_start"):
            if e.loc is None:
                continue
            key = (e.loc.path, e.loc.line)
            lines.setdefault(key, set()).add(e.get("loader"))
            first.setdefault(key, e.seq)
        steps = [s.seq for s in a.of_kind("step")]
        for (path, line), loaders in lines.items():
            if len(loaders) < 2 or not any(seq > first[(path, line)] for seq in steps):
                continue
            for text, names, others in a.source.zipped_unread(path, line):
                shown = ", ".join(names)
                reads = ", ".join(str(n) for n in others[:4])
                yield self.finding(
                    f"this loop draws a batch of `{text}` at every turn ({shown}), zipped with "
                    f"another DataLoader, but nothing reads {shown}: every forward and loss of "
                    f"the loop reads the other loader's batch (line{'s' if len(others) > 1 else ''} "
                    f"{reads}). The stream `{text}` was zipped in for (the held-out batches of a "
                    f"bilevel step, the unlabeled or target-domain batches) never reaches the "
                    f"update",
                    Location(path, line),
                    evidence={"loader": text, "names": names, "read_lines": others},
                    fix=(f"use {shown} where `{text}`'s batch was meant: check the lines that "
                         f"read the other loader's batch ({reads}) for one that should read "
                         f"{shown}"),
                )
