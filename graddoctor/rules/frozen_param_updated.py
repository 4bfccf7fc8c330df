from __future__ import annotations

import ast
import bisect

from ..analysis.basics import written
from ..findings import Severity
from ..trace import Location
from .base import Rule, one_or_many, related
from ..analysis.source import walk

# What moves a frozen parameter whose gradient is zero (the step_begin event's ``moved_by``),
# worst first: the severity and the words of the message.
MOVERS = {
    "weight_decay": Severity.ERROR,  # every step, for the rest of training
    "momentum": Severity.WARNING,  # the pre-freeze gradients, fading over tens of steps
    "moments": Severity.WARNING,
    "unknown": Severity.INFO,  # an optimizer class graddoctor does not know
}
# Without a gradient ever written, a momentum buffer or Adam's moments hold zeros: nothing moves.
NEEDS_A_GRADIENT = {"momentum", "moments", "unknown"}


class FrozenParamUpdated(Rule):
    """
    ## What it does
    Finds parameters frozen with `requires_grad_(False)` (or `p.requires_grad = False`) that
    stay in an optimizer with a `.grad` that is not `None` — `zero_grad(set_to_none=False)`
    leaves a zero tensor there — so the optimizer still updates them, and its momentum, Adam's
    running averages or weight decay keep moving the "frozen" weights.

    It also finds parameters kept out of training by zeroing their gradient by hand before
    every step (`p.grad.zero_()`, `p.grad = p.grad * 0`) in a param group with weight decay:
    the zero gradient is applied like any other, and the decay moves them. It points at the
    statement that zeroes the gradients.

    ## Why is this bad?
    PyTorch's optimizers skip a parameter only when its `.grad` is `None`; `requires_grad` is
    not looked at. A zero gradient is still a gradient: SGD's momentum buffer and Adam's
    `exp_avg` go on applying the gradients from before the freeze for tens of steps, and weight
    decay (AdamW's default 0.01) shrinks the weights at every step for the rest of training.
    The backbone you froze, and then evaluate or compare against, is not the one you froze.
    Plain SGD without momentum or weight decay computes `p -= lr * 0` and leaves it in place:
    nothing to report then.

    ## Example
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for epoch in range(epochs):
        if epoch == freeze_at:
            model.backbone.requires_grad_(False)
        for x, y in loader:
            optimizer.zero_grad(set_to_none=False)   # a zero .grad: not skipped
            loss_fn(model(x), y).backward()
            optimizer.step()                         # weight decay still shrinks the backbone
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for epoch in range(epochs):
        if epoch == freeze_at:
            model.backbone.requires_grad_(False)
        for x, y in loader:
            optimizer.zero_grad()                    # set_to_none=True: frozen params are skipped
            loss_fn(model(x), y).backward()
            optimizer.step()
    ```

    ## Stays silent on
    Parameters frozen before any gradient; a frozen layer whose `.grad` is set to None (by
    hand, or by `zero_grad()` with set_to_none) so the optimizer skips it; plain SGD without
    momentum or weight decay over zero-filled gradients; a param group removed from the
    optimizer at the freeze; a GAN's discriminator frozen only for the generator's step;
    gradual unfreezing; Lightning's `freeze()` and `toggle_optimizer`; gradients zeroed by
    hand in a group without weight decay, at some steps only, or for part of a tensor; every
    gradient of an optimizer zeroed (`grads-cleared-before-step`).
    """

    code = "GD109"
    slug = "frozen-param-updated"
    severity = Severity.WARNING
    summary = "frozen parameters keep a zero .grad, so the optimizer's momentum or weight decay still moves them"
    fix = ("clear with optimizer.zero_grad() (set_to_none=True, the default) so frozen parameters "
           "have no .grad and are skipped; or set p.grad = None when you freeze them, or give the "
           "optimizer only the parameters that still train")

    def check(self, a):
        yield from self._zeroed_by_hand(a)
        begins = [e for e in a.of_kind("step_begin") if e.get("frozen")]
        if not begins:
            return
        clears: dict[int, tuple[list, list]] = {}  # pid -> (seqs, clears) that name it, in order
        for clear in a.of_kind("clear"):
            for pid in clear.get("params") or ():
                seqs, events = clears.setdefault(pid, ([], []))
                seqs.append(clear.seq)
                events.append(clear)
        groups: dict[tuple, dict] = {}  # (optimizer, freeze seq) -> what one finding reports
        for begin in begins:
            for pid, mover, freeze in begin["frozen"]:
                if mover not in MOVERS:
                    continue  # nothing moves it: plain SGD, Adagrad, lr 0
                clear = _last_before(clears.get(pid), begin.seq)
                writer = a.last_writer(pid, begin.seq)
                if writer is not None and (clear is None or writer.seq > clear.seq):
                    # its .grad holds a real gradient: frozen after this update's backward (the
                    # step applies it, as meant), or an old one applied again (stale-grad's)
                    continue
                if writer is None and mover in NEEDS_A_GRADIENT:
                    continue  # never got a gradient: its buffers are zeros, nothing moves it
                group = groups.setdefault((begin["opt"], freeze), {
                    "begin": begin, "freeze": a.event(freeze), "pids": {}, "clear": None})
                group["pids"].setdefault(pid, mover)
                if group["clear"] is None and clear is not None and clear.get("set_to_none") is False:
                    group["clear"] = clear
        for (opt, _), group in groups.items():
            yield self._finding(a, opt, **group)

    def _finding(self, a, opt, begin, freeze, pids, clear):
        movers = set(pids.values())
        mover = next(m for m in MOVERS if m in movers)
        count = len(pids)
        names = a.names(pids)
        it, its, is_ = (one_or_many(count, *words) for words in
                        (("it", "them"), ("its", "their"), ("is", "are")))
        optimizer = a.optimizer_name(opt)
        step = a.next_step(begin.seq)
        number = a.step_number.get(step.seq) if step is not None else None
        if freeze is not None:
            lead = f"{names} {is_} frozen here with requires_grad_(False) but still in {optimizer}"
        else:
            lead = f"{names} {is_} frozen (requires_grad is False) but still in {optimizer}"
        if clear is not None:
            cause = (f"zero_grad(set_to_none=False) leaves {its} .grad a zero tensor instead of "
                     f"None")
        else:
            cause = f"{its} .grad is a tensor, not None"
        when = f"step {number} and every step after" if number is not None else "every step"
        verb = "move" if number is not None else "moves"
        what = {
            "weight_decay": f"still {verb} {it}: weight decay shrinks {it} at every step, for "
                            f"the rest of training",
            "momentum": (f"still {verb} {it}: the momentum buffer keeps applying the gradients "
                         f"from before the freeze, fading over tens of steps"),
            "moments": (f"still {verb} {it}: {optimizer}'s running averages (exp_avg) keep "
                        f"applying the gradients from before the freeze, fading over tens of steps"),
            "unknown": (f"may still move {it}: graddoctor "
                        f"does not know how {optimizer} treats a zero gradient (momentum or weight "
                        f"decay would move {it})"),
        }[mover]
        message = (f"{lead}, and {cause}: an optimizer skips a parameter only when its .grad is "
                   f"None, so {when} {what}")
        location = (freeze or clear or step or begin).loc
        return self.finding(
            message, location, severity=MOVERS[mover],
            related=(
                related(clear, "zero_grad(set_to_none=False): the frozen parameters keep a zero "
                               ".grad, so the optimizer does not skip them")
                if clear is not None and clear.loc != location else None,
                related(step or begin, f"the first step that moves the frozen "
                                       f"{one_or_many(count, 'parameter', 'parameters')}")
                if (step or begin).loc != location else None,
            ),
            step=number,
            evidence={"optimizer": opt, "params": a.param_names(pids, limit=8),
                      "moved_by": sorted(movers), "zero_grad_set_to_none_false": clear is not None},
        )


    def _zeroed_by_hand(self, a):
        """Parameters that train (requires_grad) whose gradient the script zeroes by hand
        between the backward and every step (``p.grad.zero_()``, ``p.grad = p.grad * 0``), in a
        group with weight decay: the "freeze" leaves them in the update, and the decay moves them."""
        windows = a.ledger.windows
        for opt, steps in a.applied_steps.items():
            decays = _group_decays(a, opt)
            if not decays or a.count(steps) < _ZEROED_STEPS:
                continue
            zeroed, first = None, None
            for step in steps:
                window = windows.get(step.seq)
                if not window:
                    zeroed = None
                    break
                norms, edited = a.measured_at(step, window[-1].seq)
                if norms is None:
                    continue
                written_now = {p for b in window for p in written(b)}
                hit = {p for p in edited if norms.get(p) == 0.0 and p in written_now
                       and decays.get(p, 0) > 0}
                zeroed = hit if zeroed is None else zeroed & hit
                if not zeroed:
                    break
                first = first or (step, window[-1])
            if not zeroed or first is None:
                continue
            owned = a.opt_params.get(opt, ())
            if len(zeroed) == len([p for p in owned if decays.get(p, 0) > 0]) == len(owned):
                continue  # every gradient cleared: grads-cleared-before-step's (nothing trains)
            step, backward = first
            loc = step.loc
            if backward.loc is not None and loc is not None and backward.loc.path == loc.path:
                line = _grad_write_line(a, loc.path, backward.loc.line + 1, loc.line - 1)
                if line is not None:
                    loc = Location(loc.path, line)
            pids = sorted(zeroed)
            count = len(pids)
            it, its, is_, they, stay = (one_or_many(count, *words) for words in
                                        (("it", "them"), ("its", "their"), ("is", "are"),
                                         ("it", "they"), ("stays", "stay")))
            optimizer = a.optimizer_name(opt)
            decay = max(decays[p] for p in pids)
            yield self.finding(
                f"{a.names(pids)} {is_} kept out of training by zeroing {its} gradient here before "
                f"every step, but {they} {stay} in {optimizer} with "
                f"weight_decay={decay:g}: a zero gradient is still a gradient, so the weight decay "
                f"shrinks {it} at every step and the \"frozen\" values drift toward zero",
                loc, severity=Severity.WARNING, step=a.step_number.get(step.seq),
                related=(related(step, "the step that applies the weight decay"),)
                if step.loc != loc else (),
                evidence={"optimizer": opt, "params": a.param_names(pids, limit=8),
                          "moved_by": ["weight_decay"], "zeroed_by_hand": True,
                          "weight_decay": decay},
                fix=(f"freeze {it} instead: requires_grad_(False) and set {its} .grad to None "
                     f"(zero_grad() does), or put {it} in a param group with weight_decay=0"))


_ZEROED_STEPS = 3  # steps whose gradients were all zeroed by hand before a finding


def _group_decays(a, opt) -> dict:
    """pid -> the weight decay of the param group that holds it (torch's optimizers apply it to
    a zero gradient too); {} when the optimizer's settings were not recorded."""
    out = {}
    for e in a.of_kind("optimizer_init"):
        if e.get("opt") != opt:
            continue
        hypers = e.get("hyper") or ()
        if len(hypers) != 1:
            return {}
        decay = (hypers[0] or {}).get("weight_decay") or 0
        for pid in e.get("params") or ():
            out[pid] = decay
    return out


def _grad_write_line(a, path: str, first: int, last: int) -> int | None:
    """The first statement on lines ``first``..``last`` that writes a ``.grad`` (assigns it,
    or zeroes, fills or scales it in place)."""
    tree = a.source.tree(path)
    if tree is None or first > last:
        return None
    lines = []
    for node in walk(tree):
        if not (isinstance(node, ast.stmt) and first <= node.lineno <= last):
            continue
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "grad" for t in targets):
                lines.append(node.lineno)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and isinstance(node.value.func, ast.Attribute) \
                and node.value.func.attr in ("zero_", "fill_", "mul_") \
                and "grad" in ast.unparse(node.value.func.value).split("."):
            lines.append(node.lineno)
    return min(lines, default=None)


def _last_before(seqs_events, seq: int):
    """The last of the events (``(seqs, events)``, in seq order) before seq ``seq``, or None."""
    if seqs_events is None:
        return None
    seqs, events = seqs_events
    i = bisect.bisect_left(seqs, seq)
    return events[i - 1] if i else None
