from __future__ import annotations

from ..findings import Severity
from ..location import Location
from .base import Related, Rule


class GraphKeptAlive(Rule):
    """
    ## What it does
    Finds autograd graphs of earlier steps that the script keeps referenced: a loss added into
    a running total as a tensor (`total += loss`), losses or model outputs appended to a list
    (`history.append(loss)`), a metrics object summing tensors. Several backwards later the
    earlier graphs are still alive; the finding names the variable and the line that keeps them.

    ## Why is this bad?
    Each kept tensor holds its whole autograd graph: its nodes, and what the forward saved
    wherever the backward did not free it. One more graph per step: memory grows until the run
    fails with out-of-memory hours later, and the total itself builds an ever longer graph.

    ## Example
    ```python
    running = 0.0
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        running += loss            # keeps every step's graph
    ```

    ## Use instead
    ```python
    running = 0.0
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        running += loss.item()     # a number; or loss.detach()
    ```

    ## Stays silent on
    `loss.item()` / `loss.detach()` kept; the last step's loss kept in a variable, also when it
    is computed only once per several updates (WGAN-GP's `g_loss`, every `n_critic` critic
    updates) and so outlives a few of them; the sum of one update's losses kept for a log line
    (DCGAN's `errD = errD_real + errD_fake`): a variable must keep the graphs of two updates or
    more; a hidden state carried across steps (hidden-state-not-detached judges that).
    """

    code = "GD238"
    slug = "graph-kept-alive"
    severity = Severity.WARNING
    summary = "tensors with the autograd graphs of earlier steps stay referenced: memory grows every step"
    fix = "keep loss.item() (a number) or loss.detach() instead of the tensor"

    def check(self, a):
        if any(b.get("history") for b in a.of_kind("backward")):
            return  # a backward reaches an earlier graph on purpose: hidden-state-not-detached
        for e in a.of_kind("graph_kept"):
            name, holder = e.get("name"), e.get("holder")
            if e.loc is None:
                continue
            line = a.source.keeping_line(e.loc.path, e.loc.line, name)
            loc = Location(e.loc.path, line) if line is not None else e.loc
            what = {"tensor": f"the tensor {name}", "list": f"the list {name}",
                    "dict": f"the dict {name}", "attribute": f"an attribute of {name}"}.get(holder, name)
            yield self.finding(
                f"{what} still holds the autograd graphs of earlier steps several backwards "
                "later: each step adds one more graph, so memory grows until the run runs out",
                loc, related=(Related(e.loc, "the backward where they were found"),)
                if loc != e.loc else (),
                fix=f"keep a number or a detached tensor in {name}: .item() or .detach()",
                evidence={"name": name, "holder": holder, "steps": e.get("steps")})
