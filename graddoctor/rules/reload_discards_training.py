from __future__ import annotations

from ..findings import Severity
from .base import Rule, related
from .params_reset_every_step import _undoes

_LOADS = 2  # loads of the same unchanged state into stepped parameters, at least


def _same(event, earlier) -> bool:
    """Whether ``event`` loads the values ``earlier`` loaded: where both loads read a fingerprint
    of the state's values, the same fingerprint (a fresh copy of an unchanged state too; a state
    edited through ``.data`` keeps its versions but not its values); else the very same tensors
    at the same versions."""
    values, before = event.get("values"), earlier.get("values")
    if values is not None and before is not None:
        return values == before
    state = event.get("state")
    return state is not None and earlier.get("state") == state


class ReloadDiscardsTraining(Rule):
    """
    ## What it does
    Finds a state loaded again and again into parameters an optimizer trains, unchanged between
    the loads, with updates of those parameters in between: every update since the previous
    load is thrown away. The classic case is a DQN's target-network sync written the wrong way
    round, `q_net.load_state_dict(target_net.state_dict())`: the target network is a copy no
    optimizer steps, so each sync resets the trained network to it. Told from the loads
    themselves: the same values (a fingerprint of a sample; the same tensors at the same
    versions past the first 32 loads) as a load before, with a step of the loaded parameters'
    optimizer, built before that load, between the two.

    ## Why is this bad?
    The optimizer steps, the loss goes down between two syncs, and then the network is set back
    to the state it had at the previous load (for a target network that never changes: its
    initialisation). Nothing is learnt for longer than one sync period; a DQN never improves
    on its random start and the loss curve is a saw-tooth.

    ## Example
    ```python
    target_net = copy.deepcopy(q_net)
    ...
    if step % sync_every == 0:
        q_net.load_state_dict(target_net.state_dict())
    ```

    ## Use instead
    ```python
    if step % sync_every == 0:
        target_net.load_state_dict(q_net.state_dict())  # copy the trained net into the target
    ```

    ## Stays silent on
    The sync in the right direction; Polyak/EMA updates of a target copy; a best checkpoint
    restored once (early stopping); a state that changes between the loads (federated
    averaging's global weights, Reptile's meta-weights edited through `.data`); a state loaded
    into a copy no optimizer owns; a reload after the trained values were saved with
    `state_dict()` (federated averaging's clients, each trained from the global weights); the
    same initial state loaded for each run of a sweep or
    fold with a new optimizer built for it; a reload between every two steps
    (params-reset-every-step's finding); a sync into a copy the optimizer was wrongly built
    over (`AdamW(target_net.parameters())`: param-not-in-optimizer's finding).
    """

    code = "GD258"
    slug = "reload-discards-training"
    severity = Severity.WARNING
    summary = ("the same unchanged state is loaded again into parameters an optimizer trains: "
               "every update since the previous load is discarded")
    fix = ("load the saved state once, before the training loop; to sync a target or EMA copy, "
           "load the trained model's state into the copy, not the copy's into the model")

    def check(self, a):
        resets = [e for e in a.by_kind.get("param_reset", ()) if e["via"] == "load_state_dict"]
        if len(resets) < _LOADS:
            return
        done: set[int] = set()
        for opt, owned in a.opt_params.items():
            owned = set(owned)
            steps = [s for s in a.steps if s["opt"] == opt and not s.get("skipped")]
            if not steps or _every_step(a, steps, owned):
                continue  # params-reset-every-step reports it
            if opt in a.optimizers_on_copies:
                continue  # built over the copy, not the model: param-not-in-optimizer says so
            init = a.optimizers.get(opt)
            loads = [e for e in resets if owned.intersection(e.get("params") or ())]
            hits = []
            for i, event in enumerate(loads):
                for earlier in loads[:i]:
                    if (init is not None and init.seq < earlier.seq and not event.get("kept")
                            and _same(event, earlier)
                            and any(earlier.seq < s.seq < event.seq for s in steps)):
                        hits.append((earlier, event))
                        break
            if len(hits) + 1 < _LOADS or hits[0][1].seq in done:
                continue
            first, again = hits[0]
            done.add(again.seq)
            yield self._finding(a, opt, owned, steps, first, again, len(hits) + 1)

    def _finding(self, a, opt, owned, steps, first, again, loads):
        pids = [p for p in again.get("params") or () if p in owned]
        cls = a.optimizer_class(opt) or "the optimizer"
        between = sum(1 for s in steps if first.seq < s.seq < again.seq)
        loc = again.loc
        fix, call = self.fix, "this load_state_dict"
        alias = a.source.self_load_alias(loc.path, loc.line) if loc is not None else None
        if alias is not None:
            target, source, _ = alias
            call = f"{target}.load_state_dict({source}.state_dict())"
            fix = (f"copy the trained weights into the copy, not the other way round: "
                   f"{source}.load_state_dict({target}.state_dict())")
        return self.finding(
            f"{call} loads the same state into {a.names(pids)} again, unchanged since it was "
            f"loaded before, after {between} step{'s' if between != 1 else ''} of {cls} trained "
            f"them: every update since the previous load is discarded ({loads} loads of it in "
            f"the {a.count(steps)} steps run)",
            loc,
            related=(related(first, "the previous load of the same state")
                     if first.loc != loc else None,),
            step=a.step_number.get(max(s.seq for s in steps if s.seq < again.seq)),
            evidence={"params": a.param_names(pids), "loads": loads, "steps_between": between},
            fix=fix)


def _every_step(a, steps, owned) -> bool:
    """params-reset-every-step's case: a reset between every two of at least 3 steps."""
    if a.count(steps) < 3:
        return False
    resets = a.by_kind.get("param_reset", ())
    for before, after in zip(steps, steps[1:]):
        if not any(e.kind == "param_reset" and owned.intersection(e.get("params") or ())
                   and _undoes(e, resets) for e in a.span(before.seq + 1, after.seq - 1)):
            return False
    return True
