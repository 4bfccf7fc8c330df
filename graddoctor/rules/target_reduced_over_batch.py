from __future__ import annotations

import re

from ..findings import Severity
from .base import Rule

# what a reduction takes along the axis it should reduce, and whether it returns (values, indices)
_PAIRED = frozenset({"max", "min", "median", "nanmedian"})


class TargetReducedOverBatch(Rule):
    """
    ## What it does
    Finds a regression target that gives every sample a value reduced over the *batch*: a DQN
    target `r + gamma * q_target(s2).max()` (no `dim`: one number for the whole batch) or
    `q_target(s2).max(0)[0]` (the max over dim 0, the batch, instead of over the actions), an
    actor-critic's `r + gamma * critic(s2).mean()`, an expected SARSA's `(pi * q).sum()`. The
    first backwards' turns are followed (a `TorchFunctionMode` outside module calls, reading
    shapes only): the side without gradient of `mse_loss`, `smooth_l1_loss`, `huber_loss`,
    `l1_loss` or of a hand-written squared or absolute difference holds a reduction over dim 0
    of a model's output (whose first dimension is its input's batch), broadcast back onto the
    samples and combined with values not derived from that output (rewards, masks). It points
    at the reduction.

    ## Why is this bad?
    A bootstrapped target is meant per sample: the return of *this* transition, `r_i + gamma *
    max_a Q(s2_i, a)`. Reduced over the batch, every sample bootstraps from the same number (or
    from a per-action maximum taken over other samples' next states), so what a transition is
    worth no longer depends on where it leads. Nothing fails: the shapes broadcast, the loss
    goes down, and the values learnt are those of an average next state.

    ## Example
    ```python
    with torch.no_grad():
        q_next = target_net(s2).max()
        y = r + gamma * (1 - done) * q_next
    loss = F.smooth_l1_loss(q_net(s).gather(1, a).squeeze(1), y)
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        q_next = target_net(s2).max(dim=1).values
        y = r + gamma * (1 - done) * q_next
    loss = F.smooth_l1_loss(q_net(s).gather(1, a).squeeze(1), y)
    ```

    ## Stays silent on
    `max(1)[0]`, `max(dim=1).values`, `amax(-1)` over the actions; Double DQN's
    `gather(1, argmax(1))`; TD3/SAC's elementwise `torch.min(q1, q2)` and discrete SAC's
    expectation `sum(dim=1)`; the `(1 - done)` mask written any way (`~done`,
    `logical_not()`, `torch.where`); n-step returns summed over their steps; GAE over the time
    axis of a `(T, N)` rollout; batch-normalised advantages or returns `(A - A.mean()) /
    A.std()` and a batch-mean baseline (a reduction combined with the values it was taken
    from); losses that compare batch statistics on purpose (feature matching's
    `mse(f.mean(0), g.mean(0))`, MMD, contrastive losses); targets computed inside a model's
    `forward` (samples-mixed-in-batch's), in another thread, through `.item()`, or by a model
    that is no `nn.Module` (not followed).
    """

    code = "GD172"
    slug = "target-reduced-over-batch"
    severity = Severity.WARNING
    summary = ("a regression target holds a reduction over the batch (q_target(s2).max() without "
               "dim, .max(0), V(s2).mean()): every sample bootstraps from the same value")
    fix = ("reduce over each sample's own axis (the actions: dim=1), never over dim 0 (the batch): "
           "q_target(s2).max(dim=1).values")

    def check(self, a):
        for e in a.of_kind("batch_reduced_target"):
            if e.loc is None:
                continue
            op, dims, batch = e.get("op") or "reduction", e.get("dims"), e.get("batch")
            shape = list(e.get("shape") or ())
            text = a.source.line_text(e.loc.path, e.loc.line)
            call = _call_text(text, op)
            how = "over every dim, the batch included" if dims is None else "over dim 0, the batch"
            shown = f"`{call}`" if call else f"the `{op}`"
            per_sample = len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)
            if per_sample:
                effect = (f"each sample's target gets the {op} of the {batch} samples' next "
                          f"values instead of its own")
                fix = (f"keep one value per sample: drop the `.{op}(...)` (the model's output "
                       f"has one value per sample along dim 0, the batch: there is nothing else "
                       f"to reduce)")
            else:
                effect = (f"every sample's target mixes the {batch} samples of the batch "
                          f"instead of reducing its own row")
                fixed = _fixed(call, op, dims, len(shape)) if call else None
                axis = "dim=1 (each sample's own values: a Q-network's actions)" if len(shape) == 2 else f"the sample's own dims (1..{len(shape) - 1})"
                fix = (f"`{fixed}`: reduce over {axis}, never over dim 0 (the batch)" if fixed
                       else f"reduce over {axis}, never over dim 0 (the batch)")
            loss = e.get("fn") or "the loss"
            at = f" at line {e.get('loss_line')}" if e.get("loss_line") else ""
            yield self.finding(
                f"{shown} reduces a {tuple(shape)} value made from a model's per-sample output {how}, and the "
                f"result is broadcast back into the target of {loss}{at}: {effect}, so what a "
                f"sample is worth no longer depends on its own next state",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"op": op, "dims": dims, "batch": batch, "shape": shape,
                          "loss": e.get("fn"), "loss_line": e.get("loss_line")},
                fix=fix)


def _call_text(line: str, op: str) -> str | None:
    """``q_target(s2).max()`` of a line that calls ``.max(`` (the receiver and the call with its
    arguments, and a ``[0]``/``.values`` after it), or None."""
    code = line.split("#", 1)[0]
    for found in re.finditer(r"(?:\.|torch\.)" + re.escape(op) + r"\(", code):
        start = found.start()
        end = _closing(code, found.end() - 1)
        if end is None:
            continue
        head = _receiver_start(code, start) if code[start] == "." else start
        tail = re.match(r"(\[0\]|\.values|\.indices)", code[end + 1:])
        return code[head:end + 1 + (tail.end() if tail else 0)].strip()
    return None


def _closing(code: str, opening: int) -> int | None:
    depth = 0
    for i in range(opening, len(code)):
        depth += {"(": 1, ")": -1}.get(code[i], 0)
        if depth == 0:
            return i
    return None


def _receiver_start(code: str, dot: int) -> int:
    """Where the expression whose method is called at ``dot`` begins (names, attributes,
    calls and subscripts)."""
    i = dot
    while i > 0:
        ch = code[i - 1]
        if ch in ")]":
            depth, j = 0, i - 1
            while j >= 0:
                depth += {")": 1, "]": 1, "(": -1, "[": -1}.get(code[j], 0)
                if depth == 0:
                    break
                j -= 1
            i = j
        elif ch.isalnum() or ch in "_.":
            i -= 1
        else:
            break
    return i


def _fixed(call: str, op: str, dims, ndim: int) -> str | None:
    """``call`` made to reduce dim 1 where it reduced dim 0 or every dim, or None."""
    m = re.search(re.escape(op) + r"\(([^()]*)\)", call)
    if m is None:
        return None
    inner = m.group(1).strip()
    if dims is None and not inner:
        new = "dim=1"
    elif re.fullmatch(r"0", inner):
        new = "1"
    elif re.fullmatch(r"dim\s*=\s*0", inner):
        new = "dim=1"
    elif re.fullmatch(r"0\s*,\s*keepdim\s*=\s*True", inner):
        new = "1, keepdim=True"
    elif re.fullmatch(r"dim\s*=\s*0\s*,\s*keepdim\s*=\s*True", inner):
        new = "dim=1, keepdim=True"
    else:
        return None
    fixed = call[:m.start(1)] + new + call[m.end(1):]
    if op in _PAIRED and dims is None and not fixed.endswith(("[0]", ".values")):
        fixed += ".values"
    return fixed
