"""Which statements of a script's source train, read with ``ast`` alone.

One predicate shared by the budget that waits for a later training phase (instrument/phases.py),
the run note for a phase the budget did not reach (rules/notes.py) and the rules that read a
training loop's own statements: a statement trains when it calls ``backward()``, a framework's
training loop (Lightning's ``trainer.fit()``, the HF Trainer's ``trainer.train()``), or a function
of the script that does, followed ``depth`` calls deep.
"""

from __future__ import annotations

import ast

CALL_DEPTH = 2  # functions of the script followed from a statement into the calls it makes

FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef)


def functions_of(tree: ast.AST) -> dict[str, ast.AST]:
    """The script's functions and methods by name (a later definition wins)."""
    return {n.name: n for n in ast.walk(tree) if isinstance(n, FUNCTION_NODES)}


def called_name(func: ast.AST) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def backward_lines(node: ast.AST) -> list[int]:
    """The lines of ``x.backward(...)`` / ``torch.autograd.backward(...)`` calls under ``node``."""
    return [n.lineno for n in ast.walk(node) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"]


def _runs_training(call: ast.Call) -> bool:
    """A backward, Lightning's ``trainer.fit()``, the HF Trainer's ``trainer.train()``."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    return func.attr in ("backward", "fit") or (
        func.attr == "train" and isinstance(func.value, ast.Name) and "trainer" in func.value.id.lower())


def training_call_lines(node: ast.AST, functions: dict[str, ast.AST], depth: int = CALL_DEPTH) -> list[int]:
    """The lines of the calls under ``node`` that train: a backward, a framework's fit, or a call
    of a function of the script that trains (followed ``depth`` calls deep)."""
    lines = []
    for n in ast.walk(node):
        if not isinstance(n, ast.Call):
            continue
        if _runs_training(n) or (depth > 0 and called_name(n.func) in functions
                                 and _function_trains(called_name(n.func), functions, depth - 1, set())):
            lines.append(n.lineno)
    return lines


def _function_trains(name: str, functions: dict[str, ast.AST], depth: int, seen: set[str]) -> bool:
    if name in seen:
        return False
    seen.add(name)
    for n in ast.walk(functions[name]):
        if not isinstance(n, ast.Call):
            continue
        if _runs_training(n):
            return True
        callee = called_name(n.func)
        if depth > 0 and callee in functions and _function_trains(callee, functions, depth - 1, seen):
            return True
    return False


def trains(node: ast.AST, functions: dict[str, ast.AST], depth: int = CALL_DEPTH) -> bool:
    """Whether ``node`` trains: see ``training_call_lines``."""
    return bool(training_call_lines(node, functions, depth))


def block_of(tree: ast.AST, line: int) -> list | None:
    """The statement list whose statement holds ``line``, innermost."""
    node, found = tree, None
    while True:
        inner = None
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list):
                continue
            for stmt in stmts:
                if isinstance(stmt, ast.stmt) and stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
                    found, inner = stmts, stmt
                    break
            if inner is not None:
                break
        if inner is None or inner.lineno == line or not isinstance(getattr(inner, "body", None), list):
            return found  # a simple statement (or a compound one's header): its block
        node = inner


def later_training_statements(body: list, after: int, functions: dict[str, ast.AST]) -> list[ast.stmt]:
    """The statements of ``body`` past line ``after`` that train (definitions left out: they run
    nothing where they stand)."""
    return [stmt for stmt in body if stmt.lineno > after
            and not isinstance(stmt, (*FUNCTION_NODES, ast.ClassDef)) and trains(stmt, functions)]
