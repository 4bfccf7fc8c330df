from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule, plural, related


class SnapshotAliasesParams(Rule):
    """
    ## What it does
    Finds a "best model" or checkpoint snapshot that is no copy: `best_state =
    model.state_dict()` (or `{k: v for k, v in model.state_dict().items()}`) keeps the very
    tensors `state_dict()` returned, which share storage with the live parameters. When the
    script later restores it (`load_state_dict`) or saves it (`torch.save`) after optimizer steps
    changed those parameters, graddoctor points at the `state_dict()` call that took it. A
    restore the check does not reach (early stopping's `load_state_dict(best_state)` after the
    loop) is read from the script: a snapshot taken in an `if` inside the loop, still held by
    that variable at the next optimizer step and given to no load or save before it, whose name
    a later line passes to `load_state_dict` or `torch.save`. State dicts collected in a list
    (`snapshots.append(model.state_dict())` each epoch for a weight average, federated clients'
    `states.append(local_train(...))` where each client is the same model object, not a copy)
    are reported at the `state_dict()` call once two entries of the list are seen to share the
    same live tensors at an optimizer step: nothing taken from that list can differ.

    ## Why is this bad?
    `state_dict()` returns references, not copies: every later update of the parameters shows
    in the snapshot. `model.load_state_dict(best_state)` at the end of early stopping restores
    the last weights, not the best ones, and `torch.save(best_state, path)` writes the last
    weights under the best checkpoint's name. Nothing fails; the reported best score belongs to
    weights that no longer exist.

    ## Example
    ```python
    if val_loss < best_loss:
        best_loss, best_state = val_loss, model.state_dict()
    ...
    model.load_state_dict(best_state)
    ```

    ## Use instead
    ```python
    if val_loss < best_loss:
        best_loss, best_state = val_loss, copy.deepcopy(model.state_dict())
    ...
    model.load_state_dict(best_state)
    ```

    ## Stays silent on
    `copy.deepcopy(model.state_dict())`, `{k: v.clone() ...}`, `{k: v.detach().cpu().clone()
    ...}`; a state dict taken and saved or loaded before the next step (checkpointing the
    current model each epoch, an EMA copy loaded from the live model); a state from
    `torch.load`; `{k: v.cpu() ...}` and `.to("cpu")` snapshots, which copy on a GPU (on the CPU
    they are the tensors themselves: a GPU script checked on a CPU); a reference taken at every
    iteration and saved after the loop (`last = model.state_dict()`: the last weights are the
    ones meant); a snapshot saved right after it is taken (`if epoch % 5 == 0: sd =
    model.state_dict(); torch.save(sd, path)`); a list of state dicts of different models
    (federated clients that are `copy.deepcopy` of the global model) or of copies.
    """

    code = "GD125"
    slug = "snapshot-aliases-params"
    severity = Severity.WARNING
    summary = ("a state_dict() snapshot holds references to the live parameters, not copies: "
               "restored or saved after training went on, it gives the last weights")
    fix = ("copy the tensors when taking the snapshot: copy.deepcopy(model.state_dict()) or "
           "{k: v.detach().clone() for k, v in model.state_dict().items()}")

    def check(self, a):
        seen = set()
        for event in a.of_kind("snapshot_alias"):
            taken = event.get("taken")
            if not taken or event["steps"] < 1 or not event["params"]:
                continue
            snapshot = Location(str(taken[0]), int(taken[1]), str(taken[2]))
            key = (snapshot.path, snapshot.line)
            if key in seen:
                continue
            seen.add(key)
            if a.source.moves_to_host(snapshot.path, snapshot.line):
                continue  # `.cpu()`: a copy on a GPU, the tensor itself on the CPU
            yield self._finding(a, event, snapshot)
        for event in a.of_kind("snapshot_held"):
            loc = event.loc
            if loc is None or (loc.path, loc.line) in seen or event["steps"] < 1 or not event["params"]:
                continue
            if (event.get("alike") or 0) >= 2:
                seen.add((loc.path, loc.line))
                yield self._collected(a, event, loc)
                continue
            later = a.source.snapshot_restored_later(loc.path, loc.line, event["name"])
            if later is None or a.source.moves_to_host(loc.path, loc.line):
                continue
            seen.add((loc.path, loc.line))
            yield self._held(a, event, loc, later)

    def _collected(self, a, event, snapshot):
        pids, name, alike = list(event["params"]), event["name"], event["alike"]
        obj = a.source.called_object(snapshot.path, snapshot.line, "state_dict") or "model"
        return self.finding(
            f"the state dicts collected in `{name}` are references to the live tensors of "
            f"{a.names(pids)}, not copies: {alike} of its entries are the very same tensors, so "
            f"whatever is averaged, compared or restored from `{name}` is the current weights "
            f"{alike} times, not {alike} different models (snapshots of one model, or clients "
            f"that are the same model object rather than copies of it)",
            snapshot,
            step=a.steps_before(event.seq),
            evidence={"params": a.param_names(pids), "via": "collected", "steps": event["steps"],
                      "name": name, "alike": alike},
            fix=(f"copy the tensors when taking each one: copy.deepcopy({obj}.state_dict()) "
                 f"(import copy); when each entry is meant to come from a model of its own, build "
                 f"that model as a copy (copy.deepcopy) rather than binding the same one"))

    def _held(self, a, event, snapshot, later):
        pids, name = list(event["params"]), event["name"]
        line, via = later
        obj = a.source.called_object(snapshot.path, snapshot.line, "state_dict") or "model"
        does = ("restores it: the last weights, not the best ones" if via == "load_state_dict"
                else "saves it: the last weights under this snapshot's name")
        return self.finding(
            f"`{name}` is taken here only on some iterations and kept for later, but it holds "
            f"references to the live tensors of {a.names(pids)}, not copies: the optimizer steps "
            f"that follow change it too, so the {via}(...) at line {line} {does} "
            f"(the check stopped before that line ran)",
            snapshot,
            step=a.steps_before(event.seq),
            evidence={"params": a.param_names(pids), "via": via, "steps": event["steps"],
                      "name": name, "used_at": line},
            fix=(f"copy the tensors when taking it: {name} = copy.deepcopy({obj}.state_dict()) "
                 f"(import copy) or {{k: v.detach().clone() for k, v in {obj}.state_dict().items()}}"))

    def _finding(self, a, event, snapshot):
        pids, steps = list(event["params"]), event["steps"]
        at = ""
        if event.loc is not None:
            at = f" at {event.loc}" if event.loc.path != snapshot.path else f" at line {event.loc.line}"
        if event["via"] == "torch.save":
            does = f"the torch.save(...){at}, which writes the last weights"
            what = "saves the snapshot: the weights of this moment"
        else:
            does = f"the load_state_dict(...){at}, which restores the last weights"
            what = "restores the snapshot: the weights of this moment"
        obj = a.source.called_object(snapshot.path, snapshot.line, "state_dict") or "model"
        return self.finding(
            f"this state_dict() snapshot holds references to the live tensors of "
            f"{a.names(pids)}, not copies: {plural(steps, 'optimizer step')} changed them before "
            f"{does}, not the ones of the moment it was taken",
            snapshot,
            related=(related(event, what),),
            step=a.steps_before(event.seq),
            evidence={"params": a.param_names(pids), "via": event["via"], "steps": steps,
                      "tensors": event.get("tensors"), "total": event.get("total"),
                      "used_at": event.loc.line if event.loc is not None else None},
            fix=(f"copy the tensors when taking it: copy.deepcopy({obj}.state_dict()) (import copy) "
                 f"or {{k: v.detach().clone() for k, v in {obj}.state_dict().items()}}"))
