from __future__ import annotations

import ast

from ..analysis import written
from ..findings import Severity
from ..trace import Location
from .base import Rule, related
from ..analysis.source import walk

MIN_UPDATES = 2  # updates whose gradients no DDP forward made before it is reported


class DDPForwardBypassed(Rule):
    """
    ## What it does
    Finds a model wrapped in `DistributedDataParallel` whose training loss is computed around
    the wrapper — `model.module(x)`, `model.module.forward(x)`, accelerate's
    `accelerator.unwrap_model(model)(x)` — so that no DDP forward runs
    before the backward: the optimizer then steps the wrapped parameters on gradients no
    all-reduce produced. Reported when every backward since the previous step wrote them
    without a DDP forward, for two updates or more, at the `.module(...)` call (or the
    `unwrap_model(...)` call) when the script shows a single one, else at the backward.

    ## Why is this bad?
    DDP all-reduces gradients from hooks that its own `forward` arms (it marks the parameters
    that will get gradients and starts the reducer for that iteration). Called through
    `.module`, the model runs as a plain module: each rank's backward writes only its own
    gradient, every rank steps on it, and the replicas, which DDP synchronised once at
    construction, drift apart from the first step (with N ranks, each trains on 1/N of the data
    alone). On one rank nothing differs, which is why the bug survives a single-GPU test.

    ## Example
    ```python
    model = DDP(net, device_ids=[rank])
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model.module(x), y)  # around DDP: no all-reduce
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
        loss = F.cross_entropy(model(x), y)  # DDP's forward: its backward averages gradients
    ```

    ## Stays silent on
    `model.module` used for evaluation under `no_grad`, for saving (`model.module.state_dict()`)
    or for a part whose gradients the same iteration's DDP forward also reaches (an auxiliary
    head called through `.module` next to `model(x)`); `no_sync()` micro-batches (DDP's forward
    runs, with its all-reduce postponed on purpose); backwards never stepped; FSDP.
    """

    code = "GD406"
    slug = "ddp-forward-bypassed"
    severity = Severity.ERROR
    summary = ("the loss is computed through model.module (around DistributedDataParallel): its "
               "backward all-reduces nothing and each rank steps on its own gradient")
    fix = ("compute the training loss through the DDP wrapper (`model(x)`, not `model.module(x)`); "
           "keep model.module for saving and evaluation")

    def check(self, a):
        inits = a.of_kind("ddp_init")
        if not inits:
            return
        wrapped: set[int] = set()
        for e in inits:
            wrapped.update(e.get("params") or ())
        world = max((e.get("world") or 0 for e in inits), default=0)
        window: list = []  # the backwards since the last step that wrote wrapped parameters
        hits: list = []  # (step, backwards): updates whose wrapped gradients no DDP forward made
        for e in a.of_kind("backward", "step", "clear"):
            if e.kind == "backward":
                mine = wrapped.intersection(written(e))
                if mine:
                    window.append((e, mine))
            elif e.kind == "clear":
                cleared = set(e.get("params") or ())
                window = [(b, mine - cleared) for b, mine in window if mine - cleared]
            elif not e.get("skipped"):
                owned = set(a.opt_params.get(e.get("opt"), ()))
                used = [(b, mine & owned) for b, mine in window if mine & owned]
                if used and all("allreduce" not in b.data for b, _ in used):
                    hits.append((e, [b for b, _ in used]))
                window = [(b, mine - owned) for b, mine in window if mine - owned]
        if a.count(step for step, _ in hits) < MIN_UPDATES:
            return
        step, backwards = hits[0]
        back = backwards[-1]
        call = _module_call(a, back.loc)
        pids = sorted({p for b in backwards for p in written(b)} & wrapped)
        ranks = (f"with {world} ranks each one steps on its own gradient and the replicas drift "
                 f"apart from the first step" if world and world > 1 else
                 "on one rank nothing differs, but with N ranks each one steps on its own "
                 "gradient and the replicas drift apart")
        yield self.finding(
            f"{'the training forward goes from this line' if call else 'the loss backpropagated here is computed'} "
            f"around the model's DistributedDataParallel wrapper (no DDP forward before any backward of "
            f"{a.count(s for s, _ in hits)} "
            f"updates), so DDP's hooks are not armed and the gradients of {a.names(pids)} are "
            f"never all-reduced: {ranks}",
            call or back.loc,
            related=tuple(r for r in (related(back, "the backward whose gradients stay local") if call else None,
                                      related(inits[0], "the DistributedDataParallel wrapper"),
                                      related(step, "a step on gradients no all-reduce made"))
                          if r is not None),
            severity=Severity.ERROR if world and world > 1 else Severity.WARNING,
            fix=(("compute the training loss through the model accelerator.prepare() returned "
                  "(`model(x)`), not accelerator.unwrap_model(model) or model.module; keep the "
                  "unwrapped model for saving and evaluation")
                 if a.framework == "accelerate" else self.fix),
            step=a.step_number.get(step.seq),
            evidence={"updates": a.count(s for s, _ in hits), "world": world or None,
                      "params": a.param_names(pids, 8)})


def _module_call(a, loc: Location | None) -> Location | None:
    """The single ``x.module(...)`` / ``x.module.forward(...)`` call of the backward's file:
    the forward that goes around the wrapper. None when there is none or several."""
    if loc is None:
        return None
    tree = a.source.tree(loc.path)
    if tree is None:
        return None
    lines = set()
    for node in walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        func = node.func
        if func.attr == "forward" and isinstance(func.value, ast.Attribute):
            func = func.value
        if func.attr == "module" and not _no_grad_inside(tree, node.lineno):
            lines.add(node.lineno)
    if not lines:  # accelerate: the module accelerator.unwrap_model(model) returns, trained
        lines = {node.lineno for node in walk(tree) if isinstance(node, ast.Call)
                 and isinstance(node.func, ast.Attribute) and node.func.attr == "unwrap_model"
                 and not _no_grad_inside(tree, node.lineno)}
    if len(lines) != 1:
        return None
    return Location(loc.path, lines.pop())


def _no_grad_inside(tree, line: int) -> bool:
    """Whether ``line`` sits in a ``with torch.no_grad():`` / ``inference_mode()`` block."""
    for node in walk(tree):
        if isinstance(node, ast.With) and node.lineno <= line <= (node.end_lineno or node.lineno):
            for item in node.items:
                text = ast.unparse(item.context_expr)
                if "no_grad" in text or "inference_mode" in text:
                    return True
    return False
