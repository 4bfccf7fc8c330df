from __future__ import annotations

import ast

from ..analysis.windows import typical
from ..findings import Severity
from ..trace import Location
from .base import Rule, plural
from ..analysis.source import walk


def _counts_from_zero(test: ast.AST) -> tuple[str, str] | None:
    """``(index, k)`` texts of a step condition true at index 0: ``i % k == 0``,
    ``not i % k``, ``0 == i % k``; None for ``(i + 1) % k == 0`` or anything else."""
    mod = None
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        sides = [test.left, test.comparators[0]]
        zero = [s for s in sides if isinstance(s, ast.Constant) and s.value == 0]
        mods = [s for s in sides if isinstance(s, ast.BinOp) and isinstance(s.op, ast.Mod)]
        if zero and mods:
            mod = mods[0]
    elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) \
            and isinstance(test.operand, ast.BinOp) and isinstance(test.operand.op, ast.Mod):
        mod = test.operand
    if mod is None or not isinstance(mod.left, (ast.Name, ast.Attribute)):
        return None  # (i + 1) % k, (step - 1) % k: an offset index, counted another way
    return ast.unparse(mod.left), ast.unparse(mod.right)


def step_condition(tree: ast.AST, line: int) -> tuple[int, str, str] | None:
    """``(line, index, k)`` of the innermost ``if`` around the statement at ``line`` whose
    test is a modulo of a bare index equal to zero (``if step % k == 0:``); None otherwise."""
    best = None
    for node in walk(tree):
        if isinstance(node, ast.If) and node.body and node.body[0].lineno <= line <= (
                node.body[-1].end_lineno or node.body[-1].lineno):
            found = _counts_from_zero(node.test)
            if found is not None and (best is None or node.lineno > best[0]):
                best = (node.lineno, *found)
    return best


class AccumulationWindowMisaligned(Rule):
    """
    ## What it does
    Finds gradient accumulation that steps on `i % k == 0`: true at the first micro-batch, so
    the first update applies the gradients of one micro-batch instead of k, and the windows
    after it run from one multiple of k to the next. With an index that restarts at 0 each epoch
    (`for i, batch in enumerate(loader)`), every epoch starts with such a step, and an epoch
    whose length k does not divide ends with a tail that the next epoch's first step applies
    with one micro-batch of its own: a window shorter than k at every epoch boundary.
    Read from the accumulation windows (the backwards between two steps of an optimizer and the
    DataLoader batches they used): the run's first step taken right after the first batch while
    the typical window holds k >= 2 micro-batches; the step's `if` tests a bare index modulo k
    equal to 0.

    ## Why is this bad?
    A window of fewer than k micro-batches, with the loss divided by k, is a step scaled down by
    the share of micro-batches it holds (and a noisier gradient); the last window of the run is
    never applied. A warning when every epoch boundary of the real run gets such a window (the
    index restarts each epoch and the epoch length is not a multiple of k); info when only the
    run's first step is short.

    ## Example
    ```python
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / k).backward()
            if i % k == 0:
                optimizer.step()
                optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / k).backward()
            if (i + 1) % k == 0 or (i + 1) == len(loader):
                optimizer.step()
                optimizer.zero_grad()
    ```

    ## Stays silent on
    `(i + 1) % k == 0`, `enumerate(loader, start=1)` and any first window of k micro-batches;
    `if i % k == 0: optimizer.zero_grad()` before the backward (a clear, not a step); a step
    after every micro-batch (k = 1); windows on a global counter that reach k from the start.
    """

    code = "GD350"
    slug = "accumulation-window-misaligned"
    severity = Severity.WARNING
    summary = ("gradient accumulation steps on i % k == 0: the first step (and, with a per-epoch "
               "index, each epoch's first) applies fewer than k micro-batches")
    fix = "step on `(i + 1) % k == 0`, and on the epoch's last batch"

    def check(self, a):
        lengths = {(e["loader"], e["epoch"]): e for e in a.of_kind("epoch_start")}
        for opt, windows in a.windows.items():
            whole = [w for w in windows if w.batches() and not w.straddles()]
            k = typical([len(w.batches()) for w in whole], [a.weight(w.step) for w in whole])
            if k is None or k < 2 or not windows:
                continue
            first = windows[0]
            batches = first.batches()
            if len(batches) != 1 or batches[0][2] != 0 or len(first.backwards) != 1:
                continue  # the first step is not taken right after the run's first batch
            loc = first.step.loc
            if loc is None:
                continue
            tree = a.source.tree(loc.path)
            found = step_condition(tree, loc.line) if tree is not None else None
            if found is None:
                continue
            line, index, divisor = found
            loader = batches[0][0]
            # the index restarts each epoch: a later epoch's first batch ends a window too
            restarts = [w for w in windows[1:] if w.batches() and w.batches()[-1][0] == loader
                        and w.batches()[-1][2] == 0]
            start = lengths.get((loader, batches[0][1]))
            real_len = start.get("real_len") if start else None
            per_epoch = bool(restarts) and len(restarts) + 1 == len(
                {b[1] for w in windows for b in w.batches() if b[0] == loader and b[2] == 0})
            boundary = None
            if per_epoch and real_len:
                boundary = (real_len - 1) % k + 1  # the tail and the next epoch's first batch
            fix = (f"step on `({index} + 1) % {divisor} == 0` (or `{index} % {divisor} == "
                   f"{divisor} - 1`), and on the epoch's last batch too")
            if boundary is not None and boundary < k:
                held = ("the new epoch's first alone" if boundary == 1 else
                        f"{plural(boundary - 1, 'micro-batch', 'micro-batches')} left from the "
                        f"previous epoch and the new epoch's first")
                message = (f"the step's condition `{index} % {divisor} == 0` is true at the first "
                           f"micro-batch, and `{index}` restarts each epoch: every epoch's first "
                           f"{a.optimizer_name(opt)} step applies "
                           f"{plural(boundary, 'micro-batch', 'micro-batches')} ({held}) instead "
                           f"of k = {k}, and the first step of the run only one: those updates are "
                           f"scaled down by the share they hold")
                severity = Severity.WARNING
            else:
                message = (f"the step's condition `{index} % {divisor} == 0` is true at the first "
                           f"micro-batch: the first {a.optimizer_name(opt)} step applies the "
                           f"gradients of one micro-batch instead of k = {k}, and the windows "
                           f"after it end one micro-batch early")
                if per_epoch and real_len:
                    message += (f" (the index restarts each epoch, but the epochs' {real_len} "
                                f"batches are a multiple of {k}: only the run's first step is short)")
                severity = Severity.INFO
            yield self.finding(
                message, Location(loc.path, line), step=first.index, severity=severity, fix=fix,
                evidence={"k": k, "index": index, "per_epoch": per_epoch, "real_len": real_len,
                          "boundary_window": boundary})
