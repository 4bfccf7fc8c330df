from __future__ import annotations

import math
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule, related

_BUILDERS = {"cross_entropy": ("CrossEntropyLoss", "cross_entropy"), "nll_loss": ("NLLLoss", "nll_loss"),
             "binary_cross_entropy_with_logits": ("BCEWithLogitsLoss", "binary_cross_entropy_with_logits")}


def _pct(share: float) -> str:
    return f"{share * 100:.3g} %"


class ClassWeightsInverted(Rule):
    """
    ## What it does
    Finds a classification loss whose per-class weights grow with how often each class occurs
    among its targets: `cross_entropy` / `nll_loss` (or `nn.CrossEntropyLoss`, `nn.NLLLoss`)
    given `weight=` that ranks the classes as their frequency does (the most frequent class
    weighs the most, the rarest the least), or `binary_cross_entropy_with_logits` given a
    `pos_weight` below 1 for outputs whose positives are rare, or equal to positives / negatives
    (to within a factor of 1.5) for outputs whose positives are the minority. The targets of the first calls
    are counted per class. It points at the call that passes the weights (the loss's
    construction, `nn.CrossEntropyLoss(weight=...)`) when the script has one, or at the
    statement that computes the weights it is given (`pos_weight = n_pos / n_neg`, given to the
    loss's construction or by name to the functional call), else at the loss call. The same
    weights applied by hand: a per-sample `cross_entropy(..., reduction="none")` multiplied by a
    table of one weight per class looked up by the labels (`(w[y] * ce).mean()`, a class-balanced
    focal loss `cb[y] * (1 - p_t) ** gamma * ce`), read from the graph of the first backwards (a
    factor without gradient, one value within each target class); it points at the statement
    that computes the table (`w = counts / counts.sum()`, not a later renormalisation). The same inversion in a `WeightedRandomSampler`: per-sample weights that take a few
    values (one per class, `class_weight[labels]`), where the values held by more samples are
    larger in proportion to how many samples hold them (a slope of 0.75–1.33 on a log-log fit,
    the most common value on at least 3 times as many samples as the rarest). It points at the
    line that computes those weights when the script assigns them to a name, else at the
    sampler.

    ## Why is this bad?
    Class weights are meant to counter an imbalance: the inverse of each class's frequency
    (`pos_weight = negatives / positives`). Weights proportional to the frequency (`counts /
    counts.sum()`, the inversion forgotten; `pos_weight = positives / negatives`) do the opposite:
    the frequent classes weigh even more, the rare ones are all but ignored, and the model
    learns to predict the majority class. The loss still goes down; nothing fails. A sampler
    given such weights draws each class in proportion to the square of its frequency: the rare
    classes almost vanish from the batches, the opposite of the oversampling it was built for.

    ## Example
    ```python
    counts = torch.bincount(train_labels, minlength=C).float()
    criterion = nn.CrossEntropyLoss(weight=counts / counts.sum())
    sampler = WeightedRandomSampler(counts[train_labels], num_samples=len(train_labels))
    ```

    ## Use instead
    ```python
    counts = torch.bincount(train_labels, minlength=C).float()
    criterion = nn.CrossEntropyLoss(weight=counts.sum() / (C * counts))
    sampler = WeightedRandomSampler(1.0 / counts[train_labels], num_samples=len(train_labels))
    ```

    ## Stays silent on
    Inverse-frequency weights (and their square root, effective-number weights); weights that
    do not follow the frequencies (a class weighed up for its cost); a weight of 0 for a
    padding or ignored class; balanced targets (the most frequent class less than 3 times the
    rarest seen); weights within a factor of 2 of each other; per-sample weights applied by hand
    that are not one value per class (a confidence or small-loss weight); `pos_weight` above 1, or below 1
    for outputs whose positives are common; class-probability targets. Samplers whose weights
    are inverse to the group sizes (or a power of them below 0.75, temperature sampling), take
    more than 64 values or single-sample values (per-sample scores), or down-weight a small
    group by a factor unrelated to its size (a noisy source at 0.3).
    """

    code = "GD150"
    slug = "class-weights-inverted"
    severity = Severity.WARNING
    summary = ("a loss's class weights grow with the classes' frequency (proportional, not "
               "inverse): the frequent classes weigh more and the rare ones are ignored")
    fix = "weigh each class by the inverse of its frequency: weight = counts.sum() / (C * counts)"

    def check(self, a):
        for e in a.of_kind("class_weights"):
            fn = e.get("fn", "cross_entropy")
            loc, notes = self._weighted_call(a, e, fn), ()
            if loc is not e.loc:
                notes = (related(e, "the loss called with those weights"),)
            classes, shares, weights = e.get("classes") or [], e.get("shares") or [], e.get("weights") or []
            evidence = {"function": fn, "classes": classes, "shares": shares, "weights": weights}
            if fn == "binary_cross_entropy_with_logits":
                shown = ", ".join(f"output {c} ({_pct(s)} positives) has pos_weight {w:g}"
                                  for c, s, w in zip(classes, shares, weights))
                yield self.finding(
                    f"binary_cross_entropy_with_logits weighs the positives of outputs whose "
                    f"positives are the minority below 1: {shown}, so those positives count even less "
                    f"than without a weight (pos_weight = positives / negatives, inverted?)",
                    loc, related=notes, step=a.next_step_number(e.seq), evidence=evidence,
                    fix="set pos_weight = negatives / positives per output (above 1 for rare "
                        "positives)")
                continue
            if len(classes) < 2:
                continue
            if e.get("by_hand"):
                yield self._by_hand(a, e, classes, shares, weights, evidence)
                continue
            yield self.finding(
                f"{fn}'s class weights grow with the classes' frequency: class {classes[0]} "
                f"({_pct(shares[0])} of the targets seen) weighs {weights[0]:g}, class "
                f"{classes[1]} ({_pct(shares[1])}) weighs {weights[1]:g}, so the frequent "
                f"classes count more and the rare ones are all but ignored: weights proportional "
                f"to the counts, where their inverse was meant",
                loc, related=notes, step=a.next_step_number(e.seq), evidence=evidence)

        yield from self._sampler_findings(a)

    def _by_hand(self, a, e, classes, shares, weights, evidence):
        tables = a.source.label_weight_tables(e.loc.path) if e.loc is not None else []
        loc, notes, name = e.loc, (), None
        if len(tables) == 1:
            loc = Location(e.loc.path, tables[0][0], e.loc.function)
            name = tables[0][2]
            notes = (related(e, "the backward of the loss those weights multiply"),)
        shown = f"`{name}`" if name else "the per-class weights"
        return self.finding(
            f"{shown}, looked up by each sample's label and multiplied into the per-sample "
            f"cross-entropy, grow with the classes' frequency: class {classes[0]} "
            f"({_pct(shares[0])} of the targets seen) weighs {weights[0]:g}, class {classes[1]} "
            f"({_pct(shares[1])}) weighs {weights[1]:g}, so the frequent classes count more and "
            f"the rare ones are all but ignored: weights proportional to the counts (or the "
            f"effective numbers), where their inverse was meant",
            loc, related=notes, step=a.next_step_number(e.seq), evidence={**evidence, "by_hand": True},
            fix=(f"invert it: {name} = 1 / counts (normalised), or (1 - beta) / (1 - beta ** counts) "
                 f"for effective-number weights" if name else
                 "give each class the inverse of its frequency: 1 / counts (normalised), or "
                 "(1 - beta) / (1 - beta ** counts)"))

    def _sampler_findings(self, a):
        for e in a.of_kind("loader_sampler"):
            levels = [level for level in e.get("levels") or () if level[0] > 0]
            if len(levels) < 2:
                continue
            by_size = sorted(levels, key=lambda level: level[1])
            (w_rare, n_rare), (w_common, n_common) = by_size[0], by_size[-1]
            if n_common < 3 * n_rare or w_common < 2 * w_rare:
                continue
            slope = _log_slope([n for _, n in levels], [w for w, _ in levels])
            if slope is None or not 0.75 <= slope <= 1.33:
                continue
            loc, notes = e.loc, ()
            origin = a.source.argument_origin(e.loc.path, e.loc.line, "WeightedRandomSampler",
                                                      "weights") if e.loc else None
            if origin is not None:
                loc = Location(e.loc.path, origin[0], e.loc.function)
                notes = (related(e, "the WeightedRandomSampler given those weights"),)
            yield self.finding(
                f"WeightedRandomSampler's weights grow with the size of the group that holds them: "
                f"{n_common} samples weigh {w_common:g} each, {n_rare} samples weigh {w_rare:g} "
                f"each, so the common classes are drawn in proportion to the square of their "
                f"frequency and the rare ones almost never: weights proportional to the class "
                f"counts, where their inverse was meant",
                loc, related=notes, step=a.next_step_number(e.seq),
                evidence={"function": "WeightedRandomSampler", "levels": levels, "slope": slope},
                fix="give each sample the inverse of its class's count: weights = 1.0 / "
                    "counts[labels]")

    @staticmethod
    def _weighted_call(a, e, fn: str):
        """The one call of the script that builds or calls this loss with its weights
        (``nn.CrossEntropyLoss(weight=w)``), else the event's location (the loss call)."""
        if e.loc is None:
            return e.loc
        keyword = "pos_weight=" if fn == "binary_cross_entropy_with_logits" else "weight="
        found = [c for c in a.source.calls_named(e.loc.path, _BUILDERS.get(fn, ()))
                 if keyword in c[1].replace(" ", "")]
        if len(found) != 1:
            return e.loc
        line = found[0][0]
        # the weights computed in a statement of their own (`pos_weight = n_pos / n_neg`): the
        # arithmetic there is what to change, not the loss built with its result
        for builder in _BUILDERS.get(fn, ()):
            if builder[:1].isupper():
                origin = a.source.argument_origin(e.loc.path, line, builder, keyword.rstrip("="))
            else:  # a functional call's first argument is the scores: follow the keyword's name
                name = a.source.call_argument(e.loc.path, line, builder, 99, keyword.rstrip("="))
                origin = (a.source.value_origin(e.loc.path, line, name)
                          if name is not None and name.isidentifier() else None)
            if origin is not None and origin[0] != line \
                    and re.search(r"[/*]|\b(sum|mean|bincount|count|numel)", origin[1]):
                return Location(e.loc.path, origin[0])
        return Location(e.loc.path, line)


def _log_slope(sizes: list[int], weights: list[float]) -> float | None:
    """The least-squares slope of log(weight) on log(size) over the levels (1: weights
    proportional to how many samples hold them, -1: inverse), or None when the sizes are all
    one."""
    xs, ys = [math.log(n) for n in sizes], [math.log(w) for w in weights]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
