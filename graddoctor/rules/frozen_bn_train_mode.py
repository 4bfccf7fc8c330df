from __future__ import annotations

from ..findings import Role, Safety, Severity
from .base import Rule, one_or_many, related
from .source import method_calls, receiver, related_line


class FrozenBnTrainMode(Rule):
    """
    ## What it does
    Finds BatchNorm layers whose parameters are frozen (`requires_grad=False`) or owned by no
    optimizer, yet run in train mode during training updates. It points at the `model.train()`
    call that put them in train mode; when nothing ever set their mode, at the freeze that
    graddoctor saw (the first `requires_grad_(False)` that froze them) in a loop written by
    hand, else (or under a framework, which calls `train()` itself) at the forward call.

    ## Why is this bad?
    Freezing the parameters does not freeze a BatchNorm layer: in train mode every forward
    normalises with the batch's statistics and overwrites `running_mean` / `running_var` with
    them. The "frozen" backbone drifts towards the statistics of the small fine-tuning batches,
    and evaluation then runs with statistics the pretrained weights were never trained with.
    Layers that an EMA or momentum copy updates by hand, and layers frozen only for part of
    the run (a GAN discriminator during the generator's step) are not reported.

    ## Example
    ```python
    model.backbone.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.head.parameters(), lr=1e-3)
    for epoch in range(epochs):
        model.train()
        for x, y in loader:
            ...
    ```

    ## Use instead
    ```python
    model.backbone.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.head.parameters(), lr=1e-3)
    for epoch in range(epochs):
        model.train()
        model.backbone.eval()  # after every model.train(): frozen BatchNorm keeps its statistics
        for x, y in loader:
            ...
    ```

    ## Stays silent on
    `eval()` on a frozen BatchNorm after every `model.train()` (by hand, in an overridden
    `train()`, in a Lightning hook); BatchNorm without running statistics; a frozen encoder
    kept in eval mode; a teacher, BYOL target or MoCo momentum encoder in train mode under
    `no_grad`, EMA-updated; a GAN's discriminator frozen only while the generator steps; PGD
    attacks under `eval()`; the model's BatchNorm layers when the optimizer was built over a
    copy of the model instead (an EMA copy: param-not-in-optimizer reports that).
    """

    code = "GD301"
    slug = "frozen-bn-train-mode"
    severity = Severity.WARNING
    summary = "frozen BatchNorm layers run in train mode and keep updating their running statistics"
    fix = ("after every model.train(), put the frozen BatchNorm layers back in eval mode: "
           "model.backbone.eval(), or for m in model.modules(): "
           "if isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.weight.requires_grad: m.eval()")
    fixes = {
        "lightning": ("Lightning puts the whole LightningModule in train mode when fitting starts "
                      "and after every validation: put the frozen BatchNorm layers back in eval "
                      "mode in a hook, def on_train_epoch_start(self): self.backbone.eval() (or "
                      "on_train_batch_start when validation runs within an epoch)"),
        "accelerate": ("after every model.train(), put the frozen BatchNorm layers back in eval "
                       "mode: accelerator.unwrap_model(model).backbone.eval()"),
        "transformers": ("the Trainer calls model.train() at every training step: keep the frozen "
                         "BatchNorm layers in eval mode by overriding train() in the model "
                         "(def train(self, mode=True): super().train(mode); "
                         "self.backbone.eval(); return self)"),
    }

    fix_safety = Safety.UNSAFE  # eval() also switches the frozen part's dropout off

    def autofix(self, finding, src):
        """``.eval()`` on the frozen part after every ``train()`` of the model it sits in (or,
        with no train() call, after the freeze)."""
        cst = src.cst
        if finding.evidence.get("without_optimizer"):
            return None  # layers no optimizer trains: adding them to it may be the fix instead
        part = None
        freeze_line = related_line(finding, Role.FREEZE)
        if freeze_line is not None:
            calls = method_calls(src, "requires_grad_", line=freeze_line)
            if calls:
                part = receiver(src, calls[0])
            else:  # for p in part.parameters(): p.requires_grad = False
                s = src.statement_at(freeze_line)
                loop = src.enclosing_loop(s) if s is not None else None
                if loop is not None and loop.syntax == "For":
                    it = loop.node.iter
                    if isinstance(it, cst.Call) and isinstance(it.func, cst.Attribute) \
                            and it.func.attr.value == "parameters":
                        part = src.code(it.func.value)
        trains = method_calls(src, "train", line=finding.location.line)
        if part is not None and part.split(".")[0] == "self":
            # frozen inside the model's own class (self.teacher): outside it, the part is an
            # attribute of the model the script calls train() on
            part = receiver(src, trains[0]) + part[len("self"):] if trains else None
            if part is None:
                return None
        if part is None and trains:
            part = receiver(src, trains[0])
        if part is None:
            part = _common_part(finding.evidence.get("layers") or (), src)
        if part is None:
            return None
        root = part.split(".")[0].split("[")[0]
        sites = [c for c in method_calls(src, "train") if receiver(src, c) in (root, part)]
        edits = []
        for c in sites:
            s = src.statement_at(src.span(c)[0])
            if s is not None and all(e.line != s.end_line + 1 for e in edits):
                edits.append(src.insert_after(s, f"{part}.eval()  # frozen: keep its BatchNorm statistics"))
        if not edits:  # nothing ever calls train(): once, before the training loop
            s = src.statement_at(finding.location.line)
            loop = src.enclosing_loop(s) if s is not None else None
            while loop is not None and src.enclosing_loop(loop) is not None:
                loop = src.enclosing_loop(loop)
            if loop is not None:
                edits.append(src.insert_before(loop, f"{part}.eval()  # frozen: keep its BatchNorm statistics"))
            elif s is not None and finding.location.line == freeze_line:  # at the freeze itself
                edits.append(src.insert_after(s, f"{part}.eval()  # frozen: keep its BatchNorm statistics"))
        if not edits:
            return None
        where = "after train()" if sites else "before the training loop"
        return self.edit(f"put the frozen {part} in eval mode {where}", *edits)

    def check(self, a):
        tl = a.modes
        groups: dict = {}
        # a hand-written loop: eval() belongs at the freeze when nothing sets the mode; a
        # framework calls train() itself, and the fix is its hook, at the forward it drives
        by_hand = not a.framework
        misowned = {a.param_name(pid).rsplit(".", 1)[0]
                    for match in a.optimizers_on_copies.values() for pid in match["trained"]}
        for f in tl.forwards:
            if f.context != "training" or f.step is None or not f.training:
                continue
            for mid in f.modules:
                why = _frozen_why(f.states.get(mid) or {}, tl.final_states.get(mid) or {},
                                  mid in tl.ever_trainable)
                if why is None or mid in f.recalibrated:
                    continue
                if why == "unowned" and tl.name(mid) in misowned:
                    continue  # an optimizer built over the model's copy: param-not-in-optimizer
                cause = f.set_by.get(mid)
                if cause is not None and not cause.get("mode"):
                    cause = None  # set to train mode by hand (m.training = True): name the forward
                where = cause.loc if cause is not None else f.event.loc
                if cause is None and by_hand:
                    # nothing ever set its mode: the freeze is where eval() belongs
                    freeze = a.event((f.states.get(mid) or {}).get("freeze"))
                    where = freeze.loc if freeze is not None and freeze.loc is not None else where
                group = groups.setdefault(where, {"cause": cause, "forward": f, "mids": {}})
                group["mids"].setdefault(mid, why)
        for where, group in groups.items():
            f, cause, mids = group["forward"], group["cause"], group["mids"]
            frozen = [m for m, why in mids.items() if why == "frozen"]
            unowned = [m for m, why in mids.items() if why != "frozen"]
            what = " and ".join(part for part in (
                f"frozen ({tl.names(frozen)})" if frozen else "",
                f"trained by no optimizer ({tl.names(unowned)})" if unowned else "",
            ) if part)
            count = len(mids)
            layers = one_or_many(count, "a BatchNorm layer", f"{count} BatchNorm layers") + \
                f" whose parameters are {what}"
            their, them = one_or_many(count, "its", "their"), one_or_many(count, "it drifts", "they drift")
            if cause is not None:
                message = (f"this train() call puts {layers} in train mode: every training forward "
                           f"still updates {their} running statistics, so {them} to the statistics "
                           f"of these batches")
            elif where != f.event.loc:
                message = (f"this freezes {one_or_many(count, 'a BatchNorm layer', f'{count} BatchNorm layers')} "
                           f"({tl.names(mids)}), but nothing ever sets "
                           f"{one_or_many(count, 'it', 'them')} to eval: every training forward "
                           f"(line {f.event.loc.line}) runs {one_or_many(count, 'it', 'them')} in train "
                           f"mode and updates {their} running statistics, so {them} to the statistics "
                           f"of these batches")
            else:
                message = (f"this forward runs {layers} in train mode (nothing ever set "
                           f"{one_or_many(count, 'it', 'them')} to eval): every training forward updates "
                           f"{their} running statistics, so {them} to the statistics of these batches")
            freeze = None
            for mid in (frozen if where == f.event.loc else mids):
                freeze = a.event((f.states.get(mid) or {}).get("freeze"))
                if freeze is not None:
                    break
            yield self.finding(
                message, where,
                related=(
                    related(freeze, "the parameters are frozen here", Role.FREEZE),
                    related(f.event, "a training forward that updates their running statistics",
                            Role.TRAINING_FORWARD)
                    if cause is not None or where != f.event.loc else None,
                ),
                step=f.step_index,
                fix=("put the frozen layers in eval mode right after freezing them (.eval() on the "
                     "module frozen here), and again after any later train() call that covers them")
                if where != f.event.loc and cause is None else None,
                evidence={"layers": [tl.name(m) for m in mids], "frozen": len(frozen),
                          "without_optimizer": len(unowned)},
            )


def _common_part(layers, src) -> str | None:
    """``features`` for layers ``features.1``, ``features.4``: the module that holds them all,
    when the script names it (a variable of the file)."""
    parts = [str(name).split(".")[:-1] for name in layers]
    if not parts or not parts[0]:
        return None
    common = []
    for pieces in zip(*parts):
        if len(set(pieces)) != 1:
            break
        common.append(pieces[0])
    if not common or not all(p.isidentifier() for p in common):
        return None
    names = {n.value for n in src.nodes(src.cst.Name)}
    return ".".join(common) if common[0] in names else None


def _frozen_why(state: dict, final: dict, ever_trainable: bool) -> str | None:
    """'frozen' / 'unowned' for a BatchNorm layer whose running statistics should not move."""
    if state.get("layer") != "batchnorm" or not state.get("has_params"):
        return None
    if not state.get("track_running_stats") or state.get("momentum") is None:
        return None  # nothing drifts / a cumulative average on purpose
    if final.get("updated") or state.get("updated"):
        return None  # an EMA / momentum encoder: updated by hand, train mode on purpose
    if state.get("frozen") and not ever_trainable:  # (a GAN's D frozen only for G's step trains)
        return "frozen"
    if state.get("owned") is False and final.get("owned") is False:
        return "unowned"
    return None
