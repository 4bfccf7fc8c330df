from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

# the unit a length's name gives it, by its words (`warmup_steps`, `anneal_iters`, `n_epochs`)
_STEP_WORDS = frozenset({"step", "steps", "iter", "iters", "iteration", "iterations", "update",
                         "updates", "batch", "batches"})
_EPOCH_WORDS = frozenset({"epoch", "epochs"})
_RATE_WORDS = frozenset({"per", "every"})


def _words(name: str) -> set[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return {w for w in re.split(r"[_\W]+", spaced.lower()) if w}


def _unit(node: ast.AST) -> str | None:
    """"step" or "epoch" for a name or attribute whose words say one unit and not the other
    (`warmup_steps`, `self.kl_anneal_epochs`, `args.warmup_iters`); None for anything else and
    for a rate (`steps_per_epoch`)."""
    name = node.id if isinstance(node, ast.Name) else \
        node.attr if isinstance(node, ast.Attribute) else None
    if name is None:
        return None
    words = _words(name)
    if words & _RATE_WORDS:
        return None
    step, epoch = bool(words & _STEP_WORDS), bool(words & _EPOCH_WORDS)
    return "step" if step and not epoch else "epoch" if epoch and not step else None


def _counter(node: ast.AST) -> str | None:
    """The name a progress numerator reads: ``epoch``, ``epoch + 1``, ``float(step)``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)) \
            and isinstance(node.right, ast.Constant):
        node = node.left
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in ("float", "int") and len(node.args) == 1:
        node = node.args[0]
    return node.id if isinstance(node, ast.Name) else None


def _over_data(loop: ast.AST) -> bool:
    """A ``for`` loop over batches: its iterable is no ``range(...)`` (a loader, a dataset,
    ``enumerate(loader)``) and its body calls ``backward()`` (a loop over parameter groups or
    an episode's steps is none)."""
    if not isinstance(loop, ast.For):
        return False
    it = loop.iter
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range":
        return False
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr == "backward" for stmt in loop.body for n in walk(stmt))


def _counters(scope: ast.AST) -> dict[str, str]:
    """The scope's counters and what they count: the variable of a ``for`` loop whose body holds
    a loop over batches (an epoch: ``for epoch in range(E): for x in loader:``), and a name
    incremented by one in the body of that inner loop (a step: ``step += 1`` per batch)."""
    units: dict[str, set] = {}
    for loop in walk(scope):
        if not isinstance(loop, ast.For):
            continue
        inner = [n for stmt in loop.body for n in walk(stmt) if _over_data(n)]
        if not inner:
            continue
        if isinstance(loop.target, ast.Name):
            units.setdefault(loop.target.id, set()).add("epoch")
        for sub in inner:
            for stmt in walk(sub):
                if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add) \
                        and isinstance(stmt.target, ast.Name) \
                        and isinstance(stmt.value, ast.Constant) and stmt.value.value == 1:
                    units.setdefault(stmt.target.id, set()).add("step")
    return {name: got.pop() for name, got in units.items() if len(got) == 1}


def mismatched_ramps(tree: ast.AST) -> list[tuple[int, str, str, str, str, str]]:
    """``(line, text, counter, counts, length, unit)`` for each statement that divides a loop
    counter by a length named in the other unit: an epoch counter over ``warmup_steps``
    (a ramp that reaches 1 only after as many epochs as it meant steps), a per-batch step
    counter over ``anneal_epochs`` (done within the first epoch)."""
    found = []
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in [tree] + scopes:
        counters = _counters(scope)
        if not counters:
            continue
        for stmt in walk(scope):
            if not isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return)) \
                    or stmt.value is None:
                continue
            for node in walk(stmt.value):
                if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)):
                    continue
                counter = _counter(node.left)
                counts = counters.get(counter) if counter else None
                unit = _unit(node.right)
                if counts is None or unit is None or counts == unit:
                    continue
                if _unit(ast.Name(id=counter)) not in (None, counts):
                    continue  # the counter's own name says the other unit: not ours to judge
                found.append((stmt.lineno, ast.unparse(stmt).strip(), counter, counts,
                              ast.unparse(node.right), unit))
                break
    return sorted(set(found))


class RampCounterUnitMismatch(Rule):
    """
    ## What it does
    Finds a progress ratio that divides a loop counter by a length named in another unit: the
    epoch counter of a loop over epochs divided by `warmup_steps` or `anneal_iters`
    (`beta = min(1.0, epoch / warmup_steps)`), or a counter incremented once per batch divided
    by a length in epochs (`tau = max(0.5, 1 - step / anneal_epochs)`). The counter's unit is
    read from the loops (the variable of a `for` loop holding a loop over batches, a loader
    or a dataset whose body calls `backward()`, counts epochs; a name incremented by one
    inside that inner loop counts steps), the length's from its name. Read from the source of
    the files a backward ran from.

    ## Why is this bad?
    A KL warm-up, a Gumbel-softmax temperature anneal, a hand-written lr warm-up or a
    teacher-forcing decay is a fraction of the run: counted in the wrong unit it runs tens or
    hundreds of times too slow or too fast. An epoch counter over a length in steps leaves
    the KL weight near 0 for the whole run (an autoencoder whose posterior ignores the prior, a
    poor ELBO); a step counter over a length in epochs finishes the ramp inside the first epoch
    (the posterior collapses before the decoder learns to use the latent). Nothing fails.

    ## Example
    ```python
    for epoch in range(epochs):
        for x in loader:
            step += 1
            beta = min(1.0, epoch / warmup_steps)
    ```

    ## Use instead
    ```python
            beta = min(1.0, step / warmup_steps)
    ```

    ## Stays silent on
    Counters and lengths of one unit (`epoch / n_epochs`, `step / warmup_steps`); a rate
    (`step / steps_per_epoch`, which gives epochs on purpose); lengths whose names say no unit
    (`warmup`, `len(loader)`); a counter whose own name says the other unit; counters of a loop
    the script does not nest over batches (an episode's rollout loop inside a loop of updates);
    files no backward ran from.
    """

    code = "GD359"
    slug = "ramp-counter-unit-mismatch"
    severity = Severity.WARNING
    summary = ("a schedule's progress divides an epoch counter by a length in steps (or a step "
               "counter by one in epochs): the ramp runs far too slow or too fast")
    fix = "divide the counter by a length in its own unit (step / warmup_steps, epoch / n_epochs)"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, counter, counts, length, unit in mismatched_ramps(tree):
                plural = {"step": "steps", "epoch": "epochs"}
                yield self.finding(
                    f"`{text}` divides `{counter}`, which counts {plural[counts]}, by `{length}`, "
                    f"a length in {plural[unit]}: the ratio moves "
                    f"{'once per epoch against a length in steps, so it stays near its start for the whole run' if counts == 'epoch' else 'once per batch against a length in epochs, so it is done within the first epoch'}",
                    Location(path, line),
                    evidence={"counter": counter, "counts": counts, "length": length,
                              "unit": unit},
                    fix=(f"divide a {counts} counter by a length in {plural[counts]}, or count "
                         f"`{length}` with the {unit} counter"))
