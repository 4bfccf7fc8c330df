from __future__ import annotations

import re

from ..analysis.modes import evaluation_backward
from ..findings import Severity
from .base import Rule, related

# words that name held-out data, as parts of a variable or function name (val_loader, testloader,
# evaluate, run_validation): "trainval" or "interval" are not among them
_HELD_OUT = re.compile(r"^(val|valid|validation|validate|test|testing|eval|evaluate|evaluation|dev|"
                       r"holdout)(loader|dl|set|data|dataloader|iter|batches)?$")


_TRAINING = re.compile(r"^(train|training|trn|fit|finetune)(loader|dl|set|data|dataloader|iter|batches|epoch|step|one|loop)?$")


def _parts(name: str) -> list[str]:
    return [part for part in re.split(r"_+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower())
            if part]


def _held_out(name: str | None) -> bool:
    """A name made of a held-out word and no training word (``train_and_evaluate`` holds
    both: it says nothing of one loop)."""
    if not name:
        return False
    parts = _parts(name)
    return (any(_HELD_OUT.match(part) for part in parts)
            and not any(_TRAINING.match(part) for part in parts))


def _training(name: str | None) -> bool:
    return bool(name) and any(_TRAINING.match(part) for part in _parts(name))


class TrainsOnEvaluationData(Rule):
    """
    ## What it does
    Finds optimizer steps that apply gradients computed on batches of a DataLoader the script
    uses for evaluation: its loop iterates a loader named for held-out data (`val_loader`,
    `test_dl`, `self.valid_loader`) or runs in a function named for evaluation (`validate`,
    `evaluate`, `test_epoch`), while another DataLoader feeds the training steps. Read from the
    trace (each backward's batch and each loader's loop line) and the loop's source.

    ## Why is this bad?
    A validation loop copied from the training loop keeps its `loss.backward()` and
    `optimizer.step()`: the model trains on the data it is evaluated on. The validation loss
    goes down with it and stops measuring generalisation — early stopping, model selection and
    the reported score all read a number the model was fitted to.

    ## Example
    ```python
    for x, y in val_loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        val_loss += loss.item()
    ```

    ## Use instead
    ```python
    model.eval()
    with torch.no_grad():
        for x, y in val_loader:
            val_loss += criterion(model(x), y).item()
    model.train()
    ```

    ## Stays silent on
    Evaluation loops without a step, a backward in an evaluation loop whose gradients are
    cleared before any step (saliency maps, Grad-CAM), loaders named otherwise (`trainval`,
    `finetune`, a meta-learning task's query set), and a script whose only training data is the
    held-out loader (test-time adaptation).
    """

    code = "GD256"
    slug = "trains-on-evaluation-data"
    severity = Severity.WARNING
    summary = ("an optimizer steps on gradients from batches of the validation/test DataLoader: "
               "the model trains on the data it is evaluated on")
    fix = ("remove backward() and optimizer.step() from the evaluation loop, and run it under "
           "torch.no_grad() with model.eval() (model.train() after it)")

    def check(self, a):
        loops: dict[int, object] = {}  # loader -> its first epoch_start (the loop's line)
        for e in a.by_kind.get("epoch_start", ()):
            loops.setdefault(e.get("loader"), e)
        held_out: dict[int, tuple] = {}  # loader -> (what names it, the loop's event)
        for loader, e in loops.items():
            if e.loc is None:
                continue
            names = a.source.loop_names(e.loc.path, e.loc.line)
            if names is None:
                continue
            iterable, function = names
            if _held_out(iterable):
                held_out[loader] = (f"the batches of `{iterable}`", e)
            elif not _training(iterable) and _held_out(function):
                held_out[loader] = (f"the batches that {function}()'s loop reads", e)
        if not held_out:
            return
        applied: dict[int, list] = {}  # loader -> [(backward, step)] applied by a step
        by_seq = {s.seq: s for s in a.steps}
        for step_seq, backwards in a.ledger.windows.items():
            step = by_seq.get(step_seq)
            if step is None or step.get("skipped"):
                continue
            for b in backwards:
                batch = b.get("batch")
                if type(batch) is list and len(batch) == 3:
                    applied.setdefault(batch[0], []).append((b, step))
        # a backward of an eval-mode pass whose gradients leak into the next update is
        # backward-in-evaluation's finding (the same data trained on, told by the modes)
        leaking = {found.backward.seq for f in a.modes.forwards
                   if (found := evaluation_backward(a, f)) is not None}
        applied = {loader: [(b, s) for b, s in pairs if b.seq not in leaking]
                   for loader, pairs in applied.items()}
        trained_elsewhere = any(pairs and loader not in held_out for loader, pairs in applied.items())
        if not trained_elsewhere:
            return  # the held-out loader is the only training data: adaptation at test time
        for loader, (what, loop) in held_out.items():
            found = applied.get(loader)
            if not found:
                continue
            backward, step = found[0]
            n = a.count(b for b, _ in found)
            yield self.finding(
                f"{a.optimizer_name(step.get('opt'))} steps on gradients computed from {what} "
                f"({n} backward{'s' if n != 1 else ''} applied): the loop that reads held-out "
                f"data trains the model on it, so its loss stops measuring generalisation",
                backward.loc,
                related=(related(loop, "the evaluation loop"),
                         related(step, "the step that applies them")),
                step=a.step_number.get(step.seq),
                evidence={"loader": loader, "backwards": n})
