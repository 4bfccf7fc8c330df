from __future__ import annotations

from ..findings import Severity
from .base import Rule



class PrefixSumOffPositions(Rule):
    """
    ## What it does
    Finds a prefix sum or product (`cumsum`, `cumprod`, `logcumsumexp`) in a next-token model
    that runs over another axis than the positions: causal linear attention's running
    `k^T v` state summed over the heads or features (`.cumsum(dim=2)` on (B, T, H, D, D)), a
    gated linear RNN's decays multiplied over the channels, a causal running mean taken over
    the features. The dependency probe gives the sequence's length T (the positions of the
    model's output whose targets are the next tokens); each cumulative op with a graph whose
    result the loss reads at the first backwards gives its shape and axis: one whose shape holds
    T at exactly one axis, while it runs over another axis of another size, is reported at its
    call.

    ## Why is this bad?
    In a causal linear attention or a linear RNN written in parallel form, the prefix over the
    positions is the recurrence: position t sums the keys and values of positions 0..t. Run over
    the heads or the features, it mixes channels that should stay apart and carries nothing
    from one position to the next: the model has no memory of the context, and learns little
    more than a bigram table. Nothing fails: the shapes are the same.

    ## Example
    ```python
    kv = torch.einsum("bthd,bthe->bthde", k, v).cumsum(dim=2)  # over the heads
    ```

    ## Use instead
    ```python
    kv = torch.einsum("bthd,bthe->bthde", k, v).cumsum(dim=1)  # over the positions
    ```

    ## Stays silent on
    Prefixes over the positions (any way the axis is written, `dim=1`, `dim=-4`); chunked
    forms whose shapes no longer hold T (a prefix within or across chunks); prefixes in models
    without next-token targets; prefixes without a graph (position ids from a mask); results
    whose shape holds T at two axes (ambiguous); the CDF of a per-position distribution over
    classes or bins (a cumsum of probabilities ending at 1 everywhere: an ordinal or
    earth-mover loss over the vocabulary).
    """

    code = "GD388"
    slug = "prefix-sum-off-positions"
    severity = Severity.WARNING
    summary = ("a prefix sum or product in a next-token model runs over another axis than the "
               "positions: the running state carries nothing from one position to the next")
    fix = "run the cumulative op over the positions' axis (dim=1 for batch-first (B, T, ...) tensors)"

    def check(self, a):
        lengths = set()
        for e in a.by_kind.get("dependency", ()):
            seq = e.get("seq") or {}
            if seq.get("k") == 1 and seq.get("positions"):
                lengths.add(int(seq["positions"]))
        if len(lengths) != 1:
            return  # no next-token model probed, or several lengths: the positions are not known
        T, = lengths
        for e in a.of_kind("cumulative_axis"):
            shape, dim, op = list(e["shape"]), int(e["dim"]), e["op"]
            if e.get("cdf") or shape.count(T) != 1 or shape[dim] in (T, 1):
                continue
            axis = shape.index(T)
            yield self.finding(
                f"`{op}` runs over axis {dim} (size {shape[dim]}) of a {tuple(shape)} tensor, while "
                f"the {T} positions of this next-token model are its axis {axis}: the prefix "
                f"accumulates across {'the heads or features' if dim > axis else 'another axis'} "
                f"instead of across the positions, so the running state carries nothing from one "
                f"position to the next",
                e.loc, step=a.next_step_number(e.seq),
                fix=f"run it over the positions: `{op}(dim={axis})` (or dim={axis - len(shape)})",
                evidence={"op": op, "shape": shape, "dim": dim, "positions": T,
                          "positions_axis": axis})
