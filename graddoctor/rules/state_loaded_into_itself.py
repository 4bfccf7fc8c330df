from __future__ import annotations

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule


class StateLoadedIntoItself(Rule):
    """
    ## What it does
    Finds a `load_state_dict` whose state holds, for every parameter it names, that very
    parameter's storage: the "other" module the state came from is the same module under a
    second name (`target_net = policy_net`), or one that shares all its parameters. Told by
    storage when the load runs.

    ## Why is this bad?
    An assignment does not copy a module: `target_net = policy_net` names one network twice,
    and `target_net.load_state_dict(policy_net.state_dict())` copies each parameter onto itself.
    The target network (or the EMA, "best" or frozen copy) is the network being trained: it
    follows every update instead of lagging behind it. A DQN then bootstraps from the moving
    network its target network was meant to hold still (the instability a target network
    prevents), and a "best" checkpoint kept this way is always the latest weights.

    ## Example
    ```python
    target_net = policy_net
    ...
    if step % sync_every == 0:
        target_net.load_state_dict(policy_net.state_dict())
    ```

    ## Use instead
    ```python
    target_net = copy.deepcopy(policy_net)  # its own parameters
    ...
    if step % sync_every == 0:
        target_net.load_state_dict(policy_net.state_dict())
    ```

    ## Stays silent on
    A copy made with `copy.deepcopy` or a second constructor call, a checkpoint from
    `torch.load`, a state that shares only some parameters (tied embeddings), and a
    `state_dict()` snapshot restored after training went on (snapshot-aliases-params' finding).
    """

    code = "GD140"
    slug = "state-loaded-into-itself"
    severity = Severity.WARNING
    summary = ("load_state_dict copies a module's parameters onto themselves: the module the state "
               "comes from is the same one (target = model), so the copy follows every update")
    fix = ("make the copy its own module: target = copy.deepcopy(model) (an assignment names the "
           "same module twice); load_state_dict then copies the weights into it")

    def check(self, a):
        aliased = {e.loc for e in a.by_kind.get("snapshot_alias", ()) if e.loc is not None}
        seen = set()
        for event in a.by_kind.get("state_self_load", ()):
            loc = event.loc
            if loc is None or loc in aliased or loc in seen:
                continue
            seen.add(loc)
            alias = a.source.self_load_alias(loc.path, loc.line)
            fix, where, call = self.fix, loc, "load_state_dict"
            if alias is not None:
                target, source, assigned = alias
                call = f"{target}.load_state_dict({source}.state_dict())"
                why = (f"`{target} = {source}` names one module twice" if assigned is not None
                       else f"{target} holds {source}'s own parameters")
                fix = (f"make {target} its own module: {target} = copy.deepcopy({source}) "
                       f"({why}); load_state_dict then copies {source}'s weights into it")
                if assigned is not None:
                    where = Location(loc.path, assigned, loc.function)
            n = event.get("params")
            yield self.finding(
                f"{call} copies the {n} parameter{'s' if n != 1 else ''} of {event.get('cls')} "
                f"onto themselves: the state holds the module's own tensors, so "
                f"{alias[0] if alias else 'the loaded module'} and "
                f"{alias[1] if alias else 'the module the state came from'} are one module. "
                f"The copy follows every update instead of holding older weights (a DQN's target "
                f"network, an EMA, a best checkpoint)",
                where, evidence={"cls": event.get("cls"), "params": n},
                related=(() if where is loc else (Related(loc, "the load that copies nothing"),)),
                fix=fix)
