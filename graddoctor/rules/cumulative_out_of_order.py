from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Related, Rule


def _wrong_sum(a, e, rows) -> tuple[int, str] | None:
    """When the product runs along the last axis (where rays x samples keep their samples) and
    the weights are summed along another one, the sum is the line to change: ``(line, text)`` of
    the one ``sum`` call within ``_NEAR`` lines after the product whose text names that other
    axis (``.sum(dim=0)``, ``sum(0)``); None otherwise (which side is wrong is then not told)."""
    dim = e.get("dim")
    if e.loc is None or dim != -1 or not isinstance(rows, int) or rows < 0:
        return None
    spelled = (f"dim={rows}", f"sum({rows})", f"sum({rows},", f"axis={rows}")
    found = [(line, text) for line, text, _ in a.source.calls_named(e.loc.path, frozenset({"sum"}))
             if e.loc.line < line <= e.loc.line + _NEAR
             and any(s in text.replace(" ", "") for s in spelled)]
    found = list(dict.fromkeys(found))
    return found[0] if len(found) == 1 else None


_NEAR = 12  # lines after the product where the rendering's sum is looked for


class CumulativeOutOfOrder(Rule):
    """
    ## What it does
    Finds a cumulative op (`cumsum`, `logcumsumexp`, `cumprod`) whose running order is not the
    order its loss needs, so that each row (or sample) is paired with the running total of the
    wrong rows:
    a ranking normalizer `h - logcumsumexp(h, 0)` (a Cox partial likelihood's risk set, a
    Plackett-Luce term) over rows that are not sorted by the key it must follow (the rows come
    shuffled from a loader, or the script's event times run ascending under a prefix sum), and a
    volume-rendering transmittance `alpha * cumprod(1 - alpha)` that is inclusive (sample `i`
    dimmed by its own opacity) or taken along another axis than the one the rendering sums the
    weights over (the rays instead of the samples). Read at the first 3 backwards after such ops: the loss's
    graph, and for a 1-D normalizer the per-row keys the op's frame and its caller's hold
    (1-D tensors of the rows' length, without gradient, with many distinct values), put in the
    order the op ran over (an index taken on the way, a flip). It points at the op's call, or,
    for a product along the last axis (where rays x samples keep their samples) whose weights
    are summed along another, at that `sum(dim=...)` when the source shows one within a few
    lines after the product: the composite is then the line to change.

    ## Why is this bad?
    A Cox risk set for subject `i` is every subject still at risk at `i`'s event time: with the
    rows in descending time order, a prefix sum. In any other order the prefix sum mixes in
    subjects who left before and drops some still at risk; the loss still falls, and the
    model learns a ranking of nothing in particular (the concordance stays near 0.5). An
    inclusive transmittance makes every sample's weight `alpha_i * (1 - alpha_i) * ...`: an
    opaque sample (alpha = 1) gets weight 0, the weights no longer add up to the ray's opacity,
    and surfaces render dark or hollow.

    ## Example
    ```python
    for x, time, event in loader:                     # shuffled rows
        risk = net(x).squeeze(-1)
        loss = -((risk - torch.logcumsumexp(risk, 0)) * event).sum()
    ```

    ## Use instead
    ```python
    order = torch.argsort(time, descending=True)      # the risk sets as prefixes
    risk, event = risk[order], event[order]
    loss = -((risk - torch.logcumsumexp(risk, 0)) * event).sum()
    # NeRF: T_i = prod_{j<i} (1 - alpha_j), an exclusive product
    trans = torch.cumprod(torch.cat([torch.ones_like(alpha[..., :1]), 1 - alpha + 1e-10], -1), -1)[..., :-1]
    ```

    ## Stays silent on
    A normalizer over rows sorted by a key in the frames (descending, or ascending with the
    sum flipped: `flip(cumsum(flip(x)))`), or sorted inside the loss function by an index;
    a ranking term over rows in ascending key order without a survival indicator (a ListMLE's
    own convention); no per-row key in the frames (nothing to check against); a cumulative
    sum over another axis (stick-breaking weights, a sequence's running total) or whose result
    is not compared with its own rows; an exclusive transmittance (a shifted `cat`/`pad`, or
    log space with `pad`). Not seen: risk sets built as an `(N, N)` mask, rows on an
    accelerator, a wrong-axis product whose weights are not summed by one plain `sum(dim)`.
    """

    code = "GD275"
    slug = "cumulative-out-of-order"
    severity = Severity.WARNING
    summary = ("a cumulative op runs in another order than its loss needs: a Cox risk set over "
               "unsorted rows, or an inclusive transmittance")
    fix = ("sort the rows by the key before the running sum (descending event time for a Cox "
           "risk set), or make the product exclusive (shift it by one sample)")

    def check(self, a):
        for e in a.of_kind("cumulative_order"):
            op, case, key = e.get("op"), e.get("case"), e.get("key")
            if case == "inclusive":
                yield self.finding(
                    f"this `{op}` makes a transmittance that includes each sample's own "
                    f"opacity: the loss multiplies `alpha` by the running product of `1 - alpha` "
                    f"up to and including the same sample, with no shift between them. Sample i "
                    f"is then dimmed by itself (an opaque sample gets weight 0) and the weights no "
                    f"longer sum to the ray's opacity, so surfaces render dark or hollow",
                    e.loc, step=a.next_step_number(e.seq),
                    evidence={"op": op, "case": case, "dim": e.get("dim")},
                    fix=("make the product exclusive, T_i = prod_{j<i} (1 - alpha_j): prepend a 1 "
                         "and drop the last sample, e.g. trans = torch.cumprod(torch.cat("
                         "[torch.ones_like(alpha[..., :1]), 1 - alpha + 1e-10], -1), -1)[..., :-1]"))
                continue
            rows = e.get("rows")
            if case == "axis":
                summed = _wrong_sum(a, e, rows)
                if summed is not None:
                    line, text = summed
                    yield self.finding(
                        f"this sum composites the weights `alpha * T` along axis {rows}, but the "
                        f"transmittance `{op}` runs along axis {e.get('dim')}, the samples' axis: "
                        f"`{text}` adds up the samples at one position of all rays (other rays' "
                        f"colours), not the samples of each ray, so each pixel is rendered from "
                        f"the other rays in the batch",
                        Location(e.loc.path, line, e.loc.function), step=a.next_step_number(e.seq),
                        related=(Related(e.loc, f"the `{op}` along axis {e.get('dim')}"),),
                        evidence={"op": op, "case": case, "dim": e.get("dim"), "summed": rows,
                                  "at": "sum"},
                        fix=("sum the weighted colours over the samples' axis, the one the "
                             "transmittance runs along (`.sum(dim=-2)` of (rays, samples, 3) "
                             "colours, `dim=-1` of (rays, samples) weights)"))
                    continue
                yield self.finding(
                    f"this `{op}` runs the transmittance along axis {e.get('dim')}, but the "
                    f"rendering sums the weights `alpha * T` along axis {rows}: each sample is "
                    f"dimmed by the samples at its position on other rays (or other rays' "
                    f"samples), not by the ones in front of it on its own ray",
                    e.loc, step=a.next_step_number(e.seq),
                    evidence={"op": op, "case": case, "dim": e.get("dim"), "summed": rows},
                    fix=(f"take the product along the samples' axis, the one the weights are "
                         f"summed over (dim={rows}, usually -1), with the 1 prepended and the last "
                         f"product dropped along that same axis"))
                continue
            if case == "reversed":
                why = (f"the rows run in ascending `{key}` order, so the prefix `{op}` of row i "
                       f"covers the rows with an earlier `{key}`, not the ones still at risk; "
                       f"the term is multiplied by a 0/1 event indicator, as a Cox partial "
                       f"likelihood is")
                fix = (f"sort by `{key}` descending (torch.argsort({key}, descending=True)) "
                       f"before the {op}, or flip the rows around it: "
                       f"{op}(x.flip(0), 0).flip(0)")
            else:
                why = (f"its {rows} rows are in no order of `{key}` (nor of any other per-row key "
                       f"the frames hold, even after the index taken on the way): each row's "
                       f"running total covers whichever rows happened to come first, a shuffled "
                       f"loader's order")
                fix = (f"sort the rows by `{key}` (descending event time for a Cox risk set) "
                       f"before the {op}: order = torch.argsort({key}, descending=True); "
                       f"risk, event = risk[order], event[order]")
            yield self.finding(
                f"this `{op}` is a ranking normalizer (each row's score against the running total "
                f"over the rows before it, as in a Cox risk set) but {why}. The loss still falls; "
                f"the model learns to rank by nothing in particular",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"op": op, "case": case, "key": key, "rows": rows}, fix=fix)
