from __future__ import annotations

from ..findings import Severity
from .base import Rule


class StateDictNotLoaded(Rule):
    """
    ## What it does
    Finds a `load_state_dict(..., strict=False)` that placed none of the model's parameters:
    every parameter is among the missing keys and the state's keys are unexpected, most often
    because the checkpoint was saved from a `DataParallel`/DDP-wrapped model (`module.` before
    every key) or from another nesting (`backbone.`, `model.`).

    ## Why is this bad?
    `strict=False` returns the keys it could not place instead of raising. The model keeps its
    random initialisation and trains from scratch while the script believes it fine-tunes
    pretrained weights: the loss goes down, only slower and to a worse place.

    ## Example
    ```python
    state = torch.load("checkpoint.pt")  # saved from DistributedDataParallel: "module.fc.weight"
    model.load_state_dict(state, strict=False)
    ```

    ## Use instead
    ```python
    state = torch.load("checkpoint.pt")
    state = {k.removeprefix("module."): v for k, v in state.items()}
    model.load_state_dict(state)  # strict: a mismatch raises
    ```

    ## Stays silent on
    A partial load that places some parameters (a backbone loaded into a model with a new head,
    a checkpoint missing a few layers); `strict=True` (torch raises on any mismatch).
    """

    code = "GD130"
    slug = "state-dict-not-loaded"
    severity = Severity.WARNING
    summary = ("load_state_dict(strict=False) placed none of the model's parameters (the keys do "
               "not match, e.g. a 'module.' prefix): the model trains from its random initialisation")
    fix = ("make the keys match (print both lists) and load with strict=True, so that a mismatch "
           "raises instead of loading nothing")

    def check(self, a):
        for event in a.by_kind.get("state_not_loaded", ()):
            unexpected = event.get("unexpected") or []
            missing = event.get("missing") or []
            prefix = event.get("prefix")
            fix = self.fix
            if prefix and prefix[0] == "strip":
                fix = (f"strip the {prefix[1]!r} prefix the state's keys carry: "
                       f"state = {{k.removeprefix({prefix[1]!r}): v for k, v in state.items()}}, "
                       f"then load_state_dict(state) with strict=True")
            elif prefix and prefix[0] == "add":
                fix = (f"the model's keys start with {prefix[1]!r} (a wrapped model): load into the "
                       f"inner module, or add the prefix: state = {{{prefix[1]!r} + k: v for k, v in "
                       f"state.items()}}; keep strict=True")
            yield self.finding(
                f"load_state_dict(strict=False) placed none of the {event.get('params')} parameters "
                f"of {event.get('cls')}: none of the state's {event.get('keys')} keys matches "
                f"(unexpected: {', '.join(map(repr, unexpected))}; missing: "
                f"{', '.join(map(repr, missing))}). strict=False hides it, and the model trains "
                f"from its random initialisation",
                event.loc,
                evidence={"keys": event.get("keys"), "params": event.get("params"),
                          "unexpected": unexpected, "missing": missing, "prefix": prefix},
                fix=fix)
