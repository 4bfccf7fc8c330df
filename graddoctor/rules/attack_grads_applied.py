from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule, related
from ..analysis.source import walk

_WINDOWS = 2  # updates that applied an attack's gradients, at least


def _input_gradient(b) -> bool:
    """A backward that wrote a non-parameter leaf's ``.grad`` (an attack's ``delta.grad``)
    outside ``optimizer.step(closure)``."""
    return bool(b.get("extra_leaves")) and b.get("in_step") is None


def _iterative_attack(window) -> tuple[list, list] | None:
    """The window's attack backwards and the training backwards after them, when one line
    computed an input gradient at least twice in it (PGD's steps) and a backward of plain
    parameter gradients (the training loss's) followed: the step applied both."""
    attack = [b for b in window if _input_gradient(b)]
    if not attack:
        return None
    lines: dict = {}
    for b in attack:
        lines[b.loc] = lines.get(b.loc, 0) + 1
    if max(lines.values()) < 2:
        return None  # one input gradient: a clean loss that also makes FGSM's sign (one objective)
    training = [b for b in window if not _input_gradient(b) and b.seq > attack[0].seq
                and b.get("in_step") is None]
    if not training:
        return None  # free adversarial training: the attack's backward is the update's own
    return attack, training


def _perturbation_name(a, loc) -> str | None:
    """What the attack reads a ``.grad`` of (``delta``): the one name the innermost loop or
    function around its backward reads a gradient of."""
    tree = a.source.tree(loc.path)
    if tree is None:
        return None
    around = sorted((n for n in walk(tree)
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.For, ast.While))
                     and n.lineno <= loc.line <= (n.end_lineno or n.lineno)),
                    key=lambda n: (n.end_lineno or n.lineno) - n.lineno)
    for node in around:
        names = {ast.unparse(n.value).removesuffix(".data") for n in walk(node)
                 if isinstance(n, ast.Attribute) and n.attr == "grad"}
        if len(names) == 1:
            return names.pop()
        if names:
            return None
    return None


def _backpropagated(a, loc) -> str:
    """What the backward at ``loc`` starts from, as the script writes it (``loss``)."""
    try:
        line = ast.parse(a.source.line_text(loc.path, loc.line).strip())
    except SyntaxError:
        return "loss"
    for n in walk(line):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward":
            return ast.unparse(n.func.value)
    return "loss"


class AttackGradsApplied(Rule):
    """
    ## What it does
    Finds an iterative adversarial attack (PGD) whose `backward()` calls write the model's
    parameter gradients as well as the perturbation's, with nothing clearing them before the
    training loss's own backward: the optimizer step applies the attack's gradients together
    with the update's. graddoctor reads it from the gradients each step applies for the first
    time: two or more backwards of one line that wrote a non-parameter leaf's `.grad` (the
    attack's `delta.grad`), then a backward of the training loss, then the step. It points at
    the `zero_grad()` that runs before the attack (the line to move), else at the attack's
    backward.

    ## Why is this bad?
    `loss.backward()` inside the attack adds the gradient of each attack step's loss to every
    parameter's `.grad`. With `zero_grad()` before the attack instead of after it, the update
    applies the sum of k attack gradients (computed in the attack's mode, on the partly
    perturbed inputs) plus the adversarial loss's: a gradient several times too large and
    pointing mostly at the clean-ish inputs, so adversarial training trains on the wrong thing
    and its effective learning rate changes with the number of attack steps.

    ## Example
    ```python
    optimizer.zero_grad()
    for _ in range(steps):
        loss = F.cross_entropy(model(x + delta), y)
        loss.backward()
        delta.data = (delta + alpha * delta.grad.sign()).clamp(-eps, eps)
        delta.grad.zero_()
    loss = F.cross_entropy(model(x + delta.detach()), y)
    loss.backward()
    optimizer.step()
    ```

    ## Use instead
    ```python
    for _ in range(steps):
        loss = F.cross_entropy(model(x + delta), y)
        grad, = torch.autograd.grad(loss, delta)   # writes no parameter's .grad
        delta = (delta.detach() + alpha * grad.sign()).clamp(-eps, eps).requires_grad_()
    optimizer.zero_grad()                              # or clear here, after the attack
    loss = F.cross_entropy(model(x + delta.detach()), y)
    loss.backward()
    optimizer.step()
    ```

    ## Stays silent on
    `zero_grad()` between the attack and the training loss; an attack through
    `torch.autograd.grad`; free adversarial training (the one backward gives both the input's
    and the update's gradients, each replay steps); one clean backward that also gives FGSM's
    input gradient, followed by the adversarial loss's backward and one step (both terms of one
    objective, Goodfellow's `0.5 * clean + 0.5 * adversarial`); L-BFGS's closure.
    """

    code = "GD420"
    slug = "attack-grads-applied"
    severity = Severity.WARNING
    summary = ("an iterative attack's backward() calls write the parameters' gradients and no "
               "zero_grad() clears them before the training loss's backward: the step applies them")
    fix = ("clear the gradients after the attack, right before the training loss's backward, or "
           "take the input's gradient with torch.autograd.grad(loss, delta)")

    def check(self, a):
        steps = {e.seq: e for e in a.by_kind.get("step", ())}
        groups: dict = {}
        for step_seq, window in a.ledger.windows.items():
            found = _iterative_attack(window)
            if found is not None:
                attack, training = found
                groups.setdefault((attack[0].loc, training[0].loc), []).append((step_seq, attack, training))
        for (attack_loc, training_loc), items in groups.items():
            updates = a.count(steps[s] for s, _, _ in items)
            if updates < _WINDOWS or attack_loc is None:
                continue
            step_seq, attack, training = items[0]
            step = steps[step_seq]
            # the first update may have no clear before it (``zero_grad()`` after each step)
            clear = next((c for _, each, _ in items if (c := self._clear_before(a, each[0])) is not None), None)
            loc = clear.loc if clear is not None and clear.loc is not None else attack_loc
            name = _perturbation_name(a, attack_loc)
            what = f"`{name}.grad`" if name else "the input's gradient"
            clear_text = a.source.line_text(clear.loc.path, clear.loc.line).split("#")[0].strip() \
                if clear is not None and clear.loc is not None else ""
            where = (f"`{clear_text}` at line {clear.loc.line} runs before the attack, so it clears "
                     f"nothing of it" if clear_text else "nothing clears them in between")
            fix = (f"move `{clear_text}` after the attack, right before the training loss's forward, "
                   f"or compute the attack's gradient with "
                   f"torch.autograd.grad({_backpropagated(a, attack_loc)}, {name}), which writes no "
                   f"parameter's .grad" if clear_text and name else None)
            yield self.finding(
                f"the attack's backward() at line {attack_loc.line} computes {what} and also adds its "
                f"loss's gradient to every parameter's .grad, {len(attack)} times per update; "
                f"{where}, and the step applies them with the training loss's gradient (line "
                f"{training_loc.line}) in {updates} updates",
                loc,
                related=(related(attack[0], "the attack's backward, writing parameter gradients"),
                         related(training[0], "the training loss's backward"),
                         related(step, "the step that applies both")),
                step=a.step_number.get(step_seq),
                fix=fix,
                evidence={"attack_backwards": len(attack), "updates": updates})

    @staticmethod
    def _clear_before(a, first):
        """The clear between the previous step (or the run's start) and the attack's first
        backward: the one that runs before the attack instead of after it."""
        for e in reversed(a.span(0, first.seq - 1)):
            if e.kind == "step":
                return None
            if e.kind == "clear" and e.get("thread") == first.get("thread"):
                return e
        return None
