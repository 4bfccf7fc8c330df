from __future__ import annotations

import ast
import re
import math

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule
from .model_end import model_end_line
from ..analysis.source import walk

_EXPECTS = {
    "cross_entropy": "logits (it applies log_softmax itself)",
    "binary_cross_entropy_with_logits": "logits (it applies sigmoid itself)",
    "nll_loss": "log-probabilities (log_softmax of the logits)",
    "kl_div": "log-probabilities as its input (log_softmax of the student's logits)",
    "ctc_loss": "log-probabilities over the classes (log_softmax(dim=-1) of its (T, N, C) scores)",
    "binary_cross_entropy": "probabilities (one sigmoid of the logits)",
}
_GIVEN = {
    "softmax": "the output of softmax (probabilities)",
    "sigmoid": "the output of sigmoid (values squashed into (0, 1))",
    "probabilities": "probabilities (every row lies in [0, 1] and sums to 1)",
    "logits": "raw scores (the rows are not log-normalised and no log op precedes them)",
    "relu": "the output of a ReLU (scores that cannot go below 0)",
    "clamp": "scores clamped with a floor of 0 or more (they cannot go below 0)",
    "sigmoid-twice": ("a sigmoid of values that a sigmoid or softmax had squashed already (the "
                      "model's last layer and the loss code each apply one)"),
}


def _ceiling(classes: int) -> str:
    """The best probability softmax can give one class when every score lies in [0, 1]."""
    best = math.e / (math.e + max(classes, 2) - 1)
    return f"{best:.0%}"


# the problems whose operation a model may apply as its last one: (its kind in model_end, over
# dim 0 only)
_AT_MODEL_END = {"softmax": ("softmax", False), "sigmoid": ("sigmoid", False),
                 "relu": ("relu", False), "dim": ("log_softmax", True)}


def _effect(fn: str, problem: str, classes: int) -> str:
    if problem == "sigmoid-twice":
        return ("sigmoid of a value in [0, 1] lies in [0.5, 0.73], so every predicted "
                "probability is at least 0.5: negatives can never be predicted, the loss never "
                "approaches zero, and the gradient is damped by both sigmoids' slopes")
    if problem == "relu" and fn == "cross_entropy":
        return ("a class can only be preferred by raising its score, never by lowering the others, "
                "and a score whose ReLU input turns negative gets no gradient at all: a sample "
                "whose right class falls there can never be learned")
    if problem == "relu":
        return ("sigmoid of a score ≥ 0 is ≥ 0.5: the predicted probability never drops below "
                "0.5, so negatives are never learned")
    if problem == "clamp" and fn == "cross_entropy":
        return ("a class can only be preferred by raising its score, and a score the clamp holds "
                "at a bound gets no gradient at all: the samples whose scores sit there are not "
                "learned")
    if problem == "clamp":
        return ("sigmoid of a score ≥ 0 is ≥ 0.5: the predicted probability never drops below "
                "0.5, so negatives are never learned, and a score the clamp holds at a bound "
                "gets no gradient at all")
    if fn == "cross_entropy":
        return (f"the scores it turns into probabilities all lie in [0, 1], so with {classes} "
                f"classes the right class can never get more than {_ceiling(classes)} "
                f"(e/(e+{max(classes, 2) - 1})): the loss cannot fall below "
                f"{-math.log(math.e / (math.e + max(classes, 2) - 1)):.2f} and its gradients "
                f"shrink as the {'softmax' if problem != 'sigmoid' else 'sigmoid'} saturates")
    if fn == "binary_cross_entropy_with_logits":
        return ("sigmoid runs twice: sigmoid of a value in (0, 1) lies in (0.5, 0.73), so the "
                "predicted probability never drops below 0.5 — negatives are never learned and "
                "the loss never approaches zero")
    if fn == "nll_loss" and problem == "logits":
        return ("it minimises -score[target] with nothing to bound it: the target's score is "
                "pushed up without limit instead of its probability towards 1")
    if fn == "nll_loss":
        return ("it minimises -p[target] instead of -log p[target]: a bounded loss whose "
                "gradient does not grow for badly wrong predictions, so training stalls")
    if fn == "kl_div" and problem == "logits":
        return ("the divergence is computed as target·(log target − input): with raw scores as "
                "input its gradient is −target whatever the student predicts, and the loss falls "
                "without bound as the scores grow, so the student is not pulled towards the "
                "target distribution")
    if fn == "ctc_loss":
        return ("it sums them along each alignment as if they were log-probabilities: the result "
                "is not the negative log-likelihood of the target sequence (it falls below zero), "
                "and as no probability can exceed 1 the loss saturates instead of pulling the "
                "target's alignments towards probability 1")
    return ("the divergence is computed as target·(log target − input): with probabilities as "
            "input its gradient is −target whatever the student predicts, so the student is not "
            "pulled towards the target distribution")


def _fix(fn: str, problem: str) -> str:
    if problem == "sigmoid-twice":
        return ("apply the sigmoid once: drop the one before the loss or the model's final "
                "nn.Sigmoid — or drop both and pass the logits to BCEWithLogitsLoss, which is "
                "numerically safer")
    if problem == "relu":
        return "drop the ReLU after the last layer: the loss takes raw scores (logits), negative ones included"
    if problem == "clamp":
        return ("drop the clamp, or clamp symmetrically for stability only (logits.clamp(-15, "
                "15)): the loss takes raw scores (logits), negative ones included")
    if fn == "cross_entropy" and problem == "probabilities":
        return ("pass the logits to cross_entropy, or use F.nll_loss(torch.log(probs)) where only "
                "probabilities exist")
    if fn == "cross_entropy":
        return (f"pass the logits: drop the {problem} before the loss (apply it only to read "
                f"predictions)")
    if fn == "binary_cross_entropy_with_logits":
        return ("drop the sigmoid before binary_cross_entropy_with_logits (BCEWithLogitsLoss), "
                "or keep it and use binary_cross_entropy (BCELoss)")
    if fn == "nll_loss" and problem == "logits":
        return "apply F.log_softmax(scores, dim=1) before nll_loss, or use F.cross_entropy on the scores"
    if fn == "nll_loss":
        return (f"use F.log_softmax instead of {problem} before nll_loss (or cross_entropy on the "
                f"logits)")
    if fn == "ctc_loss":
        return (f"use F.log_softmax(scores, dim=-1) instead of {problem} before ctc_loss "
                f"(nn.CTCLoss takes log-probabilities)")
    return ("give kl_div log-probabilities: F.kl_div(F.log_softmax(student_logits, dim=-1), "
            "target_probs, reduction='batchmean')")


class LossInputMismatch(Rule):
    """
    ## What it does
    Finds classification losses that a gradient flows through and that are given the wrong
    kind of score: `cross_entropy` (`nn.CrossEntropyLoss`) or
    `binary_cross_entropy_with_logits` (`nn.BCEWithLogitsLoss`) given the output of a softmax
    or sigmoid, `nll_loss` (`nn.NLLLoss`) given probabilities or raw scores, `kl_div`
    (`nn.KLDivLoss`) given probabilities or raw scores (a distillation's scaled logits) as its
    input, `ctc_loss` (`nn.CTCLoss`) given probabilities, `binary_cross_entropy`
    (`nn.BCELoss`) given a sigmoid of values already squashed by a sigmoid or softmax (a model
    ending in `nn.Sigmoid()` and a `torch.sigmoid` before the loss); also
    scores out of a ReLU, or clamped with a floor of 0 or more (`logits.clamp(0, 1)`), given to
    `cross_entropy` or `binary_cross_entropy_with_logits`, a `log_softmax`, or the log of a
    softmax (`torch.log(F.softmax(x, dim=0) + 1e-8)`, or of a clamped one), over another
    dimension than the classes (`dim=0`: the batch) given to `cross_entropy`, `nll_loss` or
    `ctc_loss` (whose classes are the last dimension of its (T, N, C) input),
    and swapped arguments (`criterion(labels, outputs)`: the labels taken as the scores and the
    model's output as the target, which torch differentiates), and (N, C) scores reshaped from a
    tensor whose dimensions their rows cut across (a (batch, classes, positions) output viewed as
    `(-1, C)`: each row holds one class's scores at C positions), and flattened scores whose
    token targets are flattened in the other order (a seq-first model's (T, B, C) output against
    batch-first (B, T) next-token targets: the targets are the embedded tokens only when read
    transposed). It points at the loss call, or at the statement that normalised the scores
    over the wrong dimension when one of its own computes the loss's input, or, when the
    softmax, sigmoid, ReLU or batch-axis `log_softmax` is the model's own last operation (the
    last element of its `nn.Sequential`, the `return` of its `forward`, or of the method whose
    result `forward` returns first, as a VAE's `decode`) and the file holds one
    such place, at that line, with the loss call as the related line. The
    operation behind the input is read from the autograd graph (past reshapes, slices, casts
    and clamps); where the graph does not tell, `cross_entropy` is reported when every row lies
    in [0, 1] and sums to 1, and `nll_loss` when its rows are not log-normalised and no log op
    comes before them. Losses computed without a gradient (validation metrics) are not judged,
    and `log_softmax` before `cross_entropy` is not reported: log_softmax of log-probabilities
    changes nothing. Targets outside the domain a loss reads them in (multi-hot rows, -1/+1
    labels to BCE, log-probabilities as `kl_div`'s target) are `target-outside-loss-domain`'s.

    ## Why is this bad?
    `cross_entropy` applies log_softmax itself. Given probabilities, every score lies in
    [0, 1]: with C classes the right class can never get more than e/(e+C−1) (23% for 10
    classes), the loss has a floor far above zero, and gradients shrink as the softmax
    saturates. A sigmoid before `binary_cross_entropy_with_logits` runs sigmoid twice, and so
    does a second sigmoid before `binary_cross_entropy`: the prediction never drops below 0.5. `nll_loss` on probabilities minimises −p instead of
    −log p; on raw scores it minimises −score[target], which has no lower bound. `kl_div` with
    probabilities as input gives a gradient that ignores the student's own prediction. The
    script runs, the loss goes down a little, the model trains badly.

    ## Example
    ```python
    model = nn.Sequential(nn.Linear(784, 10), nn.Softmax(dim=1))
    loss = nn.CrossEntropyLoss()(model(x), y)
    ```

    ## Use instead
    ```python
    model = nn.Sequential(nn.Linear(784, 10))           # logits
    loss = nn.CrossEntropyLoss()(model(x), y)
    probs = model(x).softmax(dim=1)                     # only to read predictions
    ```

    ## Stays silent on
    Logits to `cross_entropy` and `BCEWithLogitsLoss`, `log_softmax` to `nll_loss`, `kl_div`
    and `ctc_loss` (also taken over (N, T, C) and transposed), one sigmoid before
    `binary_cross_entropy` (also of a gated product of two sigmoids); soft targets (label smoothing, mixup, a teacher's softmax or
    sigmoid); REINFORCE's log-probabilities, a log
    of softmax probabilities over the classes with an epsilon or a clamp, Gumbel-softmax; sequence scores flattened or
    with `log_softmax` over the class dimension; scores flattened with the classes last
    (`movedim(1, -1).reshape(-1, C)`, (B, C, 1, 1) heads, K heads packed as (B, K * C) and split
    into (B * K, C) rows); `kl_div(log p, q)` with the model's
    distribution as the target (KL(q || p)); two model outputs distilling each other.
    """

    code = "GD212"
    slug = "loss-input-mismatch"
    severity = Severity.WARNING
    summary = ("a classification loss is given probabilities where it expects logits (softmax "
               "or sigmoid applied twice) or log-probabilities")
    fix = "pass the loss the kind of score it expects: logits to cross_entropy, log-probabilities to nll_loss and kl_div"

    def check(self, a):
        # the model's last op given to several loss calls (the training loss and an evaluation
        # loss under eval()) is one bug, told once at that line with each loss call beside it
        told: dict = {}
        pending: list = []
        for e in a.of_kind("loss_input"):
            message, fix, evidence = _describe(e.get("fn", "cross_entropy"), e.get("problem", "softmax"),
                                               int(e.get("classes") or 2), e.get("normalised"),
                                               e.get("source"))
            if e.get("problem") == "swapped" and e.loc is not None:
                call = _swapped_call(a.source.tree(e.loc.path), e.loc.line)
                if call is not None:
                    fix = f"pass the model's output first and the labels second: {call}"
            loc, related = e.loc, ()
            problem = e.get("problem")
            origin = None
            if problem in ("dim", "log-dim") and loc is not None:
                # normalised over the wrong axis in a statement of its own: the axis is what to
                # change (`log_probs = logits.log_softmax(dim=1)`), not the loss call
                origin = _input_origin(a, loc, e.get("fn", ""))
                if origin is not None and "softmax" in origin[1]:
                    loc = Location(loc.path, origin[0], loc.hook)
            elif e.get("problem") in ("sigmoid", "softmax", "sigmoid-twice", "clamp") and loc is not None:
                # the second sigmoid or softmax applied by the training step in a statement of
                # its own (`pred = torch.sigmoid(model(x))`, then `criterion(pred, y)`): that
                # statement is what to change, not the loss call
                origin = _input_origin(a, loc, e.get("fn", ""))
                if origin is not None and origin[0] != loc.line \
                        and re.search(r"\b(sigmoid|softmax|clamp|clamp_min|clip)\s*\(", origin[1]) \
                        and not origin[1].lstrip().startswith("return"):
                    loc = Location(loc.path, origin[0], loc.hook)
            if problem in _AT_MODEL_END and loc is e.loc and loc is not None:
                # the operation is the model's last one (`nn.Softmax(dim=1)` ending its
                # Sequential, `return torch.sigmoid(x)` in its forward): that line is the one to
                # change, when the loss's input is not computed beside the loss call
                kind, zero_dim = _AT_MODEL_END[problem]
                origin = origin or _input_origin(a, loc, e.get("fn", ""))
                if origin is None or kind.split("_")[-1] not in origin[1]:
                    line = model_end_line(a.source.tree(loc.path), kind, zero_dim)
                    if line is not None and line != loc.line:
                        related = (Related(loc, "the loss call that is given these scores"),)
                        loc = Location(loc.path, line)
            key = (loc.path, loc.line, problem, e.get("fn")) if loc is not None and loc is not e.loc else None
            if key is not None and key in told:
                told[key].extend(r for r in related if r not in told[key])
                continue
            both = list(related)
            if key is not None:
                told[key] = both
            pending.append((message, loc, both, a.next_step_number(e.seq), fix, evidence))
        for message, loc, related, step, fix, evidence in pending:
            yield self.finding(message, loc, related=tuple(related), step=step, fix=fix, evidence=evidence)


def _input_origin(a, loc, fn: str) -> tuple[int, str] | None:
    """(line, text) of the assignment that computed the loss's input, for the loss called as
    ``F.<fn>`` or through a module instance (``ctc = nn.CTCLoss()``, ``ctc(log_probs, ...)``)."""
    tree = a.source.tree(loc.path)
    names = [fn]
    if tree is not None:
        for node in walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args \
                    and node.lineno <= loc.line <= (node.end_lineno or node.lineno):
                names.append(node.func.id)
    for name in names:
        origin = a.source.argument_origin(loc.path, loc.line, name, "input")
        if origin is not None:
            return origin
    return None


def _swapped_call(tree, line: int) -> str | None:
    """The loss call on ``line`` with its two positional arguments swapped back
    (``criterion(y, model(x))`` -> ``criterion(model(x), y)``), or None when not one such call."""
    if tree is None:
        return None
    calls = [n for n in walk(tree) if isinstance(n, ast.Call) and n.lineno == line
             and len(n.args) == 2 and not any(isinstance(x, ast.Starred) for x in n.args)]
    outer = [c for c in calls if not any(c is not o and c in walk(o) for o in calls)]
    if len(outer) != 1:
        return None
    call = outer[0]
    swapped = ast.Call(func=call.func, args=[call.args[1], call.args[0]], keywords=call.keywords)
    return ast.unparse(swapped)


def _describe(fn: str, problem: str, classes: int, normalised,
              source=None) -> tuple[str, str, dict]:
    """(message, fix, evidence) of one wrong loss input."""
    evidence = {"function": fn, "given": problem, "classes": classes}
    if problem in ("dim", "log-dim"):
        evidence["normalised"] = normalised
        taken = "a log_softmax" if problem == "dim" else "the log of a softmax"
        return (f"{fn} is given {taken} taken over a dimension of size {normalised}, not over "
                f"the {classes} classes (dimension {'-1' if fn == 'ctc_loss' else '1'} of its "
                f"input): each class's scores are normalised across that other dimension (the "
                f"batch, for dim={1 if fn == 'ctc_loss' else 0}), so the "
                f"probabilities of one sample's classes do not sum to 1 and the loss trains "
                f"samples against each other",
                ("take log_softmax over the classes, the last dimension of ctc_loss's (T, N, C) "
                 "input: F.log_softmax(scores, dim=-1)") if fn == "ctc_loss" else
                ("take log_softmax over the class dimension: F.log_softmax(scores, dim=-1) "
                 "for (N, C) scores, dim=1 for (N, C, ...)") if problem == "dim" else
                ("normalise over the class dimension, in one stable step: "
                 "F.log_softmax(scores, dim=-1) for (N, C) scores, dim=1 for (N, C, ...), in "
                 "place of torch.log(F.softmax(scores, dim) + eps)"), evidence)
    if problem == "rows" and source:
        evidence["source"] = source
        shape = "(" + ", ".join(map(str, source)) + ")"
        return (f"{fn} is given (N, {classes}) scores reshaped from a {shape} tensor whose "
                f"dimensions their rows cut across: each row of {classes} consecutive values "
                f"mixes positions (for a (batch, classes, positions) output, one class's scores "
                f"at {classes} positions), so no row holds one position's class scores and the "
                f"model is trained to match labels with the wrong numbers",
                f"move the class dimension last before flattening: scores.movedim(1, -1)"
                f".reshape(-1, {classes}) (or pass the (N, C, T) scores to {fn} unflattened, "
                f"with (N, T) targets)", evidence)
    if problem == "order" and source:
        evidence["source"] = source
        s0, s1 = source[0], source[1]
        return (f"{fn}'s scores are flattened from a ({s0}, {s1}, {classes}) output, in ({s0}, "
                f"{s1}) order, but its targets are the input tokens flattened in ({s1}, {s0}) "
                f"order (a seq-first (T, B) model output against batch-first (B, T) targets, or "
                f"the reverse): each score row is paired with the label of another sample and "
                f"position, and the model learns nothing about its own sequence",
                f"flatten the targets in the scores' order: targets.t().reshape(-1) (or "
                f"transpose the scores to the targets' layout before reshaping)", evidence)
    if problem == "swapped":
        return (f"{fn}'s arguments are swapped: the input (first argument) needs no gradient and "
                f"the target (second) does — the labels are passed as the scores and the model's "
                f"output as the target, and torch differentiates the target, so the model is "
                f"trained towards a wrong objective without any error",
                f"pass the model's output first and the labels second: {fn}(output, target)",
                evidence)
    return (f"{fn} expects {_EXPECTS.get(fn, 'logits')} but is given {_GIVEN.get(problem, problem)}: "
            f"{_effect(fn, problem, classes)}", _fix(fn, problem), evidence)
