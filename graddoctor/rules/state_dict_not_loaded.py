from __future__ import annotations

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule


class StateDictNotLoaded(Rule):
    """
    ## What it does
    Finds a loaded state that the training never starts from. Either a
    `load_state_dict(..., strict=False)` that placed none of the model's parameters: every
    parameter is among the missing keys and the state's keys are unexpected, most often
    because the checkpoint was saved from a `DataParallel`/DDP-wrapped model (`module.` before
    every key) or from another nesting (`backbone.`, `model.`). Or a load whose every weight
    `torch.nn.init` overwrote before the first optimizer step (`model.apply(init_weights)`,
    `reset_parameters()`, `nn.init.*_` on the loaded tensors or their `.data`): it is
    reported at the load, which belongs after the initialisation.

    ## Why is this bad?
    `strict=False` returns the keys it could not place instead of raising, and an
    initialiser overwrites whatever the tensor held. Either way the model keeps (or gets
    back) a random initialisation and trains from scratch while the script believes it
    fine-tunes pretrained weights: the loss goes down, only slower and to a worse place.

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
    a checkpoint missing a few layers); `strict=True` (torch raises on any mismatch); an
    initialisation of the keys a `strict=False` load missed, or of the new head only, after
    loading (some loaded weights survive); an initialisation before the load, or a load
    repeated after it; a model that no optimizer trains afterwards.
    """

    code = "GD130"
    slug = "state-dict-not-loaded"
    severity = Severity.WARNING
    summary = ("load_state_dict(strict=False) placed none of the model's parameters (the keys do "
               "not match, e.g. a 'module.' prefix), or nn.init overwrote all it placed: the "
               "model trains from its random initialisation")
    fix = ("make the keys match (print both lists) and load with strict=True, so that a mismatch "
           "raises instead of loading nothing")

    def check(self, a):
        yield from self._overwritten(a)
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

    def _overwritten(self, a):
        """A load whose every weight an initialiser overwrote before the first step."""
        for event in a.by_kind.get("state_overwritten", ()):
            pids = [pid for pid in event.get("params") or () if pid in a.params]
            opts = sorted({opt for pid in pids for opt in a.owners.get(pid, ())})
            if not any(s["opt"] in opts and not s.get("skipped") for s in a.steps):
                continue  # nothing trains them: an evaluation from a fresh model is no update
            at = [tuple(x) for x in event.get("at") or ()]
            lines = sorted({line for path, line, _ in at
                            if event.loc is None or path == event.loc.path})
            where = (f" at line{'s' if len(lines) > 1 else ''} "
                     f"{', '.join(str(n) for n in lines)}" if lines else "")
            via = ", ".join(v.removeprefix("torch.nn.init.") for v in event.get("via") or ())
            stepped = " and ".join(a.optimizer_name(o) for o in opts)
            yield self.finding(
                f"load_state_dict placed the parameters of {event.get('cls')}, then "
                f"torch.nn.init ({via}){where} overwrote every weight it placed before the "
                f"first optimizer step ({a.names(pids)} re-initialised): {stepped} trains the "
                "fresh initialisation, and the state loaded is lost",
                event.loc,
                related=tuple(Related(Location(path, line, function), "the re-initialisation")
                              for path, line, function in at[:2]),
                evidence={"params": len(pids), "weights": event.get("weights"),
                          "via": event.get("via"), "lines": lines},
                fix=("load the state after initialising the model: move this load_state_dict "
                     f"below the re-initialisation{where} (or drop that initialisation)"),
            )
