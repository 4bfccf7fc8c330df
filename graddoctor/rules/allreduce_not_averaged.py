from __future__ import annotations

from ..analysis import written
from ..findings import Role, Severity
from .base import Rule, plural, related
from .unscaled_accumulation import SCALE_INVARIANT

_SAME = 1e-4  # relative: a scale of 1 read from two norms of the same values


def _summed_as_is(e) -> bool:
    """A ``grad_allreduce`` whose gradients were summed over several ranks and reached the
    step as the sum: op SUM, nothing changed them before the all-reduce, nothing divided them
    after it."""
    scale = e.get("scale")
    return (e.get("op") == "sum" and (e.get("world") or 0) > 1 and not e.get("before")
            and isinstance(scale, (int, float)) and abs(scale - 1.0) <= _SAME)


def _loss_factor(backwards) -> float | None:
    """What the update's backwards multiplied their losses by, added up (``loss / k`` over k
    micro-batches: 1); None when one of them cannot tell or sums its loss (a sum normalised by
    a count of the script's own, maybe the global batch: not judged)."""
    total = 0.0
    for b in backwards:
        factor = b.get("loss_scale_factor")
        if not isinstance(factor, (int, float)) or "sum" in (b.get("loss_terms") or ()):
            return None
        total += factor
    return total


class AllreduceNotAveraged(Rule):
    """
    ## What it does
    Finds gradients that the script all-reduces itself (hand-written data parallelism, no
    `DistributedDataParallel`) with the default `ReduceOp.SUM` and that reach
    `optimizer.step()` as that sum: nothing divides them by the world size afterwards, before
    the all-reduce, or through the loss. It points at the `all_reduce` call. graddoctor compares
    the gradients each step applies with what the all-reduce produced (the per-parameter
    `dist.all_reduce(p.grad)` loop, its `.data` variant, and a flat `torch.cat` buffer copied
    back into the gradients), during the first updates.

    ## Why is this bad?
    `all_reduce` adds the ranks' gradients. Without the division every rank applies N times
    the mean gradient: the learning rate is silently multiplied by the number of ranks, and the
    same script trains differently on 2 and on 8 GPUs. Nothing crashes; SGD-like optimizers
    overshoot or diverge, and hyper-parameters tuned on one setup do not transfer.

    ## Example
    ```python
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # a sum over the ranks
    optimizer.step()
    ```

    ## Use instead
    ```python
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()  # the mean, as DDP computes it
    optimizer.step()
    ```

    ## Stays silent on
    `DistributedDataParallel` (which averages itself); the PyTorch tutorial's
    `average_gradients` (all-reduce, then `/= size`, also through `.data`); `op=ReduceOp.AVG`;
    gradients divided before the all-reduce; a loss divided by the world size before
    `backward()`; a summed loss (`reduction="sum"`, or a sum divided by a count of the script's
    own such as the global batch or token count); a loss divided by a computed tensor;
    all-reduces of metrics and losses; a single process (a group of one rank); async
    all-reduces; gradients scaled by a clip or an unscale between the all-reduce and the step.
    """

    code = "GD405"
    slug = "allreduce-not-averaged"
    severity = Severity.WARNING
    summary = ("gradients all-reduced by hand with SUM and never divided by the world size: "
               "the learning rate is multiplied by the number of ranks")
    fix = ("divide the gradients by the world size right after the all-reduce "
           "(p.grad /= dist.get_world_size()), or all-reduce with op=dist.ReduceOp.AVG where "
           "the backend supports it, or divide the loss by the world size before backward()")

    def check(self, a):
        since: dict[int, list] = {}  # optimizer -> backwards writing its params since its step
        groups: dict = {}
        checked: dict = {}  # location -> the grad_allreduce events recorded there
        for e in a.events:
            kind = e.kind
            if kind == "grad_allreduce":
                checked.setdefault(e.loc, []).append(e)
            if kind == "backward":
                for opt in {o for pid in written(e) for o in a.owners.get(pid, ())}:
                    since.setdefault(opt, []).append(e)
            elif kind == "step":
                since.pop(e.get("opt"), None)
            elif kind == "grad_allreduce" and _summed_as_is(e):
                backwards = since.get(e.get("opt"), [])
                if not backwards or any("allreduce" in b.data for b in backwards):
                    continue  # no backward to judge by; a DDP forward's (DDP averages)
                factor = _loss_factor(backwards)
                if factor is None or factor * e["world"] <= 1 + 1e-3:
                    continue  # the loss was divided by the world size (or more)
                groups.setdefault(e.loc, []).append((e, backwards))
        clips = a.of_kind("clip")
        for loc, items in groups.items():
            yield self._finding(a, loc, items, clips, a.count(checked[loc]))

    def _finding(self, a, loc, items, clips, checked: int):
        e, backwards = items[0]
        world, opt = e["world"], e.get("opt")
        step = a.next_step(e.seq)
        cls = a.optimizer_class(opt) if opt is not None else ""
        owned = set(a.opt_params.get(opt, ()))
        clipped = any(owned.intersection(c.get("params") or ()) for c in clips)
        what = (f"a flat buffer of {plural(e['params'], 'gradient')}" if e.get("via") == "flat"
                else f"{plural(e['params'], 'gradient')}")
        message = (f"this all_reduce sums {what} over the {world} ranks (op SUM) and nothing "
                   f"divides them by {world} before {a.optimizer_name(opt)}.step(): every rank "
                   f"applies {world}x the mean gradient, so the learning rate is silently "
                   f"multiplied by the number of ranks and changes with it "
                   f"({a.count(i for i, _ in items)} of the {plural(checked, 'update')} checked, "
                   f"first at step {a.next_step_number(e.seq)})")
        severity = None
        if cls in SCALE_INVARIANT and not clipped:
            severity = Severity.INFO
            message += (f"; {cls} largely cancels a constant gradient factor, so the update "
                        f"changes little: it matters once you clip or switch optimizer")
        return self.finding(
            message, loc, severity=severity, step=a.next_step_number(e.seq),
            related=(related(step, "the step that applies the summed gradients", Role.STEP),
                     related(backwards[-1], "the backward: its loss is not divided by the "
                                            "world size either", Role.BACKWARD)),
            evidence={"world_size": world, "op": "sum", "params": e["params"],
                      "via": e.get("via"), "updates": a.count(i for i, _ in items),
                      "loss_factor": _loss_factor(backwards)},
            fix=self._fix(a, loc, e.get("via")))

    def _fix(self, a, loc, via) -> str | None:
        """The fix in the script's names: the tensor it all-reduces and how it calls the module
        (``dist`` in ``dist.all_reduce``)."""
        if loc is None:
            return None
        tensor = a.source.call_argument(loc.path, loc.line, "all_reduce", 0, "tensor")
        module = a.source.called_object(loc.path, loc.line, "all_reduce") or "torch.distributed"
        if not tensor:
            return None
        world = f"{module}.get_world_size()"
        after = (f"`{tensor} /= {world}` right after this all_reduce" if via != "flat" else
                 f"`{tensor} /= {world}` right after this all_reduce, before it is copied back "
                 f"into the gradients")
        return (f"divide by the world size: {after}; or all-reduce with "
                f"`op={module}.ReduceOp.AVG` where the backend supports it; or divide the loss "
                f"by `{world}` before backward()")
