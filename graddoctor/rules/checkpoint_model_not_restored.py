from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

# keys of a checkpoint's training state besides the model's weights
_STATE_WORDS = ("optim", "sched", "scaler", "lr", "ema", "epoch", "step", "rng", "best", "loss",
                "args", "config")


def _state_dict_of(value: ast.AST) -> str | None:
    """``model`` of ``model.state_dict()`` (``model.module.state_dict()``), else None."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and value.func.attr == "state_dict" and not value.args:
        return ast.unparse(value.func.value)
    return None


def _saved_checkpoints(tree: ast.AST) -> list[tuple[dict[str, str], int]]:
    """``({key: owner}, line)`` of each dict literal given to ``torch.save`` whose values are
    ``X.state_dict()`` calls (other values are left out of the map)."""
    found = []
    for node in walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "save" and node.args and isinstance(node.args[0], ast.Dict):
            owners = {}
            for key, value in zip(node.args[0].keys, node.args[0].values):
                owner = _state_dict_of(value)
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and owner:
                    owners[key.value] = owner
            if owners:
                found.append((owners, node.lineno))
    return found


def _read_keys(tree: ast.AST) -> tuple[set[str], bool]:
    """The string keys read anywhere (``c["k"]``, ``c.get("k")``), and whether any key is read
    by a computed subscript (a loop over keys: nothing can be said)."""
    keys, computed = set(), False
    for node in walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            index = node.slice
            if isinstance(index, ast.Constant) and isinstance(index.value, str):
                keys.add(index.value)
            elif isinstance(index, (ast.Name, ast.Attribute)) and isinstance(node.value, ast.Name) \
                    and any(w in node.value.id.lower() for w in ("ckpt", "checkpoint", "state")):
                computed = True
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "pop") and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            keys.add(node.args[0].value)
    return keys, computed


def _restores(tree: ast.AST, keys: set[str]) -> list[tuple[int, str, str]]:
    """``(line, text, key)`` of each ``X.load_state_dict(c["key"])`` for a key in ``keys``."""
    found = []
    for node in walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "load_state_dict" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Subscript) and isinstance(arg.slice, ast.Constant) \
                    and arg.slice.value in keys:
                found.append((node.lineno, ast.unparse(node), arg.slice.value))
    return sorted(found)


def unrestored_models(tree: ast.AST) -> list[tuple[int, str, str, str, str]]:
    """``(line, restore text, model key, model, restored key)``: a checkpoint saved with a
    model's weights and its training state, whose training state the script loads back
    (``optimizer.load_state_dict(ckpt["optimizer"])``) while the model's key is read nowhere."""
    read, computed = _read_keys(tree)
    if computed:
        return []
    found = []
    for owners, _ in _saved_checkpoints(tree):
        state = {k for k, owner in owners.items()
                 if any(w in (k + owner).lower() for w in _STATE_WORDS)}
        models = {k: owner for k, owner in owners.items() if k not in state}
        restores = _restores(tree, state)
        if not restores:
            continue
        for key, owner in models.items():
            if key not in read:
                line, text, restored = restores[0]
                found.append((line, text, key, owner, restored))
    return found


class CheckpointModelNotRestored(Rule):
    """
    ## What it does
    Finds a resume that loads a checkpoint's training state but not its model: the script saves
    `torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), ...})`, and
    where it loads the file back it restores the optimizer (scheduler, scaler) with
    `optimizer.load_state_dict(ckpt["optimizer"])` while the model's key is read nowhere in
    the file. Read from the source of the files a backward ran from.

    ## Why is this bad?
    Training "resumes" from freshly initialised weights, with the old run's momentum and
    Adam moments, its decayed learning rate and its epoch counter: the optimizer's state belongs
    to other weights, the schedule has already decayed, and the remaining epochs are too few to
    train the new model. The loss jumps back up and the final model is much worse; nothing fails.

    ## Example
    ```python
    ckpt = torch.load(path)
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    start_epoch = ckpt["epoch"] + 1
    ```

    ## Use instead
    ```python
    ckpt = torch.load(path)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    ```

    ## Stays silent on
    The model's key read anywhere in the file (`model.load_state_dict(ckpt["model"])`,
    `ckpt.get("model")`, a helper that restores it); checkpoints whose keys are read in a loop;
    a checkpoint holding the model alone; checkpoints saved by another file.
    """

    code = "GD339"
    slug = "checkpoint-model-not-restored"
    severity = Severity.WARNING
    summary = ("a resume restores the optimizer's state from a checkpoint but never the model's "
               "weights saved beside it")
    fix = "load the model's weights too: model.load_state_dict(ckpt[\"model\"])"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, key, owner, restored in unrestored_models(tree):
                checkpoint = text.split("(", 1)[1].rsplit("[", 1)[0] if "(" in text else "ckpt"
                yield self.finding(
                    f"`{text}` restores the training state saved beside `{owner}`'s weights "
                    f"(key \"{key}\"), but \"{key}\" is read nowhere: the run resumes with "
                    f"freshly initialised weights under the old run's optimizer state and "
                    f"schedule, so the trained model is lost",
                    Location(path, line), evidence={"model_key": key, "model": owner,
                                                    "restored": restored},
                    fix=f"restore the weights too: `{owner}.load_state_dict({checkpoint}[\"{key}\"])`")
