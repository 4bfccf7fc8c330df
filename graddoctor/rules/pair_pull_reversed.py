from __future__ import annotations

import ast

from ..findings import Severity
from .base import Rule

_WHAT = {"cdist": "the distances `torch.cdist` made", "pairwise_distance": "the distances `F.pairwise_distance` made",
         "cosine_similarity": "the similarities `F.cosine_similarity` made"}


class PairPullReversed(Rule):
    """
    ## What it does
    Finds a pairwise loss (metric learning, contrastive, Siamese, supervised contrastive, a
    pairwise BCE) that pushes apart the pairs sharing a label, or pulls together the pairs
    whose labels differ: batch-hard mining whose "hardest negative" is taken among the
    same-label pairs (`masked_fill(~same, inf)`: the sample itself), a contrastive loss written
    for y=1 "similar" given y=1 "dissimilar" (`1 - same`), SupCon with the positives mask
    inverted (`!=`), a pairwise BCE whose target is 1 for different labels, a positive mined
    among the other labels. Read at the first 3 backwards: a batch's pairwise matrix
    (`torch.cdist`, `F.pairwise_distance`, `F.cosine_similarity`, a matrix product of two
    tensors that are not parameters) gets a gradient hook, and the labels come from the
    script's own `==`/`!=` of integer labels, when the mask made from it meets a value with
    gradient of the matrix's shape. In distance orientation, the gradient's push and pull per
    pair are compared between the same-label and the different-label pairs (a distance's
    diagonal counts as same-label pairs: a sample and itself). Reported when every judged
    backward says reversed, at two at least, at the line that applies the mask the other way
    (or that flips its meaning, `!=`, `~`, `1 -`).

    A `cross_entropy` over the matrix labels the pairs too, by its class targets: its input made
    from the matrix by a few elementwise ops (a sign, a scale, a square), row i's same-label
    pair is column `target[i]`. A prototypical network (queries against the class prototypes),
    a matching network or a retrieval softmax that gives the distances as logits without their
    minus sign (or a similarity with one) pushes each query away from its own class: reported
    at the statement that makes the logits from the matrix.

    ## Why is this bad?
    These losses exist to make same-label samples close and different-label ones far apart.
    Reversed, the loss still falls, and the embedding learns the opposite: same-class samples
    are spread out, different classes are merged (or, with the sample itself as the "negative",
    nothing ever pushes two classes apart and the embedding collapses). Nothing fails; the
    retrieval accuracy is just at chance or worse.

    ## Example
    ```python
    dist = torch.cdist(emb, emb)
    same = y[:, None] == y[None, :]
    hardest_pos = (dist * same.float()).max(1).values
    hardest_neg = dist.masked_fill(~same, float("inf")).min(1).values   # among the same labels
    ```

    ```python
    dists = torch.cdist(query_emb, prototypes) ** 2
    logits = dists
    loss = F.cross_entropy(logits, query_labels)
    ```

    ## Use instead
    ```python
    hardest_neg = dist.masked_fill(same, float("inf")).min(1).values    # among the other labels
    ```
    ```python
    logits = -dists
    ```

    ## Stays silent on
    Batch-hard mining done right (with `masked_fill` or `torch.where`); a contrastive loss with
    either label convention applied consistently (y=1 similar or y=1 dissimilar); SupCon with
    self-pairs removed; NT-Xent with positives on a shifted diagonal and same-class negatives
    dropped (its mask combines two comparisons: labels of neither); a margin on same-label pairs
    already satisfied (no gradient); a distance regressed toward a label-made target (0 within
    a class, 1 across). Not seen: distances written by hand from broadcasts
    (`(z[:, None] - z[None]).norm(dim=-1)`), losses that compute their distance inside
    (`cosine_embedding_loss`, `triplet_margin_loss`), labels compared through a one-hot
    product, a center loss (no pair of samples), tensors on an accelerator (`--emulate-cuda`
    runs a GPU script's path on the CPU).
    """

    code = "GD266"
    slug = "pair-pull-reversed"
    severity = Severity.WARNING
    summary = ("a pairwise loss pushes same-label pairs apart or pulls different-label pairs "
               "together: its mask or label convention is reversed, or distances are given to "
               "cross_entropy as logits without their minus sign (a prototypical network)")
    fix = ("apply the same-label mask where the loss pulls pairs together and its complement "
           "where it pushes them apart (positives: `y[:, None] == y[None, :]` without the "
           "diagonal; negatives: `~same`)")

    def check(self, a):
        told: set = set()
        for event in a.of_kind("pair_pull"):
            loc = event.loc
            if loc is None or (loc.path, loc.line) in told:
                continue
            told.add((loc.path, loc.line))
            text = a.source.line_text(loc.path, loc.line).split("  #")[0].strip()
            shown = f"`{text}`" if text else "this line"
            fn = event["fn"]
            matrix = _WHAT.get(fn, "the similarities of the matrix product")
            how = event["how"]
            push = (f"{event['push_same']:.3g} per same-label pair against "
                    f"{event['push_diff']:.3g} per different-label pair")
            pull = (f"{event['pull_diff']:.3g} per different-label pair against "
                    f"{event['pull_same']:.3g} per same-label pair")
            moves = {
                "self": (f"pushes each sample away from itself (its distance to itself gets a "
                         f"gradient that asks it to grow: the 'negative' was picked among the "
                         f"sample's own label) and pushes no pair of different labels apart "
                         f"({push})"),
                "both": (f"pushes the pairs that share a label apart and pulls the pairs whose "
                         f"labels differ together, on net (push {push}; pull {pull})"),
                "push_same": (f"pushes only pairs that share a label apart, and no pair whose "
                              f"labels differ ({push})"),
                "pull_diff": (f"pulls only pairs whose labels differ together, and no pair that "
                              f"shares a label ({pull})"),
            }[how]
            rows = "x".join(str(n) for n in event["shape"])
            if event.get("classes"):
                yield self._classes(a, event, loc, matrix, push, pull)
                continue
            what = (f"the loss's gradient on {matrix} at line {event['matrix_line']} ({rows}, "
                    f"{event['same_pairs']} same-label pairs by the labels the script "
                    f"compared) {moves}, at every one of the first backwards: the mask or "
                    f"label convention at {shown} is reversed, so the embedding learns to "
                    f"spread each class and merge the others")
            yield self.finding(what, loc, evidence=_evidence(event), fix=self.fix)

    def _classes(self, a, event, loc, matrix, push, pull):
        """A cross_entropy whose class targets pick each row's own column: the logits made from
        the matrix with the wrong sign."""
        at, text = loc, a.source.line_text(loc.path, loc.line).split("  #")[0].strip()
        given = a.source.call_argument(loc.path, loc.line, "cross_entropy", 0, "input")
        if given is not None and given.isidentifier():
            found = a.source.term_assignment(loc.path, loc.line, given)
            if found is not None and event["matrix_line"] <= found[0] < loc.line:
                at, text = type(loc)(loc.path, found[0]), found[1]
        distance = event["distance"]
        kind = "distances" if distance else "similarities"
        wants = "small" if distance else "large"
        rows = "x".join(str(n) for n in event["shape"])
        what = (f"the cross_entropy at line {loc.line} reads {matrix} at line "
                f"{event['matrix_line']} ({rows}) as logits the wrong way round: its gradient "
                f"pushes each row away from the column its target names and pulls it toward the "
                f"other columns (push {push}; pull {pull}), at every one of the first backwards. "
                f"A softmax over {kind} gives the highest probability to the {'farthest' if distance else 'least similar'} "
                f"column, so each query learns to leave its own class's prototype (or positive); "
                f"the logits made at `{text}` need the {kind} with the sign that makes the "
                f"{wants} ones likely")
        made = _flipped(text)
        fix = (f"negate the distances before the softmax: `{made or 'logits = -dists'}` (a "
               f"temperature divides them, it does not flip them)" if distance else
               f"give the similarities to cross_entropy with their own sign"
               f"{f': `{made}`' if made else ''} (scaled by a positive temperature)")
        return self.finding(what, at, evidence=_evidence(event), fix=fix)


def _flipped(statement: str) -> str | None:
    """``logits = -(dists)`` for ``logits = dists``: the statement with its value's sign
    flipped (a leading minus taken off), or None when it is no plain assignment."""
    try:
        node = ast.parse(statement).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(node, ast.Assign) or len(node.targets) != 1:
        return None
    value = node.value
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub):
        flipped = ast.unparse(value.operand)
    elif isinstance(value, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
        flipped = "-" + ast.unparse(value)
    else:
        flipped = f"-({ast.unparse(value)})"
    return f"{ast.unparse(node.targets[0])} = {flipped}"


def _evidence(event) -> dict:
    return {k: event.get(k) for k in (
        "how", "fn", "distance", "shape", "same_pairs", "push_same", "push_diff",
        "pull_same", "pull_diff", "matrix_line", "classes")}
