from __future__ import annotations

from ..findings import Severity
from .base import Rule, related


class ParamReplaced(Rule):
    """
    ## What it does
    Finds parameters replaced in their module after an optimizer was built over them, while
    that optimizer goes on stepping: a new `nn.Parameter` assigned over an old one (in an init
    function given to `model.apply`, in a `reset()` method), `load_state_dict(..., assign=True)`,
    or a submodule assigned over the one that held them (`model.fc = nn.Linear(...)`). The
    finding points at the line that made the replacement, not at the optimizer. Parameters
    tied after the optimizer was built (the new tensor is one the optimizer owns too) are
    reported as `info`: nothing trains differently, the optimizer only holds a dead tensor.

    ## Why is this bad?
    An optimizer holds the tensors it was given, not the module attributes. After the
    replacement it keeps stepping the old tensors, which the model no longer uses (they get no
    gradient), and the new ones, which get every gradient, belong to no optimizer: those layers
    never train, although the loss flows through them and nothing fails.

    ## Example
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    def init(m):
        if isinstance(m, nn.Linear):
            m.weight = nn.Parameter(torch.randn_like(m.weight) * 0.02)
    model.apply(init)
    ```

    ## Use instead
    ```python
    def init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)   # in place: the same tensor
    model.apply(init)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # or built after the change
    ```

    ## Stays silent on
    Replacements made before the optimizer is built (a new head, tied embeddings, weights
    loaded with `assign=True`), in-place initialisation (`nn.init.*_`, `copy_` under
    `no_grad`), and an optimizer rebuilt over the new parameters after the change.
    """

    code = "GD119"
    slug = "param-replaced"
    severity = Severity.WARNING
    summary = ("a parameter is replaced after the optimizer was built: the optimizer steps the "
               "old tensor, the new one never trains")
    fix = ("change the parameter in place (nn.init.*_ or copy_ under torch.no_grad()), or build "
           "the optimizer after this line")

    def check(self, a):
        by_line: dict = {}
        for e in a.replacements:
            key = (e.loc.path, e.loc.line) if e.loc is not None else None
            by_line.setdefault(key, []).append(e)
        first = a.ledger.first_contribution
        for events in by_line.values():
            old = list(dict.fromkeys(pid for e in events for pid in e.get("old") or ()))
            new = list(dict.fromkeys(pid for e in events for pid in e.get("new") or ()))
            lost = [pid for pid in new if pid in first and not a.owners.get(pid)]
            owned_new = [pid for pid in new if a.owners.get(pid)]
            opts = sorted({opt for pid in old for opt in a.owners.get(pid, ())})
            name = " and ".join(a.optimizer_name(o) for o in opts) or "the optimizer"
            e = events[0]
            init = a.optimizers.get(opts[0]) if opts else None
            via = e.get("via")
            shown = a.names(lost or new or old)
            text = a.source.line_text(e.loc.path, e.loc.line) if e.loc is not None else ""
            if "load_state_dict" in text:
                how = "load_state_dict(assign=True) puts the loaded tensors in place of"
                fix = ("load without assign=True (load_state_dict copies into the existing "
                       "parameters), or build the optimizer after loading")
            elif via == "module":
                attr = e.get("attr")
                how = f"a new submodule assigned as .{attr} takes the place of the one holding"
                fix = (f"build the optimizer after replacing .{attr}, or give it the new "
                       f"parameters: optimizer.add_param_group({{'params': <module>.{attr}.parameters()}})")
            else:
                how = "a new tensor registered here takes the place of"
                fix = None
            evidence = {"params": a.param_names(lost or new), "old": len(old), "via": via,
                        "optimizers": [a.optimizer_name(o) for o in opts]}
            rel = (related(init, f"{name}, built over the old tensors"),)
            if lost:
                yield self.finding(
                    f"{shown}: {how} the parameters {name} was built over, after it was built. "
                    f"{name} keeps stepping the old tensors, which the model no longer uses, "
                    f"while the new ones get every gradient and belong to no optimizer: they "
                    f"never train",
                    e.loc, related=rel + (related(first[lost[0]], "the backward that gives the new ones gradients"),),
                    fix=fix, evidence={**evidence, "lost": len(lost)})
            elif owned_new and len(owned_new) == len(new):
                yield self.finding(
                    f"{shown}: {how} parameters {name} was built over, after it was built; the "
                    f"new tensor is one {name} owns as well (tied weights), so training is "
                    f"unchanged, but {name} still holds the replaced tensor, which no longer "
                    f"gets a gradient",
                    e.loc, related=rel, severity=Severity.INFO,
                    fix="tie the weights before building the optimizer", evidence=evidence)
