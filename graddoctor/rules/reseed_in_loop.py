from __future__ import annotations

import bisect

from ..findings import Severity
from ..location import Location
from .base import Related, Rule, plural


class ReseedInLoop(Rule):
    """
    ## What it does
    Finds a global random generator set to the same seed again and again during training:
    `torch.manual_seed(0)` (or `random.seed`, `numpy.random.seed`, a helper that calls them)
    run with the same value between optimizer updates, in the loop or at every epoch. A seed
    set once before the loop, or set each time to a value that changes (`seed + epoch`), is
    fine.

    ## Why is this bad?
    Setting the seed rewinds the generator: every turn after it draws the very same random
    numbers. Dropout drops the same units at every update (a fixed sub-network trains instead
    of an ensemble), a `randperm`/`randint` batch is the same batch every time, a shuffled
    DataLoader serves its samples in the same order every epoch, data augmentation repeats
    itself. Nothing fails; the model just sees far less randomness than the script claims.

    ## Example
    ```python
    for step in range(steps):
        torch.manual_seed(1234)          # every update draws the same numbers
        idx = torch.randperm(len(X))[:64]
        loss = criterion(model(X[idx]), Y[idx])
        ...
    ```

    ## Use instead
    ```python
    torch.manual_seed(1234)              # once, before the loop
    for step in range(steps):
        idx = torch.randperm(len(X))[:64]
        loss = criterion(model(X[idx]), Y[idx])
        ...
    ```

    ## Stays silent on
    One seed before the loop; a seed that changes every time (`torch.manual_seed(seed + epoch)`);
    a seed whose value graddoctor cannot read; seeding a `torch.Generator` object of its own;
    a seed at the start of each training run of a sweep or a resume (a new model and optimizer
    after it: the first update after the seed is made by an optimizer that made none since the
    seed before).
    """

    code = "GD231"
    slug = "reseed-in-loop"
    severity = Severity.WARNING
    summary = "the global RNG is set to the same seed between updates: every turn draws the same random numbers"
    fix = "seed once before the training loop (or with a value that changes, e.g. seed + epoch)"

    def check(self, a):
        stepped = [e for e in a.of_kind("step") if not e.get("skipped")]
        steps = [e.seq for e in stepped]
        if not steps:
            return
        by_line: dict = {}
        for e in a.of_kind("reseed"):
            if e.loc is None or e.get("seed") is None:
                continue
            by_line.setdefault((e.loc.path, e.loc.line), []).append(e)
        found: dict = {}  # finding location -> (first repeat, count, fns, related)
        for events in by_line.values():
            repeats, previous = [], None
            for e in events:
                if previous is not None and previous.get("seed") == e.get("seed"):
                    # an update between the two seedings
                    i = bisect.bisect_right(steps, previous.seq)
                    if i < len(steps) and steps[i] < e.seq and not _new_run(stepped, steps, i, e):
                        repeats.append(e)
                previous = e
            if not repeats:
                continue
            first = repeats[0]
            loc, rel = first.loc, ()
            caller = first.get("caller")
            if caller and first.loc.function and first.loc.function != "<module>":
                at = Location(str(caller[0]), int(caller[1]), str(caller[2]))
                if a.source.inside_loop(at.path, at.line):
                    loc = at
                    rel = (Related(first.loc, f"the {first.get('fn')}({first.get('seed')}) call"),)
            key = (loc.path, loc.line)
            if key in found:  # one helper seeding torch and random: one finding at its call
                found[key]["fns"].append(first.get("fn"))
                found[key]["related"] += rel
                continue
            found[key] = {"first": first, "count": a.count(repeats) + 1, "fns": [first.get("fn")],
                          "related": rel, "loc": loc, "between": _between(a, steps, events)}
        for item in found.values():
            first, count, fns = item["first"], item["count"], item["fns"]
            rel, loc, between = item["related"], item["loc"], item["between"]
            seed = first.get("seed")
            shown = " and ".join(f"{fn}({seed})" for fn in dict.fromkeys(fns))
            yield self.finding(
                f"{shown} {'sets' if len(fns) == 1 else 'set'} the global generator to the same "
                f"seed again during training ({plural(count, 'time')}, {between}): every turn "
                "after it draws the same random numbers, so dropout masks, random batches, "
                "shuffles and augmentations repeat",
                loc, related=rel, step=a.next_step_number(first.seq),
                evidence={"fn": fns[0], "seed": seed, "times": count},
            )


def _new_run(stepped, steps, i, e) -> bool:
    """Whether the seeding ``e`` starts another training run: the first update after it is
    made by an optimizer that made none of the updates since the seeding before (``steps[i:]``
    up to ``e``): a sweep or a resume that seeds, builds a model and its optimizer, and trains."""
    j = bisect.bisect_right(steps, e.seq)
    if j >= len(steps):
        return False
    before = {s.get("opt") for s in stepped[i:j]}
    return stepped[j].get("opt") not in before


def _between(a, steps, events) -> str:
    """'before every update' or 'every 17 updates'."""
    gaps = set()
    for x, y in zip(events, events[1:]):
        gaps.add(bisect.bisect_right(steps, y.seq) - bisect.bisect_right(steps, x.seq))
    gaps.discard(0)
    if gaps == {1}:
        return "before every update"
    if len(gaps) == 1:
        return f"every {gaps.pop()} updates"
    return "between updates"
