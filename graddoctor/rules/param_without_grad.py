from __future__ import annotations

import ast
import re

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule, related
from ..analysis.source import walk

MIN_STEPS = 2  # fewer steps are not enough evidence that a parameter never gets a gradient


def _empty(param) -> bool:
    """A parameter with no elements: no gradient could change anything in it."""
    shape = None if param is None else param.get("shape")
    return shape is not None and 0 in shape


class ParamWithoutGrad(Rule):
    """
    ## What it does
    Finds parameters an optimizer owns (and that still require grad) that never receive a
    gradient over the whole replay: no backward reaches them and their `.grad` stays `None` at
    every step.
    A module that runs with gradients on while its output is simply not used — nothing around
    the call detaches it, and other parameters of the same model train — is reported as info
    when the user's code calls it (an encoder's pooler next to CLS-token pooling), and not at
    all when a library's code does (transformers' `BertModel` always runs its pooler).
    A module whose output enters a loss function (`mse_loss`, `cross_entropy`, `smooth_l1_loss`...)
    whose value never reaches a backward — a detection model's loss dict summed without the box
    loss, a multi-task loss added as `l_reg.item()` — is a warning at that loss's line: a head
    whose output feeds a loss is meant to train.
    A module whose output reaches a loss while that output does not depend on the idle
    parameters at all (its forward never uses them: a parameter defined in `__init__` and left
    out of `forward`, a parametrization that ignores its original) is a warning at the forward,
    saying so: no dropped loss is to blame.
    A run in which no backward ran at all (the loop never calls `loss.backward()`; a Lightning
    `training_step` that does not return its loss, so Lightning skips the backward; under
    Lightning's manual optimization, a `training_step` that steps its optimizer but never calls
    `self.manual_backward(loss)`) is an error at the forward, saying so; for a `training_step`
    that returns nothing, at the loss it computes (its last assignment to a name that says
    loss, else its last statement), with the forward it calls beside it.

    ## Why is this bad?
    Usually a layer defined in `__init__` but not used in `forward`, a module called under
    `torch.no_grad()` in the training loop, or an output that is detached from the loss. Those
    weights stay at their initial values. When the module that holds them ran during the replay,
    the finding points at the line that called it: under `torch.no_grad()` /
    `torch.inference_mode()` (remove it: the module is in the optimizer, meant to train; when
    the `with torch.no_grad():` or the `@torch.no_grad()` decorator sits in a function that calls
    the one calling the module, at that line),
    inside a reentrant `torch.utils.checkpoint` whose inputs do not require grad (a frozen
    embedding under LoRA with gradient checkpointing: the checkpoint call, with
    `use_reentrant=False` or an input that requires grad as the fix), or
    with gradients enabled but its output cut from the loss (`.detach()`, `.item()`, unused:
    at the `.detach()` when one was seen; of several, the one read by the owning optimizer's own
    update, as a GAN generator's step scoring `fake.detach()` after the discriminator's step
    rightly did); when it never ran, at the optimizer that owns it. If the layer is only
    used on some inputs (mixture-of-experts, rare branches), a short replay may miss it: then
    ignore this finding for that layer.
    A loss computed from the head's output and then dropped says the head was meant to train:
    that stays a warning, at the loss. An unused head is harmless: the rest of the model trains, and those weights only cost
    memory and optimizer state. It is a bug only if that output was meant to enter the loss,
    which the script alone cannot tell, hence info; a library model's head the script never
    asked for is not the script's to fix, hence nothing. A `.detach()` / `.data` near the call,
    or a model none of whose other parameters train (a detached encoder), stays a warning; so
    does a module run inside another module's `forward` whose caller takes that forward's
    output through `.data` or `.detach()` (a tagger gathering its character LSTM's features with
    `torch.cat((char, self.char_lstm(w).data), 0)`), pointed at that line.
    A module whose output is discarded inside a loop over a stack of blocks that drops what
    each pass hands on is a warning too, read from the loop's source: a sum over the blocks
    started at zero before the loop and returned after it, assigned the block's output instead
    of added to it (`forecast = f` for `forecast = forecast + f`: only the last block's forecast
    head trains), pointed at that assignment; a running value updated from the block's output
    and from itself that nothing else reads (`residual = residual - backcast` while each block
    is given the raw input: no backcast head trains), pointed at the block's call. A recurrent
    layer (RNN, LSTM, GRU or one of their cells) whose output and state are both discarded is a
    warning as well: a recurrence is never an optional head (a decoder step that computes the
    next state and keeps the old one), pointed at its call.

    ## Example
    ```python
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.extra = nn.Linear(8, 8), nn.Linear(8, 8)
        def forward(self, x):
            return self.body(x)          # self.extra is never used
    ```

    ## Use instead
    ```python
        def forward(self, x):
            return self.extra(torch.relu(self.body(x)))
    ```

    ## Stays silent on
    Layers below a custom `autograd.Function` whose backward returns its gradients out of
    forward's argument order (None where a gradient is needed): custom-backward-wrong names the
    `return` that drops them.
    A `.detach()` in the function that calls the model but after that function's own backward
    (`return loss.detach().cpu().item()` for logging) is not taken for the cut: it cuts only
    what was already backpropagated (an unused library pooler beside CLS pooling stays silent).
    An empty parameter (`nn.Parameter(torch.empty(0))`, kept only to read the model's device
    in `forward`): it holds no weight to train. A stack loop that adds each block's forecast
    to its sum and hands each block the running residual (the last backcast unread), or that
    keeps the last block's output from a start of `None` (info at most, as an unused head).
    The last bias of a net whose loss reads only its derivatives with respect to the inputs
    (`torch.autograd.grad(..., create_graph=True)`: a Hamiltonian net's energy, a PINN's
    solution): a constant offset no derivative sees.
    Frozen parameters (`requires_grad_(False)`, frozen before any gradient, a fixed table
    inside AdamW; a layer unfrozen only after the replay's last step, as gradual unfreezing does;
    an output detached only under a configuration flag, `if self.config.fix_emb: x = x.detach()`,
    as pytorch/examples' SNLI model keeps its pretrained word vectors fixed);
    a backbone run under `no_grad`; a layer or head used only on some
    iterations; a layer another instance of the same model trains (one net built with
    `batch_normalization=False` beside one built with it: the flag turns the layer off); activation checkpointing, reentrant (with its inputs made to require grad)
    or not; `backward(inputs=...)` over the head; CLS-token pooling whose pooler no loss
    uses; a model run for a forward hook's capture of a hidden layer, its result bound to `_`
    (`_ = self.net(x)`, BYOL's NetWrapper: the layers after the hooked one are idle on purpose;
    a bare `self.bn(x)` whose result is forgotten is still reported); a stop-gradient branch (SimSiam); a target network read under `no_grad`; weight
    tying; lazy layers; parametrized weights; the last block of a stack whose earlier blocks
    all train the same parameters, run in a loop that hands each block's output to the next pass
    (N-BEATS's backcast, subtracted from the residual that only a later block reads; EGNN's
    coordinate update, which only the next layer reads, a `.detach()` near the call
    notwithstanding: the earlier blocks run the same code and train); sparse embeddings under
    SparseAdam; an optimizer
    built over a copy of the model (an EMA copy, a target network) while the model's own
    tensors of the same names and shapes get the gradients (param-not-in-optimizer reports
    that, at the optimizer).
    """

    code = "GD106"
    slug = "param-without-grad"
    severity = Severity.WARNING
    summary = "an optimizer owns parameters that never receive a gradient"
    fix = "use the layer in forward(), remove it, or freeze it with requires_grad_(False)"

    def check(self, a):
        led = a.ledger
        params = a.params
        forwards = a.of_kind("idle_forward")
        on_copy = {pid for match in a.optimizers_on_copies.values() for pid in match["idle"]}
        # a custom autograd.Function whose backward returns its gradients out of forward's
        # order drops the gradient of every layer below it: custom-backward-wrong names the return
        misrouted = any(e.get("given_to") is not None for e in a.of_kind("custom_backward"))
        trained_by = _trained_by_each(a)
        for opt, init in a.optimizers.items():
            steps = [s for s in a.steps if s["opt"] == opt and not s.get("skipped")]
            if a.count(steps) < MIN_STEPS:
                continue
            had_grad = trained_by.get(opt, set())
            # a gradient before this optimizer was built (an earlier phase's) trains nothing it steps
            built = getattr(init, "seq", None)
            first = led.first_contribution
            idle = [pid for pid in dict.fromkeys(a.opt_params[opt])
                    if (pid not in first or (built is not None and first[pid].seq < built))
                    and pid not in had_grad
                    and pid not in a.replaced_pids  # param-replaced names the cause
                    and pid not in on_copy  # an optimizer over a copy: param-not-in-optimizer
                    and not _empty(params.get(pid))  # nothing in it to train
                    and (params.get(pid) is None or (params[pid].get("requires_grad", True)
                                                     and params[pid].get("stepped_requires_grad") is not False))]
            idle = _not_in_a_trained_twin(a, idle)
            idle = _not_trained_later(a, opt, idle, trained_by)
            idle = _not_a_member_picked_later(a, init, idle, had_grad)
            if not idle:
                continue
            cls = init.get("cls", "optimizer")
            # one finding per call line and cause (the layers of one Sequential share its line);
            # the parameters whose module was never seen running keep the optimizer's line
            by_cause: dict = {}  # (loc, cut) | None -> (the forward that explains them, [pid])
            # a Lightning run with no backward at all: one cause (training_step returns no
            # loss) for every layer, told once at training_step whatever forward ran them
            unreturned = (a.backward_calls == 0 and a.framework == "lightning"
                          and not _manual_steps(steps))
            for pid in idle:
                cause = _cause(pid, forwards)
                key = None if cause is None else (cause.loc, _with_grad(cause))
                if unreturned and cause is not None and _with_grad(cause):
                    key = "no_backward"
                by_cause.setdefault(key, (cause, []))[1].append(pid)
            trained = [pid for pid in a.opt_params[opt]
                       if pid in led.first_contribution or pid in had_grad]
            for cause, pids in by_cause.values():
                if misrouted and cause is not None and _with_grad(cause):
                    continue
                discarded = _discarded(a, cause, pids, trained)
                if discarded in ("library", "last-pass", "differentiated", "dropped"):
                    continue  # see the docs: a head the user does not use, a loop's last pass,
                    # a bias that only derivatives of the output read, a result bound to ``_``
                if not discarded and _frozen_by_switch(a, cause, pids):
                    continue  # see the docs: a configuration flag detaches it on purpose
                yield self._finding(a, cls, init, steps, opt, pids, cause, discarded=bool(discarded))

    def _finding(self, a, cls, init, steps, opt, pids, cause, discarded=False):
        n = a.count(steps)  # folded copies included
        evidence = {"params": [a.param_name(p) for p in pids], "steps": n,
                    "optimizer": opt}
        step_note = related(steps[0], "a step that finds them without gradient")
        head = (f"{a.names(pids)} are owned by this {cls} but got no gradient in "
                f"{n} steps")
        if cause is None:
            return self.finding(f"{head}: they never train", init.loc, related=(step_note,),
                                evidence=evidence)
        module = cause["cls"]
        head = (f"{a.names(pids)} (owned by the {cls} built at line {init.loc.line}) got no "
                f"gradient in {n} steps" if init.loc is not None else head)
        if a.backward_calls == 0 and _with_grad(cause):
            evidence["cause"] = "no_backward"
            lightning = a.framework == "lightning"
            manual = lightning and _manual_steps(steps)
            if manual:
                evidence["manual_optimization"] = True
            why = ("training_step steps the optimizer itself (manual optimization) but never "
                   "calls self.manual_backward(loss), and Lightning backpropagates nothing for "
                   "it (what training_step returns is not used)" if manual else
                   "training_step returns no loss, so Lightning skips the backward (it only warns "
                   "once) and steps the optimizer on nothing" if lightning else
                   "the loss computed here is never backpropagated")
            where, rel = cause.loc, (related(init, "the optimizer that owns them"), step_note)
            end = _training_step_end(a, (cause.loc, init.loc)) if lightning and not manual else None
            if end is not None and (cause.loc is None or end.line != cause.loc.line
                                    or end.path != cause.loc.path):
                # the `return loss` is missing in training_step, not in the forward it calls
                where, rel = end, (Related(cause.loc, "the forward whose loss is never returned"), *rel)
            return self.finding(
                f"{head}: no backward() ran in the whole run: {why}, so the model never trains",
                where, related=rel,
                evidence=evidence, severity=Severity.ERROR,
                fix=("call self.manual_backward(loss) in training_step after computing the loss "
                     "and before opt.step()" if manual else
                     "return the loss from training_step (`return loss`, or a dict with a "
                     "'loss' key)" if lightning else
                     "call loss.backward() after computing the loss and before optimizer.step()"))
        if not _with_grad(cause) and cause.get("checkpoint"):
            evidence["cause"] = "reentrant_checkpoint"
            by = cause.get("checkpoint")
            where = ("this torch.utils.checkpoint call" if by == "user" else
                     "the gradient checkpointing reached from this line")
            if by == "transformers":
                fix = ("make the checkpointed blocks' input require grad: call "
                       "model.enable_input_require_grads() before training (what PEFT does for "
                       "LoRA), or use the non-reentrant checkpoint: model.gradient_checkpointing_enable("
                       "gradient_checkpointing_kwargs={'use_reentrant': False})")
            elif by == "user":
                fix = ("pass use_reentrant=False to checkpoint(...), or make its input require grad "
                       "(x.requires_grad_(True) on the tensor handed to the checkpoint)")
            else:
                fix = ("use the non-reentrant checkpoint (use_reentrant=False), or make the "
                       "checkpointed block's input require grad")
            return self.finding(
                f"{head}: the {module} that holds them runs inside {where} in its reentrant form "
                f"(use_reentrant=True), whose inputs do not require grad (a frozen embedding or "
                f"frozen lower layers feed it): the reentrant checkpoint runs its block under "
                f"torch.no_grad() and returns an output with no graph, so no gradient reaches them",
                cause.loc, related=(related(init, "the optimizer that owns them"), step_note),
                evidence=evidence, fix=fix)
        if not _with_grad(cause):
            context = "torch.inference_mode()" if cause["inference"] else "torch.no_grad()"
            evidence["cause"] = "no_grad"
            block = _no_grad_block(a, cause)
            if block is not None:  # the line that turns gradients off: the one to change
                loc, text = block
                return self.finding(
                    f"{head}: the {module} that holds them runs (line {cause.loc.line}) under this "
                    f"`{text}`, so no gradient can reach them although the optimizer is meant to "
                    f"train them",
                    loc, related=(related(cause, f"the {module} runs here"),
                                  related(init, "the optimizer that owns them"), step_note),
                    evidence=evidence,
                    fix=(f"remove `{text}` from this function (keep it on the ones that only "
                         f"evaluate or log) so that the {module} trains" if text.startswith("@") else
                         f"compute the loss outside this block (keep {context} for what is only "
                         f"logged or evaluated) so that the {module} trains"))
            return self.finding(
                f"{head}: the {module} that holds them runs from this line under {context}, so no gradient can reach "
                f"them although the optimizer is meant to train them",
                cause.loc, related=(related(init, "the optimizer that owns them"), step_note),
                evidence=evidence,
                fix=f"call the module outside {context} so that it trains")
        evidence["cause"] = "cut"
        loss = _dropped_loss(a, cause, pids)
        if loss is not None and loss.get("unused"):
            evidence["cause"] = "unused-in-forward"
            return self.finding(
                f"{head}: the {module} that holds them runs (line {cause.loc.line}) and its output "
                f"enters this {loss.get('fn')}, but that output does not depend on them: the "
                f"{module}'s forward never uses them (a parameter defined and left out of forward, "
                f"or a parametrization that ignores its original), so no loss can train them",
                cause.loc, related=(related(loss, "the loss its output enters"),
                                    related(init, "the optimizer that owns them"), step_note),
                evidence=evidence,
                fix=(f"use them in the {module}'s forward if they were meant to train, or remove "
                     f"them (they only cost memory and optimizer state)"))
        if loss is not None:
            evidence["cause"] = "loss-dropped"
            evidence["loss"] = loss.get("fn")
            return self.finding(
                f"{head}: the {module} that holds them runs (line {cause.loc.line}) and its output "
                f"enters this {loss.get('fn')}, but that loss never reaches a backward: it is left "
                f"out of the loss that is backpropagated, or cut from it (.item(), .detach(), a "
                f"float()), so the {module} never trains",
                loss.loc, related=(related(cause, "the forward whose output enters the loss"),
                                   related(init, "the optimizer that owns them"), step_note),
                evidence=evidence,
                fix="add this loss (as a tensor, not .item()) into the loss you call backward() on",
                fixes={"lightning": "add this loss (as a tensor, not .item()) into the loss "
                                    "training_step returns (or passes to self.manual_backward)"})
        detaches = _detaches(a, cause, pids)
        if detaches:
            evidence["cause"] = "detached"
            chosen = _penalised_detach(a, detaches) or _detach_before_own_step(a, detaches, opt) \
                or detaches[0]
            others = [d for d in detaches if d is not chosen]
            also = (f" (also detached at line{'s' if len(others) > 1 else ''} "
                    f"{', '.join(str(d.loc.line) for d in others)})" if others else "")
            return self.finding(
                f"{head}: the {module} that holds them runs (line {cause.loc.line}) and its "
                f"output is used, but the loss receives it only through this .detach(){also}, "
                f"so no gradient reaches the {module} and it never trains",
                chosen.loc, related=(related(cause, f"the {module}'s forward"),
                                     related(init, "the optimizer that owns them"), step_note),
                evidence=evidence,
                fix=f"drop the .detach() from the term meant to train the {module} (keep it where "
                    f"the value is only a weight or a target)")
        wiring = _stack_loop_miswired(a, cause) if discarded else None
        if wiring is not None:
            how, line, name, value = wiring
            evidence["cause"] = "stack-" + how
            outer_path = str(cause.get("outer")[0][0])
            if how == "overwrite":
                message = (f"{head}: the {module} that holds them runs in a loop over a stack of "
                           f"blocks, and each pass replaces `{name}` with `{value}` instead of "
                           f"adding to it, so only the last pass reaches the loss and the earlier "
                           f"blocks' {module} never trains")
                fix = f"accumulate over the passes: `{name} = {name} + {value}`"
            else:
                message = (f"{head}: the {module} that holds them runs in a loop over a stack of "
                           f"blocks whose loop updates `{name}` from its output on every pass, "
                           f"but nothing reads `{name}` (no block is given it): the value each "
                           f"block passes on is dropped, so the {module} never trains and every "
                           f"block sees the same input")
                fix = (f"give each block the running `{name}` (`block({name})`), as the "
                       f"residual stack means to")
            return self.finding(
                message, Location(outer_path, line),
                related=(related(cause, f"the {module}'s forward"),
                         related(init, "the optimizer that owns them"), step_note),
                evidence=evidence, fix=fix)
        if discarded and module in _RECURRENT_LAYERS:
            # a recurrent layer is no optional head: its output is the sequence the model reads
            evidence["cause"] = "discarded"
            return self.finding(
                f"{head}: the {module} that holds them runs from this line, but its output and "
                f"state are discarded (never used by the loss, and nothing around the call "
                f"detaches it) while the rest of the model trains: the recurrence never reaches "
                f"the loss, so the {module} never trains and what follows reads none of it",
                cause.loc, related=(related(init, "the optimizer that owns them"), step_note),
                evidence=evidence,
                fix=f"use the {module}'s output (or its new state) where the model goes on: "
                    "`out, h = rnn(x, h)` and read `out`/`h` after it")
        if discarded:
            evidence["cause"] = "discarded"
            return self.finding(
                f"{head}: the {module} that holds them runs from this line, but its output is "
                f"discarded (never used by the loss, and nothing around the call detaches it) "
                f"while the rest of the model trains — harmless if that head is not meant to be "
                f"used (a pooler next to CLS-token pooling), a wiring bug if it is",
                cause.loc, related=(related(init, "the optimizer that owns them"), step_note),
                evidence=evidence, severity=Severity.INFO,
                fix="use its output in the loss if it should train; otherwise nothing to do (or "
                    "freeze it with requires_grad_(False), or leave it out of the optimizer)")
        cut = _outer_cut(a, cause)
        if cut is not None:
            evidence["cause"] = "cut-by-caller"
            loc, text = cut
            how = ".data" if ".data" in text else ".detach()"
            return self.finding(
                f"{head}: the {module} that holds them runs (line {cause.loc.line}) inside a "
                f"module's forward whose caller takes its output through `{text}`: {how} cuts "
                f"the graph there, so the loss receives the value but no gradient reaches the "
                f"{module}, and it never trains",
                loc, related=(related(cause, f"the {module}'s forward"),
                              related(init, "the optimizer that owns them"), step_note),
                evidence=evidence,
                fix=f"use the tensor itself instead of {how} so that the {module} trains (keep "
                    f"{how} only where the value must not train it)")
        return self.finding(
            f"{head}: the {module} that holds them runs from this line with gradients enabled, but its output never "
            f"reaches the loss (cut by .detach() or .item(), or not used)",
            cause.loc, related=(related(init, "the optimizer that owns them"), step_note),
            evidence=evidence,
            fix="remove the .detach() (or .item()) between this call and the loss, or use its "
                "output in the loss")


def _detaches(a, cause, pids) -> list:
    """The ``idle_detach`` events of the module behind ``cause``: the user's ``.detach()`` calls
    of a tensor carrying its output (a forward with gradients on), one per line."""
    if cause is None or not _with_grad(cause) or cause.get("checkpoint") or cause.loc is None:
        return []
    mine = set(pids)
    # the layers of one Sequential share a call line and one finding: the detach of any of
    # their outputs (the last layer's, a generator's samples) explains the group
    return [e for e in a.of_kind("idle_detach")
            if e.loc is not None and mine.intersection(e.get("params") or ())]


def _frozen_by_switch(a, cause, pids) -> bool:
    """Whether every ``.detach()`` that cuts the module's output sits in the body of an ``if``
    on a plain configuration flag (``if self.config.fix_emb:``, ``if freeze_encoder:``) whose
    body does nothing but detach: the script's author wrote both ways and chose, by that flag,
    to keep the module (a pretrained embedding) fixed. A test on ``self.training``, a
    comparison or a call is no such switch."""
    detaches = _detaches(a, cause, pids)
    return bool(detaches) and all(_flag_switched(a, d.loc.path, d.loc.line) for d in detaches)


def _flag_switched(a, path: str, line: int) -> bool:
    tree = a.source.tree(path)
    if tree is None:
        return False
    switches = [n for n in walk(tree) if isinstance(n, ast.If) and n.body
                and n.body[0].lineno <= line <= (n.body[-1].end_lineno or n.body[-1].lineno)]
    if not switches:
        return False
    switch = max(switches, key=lambda n: n.lineno)
    test = switch.test.operand if isinstance(switch.test, ast.UnaryOp) \
        and isinstance(switch.test.op, ast.Not) else switch.test
    node = test
    while isinstance(node, ast.Attribute):
        node = node.value
    if not isinstance(node, ast.Name):
        return False
    last = test.attr if isinstance(test, ast.Attribute) else test.id
    if last == "training":
        return False

    def detaching(value) -> bool:
        return (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                and value.func.attr in ("detach", "detach_") and not value.args) \
            or (isinstance(value, ast.Attribute) and value.attr == "data")

    for statement in switch.body:
        if isinstance(statement, ast.Assign) and detaching(statement.value):
            continue
        if isinstance(statement, ast.Expr) and detaching(statement.value):
            continue
        return False
    return True


def _detach_before_own_step(a, detaches, opt):
    """Among several detach lines, the one the owning optimizer's own update reads: the next
    step after it is that optimizer's (a GAN's generator step that scores `fake.detach()`, not
    the discriminator's step before it, where the detach is right)."""
    steps = sorted(a.steps, key=lambda e: e.seq)
    for event in detaches:
        following = next((s for s in steps if s.seq > event.seq), None)
        if following is not None and following.get("opt") == opt:
            return event
    return None


_PENALISED = re.compile(r"\.detach\(\)\s*(\.pow\(|\*\*|\.abs\(|\.square\(|\)\s*\*\*)"
                        r"|(mse_loss|l1_loss|smooth_l1_loss|huber_loss)\([^#]*\.detach\(\)")


def _penalised_detach(a, detaches):
    """Among several detach lines, the one whose detached value is itself penalised (squared,
    abs'd, given to a regression loss): the term meant to train the module; None otherwise."""
    for event in detaches:
        text = a.source.line_text(event.loc.path, event.loc.line).split("#")[0]
        if _PENALISED.search(text):
            return event
    return None


def _dropped_loss(a, cause, pids):
    """The first ``idle_loss`` event of the module behind ``cause`` (a forward with gradients
    on): a loss computed from its output that no backward reached; None when none was seen."""
    if cause is None or not _with_grad(cause) or cause.get("checkpoint") or cause.loc is None:
        return None
    mine = set(pids)
    return next((e for e in a.of_kind("idle_loss")
                 if e.loc is not None and e.get("mid") == cause.get("mid")
                 and mine.intersection(e.get("params") or ())), None)


def _discarded(a, cause, pids, trained) -> str | None:
    """Is ``cause`` (the forward of the idle parameters' module) a module that runs with
    gradients on while its output is simply not used, and the rest of the same model trains?
    "library" when a library's code made the call (BertModel running its pooler), "user" when
    the user's did; None when a cut is likely (a ``.detach()``/``.data`` around the call line, the
    source unreadable) or the model around it does not train either (a detached encoder)."""
    if cause is None or not _with_grad(cause) or cause.get("checkpoint") or cause.loc is None:
        return None
    if not _trains_beside(a, pids, trained):
        return None
    if _differentiated_away(a, pids, trained):
        return "differentiated"
    if _last_pass_of_a_stack(a, pids, trained):
        # the earlier blocks run the same code and their same parameters train: a .detach()
        # near the call (EGNN's radial.sqrt().detach() beside its coordinate MLP) cuts nothing
        # of theirs, so it is not what leaves the last block's idle
        return "last-pass"
    if a.source.cuts_gradient_near(cause.loc.path, cause.loc.line) is not False:
        return None
    if _outer_cut(a, cause) is not None:
        return None
    if cause.get("library"):
        return "library"
    if a.source.bound_to_underscore(cause.loc.path, cause.loc.line):
        return "dropped"  # ``_ = self.net(x)``: run for a forward hook's capture
    return "user"


_RECURRENT_LAYERS = frozenset({"RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"})
_INDEX = re.compile(r"\.(\d+)\.")


def _stack_loop_miswired(a, cause) -> tuple[str, int, str, str] | None:
    """A loop over a stack of blocks (the idle module's caller, ``backcast, f = block(res)``)
    that drops what each pass hands on: ``("overwrite", line, acc, value)`` when the loop
    assigns ``acc = value`` from the call's result while ``acc`` starts at zero before the loop
    and is read after it (a sum over the blocks overwritten: only the last pass counts);
    ``("dead", call_line, carried, "")`` when the loop updates ``carried`` from the call's result
    and from itself (``res = res - backcast``) but nothing else ever reads it (each block was
    meant to be given it). None for anything else."""
    outer = cause.get("outer") if cause is not None else None
    if not outer:
        return None
    path, line = str(outer[0][0]), int(outer[0][1])
    tree = a.source.tree(path)
    if tree is None:
        return None
    func = loop = None
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.lineno <= line <= (node.end_lineno or node.lineno):
            if func is None or node.lineno > func.lineno:
                func = node
    if func is None:
        return None
    for node in walk(func):
        if isinstance(node, ast.For) and node.lineno < line <= (node.end_lineno or node.lineno):
            if loop is None or node.lineno > loop.lineno:
                loop = node
    if loop is None:
        return None
    call_stmt = next((st for st in walk(loop) if isinstance(st, ast.Assign)
                      and st.lineno == line and isinstance(st.value, ast.Call)), None)
    if call_stmt is None:
        return None
    results = {n.id for t in call_stmt.targets for n in walk(t) if isinstance(n, ast.Name)}

    def loads(node):
        return {n.id for n in walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}

    end = loop.end_lineno or loop.lineno
    for st in walk(loop):
        if not isinstance(st, ast.Assign) or len(st.targets) != 1 \
                or not isinstance(st.targets[0], ast.Name) or st is call_stmt:
            continue
        name, read = st.targets[0].id, loads(st.value)
        if not read & results:
            continue
        if name not in read:
            before = any(isinstance(n, ast.Assign) and n.lineno < loop.lineno
                         and any(bound == name and _zero(value) for bound, value in _bindings(n))
                         for n in walk(func))
            after = any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                        and n.lineno > end for n in walk(func))
            if before and after and len(read & results) == 1:
                return "overwrite", st.lineno, name, next(iter(read & results))
        else:
            others = [n for n in walk(func) if isinstance(n, ast.Name) and n.id == name
                      and isinstance(n.ctx, ast.Load)
                      and not (st.lineno <= n.lineno <= (st.end_lineno or st.lineno))]
            if not others:
                return "dead", line, name, ""
    return None


def _bindings(assign: ast.Assign):
    """``(name, value)`` of an assignment's plain names, tuples unpacked element by element."""
    for target in assign.targets:
        if isinstance(target, ast.Name):
            yield target.id, assign.value
        elif isinstance(target, ast.Tuple) and isinstance(assign.value, ast.Tuple) \
                and len(target.elts) == len(assign.value.elts):
            for t, v in zip(target.elts, assign.value.elts):
                if isinstance(t, ast.Name):
                    yield t.id, v


def _zero(node) -> bool:
    """An accumulator's start: ``0``, ``0.0``, ``torch.zeros(...)``, ``x.new_zeros(...)``,
    ``torch.zeros_like(...)``."""
    if isinstance(node, ast.Constant):
        return node.value == 0 and not isinstance(node.value, bool)
    if isinstance(node, ast.Call):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        return name in ("zeros", "zeros_like", "new_zeros")
    return False


def _differentiated_away(a, pids, trained) -> bool:
    """Are the idle parameters all biases of layers whose weights train, in a run whose loss
    is made of derivatives taken with ``torch.autograd.grad(..., create_graph=True)``? A
    Hamiltonian net's energy or a PINN's solution enters the loss only through its derivatives
    with respect to the inputs, which drop the last layer's constant offset: that bias gets no
    gradient by construction, and nothing is wired wrong."""
    if not any(e.get("create_graph") for e in a.of_kind("functional_grad")):
        return False
    trained_names = {(a.param_name(p) or "").split(" ")[0] for p in trained}
    for pid in pids:
        name = (a.param_name(pid) or "").split(" ")[0]
        if not name.endswith("bias") or name[:-4] + "weight" not in trained_names:
            return False
    return bool(pids)


def _last_pass_of_a_stack(a, pids, trained) -> bool:
    """Are the idle parameters all in the last block of a stack (``blocks.3.proj.weight``) whose
    every earlier block trains the same parameter (``blocks.0.proj.weight`` .. ``blocks.2...``)?
    A loop that hands each block's output to the next pass (N-BEATS's backcast subtracted from
    the residual) reads that output on every pass but the last, after which the loop ends: the
    script uses it, only the final value has no reader. A block whose output no pass uses, or
    the blocks before the last idle (each pass overwriting the one before), are not this."""
    trained_names = {a.param_name(p) for p in trained}
    every = {a.param_name(p) for p in a.params}
    for pid in pids:
        name = a.param_name(pid)
        if not any(_last_sibling(name, m, trained_names, every) for m in _INDEX.finditer(name)):
            return False
    return bool(pids)


def _last_sibling(name: str, m, trained_names: set, every: set) -> bool:
    n = int(m.group(1))
    at = lambda i: f"{name[:m.start()]}.{i}.{name[m.end():]}"
    return (n >= 1 and at(n + 1) not in every
            and all(at(i) in trained_names for i in range(n)))


def _trains_beside(a, pids, trained) -> bool:
    """Does a trained parameter belong to the same top-level object as the idle ones (its name
    starts the same: ``model.encoder.layer.0...`` beside ``model.encoder.pooler...``) without
    being inside their own module?"""
    owners = {a.param_name(p).rsplit(".", 1)[0] for p in pids}
    roots = {o.split(".", 1)[0] for o in owners}
    for pid in trained:
        name = a.param_name(pid)
        if name.split(".", 1)[0] in roots and not any(name.startswith(o + ".") for o in owners):
            return True
    return False


def _outer_cut(a, cause) -> tuple[Location, str] | None:
    """When the idle module runs inside another module's ``forward``: the ``.data`` or
    ``.detach()`` that follows that forward's call in its caller's function (``char =
    torch.cat((char, self.char_lstm(w).data), 0)`` in a tagger's forward), the line that cuts
    the output from the loss; None otherwise (a cut at module level or in the training loop's
    function is not looked for here)."""
    if cause.loc is None or a.source.enclosing_function(cause.loc.path, cause.loc.line) != "forward":
        return None
    outer = cause.get("outer") or ()
    if not outer:
        return None
    path, line = outer[0]
    caller = a.source.enclosing_function(path, line)
    if caller is None:
        return None
    found = a.source.cut_after(path, line)
    if found is None:
        return None
    # a cut after a backward that ran in the same function cuts what was already
    # backpropagated (`return loss.detach().cpu().numpy()` for logging): not what kept the
    # gradient from the module
    for b in a.of_kind("backward"):
        if (b.loc is not None and b.loc.path == path and line < b.loc.line < found[0]
                and a.source.enclosing_function(path, b.loc.line) == caller):
            return None
    return Location(path, found[0]), found[1]


def _no_grad_block(a, cause) -> tuple[Location, str] | None:
    """The script's ``with torch.no_grad():`` (or decorator) around the call of the function
    that calls the module (``outer``, innermost first): the line to change lies in a caller.
    One in the module call's own function is not looked for: that call is the line to move."""
    if cause.loc is not None and a.source.no_grad_block(cause.loc.path, cause.loc.line) is not None:
        return None
    for path, line in cause.get("outer") or ():
        found = a.source.no_grad_block(path, line)
        if found is not None:
            return Location(path, found[0]), found[1]
    return None


def _cause(pid, forwards):
    """The recorded forward of ``pid``'s module that best explains why it got no gradient: one
    in training mode with gradients on (its output was cut from the loss), else one in training
    mode under no_grad/inference_mode, else the same in eval mode; None when its module was
    never seen running (unused, or the replay ended before it was watched)."""
    best, rank = None, 0
    for event in forwards:
        if pid not in event["params"]:
            continue
        r = (2 if event["training"] else 0) + (2 if _with_grad(event) else 1)
        if r > rank:
            best, rank = event, r
    return best


def _with_grad(event) -> bool:
    return bool(event["grad"]) and not event["inference"]


def _manual_steps(steps) -> bool:
    """Lightning's manual optimization: a step called from the user's own ``training_step``
    (automatic optimization's steps are Lightning's, attributed to a hook such as
    ``configure_optimizers``)."""
    return any(e.loc is not None and e.loc.function == "training_step" and not e.loc.hook
               for e in steps)


def _not_in_a_trained_twin(a, idle: list[int]) -> list[int]:
    """The idle parameters less those whose name a trained parameter of another instance
    shares (``net.bn_input.weight`` of the two nets of a with/without-BatchNorm comparison, each
    trained by its own optimizer): the class runs that layer depending on how the instance was
    built (``if self.do_bn: x = self.bn_input(x)``), so the idle copy is configured off, not
    forgotten in forward."""
    led = a.ledger
    trained = {a.params[pid].get("name") for pid in led.first_contribution
               if pid in a.params and pid not in idle}
    trained.discard(None)
    return [pid for pid in idle if (a.params.get(pid) or {}).get("name") not in trained]



def _training_step_end(a, locs):
    """Where a LightningModule's ``training_step`` computes the loss it never returns: its last
    assignment to a name that says loss (``loss = F.cross_entropy(...)``), else its last
    statement (the ``return`` is missing after it). Looked up in the files of ``locs``; None
    when no file holds exactly one ``training_step`` or it returns a value (a loss skipped on
    purpose, ``if not torch.isfinite(loss): return None``, is not a missing return)."""
    for loc in locs:
        tree = a.source.tree(loc.path) if loc is not None else None
        if tree is None:
            continue
        defs = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                and n.name == "training_step"]
        if len(defs) != 1:
            continue
        body = defs[0].body
        returns = [n for n in walk(defs[0]) if isinstance(n, ast.Return)]
        if any(r.value is not None and not (isinstance(r.value, ast.Constant) and r.value.value is None)
               for r in returns):
            return None  # it returns something: not a missing return
        losses = [n.lineno for n in walk(defs[0]) if isinstance(n, (ast.Assign, ast.AnnAssign))
                  and any(isinstance(t, ast.Name) and "loss" in t.id.lower()
                          for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
        return Location(loc.path, max(losses) if losses else body[-1].lineno)
    return None
def _trained_by_each(a) -> dict:
    """Each optimizer's parameters that had a gradient at one of its own (not skipped) steps."""
    out: dict = {}
    for s in a.steps:
        if s.get("skipped"):
            continue
        opt = s["opt"]
        out.setdefault(opt, set()).update(set(a.opt_params.get(opt, ())) - set(s.get("without_grad", ())))
    return out


def _not_trained_later(a, opt, idle: list[int], trained_by: dict) -> list[int]:
    """The idle parameters less those an optimizer built after this one trains: a task's own
    head in continual learning (a multi-head net whose optimizer, rebuilt per task over the
    whole model, owns the heads of the tasks still to come), or a stage of a staged schedule.
    The script does use them, later; a parameter idle under every optimizer stays reported."""
    built = getattr(a.optimizers.get(opt), "seq", None)
    if built is None or not idle:
        return idle
    later: set = set()
    for other, init in a.optimizers.items():
        seq = getattr(init, "seq", None)
        if other != opt and seq is not None and seq > built:
            later |= trained_by.get(other, set())
    return [pid for pid in idle if pid not in later]


def _not_a_member_picked_later(a, init, idle: list[int], had_grad: set) -> list[int]:
    """The idle parameters less the members of a container the script indexes with a run-time
    value (``self.heads[task_id]``, a ``ModuleDict``'s ``self.heads[task]``) whose module never ran, in a replay graddoctor ended at its
    step budget, while another member of the same container trains (``heads.0`` beside an idle
    ``heads.1``): a task-incremental net's head for a task still to come, which the script's
    later phase picks after the replay stopped. Heads indexed only by constants, a member that
    ran and got no gradient, and a replay that ran to the script's end stay reported."""
    end = a.of_kind("run_end")
    if not idle or not end or end[-1].get("status") != "step-limit" or init.loc is None:
        return idle
    picked = a.source.indexed_by_variable(init.loc.path)
    if not picked:
        return idle
    ran = {pid for e in a.of_kind("idle_forward") for pid in e["params"]}
    # each trained name with one part left out, for every part after a picked container:
    # ``model.heads.0.weight`` -> (("model", "heads"), ("weight",))
    siblings = set()
    for p in had_grad | set(a.ledger.first_contribution):
        parts = (a.param_name(p) or "").split(".")
        for i in range(1, len(parts)):
            if parts[i - 1] in picked:
                siblings.add((tuple(parts[:i]), parts[i], tuple(parts[i + 1:])))
    keep = []
    for pid in idle:
        parts = (a.param_name(pid) or "").split(".")
        member = pid not in ran and any(
            parts[i - 1] in picked and any(
                head == tuple(parts[:i]) and key != parts[i] and tail == tuple(parts[i + 1:])
                for head, key, tail in siblings)
            for i in range(1, len(parts)))
        if not member:
            keep.append(pid)
    return keep
