from __future__ import annotations

from ..findings import Role, Safety, Severity
from .base import Rule, related, times
from .source import calls_in, related_line


class ClipInAccumulation(Rule):
    """
    ## What it does
    Finds gradient clipping that runs in the middle of a gradient-accumulation window: after the
    clip, another `backward()` still adds to the same gradients before the optimizer step uses
    them. A clip already at the window's boundary but written above the backward of its own
    iteration (the same loop body, or Lightning's `training_step`: `if sync: clip` then
    `accelerator.backward(loss)`) is told as that order, with the backward's line and no edit:
    the backward must come first.

    ## Why is this bad?
    Clipping is meant for the gradient of the whole update. Clipping each micro-batch's partial
    sum bounds only the part accumulated so far: the later micro-batches are added unclipped,
    and the early ones are shrunk by a factor that depends on how far into the window the clip
    ran. The update's norm is neither bounded nor the one you would get without accumulation.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        (loss_fn(model(x), y) / k).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (i + 1) % k == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    for i, (x, y) in enumerate(loader):
        (loss_fn(model(x), y) / k).backward()
        if (i + 1) % k == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # once, at the boundary
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Stays silent on
    One clip at the accumulation boundary (with AMP, hand-written, token-normalised
    accumulation); the frameworks' clipping under accumulation (Lightning, accelerate, the
    transformers Trainer).
    """

    code = "GD202"
    slug = "clip-in-accumulation"
    severity = Severity.WARNING
    summary = "gradients are clipped while a later backward still adds to the same update"
    fix = "clip once per update, right before optimizer.step() (after the last micro-batch's backward)"
    fixes = {
        "accelerate": ("clip only at the end of the window: if accelerator.sync_gradients: "
                       "accelerator.clip_grad_norm_(model.parameters(), max_norm)"),
        "lightning": ("let Lightning clip (Trainer(gradient_clip_val=...) clips once per update); "
                      "with manual optimization call self.clip_gradients(opt, ...) only on the "
                      "batch that steps"),
    }

    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """Move the clip to right before the step, into the accumulation window's ``if``; in
        ``accelerator.accumulate``, guard it with ``if accelerator.sync_gradients:``. None for a
        clip that runs before its own iteration's backward: the order of the loop's lines is
        what to change, and which of them moves is a person's call."""
        if finding.evidence.get("order") == "clip_before_own_backward":
            return None
        clip = src.statement_at(finding.location.line)
        for owner in clip.ancestors() if clip is not None else ():
            acc = [c for item in getattr(owner.node, "items", ()) for c in calls_in(src, item, "accumulate")]
            if owner.syntax == "With" and acc and len(clip.node.body) == 1:
                name = src.code(acc[0].func.value)
                indent = src.indent(clip)
                return self.edit(f"clip only when {name} syncs the gradients (the window's last micro-batch)",
                                 src.delete(clip), src.insert_before(
                                     clip, [f"if {name}.sync_gradients:\n",
                                            "    " + src.stmt_lines(clip)[0], *src.stmt_lines(clip)[1:]],
                                     indent=indent))
        step_line = related_line(finding, Role.STEP)
        step = src.statement_at(step_line) if step_line else None
        if clip is None or step is None or step.parent is clip.parent or step.line <= clip.line:
            return None
        if src.only_statement(clip) or len(clip.node.body) != 1:
            return None
        return self.edit("clip once per update, right before the step",
                         src.delete(clip), src.insert_before(step, src.stmt_lines(clip)))

    def check(self, a):
        groups: dict = {}
        for hit in a.ledger.clip_overwrites:
            groups.setdefault(hit.clip.loc, []).append((hit.clip, hit.backward, hit.pids))
        for loc, items in groups.items():
            clip, backward, pids = items[0]
            step = a.next_step(backward.seq)
            if _own_backward_after(a, clip, backward):
                yield self._before_own_backward(a, loc, items, step)
                continue
            yield self.finding(
                f"this clip runs before the last micro-batch of the update: a later backward() adds "
                f"more gradient to {a.names(pids)} before the optimizer step, so the update is "
                f"not the clipped one (seen {times(a.count(i[0] for i in items))})",
                loc,
                related=(related(backward, "a later backward adds to the clipped gradients"),
                         related(step, "the step that applies the partly clipped sum", Role.STEP)),
                step=a.next_step_number(backward.seq),
                evidence={"params": [a.param_name(p) for p in dict.fromkeys(pids)],
                          "clip": clip.get("via"), "limit": clip.get("limit"),
                          "occurrences": a.count(i[0] for i in items)},
            )

    def _before_own_backward(self, a, loc, items, step):
        """The clip runs at the window's last micro-batch (already guarded, or on the line that
        steps) but before that micro-batch's own backward, which comes later in the same loop
        body: the clipped update is then topped up by an unclipped micro-batch."""
        clip, backward, pids = items[0]
        how = _backward_call(a, backward)
        n = a.count(i[0] for i in items)
        return self.finding(
            f"this clip runs before the backward at line {backward.loc.line} of the same "
            f"iteration: the micro-batch that closes the window adds its gradient to "
            f"{a.names(pids)} after the clip and before the optimizer step, so the update is not "
            f"the clipped one (seen {times(n)})",
            loc, fix=(f"call {how} before the clip: forward, {how}, then clip, then "
                      f"optimizer.step()"), fixes={},
            related=(related(backward, "the backward that runs after the clip"),
                     related(step, "the step that applies the partly clipped sum", Role.STEP)),
            step=a.next_step_number(backward.seq),
            evidence={"params": [a.param_name(p) for p in dict.fromkeys(pids)],
                      "clip": clip.get("via"), "limit": clip.get("limit"), "occurrences": n,
                      "order": "clip_before_own_backward"},
        )


def _own_backward_after(a, clip, backward) -> bool:
    """Whether the backward that adds after the clip is the same iteration's: both in one file
    and one innermost loop, the backward written below the clip (a clip every micro-batch after
    its backward meets the next iteration's backward, written above it)."""
    c, b = clip.loc, backward.loc
    if c is None or b is None or c.path != b.path or b.line <= c.line:
        return False
    loop = a.source.innermost_loop(c.path, c.line)
    if loop is None:  # a hook the framework calls per batch (Lightning's training_step)
        function = a.source.enclosing_function(c.path, c.line)
        return function == "training_step" and function == a.source.enclosing_function(b.path, b.line)
    return loop == a.source.innermost_loop(b.path, b.line)


def _backward_call(a, backward) -> str:
    """How the script writes that backward: ``accelerator.backward(loss)``,
    ``self.manual_backward(loss)`` or ``loss.backward()``."""
    text = (a.source.line_text(backward.loc.path, backward.loc.line) or "").strip()
    return text if text.endswith(")") and "backward" in text and len(text) < 60 else "backward()"
