from __future__ import annotations

from dataclasses import replace

from ..findings import Role, Safety, Severity, spans
from .base import Rule, related
from .source import call_bare_method, method_calls, related_line, stepped_optimizer


class MissingZeroGrad(Rule):
    """
    ## What it does
    Finds optimizer steps that apply gradients left over from earlier updates because nothing
    ever clears them: no `optimizer.zero_grad()` / `model.zero_grad()` touches those parameters
    between one update and the next. When one loss feeds two optimizers (an encoder's and a
    decoder's) and only one of them is cleared, it points at that clear: the missing
    `zero_grad()` goes beside it. A `zero_grad()` of the script that runs a loop level too high
    (once before the loop, once per epoch) while the optimizer steps many times after it is the
    line it points at.

    ## Why is this bad?
    `backward()` *adds* into `.grad`. Without a clear, update N applies the sum of the gradients
    of all N updates: the effective step size grows every iteration and the direction is
    dominated by old batches. Nothing crashes and the loss may even fall for a while.

    ## Example
    ```python
    for x, y in loader:
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Stays silent on
    L-BFGS's `step(closure)` whose closure clears; accumulation windows on a per-epoch index
    or a global counter; several losses backpropagated between one clear and one step; one
    backward feeding two optimizers that are both cleared; gradients cleared by hand
    (`p.grad = None`, `p.grad.data.zero_()`, a hand-written SGD that zeroes each `.grad`);
    `zero_grad` at the end of the iteration, taken as a bound method, or in a helper; the
    optimizer stepped inside the backward (one per parameter, from a post-accumulate-grad
    hook); the step first in the loop (step → zero_grad → forward → backward); a GAN whose
    every optimizer is cleared
    before its backward; a shared trunk's optimizer that steps last, after each head's
    optimizer stepped on its own loss (one clear per iteration: the sum is meant); an
    accumulation window with another optimizer (a linear probe, a temperature) cleared and
    stepped after every micro-batch inside it; DDP's `no_sync()` and FSDP's accumulation; the frameworks' own
    loops (Lightning, accelerate); loops in threads (each thread with its own model and
    optimizer, or actor threads feeding one learner).
    """

    code = "GD101"
    slug = "missing-zero-grad"
    severity = Severity.ERROR
    summary = "gradients from an earlier update reach optimizer.step(): nothing clears them"
    fix = "call optimizer.zero_grad() once per update, before the forward pass (or right after step())"
    fixes = {
        "lightning": ("with manual optimization, call opt.zero_grad() in training_step before each "
                      "self.manual_backward(loss) (automatic optimization clears them for you; "
                      "an optimizer_zero_grad override that does nothing keeps them; for a GAN, wrap each "
                      "optimizer's part in self.toggle_optimizer(opt) ... self.untoggle_optimizer(opt))"),
        "accelerate": ("call optimizer.zero_grad() once per update, after optimizer.step() "
                       "(inside accelerator.accumulate the wrapped optimizer steps and clears only "
                       "at the end of the window)"),
    }
    # a GAN's generator loss leaking into the discriminator's step, in Lightning's terms
    leak_fixes = {
        "lightning": ("in training_step, wrap each optimizer's part in self.toggle_optimizer(opt) "
                      "... self.untoggle_optimizer(opt) (the other model's parameters stop "
                      "requiring grad meanwhile), and call opt.zero_grad() right before its "
                      "self.manual_backward"),
    }

    def check(self, a):
        groups: dict = {}
        clears = a.of_kind("clear")
        steps = a.of_kind("step")
        crossed = a.crossed_old_uses  # optimizers-swapped's: a clear would not fix those
        for use in a.ledger.old_uses:
            if (use.step.seq, use.pid) in crossed:
                continue
            if use.fresh and not use.clears_between and not _accumulated_between_other_steps(use, steps):
                groups.setdefault(use.fresh[0].backward.loc, []).append(use)
        for loc, uses in groups.items():
            beside_variable = too_rare = None
            # a leak (another loss's backward writing in after the clear) is judged on the first
            # update that clears before it: on the very first update nothing was cleared yet
            first = next((u for u in uses if self._leaks(a, u, loc, clears)), uses[0])
            old = first.old[-1]
            pids = [u.pid for u in uses]
            # the step that applied the old gradient before this one (None: this step is the first)
            consumed = next((s for s in old.consumed_by if s.seq < first.step.seq), None)
            backward = first.fresh[0].backward
            in_closure = backward.get("in_step") is not None and consumed is None
            mine = set(a.opt_params.get(first.opt, ()))
            cleared = [c for c in clears if c.seq < old.backward.seq and mine & set(c["params"])]
            leak = consumed is None and not in_closure and cleared and old.backward.loc != loc
            if consumed is None and not in_closure and old.backward.loc != loc and any(
                    backward.seq < s.seq < first.step.seq and s["opt"] != first.opt for s in steps):
                # another optimizer steps between this backward and this step: the backward is
                # that optimizer's, and this one steps last over what every loss gave its
                # parameters (a shared trunk's optimizer after each head's): the sum is meant
                continue
            if in_closure:
                message = (f"this backward() in the optimizer's closure adds onto the gradients of "
                           f"its previous evaluation: {a.names(pids)} are never cleared inside the "
                           f"closure, so {a.optimizer_name(first.opt)} sees the sum of the gradients "
                           f"at every point it tried, not the gradient at the current one (first "
                           f"seen at step {first.step_index})")
                fix = "call optimizer.zero_grad() at the start of the closure, before the forward pass"
                fixes = {}
            elif leak:  # cleared every update, but another backward writes in after the clear
                message = (f"{a.names(pids)} are cleared (line {cleared[-1].loc.line if cleared[-1].loc else '?'}), "
                           f"but the backward at line {old.backward.loc.line if old.backward.loc else '?'} "
                           f"writes into their gradients after that clear and before "
                           f"{a.optimizer_name(first.opt)} steps: this backward adds onto them, so the "
                           f"step applies that other loss's gradient too (e.g. in a GAN, one model's loss "
                           f"reaching the other model's parameters through an output not detached; "
                           f"first seen at step {first.step_index})")
                fix = ("clear right before this backward (after the other loss's step), or keep the "
                       "other loss out of these parameters: detach, or requires_grad_(False) on them "
                       "while it runs")
                fixes = self.leak_fixes
            elif astray := self._clear_astray(a, first, consumed, backward, mine):
                # a zero_grad() runs every update, but on parameters no optimizer steps (another
                # model's, a leftover optimizer's): that call is the line to change
                where = f"line {backward.loc.line}" if backward.loc else "the backward"
                what = (f"only {a.names(astray['params'])}, which no optimizer steps"
                        if astray["params"] else "no parameter that an optimizer steps")
                message = (f"this zero_grad() clears {what} (another model, or an optimizer "
                           f"that never steps), not the parameters {a.optimizer_name(first.opt)} "
                           f"steps: {a.names(pids)} are never "
                           f"cleared, so the backward at {where} adds onto gradients an earlier step "
                           f"already used and every step applies the sum of all gradients so far "
                           f"(first seen at step {first.step_index})")
                fix = ("call zero_grad() on the optimizer that steps (or on the model it trains) "
                       "here instead")
                fixes = {}
                loc = astray.loc
            elif beside := self._clear_beside(a, first, consumed, backward, mine):
                # one loss, two optimizers (an encoder's and a decoder's) stepped after its
                # backward, and only the other one's zero_grad() runs: that call is where the
                # missing one goes
                clear, other = beside
                message = (f"this zero_grad() clears only {a.optimizer_name(other)}'s parameters, "
                           f"but the backward at line {backward.loc.line if backward.loc else '?'} "
                           f"also feeds {a.optimizer_name(first.opt)}, whose {a.names(pids)} are "
                           f"never cleared: every {a.optimizer_name(first.opt)} step applies the "
                           f"sum of all gradients so far (first seen at step {first.step_index})")
                variable = a.optimizer_variable(first.opt)
                fix = (f"clear {variable}'s gradients here too: {variable}.zero_grad() beside this "
                       f"one" if variable else "clear the other optimizer's gradients here too "
                       "(its zero_grad() beside this one)")
                fixes = {}
                loc = clear.loc
                beside_variable = variable
            elif bare := self._bare_zero_grad(a, backward):
                message = (f"`{bare[1]}` names the method without calling it: the statement does "
                           f"nothing, so {a.names(pids)} are never cleared and every optimizer step "
                           f"applies the sum of all gradients so far (first seen at step "
                           f"{first.step_index})")
                fix = f"call it: {bare[1]}()"
                fixes = {}
                loc = bare[0]
            elif rare := self._clear_too_rare(a, first, backward, mine):
                # the clear exists, a loop level too high: it runs once (before the loop, per
                # epoch) while the optimizer steps many times between two of its calls
                clear, calls, steps_between = rare
                when = "once, before the loop" if calls == 1 else f"{calls} times in the run"
                message = (f"this zero_grad() runs {when}, but "
                           f"{a.optimizer_name(first.opt)} steps {steps_between} times after it "
                           f"without another clear: {a.names(pids)} are never cleared between "
                           f"updates, so the backward at line "
                           f"{backward.loc.line if backward.loc else '?'} adds onto gradients "
                           f"earlier steps already used and every step applies the sum of all "
                           f"gradients so far (first seen at step {first.step_index})")
                fix = ("move this zero_grad() into the training loop, before the forward pass "
                       "(or right after step())")
                fixes = {}
                loc = clear.loc
                too_rare = backward.loc.line if backward.loc else None
            elif (consumed is not None and consumed["opt"] != first.opt
                  and any(c.seq > first.step.seq and mine & set(c["params"]) for c in clears)):
                # the leftover is another optimizer's last gradient (an earlier phase: source
                # training before test-time adaptation), and this optimizer clears after its
                # steps: only its first step is hit, which "never cleared" would misdescribe
                message = (f"this backward() adds onto gradients {a.optimizer_name(consumed['opt'])} "
                           f"already applied: {a.names(pids)} still hold its last gradient, and "
                           f"{a.optimizer_name(first.opt)} clears them only after its own steps, so "
                           f"its first step applies that leftover gradient too (first seen at step "
                           f"{first.step_index})")
                fix = ("clear the gradients before this loop's first backward: zero_grad() before "
                       "the forward pass, or once before the loop")
                fixes = {}
            else:
                message = (f"this backward() adds onto gradients an earlier step already used: "
                           f"{a.names(pids)} are never cleared, so every optimizer step applies the "
                           f"sum of all gradients so far (first seen at step {first.step_index})")
                fix = fixes = None
            yield self.finding(
                message, loc, fix=fix, fixes=fixes,
                related=(
                    related(backward, "the backward that adds onto the uncleared gradients")
                    if loc is not backward.loc else None,
                    related(consumed, "the step that already applied these gradients") if consumed
                    else None if old.backward.loc == loc  # the same line: the closure's earlier call
                    else related(old.backward, "the backward whose gradients leak into this step"
                                 if leak else "the backward that produced them",
                                 Role.LEAKING_BACKWARD if leak else Role.BACKWARD),
                    related(first.step, "the step that applies them" if leak or in_closure
                            else "the step that applies them again", Role.STEP),
                ),
                step=first.step_index,
                evidence={"params": [a.param_name(p) for p in dict.fromkeys(pids)],
                          "optimizer": first.opt, "old_backward_calls": len(first.old),
                          "steps_affected": a.count({u.step.seq: u.step for u in uses}.values()),
                          # DDP all-reduces this backward: what the other ranks do matters
                          **({"allreduce": True} if backward.get("allreduce") else {}),
                          **({"clear_beside": beside_variable} if beside_variable else {}),
                          # the clear runs a loop level too high: the fix goes into the loop
                          # around this backward
                          **({"backward_line": too_rare} if too_rare else {})},
            )

    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """Call a bare ``optimizer.zero_grad``; else clear through the optimizer that steps: at
        the start of the closure, at the top of the loop that holds the backward and the step,
        or right after a step that sits deeper (an accumulation window's ``if``)."""
        line = finding.location.line
        if related_line(finding, Role.LEAKING_BACKWARD):
            return None  # another loss's backward: detach it or clear later, a person's call
        bare = call_bare_method(src, line, ("zero_grad",))
        if bare is not None:
            return self.edit("call the zero_grad the statement only names", bare)
        step_line = related_line(finding, Role.STEP)
        opt = finding.evidence.get("clear_beside") or (
            stepped_optimizer(src, step_line) if step_line else None)
        here = src.statement_at(line)
        if opt is None or here is None:
            return None
        clear = f"{opt}.zero_grad()"
        if finding.evidence.get("backward_line"):  # a clear a loop level too high: one in the loop
            line = finding.evidence["backward_line"]
            here = src.statement_at(line)
            if here is None:
                return None
        elif method_calls(src, "zero_grad", line=line):  # another model's clear: add the right one
            return self.edit(f"clear {opt}'s gradients", src.insert_after(here, clear))
        function = src.enclosing_function(here)
        if function is not None and not function.contains(step_line) and function.children:
            # a closure the step calls: clear at its start
            return self.edit(f"clear at the start of {function.node.name.value}()",
                             src.insert_before(function.children[0], clear))
        step = src.statement_at(step_line)
        loop = src.enclosing_loop(here)
        if loop is not None and loop.contains(step_line) and step.parent is here.parent:
            return self.edit(f"clear {opt}'s gradients at the top of the loop",
                             src.insert_before(loop.children[0], clear))
        return self.edit(f"clear {opt}'s gradients after its step", src.insert_after(step, clear))

    def across_ranks(self, finding, world_size):
        """Under DDP, when only some ranks clear: the all-reduce averages the ranks' gradients,
        so every rank applies the fresh average plus k/N of the previous update's gradient
        (k: the ranks that do not clear), not the sum of all gradients."""
        ev = finding.evidence
        ranks = finding.ranks or ()
        if not ev.get("allreduce") or "ranks_not_clearing" in ev or world_size < 2 \
                or not 0 < len(ranks) < world_size:
            return finding
        k, n = len(ranks), world_size
        clearing = [r for r in range(n) if r not in ranks]
        message = (f"only rank {spans(clearing)} {'clears' if len(clearing) == 1 else 'clear'} "
                   f"these gradients; on rank {spans(ranks)} this backward() adds onto the "
                   f"gradient an earlier step already used. DDP's all-reduce averages what the "
                   f"ranks hold, so every rank's step applies the fresh averaged gradient plus "
                   f"{k}/{n} of the previous update's gradient (a decaying sum of old gradients, "
                   f"like an unintended momentum of {k / n:.2g}); the replicas stay equal, the "
                   f"update is wrong on all of them")
        return replace(finding, message=message, evidence={**ev, "ranks_not_clearing": k},
                       fix="clear the gradients on every rank, not under a rank test: call "
                           "optimizer.zero_grad() once per update on all ranks")

    @staticmethod
    def _leaks(a, use, loc, clears) -> bool:
        """Whether the gradient this use adds onto came from another line's backward that ran
        after a clear of this optimizer's parameters, in the same update (no step used it)."""
        old = use.old[-1]
        if old.backward.loc == loc or use.fresh[0].backward.get("in_step") is not None \
                or any(s.seq < use.step.seq for s in old.consumed_by):
            return False
        mine = set(a.opt_params.get(use.opt, ()))
        return any(c.seq < old.backward.seq and mine & set(c["params"]) for c in clears)

    @staticmethod
    def _clear_astray(a, first, consumed, backward, mine):
        """The last zero_grad() between the step that already used the gradients and this
        backward that clears nothing any stepped optimizer owns (None: no such clear)."""
        if consumed is None:
            return None
        stepped = {e["opt"] for e in a.of_kind("step")}
        owned = {p for opt in stepped for p in a.opt_params.get(opt, ())}
        astray = [c for c in a.of_kind("clear")
                  if consumed.seq < c.seq < backward.seq and c.loc is not None
                  and not (mine | owned) & set(c["params"] or ())]
        return astray[-1] if astray else None

    @staticmethod
    def _clear_beside(a, first, consumed, backward, mine):
        """``(clear, other optimizer)``: the last zero_grad() between the step that already used
        the gradients and this backward, when it clears only parameters of one other optimizer
        that also steps after this backward, before the next one (one loss stepped by two
        optimizers); None otherwise."""
        if consumed is None:
            return None
        owner = {p: opt for opt, params in a.opt_params.items() for p in params}
        beside = [c for c in a.of_kind("clear")
                  if consumed.seq < c.seq < backward.seq and c.loc is not None and c["params"]
                  and not mine & set(c["params"])]
        if not beside:
            return None
        clear = beside[-1]
        others = {owner.get(p) for p in clear["params"]}
        if len(others) != 1 or None in others:
            return None
        other = others.pop()
        after = next((b.seq for b in a.of_kind("backward") if b.seq > backward.seq), None)
        if not any(s["opt"] == other and backward.seq < s.seq and (after is None or s.seq < after)
                   for s in a.of_kind("step")):
            return None  # the other optimizer steps on another loss (a GAN's other model)
        return clear, other

    @staticmethod
    def _clear_too_rare(a, first, backward, mine):
        """``(clear, calls of its line, steps after it)``: the last zero_grad() of this
        optimizer's parameters before this backward, when its line ran less than half as often
        as the optimizer stepped and at least two steps of it follow that clear before the next
        clear (or the end); None otherwise."""
        clears = [c for c in a.of_kind("clear")
                  if c.seq < backward.seq and c.loc is not None and mine & set(c["params"] or ())]
        if not clears:
            return None
        clear = clears[-1]
        if clear.loc.via or "zero_grad" not in (a.source.line_text(clear.loc.path, clear.loc.line) or ""):
            return None  # a framework's clear (Lightning's, at fit), not a line of the script
        calls = a.count(c for c in a.of_kind("clear") if c.loc == clear.loc)
        steps = [s for s in a.of_kind("step") if s["opt"] == first.opt and not s.get("skipped")]
        later = [c.seq for c in a.of_kind("clear") if c.seq > clear.seq and mine & set(c["params"] or ())]
        until = later[0] if later else None
        after = a.count(s for s in steps if clear.seq < s.seq and (until is None or s.seq < until))
        if after < 2 or 2 * calls > a.count(steps):
            return None
        return clear, calls, after

    @staticmethod
    def _bare_zero_grad(a, backward):
        """``(location, text)`` of a ``something.zero_grad`` statement without parentheses in the
        loop around this backward (a no-op the trace cannot show), or None."""
        loc = backward.loc
        if loc is None or loc.via:
            return None
        from dataclasses import replace


        lines = a.source.bare_method_lines(loc.path, loc.line, "zero_grad")
        if not lines:
            return None
        return replace(loc, line=lines[0][0]), lines[0][1]


def _accumulated_between_other_steps(use, steps) -> bool:
    """An accumulation window of this optimizer that another optimizer's steps cut into phases
    (a probe or a temperature stepped every micro-batch): the earlier micro-batches' gradients,
    from the same backward line, were applied by no step before this one and none of this
    optimizer's steps ran since them, so this step applies them for the first time."""
    backward = use.fresh[0].backward
    if backward.get("in_step") is not None:
        return False  # a closure's evaluations are phases of one step: judged as such
    first = use.old[0].backward.seq
    between = [s for s in steps if first < s.seq < use.step.seq]
    return bool(between) and all(s["opt"] != use.opt for s in between) and all(
        c.backward.loc == backward.loc and not any(s.seq < use.step.seq for s in c.consumed_by)
        for c in use.old)
