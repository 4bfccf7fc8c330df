from __future__ import annotations

import ast
import re
from dataclasses import replace

from ..analysis.source import shared_if
from ..findings import Severity
from .accumulation_term_undivided import inside_accumulate
from .base import Rule, related
from .ddp_average_redone import ddp_world
from .lr_applied_twice import loss_factor_is_lr
from .unscaled_accumulation import SCALE_INVARIANT
from ..analysis.source import walk

MIN_STEPS = 3  # windows seen before "every update" is claimed
TOLERANCE = 1e-3  # how close 1 / factor must be to a whole number


def divisor(factor) -> int | None:
    """k when ``factor`` is 1/k for a whole k >= 2 (``loss / 4`` -> 4), else None."""
    if not isinstance(factor, (int, float)) or not 0 < factor < 1:
        return None
    inverse = 1.0 / factor
    k = round(inverse)
    return k if k >= 2 and abs(inverse - k) <= TOLERANCE * k else None


class AccumulationNeverAccumulates(Rule):
    """
    ## What it does
    Finds a loss divided by a constant k (read from the autograd graph: `loss / k`,
    `loss * (1 / k)`) while every optimizer step applies exactly one `backward()`: the
    accumulation the division was written for never happens (a step counter that is never
    incremented, `if step % k == 0` on a counter stuck at 0, an accumulation setting the loop
    ignores).

    The finding is `info`: a loss multiplied by a constant weight (`0.1 * loss` through a
    variable) looks exactly the same in the trace. It is left out entirely when the loss is
    assigned as a number written out times the loss (`g_loss = 0.5 * F.mse_loss(...)`: a
    weight, as LSGAN's and the VAE's; also returned so by a loss function of the script's own,
    a Gaussian NLL's `return 0.5 * (...)`, whole or as the element of a returned tuple that the
    loop unpacks into the backpropagated name, FairMOT's `loss, det_loss, id_loss =
    criterion(...)`), as a quotient by a written-out 2 (`... .mean() / 2`:
    Hadsell's contrastive loss, `||e||^2 / 2`) or as a sum with such a weighted term (`-reward -
    0.01 * entropy`, where only the weighted term carries a gradient), when the division is a mean
    (a `reduction="sum"` loss or `.sum()` divided by the batch size, `kl_div(...,
    reduction="batchmean")`) or an average of k losses (`(loss_a + loss_b) / 2`).

    ## Why is this bad?
    Each micro-batch is stepped with 1/k of its gradient: with SGD the learning rate is k times
    smaller than configured, and the effective batch is one micro-batch, not k. Adam-like
    optimizers mostly cancel the constant, but the update is still k times noisier than the
    accumulation was meant to make it.

    ## Example
    ```python
    micro = 0
    for x, y in loader:
        loss = loss_fn(model(x), y) / accum_steps
        loss.backward()
        if micro % accum_steps == 0:      # `micro` is never incremented
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    micro = 0
    for x, y in loader:
        loss = loss_fn(model(x), y) / accum_steps
        loss.backward()
        micro += 1
        if micro % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Stays silent on
    Accumulation windows on a counter or with the tail flushed; `loss * (1 / k)`; an average
    of two losses (`(loss_i + loss_t) / 2`); a convex mix of two losses whose weight is 1/2
    (`base * (1 - alpha) + distill * alpha`, also returned by a loss module of the script's own,
    as DeiT's `DistillationLoss`); constants that normalise rather than accumulate
    (a summed loss divided by the batch size); FSDP's accumulation; a loss divided by the
    world size in data parallelism by hand (the gradients all-reduced with SUM make the mean).

    Under accelerate, a loss divided by `accelerator.backward` (its
    `gradient_accumulation_steps`) while the script steps the raw optimizer, never given to
    `accelerator.prepare()` (or not the object it returned), is no loss weight: that is a
    `warning` at the `prepare` call, with that fix. Nor is one divided by
    `Accelerator(gradient_accumulation_steps=k)` while `accelerator.backward` runs outside any
    `with accelerator.accumulate(model):` block (so the wrapped optimizer steps every
    micro-batch): a `warning` at the backward, with the `accumulate()` fix. Nor is one whose
    `backward()` runs under the same `if` as the step (`if (i + 1) % k == 0: loss.backward();
    optimizer.step()`): the other micro-batches' losses are computed and never backpropagated,
    a `warning` at the backward whose fix moves it before the `if`.
    """

    code = "GD209"
    slug = "accumulation-never-accumulates"
    severity = Severity.INFO
    summary = "the loss is divided by k for accumulation, but every step applies a single backward"
    fix = ("advance the accumulation counter (`micro += 1`) so the step runs every k "
           "micro-batches, or drop the division by k")

    def check(self, a):
        edits = a.of_kind("grad_edit")
        for opt, windows in a.windows.items():
            if a.count(w.step for w in windows) < MIN_STEPS:
                continue
            if any(w.k != 1 or len(w.backwards) != 1 for w in windows):
                continue  # some step does accumulate (or sums two losses)
            backwards = [w.backwards[0] for w in windows]
            factors = {b.get("loss_scale_factor") for b in backwards}
            if len(factors) != 1:
                continue  # no factor, or one that changes: not a fixed accumulation constant
            factor = next(iter(factors))
            k = divisor(factor)
            if k is None:
                continue
            terms = [b.get("loss_terms") for b in backwards]
            if any(t and "sum" in t for t in terms):
                continue  # a summed loss divided by a constant: a mean, not accumulation
            if any(t and len(t) == k for t in terms):
                continue  # (l1 + ... + lk) / k: the average of k losses
            if any(e["opt"] == opt for e in edits):
                continue  # gradients rescaled by hand before some step
            if any(e.get("world") == k for e in a.of_kind("grad_allreduce")):
                continue  # data parallelism by hand: the loss / world size averages the summed grads
            if k == ddp_world(a) and all(b.get("allreduce") for b in backwards):
                continue  # the loss / world size of a DDP model: ddp-average-redone's
            if loss_factor_is_lr(a, opt, windows):
                continue  # (loss * lr).backward(): the lr applied twice, lr-applied-twice's
            if any(d.later_step is not None and d.later_step["opt"] == opt for d in a.ledger.discards):
                continue  # the other micro-batches were discarded: misplaced-zero-grad's finding
            if not _unprepared(windows) and _weighted_by_literal(a, backwards[0], factor):
                continue  # `loss = 0.5 * mse(...)`: a loss weight written out, no accumulation count
            yield self._finding(a, opt, windows, factor, k)

    def _finding(self, a, opt, windows, factor, k):
        w = windows[0]
        backward = w.backwards[0]
        name = a.optimizer_name(opt)
        cls = a.optimizer_class(opt)
        if _unprepared(windows):
            return self._unprepared(a, opt, windows, k, name)
        if _accelerate_divides_outside_accumulate(a, backward, k):
            return self._outside_accumulate(a, opt, windows, k, name)
        if cls in SCALE_INVARIANT:
            effect = (f"{cls} largely cancels the 1/{k}, but each update sees one micro-batch, "
                      f"not the {k} the division was written for")
        else:
            effect = (f"each micro-batch is stepped with 1/{k} of its gradient (with {cls or 'SGD'}"
                      f" a {k}x smaller learning rate) and the batch is never enlarged")
        step_loc = w.step.loc
        gate = (shared_if(a.source.tree(backward.loc.path), backward.loc.line, step_loc.line)
                if backward.loc is not None and step_loc is not None
                and step_loc.path == backward.loc.path else None)
        if gate is not None:
            # backward() under the step's own `if`: the other micro-batches' losses are made and
            # thrown away, so dropping the division would not help
            return self.finding(
                f"this loss is multiplied by {factor:g} (1/{k}), as for accumulating {k} "
                f"micro-batches, but backward() runs under the same `if` (line {gate}) as the "
                f"step: each of the {a.count(x.step for x in windows)} {name} steps applies the "
                f"gradient of one micro-batch, divided by {k}, and the losses of the other "
                f"micro-batches are computed and never backpropagated",
                backward.loc, step=w.index, severity=Severity.WARNING,
                related=(related(w.step, "the step under the same `if`"),),
                evidence={"k": k, "loss_scale_factor": factor, "optimizer": opt,
                          "optimizer_class": cls, "gate": gate,
                          "steps": a.count(x.step for x in windows)},
                fix=(f"call backward() for every micro-batch, before the `if` of line {gate}; "
                     f"keep only step() and zero_grad() inside it"))
        message = (f"this loss is multiplied by {factor:g} (1/{k}), as for accumulating {k} "
                   f"micro-batches, yet each of the {a.count(w.step for w in windows)} {name} steps applies a single "
                   f"backward(): if {k} is your accumulation count, the step runs after every "
                   f"micro-batch, not once per {k} (a counter that never advances, a step "
                   f"outside its `if`): {effect}; if {factor:g} is a loss weight (0.5 * MSE), "
                   f"ignore this")
        return self.finding(
            message, backward.loc, step=w.index,
            related=(related(w.step, "the step that follows every single backward"),),
            evidence={"k": k, "loss_scale_factor": factor, "optimizer": opt,
                      "optimizer_class": cls, "steps": a.count(w.step for w in windows)},
        )

    def _outside_accumulate(self, a, opt, windows, k, name):
        """accelerate divided the loss (``Accelerator(gradient_accumulation_steps=k)``), but no
        ``with accelerator.accumulate(model):`` block holds the wrapped optimizer back, so it
        steps after every micro-batch: the division is no loss weight the script wrote."""
        w = windows[0]
        backward = w.backwards[0]
        n = a.count(x.step for x in windows)
        cls = a.optimizer_class(opt)
        effect = (f"{cls} largely cancels the 1/{k}, but no update sees more than one micro-batch"
                  if cls in SCALE_INVARIANT else
                  f"with {cls or 'SGD'} the learning rate is in effect {k} times smaller")
        return self.finding(
            f"accelerator.backward divides this loss by gradient_accumulation_steps ({k}), but "
            f"it runs outside `with accelerator.accumulate(model):`, which is what holds the "
            f"optimizer's step back until the window's last micro-batch: each of the {n} {name} "
            f"steps applies a single micro-batch with 1/{k} of its gradient, and nothing "
            f"accumulates ({effect})",
            backward.loc, step=w.index, severity=Severity.WARNING,
            related=(related(w.step, "the step that runs after every micro-batch"),),
            fix=("put the forward, accelerator.backward, optimizer.step() and zero_grad() inside "
                 "`with accelerator.accumulate(model):`, or drop gradient_accumulation_steps from "
                 "Accelerator(...) if every batch is meant to step"),
            evidence={"k": k, "optimizer": opt, "steps": n, "cause": "outside_accumulate"},
        )

    def _unprepared(self, a, opt, windows, k, name):
        """accelerate divided the loss (``accelerator.backward`` under
        ``gradient_accumulation_steps=k``) but the script steps the optimizer itself, not the
        wrapper ``accelerator.prepare`` returns: no accumulation can be the intent of that."""
        w = windows[0]
        backward = w.backwards[0]
        where = w.step.loc or backward.loc
        prepares = [line for line, _text, _fwd in a.source.calls_named(where.path, ("prepare",))] \
            if where is not None else []
        loc = replace(where, line=prepares[0], function="", via="", hook="") \
            if len(prepares) == 1 else w.step.loc
        n = a.count(x.step for x in windows)
        return self.finding(
            f"accelerator.backward divides the loss by gradient_accumulation_steps ({k}), but "
            f"this {name} is stepped directly, not through the optimizer accelerator.prepare() "
            f"returns: the accumulate() window never holds it back, so each of its {n} steps "
            f"applies a single micro-batch with 1/{k} of its gradient: nothing accumulates "
            f"(with SGD the learning rate is in effect {k} times smaller)",
            loc, step=w.index, severity=Severity.WARNING,
            related=tuple(r for r in (related(backward, "accelerator.backward, which divides by k"),
                                      related(w.step, "the step that runs after every micro-batch"))
                          if r is not None),
            fix=("pass the optimizer to accelerator.prepare() and step the object it returns "
                 "(`model, optimizer, loader = accelerator.prepare(model, optimizer, loader)`); "
                 "the same for a scheduler"),
            evidence={"k": k, "optimizer": opt, "steps": n, "cause": "optimizer_not_prepared"},
        )


def _weighted_by_literal(a, backward, factor: float) -> bool:
    """The backpropagated loss is assigned as a number written out times the loss (``g_loss =
    0.5 * F.mse_loss(...)``, ``loss = criterion(out, y) * 0.5``), or as a sum one of whose terms
    is that number times something (``-reward - 0.01 * entropy``), or a quotient by a written-out 2:
    a loss weight, as LSGAN's and the VAE's ``0.5`` are; an accumulation count is a name
    (``loss / accum_steps``)."""
    loc = backward.loc
    if loc is None:
        return False
    assigned = a.source.loss_assignment(loc.path, loc.line)
    # a tuple unpacked into the loss after that assignment is the later one (a loss module's
    # forward that assigns its own `loss` is above the loop's `loss, stats = criterion(...)`)
    unpacked = _unpacking_assignment(a, loc)
    statement = None
    if unpacked is not None and (assigned is None or unpacked.lineno > assigned[0]):
        statement = unpacked
    elif assigned is not None:
        try:
            statement = ast.parse(assigned[1].strip()).body[0]
        except (SyntaxError, IndexError):
            return False
    if statement is None:
        return False
    value = getattr(statement, "value", None)
    if _literal_weighted(value, factor) or _complementary_weights(value):
        return True
    # a loss function of the script's own that returns the weighted value (`return 0.5 *
    # (logvar + (y - mu) ** 2 * torch.exp(-logvar)).mean()`, a Gaussian NLL's 1/2), or a loss
    # module of its own whose forward does (`criterion = DistillationLoss(...)`, returning
    # `base * (1 - self.alpha) + distill * self.alpha`)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        tree = a.source.tree(loc.path)
        defined = _called_function(tree, value.func.id) if tree is not None else None
        returns = [n for n in walk(defined) if isinstance(n, ast.Return)
                   and n.value is not None] if defined is not None else []
        if len(returns) != 1:
            return False
        returned = _unpacked(statement, returns[0].value, a.source.line_text(loc.path, loc.line))
        return returned is not None and (_literal_weighted(returned, factor)
                                         or _complementary_weights(returned))
    return False


def _unpacking_assignment(a, loc):
    """The last statement above the backward's line that unpacks a call's tuple into the
    backpropagated name (``loss, det, ident = criterion(...)`` before ``loss.backward()``)."""
    match = re.search(r"(\w+)\s*\.\s*backward\s*\(", a.source.line_text(loc.path, loc.line))
    tree = a.source.tree(loc.path)
    if match is None or tree is None:
        return None
    name, best = match.group(1), None
    for node in walk(tree):
        if isinstance(node, ast.Assign) and node.lineno < loc.line and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Call) \
                and any(isinstance(t, ast.Name) and t.id == name for t in node.targets[0].elts) \
                and (best is None or node.lineno > best.lineno):
            best = node
    return best


def _unpacked(statement, returned, backward_text: str):
    """The part of a loss function's return value the backpropagated name receives: the whole
    value, or, for ``loss, det, ident = criterion(...)`` unpacking a returned tuple (a loss
    module returning its total and the terms it logs), the element at the backpropagated
    name's position."""
    targets = getattr(statement, "targets", None) or []
    if len(targets) != 1 or not isinstance(targets[0], ast.Tuple):
        return returned
    if not isinstance(returned, ast.Tuple) or len(returned.elts) != len(targets[0].elts):
        return None
    for target, value in zip(targets[0].elts, returned.elts):
        if isinstance(target, ast.Name) and f"{target.id}.backward" in backward_text.replace(" ", ""):
            return value
    return None


def _called_function(tree, name: str):
    """The one function ``name(...)`` runs: a function of that name, or the ``forward`` of the
    script's class whose instance the name is assigned once (``criterion = KDLoss(...)``)."""
    defined = [n for n in walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    if defined:
        return defined[0] if len(defined) == 1 else None
    made = [n.value.func.id for n in walk(tree) if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)
            and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)]
    if len(made) != 1:
        return None
    classes = [n for n in walk(tree) if isinstance(n, ast.ClassDef) and n.name == made[0]]
    forwards = [n for n in classes[0].body if isinstance(n, ast.FunctionDef)
                and n.name == "forward"] if len(classes) == 1 else []
    return forwards[0] if len(forwards) == 1 else None


def _complementary_weights(value) -> bool:
    """Whether an expression is a convex mix of two terms, ``a * w + b * (1 - w)`` (a
    distillation loss's ``alpha``, a weighting of two objectives): with ``w = 0.5`` both terms
    carry the factor 1/2, which is the mix's weight, not an accumulation count."""
    if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)):
        return False
    weights = []
    for term in (value.left, value.right):
        if not (isinstance(term, ast.BinOp) and isinstance(term.op, ast.Mult)):
            return False
        weights.append({ast.unparse(term.left), ast.unparse(term.right)})

    def complements(first, second) -> bool:
        return any(f"1 - {w}" in second or f"1.0 - {w}" in second or f"(1 - {w})" in second
                   for w in first)
    return complements(weights[0], weights[1]) or complements(weights[1], weights[0])


def _literal_weighted(value, factor: float) -> bool:
    """Whether an expression is a number written out times the loss, a sum with such a term, or a
    quotient by a written-out 2."""
    # the whole value, or one term of its top-level sum: `-reward - 0.01 * entropy` whose only
    # term with a gradient is the weighted one (an entropy bonus, an auxiliary loss) reads 0.01
    terms, stack = [], [value]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            stack += [node.left, node.right]
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            stack.append(node.operand)
        else:
            terms.append(node)
    return any(isinstance(term, ast.BinOp) and isinstance(term.op, ast.Mult)
               and any(isinstance(side, ast.Constant) and type(side.value) in (int, float)
                       and abs(abs(side.value) - factor) <= TOLERANCE * factor
                       for side in (term.left, term.right))
               or _halved(term, factor)
               for term in terms)


def _halved(term, factor: float) -> bool:
    """``... / 2`` written out: the 1/2 of a convention (Hadsell's contrastive loss, ``||e||^2 / 2``),
    not an accumulation count, which is a name or a larger number."""
    return (isinstance(term, ast.BinOp) and isinstance(term.op, ast.Div)
            and isinstance(term.right, ast.Constant) and type(term.right.value) in (int, float)
            and term.right.value == 2 and abs(factor - 0.5) <= TOLERANCE)


def _unprepared(windows) -> bool:
    """Every backward went through accelerate (which divided the loss) and every step was the
    script's own call of the optimizer (no accelerate frame: not ``AcceleratedOptimizer``)."""
    return all(w.backwards[0].loc is not None and w.backwards[0].loc.via == "accelerate"
               and w.step.loc is not None and w.step.loc.via != "accelerate" for w in windows)


def _accelerate_divides_outside_accumulate(a, backward, k: int) -> bool:
    """The backward went through accelerator.backward, the script builds its Accelerator with
    gradient_accumulation_steps=k (a name counts: its value is not in the source), and the call
    sits outside every ``with ....accumulate(...)`` block: the 1/k is accelerate's."""
    loc = backward.loc
    if loc is None or loc.via != "accelerate":
        return False
    tree = a.source.tree(loc.path)
    if tree is None or inside_accumulate(tree, loc.line):
        return False
    for node in walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Accelerator":
            for keyword in node.keywords:
                if keyword.arg == "gradient_accumulation_steps":
                    value = keyword.value
                    if not isinstance(value, ast.Constant):
                        return True
                    return value.value == k
    return False
