"""A step's and a clip's gradients are read once, and what graddoctor knows stays true.

The optimizer's post hook takes the grads' states from what its pre hook read when the step
left every ``.grad`` as it got it; a clip's after-state is the grad tensors it read before, at
their new versions. Whatever the step or the clip did, graddoctor's record of each ``.grad``
(``GradState.known``: the grad tensor's id and version) must then be the grad as it is, and the
parameters without a gradient must be those that have none after the step: an optimizer that
edits a grad in place or drops it falls back to reading the grads again.
"""

import torch
from torch import nn

from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument import gradstate, optim


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def _state(param):
    grad = param.grad
    return None if grad is None else (id(grad), grad._version)


def _known(rec, model):
    """(what graddoctor knows, what is) of each parameter's grad."""
    pairs = []
    for p in model.parameters():
        pid = rec.pid(p)
        pairs.append((rec.grads.known.get(pid) if p.grad is not None else None, _state(p)))
    return [k for k, _ in pairs], [s for _, s in pairs]


class HalvesGrads(torch.optim.SGD):
    """A user's optimizer whose step edits every grad in place (a version the pre hook did
    not see)."""

    def step(self, closure=None):
        result = super().step(closure)
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(0.5)
        return result


class DropsGrads(torch.optim.SGD):
    """A user's optimizer that frees the grads as it steps (``p.grad = None``)."""

    def step(self, closure=None):
        result = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None
        return result


def _run(make_optimizer, clip: bool = False, steps: int = 3):
    rec = Recorder(step_budget=None)
    seen = []
    with Instrumentation(rec):
        model = _model()
        opt = make_optimizer(model.parameters())
        x = torch.randn(5, 3)
        for _ in range(steps):
            model(x).pow(2).sum().backward()  # no zero_grad: grads accumulate
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
                seen.append(("clip",) + tuple(_known(rec, model)))
            opt.step()
            seen.append(("step",) + tuple(_known(rec, model)))
    return rec, model, seen


def _after_step_modes(monkeypatch):
    """Records, per call of ``GradState.after_step``, whether it took its read-once path."""
    modes = []
    original = gradstate.GradState.after_step

    def spy(self, pids, read=None, keeps_grads=False, **kwargs):
        modes.append(read is not None and read.states is not None)
        return original(self, pids, read, keeps_grads, **kwargs)

    monkeypatch.setattr(gradstate.GradState, "after_step", spy)
    return modes


def test_torch_optimizer_steps_take_the_pre_hooks_read(monkeypatch):
    modes = _after_step_modes(monkeypatch)
    rec, model, seen = _run(lambda params: torch.optim.AdamW(params, lr=1e-3), clip=True)
    assert modes == [True, True, True]
    for _, known, actual in seen:
        assert known == actual and None not in actual


def test_an_optimizer_that_edits_grads_in_place_is_read_again():
    rec, model, seen = _run(lambda params: HalvesGrads(params, lr=0.1))
    for _, known, actual in seen:
        assert known == actual  # the halved grads' new versions, not the ones before the step
    # the next backward adds onto the grads graddoctor saw last: an accumulation, every time
    backwards = [e for e in rec.trace.events if e.kind == "backward"]
    assert [len(e["accumulated"]) for e in backwards] == [0, 4, 4]


def test_torch_steps_are_trusted_to_keep_grads_only_when_their_first_ones_did():
    """A torch step that changes .grad in place (SGD's foreach nesterov adds the momentum into
    it) is compared after every step; one that does not is trusted after its first few steps
    and no longer compared: either way what graddoctor knows after each step is the grads'."""
    optimizers = [
        lambda ps: torch.optim.AdamW(ps, lr=1e-3),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, foreach=True),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, foreach=False),
        lambda ps: torch.optim.Adagrad(ps, lr=0.1, weight_decay=0.1, foreach=True),
    ]
    for make in optimizers:
        rec, model, seen = _run(make, steps=3 * optim.TRUSTED_AFTER)
        for _, known, actual in seen:
            assert known == actual


def test_an_optimizer_that_drops_grads_leaves_them_without_one():
    rec, model, seen = _run(lambda params: DropsGrads(params, lr=0.1))
    steps = [e for e in rec.trace.events if e.kind == "step"]
    pids = [rec.pid(p) for p in model.parameters()]
    assert [sorted(e["without_grad"]) for e in steps] == [sorted(pids)] * 3
    backwards = [e for e in rec.trace.events if e.kind == "backward"]
    assert [len(e["fresh"]) for e in backwards] == [4, 4, 4]


def test_a_clip_records_the_grads_it_changed_and_an_edit_before_it():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(5, 3)
        for i in range(3):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            if i == 1:
                model[0].bias.grad.div_(4)  # by hand, before the clip: an edit the clip reports
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            known, actual = _known(rec, model)
            assert known == actual
            opt.step()
    clips = [e for e in rec.trace.events if e.kind == "clip"]
    assert [e["edited"] for e in clips] == [[], [rec.pid(model[0].bias)], []]
    # the edit was reported at the clip, not again at the step
    assert not [e for e in rec.trace.events if e.kind == "grad_edit"]


class FailsToStep(torch.optim.SGD):
    """A step that raises after torch's pre hooks ran (an out-of-memory error, say)."""

    def step(self, closure=None):
        raise RuntimeError("out of memory")


def test_a_step_that_raised_holds_no_gradient_past_the_next_zero_grad():
    import gc
    import weakref

    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = _model()
        opt = FailsToStep(model.parameters(), lr=0.1)
        model(torch.randn(5, 3)).pow(2).sum().backward()
        grads = [weakref.ref(p.grad) for p in model.parameters()]
        try:
            opt.step()  # the recovery loop of a script: catch, clear, go on with less
        except RuntimeError:
            opt.zero_grad(set_to_none=True)
        gc.collect()
        assert [g() for g in grads] == [None] * len(grads)


def _step_in_helper(opt):
    opt.step()  # the step's line: both of its events are located here


def test_a_step_event_is_located_where_its_step_begin_is():
    """The post hook takes the location its pre hook found for the same step wrapper frame:
    each ``step`` event sits at its ``step_begin``'s line, whether the step is called in the
    loop, in a helper, through a scheduler's wrapper, or after a step that raised (its pre hook
    ran, its post hook never did)."""
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        failing = FailsToStep(model.parameters(), lr=0.1)
        x = torch.randn(5, 3)
        model(x).pow(2).sum().backward()
        opt.step()
        model(x).pow(2).sum().backward()
        _step_in_helper(opt)
        try:
            failing.step()
        except RuntimeError:
            pass
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1)  # wraps opt.step
        model(x).pow(2).sum().backward()
        opt.step()
        scheduler.step()
    events = [e for e in rec.trace.events if e.kind in ("step_begin", "step") and e["opt"] == 0]
    assert [e.kind for e in events] == ["step_begin", "step"] * 3
    lines = [e.loc.line for e in events]
    assert lines[0::2] == lines[1::2]  # each step where its begin is
    assert len(set(lines[0::2])) == 3  # three different call lines


def _configurations():
    """torch's optimizers over the switches that change which ops their steps run."""
    both = [{"weight_decay": wd, "maximize": mx} for wd in (0, 0.1) for mx in (False, True)]
    yield from (("SGD", dict(lr=0.1, momentum=m, nesterov=n, weight_decay=wd, maximize=mx))
                for m in (0, 0.9) for n in (False, True) for wd in (0, 0.1) for mx in (False, True)
                if m or not n)
    for name in ("Adam", "AdamW"):
        yield from ((name, dict(lr=1e-3, amsgrad=a, **b)) for a in (False, True) for b in both)
    for name in ("Adagrad", "Adadelta", "Adamax", "ASGD"):
        yield from ((name, b) for b in both)
    for name in ("NAdam", "RAdam"):
        yield from ((name, dict(decoupled_weight_decay=d, **b)) for d in (False, True) for b in both)
    yield from (("RMSprop", dict(lr=0.01, momentum=m, centered=c, **b))
                for m in (0, 0.9) for c in (False, True) for b in both)
    yield from (("Rprop", {"maximize": mx}) for mx in (False, True))


def test_no_torch_optimizer_starts_changing_grads_after_its_first_steps():
    """What trusting a torch step rests on: each of torch's optimizers, in each configuration
    and implementation (single tensor, foreach, fused where the CPU has one), either changes a
    ``.grad`` in place from its first step on or never. A torch release that breaks this fails
    here."""
    late, changers = [], []
    for name, config in _configurations():
        for impl in ({"foreach": False}, {"foreach": True}, {"fused": True}):
            torch.manual_seed(0)
            model = nn.Linear(4, 3)
            try:
                opt = getattr(torch.optim, name)(model.parameters(), **impl, **config)
            except (TypeError, RuntimeError, ValueError):
                continue  # no such implementation of it here
            changed = []
            for _ in range(optim.TRUSTED_AFTER + 3):
                model(torch.randn(5, 4)).pow(2).mean().backward()
                before = [p.grad._version for p in model.parameters()]
                opt.step()
                changed.append([p.grad._version for p in model.parameters()] != before)
            if any(changed):
                changers.append((name, impl))
                if not changed[0]:
                    late.append((name, config, impl, changed))
    assert late == []
    assert ("SGD", {"foreach": True}) in changers  # the scan sees a step that changes grads


def test_every_torch_optimizer_bumps_each_stepped_parameter_alike_at_every_step():
    """What predicting a step's versions rests on (``GradState._versions_after``): each of
    torch's optimizers, in each configuration and implementation, bumps the version of every
    parameter it updates by the same count at every step, and of a parameter without a grad by
    none. A torch release that breaks this fails here."""
    broken = []
    for name, config in _configurations():
        for impl in ({"foreach": False}, {"foreach": True}, {"fused": True}):
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
            try:
                opt = getattr(torch.optim, name)(model.parameters(), **impl, **config)
            except (TypeError, RuntimeError, ValueError):
                continue
            bumps = set()
            for i in range(gradstate.BUMP_TRUSTED_AFTER + 4):
                model(torch.randn(5, 4)).pow(2).mean().backward()
                if i % 3 == 2:
                    model[0].bias.grad = None  # a parameter without a grad this step
                before = [p._version for p in model.parameters()]
                opt.step()
                for p, v in zip(model.parameters(), before):
                    bumps.add((p.grad is not None, p._version - v))
                opt.zero_grad()
            with_grad = {b for has, b in bumps if has}
            if len(with_grad) != 1 or {b for has, b in bumps if not has} - {0}:
                broken.append((name, config, impl, sorted(bumps)))
    assert broken == []


def _hand_edits(make_optimizer, edit_at: set, steps: int = 10, hook=None):
    """The edited_params of each step_begin of a loop that edits the first layer's weight in
    place (an EMA-like write) before the steps ``edit_at``; and whether the ledger's versions
    are the parameters' at the end."""
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = _model()
        opt = make_optimizer(model.parameters())
        if hook is not None:
            opt.register_step_post_hook(hook)
        x = torch.randn(5, 3)
        for i in range(steps):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            if i in edit_at:
                with torch.no_grad():
                    model[0].weight.mul_(0.5)
            opt.step()
        pids = [rec.pid(p) for p in model.parameters()]
        ledger = [rec.grads.param_version.get(pid) for pid in pids]
        actual = [p._version for p in model.parameters()]
    begins = [e for e in rec.trace.events if e.kind == "step_begin"]
    return [e["edited_params"] for e in begins], ledger == actual, pids


def test_a_hand_edit_between_predicted_steps_is_seen():
    for make in (lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                 lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True)):
        edits, ledger_true, pids = _hand_edits(make, {2, 7, 8})
        assert ledger_true
        assert [i for i, e in enumerate(edits) if e] == [2, 7, 8]
        assert all(e == [pids[0]] for e in edits if e)


def test_a_step_hook_that_edits_parameters_now_and_then_is_not_predicted():
    """A post hook of the optimizer's own may change parameters only on some steps: the
    versions after such steps are read, never predicted (no hand edit is made up)."""
    calls = [0]

    def sometimes(opt, args, kwargs):
        calls[0] += 1
        if calls[0] in (5, 6, 9):
            with torch.no_grad():
                for p in opt.param_groups[0]["params"]:
                    p.clamp_(-10, 10)

    edits, ledger_true, _ = _hand_edits(lambda ps: torch.optim.AdamW(ps, lr=1e-3), set(),
                                        hook=sometimes)
    assert ledger_true and not any(edits)
