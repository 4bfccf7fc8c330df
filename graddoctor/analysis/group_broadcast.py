"""Per-group statistics expanded back to the flat batch in the other layout, read from the
script's source: GRPO's and RLOO's group baselines.

A flat batch of ``n * g`` values (rewards of ``g`` completions for each of ``n`` prompts) is
grouped with a two-dimensional view, ``x.view(-1, g)`` or ``x.view(g, -1)``, reduced over one
axis (``mean``, ``std``, ``sum``, ``max``...) and expanded back to one value per element, to be
subtracted from (or to divide) the flat values. A view is row-major, so element ``i`` of ``x``
sits in row ``i // cols`` and column ``i % cols``: a statistic per row (reduced over axis 1)
lines up with ``x`` when each value is repeated in place, ``repeat_interleave``; a statistic per
column (reduced over axis 0) lines up when the whole vector is tiled, ``repeat``. The other
expansion gives each element the statistic of another group, and nothing fails: the shapes
match whenever the two sizes allow it.
"""

from __future__ import annotations

import ast

from .source import _parse, scope_walk, walk

_REDUCTIONS = frozenset({"mean", "std", "var", "sum", "max", "min", "amax", "amin", "median",
                         "logsumexp", "nanmean", "nansum"})
_VIEWS = frozenset({"view", "reshape"})
_EXPANSIONS = frozenset({"repeat", "repeat_interleave"})


def _text(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover
        return ""


def _method(node: ast.AST, names) -> ast.Call | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names:
        return node
    return None


def _view_base(node: ast.AST, views: dict) -> str | None:
    """The flat tensor's text when ``node`` is a two-dimensional view of it (inline, or a name
    assigned one), else None."""
    if isinstance(node, ast.Name) and node.id in views:
        return views[node.id]
    call = _method(node, _VIEWS)
    if call is None:
        return None
    shape = call.args
    if len(shape) == 1 and isinstance(shape[0], (ast.Tuple, ast.List)):
        shape = shape[0].elts
    if len(shape) != 2 or call.keywords or any(isinstance(s, ast.Starred) for s in shape):
        return None
    base = call.func.value
    if not isinstance(base, (ast.Name, ast.Attribute)):
        return None
    return _text(base)


def _axis(call: ast.Call) -> int | None:
    """The axis (0 or 1 of a two-dimensional view) a reduction call reduces, keepdim left out."""
    dim = call.args[0] if call.args else None
    for k in call.keywords:
        if k.arg in ("dim", "axis"):
            dim = k.value
        elif k.arg == "keepdim" and not (isinstance(k.value, ast.Constant) and k.value.value is False):
            return None
    if len(call.args) > 1:
        return None  # keepdim given by position
    if isinstance(dim, ast.UnaryOp) and isinstance(dim.op, ast.USub) and isinstance(dim.operand, ast.Constant):
        value = -dim.operand.value
    elif isinstance(dim, ast.Constant):
        value = dim.value
    else:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value not in (0, 1, -1, -2):
        return None
    return value % 2


def _reduction(node: ast.AST, views: dict, stats: dict):
    """``(flat text, axis, line)`` when ``node`` is a reduction over one axis of a 2-D view
    (inline, or a name assigned one; ``max``'s ``.values`` and ``[0]`` read through)."""
    if isinstance(node, ast.Name) and node.id in stats:
        return stats[node.id]
    if isinstance(node, ast.Attribute) and node.attr == "values":
        node = node.value
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == 0:
        node = node.value
    call = _method(node, _REDUCTIONS)
    if call is None:
        return None
    base = _view_base(call.func.value, views)
    axis = _axis(call)
    if base is None or axis is None:
        return None
    return base, axis, call.lineno


def _expansion(call: ast.Call) -> str | None:
    """"interleave" or "tile" for a one-dimensional expansion of a vector, else None."""
    name = call.func.attr
    if name == "repeat_interleave":
        if len(call.args) != 1:
            return None
        for k in call.keywords:
            if k.arg == "dim" and not (isinstance(k.value, ast.Constant) and k.value.value in (0, -1)):
                return None
        return "interleave"
    if name == "repeat" and len(call.args) == 1 and not call.keywords \
            and not isinstance(call.args[0], (ast.Tuple, ast.List, ast.Starred)):
        return "tile"
    return None


def _scopes(tree: ast.AST):
    """The module and each function, with the statements of each (nested functions apart)."""
    yield tree
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _own_nodes(scope: ast.AST):
    """The nodes of ``scope`` in source order, nested functions and classes left out."""
    return sorted(scope_walk(scope), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))


def _side_is(node: ast.AST, text: str) -> bool:
    """``node`` is ``text``, or ``text`` plus or minus something (``std + eps``, ``x - mean``),
    parentheses aside."""
    if _text(node) == text:
        return True
    return isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)) \
        and _text(node.left) == text


def _combined_with(nodes, stat: str, flat: str) -> bool:
    """Whether the expanded statistic (the text of the call, or the name it was assigned to)
    meets the flat tensor in a subtraction or a quotient."""
    for node in nodes:
        if not isinstance(node, ast.BinOp) or not isinstance(node.op, (ast.Sub, ast.Div)):
            continue
        if (_side_is(node.left, flat) and _side_is(node.right, stat)) \
                or (_side_is(node.left, stat) and _side_is(node.right, flat)):
            return True
    return False


def misaligned_group_expansions(path: str) -> list[tuple[int, str, int, str, str]]:
    """``(line, flat tensor, reduction line, axis reduced as "rows"/"columns", expansion)`` for
    each statistic of a two-dimensional view of a flat tensor, reduced over one axis, expanded
    back with the expansion of the other layout (a row statistic tiled with ``repeat``, a column
    statistic repeated in place with ``repeat_interleave``) and subtracted from (or dividing)
    that flat tensor in the same function."""
    tree = _parse(path)
    if tree is None:
        return []
    out = []
    seen: set[int] = set()
    for scope in _scopes(tree):
        nodes = _own_nodes(scope)
        views: dict[str, str] = {}
        stats: dict[str, tuple] = {}
        for node in nodes:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                base = _view_base(node.value, {})
                if base is not None:
                    views[name] = base
                else:
                    views.pop(name, None)
                found = _reduction(node.value, views, {})
                expanded = _method(node.value, _EXPANSIONS)
                if found is not None:
                    stats[name] = found
                elif expanded is None:
                    stats.pop(name, None)
            call = _method(node, _EXPANSIONS)
            if call is None or call.lineno in seen:
                continue
            layout = _expansion(call)
            found = _reduction(call.func.value, views, stats)
            if layout is None or found is None:
                continue
            flat, axis, reduced_at = found
            if (axis == 1) == (layout == "interleave"):
                continue  # the layout the view made
            assigned = None
            for other in nodes:
                if isinstance(other, ast.Assign) and other.value is call and len(other.targets) == 1 \
                        and isinstance(other.targets[0], ast.Name):
                    assigned = other.targets[0].id
            if not (_combined_with(nodes, _text(call), flat)
                    or (assigned is not None and _combined_with(nodes, assigned, flat))):
                continue
            seen.add(call.lineno)
            out.append((call.lineno, flat, reduced_at, "rows" if axis == 1 else "columns",
                        call.func.attr))
    return sorted(out)


_PICKS = frozenset({"argmax", "argmin"})


def _pick(node: ast.AST, views: dict) -> str | None:
    """The flat tensor's text when ``node`` picks one position per row of a two-dimensional view
    of it: ``view.argmax(dim=1)``, ``view.max(dim=1).indices`` / ``[1]``, ``view.topk(k,
    dim=1).indices``."""
    if isinstance(node, ast.Attribute) and node.attr == "indices":
        node = node.value
        call = _method(node, frozenset({"max", "min", "topk", "sort"}))
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == 1:
        call = _method(node.value, frozenset({"max", "min", "topk", "sort"}))
    else:
        call = _method(node, _PICKS)
    if call is None:
        return None
    base = _view_base(call.func.value, views)
    if base is None:
        return None
    name = call.func.attr
    args = call.args[1:] if name == "topk" else call.args
    dim = args[0] if args else None
    for k in call.keywords:
        if k.arg in ("dim", "axis"):
            dim = k.value
        elif k.arg == "keepdim":
            return None
    if name == "topk" and dim is None:
        dim = ast.Constant(-1)
    if isinstance(dim, ast.UnaryOp) and isinstance(dim.op, ast.USub) and isinstance(dim.operand, ast.Constant):
        value = -dim.operand.value
    elif isinstance(dim, ast.Constant):
        value = dim.value
    else:
        return None
    if value not in (1, -1) or len(args) > 1:
        return None
    return base


def _sources(name: str, made_from: dict) -> set[str]:
    """The names ``name`` was computed from, through the scope's assignments."""
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        for source in made_from.get(current, ()):
            if source not in seen:
                seen.add(source)
                todo.append(source)
    return seen


def group_indices_used_flat(path: str) -> list[tuple[int, str, str, int]]:
    """``(line, index name, flat tensor indexed, line indexed)`` for each position picked per
    row of a two-dimensional view of a flat tensor (``scores.view(B, N).argmax(1)``: a column
    number in ``[0, N)``), assigned to a name that then indexes the rows of a flat tensor
    (``seq[best]``) with no row offset added: every row's pick lands in the first group. The
indexed tensor is a batch of groups: it (or a name it was computed from, through the scope's
assignments) was made with ``repeat_interleave``/``repeat``; a table of the group's own size
(shared candidates) is left out."""
    tree = _parse(path)
    if tree is None:
        return []
    out = []
    for scope in _scopes(tree):
        nodes = _own_nodes(scope)
        views: dict[str, str] = {}
        picks: dict[str, tuple[int, str]] = {}  # name -> (line, flat text)
        made_from: dict[str, set[str]] = {}  # name -> the names its assignments read
        grouped_rows: set[str] = set()  # names assigned from a repeat / repeat_interleave
        for node in nodes:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                made_from.setdefault(name, set()).update(
                    n.id for n in walk(node.value) if isinstance(n, ast.Name))
                if any(_method(n, _EXPANSIONS) is not None for n in walk(node.value)):
                    grouped_rows.add(name)
                base = _view_base(node.value, {})
                if base is not None:
                    views[name] = base
                else:
                    views.pop(name, None)
                flat = _pick(node.value, views)
                if flat is not None:
                    picks[name] = (node.lineno, flat)
                else:
                    picks.pop(name, None)
                continue
            if not isinstance(node, ast.Subscript) or not isinstance(node.slice, ast.Name) \
                    or node.slice.id not in picks or not isinstance(node.value, (ast.Name, ast.Attribute)):
                continue
            indexed = _text(node.value)
            if indexed in views:
                continue  # a row of the grouped view itself
            line, flat = picks[node.slice.id]
            if not ({indexed} | _sources(indexed, made_from)) & grouped_rows:
                continue  # no batch of groups made by repetition: a table of the group's size
            out.append((line, node.slice.id, indexed, node.lineno))
    return sorted(set(out))
