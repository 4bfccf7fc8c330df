from __future__ import annotations

from ..analysis import written
from ..findings import Severity
from .base import Rule, related, times


class ParamInTwoOptimizers(Rule):
    """
    ## What it does
    Finds parameters owned by two optimizers that both step on the same gradient: between one
    `backward()` and the next, each optimizer applies it. Also finds an optimizer whose
    parameters are all owned by a second, larger optimizer too, when the two keep stepping in
    turn on the gradients of two different losses (a bilevel split: DARTS's architecture
    optimizer on the validation loss, the weight optimizer on the training loss): the
    smaller one's parameters learn from the larger one's loss as well. Wrappers that step one inner
    optimizer (Lookahead, `torch.optim.swa_utils`), an optimizer rebuilt over the same
    parameters (the old one no longer steps), and two optimizers over separate parameters (a
    GAN) are left alone.

    ## Why is this bad?
    Each step applies the full gradient: the parameters move twice per update, with two
    learning rates, two sets of moments and two weight decays. Usually a second optimizer (or
    a param group) was meant for part of the model, but the first one was still built over
    `model.parameters()`, which includes that part. Training runs, just not with the learning
    rate either optimizer was given. In a bilevel split the damage is the loss: architecture
    parameters (or loss weights, or hyper-parameters) that the weight optimizer also steps are
    fitted to the training batches they were meant to be kept apart from.

    ## Example
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    head_optimizer = torch.optim.SGD(model.head.parameters(), lr=0.1)
    ```
    ```python
    w_opt = torch.optim.SGD(model.parameters(), lr=0.05)   # model.alpha included
    a_opt = torch.optim.Adam([model.alpha], lr=3e-3)
    for (xt, yt), (xv, yv) in zip(train_loader, val_loader):
        a_opt.zero_grad(); F.cross_entropy(model(xv), yv).backward(); a_opt.step()
        w_opt.zero_grad(); F.cross_entropy(model(xt), yt).backward(); w_opt.step()
    ```

    ## Use instead
    ```python
    head = list(model.head.parameters())
    rest = [p for p in model.parameters() if all(p is not h for h in head)]
    optimizer = torch.optim.SGD([{"params": rest},
                                 {"params": head, "lr": 0.1}], lr=0.01)
    ```
    ```python
    weights = [p for name, p in model.named_parameters() if name != "alpha"]
    w_opt = torch.optim.SGD(weights, lr=0.05)
    ```

    ## Stays silent on
    Lookahead/SWA wrappers stepping one inner optimizer; two optimizers over separate
    parameters (a GAN, one backward feeding both); fp32 master copies owned by the
    optimizer; an optimizer rebuilt (the old one no longer steps); one optimizer per
    parameter stepped inside the backward; weight tying (one parameter, two uses); a head
    trained alone by its own optimizer for a warm-up and then with the rest by another (the
    two take turns once, not at every update); optimizers that take turns on one loss.
    """

    code = "GD115"
    slug = "param-in-two-optimizers"
    severity = Severity.WARNING
    summary = ("two optimizers own the same parameters and both step on one gradient, or a "
               "larger optimizer also steps a smaller one's parameters on the gradient of "
               "another loss (DARTS's architecture parameters in the weight optimizer)")
    fix = ("give each parameter to one optimizer: build the other one over the remaining "
           "parameters, or use one optimizer with a param group per learning rate")

    def check(self, a):
        yield from self._same_gradient(a)
        yield from self._two_losses(a)

    def _same_gradient(self, a):
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

    def _two_losses(self, a):
        """An optimizer whose parameters a larger optimizer owns too, the two stepping them in
        turn, each on the gradient of its own backward line."""
        wrote: dict[int, object] = {}  # pid -> the backward that last wrote its gradient
        # (opt, pid) -> the backward lines whose gradients its steps applied
        applied: dict[tuple[int, int], set[int]] = {}
        turns: dict[int, list[tuple[int, object]]] = {}  # pid -> [(opt, step event)] in order
        for e in a.replayed(2):
            kind = e.kind
            if kind == "backward":
                for pid in written(e):
                    wrote[pid] = e
            elif kind == "clear":
                for pid in e.get("params") or ():
                    wrote.pop(pid, None)
            elif kind == "step":
                if e.get("skipped") or e.get("closure"):
                    continue
                opt = e.get("opt")
                without = set(e.get("without_grad") or ())
                for pid in dict.fromkeys(a.opt_params.get(opt, ())):
                    back = wrote.get(pid)
                    if pid in without or back is None or back.loc is None:
                        continue
                    applied.setdefault((opt, pid), set()).add(back.loc.line)
                    seen = turns.setdefault(pid, [])
                    if not seen or seen[-1][0] != opt:
                        seen.append((opt, e))
        owned = {opt: set(pids) for opt, pids in a.opt_params.items()}
        for small, mine in owned.items():
            for large, theirs in owned.items():
                if small == large or not mine or not mine < theirs:
                    continue
                small_lines: set[int] = set()
                large_lines: set[int] = set()
                switches, step = None, None
                for pid in mine:
                    own, other = applied.get((small, pid)), applied.get((large, pid))
                    if not own or not other:
                        break
                    small_lines.update(own)
                    large_lines.update(other)
                    order = [o for o, _ in turns.get(pid, ()) if o in (small, large)]
                    order = [o for i, o in enumerate(order) if i == 0 or order[i - 1] != o]
                    count = len(order) - 1
                    switches = count if switches is None else min(switches, count)
                    step = step or next((ev for o, ev in turns.get(pid, ()) if o == large), None)
                else:
                    # each optimizer on its own loss, taking turns at every update (a warm-up
                    # of the small one before the large one takes over turns once)
                    if not switches or switches < 3 or small_lines & large_lines:
                        continue
                    one, two = a.optimizers.get(small), a.optimizers.get(large)
                    if one is None or two is None:
                        continue
                    yield self._two_losses_finding(a, small, large, sorted(mine), one, two, step,
                                                   min(small_lines), min(large_lines))

    def _two_losses_finding(self, a, small, large, pids, one, two, step, small_line, large_line):
        small_name, large_name = a.optimizer_name(small), a.optimizer_name(large)
        one_param = len(pids) == 1
        return self.finding(
            f"{a.names(pids)} {'is' if one_param else 'are'} stepped by {small_name} on the "
            f"gradient of the backward at line {small_line}, and also by {large_name}, which owns "
            f"{'it' if one_param else 'them'} too, on the gradient of the backward at line "
            f"{large_line}: the two take turns at every update, so {small_name}'s parameters "
            f"also learn from the loss {large_name} trains the others on (in a bilevel split "
            f"such as DARTS: the architecture parameters fit the training batches)",
            two.loc,
            related=(related(one, f"{small_name}, which owns them"),
                     related(step, f"a step of {large_name} that applies their gradient")),
            step=a.step_number.get(step.seq) if step is not None else None,
            evidence={"params": [a.param_name(p) for p in pids],
                      "optimizers": [small_name, large_name],
                      "backward_lines": [small_line, large_line]},
            fix=(f"build {large_name} over its other parameters only: leave out "
                 f"{a.names(pids)}, which {small_name} trains"),
        )
