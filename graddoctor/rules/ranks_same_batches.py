from __future__ import annotations

from dataclasses import replace

from ..findings import Severity, spans
from ..trace import Location
from .base import Rule

PRINT_RTOL = 1e-9  # the same batch gives the same fingerprint; another one is far off


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
        and abs(value) != float("inf")


def _same(a, b, rtol: float = PRINT_RTOL) -> bool:
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-30)


def _replicas(processes, ranks) -> bool:
    """Whether the ranks' parameter checksums (replicas-diverge's) say they train one model:
    DistributedDataParallel on each, or, without it, parameters of the same shapes stepped
    from the same values. A pipeline's stages and models seeded per rank are no replicas, and
    ranks without checksums (sharded parameters, no optimizer step) are not known to be."""
    first = {}
    for p in processes:
        if p.rank in ranks:
            sums = [c for c in p.checksums if c.get("opt") is not None]
            if not sums:
                return False
            first[p.rank] = min(sums, key=lambda c: (c.get("step", 0), c["opt"]))
    lead = first[min(first)]
    if "layout" not in lead:
        return all("layout" not in c for c in first.values())
    return all(c.get("layout") == lead["layout"] and _number(c.get("initial"))
               and _number(lead.get("initial")) and _same(c["initial"], lead["initial"], 1e-5)
               for c in first.values())


class RanksSameBatches(Rule):
    """
    ## What it does
    Compares the first batches each rank of a distributed run trains on (a fingerprint of the
    first 3 DataLoader batches that feed a backward, one device op each, read at the end of the
    run) and reports when every rank got the same ones: the DataLoader has no
    `DistributedSampler` (`shuffle=True` with the same seed everywhere, or no shuffling), or
    its `DistributedSampler` was told the same `rank`/`num_replicas` on every rank (then it
    points at the sampler's `rank=` argument, the one `DistributedSampler(...)` call that gives
    it). It
    compares processes, so it runs when the ranks' reports are merged (`check_processes`).

    ## Why is this bad?
    Nothing fails: the all-reduce averages N identical gradients, so the update is what one
    rank alone would compute. N GPUs do the work of one, every epoch goes over the dataset N
    times, the effective batch is a single rank's (not N times it, as the learning rate and the
    schedule assume), and the run sees 1/N of the data it was budgeted for.

    ## Example
    ```python
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    loader = DataLoader(dataset, batch_size=32, shuffle=True)  # the same order on every rank
    for epoch in range(epochs):
        for x, y in loader:
            ...
    ```

    ## Use instead
    ```python
    sampler = DistributedSampler(dataset)  # rank and world size from the process group
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)  # no shuffle=True
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            ...
    ```

    ## Stays silent on
    A `DistributedSampler` (with or without `set_epoch`: `sampler-without-set-epoch` judges
    that); data sharded per rank by hand (`Subset(dataset, range(rank, len(dataset), world))`,
    an `IterableDataset` that skips to its rank's items); `RandomSampler` with a seed that
    differs per rank (`torch.manual_seed(seed + rank)`); a single process; loaders that feed
    no backward (validation); data that is the same for every batch (a constant synthetic
    dataset: nothing to tell); ranks that are no replicas of one model (a pipeline's stages,
    tensor-parallel or sharded parameters, models seeded per rank: each may read the same
    batch by design), and ranks that took no optimizer step.
    """

    code = "GD404"
    slug = "ranks-same-batches"
    severity = Severity.WARNING
    summary = "every rank trains on the same batches (no DistributedSampler): N ranks do the work of one"
    fix = ("give the DataLoader sampler=DistributedSampler(dataset) (and drop shuffle=True), and "
           "call sampler.set_epoch(epoch) at the start of every epoch")

    def check(self, a):
        return iter(())  # one trace has nothing to compare its batches with: see check_processes

    def check_processes(self, processes):
        """Every rank's first batches identical: the ranks' fingerprints of the same batches
        (loader, epoch, index) all equal, while they change from one batch to the next."""
        prints: dict[int, dict[tuple, dict]] = {}
        for p in processes:
            if p.rank is None:
                continue
            own = {(e["loader"], e["epoch"], e["index"]): e for e in p.batch_fingerprints
                   if _number(e.get("value"))}
            if own:
                prints[p.rank] = own
        if len(prints) < 2:
            return
        keys = sorted(set.intersection(*(set(own) for own in prints.values())))
        lead = min(prints)
        ref = [prints[lead][k]["value"] for k in keys]
        if len(keys) < 2 or all(_same(v, ref[0]) for v in ref):
            return  # one batch, or the same one each time (constant data): nothing to tell
        if any(not _same(prints[r][k]["value"], v) for r in prints for k, v in zip(keys, ref)):
            return
        ranks = sorted(prints)
        if not _replicas(processes, set(ranks)):
            return
        first = prints[lead][keys[0]]
        loc = Location(first["path"], int(first["line"])) if first.get("path") and first.get("line") \
            else None
        n = len(ranks)
        why, fix = self._cause(first.get("sampler"), first.get("replicas"))
        if first.get("replicas") and isinstance(first.get("sampler_line"), int) and loc is not None:
            # the sampler was told the same rank on every rank: the line that tells it
            loc = Location(loc.path, first["sampler_line"])
        found = self.finding(
            f"every rank trains on the same batches: the first {len(keys)} batches that fed a "
            f"backward are identical on rank {spans(ranks)}{why}. The all-reduce averages {n} "
            f"copies of one gradient, so the {n} ranks do the work of one, each epoch goes over "
            f"the dataset {n} times, and the effective batch is one rank's, not {n} times it",
            loc, fix=fix,
            evidence={"ranks": ranks, "batches": [list(k) for k in keys],
                      "fingerprints": {str(r): [prints[r][k]["value"] for k in keys] for r in ranks},
                      "sampler": first.get("sampler"), "replicas": first.get("replicas")})
        yield replace(found, ranks=tuple(ranks))

    def _cause(self, sampler, replicas) -> tuple[str, str | None]:
        """What the loader draws with, said after the ranks, and the fix for it (None: the rule's)."""
        if sampler is None:
            return (": the IterableDataset yields the same stream on every rank",
                    "shard the stream by rank in the IterableDataset's __iter__ (keep every "
                    "world_size-th item from dist.get_rank(), or give each rank its own files)")
        if replicas:
            return (f": its {sampler} was built with num_replicas={replicas[0]}, rank={replicas[1]} "
                    f"on every rank",
                    f"build the {sampler} without num_replicas and rank (it reads them from the "
                    f"process group), or pass num_replicas=dist.get_world_size(), "
                    f"rank=dist.get_rank()")
        if sampler in ("RandomSampler", "SequentialSampler"):
            how = "shuffles with the same seed on every rank" if sampler == "RandomSampler" \
                else "reads the dataset in order on every rank"
            return f": the DataLoader has no DistributedSampler and {how}", None
        return (f": its {sampler} draws the same samples on every rank",
                f"make the {sampler} draw another part of the dataset on each rank (shard its "
                f"indices by dist.get_rank() and dist.get_world_size(), as DistributedSampler "
                f"does)")
