from __future__ import annotations

import re

from ..findings import Severity
from ..trace import Location
from .base import Rule

_LOSSES = ("cross_entropy", "CrossEntropyLoss", "nll_loss", "NLLLoss", "criterion", "loss_fn")


def _scores_name(given: str) -> str | None:
    """The name of the logits in the loss's first argument as written: ``sim`` in ``sim`` and
    in ``F.log_softmax(sim, dim=1)``; None for anything else."""
    inner = given.split("(", 1)[1].split(",")[0].split(")")[0].strip() if "(" in given else given
    return inner if inner.isidentifier() else None


def _arange_for(value: str, logits: str | None, rows: int) -> str:
    """The ``arange`` that labels row i with column i, written like the targets it replaces
    where it can be: ``torch.zeros(len(q), dtype=torch.long)`` becomes ``torch.arange(len(q),
    dtype=torch.long)``; else one as long as the logits."""
    if re.match(r"torch\.zeros\((?![(\[])", value):
        return value.replace("torch.zeros(", "torch.arange(", 1)
    if logits is not None:
        return f"torch.arange(len({logits}), device={logits}.device)"
    return f"torch.arange({rows})"


class ContrastivePositiveMisplaced(Rule):
    """
    ## What it does
    Finds a pairwise-similarity loss whose targets do not point at each row's positive. Read
    from the graph of the loss's input at its first calls: the logits of a `cross_entropy`
    (or of `nll_loss` after `log_softmax`) are followed down, through scalar factors, a learned
    temperature, masked fills and transposes, to the pairwise similarities of two batches'
    embeddings (`z1 @ z2.T`, `torch.mm`, `einsum("nd,md->nm")`, `F.cosine_similarity(z1[:,
    None], z2[None], dim=-1)`, `-torch.cdist(z1, z2)`; neither side a parameter or made of
    parameters alone). It is reported when every row gets the same label (`torch.zeros(B)`,
    at least 4 rows and as many columns), or when the similarity is of one tensor with itself
    (`z @ z.T`) and at least half the rows are labelled with their own index (`arange(2N)`:
    each sample's similarity with itself). And for `triplet_margin_loss`,
    `triplet_margin_with_distance_loss` and their `nn` modules, when the positive given is the
    negative given with its rows reordered (`roll`, `flip`, `index_select`, indexing) and in
    at least 75% of the rows the anchor is nearer the negative given than the positive given:
    the arguments are swapped. It points at the line that writes the targets (their
    assignment, or the call), or at the triplet call.

    ## Why is this bad?
    In `z1 @ z2.T` row i holds sample i's similarities with every sample of the other view, and
    its positive is column i. Labels of zeros say that every sample's positive is sample 0's
    other view: the loss pulls all the embeddings towards one sample and pushes each away from
    its own pair, the opposite of what a contrastive loss is for. Labels on the diagonal of
    `z @ z.T` point at each view's similarity with itself, a constant after normalisation:
    nothing pulls the two views together, only apart from the rest. A triplet with positive
    and negative swapped pushes each anchor away from its own view. The loss still falls, the
    run ends normally, and the embeddings are worthless.

    ## Example
    ```python
    logits = F.normalize(z1, dim=1) @ F.normalize(z2, dim=1).T / 0.07
    loss = F.cross_entropy(logits, torch.zeros(len(z1), dtype=torch.long))
    ```

    ## Use instead
    ```python
    logits = F.normalize(z1, dim=1) @ F.normalize(z2, dim=1).T / 0.07
    loss = F.cross_entropy(logits, torch.arange(len(z1)))
    # SimCLR's 2N views against each other: the positive of row i is column (i + N) % 2N
    labels = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
    ```

    ## Stays silent on
    MoCo's `cat([l_pos, l_neg], 1)` with labels of zeros (column 0 is each row's own
    positive); per-row candidate lists (`bmm(q[:, None], cands.transpose(1, 2))` with the
    positive first); SimCLR's shifted `arange`; CLIP's `arange` both ways, with or without
    label smoothing; retrieval with hard negatives appended after the in-batch columns and
    `arange` labels; supervised contrastive losses with soft class-mask targets; classification
    heads, `x @ W.T` and cosine classifiers with a normalised weight; triplets whose negatives
    are the positives rolled, and batch-hard mining (positive and negative both picked from one
    embedding). Not looked at: labels that are a permutation other than the identity (a shift
    by the wrong amount); a triplet whose swapped arguments come from separate batches (nothing
    in the graph tells which is the anchor's); a margin or ranking loss over similarities
    (`margin_ranking_loss(neg, pos, 1)`).
    """

    code = "GD173"
    slug = "contrastive-positive-misplaced"
    severity = Severity.WARNING
    summary = ("the targets of a contrastive loss do not point at each row's positive: one "
               "label for every row, labels on each sample's similarity with itself, or a "
               "triplet's positive and negative swapped")
    fix = "label row i with the column of its own positive: torch.arange(B) for z1 @ z2.T"

    def check(self, a):
        told = set()
        for e in a.of_kind("pair_labels"):
            loc = e.loc
            how = e["how"]
            if how in ("triplet", "triplet-apart"):
                finding = self._triplet(a, e, loc)
            else:
                finding = self._labels(a, e, loc)
            if finding is not None and (finding.location, how) not in told:
                told.add((finding.location, how))
                yield finding

    def _labels(self, a, e, loc):
        rows, columns = e["rows"], e["columns"]
        written = a.source.labels_written(loc.path, loc.line, _LOSSES + (e["fn"],)) \
            if loc is not None else None
        if written is not None:
            loc = Location(loc.path, written[0])
        text = f"`{written[1]}`" if written is not None else "the loss's targets"
        logits = _scores_name(written[3]) if written is not None else None
        if e["how"] == "cat":
            return self._cat(a, e, loc, written, text)
        if e["how"] == "constant":
            value = "" if written is None else written[1].split(" = ", 1)[1] if written[4] else written[1]
            right = _arange_for(value, logits, rows)
            note = ("" if rows == columns else
                    f" (the first {rows} columns being the rows' positives in order)")
        elif e.get("halves"):
            n = rows // 2
            right = f"torch.cat([torch.arange({n}, {rows}), torch.arange({n})])"
            note = f": each view's other view, {n} rows away; and mask the diagonal"
        else:
            n = rows // 2
            right = f"torch.cat([torch.arange({n}, {rows}), torch.arange({n})])"
            note = (f" if the {rows} rows are two views of {n} samples concatenated, and mask "
                    f"the diagonal; a single view has no positive in its similarity with itself: "
                    f"compare it with a second view (z1 @ z2.T, labels torch.arange(len(z1)))")
        if written is not None and written[4]:
            fix = f"label each row with its own positive: `{written[2]} = {right}`{note}"
        elif written is not None:
            fix = f"label each row with its own positive: replace `{written[1]}` with `{right}`{note}"
        else:
            fix = f"label each row with its own positive: `{right}`{note}"
        if e["how"] == "constant":
            return self.finding(
                f"all {rows} rows of the {rows}x{columns} similarity matrix (a product of two "
                f"batches' embeddings) get the same label, {e['label']}, from {text}: every sample is "
                f"told that its positive is the sample of column {e['label']}, so the loss pulls "
                f"every embedding towards that one and pushes each away from its own pair"
                + (" (labels of zeros are right only for MoCo's cat([l_pos, l_neg]), where column 0 "
                   "is each row's own positive)" if e["label"] == 0 else ""),
                loc, evidence={"rows": rows, "columns": columns, "label": e["label"], "fn": e["fn"]},
                fix=fix)
        return self.finding(
            f"{e['share']:.0%} of the rows of the {rows}x{rows} similarity of one batch of "
            f"embeddings with itself (z @ z.T) are labelled with their own index by {text}: each such row's "
            f"target is the sample's similarity with itself, a constant once normalised, so no "
            f"two views are ever pulled together",
            loc, evidence={"rows": rows, "share": e["share"], "fn": e["fn"]}, fix=fix)

    def _cat(self, a, e, loc, written, text):
        rows, columns, column = e["rows"], e["columns"], e["label"]
        where = "column 0, the first" if column == 0 else f"column {column}, the last"
        right = (f"torch.zeros({rows}, dtype=torch.long)" if column == 0 else
                 f"torch.full(({rows},), {column}, dtype=torch.long)")
        if written is not None:
            made = a.source.labels_built(loc.path, loc.line) if not written[4] else None
            if made is not None:
                loc = Location(loc.path, made[0])
                text = f"`{made[1]}`"
                value = made[1].split(" = ", 1)[1]
                if column == 0 and "arange(" in value:
                    right = value.replace("arange(", "zeros(", 1)
                elif column == 0 and "ones(" in value:
                    right = value.replace("ones(", "zeros(", 1)
                fix = f"label every row with its positive's column: `{made[2]} = {right}`"
            elif written[4]:
                fix = f"label every row with its positive's column: `{written[2]} = {right}`"
            else:
                fix = f"label every row with its positive's column: replace `{written[1]}` with `{right}`"
        else:
            fix = f"label every row with its positive's column: `{right}`"
        return self.finding(
            f"the {rows}x{columns} logits concatenate each row's similarity with its own positive "
            f"(a single column, {where}) with its similarities to the negatives (MoCo's "
            f"cat([l_pos, l_neg], dim=1)), but {e['share']:.0%} of the rows are labelled with "
            f"another column by {text}: those rows are told that a negative (a queued key, another "
            f"sample) is their positive, so the loss pulls each query towards a negative and away "
            f"from its own key",
            loc, evidence={"rows": rows, "columns": columns, "column": column,
                           "share": e["share"], "fn": e["fn"], "how": "cat"},
            fix=fix)

    def _triplet(self, a, e, loc):
        call = a.source.call_with_swapped(loc.path, loc.line, 1, 2) if loc is not None else None
        fix = (f"swap the positive and the negative: `{call[1]}`" if call is not None else
               "pass (anchor, positive, negative) in that order: the anchor's own view second, "
               "the reordered rows third")
        if e["how"] == "triplet-apart":
            return self.finding(
                f"{e['fn']} is given three separately embedded batches, and in {e['share']:.0%} of "
                f"the {e['rows']} rows the anchor is nearer the tensor given as negative than the "
                f"one given as positive, at two calls: positive and negative are swapped, so each "
                f"anchor is pulled towards the sample of another class (or another image) and pushed "
                f"away from its own positive",
                loc, evidence={"rows": e["rows"], "share": e["share"], "fn": e["fn"], "how": e["how"]},
                fix=fix)
        return self.finding(
            f"{e['fn']} gets as its positive the negative's rows reordered (each row "
            f"another sample's embedding), and in {e['share']:.0%} of the {e['rows']} rows the "
            f"anchor is nearer the tensor given as negative: positive and negative are swapped, "
            f"so each anchor is pushed away from its own view and pulled towards another sample",
            loc, evidence={"rows": e["rows"], "share": e["share"], "fn": e["fn"]}, fix=fix)
