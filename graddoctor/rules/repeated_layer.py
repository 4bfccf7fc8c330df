from __future__ import annotations

from ..analysis import written
from ..findings import Severity
from .base import Rule, related


class RepeatedLayer(Rule):
    """
    ## What it does
    Finds an `nn.ModuleList` or `nn.Sequential` built by the script that holds one layer object
    at several positions: `nn.ModuleList([layer] * n)`, `nn.Sequential(*[block] * n)`, or
    `layers.append(layer)` in a loop with `layer` built once before it. Reported when the
    repeated layer's parameters train (an optimizer steps them after a backward wrote them),
    at the line that built or extended the container.

    ## Why is this bad?
    `[layer] * n` repeats a reference, not the layer: the list holds the same object n times.
    The container registers it under every index, but `parameters()` yields its weights once,
    so the "n-layer" stack is one layer applied n times with a single set of weights (n times
    fewer parameters than meant, and every position's gradient summed into that one set).
    Nothing fails: the model trains, with less capacity than its configuration says, and
    `print(model)` shows n layers.

    ## Example
    ```python
    class Encoder(nn.Module):
        def __init__(self, d, n):
            super().__init__()
            layer = nn.Linear(d, d)
            self.layers = nn.ModuleList([layer] * n)
    ```

    ## Use instead
    ```python
    class Encoder(nn.Module):
        def __init__(self, d, n):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(d, d) for _ in range(n)])
            # or: [copy.deepcopy(layer) for _ in range(n)]
    ```

    ## Stays silent on
    A layer shared on purpose by calling it in a loop (`for _ in range(n): x = self.shared(x)`:
    the container holds it once); distinct layers (a list comprehension, `copy.deepcopy` per
    position); a parameter-free module repeated (one `nn.ReLU()` or `nn.Dropout` object at
    several positions of a `Sequential`); one module registered under two attribute names
    (tied encoder/decoder parts); a `ModuleDict` (names, not a stack); containers built inside
    a library (its architecture); repeated layers whose parameters never train.
    """

    code = "GD129"
    slug = "repeated-layer"
    severity = Severity.WARNING
    summary = ("a ModuleList/Sequential holds one layer object at several positions ([layer] * n): "
               "the n layers share one set of weights")
    fix = ("build a new layer for each position: nn.ModuleList([nn.Linear(d, d) for _ in "
           "range(n)]), or copy.deepcopy(layer) per position")

    def check(self, a):
        by_line: dict = {}
        for e in a.of_kind("module_repeated"):
            if e.loc is not None:
                by_line.setdefault((e.loc.path, e.loc.line), []).append(e)
        if not by_line:
            return
        trained = _trained(a)
        for events in by_line.values():
            # one container may repeat several objects (a block and its norm); per object, the
            # event that saw the most positions
            widest: dict = {}
            for e in events:
                key = tuple(e.get("params") or ())
                if key not in widest or len(e["positions"]) > len(widest[key]["positions"]):
                    widest[key] = e
            shown = [e for e in widest.values() if set(e.get("params") or ()) & trained]
            if not shown:
                continue  # the repeated layer never trains: nothing learns less than meant
            e = max(shown, key=lambda e: len(e["positions"]))
            positions = e["positions"]
            n = len(positions)
            pids = [pid for pid in e.get("params") or () if pid in a.params]
            where = ", ".join(positions[:8]) + (", ..." if n > 8 else "")
            message = (f"this {e['container']} holds one {e['cls']} object at {n} positions "
                       f"({where}): it holds {n} references to one object (as [layer] * n makes), so "
                       f"the {n} layers are one layer applied {n} times and train a single set of "
                       f"weights"
                       + (f" ({a.names(pids)})" if pids else "")
                       + f", {n} times fewer than the stack is meant to have")
            others = len(shown) - 1
            if others:
                message += (f"; {others} more repeated module{'s' if others > 1 else ''} in it "
                            f"the same way")
            first = next((b for b in a.of_kind("backward")
                          if set(written(b)) & set(e.get("params") or ())), None)
            yield self.finding(
                message, e.loc,
                related=(related(first, "a backward that trains the shared weights"),) if first else (),
                fix=(f"build a new {e['cls']} for each position (a list comprehension that calls "
                     f"the constructor, or copy.deepcopy(layer) per position)"),
                evidence={"container": e["container"], "cls": e["cls"], "positions": n,
                          "params": [a.param_name(p) for p in pids],
                          "repeated_modules": len(shown)},
            )


def _trained(a) -> set[int]:
    """pids that a backward wrote and an optimizer owning them then stepped."""
    pending: set[int] = set()
    trained: set[int] = set()
    for e in a.of_kind("backward", "step"):
        if e.kind == "backward":
            pending.update(written(e))
        elif not e.get("skipped"):
            trained.update(set(a.opt_params.get(e.get("opt"), ())) & pending)
    return trained
