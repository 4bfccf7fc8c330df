from __future__ import annotations

import ast

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_HOW = {"copy_": "copy_()", "lerp_": "lerp_()", "set_": "set_()", ".data =": "the .data assignment"}


def _write_source(stmt: ast.AST, how: str) -> ast.AST | None:
    """The expression a line's write takes its source from: the value of ``x.data = v``, the
    first argument of ``x.copy_(v)`` / ``x.lerp_(v, w)`` / ``x.set_(v)``."""
    for node in walk(stmt):
        if how == ".data =" and isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == "data" for t in node.targets):
            return node.value
        if how != ".data =" and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == how:
            if node.args:
                return node.args[0]
            for kw in node.keywords:
                if kw.arg in ("src", "end", "source"):
                    return kw.value
    return None


def _statement(tree: ast.AST, line: int):
    best = None
    for node in walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                   ast.ClassDef, ast.For, ast.While,
                                                                   ast.If, ast.With, ast.Try)) \
                and node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is None or node.lineno >= best.lineno:
                best = node
    return best


def _function(tree: ast.AST, line: int):
    best = None
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is None or node.lineno >= best.lineno:
                best = node
    return best


def _key(target: ast.AST) -> str | None:
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    if isinstance(target, ast.Subscript):
        index = target.slice
        if isinstance(index, ast.Constant) and isinstance(index.value, str):
            return index.value
        return _key(target.value)
    return None


def _view(node: ast.AST, bare: bool) -> bool:
    """``p.data`` / ``p.detach()`` of a name (not of a ``.grad``), or the name itself when
    ``bare`` (an element of a comprehension over parameters)."""
    if isinstance(node, ast.Attribute) and node.attr == "data":
        inner = node.value
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == "detach" and not node.args:
        inner = node.func.value
    else:
        return bare and isinstance(node, ast.Name)
    return isinstance(inner, (ast.Name, ast.Subscript)) or \
        isinstance(inner, ast.Attribute) and inner.attr != "grad"


def _uncopied(value: ast.AST) -> bool:
    """A value holding parameters' memory without a copy: ``p.data``, ``p.detach()``, or a
    comprehension (nested, or inside ``list()``/``dict()``) of those or of the parameters
    themselves."""
    bare = False
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
            and value.func.id in ("list", "dict", "tuple") and len(value.args) == 1 \
            and isinstance(value.args[0], ast.Call) and isinstance(value.args[0].func, ast.Attribute) \
            and value.args[0].func.attr in ("parameters", "named_parameters"):
        return True  # list(model.parameters()): the parameter objects themselves
    while True:
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
                and value.func.id in ("list", "dict", "tuple") and len(value.args) == 1:
            value = value.args[0]
        elif isinstance(value, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            value, bare = value.elt, True
        elif isinstance(value, ast.DictComp):
            value, bare = value.value, True
        else:
            break
    return _view(value, bare)


def store_lines(tree: ast.AST, write_line: int) -> list[tuple[int, str]]:
    """The assignments that store a weight copy without copying it, under a name (attribute,
    string key) that the function around the write at ``write_line`` reads: ``[(line, name)]``."""
    scope = _function(tree, write_line) or tree
    read: set[str] = set()
    for node in walk(scope):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            read.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            read.add(node.attr)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            read.add(node.slice.value)
    found = []
    for node in walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and node.lineno != write_line \
                and _uncopied(node.value):
            key = _key(node.targets[0])
            if key is not None and key in read and key != "data":
                found.append((node.lineno, key))
    return sorted(set(found))


class WeightCopyAliasesParams(Rule):
    """
    ## What it does
    Finds a weight copy that is no copy, written back onto the parameters it was taken from:
    Lookahead's slow weights, SAM's saved weights, a best-weights or EMA/SWA copy kept as
    `p.data`, `p.detach()` or the parameter itself (no `clone()`). In the first optimizer steps
    the script's own `copy_()`, `set_()` and `.data =` writes into a stepped
    parameter are watched: a source that is that parameter's own memory (the same object, or the
    same address, shape and strides) writes the weights onto themselves. It points at the
    assignment that stored the copy when the script has one (an uncopied `p.data`/`p.detach()`,
    or a comprehension of them, under a name the writing function reads), else at the write.

    ## Why is this bad?
    The copy shares the parameters' memory, so every in-place update (the optimizer's step,
    SAM's ascent `p.add_(e)`) moved it too: restoring it restores nothing. Lookahead never pulls
    the fast weights back to its slow weights (it is the inner optimizer alone); SAM's base step
    starts from the perturbed weights `w + e`, which drift by `e` at every update; early
    stopping's "best" weights are the last ones. Nothing fails.

    ## Example
    ```python
    self.slow = [[p.data for p in g["params"]] for g in self.param_groups]
    ...
    q.add_(p.data - q, alpha=self.alpha)
    p.data.copy_(q)                     # copies p onto itself
    ```

    ## Use instead
    ```python
    self.slow = [[p.detach().clone() for p in g["params"]] for g in self.param_groups]
    ```

    ## Stays silent on
    Copies made with `clone()` / `copy.deepcopy` / `torch.save`; an in-place operator on the
    weights' `.data` (`self.weight.data *= self.mask`, a masked convolution's mask applied at each
    forward: Python stores the result back through `.data =`, but nothing is restored); weights tied through `.data`
    (a memory two parameters share), tied again at every forward; `p.data = p.data.to(device)`
    and other conversions that return their input when there is nothing to convert; writes
    from library code (`load_state_dict` onto itself is state-loaded-into-itself's). Not seen:
    a write after the first 12 optimizer steps (a restore only at the end of training), writes
    through indexing (`p[:] = q`), a restore by `lerp_(fast, 1.0)` (not watched: torch's Adam
    calls `lerp_` once per parameter).
    """

    code = "GD283"
    slug = "weight-copy-aliases-params"
    severity = Severity.WARNING
    summary = ("a weight copy kept without clone() (Lookahead's slow weights, SAM's saved weights, "
               "a best-weights copy) is written back onto its parameter: it is the parameter's own "
               "memory, so the restore changes nothing")
    fix = "take the copy with p.detach().clone() (or copy.deepcopy), not p, p.data or p.detach()"

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        told: dict = {}  # the line reported -> (event, pids, the write's location)
        for e in a.of_kind("self_copy"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids or e.loc is None:
                continue
            how = e.get("how") or "copy_"
            tree = a.source.tree(e.loc.path)
            loc, name = e.loc, None
            if tree is not None:
                stmt = _statement(tree, e.loc.line)
                if how == ".data =" and isinstance(stmt, ast.AugAssign):
                    continue  # p.data *= mask: an in-place op on the weights (PixelCNN's mask), no copy
                source = _write_source(stmt, how) if stmt is not None else None
                if isinstance(source, ast.Call):
                    continue  # p.data = p.data.to(device): a conversion with nothing to do
                stores = store_lines(tree, e.loc.line)
                if len(stores) == 1:
                    loc, name = Location(e.loc.path, stores[0][0]), stores[0][1]
            key = (loc.path, loc.line)
            if key in told:
                told[key][1].extend(p for p in pids if p not in told[key][1])
                continue
            told[key] = (e, list(pids), name)
        for key, (e, pids, name) in told.items():
            loc = Location(*key)
            how = _HOW.get(e.get("how"), "this write")
            stored = (f"`{name}` is stored here as the parameters' own memory (p.data, p.detach() "
                      f"or the parameter, no clone()), and {how} at line {e.loc.line} writes it "
                      f"back" if name else
                      f"{how} here writes a copy that is the parameters' own memory (taken as "
                      f"p.data, p.detach() or the parameter, no clone())")
            related = () if loc == e.loc else (Related(e.loc, "the write that copies the weights onto themselves"),)
            yield self.finding(
                f"{stored}: it copies {a.names(pids)} onto itself. The copy moved with every "
                f"in-place update (the optimizer's step, an ascent p.add_(e)), so the restore "
                f"changes nothing: Lookahead never steps back to its slow weights, SAM's step "
                f"starts from the perturbed weights, a restored best model is the last one",
                loc, step=a.next_step_number(e.seq), related=related,
                evidence={"params": pids[:16], "how": e.get("how")},
                fix=("take the copy with `p.detach().clone()` (or copy.deepcopy of the model) "
                     "when it is stored, not `p`, `p.data` or `p.detach()`"))
