from __future__ import annotations

from ..findings import Severity
from .base import Rule

MIN_BATCHES = 3  # single-class batches that fed a backward before it is called sorted
MIN_SIZE = 4  # a batch of fewer labels is one class by chance too often
NARROW = 0.02  # within-batch variance below this share of the whole: each batch a narrow slice


class UnshuffledSortedData(Rule):
    """
    ## What it does
    Finds a training DataLoader that never shuffles (`shuffle=False`, the default) over data
    sorted by class: nearly every batch it serves holds a single label. `ImageFolder` lists its
    samples class by class, and so do datasets built by concatenating one class after another.
    The same for data ordered by a value: a regression target or a scalar input (`x =
    torch.linspace(...)`, a table sorted by price): each of the first batches holds values
    that lie all above (or all below) the batch before it, or the values vary within each batch
    by less than 2 % of their variance over those batches together. It points at the
    DataLoader.

    ## Why is this bad?
    The model sees hundreds of steps of class 0, then of class 1, and so on: each stretch
    pulls the whole model towards predicting that one class, and what it learned of the
    earlier classes is overwritten. The loss looks fine within each stretch (it is easy to
    predict a constant) and the model ends up predicting mostly the last classes it saw.
    BatchNorm statistics are computed over one class at a time as well. Ordered by a value,
    each stretch of steps fits one part of the range, and the model ends up fitting the last.

    ## Example
    ```python
    train_set = torchvision.datasets.ImageFolder("data/train", transform=tf)
    loader = DataLoader(train_set, batch_size=64)
    ```

    ## Use instead
    ```python
    loader = DataLoader(train_set, batch_size=64, shuffle=True)
    ```

    ## Stays silent on
    `shuffle=True` and every random sampler; unshuffled loaders whose batches mix labels (data
    already shuffled on disk, or float values spread alike in every batch); loaders no backward
    uses (validation, test); token ids and inputs or targets of several values per sample
    (sequences, images, feature rows); fewer than 4 batches; batches of fewer than 4 samples; a
    dataset with a single class (one-class training), or all first batches of one class when
    the dataset does not say how many classes it holds.
    """

    code = "GD241"
    slug = "unshuffled-sorted-data"
    severity = Severity.WARNING
    summary = ("a training DataLoader that never shuffles serves data sorted by class: its "
               "batches hold a single label each")
    fix = "shuffle the training data: DataLoader(dataset, ..., shuffle=True)"

    def check(self, a):
        labels, spreads = a.by_kind.get("batch_labels", ()), a.by_kind.get("batch_spread", ())
        if not labels and not spreads:
            return
        fed: set = set()
        for b in a.by_kind.get("backward", ()):
            batch = b.get("batch")
            if batch:
                fed.add((batch[0], batch[1], batch[2]))
        yield from self._ordered_values(a, spreads, fed)
        by_loader: dict[int, list] = {}
        for e in labels:
            if (e["loader"], 0, e["index"]) in fed:
                by_loader.setdefault(e["loader"], []).append(e)
        for loader, read in by_loader.items():
            # a batch that straddles two classes is mixed: most, not all, hold one label
            seen = [e for e in read if e["distinct"] == 1 and e["size"] >= MIN_SIZE]
            if len(seen) < max(MIN_BATCHES, 0.75 * len(read)):
                continue
            values = sorted({e["value"] for e in seen})
            classes = seen[0].get("classes")
            if classes == 1 or (classes is None and len(values) < 2):
                continue
            held = (f"labels {', '.join(map(str, values[:4]))}{' ...' if len(values) > 4 else ''}"
                    if len(values) > 1 else f"label {values[0]}")
            of = f" of the dataset's {classes} classes" if classes else ""
            yield self.finding(
                f"this DataLoader never shuffles, and {len(seen)} of the first {len(read)} batches "
                f"that trained the model hold a single class ({held}{of}): the data is sorted by "
                f"label, so training sees one class at a time and forgets the others",
                seen[0].loc,
                step=a.next_step_number(seen[0].seq),
                evidence={"batches": len(read), "single_class": len(seen), "labels": values, "classes": classes,
                          "batch_size": seen[0]["size"]})

    def _ordered_values(self, a, spreads, fed: set):
        """Loaders whose batches each hold a narrow slice of a scalar's values."""
        by_slot: dict[tuple, list] = {}
        for e in spreads:
            if (e["loader"], 0, e["index"]) in fed and e["size"] >= MIN_SIZE:
                by_slot.setdefault((e["loader"], e["slot"]), []).append(e)
        told: set = set()
        for (loader, slot), read in sorted(by_slot.items(), key=lambda item: item[0][1] == "input"):
            if len(read) < MIN_BATCHES + 1 or loader in told:
                continue
            means = [e["mean"] for e in read]
            within = sum(e["var"] for e in read) / len(read)
            centre = sum(means) / len(means)
            between = sum((m - centre) ** 2 for m in means) / len(means)
            total = within + between
            if total <= 0:
                continue
            pairs = list(zip(read, read[1:]))
            rising = all(p["high"] <= q["low"] and p["mean"] < q["mean"] for p, q in pairs)
            falling = all(p["low"] >= q["high"] and p["mean"] > q["mean"] for p, q in pairs)
            if not (rising or falling or within / total < NARROW):
                continue
            told.add(loader)
            what = "target" if slot == "target" else "scalar input"
            if rising or falling:
                seen = (f"each of the first {len(read)} batches that trained the model holds "
                        f"{what} values all {'above' if rising else 'below'} those of the batch "
                        f"before it")
            else:
                seen = (f"each of the first {len(read)} batches that trained the model holds a "
                        f"narrow slice of its {what}'s values (the variance within a batch is "
                        f"{within / total:.1%} of the variance over those batches)")
            yield self.finding(
                f"this DataLoader never shuffles, and {seen}: the data is ordered by that value, "
                f"so training fits one part of the range at a time and ends up fitting the last",
                read[0].loc, step=a.next_step_number(read[0].seq),
                evidence={"batches": len(read), "slot": slot, "within_share": within / total,
                          "sorted": rising or falling,
                          "batch_size": read[0]["size"]})
