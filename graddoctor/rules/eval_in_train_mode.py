from __future__ import annotations

from ..findings import Role, Safety, Severity
from .base import Rule, one_or_many, related
from .source import call_bare_method, method_calls, receiver, related_line


class EvalInTrainMode(Rule):
    """
    ## What it does
    Finds forwards that run BatchNorm layers in train mode under `torch.no_grad()` or
    `torch.inference_mode()` outside any training update — a validation or inference pass
    without `model.eval()`. It points at that forward call, or at a `model.eval` statement
    without parentheses above it in the same function (or epoch loop): that no-op is the bug;
    or at the `model.train()` call that put the model in train mode for the pass when every
    time it ran no optimizer step followed before the next `train()`/`eval()` call while
    another `train()` line precedes the updates (the epoch's first line copied into an
    evaluation helper): `eval()` was meant there.
    Deliberate recalibration (`torch.optim.swa_utils.update_bn`, a pass after
    `reset_running_stats()`, `momentum=None`, a forward whose result nothing keeps:
    `model(x)` as a statement of its own, or `output = model(x)` whose name its function
    never reads, run only to re-estimate the statistics)
    and no-grad forwards inside an update (a GAN's fake batch, a teacher's targets) are not
    reported. Nor is a GAN's preview: one no-grad call (no loop over batches) of a network
    whose layers no `eval()` call covers anywhere in the run, in a run where two optimizers
    take turns, each after its own backward (the DCGAN tutorial's
    `with torch.no_grad(): fake = netG(fixed_noise)`).

    ## Why is this bad?
    In train mode BatchNorm normalises with the statistics of the validation batch and writes
    them into `running_mean` / `running_var`: the validation data leaks into the model, the
    metrics are computed with batch statistics (and with dropout on), and the next evaluation
    uses statistics that no longer match the trained weights.
    A GAN that never switches its networks to eval mode never reads those running statistics,
    and its preview samples noise from the distribution it trains on: nothing leaks and the
    preview shows what training sees. A loop of no-grad calls (a validation loader) in that
    run, or a network that is evaluated in eval mode elsewhere, is still reported.

    ## Example
    ```python
    with torch.no_grad():
        for x, y in val_loader:
            val_loss += loss_fn(model(x), y).item()
    ```

    ## Use instead
    ```python
    model.eval()
    with torch.no_grad():
        for x, y in val_loader:
            val_loss += loss_fn(model(x), y).item()
    model.train()
    ```

    ## Stays silent on
    `swa_utils.update_bn` and statistics re-estimated after `reset_running_stats()`, or by a
    no-grad pass in train mode whose forward's result nothing keeps (`for x, _ in loader:
    model(x)`, BatchNorm statistics recomputed on clean training images; SWA's original
    `bn_update`, whose `output = model(input)` nothing reads); a
    teacher in eval mode under `no_grad`; a momentum encoder (MoCo, BYOL) run under
    `no_grad` inside the training forward, in train mode, EMA-updated; a GAN whose models
    stay in train mode; BatchNorm without running statistics; a model with no BatchNorm or
    dropout; a frozen feature network (a perceptual loss's VGG) whose statistics a no-grad pass
    estimates before training, then `eval()` before the first step and never in train mode again.
    """

    code = "GD303"
    slug = "eval-in-train-mode"
    severity = Severity.WARNING
    summary = "BatchNorm in train mode runs under no_grad outside training: validation without eval()"
    fix = "call model.eval() before the no-grad pass, and model.train() again before training"

    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """``model.eval()`` before the ``with torch.no_grad()`` (or ``inference_mode()``) block
        the forward runs in, ``model.train()`` after it; the model is the one ``train()`` was
        called on, else the one called on the forward's line whose parameters the script
        hands to an optimizer. A bare ``model.eval`` (the statement only names the method)
        is called instead."""
        cst = src.cst
        bare = call_bare_method(src, finding.location.line, ("eval",))
        if bare is not None:
            return self.edit("call the eval the statement only names", bare)
        if finding.evidence.get("train_call_meant_eval"):
            calls = method_calls(src, "train", line=finding.location.line)
            if len(calls) != 1 or calls[0].args:
                return None
            return self.edit("switch to eval mode where train mode was set",
                             src.replace(calls[0].func.attr, "eval"))
        here = src.statement_at(finding.location.line)
        block = next((a for a in here.ancestors() if a.syntax == "With" and any(
            src.code(item.item).split("(")[0].split(".")[-1] in ("no_grad", "inference_mode")
            for item in a.node.items)), None) if here is not None else None
        if block is None or src.enclosing_function(block) is not src.enclosing_function(here):
            return None
        module = None
        train_line = related_line(finding, Role.TRAIN_CALL)
        if train_line is not None:
            calls = method_calls(src, "train", line=train_line)
            module = receiver(src, calls[0]) if len(calls) == 1 else None
        if module is None:
            owned = {receiver(src, c) for c in method_calls(src, "parameters")}
            called = [src.code(c.func) for c in src.nodes(cst.Call, within=here)
                      if isinstance(c.func, (cst.Name, cst.Attribute)) and src.code(c.func) in owned]
            module = called[0] if len(set(called)) == 1 else None
        if module is None:
            return None
        return self.edit(f"evaluate {module} in eval mode, then back to train mode",
                         src.insert_before(block, f"{module}.eval()"),
                         src.insert_after(block, f"{module}.train()"))

    def check(self, a):
        tl = a.modes
        groups: dict = {}
        calibrated = _statistics_warmups(a)
        for f in tl.forwards:
            if f.context != "outside" or not f.training or f.grad:
                continue
            if tl.adversarial and f.event.get("calls", 1) == 1 and not tl.evaluated & set(f.modules):
                continue  # a GAN's preview: its running statistics are never read (see the docs)
            for mid in f.modules:
                state = f.states.get(mid) or {}
                if (state.get("layer") != "batchnorm" or not state.get("track_running_stats")
                        or mid in f.recalibrated or mid in calibrated.get(f.event.seq, ())):
                    continue
                if _statistics_pass(a, f.event.loc):
                    continue
                group = groups.setdefault(f.event.loc, {"forward": f, "mids": []})
                if mid not in group["mids"]:
                    group["mids"].append(mid)
        for where, group in groups.items():
            f, mids = group["forward"], group["mids"]
            cause = next((c for c in (f.set_by.get(m) for m in mids) if c is not None and c.get("mode")), None)
            under = "torch.inference_mode()" if f.event.get("inference") else "torch.no_grad()"
            count = len(mids)
            layers = one_or_many(count, "a BatchNorm layer", f"{count} BatchNorm layers")
            their = one_or_many(count, "its", "their")
            dropout = any((f.states.get(m) or {}).get("layer") == "dropout" for m in f.modules)
            message = (f"this forward runs under {under} with {layers} in train mode ({tl.names(mids)}) "
                       f"outside any training update: it overwrites {their} running statistics with this data "
                       f"and normalises with batch statistics{' (and dropout stays on)' if dropout else ''} — "
                       f"a validation pass without model.eval()")
            fix, at, relations = None, where, [related(cause, "train() here left the model in train mode",
                                                       Role.TRAIN_CALL)]
            bare = _bare_eval(a, where)
            meant = _train_meant_eval(a, cause, where) if bare is None else None
            if meant is not None:  # a train() call that only ever precedes no-grad passes
                at, fix = meant[0], f"`{meant[1].replace('.train()', '.eval()', 1)}`"
                message = (f"`{meant[1]}` puts the model in train mode right before a pass that only "
                           f"evaluates (no optimizer step follows it before the next mode change): "
                           f"eval() was meant. The forward {message[len('this forward '):]}")
                relations = [related(f.event, "the forward that runs in train mode")]
            if bare is not None:  # `model.eval` named, not called: that statement is the bug
                at, fix = bare[0], f"call it: {bare[1]}()"
                message = (f"`{bare[1]}` names the method without calling it, so the model stays in "
                           f"train mode for the no-grad pass below it: " + message[len("this forward "):]
                           .replace("runs under", "the forward runs under", 1))
                relations.append(related(f.event, "the forward that runs in train mode"))
            yield self.finding(
                message, at, fix=fix,
                related=tuple(relations),
                step=f.steps_before or None,
                evidence={"layers": [tl.name(m) for m in mids], "calls": f.event.get("calls", 1),
                          "inference_mode": bool(f.event.get("inference")),
                          **({"train_call_meant_eval": True} if meant is not None else {})},
            )


def _statistics_warmups(a) -> dict[int, set[int]]:
    """seq of a no-grad train-mode forward -> the BatchNorm layers it only calibrates: it runs
    before the first optimizer step, the next ``train()``/``eval()`` call that covers those layers
    is an ``eval()`` made before any step, and they never run in train mode again — the running
    statistics of a frozen feature network estimated once and then kept (what ``update_bn`` does
    for a model that is done training)."""
    tl = a.modes
    last_training: dict[int, int] = {}
    for g in tl.forwards:
        if g.training:
            for mid in g.modules:
                last_training[mid] = max(last_training.get(mid, -1), g.event.seq)
    mode_sets = sorted((e for kind in ("train", "eval") for e in a.by_kind.get(kind, ())),
                       key=lambda e: e.seq)
    out: dict[int, set[int]] = {}
    for f in tl.forwards:
        if f.grad or not f.training or f.steps_before:
            continue
        for mid in f.modules:
            if last_training.get(mid, -1) > f.event.seq:
                continue  # the layer trains (or runs in train mode) later: not a one-off estimate
            nxt = next((e for e in mode_sets if e.seq > f.event.seq and mid in e.get("modules", ())), None)
            if nxt is not None and nxt.kind == "eval" and not a.steps_before(nxt.seq):
                out.setdefault(f.event.seq, set()).add(mid)
    return out
def _statistics_pass(a, loc) -> bool:
    """The forward's result is kept by nothing (``model(x)`` as a statement of its own, or
    bound to ``_``): the pass runs for the running statistics it writes, not to evaluate."""
    if loc is None or loc.via or not loc.path:
        return False
    return a.source.result_dropped(loc.path, loc.line)


def _bare_eval(a, loc):
    """``(location, text)`` of a ``something.eval`` statement without parentheses above the
    forward, in its function or the loop around it (a no-op the trace cannot show), or None."""
    if loc is None or loc.via or not loc.path:
        return None
    from dataclasses import replace

    lines = a.source.bare_method_before(loc.path, loc.line, "eval")
    return (replace(loc, line=lines[-1][0]), lines[-1][1]) if lines else None


def _train_meant_eval(a, cause, forward_loc):
    """``(location, text)`` of the ``X.train()`` call that left the model in train mode for this
    no-grad pass when that call (each time its line ran) is followed by no optimizer step before
    the next ``train()``/``eval()`` call, while the run steps after a train() call of another
    line: a statement that sets up only evaluation passes, where ``eval()`` was meant (the
    epoch's ``model.train()`` copied below the training loop). None otherwise."""
    loc = getattr(cause, "loc", None)
    if loc is None or loc.via or not loc.path or forward_loc is None or loc.path != forward_loc.path \
            or not a.steps:
        return None
    text = a.source.line_text(loc.path, loc.line).split("#")[0].strip()
    if text.count(".train()") != 1 or not text.endswith(".train()") or "=" in text:
        return None
    mode_sets = sorted((e for kind in ("train", "eval") for e in a.by_kind.get(kind, ())),
                       key=lambda e: e.seq)
    step_seqs = [s.seq for s in a.steps]
    own = other_steps = 0
    for i, e in enumerate(mode_sets):
        if e.kind != "train" or e.loc is None:
            continue
        end = mode_sets[i + 1].seq if i + 1 < len(mode_sets) else float("inf")
        stepped = any(e.seq < s < end for s in step_seqs)
        if e.loc.path == loc.path and e.loc.line == loc.line:
            own += 1
            if stepped:
                return None
        elif stepped:
            other_steps += 1
    if not own or not other_steps:
        return None
    return loc, text
