from __future__ import annotations

from ..analysis.windows import typical
from ..findings import Safety, Severity
from .base import Rule, plural, related
from .source import method_calls


class AccumulationLeftover(Rule):
    """
    ## What it does
    Finds gradient accumulation whose last, partial window of an epoch is carried into the next
    epoch: the epoch ends with micro-batches whose gradients no step has used yet, and the first
    step of the next epoch applies them together with a full window of new ones. Typical cause:
    stepping on `(i + 1) % k == 0` with a per-epoch index `i` when the epoch length is not a
    multiple of k. graddoctor replays short epochs (see `--epoch-batches`) that k does not
    divide, so the tail shows; a tail that exists only because of that cut is not reported:
    when the real epoch length is a multiple of k, or when the step's `if` also steps on a
    count of the script's own (`(i + 1) % k == 0 or i + 1 == num_batches`, `or is_last`) that
    the replay's shorter epochs never reach. Stepping on a global counter, flushing the tail
    with `(i + 1) == len(loader)`, or clearing it at the epoch start are all fine.

    ## Why is this bad?
    One update per epoch sums more than k micro-batches (up to 2k - 1): a larger, unevenly
    weighted step, and with a per-epoch `zero_grad` missing, gradients computed with last
    epoch's weights and data order leak into this epoch. Nothing crashes; results shift with
    the dataset size and batch size.

    ## Example
    ```python
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / k).backward()
            if (i + 1) % k == 0:
                optimizer.step()
                optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            (loss_fn(model(x), y) / k).backward()
            if (i + 1) % k == 0 or (i + 1) == len(loader):   # flush the tail
                optimizer.step()
                optimizer.zero_grad()
    ```

    ## Stays silent on
    A tail flushed with `len(loader)` or with the script's own batch count; a real epoch
    length divisible by k (at most `info`); windows on a global counter that straddle
    epochs; a partial tail dropped by a clear at the epoch start; accelerate's own last
    window.
    """

    code = "GD205"
    slug = "accumulation-leftover"
    severity = Severity.WARNING
    summary = "a partial accumulation window at an epoch end leaks into the next epoch's first step"
    fix = "step on the epoch's last batch too: `if (i + 1) % k == 0 or (i + 1) == len(loader):`"

    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """Flush the window at the epoch's end: ``if (i + 1) % k == 0`` ->
        ``if (i + 1) % k == 0 or (i + 1) == len(loader)``, when the batch loop is
        ``for i, ... in enumerate(loader)``."""
        cst = src.cst
        step = src.statement_at(finding.location.line)
        if step is None or not method_calls(src, "step", within=step):
            return None
        branch = step.parent if step.parent is not None and step.parent.syntax == "If" else None
        loop = src.enclosing_loop(step)
        if branch is None or loop is None or loop.syntax != "For":
            return None
        it = loop.node.iter
        if not (isinstance(it, cst.Call) and isinstance(it.func, cst.Name)
                and it.func.value == "enumerate" and it.args):
            return None
        loader = src.code(it.args[0].value)
        test = branch.node.test
        mods = [op for op in src.nodes(cst.BinaryOperation, within=branch)
                if isinstance(op.operator, cst.Modulo) and src.span(op)[0] == src.span(test)[0]]
        if len(mods) != 1 or f"len({loader})" in src.code(test):
            return None
        index = src.code(mods[0].left)
        if not isinstance(mods[0].left, (cst.Name, cst.Attribute)) and not index.startswith("("):
            index = f"({index})"
        code = src.code(test)
        if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
            code = f"({code})"
        line, col, end_line, end_col = src.span(test)
        return self.edit(f"also step at the end of each pass over {loader}",
                         src.replace(test, f"{code} or {index} == len({loader})"))

    def check(self, a):
        lengths = {(e["loader"], e["epoch"]): e for e in a.of_kind("epoch_start")}
        groups: dict = {}
        for opt, windows in a.windows.items():
            whole = [w for w in windows if w.batches() and not w.straddles()]
            k = typical([len(w.batches()) for w in whole], [a.weight(w.step) for w in whole])
            if k is None or k < 2:
                continue
            for w in windows:
                batches = w.batches()
                if not w.straddles() or len(batches) <= k:
                    continue
                loader, last_epoch = batches[-1][0], batches[-1][1]
                leftover = [b for b in batches if b[0] == loader and b[1] < last_epoch]
                if not leftover:  # the last batch came from another loader (zip of two loaders)
                    continue
                groups.setdefault(w.step.loc, []).append((w, k, loader, last_epoch, leftover))
        for loc, items in groups.items():
            w, k, loader, epoch, leftover = items[0]
            start = lengths.get((loader, epoch))
            real_len = start.get("real_len") if start else None
            replay_len = start.get("replay_len") if start else None
            tail_backward = next((b for b in reversed(w.backwards)
                                  if b.get("batch") is not None and tuple(b["batch"]) == leftover[-1]), None)
            shortened = replay_len is not None and real_len is not None and replay_len < real_len
            if shortened and real_len % k == 0:
                continue  # the replay's cut made this tail; the real epochs hold whole windows
            if shortened and loc is not None and a.source.tail_flush(loc.path, loc.line):
                continue  # the script flushes its tail at a count of its own, past the replay's cut
            message = (f"the first {a.optimizer_name(w.opt)} step of epoch {epoch} applies "
                       f"{plural(len(leftover), 'leftover micro-batch', 'leftover micro-batches')} of the previous epoch together with "
                       f"{len(w.batches()) - len(leftover)} new ones (k = {k}): the epoch's partial "
                       f"window is never stepped on its own")
            if shortened:
                message += (f" (replayed with {replay_len}-batch epochs; the real ones have {real_len}, "
                            f"which {k} does not divide either)")
            yield self.finding(
                message, loc, step=w.index,
                related=(related(tail_backward, "the leftover micro-batch of the previous epoch"),
                         related(start, "the next epoch starts here")),
                evidence={"k": k, "real_len": real_len, "replay_len": replay_len,
                          "leftover_batches": len(leftover), "epoch": epoch,
                          "occurrences": a.count(i[0].step for i in items)},
            )

