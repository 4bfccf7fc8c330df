from __future__ import annotations

import ast

from ..analysis.source import scope_walk
from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_PICKS = ("argmin", "argmax")
_LOSS_WORDS = ("loss", "mse", "criterion", "l1", "huber", "kl_div", "cross_entropy")
_NAMESPACES = {"torch", "F", "nn", "self", "np", "math"}


def _callee(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return None


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in walk(node) if isinstance(n, ast.Name)}


def _reads(node: ast.AST, names: set[str]) -> bool:
    return bool(_names(node) & names)


def _picked(value: ast.AST) -> ast.AST | None:
    """The operand of ``d.argmin(1)``, ``torch.argmin(d, dim=1)``, ``d.min(1)[1]``,
    ``d.min(dim=1).indices``: the tensor a code is chosen from."""
    if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant) and value.slice.value == 1:
        value = value.value
        if _callee(value) not in ("min", "max"):
            return None
    elif isinstance(value, ast.Attribute) and value.attr == "indices":
        value = value.value
        if _callee(value) not in ("min", "max"):
            return None
    elif _callee(value) not in _PICKS:
        return None
    func = value.func
    if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and func.value.id == "torch"):
        return func.value
    return value.args[0] if value.args else None


def _lookup(value: ast.AST, indices: set[str]) -> bool:
    """A table read at chosen indices: ``codebook(idx)``, ``F.embedding(idx, w)``, ``w[idx]``,
    ``one_hot(idx) @ w``,
    ``torch.index_select(w, 0, idx)`` (through reshapes of the result); a ``gather`` of one value
    per row (an action's Q-value) is no table read."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and value.func.attr in ("view", "reshape", "permute", "view_as", "contiguous", "unsqueeze"):
        value = value.func.value
    if isinstance(value, ast.Subscript):
        return _reads(value.slice, indices)
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.MatMult):
        return any(isinstance(side, ast.Name) and side.id in indices for side in (value.left, value.right))
    if isinstance(value, ast.Call) and _callee(value) not in _PICKS + ("one_hot", "gather", "take_along_dim"):
        return any(isinstance(arg, ast.Name) and arg.id in indices for arg in value.args) \
            or any(isinstance(a, ast.Call) and _callee(a) in ("view", "reshape", "flatten")
                   and _reads(a, indices) for a in value.args)
    return False


def _detached(value: ast.AST) -> ast.AST | None:
    """``x`` of ``x.detach()`` or ``x.data``."""
    if _callee(value) == "detach" and isinstance(value.func, ast.Attribute) and not value.args:
        return value.func.value
    if isinstance(value, ast.Attribute) and value.attr == "data":
        return value.value
    return None


def _signed_terms(node: ast.AST, sign: int = 1) -> list[tuple[int, ast.AST]]:
    """The terms of a sum with their signs: ``a + z - z.detach()`` -> ``[(1, a), (1, z), (-1, z.detach())]``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        return _signed_terms(node.left, sign) + _signed_terms(
            node.right, -sign if isinstance(node.op, ast.Sub) else sign)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _signed_terms(node.operand, -sign)
    return [(sign, node)]


def _straight_through(scope: ast.AST) -> bool:
    """Whether the scope writes a straight-through estimator: a difference detached
    (``(q - z).detach()``) or a sum that adds ``z`` and takes ``z.detach()`` away, in any
    order and beside other terms (``q.detach() + z - z.detach()``, ``z_q + z - z.detach()``)."""
    for node in scope_walk(scope):
        inner = _detached(node)
        if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Sub):
            return True
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            terms = _signed_terms(node)
            added = {ast.dump(t) for sign, t in terms if sign > 0}
            if any(sign < 0 and _detached(t) is not None and ast.dump(_detached(t)) in added
                   for sign, t in terms):
                return True
    return False


def _no_grad_lines(scope: ast.AST) -> set[int]:
    lines = set()
    for node in scope_walk(scope):
        if isinstance(node, ast.With) and any("no_grad" in ast.unparse(item.context_expr)
                                              or "inference_mode" in ast.unparse(item.context_expr)
                                              for item in node.items):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def _fed_on(scope: ast.AST, name: str, after: int, quiet: set[int]) -> ast.AST | None:
    """The first read of ``name`` after line ``after`` (outside ``no_grad``) that gives it to a
    network or returns it: an argument of a call that is no loss, or a returned value."""
    parents = {}
    for node in [scope, *scope_walk(scope)]:
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    reads = sorted((n for n in scope_walk(scope) if isinstance(n, ast.Name) and n.id == name
                    and isinstance(n.ctx, ast.Load) and n.lineno > after and n.lineno not in quiet),
                   key=lambda n: n.lineno)
    for node in reads:
        child, parent = node, parents.get(id(node))
        while parent is not None and not isinstance(parent, ast.stmt):
            callee = _callee(parent)
            if callee is not None and child is not getattr(parent, "func", None):
                if any(word in callee.lower() for word in _LOSS_WORDS):
                    break  # a loss's operand: a codebook or commitment term
                if callee not in ("detach", "clone", "view", "reshape", "float", "size", "numel",
                                  "item", "cpu", "numpy", "tolist", "unique", "bincount", "append"):
                    return parent
            child, parent = parent, parents.get(id(parent))
        else:
            if isinstance(parent, ast.Return):
                return parent
    return None


def detached_quantisations(tree: ast.AST) -> list[dict]:
    """Codes chosen by argmin/argmax, read from a table at those indices, detached and given on
    to a network (or returned) in a scope that writes no straight-through estimator."""
    scopes = [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = []
    for scope in scopes:
        assigns = sorted((n for n in scope_walk(scope) if isinstance(n, ast.Assign) and len(n.targets) == 1
                          and isinstance(n.targets[0], ast.Name)), key=lambda n: n.lineno)
        indices: dict[str, ast.AST] = {}
        lookups: dict[str, str] = {}  # a looked-up name -> the index name
        for node in assigns:
            name, value = node.targets[0].id, node.value
            chosen = _picked(value)
            if chosen is not None:
                indices[name] = chosen
                continue
            hot = next((n for n in walk(value) if _callee(n) == "one_hot" and n.args
                        and isinstance(n.args[0], ast.Name) and n.args[0].id in indices), None)
            if hot is not None:
                indices[name] = indices[hot.args[0].id]  # the choice as one-hot rows
                continue
            if _lookup(value, set(indices)):
                lookups[name] = next(n for n in _names(value) if n in indices)
        if not indices or _straight_through(scope):
            continue
        quiet = _no_grad_lines(scope)
        for node in assigns:
            inner = _detached(node.value)
            if inner is None or node.lineno in quiet:
                continue
            if isinstance(inner, ast.Name) and inner.id in lookups:
                index = lookups[inner.id]
            elif _lookup(inner, set(indices)):
                index = next(n for n in _names(inner) if n in indices)
            else:
                continue
            fed = _fed_on(scope, node.targets[0].id, node.lineno, quiet)
            if fed is None:
                continue
            source = indices[index]
            table = _names(inner) | ({n for n in _names(assigns_value(assigns, inner.id))}
                                     if isinstance(inner, ast.Name) else set())
            measured = assigns_value(assigns, source.id) if isinstance(source, ast.Name) else source
            continuous = sorted(_names(measured) - table - _NAMESPACES - set(indices))
            made = [n.lineno for n in assigns if n.targets[0].id in continuous]
            if made and all(line in quiet for line in made):
                continue  # chosen for values made without gradient (a frozen tokenizer's): nothing to carry back
            found.append({"line": node.lineno, "statement": ast.unparse(node),
                          "quantised": ast.unparse(inner), "chosen_from": ast.unparse(source),
                          "continuous": continuous[0] if len(continuous) == 1 else None,
                          "fed": ast.unparse(fed)[:80]})
    return found


def assigns_value(assigns, name: str) -> ast.AST:
    node = next((n for n in reversed(assigns) if n.targets[0].id == name), None)
    return node.value if node is not None else ast.Constant(None)


class QuantisedValueDetached(Rule):
    """
    ## What it does
    Finds a vector quantiser that hands its decoder the chosen codes detached: a code picked by
    `argmin`/`argmax` (of distances, of logits), read from a table at those indices
    (`codebook(idx)`, `F.embedding(idx, w)`, `w[idx]`), then `.detach()`ed (or read through
    `.data`) and given on to a network or returned, in a function that writes no
    straight-through estimator (`z + (q - z).detach()`). Read from the script's source once a
    backward ran; reported at the detach.

    ## Why is this bad?
    The choice of a code has no gradient, and a detached code has none either: the decoder's
    loss reaches neither the encoder nor the codebook through it. The encoder then learns only
    from the commitment term, which pulls it toward codes the reconstruction never shaped; the
    reconstruction stays poor while every loss term falls. The straight-through estimator is
    what carries the decoder's gradient to the encoder: `z + (q - z).detach()` is `q` in value
    and `z` in gradient.

    ## Example
    ```python
    idx = torch.cdist(z, self.codebook.weight).argmin(1)
    q = self.codebook(idx)
    z_q = q.detach()
    return self.decoder(z_q), F.mse_loss(q, z.detach()) + beta * F.mse_loss(z, q.detach())
    ```

    ## Use instead
    ```python
    z_q = z + (q - z).detach()
    ```

    ## Stays silent on
    The straight-through forms (`z + (q - z).detach()`, `q.detach() + z - z.detach()`, also
    over two statements: `z_q = q.detach()`, then `z_q = z_q + z - z.detach()`); a
    detached code given to a loss (the commitment and codebook terms); codes read under
    `no_grad` (an EMA codebook update, an evaluation), or chosen for encoder outputs computed
    under `no_grad` (a prior trained on a frozen tokenizer's codes); a detached code in a function without
    the lookup (a second stage training a prior on a frozen tokenizer's codes); indices given
    on as they are (an autoregressive prior over code indices).
    Not seen: a lookup and its detach in different functions.
    """

    code = "GD384"
    slug = "quantised-value-detached"
    severity = Severity.WARNING
    summary = ("a vector quantiser gives its decoder the chosen codes detached, with no "
               "straight-through estimator: the reconstruction loss never reaches the encoder")
    fix = "pass the straight-through value `z + (q - z).detach()` on instead of `q.detach()`"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for site in detached_quantisations(tree):
                z = site["continuous"]
                q = site["quantised"]
                fix = (f"`{z} + ({q} - {z}).detach()`: the code's value forward, `{z}`'s gradient "
                       f"backward" if z else None)
                yield self.finding(
                    f"`{site['statement']}` detaches the codes chosen from `{site['chosen_from']}` "
                    f"and the result is given on (`{site['fed']}`) with no straight-through "
                    f"estimator in the function: neither the choice nor the detached code carries "
                    f"a gradient, so the reconstruction loss never reaches the encoder, which "
                    f"learns only from the commitment term",
                    Location(path, site["line"]),
                    evidence={"quantised": q, "chosen_from": site["chosen_from"]},
                    fix=fix)
