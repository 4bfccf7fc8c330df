from __future__ import annotations

import ast
import bisect

from ..findings import Role, Severity
from .base import Rule, related
from ..analysis.source import walk


class BackwardAfterBatchLoop(Rule):
    """
    ## What it does
    Finds a `loss.backward()` written after a DataLoader loop, one indentation level out,
    whose `loss` the loop body reassigns on every batch (`loss = criterion(model(x), y)`, not
    added up): the backward runs once per epoch, on the last batch's loss only. Read from the
    trace (the backwards at that line: one per pass over the loader, whose replay served two
    batches or more) and from the script's source (the `for` over the loader right before the
    backward, in the same block, assigns the name the backward is called on, and nothing
    between the loop and the backward assigns it again). It points at the backward, with the
    loop and the step as related lines.

    ## Why is this bad?
    The forward of every batch but the last is computed and thrown away: the model is trained
    on one batch per epoch (and that batch's gradient is all the step sees), so the loss
    creeps down many times slower than the loop suggests, or not at all. Nothing fails; the
    printed loss is a real batch's loss. The usual cause is an indentation slip: `backward()`
    and `step()` dedented out of the batch loop.

    ## Example
    ```python
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
        loss.backward()          # after the loop: the last batch only
        optimizer.step()
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    ```

    ## Stays silent on
    A loss added up over the loop (`total = total + loss`, `total += loss`) and backpropagated
    once after it (full-batch gradient descent over a loader); a loss rebuilt after the loop
    from the batch losses (`loss = torch.stack(losses).mean()`); a backward inside the loop;
    loops over something other than a DataLoader (chunks of a sequence, a list of tensors);
    a loader that served a single batch per epoch.
    """

    code = "GD291"
    slug = "backward-after-batch-loop"
    severity = Severity.WARNING
    summary = ("loss.backward() sits after the DataLoader loop whose body reassigns the loss: "
               "only the last batch of each epoch is backpropagated")
    fix = "indent loss.backward() (and optimizer.step()) into the loop over the batches"

    def check(self, a):
        backwards: dict = {}
        for b in a.of_kind("backward"):
            if b.loc is not None:
                backwards.setdefault((b.loc.path, b.loc.line), []).append(b)
        if not backwards:
            return
        epochs: dict = {}
        for e in a.of_kind("epoch_start"):
            if e.loc is not None:
                epochs.setdefault((e.loc.path, e.loc.line), []).append(e)
        if not epochs:
            return
        for (path, line), events in backwards.items():
            found = _after_loop(a.source.tree(path), line)
            if found is None:
                continue
            name, loop_line, assign_line = found
            starts = epochs.get((path, loop_line))
            if not starts or max(s.get("replay_len") or 0 for s in starts) < 2:
                continue
            if not _once_per_pass(a, starts, events):
                continue
            first = events[0]
            step = next((s for s in a.steps if s.seq > first.seq), None)
            served = max(s.get("replay_len") or 0 for s in starts)
            yield self.finding(
                f"this `{name}.backward()` runs after the loop over the DataLoader at line "
                f"{loop_line}, once per pass, while the loop reassigns `{name}` at line "
                f"{assign_line} on each of its {served} batches: only the last batch's loss is "
                f"backpropagated, the other batches' forwards are computed and thrown away, and "
                f"the model learns from one batch per epoch",
                first.loc,
                related=(related(starts[0], "the loop over the batches"),
                         related(step, "the step that applies the last batch's gradient only",
                                 Role.STEP)),
                step=a.step_number.get(step.seq) if step is not None else None,
                evidence={"loss": name, "loop_line": loop_line, "assigned_line": assign_line,
                          "batches": served, "backwards": a.count(events)},
                fix=(f"indent `{name}.backward()` and the optimizer step into the loop at line "
                     f"{loop_line}, or add the batch losses up (total = total + {name}) and "
                     f"backpropagate the total"),
            )


def _once_per_pass(a, starts, backwards) -> bool:
    """Each pass of the loader (from its epoch_start to the next) holds at most one of these
    backwards, and at least one pass holds one."""
    seqs = sorted(s.seq for s in starts)
    counts = [0] * len(seqs)

    for b in backwards:
        i = bisect.bisect_right(seqs, b.seq) - 1
        if i < 0:
            return False  # a backward before the loop ran: not this layout
        counts[i] += 1
    return max(counts) == 1


def _calls_backward_on(stmt: ast.stmt) -> str | None:
    """``name`` of a statement ``name.backward(...)``."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        if isinstance(func, ast.Attribute) and func.attr == "backward" \
                and isinstance(func.value, ast.Name):
            return func.value.id
    return None


def _assigns(stmt: ast.AST, name: str) -> list[ast.stmt]:
    """The statements in ``stmt`` (not in nested functions or classes) that assign ``name``."""
    out = []
    todo = [stmt]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)) \
                and node is not stmt:
            continue
        if isinstance(node, ast.Assign) and any(
                isinstance(n, ast.Name) and n.id == name for t in node.targets for n in walk(t)):
            out.append(node)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name) \
                and node.target.id == name:
            out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _reads(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
               for n in walk(node))


def _after_loop(tree: ast.AST | None, line: int) -> tuple[str, int, int] | None:
    """``(name, loop line, assignment line)`` when the statement on ``line`` is
    ``name.backward()`` right after (in its block) a ``for`` loop whose body reassigns ``name``
    from scratch on each pass, and nothing between the two assigns it."""
    if tree is None:
        return None
    for block_owner in walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(block_owner, field, None)
            if not isinstance(block, list):
                continue
            for i, stmt in enumerate(block):
                if getattr(stmt, "lineno", None) != line:
                    continue
                name = _calls_backward_on(stmt)
                if name is None:
                    return None
                for j in range(i - 1, -1, -1):
                    prev = block[j]
                    if isinstance(prev, (ast.For, ast.AsyncFor)):
                        body = ast.Module(body=prev.body, type_ignores=[])
                        assigned = _assigns(body, name)
                        if not assigned:
                            return None
                        if any(not isinstance(s, ast.Assign) or _reads(s.value, name)
                               for s in assigned):
                            return None  # added up over the loop: one backward is right
                        return name, prev.lineno, assigned[-1].lineno
                    if _assigns(prev, name):
                        return None  # rebuilt after the loop (torch.stack(losses).mean())
                return None
    return None
