from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Related, Rule
from ..analysis.source import walk

# what makes a per-sample derivative scale-free: its direction only (FGSM, a normalised step)
_SCALE_FREE = {"sign", "normalize"}


def _is_autograd_grad(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "grad":
        owner = func.value
        return (isinstance(owner, ast.Attribute) and owner.attr == "autograd") or \
            (isinstance(owner, ast.Name) and owner.id == "autograd")
    return isinstance(func, ast.Name) and func.id == "grad"


def _whole_mean(node: ast.AST | None) -> ast.AST | None:
    """``x`` of ``x.mean()`` / ``torch.mean(x)`` averaged over every element (no dim), else
    None."""
    if not isinstance(node, ast.Call) or node.keywords:
        return None
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "mean":
        if not node.args and not (isinstance(func.value, ast.Name) and func.value.id == "torch"):
            return func.value
        if len(node.args) == 1 and isinstance(func.value, ast.Name) and func.value.id == "torch":
            return node.args[0]
    return None


def _argument(call: ast.Call, position: int, keyword: str) -> ast.AST | None:
    if len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _names(node: ast.AST | None) -> list[str]:
    """The plain names ``inputs`` lists (``x``, ``(x, t)``, ``[pos]``); [] for anything else."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in node.elts):
        return [e.id for e in node.elts]
    return []


def _made_differentiable(scope_nodes, name: str) -> bool:
    """Whether the scope turns ``name`` into a differentiable input: ``name.requires_grad_()``,
    ``name = (...).requires_grad_(True)``, ``name = torch.rand(..., requires_grad=True)``."""
    for n in scope_nodes:
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                and n.func.attr == "requires_grad_" and isinstance(n.func.value, ast.Name) \
                and n.func.value.id == name:
            return True
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
            for m in walk(n.value):
                if isinstance(m, ast.Call) and (
                        (isinstance(m.func, ast.Attribute) and m.func.attr == "requires_grad_")
                        or any(k.arg == "requires_grad" and isinstance(k.value, ast.Constant)
                               and k.value.value is True for k in m.keywords)):
                    return True
    return False


def _calls(node: ast.AST, names) -> bool:
    return any(isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Attribute) and n.func.attr in names)
        or (isinstance(n.func, ast.Name) and n.func.id in names)) for n in walk(node))


def _scale_free_use(scope_nodes) -> bool:
    """``.sign()``, ``F.normalize``, or a division by a norm (``g / g.norm()``) in the scope."""
    return any(_calls(n, _SCALE_FREE) if isinstance(n, ast.Call) else
               isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and _calls(n.right, {"norm"})
               for n in scope_nodes)


def _batch_size(node: ast.AST, sizes: set[str]) -> bool:
    """``x.shape[0]``, ``x.size(0)``, ``len(x)``, or a name the scope binds to one of them."""
    if isinstance(node, ast.Name):
        return node.id in sizes
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
        return isinstance(node.slice, ast.Constant) and node.slice.value == 0
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id == "len":
            return True
        if isinstance(func, ast.Attribute) and func.attr == "size":
            return len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and node.args[0].value == 0
    return False


def _rescaled(call: ast.Call, nodes) -> bool:
    """Whether the derivative is multiplied back by the batch size, where it is taken
    (``grad(e.mean(), x)[0] * x.shape[0]``) or through the name it is bound to: the mean's
    ``1 / N`` undone, each sample's own derivative."""
    sizes: set[str] = set()
    for n in nodes:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) \
                and _batch_size(n.value, set()):
            sizes.add(n.targets[0].id)
    parents = {id(child): n for n in nodes for child in ast.iter_child_nodes(n)}
    bound, cur = set(), call
    while id(cur) in parents:
        parent = parents[id(cur)]
        if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Mult):
            other = parent.right if parent.left is cur else parent.left
            if _batch_size(other, sizes):
                return True
        if isinstance(parent, ast.Assign):
            bound = {t.id for t in parent.targets if isinstance(t, ast.Name)}
            break
        if not isinstance(parent, (ast.BinOp, ast.UnaryOp, ast.Subscript)):
            break
        cur = parent
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and (
        (isinstance(n.left, ast.Name) and n.left.id in bound and _batch_size(n.right, sizes))
        or (isinstance(n.right, ast.Name) and n.right.id in bound and _batch_size(n.left, sizes)))
        for n in nodes)


def batch_mean_input_grads(tree: ast.AST) -> list[tuple[int, str, str, str]]:
    """``(line, call text, averaged expression, inputs)`` for each ``torch.autograd.grad``
    whose output is a whole ``.mean()`` and whose inputs are tensors the same function (or
    module level) made differentiable itself (data, not parameters), in a scope that does not
    keep only the derivative's direction (``.sign()``, a norm)."""
    found = []
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    inner = {id(n) for f in scopes for n in walk(f) if n is not f}
    for scope in scopes + [tree]:
        nodes = [n for n in walk(scope) if scope is not tree or id(n) not in inner]
        if _scale_free_use(nodes):
            continue
        for n in nodes:
            if not (isinstance(n, ast.Call) and _is_autograd_grad(n)):
                continue
            averaged = _whole_mean(_argument(n, 0, "outputs"))
            names = _names(_argument(n, 1, "inputs"))
            if averaged is None or not names or \
                    not all(_made_differentiable(nodes, name) for name in names):
                continue
            if _rescaled(n, nodes):
                continue
            found.append((n.lineno, ast.unparse(n), ast.unparse(averaged), ", ".join(names)))
    return sorted(set(found))


class InputGradOfBatchMean(Rule):
    """
    ## What it does
    Finds `torch.autograd.grad` taken of a batch's whole mean with respect to inputs the script
    made differentiable itself (`pos.requires_grad_(True)`, `torch.rand(..., requires_grad=True)`):
    `forces = -torch.autograd.grad(energy.mean(), pos, create_graph=True)[0]`, a PINN's
    `u_x = grad(u.mean(), x)`, a gradient penalty's `grad(d_hat.mean(), x_hat)`, whose result
    the script then uses as a per-sample quantity. The call ran; read from the source.

    ## Why is this bad?
    Each sample's output depends only on its own input, so the derivative of the mean with
    respect to one sample's input is that sample's derivative divided by the number of values
    averaged. The forces of a force field, the derivatives in a PDE residual, the gradient
    norms of a penalty all come out `N` times too small: a force-matching loss then trains the
    energy to be `N` times too steep, a residual is satisfied by the wrong field, a penalty
    pushes the gradient norm to `N`, not 1. It still trains, and each batch size gives a
    different model.

    ## Example
    ```python
    pos = batch_pos.clone().requires_grad_(True)
    energy = model(pos)                      # one energy per structure
    forces = -torch.autograd.grad(energy.mean(), pos, create_graph=True)[0]
    ```

    ## Use instead
    ```python
    pos = batch_pos.clone().requires_grad_(True)
    energy = model(pos)
    forces = -torch.autograd.grad(energy.sum(), pos, create_graph=True)[0]
    # or: torch.autograd.grad(energy, pos, grad_outputs=torch.ones_like(energy), create_graph=True)
    ```

    ## Stays silent on
    `.sum()` or `grad_outputs=torch.ones_like(...)`; a mean over a dimension (`u.mean(1)`);
    gradients with respect to parameters (MAML's inner step, `model.parameters()`); an input
    gradient whose direction only is used (`.sign()` for FGSM, a step normalised by its norm);
    a gradient multiplied back by the batch size (`grad(e.mean(), x)[0] * x.shape[0]`);
    a mean the grad call gets through a name; files no backward ran from.
    """

    code = "GD392"
    slug = "input-grad-of-batch-mean"
    severity = Severity.WARNING
    summary = ("torch.autograd.grad of a batch's mean with respect to per-sample inputs: each "
               "sample's derivative (forces, PDE derivatives, penalty gradients) is divided by "
               "the batch size")
    fix = "take the gradient of the sum (or pass grad_outputs=torch.ones_like(output))"

    def check(self, a):
        grads = [e for e in a.of_kind("functional_grad")
                 if e.get("api") == "torch.autograd.grad" and e.loc is not None]
        ran = {(e.loc.path, e.loc.line) for e in grads}
        if not ran or not a.of_kind("backward"):
            return
        for path in list(dict.fromkeys(p for p, _ in ran))[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, averaged, inputs in batch_mean_input_grads(tree):
                if (path, line) not in ran:
                    continue
                backward = a.source.result_reaches_backward(path, line)
                if backward is None:
                    continue
                yield self.finding(
                    f"`{text}` differentiates the mean of `{averaged}` over all its values with "
                    f"respect to `{inputs}`: each sample's derivative comes out divided by the "
                    f"number of values averaged, and the loss backpropagated at line {backward} "
                    f"uses it as a per-sample quantity (forces, PDE derivatives, a penalty's "
                    f"gradient norm), so it is trained against values that size times too small",
                    Location(path, line),
                    related=(Related(Location(path, backward), "the backward of the loss that uses it"),),
                    evidence={"averaged": averaged, "inputs": inputs, "backward_line": backward},
                    fix=(f"differentiate `{averaged}.sum()` instead (or pass "
                         f"`grad_outputs=torch.ones_like({averaged})`): each sample's output "
                         f"depends on its own input only, so the sum gives each sample its own "
                         f"derivative"))
