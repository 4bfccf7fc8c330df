from __future__ import annotations

import ast
import re
from dataclasses import replace

from ..analysis import written
from ..findings import Role, Severity
from .allreduce_not_averaged import _loss_factor, _summed_as_is
from .base import Rule, plural, related
from .unscaled_accumulation import SCALE_INVARIANT
from ..analysis.source import walk

_CLOSE = 1e-3  # relative: a loss factor of exactly 1 / world
MIN_UPDATES = 2  # updates seen with the loss divided by the world size before it is said
# a divisor the script names as the number of ranks (`world_size`, `dist.get_world_size()`,
# `accelerator.num_processes`, `args.n_gpus`)
_WORLD_NAME = re.compile(r"world|num_replicas|nprocs|num_processes|n_?gpus|num_gpus|gpu_count|"
                         r"num_devices|n_?devices|dp_size|ddp_size|n_?ranks|num_ranks",
                         re.IGNORECASE)


def ddp_world(a) -> int | None:
    """The number of ranks the DistributedDataParallel modules were built over (2 or more),
    or None (no DDP, a group of one, ranks that disagree)."""
    worlds = {e.get("world") for e in a.of_kind("ddp_init")}
    if len(worlds) != 1:
        return None
    world = next(iter(worlds))
    return world if isinstance(world, int) and world >= 2 else None


def _names_world(node) -> bool:
    try:
        text = ast.unparse(node)
    except Exception:
        return False
    return bool(_WORLD_NAME.search(text))


def world_division(text: str) -> bool:
    """The statement divides by something it names as the world size: ``loss / world_size``,
    ``loss /= dist.get_world_size()``, ``loss * (1 / args.n_gpus)``."""
    try:
        tree = ast.parse(text.strip())
    except SyntaxError:
        return False
    for node in walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _names_world(node.right):
            return True
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div) and _names_world(node.value):
            return True
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for side in (node.left, node.right):
                if isinstance(side, ast.BinOp) and isinstance(side.op, ast.Div) \
                        and isinstance(side.left, ast.Constant) and side.left.value == 1 \
                        and _names_world(side.right):
                    return True
    return False


class DdpAverageRedone(Rule):
    """
    ## What it does
    Finds a script that redoes the averaging `DistributedDataParallel` already does over the
    ranks:

    * the loss of a DDP forward is divided by the world size before `backward()`
      (`loss / world_size`, `loss / dist.get_world_size()`): the loss's constant factor, read
      from its autograd graph, is exactly 1/N over every update (1/N in all of an accumulation
      window's micro-batches together), and the line that makes the loss divides by a name of
      the world size;
    * the gradients a DDP backward has already averaged are all-reduced again by hand with
      `ReduceOp.SUM` (`dist.all_reduce(p.grad)` after `loss.backward()`) and reach
      `optimizer.step()` as that sum.

    ## Why is this bad?
    DDP's backward all-reduces the gradients and divides them by the number of ranks: every
    rank holds the mean gradient of the global batch, as one process would over the whole
    batch. Dividing the loss by the world size as well makes each update N times smaller
    (with SGD the learning rate is in effect divided by the number of GPUs, and changes when
    they do); summing the averaged gradients once more makes it N times larger. Nothing fails;
    the run just trains as if its learning rate were wrong, and differently on 2 and on 8 GPUs.

    ## Example
    ```python
    model = DDP(net)
    for x, y in loader:
        loss = criterion(model(x), y) / dist.get_world_size()
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    model = DDP(net)
    for x, y in loader:
        loss = criterion(model(x), y)   # DDP averages the gradients over the ranks
        loss.backward()
        optimizer.step()
    ```

    ## Stays silent on
    Hand-written data parallelism without DDP (the loss divided by the world size before a SUM
    all-reduce is the mean; `allreduce-not-averaged` judges that); a loss divided by the
    accumulation steps only; a summed loss divided by a count; a constant factor of 1/N that the
    source does not name as the world size (a loss weight of 0.5 on two ranks); a hand
    all-reduce followed by the division by the world size (redundant but the mean); all-reduces
    of metrics and losses; `no_sync()` backwards; a group of one rank.
    """

    code = "GD298"
    slug = "ddp-average-redone"
    severity = Severity.WARNING
    summary = ("the script redoes DistributedDataParallel's average over the ranks (the loss "
               "divided by the world size, or the gradients all-reduced again): each update is "
               "N times too small or too large")
    fix = ("let DistributedDataParallel average the gradients: do not divide the loss by the "
           "world size, and do not all-reduce the gradients of a DDP model again")

    def check(self, a):
        world = ddp_world(a)
        if world is None:
            return
        yield from self._loss_divided(a, world)
        yield from self._summed_again(a, world)

    # -- the loss divided by the world size ---------------------------------------------------
    def _loss_divided(self, a, world):
        clips = a.of_kind("clip")
        for opt, windows in a.windows.items():
            judged = []
            for w in windows:
                if not w.backwards or not all(b.get("allreduce") is not None for b in w.backwards):
                    continue  # not every backward ran on a DDP forward
                if not w.backwards[-1].get("allreduce"):
                    continue  # the last one under no_sync(): step-without-allreduce's
                factor = _loss_factor(w.backwards)
                if factor is None:
                    judged = []
                    break  # a summed loss or a factor the graph cannot tell: not judged
                judged.append((w, factor))
            if not judged or a.count(w.step for w, _ in judged) < MIN_UPDATES:
                continue
            if not all(abs(f * world - 1) <= _CLOSE for _, f in judged):
                continue
            w = judged[0][0]
            backward = w.backwards[-1]
            loc = backward.loc
            if loc is None:
                continue
            assigned = a.source.loss_assignment(loc.path, loc.line, framework=loc.via == "accelerate")
            texts = [a.source.line_text(loc.path, loc.line)]
            if assigned is not None:
                texts.insert(0, assigned[1])
            if not any(world_division(t.split("  #")[0]) for t in texts if t):
                continue  # a factor of 1/N the source does not name as the world size
            if assigned is not None and world_division(assigned[1].split("  #")[0]):
                loc = replace(loc, line=assigned[0], function="", via="", hook="")
            name, cls = a.optimizer_name(opt), a.optimizer_class(opt)
            owned = set(a.opt_params.get(opt, ()))
            clipped = any(owned.intersection(c.get("params") or ()) for c in clips)
            n = a.count(x.step for x, _ in judged)
            message = (f"this loss is divided by the world size ({world}) before backward(), but "
                       f"the model is a DistributedDataParallel, whose backward already averages "
                       f"the gradients over the {world} ranks: the gradients {name} applies are "
                       f"the global batch's mean divided by {world} once more ({plural(n, 'update')} "
                       f"like this, first at step {w.index})")
            severity = None
            if cls in SCALE_INVARIANT and not clipped:
                severity = Severity.INFO
                message += (f"; {cls} largely cancels a constant factor, so the update changes "
                            f"little: it matters once you clip or switch optimizer")
            else:
                message += (f": with {cls or 'SGD'} the learning rate is in effect {world} times "
                            f"smaller, and changes with the number of GPUs")
            yield self.finding(
                message, loc, step=w.index, severity=severity,
                related=tuple(r for r in (related(backward, "the backward DDP all-reduces (and "
                                                            "averages)", Role.BACKWARD),
                                          related(w.step, "the step that applies the mean / "
                                                          f"{world}", Role.STEP)) if r is not None),
                evidence={"world_size": world, "cause": "loss_divided", "updates": n,
                          "loss_factor": judged[0][1], "optimizer_class": cls},
                fix=(f"drop the division by the world size: DistributedDataParallel already "
                     f"averages the gradients over the ranks (divide the loss only by the "
                     f"accumulation steps, if any)"))

    # -- the averaged gradients all-reduced again ------------------------------------------------
    def _summed_again(self, a, world):
        since: dict[int, list] = {}
        groups: dict = {}
        for e in a.events:
            kind = e.kind
            if kind == "backward":
                for opt in {o for pid in written(e) for o in a.owners.get(pid, ())}:
                    since.setdefault(opt, []).append(e)
            elif kind == "step":
                since.pop(e.get("opt"), None)
            elif kind == "grad_allreduce" and _summed_as_is(e):
                backwards = since.get(e.get("opt"), [])
                if not backwards or not backwards[-1].get("allreduce"):
                    continue  # no DDP backward (allreduce-not-averaged's), or one under no_sync()
                factor = _loss_factor(backwards)
                if factor is None or factor * e["world"] <= 1 + _CLOSE:
                    continue  # the loss divided by the world size: the sum is the mean again
                groups.setdefault(e.loc, []).append((e, backwards))
        clips = a.of_kind("clip")
        for loc, items in groups.items():
            e, backwards = items[0]
            n, opt = e["world"], e.get("opt")
            cls = a.optimizer_class(opt) if opt is not None else ""
            owned = set(a.opt_params.get(opt, ()))
            clipped = any(owned.intersection(c.get("params") or ()) for c in clips)
            step = a.next_step(e.seq)
            message = (f"this all_reduce sums over the {n} ranks gradients that the "
                       f"DistributedDataParallel backward has already averaged over them: "
                       f"{a.optimizer_name(opt)}.step() applies {n}x the mean gradient, as if "
                       f"the learning rate were multiplied by the number of GPUs "
                       f"({plural(a.count(i for i, _ in items), 'update')} like this, first at "
                       f"step {a.next_step_number(e.seq)})")
            severity = None
            if cls in SCALE_INVARIANT and not clipped:
                severity = Severity.INFO
                message += (f"; {cls} largely cancels a constant factor, so the update changes "
                            f"little: it matters once you clip or switch optimizer")
            yield self.finding(
                message, loc, step=a.next_step_number(e.seq), severity=severity,
                related=tuple(r for r in (related(backwards[-1], "the DDP backward that already "
                                                                 "averaged them", Role.BACKWARD),
                                          related(step, "the step that applies the sum",
                                                  Role.STEP)) if r is not None),
                evidence={"world_size": n, "cause": "summed_again", "op": "sum",
                          "params": e["params"], "updates": a.count(i for i, _ in items),
                          "optimizer_class": cls},
                fix=("remove this all_reduce of the gradients: DistributedDataParallel's "
                     "backward has already averaged them over the ranks (all-reduce by hand "
                     "only for a model not wrapped in DDP)"))
