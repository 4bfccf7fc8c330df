"""param-without-grad (GD106) on hand-written traces: the ``idle_forward`` events point the
finding at the cause (a forward under no_grad, or one whose output was cut from the loss), and
without them it stays at the optimizer. No torch."""

from __future__ import annotations

import pytest

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules.param_without_grad import ParamWithoutGrad
from graddoctor.trace import Location, TraceBuilder


def check(t):
    return list(ParamWithoutGrad().check(Analysis(t.trace)))


def run(t, steps=3, idle=(1, 2), forwards=(), backward_line=20):
    """An optimizer at line 5 owning 0, 1, 2; pid 0 trains; ``forwards``: (step index, line,
    kwargs of idle_forward) recorded before that step's backward."""
    t.optimizer(0, [0, 1, 2], line=5)
    for i in range(steps):
        for at, line, kw in forwards:
            if at == i:
                data = dict(mid=0, cls="Linear", params=list(idle), grad=True, inference=False,
                            training=True)
                data.update(kw)
                t.put(ev.idle_forward(**data), line)
        t.backward(fresh=[0], line=backward_line)
        t.step(0, line=21, without_grad=list(idle))


def test_no_forward_seen_keeps_the_optimizer_line():
    t = TraceBuilder()
    run(t)
    [f] = check(t)
    assert f.location.line == 5 and "never train" in f.message
    assert f.severity == Severity.WARNING and f.fix == ParamWithoutGrad.fix


def test_forward_under_no_grad_points_at_the_call():
    t = TraceBuilder()
    run(t, forwards=[(2, 17, {"grad": False})])
    [f] = check(t)
    assert f.location.line == 17 and f.severity == Severity.WARNING
    assert "under torch.no_grad()" in f.message and "built at line 5" in f.message
    assert "no_grad" in f.fix and "requires_grad_" not in f.fix
    assert f.evidence["cause"] == "no_grad"


def test_inference_mode_is_named():
    t = TraceBuilder()
    run(t, forwards=[(2, 17, {"grad": False, "inference": True})])
    [f] = check(t)
    assert "torch.inference_mode()" in f.message and f.location.line == 17


def test_forward_with_grad_says_the_output_was_cut():
    t = TraceBuilder()
    run(t, forwards=[(2, 16, {})])
    [f] = check(t)
    assert f.location.line == 16 and "gradients enabled" in f.message and ".detach()" in f.message
    assert "requires_grad_" not in f.fix and f.evidence["cause"] == "cut"


def test_training_forward_wins_over_a_validation_forward():
    t = TraceBuilder()
    # validation under no_grad in eval mode first, then the training forward with grad
    run(t, forwards=[(2, 40, {"grad": False, "training": False}), (2, 16, {})])
    [f] = check(t)
    assert f.location.line == 16 and f.evidence["cause"] == "cut"
    t = TraceBuilder()
    # training under no_grad beats a grad-enabled forward in eval mode
    run(t, forwards=[(2, 40, {"training": False}), (2, 17, {"grad": False})])
    [f] = check(t)
    assert f.location.line == 17 and f.evidence["cause"] == "no_grad"


def test_modules_on_one_line_share_a_finding_and_unseen_ones_keep_theirs():
    t = TraceBuilder()
    run(t, forwards=[(2, 16, {"mid": 0, "params": [1]}), (2, 16, {"mid": 1, "params": [2]})])
    [f] = check(t)
    assert f.location.line == 16 and f.evidence["params"] == ["p1", "p2"]
    t = TraceBuilder()
    run(t, forwards=[(2, 16, {"mid": 0, "params": [1]})])
    found = sorted(check(t), key=lambda f: f.location.line)
    assert [f.location.line for f in found] == [5, 16]
    assert found[0].evidence["params"] == ["p2"] and found[1].evidence["params"] == ["p1"]


def test_a_param_that_got_a_gradient_once_is_silent_whatever_its_forwards():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=5)
    t.put(ev.idle_forward(mid=0, cls="Linear", params=[1], grad=False, inference=False,
                          training=True), 17)
    for i in range(4):
        t.backward(fresh=[0] if i % 2 else [0, 1], line=20)
        t.step(0, line=21, without_grad=[1] if i % 2 else [])
    assert check(t) == []


def test_idle_forward_is_an_aside_kind():
    assert "idle_forward" in ev.ASIDE_KINDS
    kind, data = ev.idle_forward(mid=0, cls="Linear", params=[1], grad=True, inference=False,
                                 training=True)
    assert ev.CONSTRUCTORS[kind](**data) == (kind, data)


def test_a_reentrant_checkpoint_is_named_with_its_fixes_for_who_called_it():
    for by, needle in (("user", "use_reentrant=False to checkpoint(...)"),
                       ("transformers", "model.enable_input_require_grads()"),
                       ("library", "use_reentrant=False")):
        t = TraceBuilder()
        run(t, forwards=[(0, 12, {"grad": False, "checkpoint": by})])
        [f] = check(t)
        assert f.location.line == 12 and f.evidence["cause"] == "reentrant_checkpoint"
        assert "reentrant" in f.message and "torch.no_grad()" in f.message
        assert needle in f.fix and "outside torch.no_grad()" not in f.fix
    t = TraceBuilder()  # a plain no_grad forward keeps its own message
    run(t, forwards=[(0, 12, {"grad": False})])
    [f] = check(t)
    assert f.evidence["cause"] == "no_grad" and "checkpoint" not in f.message


POOLER_SOURCE = """\
class Encoder(nn.Module):
    def forward(self, ids):
        h = self.layer(self.emb(ids))
        return h, self.pooler(h[:, 0])
"""


def pooler_run(tmp_path, source=POOLER_SOURCE, names=("model.encoder.layer.weight",
               "model.encoder.pooler.weight", "model.encoder.pooler.bias"), **idle):
    """pid 0 (the encoder's layer) trains; 1, 2 (its pooler) run at line 4 of ``source`` with
    gradients on and get none."""
    path = tmp_path / "model.py"
    path.write_text(source)
    t = TraceBuilder(path=str(path))
    for pid, name in enumerate(names):
        t.put(ev.param(pid=pid, name=name, shape=[2], is_parameter=True, requires_grad=True))
    run(t, forwards=[(1, 4, idle)])
    return check(t)


def test_a_users_module_whose_output_is_unused_while_its_model_trains_is_info(tmp_path):
    [f] = pooler_run(tmp_path)
    assert f.severity == Severity.INFO and f.location.line == 4
    assert f.evidence["cause"] == "discarded" and "discarded" in f.message


def test_a_librarys_own_call_of_an_unused_head_is_silent(tmp_path):
    assert pooler_run(tmp_path, library=True) == []


@pytest.mark.parametrize("source, names, library", [
    # a .detach() in the function that calls the module: a cut, not an unused output
    (POOLER_SOURCE.replace("h[:, 0])", "h[:, 0]).detach()"), None, False),
    (POOLER_SOURCE.replace("h = self.layer", "h = h.data + self.layer"), None, True),
    # nothing else of that model trains (a detached encoder beside a trained head)
    (POOLER_SOURCE, ("head.weight", "encoder.pooler.weight", "encoder.pooler.bias"), True),
])
def test_cuts_and_untrained_models_stay_warnings(tmp_path, source, names, library):
    kw = {"names": names} if names else {}
    [f] = pooler_run(tmp_path, source, library=library, **kw)
    assert f.severity == Severity.WARNING and f.evidence["cause"] == "cut"


def stack_run(tmp_path, names, idle):
    path = tmp_path / "model.py"
    path.write_text(POOLER_SOURCE)
    t = TraceBuilder(path=str(path))
    for pid, name in enumerate(names):
        t.put(ev.param(pid=pid, name=name, shape=[2], is_parameter=True, requires_grad=True))
    run(t, idle=idle, forwards=[(1, 4, {"params": list(idle)})])
    return check(t)


def test_the_last_block_of_a_stack_whose_earlier_blocks_train_the_same_weight_is_silent(tmp_path):
    # N-BEATS: the last block's backcast has no later block to read it
    names = ("m.blocks.0.backcast.weight", "m.blocks.1.backcast.weight", "m.blocks.2.backcast.weight")
    assert stack_run(tmp_path, names, idle=(2,)) == []


@pytest.mark.parametrize("names, idle", [
    # every block but the last idle: each pass overwrote the one before (`out = blk(x)`)
    (("m.blocks.2.w", "m.blocks.0.w", "m.blocks.1.w"), (1, 2)),
    # an earlier block's same weight does not train either (or there is none)
    (("m.blocks.1.w", "m.head.w", "m.blocks.2.w"), (2,)),
    # the idle block is not the last of its stack
    (("m.blocks.0.w", "m.blocks.2.w", "m.blocks.1.w"), (2,)),
])
def test_other_idle_blocks_of_a_stack_stay_info(tmp_path, names, idle):
    [f] = stack_run(tmp_path, names, idle)
    assert f.severity == Severity.INFO and f.evidence["cause"] == "discarded"


def test_unreadable_source_keeps_the_warning():
    t = TraceBuilder()
    for pid, name in enumerate(("m.a.weight", "m.b.weight", "m.b.bias")):
        t.put(ev.param(pid=pid, name=name, shape=[2], is_parameter=True, requires_grad=True))
    run(t, forwards=[(1, 4, {"library": True})])
    [f] = check(t)
    assert f.severity == Severity.WARNING


def test_a_run_without_any_backward_is_an_error_at_the_forward():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=5)
    for i in range(3):
        t.put(ev.idle_forward(mid=0, cls="Linear", params=[0, 1], grad=True, inference=False,
                              training=True), 16)
        t.step(0, line=21, without_grad=[0, 1])
    [f] = check(t)
    assert f.severity == Severity.ERROR and f.location.line == 16
    assert f.evidence["cause"] == "no_backward" and "loss.backward()" in f.fix
    t.via = "lightning"
    t.step(0, line=21, without_grad=[0, 1])  # a step driven by Lightning: the framework
    [f] = check(t)
    assert "training_step" in f.message and "return loss" in f.fix


def test_lightning_manual_optimization_without_manual_backward():
    """The step is called from the user's training_step (manual optimization): what it returns
    does not matter, the missing self.manual_backward(loss) does."""
    t = TraceBuilder()
    t.via = "lightning"
    t.optimizer(0, [0, 1], line=5)
    for i in range(3):
        t.put(ev.idle_forward(mid=0, cls="Linear", params=[0, 1], grad=True, inference=False,
                              training=True), 16)
        t.trace.put(ev.step(opt=0, without_grad=[0, 1]),
                    Location(t.path, 17, "training_step", via="lightning"))
    [f] = check(t)
    assert f.severity == Severity.ERROR and f.location.line == 16
    assert f.evidence["manual_optimization"] is True
    assert "self.manual_backward(loss)" in f.fix and "return" not in f.fix
    assert "manual optimization" in f.message and "returns no loss" not in f.message


def test_lightning_automatic_step_in_a_hook_keeps_the_return_fix():
    t = TraceBuilder()
    t.via, t.hook = "lightning", "configure_optimizers"
    t.optimizer(0, [0, 1], line=5)
    for i in range(3):
        t.put(ev.idle_forward(mid=0, cls="Linear", params=[0, 1], grad=True, inference=False,
                              training=True), 16)
        t.step(0, line=22, without_grad=[0, 1])
    [f] = check(t)
    assert "manual_optimization" not in f.evidence and "return loss" in f.fix


def test_a_loss_computed_from_the_idle_module_is_a_warning_at_the_loss_line(tmp_path):
    # a multi-task loop's l_reg = F.mse_loss(reg, y) added as l_reg.item(); a detection loss
    # dict whose box loss is left out of the sum: the head's loss never reaches a backward
    path = tmp_path / "model.py"
    path.write_text(POOLER_SOURCE)
    t = TraceBuilder(path=str(path))
    for pid, name in enumerate(("model.encoder.layer.weight", "model.encoder.pooler.weight",
                                "model.encoder.pooler.bias")):
        t.put(ev.param(pid=pid, name=name, shape=[2], is_parameter=True, requires_grad=True))
    t.put(ev.idle_loss(mid=0, cls="Linear", params=[1, 2], fn="mse_loss"), 30)
    run(t, forwards=[(1, 4, {})])
    [f] = check(t)
    assert f.severity == Severity.WARNING and f.location.line == 30
    assert f.evidence["cause"] == "loss-dropped" and f.evidence["loss"] == "mse_loss"
    assert "never reaches a backward" in f.message and f.related[0].location.line == 4
    assert ".item()" in f.fix


def test_an_output_that_does_not_depend_on_the_idle_params_names_the_forward(tmp_path):
    # the module runs and its output's loss is backpropagated, but its forward never uses them
    # (a parameter left out of forward, a parametrization that ignores its original): no dropped
    # loss to add back
    path = tmp_path / "model.py"
    path.write_text(POOLER_SOURCE)
    t = TraceBuilder(path=str(path))
    for pid, name in enumerate(("model.fc.weight", "model.logit_scale", "model.fc.bias")):
        t.put(ev.param(pid=pid, name=name, shape=[2], is_parameter=True, requires_grad=True))
    t.put(ev.idle_loss(mid=0, cls="ScaledHead", params=[1, 2], fn="cross_entropy", unused=True), 30)
    run(t, forwards=[(1, 4, {})])
    [f] = check(t)
    assert f.severity == Severity.WARNING and f.location.line == 4
    assert f.evidence["cause"] == "unused-in-forward" and "never uses them" in f.message
    assert "never reaches a backward" not in f.message and ".item()" not in f.fix
    assert f.related[0].location.line == 30


def test_a_loss_of_another_module_or_under_no_grad_changes_nothing(tmp_path):
    t = TraceBuilder()
    t.put(ev.idle_loss(mid=7, cls="Linear", params=[5], fn="mse_loss"), 30)
    run(t, forwards=[(1, 16, {})])
    [f] = check(t)
    assert f.evidence["cause"] == "cut" and f.location.line == 16
    t = TraceBuilder()
    t.put(ev.idle_loss(mid=0, cls="Linear", params=[1, 2], fn="mse_loss"), 30)
    run(t, forwards=[(1, 17, {"grad": False})])
    [f] = check(t)
    assert f.evidence["cause"] == "no_grad" and f.location.line == 17


def test_idle_loss_is_an_aside_kind():
    assert "idle_loss" in ev.ASIDE_KINDS
    kind, data = ev.idle_loss(mid=0, cls="Linear", params=[1], fn="cross_entropy")
    assert kind == "idle_loss" and ev.CONSTRUCTORS[kind] is ev.idle_loss


def test_the_watcher_records_the_loss_line_of_an_idle_heads_loss():
    import torch
    import torch.nn.functional as F
    from torch import nn

    from graddoctor.instrument import Instrumentation, Recorder

    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    trunk, head, aux = nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 1)
    x, y, t = torch.randn(8, 4), torch.randint(0, 2, (8,)), torch.randn(8)
    with Instrumentation(rec):
        opt = torch.optim.SGD([*trunk.parameters(), *head.parameters(), *aux.parameters()], lr=0.1)
        for _ in range(5):
            h = trunk(x)
            loss = F.cross_entropy(head(h), y)
            aux_loss = F.mse_loss(aux(h).squeeze(-1), t)
            opt.zero_grad()
            (loss + aux_loss.item()).backward()
            opt.step()
    found = [e for e in rec.trace if e.kind == "idle_loss"]
    assert len(found) == 1 and found[0]["fn"] == "mse_loss" and found[0]["cls"] == "Linear"


def test_parameters_frozen_at_every_step_and_unfrozen_after_the_last_are_not_idle():
    # gradual unfreezing cut by the step budget: requires_grad is True at the end of the run,
    # False at each step that owned them
    t = TraceBuilder()
    run(t)
    for pid in (1, 2):
        t.put(ev.param(pid=pid, name=f"p{pid}", shape=[2], is_parameter=True, requires_grad=True,
                       stepped_requires_grad=False))
    assert check(t) == []
    t = TraceBuilder()
    run(t)
    for pid in (1, 2):  # trainable at the steps, still without a gradient: reported
        t.put(ev.param(pid=pid, name=f"p{pid}", shape=[2], is_parameter=True, requires_grad=True,
                       stepped_requires_grad=True))
    [f] = check(t)
    assert f.location.line == 5


def test_a_generator_step_that_scores_detached_samples_is_pointed_at_its_own_detach():
    # G (opt 0: params 0, 1 in two layers called from one Sequential line 12) and D (opt 1: 2);
    # the samples are detached at line 14 for D's step (right) and at line 20 for G's (the bug)
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=5)
    t.optimizer(1, [2], line=6)
    for i in range(4):
        if i == 2:
            for mid, pid in ((0, 0), (1, 1)):
                t.put(ev.idle_forward(mid=mid, cls="Linear", params=[pid], grad=True,
                                      inference=False, training=True), 12)
            t.put(ev.idle_detach(mid=1, cls="Linear", params=[1]), 14)
        t.backward(fresh=[2], line=15)
        t.step(1, line=16)
        if i == 2:
            t.put(ev.idle_detach(mid=1, cls="Linear", params=[1]), 20)
        t.backward(fresh=[2], line=21)
        t.step(0, line=22, without_grad=[0, 1])
    [f] = check(t)
    assert f.location.line == 20 and f.evidence["cause"] == "detached"
    assert "also detached at line 14" in f.message


# -- a loop over a stack of blocks that drops what each pass hands on --------------------------

class _Source:
    def __init__(self, text):
        import ast
        self._tree = ast.parse(text)

    def tree(self, path):
        return self._tree


class _A:
    def __init__(self, text):
        self.source = _Source(text)


_STACK = """class Stack:
    def forward(self, x):
        residual, forecast = x, {init}
        for block in self.blocks:
            back, f = block({given})
            residual = residual - back
            forecast = {update}
        return forecast
"""


@pytest.mark.parametrize("init, given, update, expected", [
    ("0.0", "residual", "f", ("overwrite", 7, "forecast", "f")),
    ("torch.zeros(4)", "residual", "f", ("overwrite", 7, "forecast", "f")),
    ("0.0", "x", "forecast + f", ("dead", 5, "residual", "")),
    ("0.0", "residual", "forecast + f", None),  # the reference stack
    ("None", "residual", "f", None),  # the last block's output kept on purpose
])
def test_a_stack_loop_that_overwrites_its_sum_or_never_reads_its_residual(init, given, update, expected):
    from graddoctor.rules.param_without_grad import _stack_loop_miswired

    text = _STACK.format(init=init, given=given, update=update)
    cause = {"outer": [["m.py", 5]]}
    assert _stack_loop_miswired(_A(text), cause) == expected


CALLER_SOURCE = """\
class Net(nn.Module):
    def forward(self, x):
        h = self.body(x)
        return [self.head(h), self.aux(h)]

def run_iteration(model, x):
    out = model(x)
    loss = out[0].sum()
    loss.backward()
    return loss.detach().cpu().numpy()
"""


@pytest.mark.parametrize("backward_line, cause, severity", [
    # the backward ran in the caller before its .detach(): the detach cuts only the logged loss,
    # so the aux head's output is simply unused (a deep-supervision output weighted 0)
    (9, "discarded", Severity.INFO),
    # no backward between the call and the .detach(): the detach may be the cut
    (20, "cut-by-caller", Severity.WARNING),
])
def test_a_callers_detach_after_its_own_backward_is_not_the_cut(tmp_path, backward_line, cause, severity):
    path = tmp_path / "model.py"
    path.write_text(CALLER_SOURCE)
    t = TraceBuilder(path=str(path))
    for pid, name in enumerate(("model.body.weight", "model.aux.weight", "model.aux.bias")):
        t.put(ev.param(pid=pid, name=name, shape=[2], is_parameter=True, requires_grad=True))
    run(t, forwards=[(1, 4, {"outer": [[str(path), 7]]})], backward_line=backward_line)
    [f] = check(t)
    assert f.evidence["cause"] == cause and f.severity == severity
    assert ("takes its output through" in f.message) == (cause == "cut-by-caller")
LIT_SOURCE = """import lightning as L


class Lit(L.LightningModule):
    def forward(self, x):
        return self.head(self.body(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.log("train_loss", loss)
{tail}
"""


def _lightning_no_backward(tmp_path, tail=""):
    path = tmp_path / "lit.py"
    path.write_text(LIT_SOURCE.format(tail=tail))
    t = TraceBuilder(path=str(path))
    t.via, t.hook = "lightning", "configure_optimizers"
    t.optimizer(0, [0, 1], line=14)
    for i in range(3):
        t.put(ev.idle_forward(mid=0, cls="Linear", params=[0, 1], grad=True, inference=False,
                              training=True), 6)
        t.step(0, line=14, without_grad=[0, 1])
    [f] = check(t)
    return f


def test_lightning_training_step_without_return_points_at_its_loss(tmp_path):
    """The layers run in forward(), but the return is missing in training_step: the finding
    points at the loss training_step computes, with the forward beside it."""
    f = _lightning_no_backward(tmp_path)
    assert f.severity == Severity.ERROR and f.location.line == 11
    assert [r.location.line for r in f.related][0] == 6 and "return loss" in f.fix


def test_lightning_training_step_that_returns_a_value_keeps_the_forward(tmp_path):
    f = _lightning_no_backward(tmp_path, tail="        return {'log': loss.item()}")
    assert f.location.line == 6
HEADS_SOURCE = """\
class MultiHead(nn.Module):
    def forward(self, x, task_id):
        return self.heads[task_id](self.body(x))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def heads_run(tmp_path, source=HEADS_SOURCE, status="step-limit", ran=False,
              names=("model.heads.0.weight", "model.heads.1.weight")):
    """pid 0 (``model.heads.0.weight``) trains; pid 1 (``model.heads.1.weight``) never gets a
    gradient under the optimizer built at line 4 of ``source``."""
    path = tmp_path / "train.py"
    path.write_text(source)
    t = TraceBuilder(path=str(path))
    for pid, name in enumerate(names):
        t.put(ev.param(pid=pid, name=name, shape=[2], is_parameter=True, requires_grad=True))
    t.optimizer(0, [0, 1], line=4)
    for i in range(3):
        if ran:
            t.put(ev.idle_forward(mid=1, cls="Linear", params=[1], grad=True, inference=False,
                                  training=True), 3)
        t.backward(fresh=[0], line=20)
        t.step(0, line=21, without_grad=[1])
    t.put(ev.run_end(status=status, steps=3))
    return check(t)


def test_a_head_picked_by_task_id_for_a_task_the_replay_did_not_reach_is_silent(tmp_path):
    assert heads_run(tmp_path) == []
    # a ModuleDict keyed by the task's name
    assert heads_run(tmp_path, names=("model.heads.digits.weight", "model.heads.letters.weight")) == []
    # another layer of the same member name elsewhere is no sibling
    [f] = heads_run(tmp_path, names=("model.heads.0.weight", "model.heads.1.bias"))
    assert "model.heads.1.bias" in f.message


@pytest.mark.parametrize("source, status, ran", [
    (HEADS_SOURCE.replace("[task_id]", "[0]"), "step-limit", False),  # only ever heads[0]
    (HEADS_SOURCE, "completed", False),  # the script ran to its end: heads[1] never ran
])
def test_a_head_that_stays_idle_is_still_reported(tmp_path, source, status, ran):
    [f] = heads_run(tmp_path, source, status, ran)
    assert "model.heads.1.weight" in f.message


def test_a_parameter_a_later_optimizer_trains_is_silent():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=5)  # task 0's optimizer: head 1 waits for its task
    for _ in range(3):
        t.backward(fresh=[0], line=20)
        t.step(0, line=21, without_grad=[1])
    t.optimizer(1, [0, 1], line=5)  # task 1's optimizer trains head 1
    for _ in range(3):
        t.backward(fresh=[0, 1], line=20)
        t.step(1, line=21)
    assert check(t) == []
    u = TraceBuilder()  # idle under both optimizers: reported at each
    u.optimizer(0, [0, 1], line=5)
    for _ in range(3):
        u.backward(fresh=[0], line=20)
        u.step(0, line=21, without_grad=[1])
    u.optimizer(1, [0, 1], line=5)
    for _ in range(3):
        u.backward(fresh=[0], line=20)
        u.step(1, line=21, without_grad=[1])
    assert len(check(u)) == 2
