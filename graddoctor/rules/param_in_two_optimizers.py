from __future__ import annotations

from ..analysis import written
from ..findings import Severity
from .base import Rule, related, times


class ParamInTwoOptimizers(Rule):
    """
    ## What it does
    Finds parameters owned by two optimizers that both step on the same gradient: between one
    `backward()` and the next, each optimizer applies it. Wrappers that step one inner
    optimizer (Lookahead, `torch.optim.swa_utils`), an optimizer rebuilt over the same
    parameters (the old one no longer steps), and two optimizers over separate parameters (a
    GAN) are left alone.

    ## Why is this bad?
    Each step applies the full gradient: the parameters move twice per update, with two
    learning rates, two sets of moments and two weight decays. Usually a second optimizer (or
    a param group) was meant for part of the model, but the first one was still built over
    `model.parameters()`, which includes that part. Training runs, just not with the learning
    rate either optimizer was given.

    ## Example
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    head_optimizer = torch.optim.SGD(model.head.parameters(), lr=0.1)
    ```

    ## Use instead
    ```python
    head = list(model.head.parameters())
    rest = [p for p in model.parameters() if all(p is not h for h in head)]
    optimizer = torch.optim.SGD([{"params": rest},
                                 {"params": head, "lr": 0.1}], lr=0.01)
    ```

    ## Stays silent on
    Lookahead/SWA wrappers stepping one inner optimizer; two optimizers over separate
    parameters (a GAN, one backward feeding both); fp32 master copies owned by the
    optimizer; an optimizer rebuilt (the old one no longer steps); one optimizer per
    parameter stepped inside the backward; weight tying (one parameter, two uses).
    """

    code = "GD115"
    slug = "param-in-two-optimizers"
    severity = Severity.WARNING
    summary = "two optimizers own the same parameters and both step on one gradient"
    fix = ("give each parameter to one optimizer: build the other one over the remaining "
           "parameters, or use one optimizer with a param group per learning rate")

    def check(self, a):
        # pid -> (opt, step event) of the latest step that applied its current gradient
        applied: dict[int, tuple[int, object]] = {}
        hits: dict[tuple[int, int], list] = {}  # (first opt, second opt) -> [(second step, pids)]
        for e in a.events:
            kind = e.kind
            if kind == "backward":
                for pid in written(e):
                    applied.pop(pid, None)
            elif kind == "clear":
                for pid in e.get("params") or ():
                    applied.pop(pid, None)
            elif kind == "step":
                if e.get("skipped") or e.get("closure"):
                    continue
                opt = e.get("opt")
                without = set(e.get("without_grad") or ())
                twice = []
                for pid in dict.fromkeys(a.opt_params.get(opt, ())):
                    if pid in without:
                        continue
                    before = applied.get(pid)
                    if before is not None and before[0] != opt:
                        twice.append((before[0], pid))
                    applied[pid] = (opt, e)
                by_first: dict[int, list[int]] = {}
                for first, pid in twice:
                    by_first.setdefault(first, []).append(pid)
                for first, pids in by_first.items():
                    hits.setdefault((first, opt), []).append((e, pids))
        for (first, second), items in hits.items():
            one, two = a.optimizers.get(first), a.optimizers.get(second)
            if one is None or two is None:
                continue
            later, earlier = (two, one) if two.seq > one.seq else (one, two)
            pids = list(dict.fromkeys(pid for _e, ps in items for pid in ps))
            step = items[0][0]
            yield self.finding(
                f"{a.names(pids)} are owned by both {a.optimizer_name(first)} and "
                f"{a.optimizer_name(second)}, and both step on the same gradient: each update "
                f"applies it twice (seen {times(a.count(e for e, _ in items))})",
                later.loc,
                related=(related(earlier, f"{a.optimizer_name(earlier['opt'])}, which owns them too"),
                         related(step, "the second step on the same gradient")),
                step=a.step_number.get(step.seq),
                evidence={"params": [a.param_name(p) for p in pids],
                          "optimizers": [a.optimizer_name(first), a.optimizer_name(second)],
                          "occurrences": a.count(e for e, _ in items)},
            )
