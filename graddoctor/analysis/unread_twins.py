"""Values computed beside a twin that nothing reads, while the twin is read in their place, read
from the script's source: a piece of a split (``logits_u_w, logits_u_s = logits.chunk(2)``),
one slice of a pair (``xs, xq = x[:k], x[k:]``) or the transformed copy of a batch
(``x_adv = attack(model, x, y)``) that the code after it never reads, or a piece overwritten from
its twin before anything read it (``end = start.masked_fill(...)`` right after
``start, end = logits.unbind(-1)``).

Only the bodies of loops that call ``.backward()`` and of ``forward`` methods are read: the code
that builds what a step trains on."""

from __future__ import annotations

import ast
import linecache
import re

from .source import _parse, walk

# calls that cut one tensor into pieces of one kind
_SPLITTING = frozenset({"chunk", "split", "unbind", "tensor_split", "hsplit", "vsplit", "dsplit"})
# reads that take no gradient (logged, a detached target) or only a shape: not "in place of"
_SIDE_READS = frozenset({"detach", "item", "size", "dim", "numel", "tolist", "cpu", "numpy",
                         "argmax", "argmin", "shape", "device", "dtype", "len", "print", "isinstance"})
_SKIP = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _called(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return None


def _statements(body) -> list[ast.stmt]:
    """The simple statements of a body in source order, the bodies of its ``if``/``with``/
    ``try``/loops included (nested functions and classes left out)."""
    out: list[ast.stmt] = []
    for s in body:
        if isinstance(s, _SKIP):
            continue
        nested = [getattr(s, f, None) for f in ("body", "orelse", "finalbody")]
        nested += [h.body for h in getattr(s, "handlers", ())]
        if isinstance(s, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
            out.append(s)  # its header (test, iterable, items) is read before its body
            for part in nested:
                if part:
                    out.extend(_statements(part))
        else:
            out.append(s)
    return out


def _header(s: ast.stmt) -> list[ast.AST]:
    """What a compound statement itself evaluates (its body is listed on its own)."""
    if isinstance(s, (ast.If, ast.While)):
        return [s.test]
    if isinstance(s, ast.For):
        return [s.iter, s.target]
    if isinstance(s, ast.With):
        return [i.context_expr for i in s.items] + [i.optional_vars for i in s.items if i.optional_vars]
    if isinstance(s, ast.Try):
        return []
    return [s]


def _loads(s: ast.stmt) -> set[str]:
    return {n.id for part in _header(s) for n in walk(part)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _stores(s: ast.stmt) -> set[str]:
    return {n.id for part in _header(s) for n in walk(part)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _argument_reads(s: ast.stmt, name: str) -> bool:
    """Whether ``s`` hands ``name`` to a call as (part of) an argument, with its gradient: not
    through a detaching or shape-only method, not as the function called."""
    if not isinstance(s, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return)):
        return False  # a bare call logs, stores or prints; a header only tests
    side: set[int] = set()
    for n in walk(s):
        if isinstance(n, ast.Call):
            if _called(n) in _SIDE_READS:
                side.update(id(m) for m in walk(n))
        if isinstance(n, ast.Attribute) and n.attr in _SIDE_READS:
            side.update(id(m) for m in walk(n))
    for n in walk(s):
        if not isinstance(n, ast.Call):
            continue
        for arg in list(n.args) + [k.value for k in n.keywords]:
            for m in walk(arg):
                if isinstance(m, ast.Name) and m.id == name and isinstance(m.ctx, ast.Load) \
                        and id(m) not in side:
                    return True
    return False


def _parts(name: str) -> list[str]:
    return [p for p in re.split(r"[_\d]+", name.lower()) if p]


def _kin(dead: str, twin: str) -> bool:
    """Names of one kind of value: a part of one starts a part of the other (``x_adv``/``xb``,
    ``inputs_aug``/``inputs``)."""
    return any(a.startswith(b) or b.startswith(a) for a in _parts(dead) for b in _parts(twin))


# namespaces of library functions: their repeated calls (``torch.randn_like``, ``F.normalize``)
# make values of any kind, not twins
_LIBRARIES = frozenset({"torch", "F", "nn", "np", "numpy", "math", "random", "time", "os", "functional"})


def _callee(call: ast.Call) -> str | None:
    """The callee's last name (``weak_aug``, ``encoder``), None for a library function."""
    func = call.func
    if isinstance(func, ast.Attribute):
        root = func
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in _LIBRARIES:
            return None
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def _unpacked_twins(s: ast.Assign, names: list[str]) -> dict[str, list[str]]:
    """For an unpacking of pieces of one kind, each target's twins (the other targets made
    alike); empty when the pieces are of different kinds."""
    value = s.value
    if _called(value) in _SPLITTING:
        return {n: [m for m in names if m != n] for n in names}
    if isinstance(value, ast.Tuple) and len(value.elts) == len(names):
        keys = []
        for e in value.elts:
            if isinstance(e, ast.Subscript) and not isinstance(e.slice, ast.Constant):
                # slices or elements of one array (``x[:k]``, ``x[k:]``, ``grid[n + 1]``);
                # ``batch[0]``, ``batch["y"]`` pick fields of different kinds
                keys.append(("slice", ast.unparse(e.value), None))
            elif isinstance(e, ast.Call) and e.args and _callee(e) is not None:
                keys.append(("call", ast.unparse(e.args[0]), _callee(e)))
            else:
                keys.append(None)

        def alike(k, k2):
            return k2 is not None and k2[:2] == k[:2] and (k[2] is None or _kin(k[2], k2[2]))

        return {n: [m for m, k2 in zip(names, keys) if m != n and alike(k, k2)]
                for n, k in zip(names, keys) if k is not None}
    return {}


def _calls_backward(statements) -> bool:
    return any(_called(n) == "backward" for s in statements for n in walk(s)
               if not isinstance(s, (ast.If, ast.For, ast.While, ast.With, ast.Try)))


def _scopes(tree: ast.AST):
    """(statements, kind, owner) of each body read: the innermost loop that calls
    ``.backward()``, a function that calls it outside any loop (a step function), a ``forward``
    method; ``owner`` the function (or module) holding it."""
    owners = [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for owner in owners:
        stack = [(s, owner) for s in (owner.body if owner is not tree else tree.body)]
        if owner is not tree and owner.name == "forward":
            yield _statements(owner.body), "forward", owner
        elif owner is not tree and _calls_backward([s for s in owner.body
                                                    if not isinstance(s, (ast.For, ast.While))]):
            yield _statements(owner.body), "loop", owner
        while stack:
            node, _ = stack.pop()
            if isinstance(node, _SKIP):
                continue
            if isinstance(node, (ast.For, ast.While)):
                body = _statements(node.body)
                nested = any(isinstance(s, (ast.For, ast.While)) and _calls_backward(_statements(s.body))
                             for s in body)
                if _calls_backward(body) and not nested:
                    yield body, "loop", owner
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    stack.append((child, owner))


def _owner_loads(owner: ast.AST) -> set[str]:
    """Every name the owner reads, in nested functions too (a module's functions only where
    they do not bind the name themselves)."""
    if not isinstance(owner, ast.Module):
        return {n.id for n in walk(owner) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    loads: set[str] = set()
    for n in walk(owner):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            loads.add(n.id)
    for f in walk(owner):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            local = {n.id for n in walk(f) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            local |= {a.arg for a in walk(f.args) if isinstance(a, ast.arg)}
            inside = {n.id for n in walk(f) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            outside = {n.id for n in walk(owner) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                       and not _within(n, f)}
            loads -= (inside & local) - outside
    return loads


def _within(node: ast.AST, outer: ast.AST) -> bool:
    line = getattr(node, "lineno", None)
    return line is not None and outer.lineno <= line <= (outer.end_lineno or outer.lineno)


def unread_twins(path: str) -> list[dict]:
    """Per value nothing reads while its twin is read in its place: ``{"line", "text", "name",
    "twin", "dead_line", "dead_text", "how"}``; ``line`` the statement that reads the twin
    where the value was meant (or rebinds the value from its twin), ``dead_line`` the one that
    made the value; ``how`` "unread" or "overwritten"."""
    tree = _parse(path)
    if tree is None:
        return []
    text = "".join(linecache.getlines(path))

    def shown(node: ast.stmt) -> str:
        try:
            segment = ast.get_source_segment(text, node)
        except Exception:
            segment = None
        return " ".join(segment.split()) if segment else ast.unparse(node)

    functions = {n.name for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found, seen = [], set()
    owner_reads: dict[int, set[str]] = {}
    for body, where, owner in _scopes(tree):
        if id(owner) not in owner_reads:
            owner_reads[id(owner)] = _owner_loads(owner)
        all_loads = owner_reads[id(owner)]
        for i, s in enumerate(body):
            if not isinstance(s, ast.Assign) or len(s.targets) != 1:
                continue
            target = s.targets[0]
            if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
                names = [e.id for e in target.elts]
                twins = _unpacked_twins(s, names)
            elif isinstance(target, ast.Name) and isinstance(s.value, ast.Call) and where == "loop":
                # (a module output a forward drops is discarded-module-output's, seen at run time)
                names = [target.id]
                # the same callee on other arguments, bound to another name in this body
                kin = [t.targets[0].id for t in body if t is not s and isinstance(t, ast.Assign)
                       and len(t.targets) == 1 and isinstance(t.targets[0], ast.Name)
                       and t.targets[0].id != target.id and isinstance(t.value, ast.Call)
                       and ast.dump(t.value.func) == ast.dump(s.value.func)
                       and [ast.dump(a) for a in t.value.args] != [ast.dump(a) for a in s.value.args]
                       and _called(t.value) not in _SIDE_READS and _callee(t.value) is not None]
                if isinstance(s.value.func, ast.Name) and s.value.func.id in functions:
                    # a script function's copy of a batch it is given (``x_adv = attack(model, x, y)``)
                    kin += [a.id for a in s.value.args if isinstance(a, ast.Name) and _kin(target.id, a.id)]
                twins = {target.id: kin}
            else:
                continue
            for name, kin in twins.items():
                if name.startswith("_") or not kin or (s.lineno, name) in seen:
                    continue
                later = body[i + 1:]
                hit = None
                for s2 in later:
                    loads, stores = _loads(s2), _stores(s2)
                    if name in loads:
                        break
                    reading = [t for t in kin if _argument_reads(s2, t)]
                    if name in stores:
                        # rebound from a twin before anything read it: the twin copied in its place
                        if isinstance(s2, ast.Assign) and any(t in loads for t in kin):
                            hit = (s2, next(t for t in kin if t in loads), "overwritten")
                        break
                    if reading and hit is None and name not in all_loads:
                        hit = (s2, reading[0], "unread")
                if hit is None:
                    continue
                if hit[2] == "unread" and name in all_loads:
                    continue
                s2, twin, how = hit
                seen.add((s.lineno, name))
                found.append({"line": s2.lineno, "text": shown(s2), "name": name,
                              "twin": twin, "dead_line": s.lineno, "dead_text": shown(s),
                              "how": how})
    return sorted(found, key=lambda f: (f["line"], f["dead_line"], f["name"]))
