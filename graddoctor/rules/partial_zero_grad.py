from __future__ import annotations

from ..findings import Role, Safety, Severity
from .base import Rule, helper_call, related
from .source import method_calls, receiver, related_line, stepped_optimizer


class PartialZeroGrad(Rule):
    """
    ## What it does
    Finds a clear (`zero_grad`) that skips some of the parameters an optimizer steps: for
    example `model_a.zero_grad()` while the optimizer owns the parameters of `model_a` and
    `model_b`. The skipped parameters keep accumulating.

    ## Why is this bad?
    The cleared parameters train correctly, the skipped ones receive the sum of every gradient
    since the start. The model partly trains, so the bug hides behind a plausible loss curve.

    ## Example
    ```python
    optimizer = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.1)
    for x, y in loader:
        encoder.zero_grad()
        loss_fn(head(encoder(x)), y).backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()  # clears every parameter the optimizer steps
        loss_fn(head(encoder(x)), y).backward()
        optimizer.step()
    ```

    ## Stays silent on
    `model.zero_grad()` over every parameter the one optimizer owns; two optimizers over
    disjoint parameters, each cleared; a GAN whose discriminator trains on `fake.detach()`;
    a frozen teacher cleared next to the student; reentrant activation checkpointing; TBPTT
    that clears through the modules.
    """

    code = "GD102"
    slug = "partial-zero-grad"
    severity = Severity.ERROR
    summary = "zero_grad() clears only part of the parameters an optimizer steps"
    fix = "clear through the optimizer (optimizer.zero_grad()) or through a module that holds every parameter it steps"

    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """Clear through the optimizer that steps: ``head.zero_grad()`` ->
        ``optimizer.zero_grad()`` (its arguments kept)."""
        step_line = related_line(finding, Role.STEP)
        opt = stepped_optimizer(src, step_line) if step_line else None
        calls = method_calls(src, "zero_grad", line=finding.location.line)
        if opt is None or len(calls) != 1 or receiver(src, calls[0]) == opt:
            return None
        return self.edit(f"clear through {opt}, which steps every parameter",
                         src.replace(calls[0].func.value, opt))

    def check(self, a):
        groups: dict = {}
        crossed = a.crossed_old_uses  # optimizers-swapped's: a clear would not fix those
        for use in a.ledger.old_uses:
            if use.fresh and use.clears_between and (use.step.seq, use.pid) not in crossed:
                groups.setdefault(use.clears_between[-1].loc, []).append(use)
        for loc, uses in groups.items():
            first = uses[0]
            pids = [u.pid for u in uses]
            yield self.finding(
                f"this zero_grad() skips {a.names(pids)}, which {a.optimizer_name(first.opt)} steps: "
                f"their gradients keep accumulating across updates (first seen at step {first.step_index})",
                loc,
                related=(helper_call(a, first.clears_between[-1]),
                         related(first.step, "the step that applies the accumulated gradients", Role.STEP),
                         related(first.fresh[0].backward, "the backward that adds onto them")),
                step=first.step_index,
                evidence={"skipped_params": [a.param_name(p) for p in dict.fromkeys(pids)],
                          "optimizer": first.opt,
                          "clear": first.clears_between[-1].get("via")},
            )
