from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from .checkpoint_model_not_restored import _read_keys, _restores, _state_dict_of
from ..analysis.source import walk

# what the keys or owners of a resumable training state are called: the optimizer, the lr
# scheduler, the AMP grad scaler, and the counters the loop restarts from
_RESUMED = (("optim", "optimizer"), ("sched", "scheduler"), ("lr_", "scheduler"),
            ("scaler", "grad scaler"))
_COUNTERS = ("epoch", "global_step", "step")


def _kind(key: str, owner: str) -> str | None:
    text = (key + " " + owner).lower()
    return next((part for word, part in _RESUMED if word in text), None)


def _saved(tree: ast.AST) -> list[tuple[dict[str, tuple[str, str]], int]]:
    """``({key: (part, owner)}, line)`` of each dict literal given to ``torch.save``: the
    training-state ``X.state_dict()`` values (optimizer, scheduler, scaler) and the loop
    counters (``"epoch": epoch``) it holds."""
    found = []
    for node in walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "save" and node.args and isinstance(node.args[0], ast.Dict):
            held = {}
            for key, value in zip(node.args[0].keys, node.args[0].values):
                if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                    continue
                owner = _state_dict_of(value)
                if owner is not None:
                    part = _kind(key.value, owner)
                    if part is not None:
                        held[key.value] = (part, owner)
                elif isinstance(value, (ast.Name, ast.Attribute, ast.BinOp)) \
                        and key.value.lower() in _COUNTERS:
                    held[key.value] = ("counter", ast.unparse(value))
            found.append((held, node.lineno))
    return found


def _positioned_scheduler(tree: ast.AST) -> bool:
    """Whether a call passes ``last_epoch`` a value other than -1 (a scheduler rebuilt at the
    position a resume reached: ``CosineAnnealingLR(opt, T_max, last_epoch=start - 1)``)."""
    for node in walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "last_epoch" and not (
                        isinstance(kw.value, ast.UnaryOp) and isinstance(kw.value.operand, ast.Constant)
                        and kw.value.operand.value == 1):
                    return True
    return False


def _replayed_scheduler(tree: ast.AST) -> bool:
    """Whether a loop does nothing but step a scheduler (``for _ in range(start_epoch):
    scheduler.step()``): the schedule replayed to the resumed position instead of loaded."""
    for node in walk(tree):
        if isinstance(node, ast.For) and node.body and all(
                isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == "step"
                and _kind("", ast.unparse(stmt.value.func.value)) == "scheduler"
                for stmt in node.body):
            return True
    return False


def _restarted_loop(tree: ast.AST, after: int, counter: str) -> int | None:
    """The line of the first ``for <counter> in ...`` after line ``after``: the loop that starts
    again from its first value."""
    loops = [n.lineno for n in walk(tree) if isinstance(n, ast.For) and n.lineno > after
             and isinstance(n.target, ast.Name) and n.target.id == counter]
    return min(loops) if loops else None


def unrestored_state(tree: ast.AST) -> list[tuple[int, str, str, str, str, str]]:
    """``(line, last restore text, key, part, owner, restored key)``: a checkpoint saved with
    its training state, the script restoring part of that state
    (``optimizer.load_state_dict(ckpt["optimizer"])``) while another part (the scheduler, the
    scaler, the epoch counter) is read nowhere in the file."""
    read, computed = _read_keys(tree)
    if computed:
        return []
    found = []
    for held, _ in _saved(tree):
        state = {k for k, (part, _) in held.items() if part != "counter"}
        restores = _restores(tree, state)
        if not restores:
            continue  # nothing of the training state restored: a fine-tune from the weights
        line, text, restored = restores[-1]
        for key, (part, owner) in held.items():
            if part == "scheduler" and (_positioned_scheduler(tree) or _replayed_scheduler(tree)):
                continue  # rebuilt at the resumed position, or stepped to it, instead of loaded
            if key not in read:
                at = _restarted_loop(tree, line, owner) if part == "counter" else None
                found.append((at or line, text, key, part, owner, restored))
    return found


class CheckpointStateNotRestored(Rule):
    """
    ## What it does
    Finds a resume that restores only part of the training state it saved: the script saves
    `torch.save({"model": ..., "optimizer": optimizer.state_dict(), "scheduler":
    scheduler.state_dict(), "epoch": epoch})`, and where it loads the file back it restores
    some of that state (`optimizer.load_state_dict(ckpt["optimizer"])`) while another saved
    part — the lr scheduler's state, the AMP grad scaler's, the optimizer's, or the epoch
    (step) counter — is read nowhere in the file. Read from the source of the files a backward
    ran from; reported at the last restore, where the missing one goes (for a counter, at the
    loop over it that follows).

    ## Why is this bad?
    The resumed run is not the run that was interrupted. A scheduler left unrestored starts
    its schedule again (a cosine back at its peak lr, a warm-up replayed) on weights that
    were already at the end of it; an optimizer left unrestored drops its momentum and Adam
    moments; a grad scaler restarts from its initial scale; an epoch counter not read back
    trains the whole schedule again from epoch 0. Nothing fails: the loss jumps, and the
    final model is worse than an uninterrupted run's.

    ## Example
    ```python
    ckpt = torch.load(path)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    start_epoch = ckpt["epoch"] + 1
    ```

    ## Use instead
    ```python
    ckpt = torch.load(path)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    start_epoch = ckpt["epoch"] + 1
    ```

    ## Stays silent on
    A resume that reads every part it saved (`ckpt["scheduler"]`, `ckpt.get("scaler")`, a
    helper that restores it by key); a scheduler rebuilt at the resumed position
    (`last_epoch=start - 1`), or stepped there by a loop that only steps it (`for _ in
    range(start_epoch): scheduler.step()`), instead of loaded; a fine-tune that loads only the weights from a
    checkpoint that also holds the optimizer and scheduler (no part of the training state is
    restored: a new run on pretrained weights); checkpoints whose keys are read in a loop;
    keys other than the optimizer, scheduler, scaler and epoch/step counters (a best score,
    the config); a resume that loads no model weights (checkpoint-model-not-restored);
    checkpoints saved by another file.
    """

    code = "GD365"
    slug = "checkpoint-state-not-restored"
    severity = Severity.WARNING
    summary = ("a resume restores part of the training state it saved (the optimizer) but not "
               "the rest (the scheduler, scaler or epoch counter saved beside it)")
    fix = "restore every part of the saved training state: scheduler.load_state_dict(ckpt[\"scheduler\"])"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, key, part, owner, restored in unrestored_state(tree):
                checkpoint = text.split("(", 1)[1].rsplit("[", 1)[0] if "(" in text else "ckpt"
                if part == "counter":
                    what = (f"the {key} counter (`{owner}`)", "the loop starts again from its "
                            f"first {key} and replays the whole schedule on weights already "
                            "trained through part of it")
                    fix = (f"start the loop from the saved counter: `start_{key} = "
                           f"{checkpoint}[\"{key}\"] + 1`, and loop from it")
                else:
                    consequence = {
                        "scheduler": "the schedule starts over (a cosine back at its peak lr, a "
                                     "warm-up replayed) on weights already trained through it",
                        "optimizer": "momentum and adaptive moments start from zero on "
                                     "trained weights",
                        "grad scaler": "the loss scale restarts from its initial value",
                    }[part]
                    what = (f"the {part} state of `{owner}`", consequence)
                    fix = f"restore it after this line: `{owner}.load_state_dict({checkpoint}[\"{key}\"])`"
                yield self.finding(
                    f"the resume restores \"{restored}\" from the checkpoint (`{text}`), but "
                    f"{what[0]} saved beside it under \"{key}\" is read nowhere: {what[1]}",
                    Location(path, line),
                    evidence={"key": key, "part": part, "owner": owner, "restored": restored},
                    fix=fix)
