from __future__ import annotations

from ..analysis.modes import evaluation_backward
from ..findings import Autofix, Role, Safety, Severity
from .base import Rule, one_or_many, related
from .source import call_bare_method, method_calls, receiver, related_line


class TrainInEvalMode(Rule):
    """
    ## What it does
    Finds optimizer steps whose training forward ran dropout or BatchNorm layers in eval mode
    while gradients flowed through them — typically validation called `model.eval()` and
    training never switched back. It points at that `eval()` call. Layers set to eval one by
    one (the frozen-BatchNorm idiom), `eval()` on a part whose parameters are all frozen, and
    models used under `no_grad` (a teacher) are not reported. When the `eval()` covered only a
    part of the model (`model.backbone.eval()`) whose parameters still train, the finding gives
    both readings: a freeze that misses `requires_grad_(False)`, or a part meant to train.
    An `eval()` that came with a freeze of everything under it (`model.requires_grad_(False);
    model.eval()`, Lightning's `self.freeze()`) is a frozen part kept in eval mode, until a
    part of it is unfrozen (`head.requires_grad_(True)`) and stepped: its BatchNorm layers then
    train in eval mode, and the finding says so. An `eval()` that a `train()` undoes only after the
    training forward (`model.eval(); out = model(x); model.train(); loss.backward()`) leaves that
    forward, the one the backward differentiates, in eval mode: reported too, with no edit. Dropout written as a function of the module's
    mode, `F.dropout(x, p, training=self.training)` (the PyTorch Geometric idiom), counts as a
    dropout layer of the module whose code runs it.

    ## Why is this bad?
    In eval mode dropout does nothing and BatchNorm normalises with its running statistics,
    which then stop adapting. The model keeps training, but without the regularisation and
    normalisation it was designed with; after the first validation every epoch silently trains
    a different network than the first one did.

    ## Example
    ```python
    for epoch in range(epochs):
        for x, y in train_loader:
            ...
        model.eval()
        with torch.no_grad():
            val_loss = sum(loss_fn(model(x), y) for x, y in val_loader)
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        model.train()
        for x, y in train_loader:
            ...
        model.eval()
        with torch.no_grad():
            val_loss = sum(loss_fn(model(x), y) for x, y in val_loader)
    ```

    ## Stays silent on
    `model.train()` before the training forward and `eval()` + `no_grad` for validation; an
    adversarial attack run in eval mode (its backward takes the input's gradient) before
    `model.train()`; a frozen backbone or encoder kept in eval mode on purpose; BatchNorm
    statistics frozen on purpose; a teacher in eval mode under `no_grad`; samples drawn under
    `no_grad`; a soft prompt, a steering vector or an input optimised through a model in eval mode
    whose parameters no optimizer trains (frozen by `p.requires_grad = False` after the eval(), or
    just left out of the optimizer); a frozen loss network (a perceptual loss's VGG with BatchNorm) put in eval mode
    before its `requires_grad_(False)`; a frozen part whose unfrozen piece is put back in train mode (`head.train()`
    after `head.requires_grad_(True)`); a model with no BatchNorm or dropout (or whose
    `F.dropout` has p = 0 or a flag that stays on for sampling, `self.training or mc`); `model.training` read as an attribute; a
    validation pass that calls `backward()` (`backward-in-evaluation` reports it); an
    evaluation forward between two updates without `no_grad` (a test prediction to plot) whose
    `eval()` a `train()` undoes before the next training forward and its backward.
    """

    code = "GD302"
    slug = "train-in-eval-mode"
    severity = Severity.WARNING
    summary = "training continues with dropout/BatchNorm in eval mode: an eval() call is never undone"
    fix = "call model.train() at the start of every training epoch (after each validation pass)"
    fixes = {
        "lightning": ("Lightning puts the LightningModule in train mode when fitting starts and "
                      "after each validation, not after an eval() of yours in a hook or in "
                      "training_step: drop that eval() (torch.no_grad() alone is enough for a "
                      "monitoring forward) or call self.train() right after it; to keep a part "
                      "fixed, freeze it too (requires_grad_(False))"),
        "transformers": ("the Trainer calls model.train() at every training step, but an eval() "
                         "of yours in compute_loss or a callback holds until then: drop it, or "
                         "call model.train() right after the forward that needed it"),
    }

    fix_safety = Safety.SAFE

    def autofix(self, finding, src):
        """Call a bare ``model.train`` (the statement only names the method); else put the
        module back in train mode at the top of the loop that runs both the ``eval()`` (or the
        call of the function that makes it) and the training forward."""
        cst = src.cst
        bare = call_bare_method(src, finding.location.line, ("train",))
        if bare is not None:
            return self.edit("call the train the statement only names", bare)
        if finding.evidence.get("reading") == "freeze-or-train":
            return Autofix(title="", safety=self.fix_safety, refused=(
                "no automatic edit: whether this part is meant to be frozen (requires_grad_(False)) "
                "or to train (no eval()) is a person's call"))
        if finding.evidence.get("reading") == "undone-late":
            return Autofix(title="", safety=self.fix_safety, refused=(
                "no automatic edit: the train() is there, after the forward; whether to move it "
                "before the forward or drop the eval() depends on what the eval() was for"))
        if finding.evidence.get("reading") == "unfrozen":
            return Autofix(title="", safety=self.fix_safety, refused=(
                "no automatic edit: model.train() at the top of the loop would also undo the "
                "eval() the still-frozen part is kept in; the part you unfreeze is the one to "
                "put back in train mode"))
        evals = method_calls(src, "eval", line=finding.location.line)
        forward_line = related_line(finding, Role.TRAINING_FORWARD)
        here = src.statement_at(finding.location.line)
        if len(evals) != 1 or forward_line is None or here is None:
            return None
        module = receiver(src, evals[0])
        site = here
        function = src.enclosing_function(here)
        if function is not None:  # eval() inside a helper: where the loop calls it
            name = function.node.name.value
            calls = [c for c in src.nodes(cst.Call) if isinstance(c.func, cst.Name)
                     and c.func.value == name]
            params = [p.name.value for p in function.node.params.params]
            root = module.split(".")[0]
            if len(calls) != 1:
                return None
            if root in params:
                index = params.index(root)
                args = calls[0].args
                if index >= len(args) or args[index].keyword is not None:
                    return None
                module = src.code(args[index].value) + module[len(root):]
            site = src.statement_at(src.span(calls[0])[0])
            if site is None:
                return None
        loop = src.enclosing_loop(site)
        while loop is not None and not loop.contains(forward_line):
            loop = src.enclosing_loop(loop)
        if loop is None or not loop.children:
            return None
        return self.edit(f"put {module} back in train mode at the top of the training loop",
                         src.insert_before(loop.children[0], f"{module}.train()"))

    def check(self, a):
        tl = a.modes
        groups: dict = {}
        for f in tl.forwards:
            if f.context != "training" or f.step is None or f.training or not f.grad:
                continue
            if evaluation_backward(a, f) is not None:
                continue  # a pass in eval mode with its own backward, then train() for the
                # update: an attack's input gradient, or backward-in-evaluation's mistake
            if _rerun_in_train_mode(a, tl, f):
                continue  # an evaluation forward between two updates (a plot, a test loss),
                # undone by train(): the update's backward reads a forward made after it
            flowing = f.grad_modules
            for mid in f.modules:
                if mid not in flowing or mid in f.recalibrated or not _mode_matters(f.states.get(mid) or {}):
                    continue
                cause = f.set_by.get(mid)
                if cause is None or cause.get("mode") or cause.get("leaf"):
                    continue  # set by hand; one layer on purpose (frozen BatchNorm)
                if cause.get("frozen") and not _unfrozen_since(f.states.get(mid) or {}):
                    continue  # a frozen part kept in eval mode on purpose
                if (f.states.get(mid) or {}).get("frozen"):
                    continue  # its own parameters frozen when it ran, whether the freeze came
                    # before or after the eval(): a perceptual loss's VGG, a fixed backbone
                if ((f.states.get(mid) or {}).get("model")
                        or (tl.final_states.get(mid) or {}).get("model")):
                    continue  # a dropout layer of a model no optimizer trains, the gradient
                    # passing through it to something else: a steering vector, a soft prompt
                    # or an input optimised through a frozen model kept in eval mode
                group = groups.setdefault(cause.loc, {"cause": cause, "forward": f, "mids": []})
                if mid not in group["mids"]:
                    group["mids"].append(mid)
        # the layers each training forward runs, in either mode (one mode_forward per mode)
        ran: dict = {}
        for g in tl.forwards:
            if g.context == "training" and g.step is not None:
                ran.setdefault((g.event.loc, g.step.seq), set()).update(g.modules)
        for where, group in groups.items():
            f, cause, mids = group["forward"], group["cause"], group["mids"]
            layers = sorted({(f.states.get(m) or {}).get("layer", "") for m in mids})
            kinds = " and ".join(_KINDS[k] for k in layers if k)
            at = f" at {f.event.loc}" if f.event.loc is not None else ""
            effect = " and ".join(part for k, part in (
                ("dropout", "dropout is off"),
                ("batchnorm", "BatchNorm normalises with running statistics that stop adapting"),
            ) if k in layers or (k == "dropout" and "functional_dropout" in layers))
            message = (f"this eval() is never undone: the training forward{at} runs {kinds} in "
                       f"eval mode ({tl.names(mids)}) while gradients flow through "
                       f"{one_or_many(len(mids), 'it', 'them')} (optimizer step {f.step_index} "
                       f"follows): training continues, but {effect}")
            fix = None
            late = next((e for e in a.span(f.event.seq + 1, f.step.seq - 1) if e.kind == "train"
                         and e.get("mode", True) and set(mids) <= set(e.get("modules", ()))), None)
            if late is not None:  # undone, but after the forward the update's backward reads
                message = (f"this eval() is undone only after the training forward{at}: the "
                           f"train() at line {late.loc.line if late.loc else '?'} comes before the "
                           f"backward but after the forward it differentiates, which ran {kinds} "
                           f"in eval mode ({tl.names(mids)}; optimizer step {f.step_index} "
                           f"follows), so {effect}")
                fix = ("call train() before the training forward (or drop this eval() if no "
                       "evaluation needs it)")
            undone_late = late is not None
            covered = set(cause.get("modules", ()))
            part = _part_receiver(a, cause)
            if (covered and covered < ran.get((f.event.loc, f.step.seq), set())) or part:
                # eval() on a part of the model the training forward runs, whose parameters still
                # train: a freeze that only half happened, or a part meant to train. eval()
                # freezes nothing: say that first.
                stepped = any((f.states.get(m) or {}).get("owned") and (f.states.get(m) or {}).get("trainable")
                              for m in mids)
                still = ("the optimizer still steps its parameters" if stepped else
                         "its parameters still require grad")
                off = " and ".join(part_ for k, part_ in (
                    ("dropout", "dropout off"), ("batchnorm", "BatchNorm's running statistics fixed"),
                ) if k in layers or (k == "dropout" and "functional_dropout" in layers))
                shown = part or "that part"
                message = (f"this eval() does not freeze {shown}: eval() only switches its "
                           f"{kinds} layers ({tl.names(mids)}) to inference behaviour, while "
                           f"{still} and gradients flow through it in the training forward{at} "
                           f"(optimizer step {f.step_index} follows), so its weights keep "
                           f"changing. If it is meant to train instead, it trains with {off}")
                fix = (f"to freeze it: {shown}.requires_grad_(False) (and leave its parameters out "
                       f"of the optimizer), keeping this eval() after every model.train(); to "
                       f"train it, remove this eval()")
                evidence_reading = "freeze-or-train"
            else:
                evidence_reading = None
            if cause.get("frozen"):
                # eval() came with a freeze of everything under it (Lightning's freeze() does
                # both); a part unfrozen afterwards trains, and stays in eval mode
                message = (f"this eval() ran while every parameter under it was frozen, but "
                           f"{tl.names(mids)} {one_or_many(len(mids), 'was', 'were')} unfrozen "
                           f"afterwards (requires_grad_(True)) and the optimizer steps "
                           f"{one_or_many(len(mids), 'its', 'their')} parameters: the training "
                           f"forward{at} runs {one_or_many(len(mids), 'it', 'them')} in eval "
                           f"mode (optimizer step {f.step_index} follows), so {effect}")
                fix = ("put the part you unfreeze back in train mode: call .train() on it right "
                       "after its requires_grad_(True) (eval() and freeze() leave it in eval mode)")
                evidence_reading = "unfrozen"
            bare = _bare_train(a, f.event)
            if bare is not None:  # `model.train` named, not called: that statement is the bug
                message = (f"`{bare[1]}` names the method without calling it, so the eval() at "
                           f"line {where.line if where else '?'} is never undone: the training "
                           f"forward{at} runs {kinds} in eval mode ({tl.names(mids)}) while "
                           f"gradients flow through {one_or_many(len(mids), 'it', 'them')}: "
                           f"training continues, but {effect}")
                fix = f"call it: {bare[1]}()"
            yield self.finding(
                message, bare[0] if bare is not None else where, fix=fix,
                related=(
                    related(cause, "the eval() it leaves in place") if bare is not None else None,
                    related(f.event, "a training forward that runs in eval mode", Role.TRAINING_FORWARD),
                    related(f.step, "the optimizer step that follows"),
                ),
                step=f.step_index,
                evidence={"layers": [tl.name(m) for m in mids], "kinds": layers,
                          **({"reading": evidence_reading} if evidence_reading else
                             {"reading": "undone-late"} if undone_late else {})},
            )


_KINDS = {"dropout": "dropout", "batchnorm": "BatchNorm",
          # a module whose own code runs F.dropout(x, p, self.training)
          "functional_dropout": "F.dropout(..., training=self.training)"}


def _part_receiver(a, cause) -> str | None:
    """The source text of the module an ``eval()`` was called on when it names a part of a
    model (``model.backbone``, ``self.encoder``): an attribute of another object that is not
    itself the whole model (``self.model``, ``trainer.module``). None otherwise."""
    loc = cause.loc
    if loc is None or loc.via:
        return None
    text = a.source.called_object(loc.path, loc.line, "eval")
    if not text or "." not in text or "(" in text:
        return None
    last = text.rsplit(".", 1)[1].lower()
    if last in ("model", "module", "net", "network", "ema", "teacher", "student"):
        return None
    return text


def _mode_matters(state: dict) -> bool:
    """Does eval mode change what this layer computes?"""
    if state.get("layer") in ("dropout", "functional_dropout"):
        return bool(state.get("p"))
    if state.get("layer") == "batchnorm":
        return bool(state.get("track_running_stats"))
    return False


def _bare_train(a, forward):
    """``(location, text)`` of a ``something.train`` statement without parentheses in a loop
    around this training forward (a no-op the trace cannot show), or None."""
    loc = forward.loc if forward is not None else None
    if loc is None or loc.via:
        return None
    from dataclasses import replace


    lines = a.source.bare_method_lines(loc.path, loc.line, "train", outer=True)
    return (replace(loc, line=lines[0][0]), lines[0][1]) if lines else None


def _unfrozen_since(state: dict) -> bool:
    """Whether a BatchNorm layer an eval() found frozen trains at this forward: its parameters
    require grad again and an optimizer owns them (a dropout layer has no parameters to say)."""
    return bool(state.get("trainable") and state.get("owned"))


def _rerun_in_train_mode(a, tl, f) -> bool:
    """``f`` ran in eval mode with gradients on, and before any backward follows it a
    ``train()`` covers its layers and the same layers run again in training mode: ``f`` was an
    evaluation pass between two updates (a test prediction to plot, without ``no_grad``), and
    the update's backward reads the forward made after ``train()``."""
    after = a.span(f.event.seq + 1, f.step.seq - 1)
    backward = next((e for e in after if e.kind == "backward"), None)
    end = backward.seq if backward is not None else f.step.seq
    ran = set(f.modules)
    train = next((e for e in after if e.kind == "train" and e.seq < end and e.get("mode", True)
                  and ran <= set(e.get("modules", ()))), None)
    if train is None:
        return False
    return any(g.training and train.seq < g.event.seq < end and ran & set(g.modules)
               for g in tl.forwards)

