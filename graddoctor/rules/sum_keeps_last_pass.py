from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from ..analysis.source import scope_walk as _scope_walk
from .base import Related, Rule
from ..analysis.source import walk

# calls that make a zero to sum into: torch.zeros(()), torch.tensor(0.0), x.new_zeros(())
_ZERO_CALLS = ("zeros", "zeros_like", "new_zeros")


def _zero(value: ast.AST) -> bool:
    """``0``, ``0.0``, ``torch.zeros(...)``, ``torch.tensor(0.0)``, ``x.new_zeros(...)``: a value
    to sum into."""
    if isinstance(value, ast.Constant):
        return not isinstance(value.value, bool) and isinstance(value.value, (int, float)) \
            and value.value == 0
    if isinstance(value, ast.Call):
        name = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", "")
        if name in _ZERO_CALLS:
            return True
        if name in ("tensor", "as_tensor") and value.args:
            return _zero(value.args[0])
    return False


def _loads(node: ast.AST) -> set[str]:
    return {n.id for n in [node, *_scope_walk(node)] if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _assigned(stmt: ast.stmt) -> str | None:
    """The one plain name ``stmt`` assigns (``x = ...``), or None."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        return stmt.target.id
    return None


def _accumulates(stmt: ast.stmt, name: str) -> bool:
    """``name += v``, ``name = name + v`` (or ``v + name``, ``name - v``)."""
    if isinstance(stmt, ast.AugAssign):
        return isinstance(stmt.target, ast.Name) and stmt.target.id == name \
            and isinstance(stmt.op, (ast.Add, ast.Sub))
    return _assigned(stmt) == name and isinstance(stmt.value, ast.BinOp) \
        and isinstance(stmt.value.op, (ast.Add, ast.Sub)) and name in _loads(stmt.value)


def _stores(node: ast.AST, name: str) -> list[ast.AST]:
    return [n for n in [node, *_scope_walk(node)] if isinstance(n, ast.Name) and n.id == name
            and isinstance(n.ctx, (ast.Store, ast.Del))]


def _backward_in(loop: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"
               for n in _scope_walk(loop))


def _blocks(tree: ast.AST):
    for node in walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def last_pass_sums(tree: ast.AST) -> list[tuple]:
    """``[(line, name, kind, other line, the text of the statement to change, its fix)]`` for each
    ``for`` loop whose body is meant to sum a value over its passes into ``name`` but leaves only
    the last pass's value there, read after the loop:

    * ``"overwritten"``: ``name`` is set to zero before the loop and assigned in the loop's body
      (unconditionally, once) from a value that does not read it (``s = term`` for ``s = s +
      term``); ``other line`` is the zero's.
    * ``"reset"``: the loop's body sets ``name`` to zero and then adds to it (``s = 0`` ...
      ``s += term``); ``other line`` is the addition's.

    Loops with a ``break`` (a search that keeps what it found) or a ``backward`` (each pass is
    used where it is made) and names the loop reads elsewhere are left out."""
    found = []
    for block in _blocks(tree):
        zeros: dict[str, int] = {}
        for stmt in block:
            if isinstance(stmt, ast.For):
                found.extend(_in_loop(stmt, zeros, block))
            name = _assigned(stmt)
            for n in _scope_walk(stmt) if not isinstance(stmt, ast.For) else ():
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    zeros.pop(n.id, None)
            if isinstance(stmt, ast.For):
                for n in [stmt, *_scope_walk(stmt)]:
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                        zeros.pop(n.id, None)
            if name is not None:
                if _zero(stmt.value):
                    zeros[name] = stmt.lineno
                else:
                    zeros.pop(name, None)
    return found


def _in_loop(loop: ast.For, zeros: dict[str, int], block: list):
    if loop.orelse or _backward_in(loop) or any(isinstance(n, ast.Break) for n in _scope_walk(loop)):
        return
    after = block[block.index(loop) + 1:]
    read_after = set().union(*(_loads(s) for s in after)) if after else set()
    target_names = {n.id for n in walk(loop.target) if isinstance(n, ast.Name)}
    for name in read_after - target_names:
        stores = [n for stmt in loop.body for n in _stores(stmt, name)]
        reads = [stmt for stmt in loop.body if name in _loads(stmt)]
        top = [stmt for stmt in loop.body if _assigned(stmt) == name or _accumulates(stmt, name)]
        if name in zeros and len(stores) == 1 and len(top) == 1 and not reads \
                and _assigned(top[0]) == name and not _accumulates(top[0], name):
            stmt = top[0]
            fixed = f"{name} = {name} + {ast.unparse(stmt.value)}"
            yield stmt.lineno, name, "overwritten", zeros[name], ast.unparse(stmt), fixed
            continue
        if len(top) == 2 and len(stores) == 2 and _assigned(top[0]) == name and _zero(top[0].value) \
                and _accumulates(top[1], name) and all(r is top[1] for r in reads):
            yield (top[0].lineno, name, "reset", top[1].lineno, ast.unparse(top[0]),
                   ast.unparse(top[0]))


class SumKeepsLastPass(Rule):
    """
    ## What it does
    Finds a loop meant to sum a loss over its passes — over the layers of a style or perceptual
    loss, the scales of a multi-resolution STFT or pyramid loss, the heads or time steps of a
    model — that leaves only the last pass's value in the sum: the sum is set to zero before the
    loop and assigned in it from the new term alone (`s_loss = F.mse_loss(...)` for `s_loss =
    s_loss + F.mse_loss(...)`), or set to zero inside the loop before each addition. Read from
    the script's source, in the files a backward ran from, for a sum read after the loop into
    that backward's loss; it points at the statement to change.

    ## Why is this bad?
    Every pass but the last computes its term and drops it: a style transfer matches the Gram
    matrix of its last layer only, a multi-scale loss trains at its last scale only, a
    deep-supervision loss reaches only the last head. Nothing fails, the loss is finite and
    falls, and the part of the objective the loop was written for is silently missing from
    every update.

    ## Example
    ```python
    style_loss = 0.0
    for i in style_layers:
        style_loss = F.mse_loss(gram(feats[i]), targets[i])
    loss = content_loss + 1e4 * style_loss
    ```

    ## Use instead
    ```python
    style_loss = 0.0
    for i in style_layers:
        style_loss = style_loss + F.mse_loss(gram(feats[i]), targets[i])
    loss = content_loss + 1e4 * style_loss
    ```

    ## Stays silent on
    A sum written `+=` or `s = s + term`; a value kept from the last pass on purpose that
    was not set to zero (`h = layer(h)`, `out = None`), or assigned under a condition (a search:
    `best = 0` ... `if ...: best = i`), or in a loop with a `break`; a loop whose passes each
    call `backward` (the training loop's own `loss = criterion(...)`); a sum the loop reads
    elsewhere (a recurrence, a list append of each pass); a sum that reaches no backward
    (a running total for the log); loops in other modules. The loop's pass count is not
    known: a loop that runs once holds the same value either way.
    """

    code = "GD361"
    slug = "sum-keeps-last-pass"
    severity = Severity.WARNING
    summary = ("a loss summed over a loop's passes keeps only the last pass: the sum is "
               "overwritten (s = term for s = s + term) or reset to zero inside the loop")
    fix = "add each pass's term to the sum (s = s + term) and set it to zero once, before the loop"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        lines = {(e.loc.path, e.loc.line) for e in backwards if e.loc is not None}
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, name, how, other, text, fixed in last_pass_sums(tree):
                backward = a.source.value_reaches_backward(path, line)
                if backward is None or (path, backward) not in lines:
                    continue
                if how == "overwritten":
                    message = (f"`{name}` is set to zero before this loop, read after it into the "
                               f"loss backpropagated at line {backward}, and assigned here each "
                               f"pass from the new term alone (`{text}`): every pass but the last "
                               f"is dropped, so the loss holds the last pass's term only and what "
                               f"the other passes measure (other layers, scales, heads) never "
                               f"trains anything")
                    related = (Related(Location(path, other), f"`{name}` set to zero here"),)
                    fix = f"add each pass's term to the sum: `{fixed}` (or `{name} += ...`)"
                else:
                    message = (f"`{name}` is set to zero here, inside the loop, before each "
                               f"pass adds to it, and read after the loop into the loss "
                               f"backpropagated at line {backward}: the sum restarts every pass, so "
                               f"the loss holds the last pass's term only and what the other "
                               f"passes measure never trains anything")
                    related = (Related(Location(path, other), "the addition it restarts"),)
                    fix = f"set the sum to zero once, before the loop: move `{fixed}` above the `for`"
                yield self.finding(message, Location(path, line), related=related,
                                   evidence={"name": name, "how": how, "backward_line": backward},
                                   fix=fix)
