from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from ..analysis.source import scope_walk as _scope_walk
from .base import Related, Rule
from ..analysis.source import walk

# how scripts name the value a recurrence starts from, around the state's own name
_SUFFIXES = ("0", "_0", "_init", "init", "_initial", "_start", "_begin", "_first")
_PREFIXES = ("init_", "initial_", "start_", "first_")
# a call whose name says it draws something new each time: each pass differs on purpose
_RANDOM = ("rand", "normal", "uniform", "bernoulli", "multinomial", "dropout", "noise",
           "sample", "shuffle", "choice", "perm", "jitter", "augment")


def _starts_from(state: str, source: str) -> bool:
    """Whether ``source`` is named as the value ``state`` starts from (``x0``, ``h_init``,
    ``initial_state``)."""
    if source == state:
        return False
    if source.startswith(state) and source[len(state):] in _SUFFIXES:
        return True
    return source.endswith(state) and source[:-len(state)] in _PREFIXES


def _bound(loop: ast.For | ast.While) -> dict[str, list[ast.AST]]:
    """Each name the loop binds (its target, assignments, augmented assignments, ``with ...
    as``, inner loops' targets, walrus) -> the binding nodes."""
    bound: dict[str, list[ast.AST]] = {}
    roots = [loop.target] if isinstance(loop, ast.For) else []
    for root in roots:
        for n in walk(root):
            if isinstance(n, ast.Name):
                bound.setdefault(n.id, []).append(loop)
    for stmt in loop.body:
        for n in [stmt, *_scope_walk(stmt)]:
            if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                bound.setdefault(n.id, []).append(n)
    return bound


def _loads(node: ast.AST) -> list[ast.Name]:
    return [n for n in [node, *_scope_walk(node)] if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]


def _call_name(call: ast.Call) -> str:
    func = call.func
    return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")).lower()


def _steps_from(value: ast.AST, source: str) -> bool:
    """Whether ``value`` hands ``source`` to a call as one of its arguments (``step(f, x0)``,
    ``x0 + dt * f(x0)``), and draws nothing random."""
    calls = [n for n in [value, *_scope_walk(value)] if isinstance(n, ast.Call)]
    if any(any(word in _call_name(c) for word in _RANDOM) for c in calls):
        return False
    return any(isinstance(arg, ast.Name) and arg.id == source
               for c in calls for arg in [*c.args, *(kw.value for kw in c.keywords)])


def _blocks(tree: ast.AST):
    """Every statement list of the file (module, function and compound statement bodies)."""
    for node in walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block
        for handler in getattr(node, "handlers", ()) or ():
            yield handler.body


def stale_recurrences(tree: ast.AST) -> list[tuple[int, str, str, int, str]]:
    """``[(line of the assignment in the loop, the state's name, the name it starts from, line
    where it starts, the assignment's value as it should read)]`` for each loop that reassigns
    a state from the value it started from instead of from itself.

    The state is set from a name before the loop (``x = x0``) and assigned once in the loop by
    a call given that starting value (``x = step(f, x0, dt)``), whose value reads nothing the
    loop changes and nothing the loop read of the state before; so every pass computes the
    same value and the state never advances."""
    found = []
    for block in _blocks(tree):
        starts: dict[str, tuple[str, int]] = {}
        for stmt in block:
            if isinstance(stmt, (ast.For, ast.While)):
                found.extend(_stale_in(stmt, starts))
            for n in [stmt, *_scope_walk(stmt)]:
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    starts.pop(n.id, None)  # rebound after its start: a different value
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name) and isinstance(stmt.value, ast.Name)):
                starts[stmt.targets[0].id] = (stmt.value.id, stmt.lineno)
    return found


def _stale_in(loop, starts: dict[str, tuple[str, int]]):
    bound = _bound(loop)
    for state, (source, start_line) in starts.items():
        if not _starts_from(state, source) or source in bound:
            continue
        binds = bound.get(state, ())
        if len(binds) != 1:
            continue
        assign = next((n for stmt in loop.body for n in [stmt, *_scope_walk(stmt)]
                       if isinstance(n, ast.Assign) and len(n.targets) == 1
                       and n.targets[0] is binds[0]), None)
        if assign is None:
            continue
        incremental = _increment_on_start(assign, source, state, loop)
        if not (incremental or _steps_from(assign.value, source)):
            continue
        names = {n.id for n in _loads(assign.value)}
        if state in names:
            continue  # reads itself
        read_before = any(n.id == state and n.lineno <= assign.lineno
                          for stmt in loop.body for n in _loads(stmt))
        if names & set(bound) or read_before:
            # the increment changes each pass: stale only when it is worked out from the state
            # the loop carries and then added to the start (an RK step's stages from `y`, the
            # update from `y0`)
            if not incremental:
                continue
        elif isinstance(loop, ast.While) and state in {n.id for n in _loads(loop.test)}:
            continue
        fixed = _Rename(source, state).visit(ast.parse(ast.unparse(assign.value), mode="eval"))
        yield assign.lineno, state, source, start_line, f"{state} = {ast.unparse(fixed.body)}"


def _increment_on_start(assign: ast.Assign, source: str, state: str, loop) -> bool:
    """Whether ``assign`` adds to the starting value (``y = y0 + h * (k1 + ...)``, the start
    the leftmost term of a sum) an increment read from names the loop computed from the state
    before it, draws nothing, and the loop collects the state each pass (``ys.append(y)``): a
    trajectory of states, not a fixed-point iteration around the start."""
    left = assign.value
    if not (isinstance(left, ast.BinOp) and isinstance(left.op, (ast.Add, ast.Sub))):
        return False
    while isinstance(left, ast.BinOp) and isinstance(left.op, (ast.Add, ast.Sub)):
        left = left.left
    if not (isinstance(left, ast.Name) and left.id == source):
        return False
    calls = [n for n in [assign.value, *_scope_walk(assign.value)] if isinstance(n, ast.Call)]
    if any(any(word in _call_name(c) for word in _RANDOM) for c in calls):
        return False
    derived = {state}
    for stmt in loop.body:
        for n in [stmt, *_scope_walk(stmt)]:
            if (isinstance(n, ast.Assign) and n.lineno < assign.lineno
                    and {m.id for m in _loads(n.value)} & derived):
                derived |= {t.id for tgt in n.targets for t in walk(tgt) if isinstance(t, ast.Name)}
    if not ({n.id for n in _loads(assign.value)} & (derived - {state})):
        return False
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "append"
               and any(isinstance(a, ast.Name) and a.id == state for a in n.args)
               for stmt in loop.body for n in [stmt, *_scope_walk(stmt)])


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node):
        return ast.Name(self.new, node.ctx) if node.id == self.old else node


def restarted_rollout(tree: ast.AST) -> tuple[int, str, str, str] | None:
    """``(line, text, name, fixed)`` of the one statement ``name = f(arg)`` written straight in a
    loop's body whose ``name`` is assigned before that loop in the same block (a rollout's
    state: ``state = x``) while the call reads another name than ``name`` (the initial input,
    again at every step), ``fixed`` the statement reading ``name`` instead; None when no
    statement or several fit."""
    found = []
    for block_owner in walk(tree):
        for field in ("body", "orelse"):
            block = getattr(block_owner, field, None)
            if not isinstance(block, list):
                continue
            for index, loop in enumerate(block):
                if not isinstance(loop, (ast.For, ast.While)):
                    continue
                before = {t.id for stmt in block[:index] if isinstance(stmt, ast.Assign)
                          for t in stmt.targets if isinstance(t, ast.Name)}
                for stmt in loop.body:
                    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                            and isinstance(stmt.targets[0], ast.Name) and isinstance(stmt.value, ast.Call)
                            and len(stmt.value.args) == 1 and isinstance(stmt.value.args[0], ast.Name)):
                        continue
                    name, arg = stmt.targets[0].id, stmt.value.args[0].id
                    read = {n.id for n in walk(stmt.value) if isinstance(n, ast.Name)}
                    if name in before and name not in read and arg not in _bound_in(loop.body):
                        call = stmt.value
                        fixed = f"{name} = " + ast.unparse(ast.Call(
                            func=call.func, args=[ast.Name(name)], keywords=call.keywords))
                        found.append((stmt.lineno, ast.unparse(stmt), name, fixed))
    return found[0] if len(found) == 1 else None


def _bound_in(statements) -> set:
    """Names the statements bind (assignments, loop targets), nested ones included."""
    return {n.id for stmt in statements for n in walk(stmt) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Store)}




class RecurrenceNeverCarried(Rule):
    """
    ## What it does
    Finds a loop meant to carry a state from one pass to the next — the state set from its
    starting value before the loop (`x = x0`, `h = h_init`, `state = initial_state`) — whose
    only assignment in the loop hands the starting value to the step instead of the state
    (`x = rk4_step(f, x0, dt)`, `z = z0 + dt * f(z0)`), reading nothing else the loop changes;
    or adds to the starting value an increment the loop worked out from the state
    (`k1 = f(y)` ... `y = y0 + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)`) while collecting the state
    each pass (`ys.append(y)`).
    Read from the script's source, in the files a backward ran from; it points at the
    assignment in the loop. Also seen in the loss's graph, whatever the names: predictions
    equal to the last bit (the model called again on identical inputs) each compared by one
    difference or loss function with a different target, at two backwards — an unrolled
    rollout whose step reads the initial input again (`state = x` before the loop, `state =
    model(x)` in it instead of `state = model(state)`), pointed at that statement when the
    source shows one.

    ## Why is this bad?
    Every pass takes its step from the initial state, so the state never advances: a
    hand-written ODE solver returns the first step `n` times, an unrolled recurrence repeats
    its first output, a rollout compared with a trajectory trains the vector field to jump from
    the start to each later point in one step. Nothing fails, the shapes are right, and the
    loss still falls a little, toward the wrong model.

    ## Example
    ```python
    x, xs = x0, [x0]
    for _ in range(n_steps):
        x = rk4_step(f, x0, dt)
        xs.append(x)
    ```

    ## Use instead
    ```python
    x, xs = x0, [x0]
    for _ in range(n_steps):
        x = rk4_step(f, x, dt)
        xs.append(x)
    ```

    ## Stays silent on
    A step that reads the state (`x = step(x)`, semi-implicit updates reading the new
    momentum); a value that changes with the loop (`lr = lr0 * gamma ** epoch`, a closed-form
    solution at each time `t`, `h = cell(x[t], h0)` is not judged); a start value the loop
    itself updates; a draw that differs each pass (`x = x0 + sigma * torch.randn_like(x0)`,
    random restarts); a start value passed beside the state (`f(x, x0)`, an augmented ODE);
    a fixed-point (Picard) iteration of an implicit step (`x = x0 + h * f(x)` iterated, the
    iterates not collected); a drift added to the start at each time (`x = x0 + v * t`);
    a state set from an expression or an attribute before the loop; loops in other modules;
    a rollout fed the previous prediction, detached or not (the pushforward trick), or the
    true state (teacher forcing); a model called twice on one input for two terms of
    different forms (a loss and a penalty).
    """

    code = "GD344"
    slug = "recurrence-never-carried"
    severity = Severity.WARNING
    summary = ("a loop that should carry a state from pass to pass (x = x0; x = step(x0)) steps "
               "from the starting value every time: the state never advances")
    fix = "give the step the state itself: x = step(x), not step(x0)"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, state, source, start_line, fixed in stale_recurrences(tree):
                yield self.finding(
                    f"`{state}` starts as `{source}` before this loop and is reassigned here each "
                    f"pass from `{source}`, never from its own last value: every pass takes its "
                    f"step from the starting value, so `{state}` never gets more than one step "
                    f"away from it and whatever is built from it (a rollout, an unrolled state) "
                    f"is a set of one-step jumps",
                    Location(path, line),
                    related=(Related(Location(path, start_line), f"`{state}` set to `{source}` here"),),
                    evidence={"state": state, "start": source, "start_line": start_line},
                    fix=f"step from the state itself: `{fixed}`")
        yield from self._repeated(a)

    def _repeated(self, a):
        """Seen in the loss's graph (``same_compared``, how "repeated"): predictions equal to
        the last bit, each compared with a different target by one difference or loss
        function — a rollout whose every step reads the initial input again."""
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        told: set = set()
        for e in a.of_kind("same_compared"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if e.get("how") != "repeated" or not pids or e.loc is None:
                continue
            tree = a.source.tree(e.loc.path)
            found = restarted_rollout(tree) if tree is not None else None
            if found is not None and any(line == found[0] for line, *_ in stale_recurrences(tree)):
                continue  # told above, from the source alone
            loc, related = e.loc, ()
            if found is not None:
                loc = Location(e.loc.path, found[0])
                related = (Related(e.loc, "the backward of that loss"),)
            if (loc.path, loc.line) in told:
                continue
            told.add((loc.path, loc.line))
            where = f" (`{found[1]}`, here, never reads `{found[2]}`)" if found else ""
            yield self.finding(
                f"the loss compares predictions that are equal to the last bit (two calls of "
                f"{a.names(pids)} on identical inputs) each with a different target by a "
                f"{e.get('op') or 'difference'}{where}: an unrolled rollout whose every step "
                f"predicts from the initial input again instead of from the previous step's "
                f"prediction, so the later steps' targets are asked of the one-step prediction "
                f"and the model never learns to roll out from its own outputs",
                loc, related=related,
                evidence={"how": "repeated", "op": e.get("op"), "params": pids[:16]},
                fix=(f"feed each step the previous step's prediction: `{found[3]}`" if found else
                     "feed each step of the rollout the previous step's prediction, not the "
                     "initial input"))
