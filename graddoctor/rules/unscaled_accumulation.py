from __future__ import annotations

from dataclasses import replace

from ..analysis.windows import typical
from ..findings import Autofix, Role, Safety, Severity
from .base import Rule, related
from .source import calls_in, method_calls, related_line


# optimizers whose update divides by a running magnitude of the gradient: a constant factor on
# the gradient (k, from not dividing the loss) mostly cancels out unless clipping is involved
SCALE_INVARIANT = {"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop",
                   "SparseAdam", "Adafactor"}


def divides_by(factor: float, k: int) -> bool:
    """``loss * factor`` is ``loss / (m * k)`` for a whole m >= 1 (``/ k``, ``/ (k * batch)``)."""
    if factor <= 0:
        return False
    m = 1.0 / (factor * k)
    return m >= 1 - 1e-6 and abs(m - round(m)) <= 1e-3 * m


def weighted_mean(factors: list[float]) -> bool:
    """Micro-batches weighted by their share of the window (``loss * (bs / window_total)``): the
    factors differ but add up to ``1 / m`` for a whole m >= 1, so the accumulated gradient is a
    weighted mean over the window, not a sum."""
    return len(set(factors)) > 1 and all(f > 0 for f in factors) and divides_by(sum(factors), 1)


def _term_weights(odd) -> bool:
    """The backwards of a window weighted by factors that differ from one backward to the next,
    some above 1: returns or advantages weighting each time step's term of one objective
    (REINFORCE's ``(-log p * R).backward()`` per step of an episode), not a normalisation of
    micro-batches, which never multiplies a batch's loss by more than 1."""
    factors = {b.get("loss_scale_factor") for w in odd for b in w.group}
    return len(factors) > 1 and max(factors) > 1


class UnscaledAccumulation(Rule):
    """
    ## What it does
    Finds gradient accumulation — k > 1 `backward()` calls of the same loss line per optimizer
    step — whose loss is not divided by k. graddoctor reads the division from the loss's autograd
    graph: `loss / k`, `loss * (1 / k)`, and a framework dividing inside its `backward` helper
    (accelerate, Lightning) are recognised; a division by a computed tensor (token counts) is
    taken as deliberate and left alone, and so are micro-batches weighted by their share of the
    window (`loss * (batch_size / window_samples)`: factors that add up to 1). An epoch's shorter
    last window divided by the full window's k (accelerate does that when the batches do not
    split into whole windows) counts as divided, however many such windows there are. A loss
    multiplied by k (or more) where it should be divided (`loss * k`) is judged like an undivided
    one and pointed at the line that multiplies; a factor between 1 and k is an info.

    ## Why is this bad?
    The accumulated gradient is the *sum* over k micro-batches, k times the gradient of the
    batch you meant: with SGD the effective learning rate is k times larger, and clipping
    thresholds and weight decay no longer mean what they say. Adam-like optimizers mostly
    cancel a constant factor, so there the finding is `info` unless gradients are also clipped.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y)
        loss.backward()
        if (i + 1) % k == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    for i, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y) / k
        loss.backward()
        if (i + 1) % k == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Stays silent on
    `(loss / k).backward()`, `loss * (1 / k)` and the frameworks' own division (accelerate,
    Lightning, the transformers Trainer and `num_items_in_batch`); losses normalised by the
    window's token count or weighted by each micro-batch's share of the window; several
    losses of one forward before one step; DDP's `no_sync()` and FSDP's accumulation;
    hand-written static loss scaling; per-time-step losses weighted by different returns
    (REINFORCE's `(-log p * R).backward()` over an episode), which weigh terms, not micro-batches;
    an attack's repeated backwards that compute an input's gradient (PGD's `delta.grad`).
    """

    code = "GD204"
    slug = "unscaled-accumulation"
    severity = Severity.WARNING
    summary = "gradient accumulation over k micro-batches without dividing the loss by k"
    fix = "divide the loss by the number of accumulation steps before backward(): (loss / k).backward()"
    fixes = {
        "accelerate": ("inside `with accelerator.accumulate(model):` call accelerator.backward(loss), "
                       "not loss.backward(): it divides the loss by gradient_accumulation_steps"),
        "lightning": ("with manual optimization, divide the loss yourself: "
                      "self.manual_backward(loss / k); or let automatic optimization accumulate "
                      "(Trainer(accumulate_grad_batches=k) divides for you)"),
        "transformers": ("make the loss use num_items_in_batch: pass Trainer(compute_loss_func=...) "
                         "that sums the per-sample losses and divides by num_items_in_batch, or set "
                         "trainer.model_accepts_loss_kwargs = False so that the Trainer divides the "
                         "loss by gradient_accumulation_steps"),
    }

    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """Divide the loss the backward starts from by the window: ``(loss / k).backward()``,
        ``scaler.scale(loss / k)``, ``accelerator.backward(loss / k)``; ``k`` is the name the
        step's ``if`` tests with ``%`` when it has one, else the window's length."""
        cst = src.cst
        line = finding.location.line
        if finding.evidence.get("multiplied"):
            return Autofix(title="", safety=self.fix_safety, refused=(
                "no automatic edit: the loss is multiplied by the window on its own line; "
                "replace that factor with a division"))
        if len(finding.evidence.get("backward_lines") or ()) > 1:
            return Autofix(title="", safety=self.fix_safety, refused=(
                "no automatic edit: the window's micro-batches are backpropagated at several "
                "lines, each loss to divide"))
        k = finding.evidence.get("k")
        if not isinstance(k, int) or k < 2:
            return None
        window = str(k)
        step_line = related_line(finding, Role.STEP)
        step = src.statement_at(step_line) if step_line else None
        for owner in step.ancestors() if step is not None else ():
            if owner.syntax == "If":
                for op in src.nodes(cst.BinaryOperation, within=None, line=src.span(owner.node.test)[0]):
                    if isinstance(op.operator, cst.Modulo) and isinstance(op.right, (cst.Name, cst.Attribute)):
                        window = src.code(op.right)
                break
        backward = method_calls(src, "backward", line=line) or \
            method_calls(src, "manual_backward", line=line)  # Lightning's manual optimization
        if len(backward) != 1:
            return None
        call = backward[0]
        here = src.statement_at(line)
        for owner in here.ancestors() if here is not None and not call.args else ():
            accumulate = [c for item in getattr(owner.node, "items", ())
                          for c in calls_in(src, item, "accumulate")]
            if owner.syntax == "With" and accumulate:  # accelerate's idiom divides for us
                acc = src.code(accumulate[0].func.value)
                return self.edit(f"let accelerate divide the loss: {acc}.backward(loss)",
                                 src.replace(call, f"{acc}.backward({src.code(call.func.value)})"))
        target = None
        if not call.args:  # loss.backward() / scaler.scale(loss).backward()
            value = call.func.value
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
                    and value.func.attr.value == "scale" and value.args:
                target = value.args[0].value
            else:
                target = value
        elif isinstance(call.func.value, cst.Name):  # accelerator.backward(loss), manual_backward
            target = call.args[0].value
        if target is None:
            return None
        code = src.code(target)
        simple = isinstance(target, (cst.Name, cst.Attribute, cst.Call, cst.Subscript))
        inner = code if simple else f"({code})"
        divided = f"{inner} / {window}"
        if target is call.func.value:
            divided = f"({divided})"
        return self.edit(f"divide the loss by the accumulation window ({window})",
                         src.replace(target, divided))

    def check(self, a):
        edits = a.of_kind("grad_edit")
        all_clips = a.of_kind("clip")
        clips = [e for e in all_clips if not e.get("norm_only")]
        # a clip that found grads changed in place before it (p.grad.mul_(1 / n)) took them up
        # as they were: the step's pre hook no longer sees that edit
        edited_clips = [c for c in all_clips if c.get("edited")]
        for opt, windows in a.windows.items():
            owned = set(a.opt_params.get(opt, ()))
            k = typical([w.k for w in windows], [a.weight(w.step) for w in windows])
            if k is None or k < 2:
                continue
            judged = [w for w in windows if w.k == k]
            # larger windows seen: with a dataset that does not split into whole windows, every
            # epoch ends on a shorter one that the loop (accelerate, Lightning, a hand-written
            # `(loss / k)`) still divides by the full window's k; ties make that the typical one
            longer = sorted({w.k for w in windows if w.k > k})
            verdicts: dict[str, list] = {"bad": [], "good": [], "odd": [], "unknown": []}
            for w in judged:
                last = w.group[-1]
                if all(b.get("extra_leaves") for b in w.group):
                    # an attack's steps, each writing the perturbation's .grad (PGD's delta):
                    # not micro-batches; attack-grads-applied judges their parameter gradients
                    verdicts["unknown"].append(w)
                    continue
                if any(last.seq < g.seq < w.step.seq and g["opt"] == opt for g in edits) or any(
                        last.seq < c.seq < w.step.seq and owned.intersection(c["edited"])
                        for c in edited_clips):
                    verdicts["unknown"].append(w)  # gradients rescaled by hand before the step
                    continue
                factors = [b.get("loss_scale_factor") for b in w.group]
                if any(f is None for f in factors):
                    verdicts["unknown"].append(w)
                elif all(f == 1.0 for f in factors):
                    verdicts["bad"].append(w)
                elif all(divides_by(f, k) for f in factors) or any(
                        all(divides_by(f, n) for f in factors) for n in longer):
                    verdicts["good"].append(w)
                else:
                    verdicts["good" if weighted_mean(factors) else "odd"].append(w)
            if verdicts["good"]:
                continue
            if verdicts["bad"]:
                yield self._not_divided(a, opt, k, verdicts["bad"], a.optimizer_class(opt), clips)
            elif verdicts["odd"] and (grown := self._multiplied(a, opt, k, verdicts["odd"], clips)):
                yield grown
            elif verdicts["odd"] and not _term_weights(verdicts["odd"]):
                w = verdicts["odd"][0]
                factor = w.group[0].get("loss_scale_factor")
                yield self.finding(
                    f"{k} backward() calls per step of {a.optimizer_name(opt)} and this loss is "
                    f"multiplied by {factor:g}, not divided by {k}: check that the factor is meant",
                    w.group[0].loc, severity=Severity.INFO, step=w.index,
                    related=(related(w.step, "the step that applies the accumulated sum", Role.STEP),),
                    evidence={"k": k, "loss_scale_factor": factor, "optimizer": opt,
                              "windows": a.count(w.step for w in verdicts["odd"])},
                )

    def _multiplied(self, a, opt, k, odd, clips):
        """Every micro-batch's loss multiplied by the window's k or more (``loss * k`` where
        ``loss / k`` was meant): the update is at least k * k times one batch's gradient, worse
        than an undivided window, so it is judged like one (a warning, info for an Adam-like
        optimizer without clipping). A factor between 1 and k stays an info: a loss weight."""
        factors = [b.get("loss_scale_factor") for w in odd for b in w.group]
        if not factors or any(not isinstance(f, (int, float)) or f < k for f in factors) \
                or len(set(factors)) != 1:
            return None
        w, factor, cls = odd[0], factors[0], a.optimizer_class(opt)
        owned = set(a.opt_params.get(opt, ()))
        clipped = any(owned.intersection(c["params"]) for c in clips)
        times = factor * k
        message = (f"{k} backward() calls of this loss add up in the gradients of every "
                   f"{a.optimizer_name(opt)} step, and the loss is multiplied by {factor:g} "
                   f"where accumulation divides it by {k}: the update uses {times:g}x the "
                   f"gradient of one batch")
        severity = None
        if cls in SCALE_INVARIANT and not clipped:
            severity = Severity.INFO
            message += (f"; {cls} largely cancels a constant gradient factor, so the update "
                        f"changes little; it still matters once you clip gradients or switch "
                        f"optimizer")
        else:
            message += f" (with {cls or 'this optimizer'}, a {times:g}x larger learning rate)"
        loc = w.group[0].loc
        # the line that multiplies (`loss = crit(out, y) * k` above `loss.backward()`)
        assigned = a.source.loss_assignment(loc.path, loc.line,
                                            framework=bool(loc.via)) if loc is not None else None
        if assigned is not None and "*" in assigned[1]:
            loc = replace(loc, line=assigned[0])
        return self.finding(
            message, loc, severity=severity, step=w.index,
            fix=f"divide the loss by the accumulation window instead of multiplying it: loss / {k}",
            fixes={},
            related=(related(w.step, "the step that applies the accumulated sum", Role.STEP),),
            evidence={"k": k, "loss_scale_factor": factor, "optimizer": opt, "optimizer_class": cls,
                      "windows": a.count(w.step for w in odd), "clipped": clipped,
                      "multiplied": True},
        )

    def _not_divided(self, a, opt, k, bad, cls, clips):
        w = bad[0]
        owned = set(a.opt_params.get(opt, ()))
        clipped = any(owned.intersection(c["params"]) for c in clips)
        severity = None
        notes = []
        if cls in SCALE_INVARIANT and not clipped:
            severity = Severity.INFO
            notes.append(f"{cls} largely cancels a constant gradient factor, so the update changes "
                         f"little; it still matters once you clip gradients or switch optimizer")
        batches = {tuple(b["batch"]) for b in w.group if b.get("batch") is not None}
        trainer = all(b.loc is not None and b.loc.via == "transformers" for b in w.group)
        if trainer:  # the Trainer fetches the window's batches ahead: one "last batch" for all
            batches = set()
        if len(batches) == 1 and len(w.group) > 1:
            severity = Severity.INFO
            notes.append("all of them used the same DataLoader batch: if these are separate losses "
                         "rather than micro-batches, ignore this")
        message = (f"{k} backward() calls of this loss add up in the gradients of every "
                   f"{a.optimizer_name(opt)} step, and the loss is not divided by {k}: the "
                   f"update uses {k}x the gradient of one batch"
                   + (" (with SGD-like optimizers a {k}x larger learning rate)".format(k=k)
                      if cls not in SCALE_INVARIANT else ""))
        fix = None
        if trainer:
            # the Trainer divides by gradient_accumulation_steps unless the model accepts loss
            # kwargs (its forward takes **kwargs): then it passes num_items_in_batch and leaves
            # the division to the model's loss, and this loss did not divide
            message = (f"the Trainer accumulates {k} micro-batches per {a.optimizer_name(opt)} "
                       f"step (gradient_accumulation_steps={k}) without dividing the loss by {k}: "
                       f"the model's forward accepts **kwargs (model_accepts_loss_kwargs), so the "
                       f"Trainer passes num_items_in_batch and leaves the division to the model's "
                       f"loss, but this model's loss does not use num_items_in_batch: the update "
                       f"uses {k}x the gradient of the same samples in one batch"
                       + (" (with SGD-like optimizers a {k}x larger learning rate)".format(k=k)
                          if cls not in SCALE_INVARIANT else ""))
            if w.group[0].loc.hook == "compute_loss_func":  # the Trainer's compute_loss_func
                message = message.replace(
                    "the model's forward accepts **kwargs (model_accepts_loss_kwargs), so the "
                    "Trainer passes num_items_in_batch and leaves the division to the model's "
                    "loss, but this model's loss does not use num_items_in_batch",
                    "with a compute_loss_func the Trainer passes num_items_in_batch and leaves the "
                    "division to it, but this compute_loss_func does not divide by "
                    "num_items_in_batch")
                fix = ("in compute_loss_func, sum the per-sample losses and divide by "
                       "num_items_in_batch (e.g. cross_entropy(..., reduction='sum') / "
                       "num_items_in_batch)")
            if w.group[0].loc.hook == "compute_loss":  # the user's own compute_loss override
                message = message.replace(
                    "this model's loss does not use num_items_in_batch",
                    "this compute_loss receives num_items_in_batch and does not divide by it")
                fix = ("in compute_loss, sum the per-sample losses and divide by "
                       "num_items_in_batch (e.g. cross_entropy(..., reduction='sum') / "
                       "num_items_in_batch) when it is given")
        # one loop's micro-batches backpropagated at two lines (no_sync on all but the last)
        lines = sorted({b.loc.line for b in w.group if b.loc is not None})
        others = [next(b for b in w.group if b.loc is not None and b.loc.line == line)
                  for line in lines if line != w.group[0].loc.line] if len(lines) > 1 else []
        if others:
            notes.append(f"the window's micro-batches are backpropagated at lines "
                         f"{', '.join(map(str, lines))}: divide the loss at each")
        if notes:
            message += "; " + "; ".join(notes)
        loc = w.group[0].loc
        if trainer and loc.hook == "compute_loss":
            # the override's `return (loss, outputs) if return_outputs else loss`: the line to
            # change is the one that makes the loss (its mean)
            assigned = a.source.loss_assignment(loc.path, loc.line, framework=True)
            if assigned is not None and assigned[0] != loc.line and "(" in assigned[1]:
                loc = replace(loc, line=assigned[0])
        return self.finding(
            message, loc, severity=severity, step=w.index, fix=fix,
            fixes=None if fix is None else {},
            related=(*(related(b, "the same loop's other micro-batches, also undivided")
                       for b in others),
                     related(w.step, "the step that applies the accumulated sum", Role.STEP)),
            evidence={"k": k, "loss_scale_factor": 1.0, "optimizer": opt, "optimizer_class": cls,
                      "windows": a.count(w.step for w in bad), "clipped": clipped,
                      **({"backward_lines": lines} if others else {})},
        )
