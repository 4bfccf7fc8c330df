"""Loads that change nothing: a ``load_state_dict(..., strict=False)`` that places no parameter, and
a state loaded into the module it came from.

With ``strict=False`` torch returns the keys it could not place instead of raising: a checkpoint
saved from a ``DataParallel``/DDP-wrapped model (``module.`` before every key), or from another
nesting (``backbone.``, ``model.``), matches nothing, and the model trains on from its random
initialisation while the script believes it fine-tunes. Read from the call's own result (the
module's ``state_dict`` keys once per such call): nothing per step.

A state whose parameter tensors are the module's own (``target.load_state_dict(model.state_dict())``
after ``target = model``: one module under two names) copies each parameter onto itself. Told by
storage (``data_ptr``) before the load runs, one pass over the module's parameters per call.
"""

from __future__ import annotations

_SHOWN = 3  # keys named per side
_TRIED = 16  # unexpected keys tried for a common prefix


def _prefix(unexpected: list[str], expected: list[str]) -> tuple[str, str] | None:
    """``("strip", "module.")`` when the state's keys carry a prefix the module's lack,
    ``("add", "model.")`` when the module's carry one the state's lack: the one transform that
    places most of the state's keys, else None."""
    names = set(expected)
    votes: dict[tuple[str, str], int] = {}
    for key in unexpected[:_TRIED]:
        for name in expected:
            if key.endswith("." + name):
                found = ("strip", key[: len(key) - len(name)])
            elif name.endswith("." + key):
                found = ("add", name[: len(name) - len(key)])
            else:
                continue
            votes[found] = votes.get(found, 0) + 1
            break
    if not votes:
        return None
    (how, prefix), count = max(votes.items(), key=lambda item: item[1])
    placed = sum(1 for key in unexpected
                 if (key[len(prefix):] if how == "strip" and key.startswith(prefix)
                     else prefix + key if how == "add" else None) in names)
    return (how, prefix) if count * 2 > min(len(unexpected), _TRIED) and placed else None


def nothing_loaded(module, state_dict, result) -> dict | None:
    """The facts of a load that placed none of the module's parameters, else None."""
    missing = list(getattr(result, "missing_keys", None) or ())
    unexpected = list(getattr(result, "unexpected_keys", None) or ())
    if not unexpected or not missing or not hasattr(state_dict, "keys"):
        return None
    params = [name for name, _ in module.named_parameters()]
    absent = set(missing)
    if not params or any(name not in absent for name in params):
        return None  # some parameter was loaded: a new head, a partial checkpoint
    expected = list(module.state_dict().keys())
    keys = list(state_dict.keys())
    return {"cls": type(module).__name__, "keys": len(keys), "params": len(params),
            "unexpected": [str(k) for k in unexpected[:_SHOWN]],
            "missing": [str(k) for k in missing[:_SHOWN]],
            "prefix": list(_prefix([str(k) for k in unexpected], [str(k) for k in expected]) or ()) or None}


def loaded_into_itself(module, state_dict) -> dict | None:
    """The facts of a load whose state holds, for every parameter of ``module`` it names, that
    very parameter's storage (the state came from the module itself or from one that shares all
    its parameters), else None. Parameters without storage (meta, empty) are not judged."""
    if not hasattr(state_dict, "get"):
        return None
    matched = 0
    for name, param in module.named_parameters():
        value = state_dict.get(name)
        if value is None:
            continue
        if (not hasattr(value, "data_ptr") or param.numel() == 0 or param.data_ptr() == 0
                or value.data_ptr() != param.data_ptr() or value.shape != param.shape):
            return None
        matched += 1
    return {"cls": type(module).__name__, "params": matched} if matched else None
