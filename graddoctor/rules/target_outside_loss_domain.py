from __future__ import annotations

import ast

from ..findings import Location, Severity
from ..events import SOFT_CE
from .base import Rule
from ..analysis.source import walk

# how each loss's target is documented, as the message states it
_DOMAIN = {
    "binary_cross_entropy_with_logits": "targets in [0, 1] (the probability of the positive class)",
    "binary_cross_entropy": "targets in [0, 1] (the probability of the positive class)",
    "multilabel_soft_margin_loss": "0/1 targets per class (values in [0, 1])",
    "soft_margin_loss": "targets of 1 or -1",
    "hinge_embedding_loss": "targets of 1 (similar) or -1 (dissimilar)",
    "cosine_embedding_loss": "targets of 1 (similar) or -1 (dissimilar)",
    "margin_ranking_loss": "targets of 1 (the first input should rank higher) or -1 (the second)",
    "cross_entropy": "float targets that are class probabilities (each row a distribution)",
    SOFT_CE: "soft targets that are class probabilities (each row a distribution)",
    "kl_div": "a target of probabilities (log-probabilities only with log_target=True)",
    "poisson_nll_loss": "count targets (>= 0)",
    "multilabel_margin_loss": "rows of class indices that end at the first -1",
    "ctc_loss": "label sequences of class indices other than the blank",
}
_NEGATIVES_LOST = {
    "soft_margin_loss": "a target of 0 makes its term log(1 + exp(-0 * x)) = log 2, a constant "
                        "with no gradient: the samples labelled 0 (the negatives) are never "
                        "learned, only the positives train",
    "margin_ranking_loss": "a target of 0 makes the pair's loss max(0, -0 * (x1 - x2) + margin) "
                           "= margin, a constant with no gradient: the pairs labelled 0 teach "
                           "nothing, and only the pairs whose first input wins are learned",
    "cosine_embedding_loss": "torch counts a pair only when its target is 1 or -1: the pairs "
                             "labelled 0 add nothing, so dissimilar pairs are never pushed apart",
    "hinge_embedding_loss": "a target other than 1 and -1 gets both terms, x + max(0, margin - x): "
                            "the pairs labelled 0 (the dissimilar ones) are pulled down to the "
                            "margin instead of pushed beyond it",
}
_SIGN_FIX = {
    "soft_margin_loss": "map the 0/1 labels to -1/+1 before the loss (y = 2 * y - 1), or keep "
                        "them and use binary_cross_entropy_with_logits (nn.BCEWithLogitsLoss), "
                        "which takes 0/1 labels",
    "margin_ranking_loss": "map the 0/1 labels to -1/+1 before the loss (y = 2 * y - 1: 1 where "
                           "the first input should rank higher, -1 where the second should)",
}


def _num(value) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "?"


def _span(e) -> str:
    return f"[{_num(e.get('low'))}, {_num(e.get('high'))}]"


def _share(e, outside: str = "") -> str:
    share = e.get("share")
    return f" ({share * 100:.3g} % of them{outside})" if isinstance(share, (int, float)) else ""


def _outside_unit(fn: str, e) -> tuple[str, str]:
    """(what the targets look like and what that trains, fix) for [0, 1] targets left."""
    low, high, whole = e.get("low") or 0.0, e.get("high") or 0.0, bool(e.get("integral"))
    unbounded = ("for a target t outside [0, 1], -t·log σ(x) - (1 - t)·log(1 - σ(x)) has no lower "
                 "bound, so those logits are pushed towards ±infinity instead of towards the "
                 "labels and the loss falls below 0")
    if fn == "binary_cross_entropy":
        unbounded = ("for a target t outside [0, 1], -t·log p - (1 - t)·log(1 - p) has no lower "
                     "bound, so those predictions are pushed towards 0 or 1 whatever the label")
    if whole and low >= 0 and high == 255:
        return (f"0/255 values, as a mask image stores them: {unbounded}",
                "divide the mask by 255 before the loss (mask.float() / 255), so that its "
                "values are 0 and 1")
    if whole and low >= -1 and high <= 1:
        return (f"-1/+1 labels (an SVM's convention): {unbounded}",
                "map the -1/+1 labels to 0/1 before the loss: (y + 1) / 2")
    if whole and low >= 0:
        return (f"whole numbers up to {_num(high)} (class indices given as float?): {unbounded}",
                "for one class out of several use cross_entropy on one logit per class with the "
                "indices as long targets (nn.CrossEntropyLoss); for several 0/1 labels per "
                "sample give each its own output and a 0/1 target (F.one_hot(y, C).float())")
    return (f"values that are no probabilities (raw scores or standardised values, such as a "
            f"teacher's logits): {unbounded}",
            "map the targets into [0, 1] before the loss: torch.sigmoid(teacher_logits) for a "
            "teacher's scores, or rescale them to [0, 1]")


def _percent(e) -> str:
    share = e.get("share")
    return f"{share * 100:.3g} %" if isinstance(share, (int, float)) else "some"


def _ctc(e) -> tuple[str, str]:
    """(message, fix) of a ``ctc_loss`` target outside its domain."""
    problem, classes, blank = e.get("problem"), e.get("classes"), e.get("blank")
    head = f"ctc_loss takes {_DOMAIN['ctc_loss']} but is given "
    if problem == "out-of-range" and e.get("detail") == "negative":
        return (head + f"labels in {_span(e)}{_share(e, ' outside [0, ' + _num(classes) + ')')}: "
                f"a negative label is padding read as a label (target_lengths count it), and "
                f"torch does not check it: its score is read from outside the log-probabilities",
                "give each row its real length in target_lengths (len(transcript), or "
                "(targets != pad).sum(1)), so that the padding past it is never read")
    if problem == "out-of-range":
        return (head + f"labels in {_span(e)}{_share(e, ' outside [0, ' + _num(classes) + ')')} "
                f"while its log_probs have {_num(classes)} classes: torch does not check the "
                f"labels, so a label past the classes reads a score outside them (memory that "
                f"belongs to something else) and no output ever learns it",
                f"give the output layer one class per label plus the blank (here at least "
                f"{_num(e.get('high'))} + 1 outputs, the blank included: the labels run up to "
                f"{_num(e.get('high'))}), or map the labels into [0, {_num(classes)}) without the "
                f"blank {_num(blank)}")
    if problem == "unalignable":
        return (head + f"sequences too long for their input_lengths ({_percent(e)} of a batch's "
                f"sequences: a CTC path needs one frame per label and one more between two equal "
                f"labels) with zero_infinity=True: their infinite loss is replaced by 0, so those "
                f"utterances are silently dropped from every update instead of trained",
                "compute input_lengths after the front-end's subsampling and keep enough frames "
                "for the labels (subsample less, or drop the too-long utterances in the data "
                "pipeline where it can be seen); zero_infinity only hides the sequences that "
                "do not fit")
    effect = (f"{_percent(e)} of the labels within target_lengths are the blank {_num(blank)}: "
              f"CTC aligns a blank label as 'nothing between symbols', so that symbol cannot be "
              f"told from silence, the model is trained to emit the blank for it and decoding, "
              f"which removes blanks, drops it from every transcript")
    if e.get("detail") == "padding":
        return (head + f"padded rows whose target_lengths are the padded width: {effect}; the "
                f"padding value is the blank, and the lengths count it",
                "give each row its real length in target_lengths (len(transcript), or "
                "(targets != pad).sum(1) before padding), not targets.size(1)")
    if blank == 0:
        fix = ("keep 0 for the blank and number the labels from 1 (enumerate(alphabet, start=1), "
               "ord(c) - ord('a') + 1), with one output per label plus one for the blank")
    elif classes is not None and blank == classes - 1:
        fix = ("give the model one more output for the blank (len(vocab) + 1 classes, "
               "blank=len(vocab)), so that no label shares its index")
    else:
        fix = f"pick a blank index that no label uses (blank={_num(blank)} is a label here)"
    return head + f"labels in {_span(e)}: {effect}", fix


def _masked(fn: str, e) -> tuple[str, str]:
    """(message, fix) of class-index targets that meet a masked score."""
    if e.get("problem") == "masked-target":
        return (f"{fn} is given class indices whose own score is masked out (-inf or a fill "
                f"such as -1e9){_share(e)}: the loss of those rows is infinite "
                f"or enormous, and its gradient only pushes the other classes down, never the "
                f"target up. The targets point at entries the script masked: in a contrastive "
                f"loss whose similarity matrix has its diagonal masked, a row's target is the "
                f"sample itself instead of its positive",
                "make each row's target the index of an entry that is not masked: for "
                "two views stacked as 2N rows, targets = torch.cat([torch.arange(n) + n, "
                "torch.arange(n)]); mask only what is never a target")
    return (f"{fn} is given label_smoothing and rows whose scores hold -inf{_share(e)}: "
            f"smoothing spreads a share of every target over all classes, the masked ones "
            f"included, so those rows' loss is infinite and the gradient is not the smoothed "
            f"objective",
            "mask with a large finite negative (scores.masked_fill(mask, -1e4)) or drop "
            "label_smoothing and smooth the targets over the unmasked classes by hand")


_POSITION_MASKS_SKIP = ("eye", "diag")


def _assigned_with(tree: ast.AST, name: str, word: str) -> bool:
    """Whether the file assigns ``name`` a value whose text holds ``word`` (``mask = torch.eye(n)``)."""
    return any(isinstance(n, ast.Assign) and any(ast.unparse(t) == name for t in n.targets)
               and word in ast.unparse(n.value) for n in walk(tree))


def _inverted_fill(a, e) -> tuple[int, str, str, str] | None:
    """``(line, statement, scores name, mask text)`` of the one ``masked_fill`` in the loss's
    file that assigns the scores a ``cross_entropy`` is given by name, when every target of
    the call points at an entry it filled: the positions kept and the positions filled are
    swapped (``start_logits.masked_fill(ctx_mask, -1e4)`` where ``ctx_mask`` is True on the
    context). A fill of a similarity matrix's diagonal (``eye``) is a contrastive loss's, whose
    targets are the ones to move; a share below all of them is targets that stray, not a mask."""
    loc = e.loc
    if e.get("problem") != "masked-target" or loc is None or (e.get("share") or 0) < 0.99:
        return None
    tree = a.source.tree(loc.path)
    if tree is None or (a.source.target_origin(loc.path, loc.line) or {}).get("made"):
        return None  # targets the script makes itself (torch.arange): the ones to move
    calls = [n for n in walk(tree) if isinstance(n, ast.Call) and n.lineno == loc.line
             and n.args and isinstance(n.args[0], ast.Name)]
    if len(calls) != 1:
        return None
    name = calls[0].args[0].id
    found = []
    for node in walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name:
            call = node.value
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "masked_fill_" \
                and isinstance(node.value.func.value, ast.Name) and node.value.func.value.id == name:
            call = node.value
        else:
            continue
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr in ("masked_fill", "masked_fill_") and call.args):
            continue
        mask = ast.unparse(call.args[0])
        if any(word in mask or _assigned_with(tree, mask, word) for word in _POSITION_MASKS_SKIP):
            return None
        lines = a.source.lines(loc.path)
        text = lines[node.lineno - 1].split("#")[0].strip() if node.lineno <= len(lines) else ""
        found.append((node.lineno, text or ast.unparse(node), name, mask))
    return found[0] if len(found) == 1 else None


def _inverted_message(e, fill) -> tuple[str, str]:
    line, text, name, mask = fill
    flipped = mask[1:].strip() if mask.startswith("~") else f"~{mask}"
    if flipped.startswith("(") and flipped.endswith(")") and not mask.startswith("~"):
        flipped = f"~{mask}"
    fn = e.get("fn", "cross_entropy")
    return (f"{fn} is given class indices whose own score is masked out{_share(e)}: every "
            f"target points at an entry that `{text}` filled, so the fill covers the positions "
            f"the targets live in and keeps the rest. `masked_fill` fills where its mask is "
            f"True: `{mask}` is True on the entries to keep (the context, the real tokens), "
            f"the other convention. The loss of every row is enormous and its gradient only "
            f"pushes the unmasked entries down",
            f"fill where the mask is False: `{name}.masked_fill({flipped}, ...)`")


def describe(e) -> tuple[str, str]:
    """(message, fix) of one ``target_domain`` event."""
    fn, problem = e.get("fn", "binary_cross_entropy_with_logits"), e.get("problem", "outside-unit")
    if fn == "ctc_loss":
        return _ctc(e)
    if problem in ("masked-target", "smoothing-masked"):
        return _masked(fn, e)
    head = f"{fn} takes {_DOMAIN.get(fn, 'targets in another domain')} but is given "
    if problem == "outside-unit":
        what, fix = _outside_unit(fn, e)
        return head + f"targets in {_span(e)}{_share(e, ' outside [0, 1]')}: " + what, fix
    if problem == "zero-one":
        effect = _NEGATIVES_LOST.get(fn, "a target of 0 is read as neither class")
        fix = _SIGN_FIX.get(fn, "map the 0/1 labels to -1/+1 before the loss (y = 2 * y - 1: 1 "
                                "for similar pairs, -1 for dissimilar ones)")
        return (head + f"targets in {_span(e)} with zeros{_share(e)} and nothing below 0 (0/1 "
                f"labels): {effect}", fix)
    if problem == "multi-label" and fn == "multilabel_margin_loss":
        return (head + "rows of 0s and 1s (multi-hot labels): it reads each row as a list of "
                "class indices up to the first -1, so every sample is trained towards classes 0 "
                "and 1 whatever its labels are",
                "give it the indices of each row's classes padded with -1 ([2, 5, -1, -1, ...]), "
                "or keep the 0/1 rows and use multilabel_soft_margin_loss / "
                "binary_cross_entropy_with_logits (nn.BCEWithLogitsLoss)")
    if problem == "multi-label":
        return (head + f"rows with several values above 0.5{_share(e)} (multi-label targets): it "
                f"treats each row as one distribution over the classes, so the classes of a "
                f"sample compete through the softmax and each present label is pushed towards "
                f"1/k, never towards 1",
                "for multi-label targets use binary_cross_entropy_with_logits "
                "(nn.BCEWithLogitsLoss) on the same logits")
    if problem == "unlabelled":
        column = e.get("detail") or "0"
        return (head + f"rows that carry no label{_share(e)}: they hold one same value in every "
                f"column, while every labelled row peaks at column {column} whatever its class "
                f"(a one-hot or smoothed target scattered along the batch axis, "
                f"t.scatter_(0, y[:, None], ...), writes each label into column {column} of the "
                f"row its class names), so those samples are trained towards a uniform guess "
                f"and the labelled ones all towards class {column}",
                "scatter along the class axis: t.scatter_(1, y.unsqueeze(1), 1.0 - eps) (or "
                "F.one_hot(y, num_classes), or cross_entropy(logits, y, label_smoothing=eps))")
    if problem == "over-summed":
        total = e.get("detail") or "more than 1"
        return (head + f"rows that sum to {total}{_share(e)} (not to 1): the loss "
                f"-Σ target·log_softmax(input) is lowest where the softmax equals target / "
                f"{total}, so the model is trained towards that flatter distribution and the "
                f"loss is scaled by {total} (label smoothing whose ε was not divided by the "
                f"number of classes, or a mixing weight left out of one term)",
                "build each row as a distribution: label smoothing as one_hot * (1 - eps) + eps "
                "/ num_classes (or pass label_smoothing=eps with class indices), mixed targets "
                "as lam * y_a + (1 - lam) * y_b")
    if problem == "negative" and fn == "poisson_nll_loss":
        return (head + f"targets in {_span(e)}{_share(e, ' below 0')} (standardised counts?): for a "
                f"target t < 0 the Poisson loss (exp(x) - t·x of a log-rate x) has no minimum, "
                f"so those predicted rates are pushed towards 0 and the loss falls without "
                f"bound",
                "give poisson_nll_loss the raw counts (standardise the inputs, not a count "
                "target), or use mse_loss / gaussian_nll_loss for a real-valued target")
    if problem == "negative":
        return (head + f"values in {_span(e)} (logits or log-probabilities as soft targets): it "
                f"computes -Σ target·log_softmax(input), and a negative target rewards pushing "
                f"that class's probability to 0 without bound, so the loss has no minimum and "
                f"the logits diverge",
                "turn the soft targets into probabilities first: F.softmax(teacher_logits / T, "
                "dim=1) (or .exp() of log-probabilities)")
    if problem == "log-target":
        return (head + f"a target in {_span(e)} (log-probabilities) with log_target=False: it is "
                f"read as probabilities, the loss is NaN (the log of a negative number) and its "
                f"gradient, -target, does not depend on the student's prediction, so the student "
                f"is not pulled towards the target distribution",
                "pass log_target=True (F.kl_div(log_p, log_q, log_target=True), "
                "nn.KLDivLoss(log_target=True)), or give the target as probabilities: "
                "F.softmax(...)")
    return (head + f"a target in {_span(e)} (probabilities) with log_target=True: it is read as "
            f"log-probabilities, the divergence computed is exp(target)·(target - input), not "
            f"KL to the target distribution, and the student is trained towards a wrong one",
            "drop log_target=True, or pass log-probabilities as the target: F.log_softmax(...)")


class TargetOutsideLossDomain(Rule):
    """
    ## What it does
    Finds a loss a gradient flows through whose target lies outside the domain the loss reads
    it in, on its first calls: `binary_cross_entropy_with_logits` (`nn.BCEWithLogitsLoss`),
    `binary_cross_entropy` and `multilabel_soft_margin_loss` given targets outside [0, 1]
    (masks of 0/255, -1/+1 labels, class indices as float, raw scores); `soft_margin_loss`,
    `margin_ranking_loss`, `cosine_embedding_loss` and `hinge_embedding_loss` given 0/1 labels
    where they read 1 and -1; `cross_entropy` given float targets whose rows hold several values
    above 0.5 (multi-label targets: no distribution does) or negative values, or rows of
    probabilities most of which sum above 1.05 (smoothing whose ε was not divided by the number
    of classes; also in a cross-entropy written by hand, `-(t * F.log_softmax(z, 1)).sum(1)`,
    reported where its targets are made), or rows that carry no label (one value in every
    column) beside labelled rows that all peak at one column (a one-hot or smoothed target
    scattered along the batch axis, `t.scatter_(0, y[:, None], 1)`, reported at that
    `scatter_`; by hand too); `cross_entropy` given class indices whose own score
    is masked out (-inf, or a usual fill constant such as -1e9: a target on the masked diagonal,
    reported where the targets are made; every target on a position a `masked_fill` of those
    scores filled, a mask in the other convention, reported at that fill:
    `scores.masked_fill(sent_mask, -1e9)` where `sent_mask` is True on the real sentences), or `label_smoothing` over rows holding -inf;
    `multilabel_margin_loss` given 0/1 rows where it reads class indices padded with -1;
    `kl_div` given log-probabilities as its target without `log_target=True` (or probabilities
    with it); `poisson_nll_loss` given negative counts; `ctc_loss` (`nn.CTCLoss`) given label
    sequences that hold the blank or a label past the classes of its log-probabilities within
    `target_lengths` (an alphabet numbered from 0 beside the default `blank=0`, `blank` set to a
    letter's index, lengths that count the padding), or, with `zero_infinity=True`, a quarter or
    more of a batch's sequences too long for their `input_lengths`. It points at the loss call,
    and its fix fits what the targets look like (divide a mask by 255, map labels with
    `2 * y - 1` or `(y + 1) / 2`, use `BCEWithLogitsLoss` for multi-label targets, pass
    `log_target=True`, number the labels from 1, give each row its real length).

    ## Why is this bad?
    torch checks a target's shape and, for class indices, their range, but not the domain of a
    float target: the loss's formula is evaluated on whatever it gets. A BCE target of 255 makes
    the loss unbounded below, and those logits run away; a 0 label gives `SoftMarginLoss` a
    constant log 2 with no gradient (the negatives are never learned) and
    `MarginRankingLoss` a constant margin; `CosineEmbeddingLoss` skips pairs labelled 0;
    multi-hot rows make the labels of one sample compete through the softmax;
    log-probabilities read as probabilities make `kl_div`'s gradient ignore the student. CTC
    aligns a blank label as "nothing", so that character is trained towards the blank and
    decoding drops it everywhere; a label at or past the class count reads a score torch never
    checked; `zero_infinity` turns a sequence that cannot align into a loss of 0, so a wrong
    `input_lengths` silently drops those utterances. The run does not fail and the loss still
    moves; every update trains something else.

    ## Example
    ```python
    mask = read_png(path)                                 # 0 / 255
    loss = nn.BCEWithLogitsLoss()(model(image), mask.float())
    y = (score_a > score_b).float()                       # 0 / 1
    loss = nn.MarginRankingLoss(margin=0.5)(model(a), model(b), y)
    ```

    ## Use instead
    ```python
    loss = nn.BCEWithLogitsLoss()(model(image), mask.float() / 255)
    loss = nn.MarginRankingLoss(margin=0.5)(model(a), model(b), 2 * y - 1)
    ```

    ## Stays silent on
    Smoothed labels (0.05/0.95) and soft probabilities (a teacher's sigmoid) for the binary
    losses; a teacher's softmax, mixup and label-smoothed rows for `cross_entropy` (each row
    still sums to 1, one value above 0.5 at most), rows weighted below 1 by a confidence, word
    counts as a multinomial target; class-index targets and their `ignore_index`, masks that
    never hide a target (the diagonal of `z @ z.T` with each row's other view as its target), a
    finite fill with `label_smoothing`; by hand, SupCon's multi-hot positives and a policy
    gradient's signed returns beside `log_softmax`; uniform 1/C rows beside one-hot ones (outlier
    exposure) and zero rows of masked samples beside labels of several classes; -1/+1 labels for the margin losses, and `torch.sign` of a score difference
    whose ties give 0 (the -1s show the convention); `kl_div` with `log_target=True` and
    log-probabilities, or probabilities without it; counts for `poisson_nll_loss`;
    `multilabel_margin_loss` index rows padded with -1; placeholder targets a script masks out
    afterwards (`reduction="none"`, or a per-element `weight` for the binary losses); losses
    computed without a gradient (an evaluation metric on raw masks). For `ctc_loss`: (N, S)
    targets padded with the blank's 0 or with -1 past each length (never read); the blank as the
    last class after every label; unbatched calls; a few sequences too long for their frames
    under `zero_infinity=True` (an outlier it is meant for), or any without it (the loss is
    infinite: nonfinite-grad's).
    """

    code = "GD152"
    slug = "target-outside-loss-domain"
    severity = Severity.WARNING
    summary = ("a loss is given a target outside the domain it reads (0/255 masks or -1/+1 "
               "labels to BCE, 0/1 labels to a margin loss, multi-hot rows to cross_entropy, "
               "log-probabilities to kl_div, the blank as a CTC label): it trains the wrong "
               "thing without any error")
    fix = "give the loss its target in the domain it documents"

    def check(self, a):
        # a pairwise-similarity loss labelled on its masked diagonal: contrastive-positive-
        # misplaced names the positive it should point at
        paired = {e.loc for e in a.of_kind("pair_labels")}
        told = set()
        for e in a.of_kind("target_domain"):
            if e.get("problem") == "masked-target" and e.loc in paired:
                continue
            fill = _inverted_fill(a, e)
            where = Location(e.loc.path, fill[0]) if fill else self._location(a, e)
            # torch's soft-target cross_entropy is the hand-written product inside: the call's
            # wrapper and the graph reader can tell the same targets
            if (where, e.get("problem")) in told:
                continue
            told.add((where, e.get("problem")))
            message, fix = describe(e)
            if fill is not None:
                message, fix = _inverted_message(e, fill)
            evidence = {"function": e.get("fn"), "given": e.get("problem"),
                        "targets": [e.get("low"), e.get("high")]}
            if e.get("share") is not None:
                evidence["share"] = e.get("share")
            yield self.finding(message, where, step=a.next_step_number(e.seq),
                               fix=fix, evidence=evidence)

    @staticmethod
    def _location(a, e):
        """Class indices that point at masked entries are fixed where the script builds them
        (``targets = torch.arange(2 * n)``), not at the loss call."""
        loc = e.loc
        if loc is not None and e.get("problem") == "unlabelled":
            scatter = a.source.batch_axis_scatter(loc.path)
            if scatter is not None:
                return Location(loc.path, scatter[0])
        if loc is not None and e.get("fn") == SOFT_CE:
            made = a.source.soft_target_origin(loc.path, loc.line)
            return Location(loc.path, made[0]) if made else loc
        if e.get("problem") != "masked-target" or loc is None:
            return loc
        made = a.source.target_made(loc.path, loc.line)
        return Location(loc.path, made[0]) if made else loc
