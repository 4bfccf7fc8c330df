"""param-not-in-optimizer (GD105) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor.rules.engine import analyze
from graddoctor.trace import TraceBuilder


def test_no_optimizer_is_a_note_not_a_finding():
    # a hand-written update (d2l's sgd, word_language_model's p.data.add_) is correct code: what
    # graddoctor cannot judge there is said in the run's notes
    from graddoctor.analysis import Analysis
    from graddoctor.rules.notes import run_notes
    t = TraceBuilder()
    for _ in range(3):
        t.backward(fresh=[0], line=6)
    findings, _ = analyze(t.trace)
    assert findings == []
    assert any(n.startswith("no torch.optim optimizer was seen") for n in run_notes(Analysis(t.trace)))
    t = TraceBuilder()
    t.optimizer(0, [0], line=2)
    t.backward(fresh=[0], line=6)
    t.step(0, line=7)
    assert not any("no torch.optim" in n for n in run_notes(Analysis(t.trace)))


from graddoctor import events as ev  # noqa: E402
from rule_traces import findings  # noqa: E402

SLUG = "param-not-in-optimizer"


def _loop(t, n=3, extra=(), moved_at=None, opt_line=2):
    """An optimizer over params 0 and 1; backward also writes ``extra``, which nothing owns."""
    t.optimizer(0, [0, 1], line=opt_line)
    for i in range(n):
        t.clear([0, 1], line=5)
        t.backward(fresh=[0, 1, *extra], line=6)
        t.put(ev.step_begin(opt=0, norm_pids=None, norms=None,
                            moved=list(extra) if i == moved_at else None), 7)
        t.step(0, line=7)


def test_unowned_parameters_are_a_warning_at_the_optimizer():
    t = TraceBuilder()
    _loop(t, extra=[2])
    f, = findings(t, SLUG)
    assert f.severity.value == "warning" and f.location.line == 2
    assert "it never trains" in f.message  # one parameter


def test_parameters_whose_values_move_between_steps_train_by_a_copy():
    # fp16 master weights: the model's parameters get gradients no optimizer owns, and their
    # values change every update (copied back from the fp32 master the optimizer steps)
    t = TraceBuilder()
    _loop(t, extra=[2, 3], moved_at=1)
    assert findings(t, SLUG) == []


def test_a_plain_list_is_named_and_located_at_its_assignment_with_the_module_list_fix():
    t = TraceBuilder()
    t.param(2, "model.blocks[0].weight")
    t.param(3, "model.blocks[0].bias")
    _loop(t, extra=[2, 3])
    t.put(ev.unregistered(owner="Net", attr="blocks", holder="list", name="model.blocks",
                          pids=[2, 3]), 40)
    f, = findings(t, SLUG)
    assert f.location.line == 40
    assert "model.blocks[0].weight" in f.message and "plain list (self.blocks)" in f.message
    assert "nn.ModuleList" in f.fix and "model.parameters()" not in f.fix
    assert f.evidence["cause"] == "plain-list"


def test_a_plain_dict_gets_module_dict_and_a_plain_tensor_gets_parameter():
    t = TraceBuilder()
    t.param(2, "model.heads['a'].weight")
    t.param(3, "model.temperature", is_parameter=False)
    t.optimizer(0, [0, 1], line=2)
    for i in range(3):  # the tensor's gradient only accumulates: nothing clears it
        t.clear([0, 1], line=5)
        t.backward(fresh=[0, 1, 2] if i else [0, 1, 2, 3], accumulated=[3] if i else [], line=6)
        t.step(0, line=7)
    t.put(ev.unregistered(owner="Net", attr="heads", holder="dict", name="model.heads",
                          pids=[2]), 40)
    t.put(ev.unregistered(owner="Net", attr="temperature", holder="tensor",
                          name="model.temperature", pids=[3]), 41)
    by_line = {f.location.line: f for f in findings(t, SLUG)}
    assert "nn.ModuleDict" in by_line[40].fix
    assert "nn.Parameter" in by_line[41].fix and "not an nn.Parameter" in by_line[41].message


def test_a_persistent_tensor_never_cleared_is_reported_but_inputs_are_not():
    t = TraceBuilder()
    t.param(2, "temperature", is_parameter=False)
    t.param(3, "x", is_parameter=False)
    t.optimizer(0, [0, 1], line=2)
    for i in range(3):
        t.clear([0, 1], line=5)
        # the temperature's gradient accumulates; the input's is fresh each time (set to None)
        t.backward(fresh=[0, 1, 3] if i else [0, 1, 2, 3], accumulated=[2] if i else [],
                   line=6, extra_leaves=2)
        t.step(0, line=7)
    f, = findings(t, SLUG)
    assert f.evidence["params"] == ["temperature"] and "not nn.Parameter" in f.message


def test_an_input_gradient_within_one_update_is_not_a_learnable_tensor():
    t = TraceBuilder()
    t.param(2, "x", is_parameter=False)
    t.optimizer(0, [0, 1], line=2)
    t.clear([0, 1], line=5)
    t.backward(fresh=[2], line=6, extra_leaves=1)  # FGSM on a fixed batch, once
    t.backward(fresh=[0, 1], line=8, extra_leaves=1)
    t.step(0, line=9)
    assert findings(t, SLUG) == []


def _switch(t, dropped_grads_after=True, same=False):
    t.optimizer(0, [0, 1, 2], line=3, cls="SGD")
    for _ in range(3):
        t.clear([0, 1, 2], opt=0, line=5)
        t.backward(fresh=[0, 1, 2], line=6)
        t.step(0, line=7)
    t.optimizer(1, [0, 1, 2] if same else [0, 1], line=10, cls="ASGD")
    for _ in range(3):
        t.clear([0, 1], opt=1, line=5)
        t.backward(fresh=[0, 1], accumulated=[2] if dropped_grads_after else [], line=6)
        t.step(1, line=7)


def test_an_optimizer_rebuilt_over_fewer_parameters_is_reported_at_the_new_one():
    t = TraceBuilder()
    _switch(t)
    f, = findings(t, SLUG)
    assert f.location.line == 10 and f.evidence["cause"] == "optimizer-replaced"
    assert "SGD updated them until ASGD replaced it" in f.message
    assert "nor are their gradients cleared" in f.message


def test_an_optimizer_rebuilt_over_the_same_parameters_is_silent():
    t = TraceBuilder()
    _switch(t, same=True)
    assert findings(t, SLUG) == []


def test_a_parameter_the_new_optimizer_leaves_without_gradients_is_silent():
    # the dropped part is also no longer used by the loss: nothing is lost
    t = TraceBuilder()
    _switch(t, dropped_grads_after=False)
    assert findings(t, SLUG) == []


def test_a_gan_whose_generator_steps_less_often_is_not_a_replacement():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=3)  # G
    t.optimizer(1, [2, 3], line=4)  # D, built after G but before any step
    for _ in range(2):
        for _ in range(3):
            t.clear([2, 3], opt=1, line=6)
            t.backward(fresh=[0, 1, 2, 3], line=7)
            t.step(1, line=8)
        t.clear([0, 1], opt=0, line=9)
        t.backward(fresh=[0, 1], line=10)
        t.step(0, line=11)
    t.backward(fresh=[0, 1, 2, 3], line=7)
    t.step(1, line=8)
    assert findings(t, SLUG) == []


def _built_every_step(t, steps=4, cap=None):
    """A layer built in forward (line 12) at each step: two new parameters each time, recorded
    by ``param_created`` events (``cap``: only the first few, as the watcher caps them)."""
    t.optimizer(0, [0, 1], line=2)
    pid = 2
    for i in range(steps):
        new = [pid, pid + 1]
        pid += 2
        for p, attr in zip(new, ("weight", "bias")):
            t.param(p, name=None)
            if cap is None or p < cap:
                t.put(ev.param_created(owner="Linear", attr=attr, params=[p], step=i), 12)
        t.clear([0, 1], line=5)
        t.backward(fresh=[0, 1, *new], line=6)
        t.step(0, line=7)


def test_a_layer_built_in_forward_at_every_step_is_reported_at_its_construction():
    t = TraceBuilder()
    _built_every_step(t)
    f, = findings(t, SLUG)
    assert f.location.line == 12 and f.evidence["cause"] == "created-while-training"
    assert f.evidence["count"] == 8 and "__init__" in f.fix and "nn.Linear" in f.fix
    t = TraceBuilder()
    _built_every_step(t, cap=6)  # parameters past the recorded ones are the same line's
    f, = findings(t, SLUG)
    assert f.location.line == 12 and f.evidence["count"] == 8


def test_parameters_built_once_after_the_optimizer_are_reported_where_they_are_built():
    """Not a layer built in forward (once, not every step), but built after the optimizer read
    its parameter list (a head made in Lightning's on_train_start): the line that builds it."""
    t = TraceBuilder()
    _built_every_step(t, steps=1)
    f, = findings(t, SLUG)
    assert f.location.line == 12 and f.evidence["cause"] == "built-after-optimizer"
    assert [r.location.line for r in f.related][0] == 2 and "add_param_group" in f.fix


def test_parameters_built_once_before_a_later_optimizer_keep_the_generic_finding():
    t = TraceBuilder()
    t.param(2, name=None)
    t.put(ev.param_created(owner="Linear", attr="weight", params=[2], step=0), 12)
    t.optimizer(0, [0, 1], line=2)  # built after the layer, and still without it
    for _ in range(2):
        t.clear([0, 1], line=5)
        t.backward(fresh=[0, 1, 2], line=6)
        t.step(0, line=7)
    f, = findings(t, SLUG)
    assert f.location.line == 2 and "cause" not in f.evidence


def _on_copy(t, copy_names, model_names, copy_shapes=None, model_shapes=None, steps=3,
             copy_requires_grad=True):
    """An optimizer over tensors 0..k-1 (named ``copy_names``) that no backward reaches, while
    backward writes tensors 10..10+k-1 (named ``model_names``) that no optimizer owns."""
    k = len(copy_names)
    copy = list(range(k))
    model = [10 + i for i in range(len(model_names))]
    for i, (pid, name) in enumerate(zip(copy, copy_names)):
        t.param(pid, name, shape=(copy_shapes or [[4, 4]] * k)[i], requires_grad=copy_requires_grad)
    for i, (pid, name) in enumerate(zip(model, model_names)):
        t.param(pid, name, shape=(model_shapes or [[4, 4]] * len(model))[i])
    t.optimizer(0, copy, line=2)
    for _ in range(steps):
        t.clear(copy, line=5)
        t.backward(fresh=model, line=6)
        t.step(0, line=7, without_grad=copy)
    return copy, model


def test_an_optimizer_over_the_models_copy_is_one_finding_naming_the_copy():
    t = TraceBuilder()
    _on_copy(t, ["model_ema.module.0.weight", "model_ema.module.1.weight"],
             ["model.0.weight", "model.1.weight"])
    f, = findings(t, SLUG)
    assert f.location.line == 2 and f.evidence["cause"] == "optimizer-on-copy"
    assert f.evidence["copy"] == "model_ema.module" and f.evidence["model"] == "model"
    assert "model.parameters()" in f.fix and "model_ema.module" in f.fix
    # its symptoms are left to it
    assert findings(t, "param-without-grad") == []


def test_a_frozen_copy_under_the_optimizer_is_the_same_case():
    t = TraceBuilder()
    _on_copy(t, ["target_net.0.weight", "target_net.2.weight"],
             ["policy_net.0.weight", "policy_net.2.weight"], copy_requires_grad=False)
    f, = findings(t, SLUG)
    assert f.evidence["cause"] == "optimizer-on-copy" and f.evidence["model"] == "policy_net"


def test_unowned_tensors_of_other_shapes_or_names_are_not_a_copy():
    t = TraceBuilder()
    _on_copy(t, ["netD.0.weight", "netD.1.weight"], ["netG.0.weight", "netG.1.weight"],
             copy_shapes=[[4, 4], [1, 4]], model_shapes=[[8, 4], [4, 8]])
    f, = findings(t, SLUG)
    assert f.evidence.get("cause") != "optimizer-on-copy"
    t = TraceBuilder()
    _on_copy(t, ["a.fc.weight", "a.fc.bias"], ["b.conv.weight", "b.conv.bias"])
    f, = findings(t, SLUG)
    assert f.evidence.get("cause") != "optimizer-on-copy"


def test_a_copy_that_got_a_gradient_at_one_step_is_not_the_case():
    t = TraceBuilder()
    copy, model = _on_copy(t, ["ema.0.weight"], ["net.0.weight"])
    t.clear(copy, line=5)
    t.backward(fresh=[*copy, *model], line=6)
    t.step(0, line=7, without_grad=[])
    f, = findings(t, SLUG)
    assert f.evidence.get("cause") != "optimizer-on-copy"


def test_one_step_is_not_enough_to_call_it_a_copy():
    t = TraceBuilder()
    _on_copy(t, ["ema.0.weight"], ["net.0.weight"], steps=1)
    f, = findings(t, SLUG)
    assert f.evidence.get("cause") != "optimizer-on-copy"


def test_parameters_first_written_after_steps_are_told_as_unfrozen_after_the_optimizer():
    # gradual unfreezing: param 2 gets its first gradient at the third update, after the
    # optimizer was built over the parameters trainable then
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=2)
    for i in range(4):
        t.clear([0, 1], line=5)
        t.backward(fresh=[0, 1, *([2] if i >= 2 else [])], line=6)
        t.step(0, line=7)
    f, = findings(t, SLUG)
    assert f.location.line == 2
    assert f.evidence["cause"] == "gradients-after-optimizer" and f.evidence["update"] == 3
    assert "add_param_group" in f.fix


def test_parameters_written_from_the_first_update_keep_the_plain_finding():
    t = TraceBuilder()
    _loop(t, extra=[2])
    f, = findings(t, SLUG)
    assert "cause" not in f.evidence


LIST_TAKEN_EARLY = """
import torch
import torch.nn.functional as F
from torch import nn


class Plain(torch.optim.Optimizer):
    def __init__(self, params, lr=0.1):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])


model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
trainable = [p for p in model.parameters() if p.requires_grad]
model.requires_grad_(False)
model.append(nn.Linear(2, 2))
optimizer = Plain({arg})
for step in range(4):
    loss = F.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 2))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def _run(tmp_path, arg):
    from graddoctor.options import CheckOptions
    from graddoctor.run.session import run_check

    script = tmp_path / "train.py"
    script.write_text(LIST_TAKEN_EARLY.replace("{arg}", arg))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule == "param-not-in-optimizer"]


def test_a_list_taken_before_the_model_changed_is_pointed_at_and_a_custom_class_at_its_call(tmp_path):
    (f,) = _run(tmp_path, "trainable")
    assert f.location.line == 20 and f.evidence["cause"] == "list-taken-early"
    assert "line 23" in f.message  # the Plain(...) call, not its super().__init__
    (g,) = _run(tmp_path, "[model[0].weight]")
    assert g.location.line == 23 and "cause" not in g.evidence


def test_an_optimizer_over_an_earlier_optimizers_parameters_is_reported_at_the_later_one():
    # optimizerG = Adam(netD.parameters()): netG's parameters (0, 1) get gradients, no optimizer
    # owns them, and two optimizers own netD's (2, 3)
    t = TraceBuilder()
    for pid, name in enumerate(("netG.0.weight", "netG.0.bias", "netD.0.weight", "netD.0.bias")):
        t.param(pid, name=name)
    t.optimizer(0, [2, 3], line=3)
    t.optimizer(1, [2, 3], line=4)
    for _ in range(3):
        t.clear([2, 3], opt=0, line=6)
        t.backward(fresh=[2, 3], line=7)
        t.step(0, line=8)
        t.clear([2, 3], opt=1, line=9)
        t.backward(fresh=[0, 1, 2, 3], line=10)
        t.step(1, line=11)
    f, = findings(t, SLUG)
    assert f.location.line == 4 and f.evidence["cause"] == "optimizer-over-another's-parameters"
    assert [r.location.line for r in f.related][:1] == [3]
    assert "netG.parameters()" in f.fix


def test_optimizers_built_on_one_line_over_the_same_parameters_keep_the_generic_finding():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=3)
    t.optimizer(1, [0, 1], line=3)
    for _ in range(3):
        t.clear([0, 1], opt=0, line=6)
        t.backward(fresh=[0, 1, 2], line=7)
        t.step(0, line=8)
        t.step(1, line=9)
    for f in findings(t, SLUG):
        assert f.evidence.get("cause") != "optimizer-over-another's-parameters"


def test_a_wrappers_base_optimizer_over_its_own_groups_is_no_copy(tmp_path):
    # SAM builds its base optimizer over its own param_groups, inside its class
    script = tmp_path / "sam.py"
    script.write_text("import torch\n"                                        # 1
                      "class SAM(torch.optim.Optimizer):\n"                   # 2
                      "    def __init__(self, params, base):\n"               # 3
                      "        self.base = base(self.param_groups)\n"          # 4
                      "opt = SAM(model.parameters(), torch.optim.SGD)\n")      # 5
    t = TraceBuilder(str(script))
    for pid, name in enumerate(("model.0.weight", "model.0.bias", "head.weight")):
        t.param(pid, name=name)
    t.optimizer(0, [0, 1], line=5)
    t.optimizer(1, [0, 1], line=4)
    for _ in range(3):
        t.clear([0, 1], opt=0, line=6)
        t.backward(fresh=[0, 1, 2], line=7)
        t.step(1, line=8)
    found = findings(t, SLUG)
    assert found and all(f.evidence.get("cause") != "optimizer-over-another's-parameters" for f in found)


def test_a_later_statement_that_hands_the_optimizer_to_the_next_phase_is_found(tmp_path):
    from graddoctor.analysis.source import rebound_later
    script = tmp_path / "train.py"
    script.write_text("def main():\n"                                   # 1
                      "    head_opt = SGD(head.parameters())\n"          # 2
                      "    fit(head_opt)\n"                              # 3
                      "    head_opt = head_opt\n"                        # 4: rebinds its own name
                      "    unfreeze(model)\n"                            # 5
                      "    trainer.optimizer = head_opt\n"               # 6
                      "    optimizer = head_opt\n"                       # 7
                      "def other():\n"                                   # 8
                      "    opt = SGD(model.parameters())\n"              # 9
                      "    self.opt = opt\n"                             # 10: nothing unfrozen before
                      "    fit(opt)\n")                                  # 11
    assert rebound_later(str(script), 2) == 6
    assert rebound_later(str(script), 9) is None
    assert rebound_later(str(script), 3) is None  # not an assignment to a name
