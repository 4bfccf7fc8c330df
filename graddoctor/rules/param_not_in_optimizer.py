from __future__ import annotations

from ..findings import Autofix, Safety, Severity
from ..analysis import written
from ..trace import Location
from .base import Rule, related
from .source import attribute_assignment, torch_nn
from ..analysis.source import walk


class ParamNotInOptimizer(Rule):
    """
    ## What it does
    Finds trainable tensors that receive gradients but that no optimizer that still steps owns,
    and says why: a module that keeps submodules in a plain `list`/`dict` (nn.Module registers
    none of them, so `model.parameters()` leaves them out; pointed at the assignment), a
    learnable tensor made with `requires_grad=True` instead of `nn.Parameter`, an optimizer
    rebuilt mid-run over fewer parameters than the one it replaced (awd-lstm's switch to ASGD
    over `model.parameters()` only), a layer or `nn.Parameter` built inside `forward` or the
    loop (new random weights at every step, built after the optimizer; pointed at the line that
    builds them), a layer built once after every optimizer was constructed (a head made in
    Lightning's `on_train_start`, after `configure_optimizers` read `self.parameters()`;
    pointed at the line that builds it), an optimizer built over a copy of the model instead of the model
    (`SGD(model_ema.parameters())`, `AdamW(target_net.parameters())`: it owns the copy's
    tensors, which never get a gradient, while the model's, of the same names and shapes, get
    gradients it does not own; pointed at the optimizer, naming the copy, and the rules that
    see its symptoms — param-without-grad, frozen-bn-train-mode, reload-discards-training —
    leave it to this one), parameters frozen when the optimizer was built over the trainable ones
    (`filter(lambda p: p.requires_grad, model.parameters())`) and unfrozen later without being
    added to it (gradual unfreezing; pointed at the optimizer, with the update they first got
    a gradient at, or at the later statement of its scope that hands it to the next phase
    under another name, `optimizer = head_opt`), a list of parameters taken before the model took its present shape
    (`trainable = [p for p in model.parameters() if p.requires_grad]`, then LoRA adapters
    injected or a head appended and the old weights frozen: the optimizer built from it owns
    nothing that gets a gradient; pointed at the list), an optimizer built over exactly the
    parameters an earlier optimizer owns (a GAN's `optimizerG = Adam(netD.parameters())`, a
    critic's optimizer copied from the actor's line: pointed at the later one, naming the model
    left without an optimizer), or parameters simply left out of the
    optimizer. An optimizer class the script writes itself is pointed at where it is built,
    not at its `super().__init__`. Tensors
    whose values still change between steps (fp16 master weights: the model's gradients are
    copied into an fp32 master the optimizer steps, and the values copied back; a hand-written
    update) train, and are left alone, as are inputs whose gradient is the point (FGSM). When
    the script has no `torch.optim` optimizer at all (hand-written SGD), it says once, as
    `info`, that the zero_grad checks cannot judge the loop.

    ## Why is this bad?
    Those layers never train although backward spends time on them: usually a module added
    after the optimizer was built, or an optimizer built from `model.backbone.parameters()`
    while the loss also flows through `model.head`. Modules in a plain list are also skipped by
    `model.to()`, `state_dict()` and `zero_grad()`.

    ## Example
    ```python
    optimizer = torch.optim.AdamW(model.backbone.parameters(), lr=1e-3)
    loss_fn(model.head(model.backbone(x)), y).backward()
    optimizer.step()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = [nn.Linear(16, 16) for _ in range(4)]  # not registered
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # or, when the head is meant to stay fixed:
    model.head.requires_grad_(False)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))
    ```

    ## Stays silent on
    A loop with no torch optimizer (one `info`: the checks are limited); frozen parameters
    left out of the optimizer; fp16 master weights (the model's parameters get gradients no
    optimizer owns, but their values are copied back from the fp32 master every update); a
    tensor updated by hand; input gradients (FGSM, a gradient penalty: a fresh leaf each
    step); fixed data made with `requires_grad=True`; an EMA teacher or momentum encoder
    (BYOL, MoCo) owned by no optimizer, and a target network synced from the model whose
    target is not detached (its gradients change nothing of the update); an optimizer rebuilt over the same parameters;
    parametrized weights (`weight_norm`, `spectral_norm`, pruning); gradual unfreezing that
    adds the unfrozen parameters with `add_param_group`, that rebuilds the optimizer over them,
    or whose optimizer owned the frozen parameters from the start; a frozen model's
    `requires_grad` switched on for `torch.autograd.grad` (no `.grad` is written).
    """

    code = "GD105"
    slug = "param-not-in-optimizer"
    severity = Severity.WARNING
    summary = "parameters receive gradients but no optimizer updates them"
    fix = ("pass every trained parameter to the optimizer (model.parameters()), or freeze the "
           "others with requires_grad_(False)")
    fix_safety = Safety.UNSAFE

    def autofix(self, finding, src):
        """A module's plain list or dict of submodules (or of tensors) becomes
        ``nn.ModuleList``/``nn.ModuleDict`` (``nn.ParameterList``/``nn.ParameterDict``), a
        plain tensor attribute ``nn.Parameter``: ``self.blocks = nn.ModuleList([...])``.
        Unsafe: the model's ``state_dict`` gains the keys, so older checkpoints no longer load
        strictly. A parameter left out of the optimizer gets no edit: which optimizer should
        own it, at which learning rate, is a person's call."""
        wrapper, attr = finding.evidence.get("wrapper"), finding.evidence.get("attribute")
        if finding.evidence.get("cause") == "created-while-training":
            return Autofix(title="", safety=self.fix_safety, refused=(
                "no automatic edit: moving the layer into __init__ means naming it and "
                "changing forward, a person's edit"))
        if finding.evidence.get("cause") == "built-after-optimizer":
            return Autofix(title="", safety=self.fix_safety, refused=(
                "no automatic edit: moving the layer's construction before the optimizer (or "
                "adding its parameters to it, at some learning rate) is a person's call"))
        if finding.evidence.get("cause") == "optimizer-on-copy":
            return Autofix(title="", safety=self.fix_safety, refused=(
                "no automatic edit: the optimizer's argument names the copy, and which expression "
                "names the trained model instead is a person's edit"))
        if not wrapper or not attr:
            return Autofix(title="", safety=self.fix_safety, refused=(
                "no automatic edit: which optimizer should own these parameters, and at which "
                "learning rate, is a person's call"))
        found = attribute_assignment(src, finding.location.line, attr)
        nn = torch_nn(src)
        if found is None or nn is None:
            return None
        _, _, value = found
        return self.edit(f"register self.{attr} as {wrapper}",
                         src.replace(value, f"{nn}.{wrapper}({src.code(value)})"))

    fixes = {
        "lightning": ("in configure_optimizers, build the optimizer over self.parameters() (or "
                      "give each part its param group), or freeze the others in __init__ with "
                      "requires_grad_(False)"),
        "accelerate": ("create the optimizer over every trained parameter (model.parameters()) "
                       "before accelerator.prepare, or freeze the others with requires_grad_(False)"),
    }

    def check(self, a):
        led = a.ledger
        params = a.params
        if not a.optimizers:
            return  # a hand-written update: nothing to own; the run's notes say so (rules/notes.py)
        moved = a.moved | a.replaced_pids  # replaced ones: param-replaced names the cause
        untouched = _never_cleared_across_steps(a)
        orphans, dropped = [], {}
        for pid in led.first_contribution:
            event = params.get(pid)
            if event is None or pid in moved:
                continue  # unknown, or trained by a copy (fp16 master weights) or by hand
            if not event.get("is_parameter") and pid not in untouched:
                continue  # an input's gradient (FGSM, saliency): the point of that backward
            owners = a.owners.get(pid)
            if not owners:
                orphans.append(pid)
            elif all(opt in a.replaced for opt in owners):
                new = max((a.replaced[opt] for opt in owners), key=lambda e: e.seq)
                if _trained_after(a, pid, new.seq):
                    dropped.setdefault(new.seq, (new, []))[1].append(pid)
        followers = _follower_copies(a)
        orphans = [pid for pid in orphans if not _held_in(a.param_name(pid), followers)]
        if orphans:
            construction = _later_phase_optimizer(a, orphans)
            later_phase = construction is not None
            if construction is None:
                construction = next(iter(a.optimizers.values()))
            yield from self._unowned(a, orphans, construction, later_phase)
        for new, pids in dropped.values():
            yield self._dropped(a, new, pids)

    def _unowned(self, a, orphans, construction, later_phase=False):
        led = a.ledger
        left = dict.fromkeys(orphans)
        for event in a.of_kind("unregistered"):
            pids = [pid for pid in event.get("pids") or () if pid in left]
            if not pids:
                continue
            for pid in pids:
                left.pop(pid, None)
            yield self._unregistered(a, event, pids, construction)
        yield from self._created(a, left, construction)
        yield from self._on_copy(a, left)
        tensors = [pid for pid in left if not a.params[pid].get("is_parameter")]
        if tensors:
            one = len(tensors) == 1
            it, its, they = ("it", "it", "it") if one else ("them", "them", "they")
            cls = a.optimizer_class(construction["opt"]) or "Adam"
            yield self.finding(
                f"{a.names(tensors)} {'is a tensor' if one else 'are tensors'} with "
                f"requires_grad=True, not nn.Parameter: backward gives {it} a gradient every "
                f"update (accumulating, never cleared), but no optimizer owns {its} "
                f"(model.parameters() leaves plain tensors out), so {they} never "
                f"{'trains' if one else 'train'}",
                construction.loc,
                related=(related(led.first_contribution[tensors[0]], "the backward that gives them gradients"),),
                fix=(f"pass {it} to the optimizer (torch.optim.{cls}([*model.parameters(), "
                     f"{a.param_name(tensors[0])}])), or make {it} an nn.Parameter attribute of "
                     "the module so that model.parameters() includes it"),
                fixes={},
                evidence={"params": [a.param_name(p) for p in tensors], "count": len(tensors),
                          "cause": "plain-tensor"},
            )
        plain = [pid for pid in left if a.params[pid].get("is_parameter")]
        if plain:
            twin = self._twin_optimizer(a, plain)
            if twin is not None:
                yield twin
                return
        late = [] if later_phase else \
            [pid for pid in plain if a.steps_before(led.first_contribution[pid].seq) > 0]
        if late:
            yield self._late(a, late, construction)
            plain = [pid for pid in plain if pid not in late]
        if plain:
            stale = self._stale_list(a, plain, construction)
            if stale is not None:
                yield stale
                return
            yield self.finding(
                (f"{a.names(plain)} receives gradients but no optimizer owns it: it never trains"
                 if len(plain) == 1 else
                 f"{a.names(plain)} receive gradients but no optimizer owns them: they never train"),
                construction.loc,
                related=(related(led.first_contribution[plain[0]], "the backward that gives them gradients"),),
                evidence={"params": [a.param_name(p) for p in plain], "count": len(plain)},
            )

    def _stale_list(self, a, pids, construction):
        """Every optimizer built over a list of parameters none of which ever gets a gradient,
        the list a variable assigned before the optimizer from ``.parameters()``: taken before
        the model changed (LoRA adapters injected, a new head put on, the old weights frozen
        since), so the optimizer holds what is frozen now and none of what trains."""
        if len(a.optimizers) != 1 or construction.loc is None:
            return None
        owned = [pid for pid, opts in a.owners.items() if construction["opt"] in opts]
        if not owned or any(pid in a.ledger.first_contribution for pid in owned):
            return None
        path, line = construction.loc.path, construction.loc.line
        cls = construction.get("cls") or "optimizer"
        arg = a.source.call_argument(path, line, cls, 0, "params")
        if arg is None or not arg.isidentifier():
            return None
        origin = a.source.value_origin(path, line, arg)
        if origin is None or origin[0] >= line or "parameters(" not in origin[1]:
            return None
        one = len(pids) == 1
        return self.finding(
            f"`{origin[1].strip()}` is taken here, before the model took its present shape: the "
            f"{cls} built from `{arg}` (line {line}) owns {a.names(owned)}, none of which ever "
            f"gets a gradient (frozen since), while {a.names(pids)} "
            f"{'receives' if one else 'receive'} gradients but no optimizer owns "
            f"{'it' if one else 'them'}: nothing trains",
            Location(path, origin[0]),
            related=(related(construction, f"the {cls}, built over that list"),
                     related(a.ledger.first_contribution[pids[0]], "the backward that gives them gradients")),
            fix=(f"take `{arg}` after the model is changed (adapters injected, layers frozen), "
                 f"right before the {cls} is built"),
            fixes={},
            evidence={"params": [a.param_name(p) for p in pids[:8]], "count": len(pids),
                      "cause": "list-taken-early", "list": arg,
                      "owned": [a.param_name(p) for p in owned[:8]]},
        )

    def _twin_optimizer(self, a, pids):
        """An optimizer built over exactly the parameters an earlier one owns (a GAN's optimizerG
        built over netD.parameters(), copied from the line above) while other parameters get
        gradients no optimizer owns: the later one was meant for those."""
        owned = {opt: frozenset(a.opt_params.get(opt, ())) for opt in a.optimizers}
        earlier = []
        for opt in a.optimizers:
            match = next((o for o in earlier if owned[opt] and owned[o] == owned[opt]), None)
            earlier.append(opt)
            if match is None or opt in a.replaced or match in a.replaced:
                continue
            init, first = a.optimizers[opt], a.optimizers[match]
            if init.loc is None or first.loc is None or (init.loc.path, init.loc.line) == (first.loc.path, first.loc.line):
                continue  # one line building optimizers in a loop: not a copy of another line
            if _inside_class(a, init.loc) or _inside_class(a, first.loc):
                continue  # SAM, Lookahead: a wrapper builds its base optimizer over its own groups
            cls = a.optimizer_class(opt) or "optimizer"
            models = {a.param_name(pid).split(".")[0] for pid in pids}
            model = next(iter(models)) if len(models) == 1 and "." in a.param_name(pids[0]) else None
            shared = sorted(owned[opt])
            return self.finding(
                f"{a.names(pids)} receive gradients but no optimizer owns them, while the {cls} "
                f"built here owns exactly the parameters of the optimizer built at line "
                f"{first.loc.line} ({a.names(shared, 2)}): it was built over the wrong "
                f"parameters, so {model or 'the model'} never trains and the other one is "
                f"stepped by two optimizers",
                init.loc,
                related=(related(first, "the optimizer that already owns these parameters"),
                         related(a.ledger.first_contribution[pids[0]], "the first backward that gives the others gradients")),
                fix=(f"build this optimizer over {model}.parameters()" if model else
                     "build this optimizer over the parameters that get gradients but have no optimizer"),
                fixes={},
                evidence={"params": [a.param_name(p) for p in pids[:8]], "count": len(pids),
                          "cause": "optimizer-over-another's-parameters",
                          "owned": [a.param_name(p) for p in shared[:8]]},
            )
        return None

    def _late(self, a, pids, construction):
        """Parameters whose first gradient comes after optimizer steps, when every optimizer was
        built already: frozen (or unused) when their optimizer read its parameter list (the
        trainable ones, ``filter(lambda p: p.requires_grad, ...)``), unfrozen since and never
        added to it."""
        first = min((a.ledger.first_contribution[pid] for pid in pids), key=lambda e: e.seq)
        update = a.steps_before(first.seq) + 1
        one = len(pids) == 1
        they, them = ("it", "it") if one else ("they", "them")
        cls = a.optimizer_class(construction["opt"]) or "optimizer"
        built = construction.loc
        reused = a.source.rebound_later(built.path, built.line) if built is not None else None
        if reused is not None:
            return self._reused(a, pids, construction, first, update, Location(built.path, reused))
        return self.finding(
            f"{a.names(pids)} {'receives' if one else 'receive'} gradients (seen from update "
            f"{update}) but no optimizer owns {them}: the {cls} built here did not take {them} "
            f"(left out, or frozen when it read its parameter list and unfrozen since without "
            f"being added), so {they} never {'trains' if one else 'train'}",
            construction.loc,
            related=(related(first, "the first backward that gives them gradients"),),
            fix=(f"add {them} to the optimizer (when you unfreeze {them}: "
                 "optimizer.add_param_group({\"params\": [...], \"lr\": ...})), or build the "
                 "optimizer over every parameter (model.parameters()): it skips the frozen ones "
                 "while they have no gradient"),
            fixes={},
            evidence={"params": [a.param_name(p) for p in pids[:8]], "count": len(pids),
                      "cause": "gradients-after-optimizer", "update": update},
        )

    def _reused(self, a, pids, construction, first, update, loc):
        """The late parameters' case where a later phase takes over the earlier phase's
        optimizer under another name (``optimizer = head_opt`` after unfreezing the backbone):
        the line that reuses it is the one to change."""
        cls = a.optimizer_class(construction["opt"]) or "optimizer"
        text = a.source.line_text(loc.path, loc.line).strip()
        old = text.split("=")[-1].strip() or "the earlier optimizer"
        return self.finding(
            f"{a.names(pids)} receive gradients (seen from update {update}) but no optimizer "
            f"owns them: `{text}` reuses the {cls} built at line {construction.loc.line} over "
            f"the parameters trainable then, and it never took the ones unfrozen since, so they "
            f"never train",
            loc,
            related=(related(construction, "the optimizer built before they were unfrozen"),
                     related(first, "the first backward that gives them gradients")),
            fix=(f"build a new optimizer here over every trainable parameter, or add the "
                 f"unfrozen ones to {old} with {old}.add_param_group({{\"params\": [...], "
                 f"\"lr\": ...}})"),
            fixes={},
            evidence={"params": [a.param_name(p) for p in pids[:8]], "count": len(pids),
                      "cause": "gradients-after-optimizer", "update": update, "reused_at": loc.line},
        )

    def _on_copy(self, a, left: dict):
        """An optimizer built over a copy of the model (an EMA copy, a frozen teacher) instead of
        the model: it owns the copy's tensors, which no backward reaches, while the model's, of
        the same names and shapes, get gradients no optimizer owns (``a.optimizers_on_copies``)."""
        for opt, match in a.optimizers_on_copies.items():
            pids = [pid for pid in match["trained"] if pid in left]
            if not pids:
                continue
            for pid in pids:
                left.pop(pid, None)
            init = a.optimizers[opt]
            cls = init.get("cls", "optimizer")
            copy, model = match["copy"], match["model"]
            idle = match["idle"]
            n = a.count(s for s in a.steps if s.get("opt") == opt and not s.get("skipped"))
            yield self.finding(
                f"{a.names(pids)} receive gradients but no optimizer owns them: the {cls} built "
                f"here owns {copy}'s tensors instead ({a.names(idle, 2)}: a copy of {model} with "
                f"the same names and shapes), which no backward reaches, so it steps {n} times "
                f"without a gradient and {model} never trains",
                init.loc,
                related=(related(a.ledger.first_contribution[pids[0]],
                                 "the backward that gives the model's tensors gradients"),),
                fix=(f"build the {cls} over the parameters of the model the loss trains "
                     f"({model}.parameters()), not over {copy}'s"),
                fixes={},
                evidence={"params": [a.param_name(p) for p in pids[:8]], "count": len(pids),
                          "cause": "optimizer-on-copy", "copy": copy, "model": model,
                          "optimizer": opt},
            )

    def _created(self, a, left: dict, construction):
        """Parameters built anew while training runs, at one line, at two steps or more (a
        layer made inside ``forward``): each forward uses fresh ones no optimizer owns."""
        by_line: dict[tuple, list] = {}
        for event in a.of_kind("param_created"):
            if event.loc is None:
                continue
            for pid in event.get("params") or ():
                if pid in left:
                    by_line.setdefault((event.loc.path, event.loc.line), []).append((event, pid))
        recorded = {pid for items in by_line.values() for _, pid in items}
        for items in by_line.values():
            if len({event["step"] for event, _ in items}) < 2:
                yield from self._built_after_optimizer(a, left, items)
                continue
            first = items[0][0]
            pids = [pid for _, pid in items]
            # past the events recorded per line, the later ones: parameters no optimizer owns,
            # numbered after the first recorded (pids follow the order tensors were first seen;
            # a forward building several layers per step interleaves lines past their events)
            start = min(pids)
            later = [pid for pid in left if pid > start and pid not in recorded
                     and a.params[pid].get("is_parameter")]
            pids += later
            for pid in pids:
                left.pop(pid, None)
            owner = first.get("owner") or "module"
            attrs = ", ".join(dict.fromkeys(event.get("attr") or "?" for event, _ in items))
            text = a.source.line_text(first.loc.path, first.loc.line).strip()
            if "#" in text and "'" not in text and '"' not in text:
                text = text.split("#")[0].rstrip()  # the statement, not its comment
            what = f"`{text}`" if text else "this line"
            yield self.finding(
                f"{what} builds new parameters ({owner}.{attrs}) every time it runs while the "
                f"model trains: {len(pids)} were created over the steps seen, each used by the "
                f"forward that made it with fresh initial values and owned by no optimizer, so "
                f"this part of the model is random at every step and never trains",
                first.loc,
                related=(related(construction, "the optimizer, built before they existed"),),
                fix=("create the parameter once, in the module's __init__, and use it in forward"
                     if "Parameter(" in text else
                     f"build the {owner} once, in the module's __init__ (self.<name> = "
                     f"nn.{owner}(...)), and use that attribute in forward"),
                fixes={},
                evidence={"params": [a.param_name(p) for p in pids[:8]], "count": len(pids),
                          "cause": "created-while-training", "owner": owner},
            )

    def _built_after_optimizer(self, a, left: dict, items):
        """A part built once, after every optimizer that could own it was constructed (a head
        made in Lightning's on_train_start, a layer attached after the optimizer): the
        optimizer's parameter list was read before it existed, whatever that list says."""
        first = items[0][0]
        inits = list(a.optimizers.values())
        if any(init.seq > first.seq for init in inits):
            return  # an optimizer built after it (a new stage's): the generic finding says it
        pids = [pid for _, pid in items if pid in left]
        if not pids:
            return
        for pid in pids:
            left.pop(pid, None)
        owner = first.get("owner") or "module"
        construction = inits[-1]
        built = (f"line {construction.loc.line}" if construction.loc is not None else "earlier")
        yield self.finding(
            f"this {owner} is built after the optimizer ({built}) read its parameter list: "
            f"{a.names(pids)} receive gradients but no optimizer owns them, so they never train",
            first.loc,
            related=(related(construction, "the optimizer, built before they existed"),
                     related(a.ledger.first_contribution[pids[0]], "the backward that gives them gradients")),
            fix=(f"build the {owner} before the optimizer (in the module's __init__), or add its "
                 f"parameters to the optimizer with optimizer.add_param_group(...)"),
            fixes={"lightning": (f"build the {owner} in __init__: Lightning calls "
                                 f"configure_optimizers before on_fit_start/on_train_start, so "
                                 f"self.parameters() there does not hold it yet")},
            evidence={"params": [a.param_name(p) for p in pids[:8]], "count": len(pids),
                      "cause": "built-after-optimizer", "owner": owner},
        )

    def _unregistered(self, a, event, pids, construction):
        owner, attr, holder = event.get("owner"), event.get("attr"), event.get("holder")
        shown = a.names(pids)
        if holder == "tensor":
            message = (f"{shown} is a plain tensor with requires_grad=True that {owner} keeps as "
                       f"self.{attr}, not an nn.Parameter: the module does not register it, so "
                       "model.parameters() leaves it out and no optimizer owns it; backward gives "
                       "it a gradient every update, yet it never trains")
            fix = (f"make it a parameter: self.{attr} = nn.Parameter(...) (the same initial value, "
                   "without requires_grad=True)")
            wrapper = "Parameter"
        else:
            modules = any(a.param_name(pid).rsplit("]", 1)[-1] for pid in pids)
            kind = "modules" if modules else "tensors"
            wrapper = ("ModuleDict" if holder == "dict" else "ModuleList") if modules else \
                ("ParameterDict" if holder == "dict" else "ParameterList")
            message = (f"{shown} receive gradients but no optimizer owns them: {owner} keeps the "
                       f"{kind} in a plain {holder} (self.{attr}), which nn.Module does not "
                       "register, so its parameters() leaves them out (and "
                       "model.to(), state_dict() and zero_grad() skip them too); they never train")
            fix = f"hold them in nn.{wrapper}: self.{attr} = nn.{wrapper}(...)"
        return self.finding(
            message, event.loc or construction.loc,
            related=(related(construction, "the optimizer, which does not own them"),
                     related(a.ledger.first_contribution[pids[0]], "the backward that gives them gradients")),
            fix=fix, fixes={},
            evidence={"params": [a.param_name(p) for p in pids], "count": len(pids),
                      "cause": f"plain-{holder}", "attribute": attr, "owner": owner,
                      "wrapper": wrapper},
        )

    def _dropped(self, a, new, pids):
        opt = new["opt"]
        olds = sorted({o for pid in pids for o in a.owners.get(pid, ()) if a.replaced.get(o) is new},
                      key=a.optimizer_name)
        old_names = " and ".join(a.optimizer_name(o) for o in olds) or "the earlier optimizer"
        name = a.optimizer_name(opt)
        return self.finding(
            f"{a.names(pids)} receive gradients but no optimizer that still steps owns them: "
            f"{old_names} updated them until {name} replaced it, built here over fewer "
            f"parameters; since then they never train"
            + (" (nor are their gradients cleared)" if not _cleared_after(a, pids, new.seq) else ""),
            new.loc,
            related=tuple(related(a.optimizers.get(o), f"{a.optimizer_name(o)}, which owned them")
                          for o in olds),
            fix=(f"build {name} over the same parameters as {old_names} (the list you gave it, "
                 "e.g. model and loss-module parameters), or freeze the ones meant to stay with "
                 "requires_grad_(False)"),
            fixes={},
            evidence={"params": [a.param_name(p) for p in pids], "count": len(pids),
                      "cause": "optimizer-replaced", "replaced": [a.optimizer_name(o) for o in olds],
                      "by": name},
        )


def _later_phase_optimizer(a, pids):
    """The construction of the optimizer that takes the first step after these parameters' first
    gradient, when it was built after every earlier step of the run and is not the run's first
    optimizer: the own optimizer of a later training phase (a head fine-tuned after
    pre-training, a student after its teacher), the one that should own them. Else None."""
    first = min(a.ledger.first_contribution[pid].seq for pid in pids)
    after = next((s for s in a.steps if s.seq > first), None)
    if after is None:
        return None
    built = a.optimizers.get(after["opt"])
    if built is None or built is next(iter(a.optimizers.values())):
        return None
    if any(s.seq > built.seq for s in a.steps if s.seq < first):
        return None  # steps of another optimizer after it was built: interleaved, not a phase
    return built


def _trained_after(a, pid: int, seq: int) -> bool:
    """A backward after ``seq`` wrote ``pid`` and an optimizer step followed it."""
    last = a.last_writer(pid, a.events[-1].seq + 1) if a.events else None
    return last is not None and last.seq > seq and a.next_step(last.seq) is not None


def _cleared_after(a, pids, seq: int) -> bool:
    wanted = set(pids)
    return any(e.seq > seq and wanted & set(e.get("params") or ()) for e in a.of_kind("clear"))


def _never_cleared_across_steps(a) -> set[int]:
    """Tracked tensors that are not parameters, whose gradients backwards wrote before and after
    an optimizer step and that nothing cleared in between: a learnable tensor left out of the
    optimizer (its gradient only accumulates). An input whose gradient the script reads and
    clears (saliency on a fixed batch) is not one."""
    held = {pid for e in a.of_kind("unregistered") for pid in e.get("pids") or ()}
    # a scalar or vector (a temperature, a scale, a bias), or one a module holds; a larger one
    # outside any module is as likely a fixed batch made with requires_grad=True (old
    # Variable-style code): its gradient is wasted work, not an update lost
    candidates = {pid for pid, e in a.params.items() if not e.get("is_parameter")
                  and (pid in held or (e.get("shape") is not None and len(e.get("shape")) <= 1))}
    if not candidates:
        return set()
    first_step: dict[int, int] = {}
    last_step: dict[int, int] = {}
    fresh_count: dict[int, int] = {}
    touched: set[int] = set()
    for e in a.of_kind("backward"):
        before = a.steps_before(e.seq)
        for pid in written(e):
            if pid in candidates:
                first_step.setdefault(pid, before)
                last_step[pid] = before
        for pid in e.get("fresh") or ():
            if pid in candidates:
                fresh_count[pid] = fresh_count.get(pid, 0) + 1
        touched.update(pid for pid in e.get("cleared_outside") or () if pid in candidates)
    for e in a.of_kind("clear"):
        touched.update(pid for pid in e.get("params") or () if pid in candidates)
    return {pid for pid in first_step
            if last_step[pid] > first_step[pid] and pid not in touched
            and fresh_count.get(pid, 0) <= 1}


def _inside_class(a, loc) -> bool:
    """Whether ``loc`` lies in a class body (an optimizer wrapper's ``__init__``)."""
    import ast
    tree = a.source.tree(loc.path)
    if tree is None:
        return False
    return any(isinstance(node, ast.ClassDef) and node.lineno <= loc.line <= (node.end_lineno or node.lineno)
               for node in walk(tree))


def _held_in_any(names, module: str) -> bool:
    return any(n.startswith(module + ".") for n in names)


def _held_in(name: str, modules) -> bool:
    return any(name.startswith(m + ".") for m in modules)


def _follower_copies(a) -> set[str]:
    """The names of copies of a trained model that follow it (a DQN/TD3 target network, an EMA):
    equal to the model at the first step, owned by no optimizer, and written during the run or
    by code of the script that runs after set-up (``target.load_state_dict(q.state_dict())``
    every N episodes, a soft update). Their parameters get gradients when the target they make
    is not detached, which changes nothing of the trained model's update (the copy is another
    tensor); they are synced from the model, not trained, so owning them is no optimizer's job.
    The model must itself get gradients: an optimizer built over the copy instead of the model
    (the model's gradients then owned by none, the copy's by an optimizer that never sees one)
    is the bug, and stays reported."""
    out = set()
    paths = {s.loc.path for s in a.steps if s.loc is not None}
    trained = {a.param_name(pid) for pid in a.ledger.first_contribution
               if any(pid in owned for owned in a.opt_params.values())}
    for event in a.by_kind.get("model_copy", ()):
        if not event["equal"] or not _held_in_any(trained, event["model"]):
            continue
        if event["written"]:
            out.add(event["copy"])
            continue
        # the copy's writer is looked for in the file its variable is made in, else where the
        # steps run (a copy held in a function's locals has no location of its own)
        path = event.loc.path if event.loc is not None else next(iter(sorted(paths)), None)
        leaf = event["copy"].split(".")[-1]
        said = a.source.copy_writers(path, leaf) if path is not None else None
        if said is not None and [w for w in said["writers"] if w not in said["setup"]]:
            out.add(event["copy"])
    return out

