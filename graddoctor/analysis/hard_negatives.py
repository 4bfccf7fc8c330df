"""Hard negatives drawn from a batch's similarity matrix without taking each row's own pair out,
read from the script's source (hard-negative-draws-positive).

ALBEF/BLIP-style image-text matching mines, for each text, a negative image from the batch in
proportion to the contrastive similarities (``torch.multinomial(softmax(sim_t2i), 1)``), or the
most similar one (``argmax``, ``topk``). The row's own pair is its positive, and it is the most
similar entry of its row: a weight matrix whose diagonal is left in draws it often, and an
``argmax`` always. Found per function (or the module): a name assigned from a product of two
batches' features with one transposed (``a @ b.t()``, ``torch.mm(a, b.T)``, ``einsum``), or
from a name so assigned (through softmax, a temperature, a transpose); drawn from with
``multinomial``/``argmax``/``topk`` (function or method, the weights subscripted for one row or
not), the draw indexing a tensor (``image_embeds[neg_idx]``); and no statement of the scope that
masks, fills or rewrites any name of that chain (``fill_diagonal_``, ``masked_fill``, ``eye``,
``where``, an in-place method, an item or augmented assignment, an infinity): a scope that does
is trusted (reading the diagonal, ``sim.diag()`` for the positives, is no mask).
A product with a parameter (``h @ self.emb.weight.t()``: a tied language-model head, whose
sampling draws tokens) is no similarity of two batches; nor, inside a loop, a product with a
name last assigned before the loop began (a MoCo/ALBEF memory queue of past features, carried
across iterations: it holds no current positive).
"""

from __future__ import annotations

import ast

from .source import _once_per_file, _parse, scope_walk, walk

_DRAWS = frozenset({"multinomial", "argmax", "topk"})
_MASKING = frozenset({"fill_diagonal_", "masked_fill", "masked_fill_", "eye", "diag_embed", "where",
                      "index_fill_", "index_fill", "scatter_", "scatter", "tril", "triu",
                      "logical_not"})
_TRANSPOSES = frozenset({"t", "transpose", "permute", "mT"})


def _names(expr) -> set[str]:
    return {n.id for n in walk(expr) if isinstance(n, ast.Name)}


def _transposed(expr) -> bool:
    if isinstance(expr, ast.Attribute) and expr.attr in ("T", "mT"):
        return True
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
        and expr.func.attr in _TRANSPOSES


def _is_parameter(expr) -> bool:
    """``self.emb.weight``, ``head.weight.t()``: a module's weight, not a batch's features."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        expr = expr.func.value
    while isinstance(expr, ast.Attribute) and expr.attr in ("T", "mT"):
        expr = expr.value
    return isinstance(expr, ast.Attribute) and expr.attr in ("weight", "bias") \
        or isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self"


def _pairwise(expr) -> bool:
    """A product of two batches' features with one of them transposed."""
    for n in walk(expr):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult):
            if _transposed(n.right) and not _is_parameter(n.right) and not _is_parameter(n.left):
                return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("mm", "matmul") \
                and len(n.args) == 2 and _transposed(n.args[1]) \
                and not _is_parameter(n.args[1]) and not _is_parameter(n.args[0]):
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "einsum" \
                and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str):
            spec = n.args[0].value.replace(" ", "")
            ins, _, out = spec.partition("->")
            parts = ins.split(",")
            if len(parts) == 2 and len(out) == 2 and out[0] in parts[0] and out[1] in parts[1] \
                    and out[0] not in parts[1] and out[1] not in parts[0]:
                return True
    return False


def _called(node) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return None


_MODULES = frozenset({"F", "torch", "nn", "functional"})


def _base_name(expr) -> str | None:
    """The matrix a draw's weights are made of: ``w`` of ``w[r]``, ``w.softmax(0)``,
    ``F.softmax(w / t, 1)``."""
    for _ in range(8):
        if isinstance(expr, ast.Subscript):
            expr = expr.value
        elif isinstance(expr, ast.BinOp):
            expr = expr.left
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
            if isinstance(expr.func.value, ast.Name) and expr.func.value.id in _MODULES:
                if not expr.args:
                    return None
                expr = expr.args[0]
            else:
                expr = expr.func.value
        else:
            break
    return expr.id if isinstance(expr, ast.Name) else None


def _draw_weights(call: ast.Call) -> ast.AST | None:
    """The weights a draw reads: ``torch.multinomial(w, 1)``, ``w.multinomial(1)``,
    ``w.argmax(1)``, ``torch.topk(w, k)``."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in _DRAWS:
        return None
    if isinstance(func.value, ast.Name) and func.value.id == "torch":
        return call.args[0] if call.args else None
    return func.value


def _scope_draws(scope, returned: list | None = None) -> list[tuple[int, str, str, int, str]]:
    """The draws of one scope that index a tensor there; those the scope returns instead (a
    helper that mines the negatives for its caller) go to ``returned``, for the callers to
    say whether they index with them."""
    nodes = list(scope_walk(scope))
    assigns: dict[str, list[ast.Assign]] = {}
    for n in nodes:
        if isinstance(n, ast.Assign):
            for t in n.targets:
                for name in (x.id for x in walk(t) if isinstance(x, ast.Name)):
                    assigns.setdefault(name, []).append(n)
    similar: dict[str, ast.Assign] = {}  # name -> its assignment, in order of the source
    loops = [n for n in nodes if isinstance(n, (ast.For, ast.While))]
    for n in sorted((n for n in nodes if isinstance(n, ast.Assign)), key=lambda s: (s.lineno, s.col_offset)):
        if _pairwise(n.value) and _against_bank(n, assigns, loops):
            continue
        if _pairwise(n.value) or _names(n.value) & similar.keys():
            for t in n.targets:
                if isinstance(t, ast.Name):
                    similar[t.id] = n
    if not similar:
        return []
    found = []
    for n in nodes:
        if not isinstance(n, ast.Call):
            continue
        weights = _draw_weights(n)
        if weights is None:
            continue
        base = _base_name(weights)
        inline = _pairwise(weights) or bool(_names(weights) & similar.keys())
        if base not in similar and not inline:
            continue
        chain = _chain(base, similar) if base in similar else _names(weights) & similar.keys()
        chain |= {x for name in list(chain) for x in _chain(name, similar)}
        if _masked(nodes, chain):
            continue
        compared = {id(sub) for m in nodes if isinstance(m, ast.Compare) for sub in walk(m)}
        inline_index = any(isinstance(m, ast.Subscript) and isinstance(m.ctx, ast.Load)
                           and id(m) not in compared
                           and any(sub is n for sub in walk(m.slice)) for m in nodes)
        drawn = _assigned_names(nodes, n)
        target = similar[base] if base in similar else None
        line = target.lineno if target is not None else n.lineno
        text = ast.unparse(target).strip() if target is not None else ast.unparse(n)
        made = (line, text, base or ast.unparse(weights), n.lineno, ast.unparse(n))
        if not inline_index and (not drawn or not _indexes(nodes, drawn, compared)):
            # a helper's returned draw: sampled negatives only (an argmax or topk a helper
            # returns is as often a nearest prototype or code, indexed by the caller in a table
            # that is not the batch: k-means, a VQ codebook)
            if returned is not None and isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and _called(n) == "multinomial" and _returns(nodes, n, drawn):
                returned.append((scope.name, made))
            continue
        found.append(made)
    return found


def _returns(nodes, call, drawn: set[str]) -> bool:
    """Whether the scope returns the draw, as it is or through a name assigned from it."""
    return any(isinstance(r, ast.Return) and r.value is not None
               and (any(sub is call for sub in walk(r.value)) or _names(r.value) & drawn)
               for r in nodes)


def _caller_indexes(tree, helper: str) -> bool:
    """Whether a call of ``helper`` somewhere in the file indexes a tensor with what it returns
    (``image_embeds[mine(sim)]``, or ``neg_idx = mine(sim)`` then ``image_embeds[neg_idx]``)."""
    scopes = [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        nodes = list(scope_walk(scope))
        calls = [n for n in nodes if isinstance(n, ast.Call) and _called(n) == helper]
        if not calls:
            continue
        compared = {id(sub) for m in nodes if isinstance(m, ast.Compare) for sub in walk(m)}
        for call in calls:
            if any(isinstance(m, ast.Subscript) and isinstance(m.ctx, ast.Load) and id(m) not in compared
                   and any(sub is call for sub in walk(m.slice)) for m in nodes):
                return True
            drawn = _assigned_names(nodes, call)
            if drawn and _indexes(nodes, drawn, compared):
                return True
    return False


def _against_bank(stmt, assigns: dict, loops: list) -> bool:
    """Whether the product at ``stmt``, inside a loop, reads a name last assigned before that
    loop began (a memory queue of past features, carried across iterations): it holds no row
    of the current batch, so no positive to draw."""
    around = [loop for loop in loops
              if loop.lineno < stmt.lineno <= (loop.end_lineno or loop.lineno)]
    if not around:
        return False
    loop = max(around, key=lambda l: l.lineno)
    operands = set()
    for n in walk(stmt.value):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult):
            operands |= _names(n.left) | _names(n.right)
        elif isinstance(n, ast.Call) and _called(n) in ("mm", "matmul", "einsum"):
            operands |= set().union(*(_names(arg) for arg in n.args)) if n.args else set()
    for name in operands - _MODULES:
        before = [a for a in assigns.get(name, ()) if a.lineno < stmt.lineno]
        if before and max(a.lineno for a in before) < loop.lineno:
            return True
    return False


def _chain(name: str, similar: dict) -> set[str]:
    """``name`` and the similarity names its assignment reads, back to the product."""
    seen, todo = set(), [name]
    while todo:
        cur = todo.pop()
        if cur in seen or cur not in similar:
            continue
        seen.add(cur)
        todo.extend(_names(similar[cur].value) & similar.keys())
    return seen


def _masked(nodes, chain: set[str]) -> bool:
    for n in nodes:
        if isinstance(n, ast.Call) and _called(n) in _MASKING:
            if _names(n) & chain or _called(n) == "eye":
                return True
        # an in-place write on the matrix (`sim.diagonal().zero_()`, `w.fill_(...)`)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr.endswith("_") \
                and not n.func.attr.startswith("_") and _names(n.func.value) & chain:
            return True
        if isinstance(n, ast.AugAssign) and _names(n.target) & chain:
            return True
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Subscript) and _names(t) & chain for t in n.targets):
            return True
        if isinstance(n, ast.Constant) and isinstance(n.value, float) and n.value in (float("inf"), float("-inf")):
            return True
        if isinstance(n, ast.Call) and _called(n) == "float" and n.args and isinstance(n.args[0], ast.Constant) \
                and isinstance(n.args[0].value, str) and "inf" in n.args[0].value:
            return True
    return False


def _assigned_names(nodes, call) -> set[str]:
    for n in nodes:
        if isinstance(n, ast.Assign) and any(sub is call for sub in walk(n.value)):
            return {x.id for t in n.targets for x in walk(t) if isinstance(x, ast.Name)}
    return set()


def _indexes(nodes, drawn: set[str], compared: set[int]) -> bool:
    """Whether a draw (or a name assigned from it) indexes a tensor: ``x[neg_idx]``; not one
    compared (a retrieval accuracy: ``labels[sim.argmax(1)] == labels``)."""
    names = set(drawn)
    for n in nodes:
        if isinstance(n, ast.Assign) and _names(n.value) & names and not any(
                isinstance(t, ast.Subscript) for t in n.targets):
            names |= {x.id for t in n.targets for x in walk(t) if isinstance(x, ast.Name)}
    for n in nodes:
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) and id(n) not in compared \
                and _names(n.slice) & names:
            return True
    return False


@_once_per_file
def positive_drawn_as_negative(path: str) -> list[tuple[int, str, str, int, str]]:
    """``(line, text, weights, draw line, draw text)`` for each such draw in the file at
    ``path``: the line is the assignment of the weights (where the diagonal is to be taken out),
    else the draw's own."""
    tree = _parse(path)
    if tree is None:
        return []
    found, returned = [], []
    scopes = [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        found.extend(_scope_draws(scope, returned))
    found.extend(made for helper, made in returned if _caller_indexes(tree, helper))
    return sorted(set(found))
