from __future__ import annotations

from ..analysis.basics import listing
from ..findings import Severity
from .base import Rule, related


class HandUpdateWithoutZeroGrad(Rule):
    """
    ## What it does
    Finds a hand-written update (no `torch.optim` optimizer owns the tensors) whose gradients
    are never cleared: a backward adds onto the very `.grad` an earlier backward wrote, although
    the tensor itself changed in between (`w -= lr * w.grad` under `torch.no_grad()`,
    `p.data.add_(...)`). The update applied those gradients already; nothing zeroed them. It
    points at the backward that adds onto them.

    ## Why is this bad?
    `backward()` *adds* into `.grad`. Without `w.grad.zero_()` (or `w.grad = None`) after each
    update, update N applies the sum of the gradients of all N iterations: the step grows every
    iteration and old batches dominate the direction. The loss may still fall for a while, then
    oscillates or diverges. This is the classic bug of a training loop written by hand.

    ## Example
    ```python
    for x, y in batches:
        loss = ((x @ w + b - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w -= lr * w.grad
            b -= lr * b.grad
    ```

    ## Use instead
    ```python
    for x, y in batches:
        loss = ((x @ w + b - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w -= lr * w.grad
            b -= lr * b.grad
            w.grad.zero_()
            b.grad.zero_()
    ```

    ## Stays silent on
    Gradients zeroed or set to None after each update (by hand, through `.data`,
    `model.zero_grad()`); several backwards accumulated between two hand-written updates;
    gradients summed over many backwards without any update (a Fisher or saliency estimate); a
    gradient rescaled in place on purpose after the update (`p.grad.mul_(beta)`: a hand-written
    momentum); tensors changed but not along the gradients they held (a target network reloaded
    from or blended toward the model it serves, its target computed without `no_grad`: its
    gradients sum up unused; the change's cosine with the gradient, on a sample of values, must
    be 0.45 or more either way, so an attack's ascent counts); tensors an optimizer owns
    (`missing-zero-grad` checks those); an in-place op that leaves every value as it was
    (a temperature clamped within its range). Gradients on an
    accelerator are not read (that would synchronise the host): reported on the CPU only
    (`--emulate-cuda` runs a GPU script's path there).
    """

    code = "GD120"
    slug = "hand-update-without-zero-grad"
    severity = Severity.ERROR
    summary = ("a hand-written update never zeroes the gradients it applies: each backward adds "
               "onto gradients already applied")
    fix = ("zero each gradient after the hand-written update (w.grad.zero_() or w.grad = None "
           "inside the torch.no_grad() block), or use a torch.optim optimizer and its zero_grad()")

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        groups: dict = {}
        harmful: set = set()
        for i, b in enumerate(backwards):
            if b.get("applied_by_hand"):
                groups.setdefault(b.loc, []).append(b)
                if _reaches_an_update(backwards, i):
                    harmful.add(b.loc)
        for loc, backwards in groups.items():
            if loc not in harmful:
                continue
            first = backwards[0]
            pids = sorted(dict.fromkeys(p for b in backwards for p in b["applied_by_hand"]),
                          key=lambda p: _name(a, p))
            earlier = a.last_writer(pids[0], before=first.seq)
            times = a.count(backwards)
            # a tensor made again each iteration (an attack's delta) is one name, many pids
            names = list(dict.fromkeys(_name(a, p) for p in pids))
            message = (f"this backward() adds onto the gradients of {listing(names, 4)}, which the "
                       f"hand-written update already applied: the tensors changed since the "
                       f"backward that wrote those gradients, and nothing zeroed them"
                       f" ({times} backward{'s' if times != 1 else ''} so far): every update "
                       f"applies the sum of all the gradients before it")
            yield self.finding(
                message, loc, fix=_fix(names),
                related=(related(earlier, "the backward whose gradients were applied already"),),
                evidence={"params": names, "backwards": times})


def _reaches_an_update(backwards, i: int) -> bool:
    """Whether what backward ``i`` added onto applied gradients is applied again: the backward
    just before the next hand-written update of those tensors did not write them fresh. A
    backward whose sum is cleared before the update (an attack's backward, then
    ``model.zero_grad()`` and the training backward) is harmless. Without a later update (the
    run's end), the latest backward to write them decides."""
    pids = set(backwards[i]["applied_by_hand"])
    last = backwards[i]  # the latest backward to write them before their next update
    for later in backwards[i + 1:]:
        if pids & {*(later.get("updated_by_hand") or ()), *(later.get("applied_by_hand") or ())}:
            break
        if pids & {*(later.get("fresh") or ()), *(later.get("accumulated") or ())}:
            last = later
    return not pids <= set(last.get("fresh") or ())


def _name(a, pid: int) -> str:
    """The tensor's own name (the script's variable or attribute), else graddoctor's."""
    event = a.params.get(pid)
    return (event.get("name") if event else None) or a.param_name(pid)


def _fix(names: list[str]) -> str:
    """The fix in the script's own names: its tensors' ``.grad`` zeroed by name, or the module
    that holds them all cleared (``model.zero_grad()``)."""
    roots = {name.split(".")[0] for name in names}
    if all("." in name for name in names) and len(roots) == 1 and all(n.isidentifier() for n in roots):
        return (f"clear them after each update: {roots.pop()}.zero_grad() right after the "
                f"torch.no_grad() block that updates the parameters (or p.grad = None for each)")
    if all(name.isidentifier() for name in names):
        shown = "; ".join(f"{name}.grad.zero_()" for name in names[:4])
        return (f"zero them after each update, inside the torch.no_grad() block that updates "
                f"them: {shown}{'; ...' if len(names) > 4 else ''} (or set each .grad to None)")
    return HandUpdateWithoutZeroGrad.fix
