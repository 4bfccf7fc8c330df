from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Related, Rule
from ..analysis.source import walk

_DROPOUT = ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout", "dropout")
# a forward that draws its own noise samples whatever the mode (a Bayesian layer)
_DRAWS = ("randn", "randn_like", "rand", "rand_like", "normal", "normal_", "bernoulli", "sample", "rsample")


def _name(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _method_call(stmt: ast.stmt, method: str) -> str | None:
    """``model`` of a statement ``model.eval()`` (``method`` the call's name)."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and not stmt.value.args \
            and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == method \
            and isinstance(stmt.value.func.value, ast.Name):
        return stmt.value.func.value.id
    return None


def _is_false(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _switches_on(node: ast.AST) -> bool:
    """Whether ``node`` is itself a switch of a module into training mode: a ``.train()`` call
    (not ``.train(False)``), or the flag written directly (``m.training = True``)."""
    if isinstance(node, ast.Call) and _name(node.func) == "train":
        mode = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "mode"), None)
        return mode is None or not _is_false(mode)
    if isinstance(node, ast.Assign) and not _is_false(node.value):
        return any(isinstance(t, ast.Attribute) and t.attr == "training" for t in node.targets)
    return False


def _calls_train(node: ast.AST, trainers: set[str]) -> bool:
    """Whether ``node`` switches a module into training mode (``.train()``, ``m.training =
    True``) or calls a function of the file that does (``enable_dropout(model)``, or hands it
    on: ``model.apply(enable_dropout)``)."""
    return any(_switches_on(n) or (isinstance(n, ast.Call) and _name(n.func) in trainers)
               or (isinstance(n, ast.Name) and n.id in trainers) for n in walk(node))


def _loop_vars(target: ast.AST) -> set[str]:
    return {n.id for n in walk(target) if isinstance(n, ast.Name)}


def _forwards(node: ast.AST, model: str) -> list[ast.Call]:
    """Calls of ``model`` with positional inputs only (a keyword may ask for sampling:
    ``model(x, mc_dropout=True)``)."""
    return [n for n in walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id == model and not n.keywords]


def _repeated_forward(stmt: ast.stmt, model: str) -> int | None:
    """The line where ``stmt`` runs ``model`` several times on an input that does not change
    (``[model(x) for _ in range(T)]``, a loop appending ``model(x)``), else None."""
    for node in walk(stmt):
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)) and len(node.generators) == 1:
            gen = node.generators[0]
            if isinstance(gen.iter, ast.Call) and _name(gen.iter.func) == "range":
                calls = _forwards(node.elt, model)
                names = {n.id for c in calls for n in walk(c) if isinstance(n, ast.Name)}
                if calls and not names & _loop_vars(gen.target):
                    return node.lineno
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and _name(node.iter.func) == "range":
            for inner in node.body:
                for call in (c for c in walk(inner) if isinstance(c, ast.Call) and _name(c.func) == "append"):
                    forwards = [f for a in call.args for f in _forwards(a, model)]
                    names = {n.id for f in forwards for n in walk(f) if isinstance(n, ast.Name)}
                    if forwards and not names & _loop_vars(node.target):
                        return call.lineno
    return None


def _blocks(tree: ast.AST):
    for node in walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def eval_mode_samples(tree: ast.AST) -> list[tuple[int, str, int]]:
    """``[(line of model.eval(), the model, line of the repeated forward)]``: in a file whose
    models use dropout and whose forwards draw no noise of their own, a ``model.eval()``
    followed in its block, with no ``.train()`` call between, by several forwards of the model
    on one unchanged input (Monte Carlo dropout samples)."""
    dropouts = [n for n in walk(tree) if isinstance(n, ast.Call) and _name(n.func) in _DROPOUT]
    if not dropouts:
        return []
    # a functional dropout told to stay on (training=True) samples in eval mode too
    if any(k.arg == "training" and not (isinstance(k.value, ast.Attribute) and k.value.attr == "training")
           for d in dropouts for k in d.keywords):
        return []
    trainers = {fn.name for fn in walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                and any(_switches_on(n) for n in walk(fn))}
    for fn in walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == "forward" and any(
                isinstance(n, ast.Call) and _name(n.func) in _DRAWS for n in walk(fn)):
            return []
    found: dict[int, tuple[int, str, int]] = {}  # the repeated forward -> the last eval() before it
    for block in _blocks(tree):
        for i, stmt in enumerate(block):
            model = _method_call(stmt, "eval")
            if model is None:
                continue
            for later in block[i + 1:]:
                if _calls_train(later, trainers):
                    break
                line = _repeated_forward(later, model)
                if line is not None:
                    if line not in found or found[line][0] < stmt.lineno:
                        found[line] = (stmt.lineno, model, line)
                    break
                if _method_call(later, "eval") == model:
                    break  # a later eval() of the same model answers for what follows
    return sorted(found.values())


class McSamplesInEvalMode(Rule):
    """
    ## What it does
    Finds Monte Carlo dropout sampling run in eval mode: `model.eval()` followed, with no
    `.train()` call between, by several forwards of the model on one unchanged input
    (`torch.stack([model(x) for _ in range(T)])`, a loop appending `model(x)`), in a script
    whose model uses dropout and whose forwards draw no noise of their own. Read from the
    script's source, in the files a backward ran from; it points at `model.eval()`.

    ## Why is this bad?
    Eval mode turns dropout off, so the T passes compute the same output T times: the
    predictive mean is the deterministic prediction and the predictive spread (the `std`,
    the entropy of the mean, the mutual information) is exactly zero. The uncertainty the
    sampling exists to measure is silently gone, and anything built on it (rejection,
    active learning, calibration) reads a constant.

    ## Example
    ```python
    model.eval()
    with torch.no_grad():
        probs = torch.stack([model(x).softmax(1) for _ in range(30)])
    ```

    ## Use instead
    ```python
    model.eval()
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.train()  # dropout alone stays stochastic; batch norm keeps its running stats
    with torch.no_grad():
        probs = torch.stack([model(x).softmax(1) for _ in range(30)])
    ```

    ## Stays silent on
    Dropout layers switched back on after `eval()` (any `.train()` call, or a module's
    `training` flag set to `True`, before the sampling);
    `model.train()` sampling; passes over different inputs (`model(x[i])`, test-time
    augmentation of each pass); models whose forward draws its own noise (Bayesian layers
    sampling weights, a VAE's reparameterisation); scripts without dropout.
    """

    code = "GD371"
    slug = "mc-samples-in-eval-mode"
    severity = Severity.WARNING
    summary = ("Monte Carlo dropout samples drawn after model.eval(): dropout is off, every "
               "pass is the same and the predictive spread is zero")
    fix = "switch the dropout layers back on for the sampling (m.train() for each nn.Dropout)"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, model, sampled in eval_mode_samples(tree):
                yield self.finding(
                    f"`{model}.eval()` turns dropout off, and the passes below run `{model}` "
                    f"several times on the same input: each pass computes the same output, so "
                    f"the Monte Carlo samples are copies and their spread (a std, an entropy of "
                    f"the mean) is zero",
                    Location(path, line),
                    related=(Related(Location(path, sampled), "the repeated passes"),),
                    evidence={"model": model, "samples_line": sampled},
                    fix=(f"keep dropout on for the sampling: after `{model}.eval()`, "
                         f"`for m in {model}.modules(): m.train() if isinstance(m, nn.Dropout) else None`"))
