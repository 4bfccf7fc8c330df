from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from ..analysis.source import scope_walk as _nested
from .base import Related, Rule
from ..analysis.source import walk

# names of a flag that ends an episode or a rollout
_EPISODE_FLAG = re.compile(r"(^|_)(done|dones|terminal|terminated|truncated|finished|over|ended|end)$", re.I)


def _assigns(nodes, name: str) -> bool:
    for n in nodes:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(
            n, (ast.AugAssign, ast.AnnAssign, ast.For, ast.NamedExpr)) else []
        for t in targets:
            if any(isinstance(x, ast.Name) and x.id == name for x in walk(t)):
                return True
    return False


def _bool_constants(stmt: ast.AST) -> list[tuple[str, bool]]:
    """The names a statement sets to True or False: ``done = False``, ``terminated, truncated =
    False, False``; empty for any other statement."""
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return []
    target, value = stmt.targets[0], stmt.value
    pairs = [(target, value)]
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
        pairs = list(zip(target.elts, value.elts))
    if not all(isinstance(t, ast.Name) and isinstance(v, ast.Constant) and isinstance(v.value, bool)
               for t, v in pairs):
        return []
    return [(t.id, v.value) for t, v in pairs]


def _runs_while(test: ast.AST, values: dict) -> str | None:
    """The flag of ``while not flag`` (flag set False) or ``while flag`` (set True), else None."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Name):
        name = test.operand.id
        return name if values.get(name) is False else None
    if isinstance(test, ast.Name):
        return test.id if values.get(test.id) is True else None
    return None


def flags_never_reset(tree: ast.AST) -> list[tuple[int, str, int, int]]:
    """``(line of the flag's one setting, flag, line of the inner loop, line of the outer loop)``
    for each episode loop ``while not done:`` inside an outer loop (episodes, epochs) whose flag
    (``done``, ``terminated``, ``finished``...) is set once, before the outer loop (or once at the
    module's top level, for a function that declares it ``global``), set again
    inside the inner loop (the episode ends it), and never set back by the outer loop: from the
    outer loop's second pass on the inner loop never runs."""
    module = tree.body if isinstance(tree, ast.Module) else []
    # flags the module sets once, to a constant, at its top level: what a function that
    # declares them ``global`` starts from
    settings: dict = {}
    for stmt in module:
        for name, value in _bool_constants(stmt):
            settings.setdefault(name, []).append((value, stmt.lineno))
    top = {name: found[0] for name, found in settings.items()
           if len(found) == 1 and not any(_assigns([s, *_nested(s)], name) for s in module
                                          if not _bool_constants(s) and not isinstance(
                                              s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))}
    bodies = [(module, ())]
    bodies += [(n.body, tuple(name for g in walk(n) if isinstance(g, ast.Global) for name in g.names))
               for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = []
    for body, shared in bodies:
        values: dict = {}  # flag -> its constant, set at this level so far
        lines: dict = {}  # flag -> the line that set it
        for name in shared:
            if name in top:
                values[name], lines[name] = top[name]
        for stmt in body:
            constants = _bool_constants(stmt)
            if constants:
                for name, value in constants:
                    values[name], lines[name] = value, stmt.lineno
                continue
            if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                for name in list(values):
                    if _assigns([stmt], name):
                        del values[name]
                continue
            if not isinstance(stmt, (ast.For, ast.While)):
                continue
            for inner in _nested(stmt):
                if not isinstance(inner, ast.While):
                    continue
                name = _runs_while(inner.test, values)
                if name is None or not _EPISODE_FLAG.search(name):
                    continue
                inside = list(_nested(inner))
                if not _assigns(inside, name):
                    continue  # nothing in the inner loop ends it
                ids = {id(n) for n in inside} | {id(inner)}
                outside = [n for n in _nested(stmt) if id(n) not in ids]
                if _assigns(outside, name):
                    continue  # the outer loop sets it back for each pass
                found.append((lines[name], name, inner.lineno, stmt.lineno))
            for name in list(values):  # what the loop did to the flags is not followed further
                if _assigns(list(_nested(stmt)), name):
                    del values[name]
    return sorted(set(found))


class EpisodeFlagNeverReset(Rule):
    """
    ## What it does
    Finds an episode loop (`while not done:`) inside an outer loop over episodes or epochs whose
    flag is set once, before the outer loop, and never set back: `done = False` above `for
    n_epi in range(...)` where it belongs inside. The episode sets the flag when it ends, so from
    the outer loop's second pass on the inner loop never runs (a flag set once at the top of a
    script counts too for a function that declares it `global`). It reads the source of the
    files a backward ran from; the flag's name says it ends an episode (`done`, `terminated`,
    `truncated`, `finished`, `game_over`).

    ## Why is this bad?
    Only the first episode collects anything. Every later pass of the outer loop skips the
    rollout and trains again on nothing new (or on the first episode's data, or on an empty
    batch), so the agent learns from one episode however long the run is, while the loop
    counter and the logs go on as if it trained.

    ## Example
    ```python
    done = False
    for n_epi in range(10000):
        s = env.reset()
        while not done:
            a = pi.sample(s)
            s, r, done, info = env.step(a)
            pi.put_data((r, prob))
        pi.train_net()
    ```

    ## Use instead
    ```python
    for n_epi in range(10000):
        s = env.reset()
        done = False
        while not done:
            ...
    ```

    ## Stays silent on
    A flag set back inside the outer loop (`s, done = env.reset(), False`, `done = False` before
    the inner loop); an inner loop that nothing inside ends through its flag; flags whose names
    say nothing of an episode (a warm-up that runs once on purpose, `while not warmed_up:`);
    loops whose file ran no backward.
    """

    code = "GD374"
    slug = "episode-flag-never-reset"
    severity = Severity.WARNING
    summary = ("an episode loop's done flag is set once, before the loop over episodes: from the "
               "second episode on the rollout never runs")
    fix = "set the flag back at the start of each episode, inside the outer loop"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, name, inner, outer in flags_never_reset(tree):
                yield self.finding(
                    f"`{name}` is set once, here, before the loop at line {outer}; the loop at "
                    f"line {inner} runs while it says the episode is not over, and the episode sets "
                    f"it when it ends, but nothing in the outer loop sets it back: from the outer "
                    f"loop's second pass on, the inner loop never runs, so only the first episode "
                    f"is ever collected and every later update trains on nothing new",
                    Location(path, line),
                    related=(Related(Location(path, inner), f"the loop that `{name}` ends"),),
                    evidence={"flag": name, "inner_loop": inner, "outer_loop": outer},
                    fix=f"move `{name} = ...` into the loop at line {outer}, before line {inner}, "
                        f"so that each pass starts a new episode")
