from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_MIXING = ("SoftmaxBackward", "LogSoftmaxBackward")


def _sum_over_classes(text: str) -> str | None:
    """The division's text with its sum taken over the last axis (``q.sum(0, keepdim=True)``
    -> ``q.sum(-1, keepdim=True)``), keepdim added where it was missing so that each row is
    divided by its own sum; None when it cannot be rewritten."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "sum":
            changed = False
            for keyword in node.keywords:
                if keyword.arg == "dim" and isinstance(keyword.value, ast.Constant):
                    keyword.value, changed = ast.Constant(-1), True
            if not changed:
                for i, arg in enumerate(node.args):
                    if isinstance(arg, ast.Constant) and arg.value == 0:
                        node.args[i], changed = ast.Constant(-1), True
                        break
            if not changed:
                return None
            if not any(k.arg == "keepdim" for k in node.keywords):
                node.keywords.append(ast.keyword("keepdim", ast.Constant(True)))
            return ast.unparse(tree)
    return None


class SoftmaxOverBatch(Rule):
    """
    ## What it does
    Finds a softmax or log-softmax on the loss's path taken over dim 0 of a per-sample tensor:
    `torch.softmax(logits, dim=0)` (or a Gumbel-softmax sample, `F.gumbel_softmax(logits, tau,
    hard=True, dim=0)`) on (batch, classes) or (batch, classes, H, W) logits, then
    read sample by sample (a Dice or focal loss, a cross-entropy written by hand, a distillation
    term between softened outputs). Seen in the graph of the first backwards: the softmax's
    result has another axis longer than 1, is not a square (B, B) matrix, and its dim 0 is as
    long as the data or targets the graph read. Reported at the call with `dim=0` in the script.
    The same slip on a target made without gradient (a teacher's probabilities: DINO's
    `softmax((t - center) / temp, dim=0)`, a distillation target) is seen from its values at the
    first backwards: a target of probabilities (not only 0 and 1), multiplied with a
    `log_softmax` over the classes, whose rows do not sum to 1 along them. Where the script
    normalises that target by hand with a sum over dim 0 (a pseudo-label sharpened as
    `q = p ** (1 / T); q = q / q.sum(dim=0, keepdim=True)`, or `q /= q.sum(0)`) instead of a
    softmax, it points at that division (of a name the script multiplies with a log-probability).
    A hard pseudo-label made the same way is on no loss's graph (its classes and its confidence
    mask carry no gradient), so there the source shows it: a name assigned once to a softmax over
    dim 0 whose top class and probability the same function takes along the other axis
    (`p = torch.softmax(logits_u_w.detach(), dim=0)`, then `torch.max(p, dim=-1)`,
    `p.max(dim=1)`, `p.argmax(dim=1)`), in a script that trains; it points at the softmax.

    ## Why is this bad?
    Over dim 0 each class column sums to 1 across the samples: a sample's "probabilities" are
    no distribution over its classes, and they depend on what the other samples of the batch
    predict. The loss still falls, towards making each class confident in one sample of the
    batch; at inference, one image at a time, the same softmax gives 1 everywhere. Nothing
    fails and every shape agrees.

    ## Example
    ```python
    def soft_dice_loss(logits, target):          # logits: (N, C, H, W)
        probs = torch.softmax(logits, dim=0)
        onehot = F.one_hot(target, C).permute(0, 3, 1, 2).float()
        ...
    ```

    ## Use instead
    ```python
        probs = torch.softmax(logits, dim=1)      # over the classes of each pixel
    ```

    ## Stays silent on
    A softmax over the classes (dim 1 or -1); a (B, B) similarity matrix normalised over either
    axis (CLIP's symmetric loss, InfoNCE's columns); a softmax over the instances of one bag
    ((K, 1) attention weights of multiple-instance learning, a DataLoader batch of another size);
    a softmax over dim 0 of a sequence-first (T, B, ...) tensor whose axis 1 is the loss's batch
    (as long as its targets, or the class indices a hand-written cross-entropy gathers, dim 0
    not): attention pooling over the steps of an `nn.LSTM` without
    `batch_first`;
    weights over the batch of a 1-D tensor (hard-example weighting); a Gumbel-softmax over dim 0
    of a parameter (a concrete feature selector's (features, k) logits); a softmax on values without
    gradient (targets made under `no_grad`) unless the loss multiplies it with a log-softmax over
    the classes (DINO's `-q * log_softmax(s, dim=-1)`, a cross-entropy or `kl_div` with
    probability targets) and its rows do not sum to 1 over them; a soft target whose rows do sum
    to 1 (label smoothing, a teacher's softmax over the classes, mixup's mixed one-hots); a
    division by a sum over dim 0 that makes no such target (distribution alignment's
    `p / p.sum(0)` renormalised over the classes after, input features scaled by their column
    sums); a softmax over dim 0 inside the model's forward,
    which `samples-mixed-in-batch` reports, and one fed straight to `nll_loss`/`kl_div`, which
    `loss-input-mismatch` reports; balanced codes normalised over the batch and then over each
    row before their top class is taken (a Sinkhorn step: the name is reassigned), and one
    sample's vector of action probabilities whose top action is taken without a dim.
    """

    code = "GD185"
    slug = "softmax-over-batch"
    severity = Severity.WARNING
    summary = ("a softmax on the loss's path is taken over dim 0, the batch: each sample's class "
               "probabilities are normalised across the other samples")
    fix = "take the softmax over the classes (`dim=1` for (N, C, ...) logits, or `dim=-1`)"

    def check(self, a):
        events = list(a.by_kind.get("softmax_batch", ()))
        used: set = set()
        if events and not self._reported_elsewhere(a):
            yield from self._from_events(a, events, used)
        yield from self._pseudo_labels(a, used)

    def _pseudo_labels(self, a, used: set):
        """A softmax over dim 0 whose rows' top class (``max``/``argmax`` over the last axis) is
        taken as a pseudo-label and its confidence: made without gradient, it is on no loss's
        graph, so only the source shows it."""
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, text, name, read_line, read_text in _top_class_of_batch_softmax(a, path):
                if (path, line) in used:
                    continue
                used.add((path, line))
                fixed = text.replace("dim=0", "dim=-1") if "dim=0" in text else None
                yield self.finding(
                    f"`{text}` normalises over dim 0, the batch, while `{read_text}` (line "
                    f"{read_line}) takes each row's top class and its probability from `{name}`: "
                    f"the pseudo-labels and their confidences come from each class's share of "
                    f"the batch, not from each sample's distribution over its classes, so the "
                    f"unlabelled loss learns other samples' guesses and its confidence mask "
                    f"(below 1/batch for most rows) keeps almost nothing",
                    Location(path, line),
                    evidence={"name": name, "read_line": read_line, "pseudo_label": True},
                    fix=(f"`{fixed}`: normalise each row over its classes, the axis its top class "
                         f"is taken along" if fixed else
                         "normalise over the classes (`dim=-1`), the axis the top class is taken along"))

    def _from_events(self, a, events, used: set):
        for event in events:
            if event.loc is None:
                continue
            path = event.loc.path
            calls = [c for c in a.source.softmax_first_axis_calls(path) if (path, c[0]) not in used]
            if not calls and event.get("target"):
                # a target sharpened by hand and normalised by a sum: ``q / q.sum(0, keepdim=True)``
                divisions = [c for c in a.source.sum_normalised_first_axis(path)
                             if (path, c[0]) not in used]
                if divisions:
                    yield self._summed_target(event, path, *divisions[0])
                    used.add((path, divisions[0][0]))
                continue
            if not calls:
                continue
            line, text = calls[0]
            used.add((path, line))
            shape = "×".join(str(s) for s in event["shape"])
            if event.get("target"):
                fixed = text.replace("dim=0", "dim=-1") if "dim=0" in text else None
                yield self.finding(
                    f"`{text}` normalises the soft target over dim 0, the batch: the {shape} "
                    f"target the loss multiplies with the student's log_softmax over the classes "
                    f"is normalised down each class's column, not along each row, so every row's "
                    f"target is no distribution over its classes and depends on the other samples "
                    f"of the batch (a teacher's centred, sharpened output in DINO, a distillation "
                    f"target)",
                    Location(path, line),
                    evidence={"fn": event["fn"], "shape": event["shape"], "batch": event["batch"],
                              "target": True},
                    fix=(f"`{fixed}`: take it over the classes, as the student's log_softmax is"
                         if fixed else "give it the class dimension (`dim=-1`), as the student's "
                         "log_softmax"))
                continue
            dim, axis = _class_dim(event, text)
            fixed = text.replace("dim=0", f"dim={dim}") if "dim=0" in text else None
            yield self.finding(
                f"`{text}` normalises a {shape} tensor over dim 0, its {event['batch']} samples: "
                f"each class's values sum to 1 across the batch instead of each sample's across "
                f"its classes, so the {event['fn']} the loss reads for one sample depends on the "
                f"others and is no distribution over its classes",
                Location(path, line),
                evidence={"fn": event["fn"], "shape": event["shape"], "batch": event["batch"]},
                fix=(f"`{fixed}`: take it over the classes ({axis})" if fixed else
                     f"give it the class dimension (`dim={dim}`: {axis})"))

    def _summed_target(self, event, path: str, line: int, text: str):
        shape = "×".join(str(s) for s in event["shape"])
        fixed = _sum_over_classes(text)
        return self.finding(
            f"`{text}` normalises the soft target by its sum over dim 0, the batch: the {shape} "
            f"target the loss multiplies with the log_softmax over the classes sums to 1 down "
            f"each class's column, not along each row, so no row is a distribution over its "
            f"classes and each depends on what the other samples of the batch predict (a "
            f"sharpened pseudo-label, a teacher's target)",
            Location(path, line),
            evidence={"fn": "sum", "shape": event["shape"], "batch": event["batch"],
                      "target": True},
            fix=(f"`{fixed}`: normalise each row over its classes, as the log_softmax is"
                 if fixed else "normalise over the classes (`dim=-1`), as the log_softmax is"))

    @staticmethod
    def _reported_elsewhere(a) -> bool:
        """samples-mixed-in-batch names a softmax over the batch inside forward,
        loss-input-mismatch one given straight to a loss function, and attention-over-all-edges
        one over a graph's edges before a scatter."""
        if any(e.get("problem") in ("dim", "log-dim") for e in a.by_kind.get("loss_input", ())):
            return True
        if a.by_kind.get("softmax_over_edges"):
            return True
        return any(e.get("mixed") and str(e.get("op") or "").startswith(_MIXING)
                   for e in a.by_kind.get("dependency", ()))


_TOP = frozenset({"max", "argmax", "topk", "amax"})


def _literal_dim(call: ast.Call, position: int) -> int | None:
    value = next((k.value for k in call.keywords if k.arg == "dim"), None)
    if value is None and len(call.args) > position:
        value = call.args[position]
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub) \
            and isinstance(value.operand, ast.Constant):
        return -value.operand.value if isinstance(value.operand.value, int) else None
    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, int) else None


def _top_class_of_batch_softmax(a, path: str) -> list[tuple[int, str, str, int, str]]:
    """``(line, call text, name, read line, read text)`` for each ``name = softmax(..., dim=0)``
    of ``path`` (``name`` assigned once in its function) whose ``name`` the same function reads with
    ``max``/``argmax``/``topk`` over dim 1 or -1: a pseudo-label's top class and confidence."""
    tree = a.source.tree(path)
    calls = dict(a.source.softmax_first_axis_calls(path))
    if tree is None or not calls:
        return []
    found = []
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] + [tree]
    seen: set = set()
    for scope in scopes:
        for node in walk(scope):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name) and node.lineno in calls
                    and node.lineno not in seen):
                continue
            name = node.targets[0].id
            if not (isinstance(node.value, ast.Call) and ast.unparse(node.value) == calls[node.lineno]):
                continue  # the softmax itself assigned, not an expression of it (a log-prior plus scores)
            if sum(1 for n in walk(scope) if isinstance(n, (ast.Assign, ast.AugAssign))
                   and any(isinstance(t, ast.Name) and t.id == name
                           for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))) != 1:
                continue  # reassigned: the read may see another value
            for read in walk(scope):
                if not isinstance(read, ast.Call) or getattr(read, "lineno", 0) <= node.lineno:
                    continue
                func = read.func
                if not (isinstance(func, ast.Attribute) and func.attr in _TOP):
                    continue
                if isinstance(func.value, ast.Name) and func.value.id == name:
                    dim = _literal_dim(read, 1 if func.attr == "topk" else 0)
                elif isinstance(func.value, ast.Name) and func.value.id == "torch" and read.args \
                        and isinstance(read.args[0], ast.Name) and read.args[0].id == name:
                    dim = _literal_dim(read, 2 if func.attr == "topk" else 1)
                else:
                    continue
                if dim in (1, -1):
                    seen.add(node.lineno)
                    found.append((node.lineno, calls[node.lineno], name, read.lineno, ast.unparse(read)))
                    break
    return found


def _class_dim(event, text: str) -> tuple[int, str]:
    """The class axis of the normalised tensor, as the fix writes it, and why: the last one of
    a Gumbel-softmax (its categories, `F.gumbel_softmax`'s default) or of a (B, T, C) sequence,
    axis 1 of an (N, C) or (N, C, H, W) map."""
    shape = list(event.get("shape") or ())
    fn = str(event.get("fn") or "")
    if "gumbel" in fn or "gumbel" in text:
        return -1, "the categories, its last axis"
    if len(shape) == 3:
        return -1, ("the last axis of (batch, steps, classes) scores; `dim=1` if they are "
                    "(N, C, L)")
    if len(shape) >= 4:
        return 1, "axis 1 of (N, C, ...) scores"
    return 1, "axis 1 of (N, C) scores"
