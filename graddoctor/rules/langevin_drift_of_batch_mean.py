from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Related, Rule
from ..analysis.source import walk

_NOISE = ("randn", "randn_like", "normal", "normal_", "normal_like")
# a gradient whose scale is thrown away: its sign, or divided by its norm
_SCALE_FREE = ("sign", "norm", "normalize", "vector_norm")


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return getattr(node, "id", "")


def _mean_of(node: ast.AST) -> ast.AST | None:
    """``e`` of ``e.mean()`` or ``torch.mean(e)`` (a mean over every element), else None."""
    if not isinstance(node, ast.Call) or node.keywords:
        return None
    if isinstance(node.func, ast.Attribute) and node.func.attr == "mean" and not node.args:
        return node.func.value
    if _name(node.func) == "mean" and len(node.args) == 1 and isinstance(node.func, ast.Attribute) \
            and _name(node.func.value) == "torch":
        return node.args[0]
    return None


def _grad_call(value: ast.AST) -> ast.Call | None:
    """The ``torch.autograd.grad(...)`` call of ``value`` (``grad(...)[0]`` included)."""
    if isinstance(value, ast.Subscript):
        value = value.value
    if isinstance(value, ast.Call) and _name(value.func) == "grad" and isinstance(value.func, ast.Attribute) \
            and _name(value.func.value) == "autograd":
        return value
    return None


def _loads(node: ast.AST) -> set[str]:
    return {n.id for n in walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _calls(node: ast.AST) -> set[str]:
    return {_name(n.func) for n in walk(node) if isinstance(n, ast.Call)}


def _leftmost(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        node = node.left
    return node


def mean_drifts(tree: ast.AST) -> list[tuple[int, str, str, int]]:
    """``[(line of the mean, the batch tensor, the mean's text, line of the update)]``: in
    one loop, ``g = torch.autograd.grad(f(x).mean(), x)[0]`` whose result moves ``x`` itself
    (``x = x - step * g + noise``) in an update that adds Gaussian noise, the gradient's scale
    kept (no ``sign()``, no division by its norm)."""
    found = []
    for loop in (n for n in walk(tree) if isinstance(n, (ast.For, ast.While))):
        body = [s for stmt in loop.body for s in walk(stmt) if isinstance(s, ast.stmt)]
        grads: dict[str, tuple[ast.Assign, str, str, int]] = {}
        means: dict[str, tuple[ast.AST, int]] = {}  # e = energy(x).mean() before the grad
        for stmt in body:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
                continue
            target = stmt.targets[0]
            if isinstance(target, ast.Name):
                means.pop(target.id, None)
                if _mean_of(stmt.value) is not None:
                    means[target.id] = (stmt.value, stmt.lineno)
            call = _grad_call(stmt.value)
            if call is not None and len(call.args) >= 2:
                first, mean_line = call.args[0], stmt.lineno
                if isinstance(first, ast.Name) and first.id in means:
                    first, mean_line = means[first.id]
                inner = _mean_of(first)
                wrt = call.args[1]
                if isinstance(wrt, (ast.List, ast.Tuple)) and len(wrt.elts) == 1:
                    wrt = wrt.elts[0]
                names = [target.id] if isinstance(target, ast.Name) else \
                    [t.id for t in getattr(target, "elts", ()) if isinstance(t, ast.Name)][:1]
                if inner is not None and isinstance(wrt, ast.Name) and names:
                    grads[names[0]] = (stmt, wrt.id, ast.unparse(first), mean_line)
                continue
            if not isinstance(target, ast.Name):
                continue
            for g, (grad_stmt, x, text, mean_line) in grads.items():
                if target.id != x or g not in _loads(stmt.value) or stmt.lineno <= grad_stmt.lineno:
                    continue
                left = _leftmost(stmt.value)
                if not (isinstance(left, ast.Name) and left.id == x):
                    continue
                if _calls(stmt.value) & set(_SCALE_FREE):
                    continue
                noisy = bool(_calls(stmt.value) & set(_NOISE)) or any(
                    isinstance(s, ast.Assign) and _calls(s.value) & set(_NOISE)
                    and {t.id for t in s.targets if isinstance(t, ast.Name)} & _loads(stmt.value)
                    for s in body)
                if noisy:
                    found.append((mean_line, x, text, stmt.lineno))
    return list(dict.fromkeys(found))


class LangevinDriftOfBatchMean(Rule):
    """
    ## What it does
    Finds a Langevin-style sampling loop (an energy-based model's negatives, SGLD, a score
    model's sampler) that takes the gradient of the batch's *mean* energy with respect to the
    batch of samples (`g = torch.autograd.grad(energy(x).mean(), x)[0]`) and moves each
    sample with it plus Gaussian noise (`x = x - step * g + noise * torch.randn_like(x)`).
    Read from the script's source, in the files a backward ran from; it points at the
    mean's line (`e = energy(x).mean()` one line above the gradient, or the gradient's own).

    ## Why is this bad?
    Each sample's energy enters the mean with weight 1/B, so each sample's gradient is its
    own divided by the batch size: the drift shrinks B-fold while the noise does not. The
    chains barely move toward low energy (a diffusion at almost pure noise), the negatives stay
    near their initialisation, and contrastive divergence trains the energy against noise;
    changing the batch size silently changes the sampler. Nothing fails.

    ## Example
    ```python
    for _ in range(n_steps):
        g = torch.autograd.grad(energy(x).mean(), x)[0]
        x = x - 0.5 * step * g + step ** 0.5 * torch.randn_like(x)
    ```

    ## Use instead
    ```python
    for _ in range(n_steps):
        g = torch.autograd.grad(energy(x).sum(), x)[0]
        x = x - 0.5 * step * g + step ** 0.5 * torch.randn_like(x)
    ```

    ## Stays silent on
    The sum (or `grad_outputs=torch.ones_like(e)`); an update without noise (gradient descent
    on inputs, where the scale is only a step size); a gradient used through its sign or
    divided by its norm (FGSM/PGD); a mean over one axis (`energy(x).mean(1)`); the gradient
    of a mean with respect to a parameter, not the samples.
    """

    code = "GD370"
    slug = "langevin-drift-of-batch-mean"
    severity = Severity.WARNING
    summary = ("a Langevin update moves each sample by the gradient of the batch's mean "
               "energy: the drift is divided by the batch size, the noise is not")
    fix = "differentiate the batch's summed energy: torch.autograd.grad(energy(x).sum(), x)"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, x, text, update in mean_drifts(tree):
                summed = text[:-len(".mean()")] + ".sum()" if text.endswith(".mean()") else f"({text}) * batch_size"
                yield self.finding(
                    f"`{text}` averages the energy over the batch before its gradient with respect "
                    f"to `{x}` is taken: each sample's gradient is divided by the batch size, and "
                    f"the update that moves `{x}` adds noise at full scale, so the chains drift "
                    f"toward low energy B times too slowly and stay near where they started",
                    Location(path, line),
                    related=(Related(Location(path, update), f"`{x}` moved by it, with noise, here"),),
                    evidence={"samples": x, "mean": text, "update_line": update},
                    fix=f"take the gradient of the summed energy: `{summed}`")
