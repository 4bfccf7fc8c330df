"""Framework-aware locations and fixes, without the frameworks: fake framework files under a
``site-packages`` folder drive the LocationFinder (graddoctor/location.py, frameworks.py), and
hand-written traces carry ``Location.via`` to the rules. The real frameworks run in
fixtures/frameworks/ (tests/test_fixtures.py) where installed."""

from __future__ import annotations

import json

import pytest
from module_files import load

from graddoctor.analysis import Analysis
from graddoctor.rules.engine import analyze
from graddoctor.findings import Severity
from graddoctor.frameworks import framework_of_path, hook_key
from graddoctor.location import LocationFinder, _hook_line
from graddoctor.report.json_format import finding_to_dict
from graddoctor.rules import find_rule
from graddoctor.trace import Location, Trace, TraceBuilder

P = [0, 1]


@pytest.fixture
def fake(tmp_path):
    """A fake torch-like library, a fake Lightning/accelerate, and the user's script."""
    site = tmp_path / "lib" / "site-packages"
    torchish = load(site / "faketorch" / "autograd.py", """
        def backward(finder):
            return finder.here(1)  # the instrumentation's view of this call
    """)
    automatic = load(site / "lightning" / "pytorch" / "loops" / "optimization" / "automatic.py", """
        class Trainer:
            def __init__(self, module):
                self.lightning_module = module

        class AutomaticOptimization:
            def __init__(self, trainer, backward):
                self.trainer, self.backward = trainer, backward

            def backward_fn(self, finder):
                return self.backward(finder)
    """)
    strategy = load(site / "lightning" / "pytorch" / "strategies" / "strategy.py", """
        def optimizer_step(call, finder):
            return call(finder)
    """)
    accelerate = load(site / "accelerate" / "accelerator.py", """
        class Accelerator:
            def backward(self, call, finder):
                return call(finder)
    """)
    user = load(tmp_path / "train.py", """
        class Regressor:
            def training_step(self, batch, batch_idx):
                loss = batch * 2
                if batch_idx < 0:
                    return None
                return loss

        def fit(loop, finder):
            return loop.backward_fn(finder)  # line 10: the trainer.fit(...) of the script
    """)
    return torchish, automatic, strategy, accelerate, user, tmp_path


def test_framework_of_path():
    assert framework_of_path("/x/site-packages/lightning/pytorch/core/module.py") == "lightning"
    assert framework_of_path("/x/site-packages/pytorch_lightning/core/module.py") == "lightning"
    assert framework_of_path("/x/dist-packages/accelerate/accelerator.py") == "accelerate"
    assert framework_of_path("/x/site-packages/transformers/trainer.py") == "transformers"
    assert framework_of_path("/x/site-packages/torch/optim/sgd.py") == ""
    assert framework_of_path("/home/me/lightning/train.py") == ""  # the user's own folder
    assert hook_key("/x/site-packages/lightning/pytorch/core/module.py", "optimizer_step") == \
        "core/module.py:optimizer_step"


def test_automatic_optimization_backward_points_at_training_steps_return(fake):
    torchish, automatic, _, _, user, root = fake
    finder = LocationFinder(relative_to=str(root))
    loop = automatic.AutomaticOptimization(automatic.Trainer(user.Regressor()), torchish.backward)
    loc = user.fit(loop, finder)
    assert (loc.path, loc.line, loc.via, loc.hook) == ("train.py", 7, "lightning", "training_step")
    assert user.fit(loop, finder) == loc  # cached per path through the framework


def test_without_the_users_hook_the_fit_line_stays(fake):
    torchish, automatic, _, _, user, root = fake

    class NotOverridden:  # its training_step is not the user's file: no hook to point at
        training_step = staticmethod(len)

    finder = LocationFinder(relative_to=str(root))
    loop = automatic.AutomaticOptimization(automatic.Trainer(NotOverridden()), torchish.backward)
    loc = user.fit(loop, finder)
    assert (loc.line, loc.via, loc.hook) == (10, "lightning", "")


def test_a_call_the_user_made_through_a_framework_keeps_the_users_line(fake):
    torchish, _, strategy, accelerate, _, root = fake
    finder = LocationFinder(relative_to=str(root))
    here = lambda: strategy.optimizer_step(torchish.backward, finder)  # noqa: E731  a manual opt.step()
    loc = here()
    assert (loc.via, loc.hook, loc.function) == ("lightning", "", "<lambda>")
    loc = accelerate.Accelerator().backward(torchish.backward, finder)
    assert (loc.via, loc.hook) == ("accelerate", "")
    assert loc.path.endswith("test_frameworks.py")


def test_a_plain_call_has_no_framework(fake):
    torchish, *_ , root = fake
    loc = torchish.backward(LocationFinder(relative_to=str(root)))
    assert (loc.via, loc.hook) == ("", "") and loc.path.endswith("test_frameworks.py")


def test_hook_line_is_the_last_return_of_a_returning_hook(fake):
    user = fake[4]
    code = user.Regressor.training_step.__code__
    assert _hook_line(code, "training_step") == 7
    assert _hook_line(code, "on_train_epoch_start") == code.co_firstlineno


def test_location_json_round_trip_keeps_via_and_hook():
    loc = Location("train.py", 7, "training_step", "lightning", "training_step")
    assert Location.from_json(json.loads(json.dumps(loc.to_json()))) == loc
    plain = Location("train.py", 3)
    assert "via" not in plain.to_json() and Location.from_json(plain.to_json()) == plain


# -- the analysis and the rules ---------------------------------------------------------------
def trainer_accumulation(t, clipped: bool, k: int = 4):
    """The Trainer's window: every micro-batch tagged with the same (prefetched) batch."""
    t.optimizer(0, P, line=1, cls="AdamW")
    for _ in range(3):
        for i in range(k):
            t.backward(fresh=P if i == 0 else (), accumulated=P if i else (), line=29,
                       loss_scale_factor=1.0, batch=[0, 0, 7])
        if clipped:
            t.event("clip", 29, via="clip_grad_norm_", params=P, with_grad=P, untracked=0,
                    limit=1.0, norm_type=2.0, norm_only=False, total_norm=None, edited=[])
        t.step(line=29)
        t.clear(P, line=29)


def test_trainer_accumulation_is_a_warning_in_trainer_terms_when_clipped():
    t = TraceBuilder()
    t.via = "transformers"
    trainer_accumulation(t, clipped=True)
    a = Analysis(t.trace)
    assert a.framework == "transformers"
    (f,) = [f for f in analyze(a)[0] if f.rule == "unscaled-accumulation"]
    assert f.severity is Severity.WARNING and f.location.line == 29
    assert "num_items_in_batch" in f.message and "same DataLoader batch" not in f.message
    assert "compute_loss_func" in f.fix and "model_accepts_loss_kwargs" in f.fix


def test_trainer_accumulation_without_clipping_is_info():
    t = TraceBuilder()
    t.via = "transformers"
    trainer_accumulation(t, clipped=False)
    (f,) = [f for f in analyze(Analysis(t.trace))[0] if f.rule == "unscaled-accumulation"]
    assert f.severity is Severity.INFO and "num_items_in_batch" in f.message


def test_a_hand_written_loop_with_one_batch_keeps_the_old_info():
    t = TraceBuilder()  # no framework: several losses of one batch may be meant
    trainer_accumulation(t, clipped=True)
    (f,) = [f for f in analyze(Analysis(t.trace))[0] if f.rule == "unscaled-accumulation"]
    assert f.severity is Severity.INFO and "same DataLoader batch" in f.message
    assert f.fix == find_rule("unscaled-accumulation").fix


def test_compute_loss_hook_gets_its_own_fix():
    t = TraceBuilder()
    t.via, t.hook = "transformers", "compute_loss"
    trainer_accumulation(t, clipped=True)
    (f,) = [f for f in analyze(Analysis(t.trace))[0] if f.rule == "unscaled-accumulation"]
    assert "this compute_loss" in f.message and f.fix.startswith("in compute_loss")


@pytest.mark.parametrize("via, expected", [("accelerate", "accelerator.backward(loss)"),
                                           ("lightning", "self.manual_backward(loss / k)"),
                                           ("", "(loss / k).backward()")])
def test_fix_variant_follows_the_framework_of_the_run(via, expected):
    t = TraceBuilder()
    t.optimizer(0, P, line=1)
    for _ in range(3):
        t.via = ""  # the user's own loss.backward(): no framework frame on its stack
        for i in range(4):
            t.backward(fresh=P if i == 0 else (), accumulated=P if i else (), line=18,
                       loss_scale_factor=1.0, batch=[0, 0, i])
        t.via = via  # the wrapped optimizer's step
        t.step(line=19)
        t.clear(P, line=20)
    (f,) = [f for f in analyze(Analysis(t.trace))[0] if f.rule == "unscaled-accumulation"]
    assert expected in f.fix


def test_explain_and_sarif_help_list_the_variants():
    from graddoctor.report.sarif import rule_descriptor

    rule = find_rule("frozen-bn-train-mode")
    assert "## Fix in a framework" in rule.docs() and "on_train_epoch_start" in rule.docs()
    assert rule.fix_for("lightning") != rule.fix and rule.fix_for("") == rule.fix
    assert "on_train_epoch_start" in json.dumps(rule_descriptor(rule))
    assert "## Fix in a framework" not in find_rule("stale-grad").docs()  # no variants: unchanged


def test_closure_step_without_backward_is_a_plain_step():
    """Lightning hands every step a closure; manual optimization's runs no backward: such a
    step is not an L-BFGS-style closure step (its window is judged like any other)."""
    import torch

    from graddoctor.instrument import Instrumentation, Recorder

    model = torch.nn.Linear(3, 1)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            opt.step(lambda: None)  # does nothing

        def closure():
            opt.zero_grad()
            loss = model(torch.randn(4, 3)).sum()
            loss.backward()
            return loss

        opt.step(closure)
    steps = [e["closure"] for e in rec.trace if e.kind == "step"]
    assert steps == [False, False, True]


def test_hook_locations_in_json_schema_and_text():
    import jsonschema
    from rich.console import Console

    from graddoctor.findings import Finding
    from graddoctor.report.text_findings import finding_block

    loc = Location("train.py", 20, "training_step", "lightning", "training_step")
    f = Finding(rule="missing-zero-grad", code="GD101", severity=Severity.ERROR, message="m",
                location=loc, fix="x")
    import io
    import os

    import graddoctor.report

    path = os.path.join(os.path.dirname(graddoctor.report.__file__), "report.schema.json")
    with open(path, encoding="utf-8") as fh:
        schema = json.load(fh)
    location_schema = {**schema["$defs"]["location"], "$defs": schema["$defs"]}
    jsonschema.validate(finding_to_dict(f)["location"], location_schema)
    assert finding_to_dict(f)["location"] == {"path": "train.py", "line": 20, "via": "lightning",
                                              "hook": "training_step"}
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(finding_block(f))
    assert "PyTorch Lightning's own, made for what your training_step returned" in console.export_text()


def test_hook_code_reads_overrides_and_held_functions():
    from graddoctor.location import _hook_code

    def my_loss(outputs, labels, num_items_in_batch=None):
        return outputs

    class Base:
        def compute_loss(self):
            return 0

    class Mine(Base):
        def compute_loss(self):
            return 1

    owner = Mine()
    owner.compute_loss_func = my_loss
    assert _hook_code(owner, "compute_loss") is Mine.compute_loss.__code__
    assert _hook_code(owner, "compute_loss_func") is my_loss.__code__
    assert _hook_code(owner, "training_step") is None
    assert _hook_code(3, "compute_loss_func") is None  # no __dict__


def test_owner_properties_that_raise_are_passed_over(fake):
    torchish, automatic, _, _, user, root = fake

    class Loop(automatic.AutomaticOptimization):  # like a LightningModule outside a Trainer
        def __init__(self, backward):
            self.backward = backward

        @property
        def trainer(self):
            raise RuntimeError("not attached to a Trainer")

    loop = Loop(torchish.backward)
    loc = user.fit(loop, LocationFinder(relative_to=str(root)))
    assert (loc.line, loc.via, loc.hook) == (10, "lightning", "")


def test_a_users_own_clip_gradients_call_keeps_its_line(tmp_path):
    """self.clip_gradients(...) written in the user's configure_gradient_clipping override (or in a
    manual training_step) is the user's call: its line, not the override's def line."""
    site = tmp_path / "lib" / "site-packages"
    torchish = load(site / "faketorch" / "clip.py", """
        def clip_grad_norm_(finder):
            return finder.here(1)
    """)
    module = load(site / "lightning" / "pytorch" / "core" / "module.py", """
        class LightningModule:
            def clip_gradients(self, finder):
                return self.clip(finder)

            def configure_gradient_clipping(self, finder):
                return self.clip_gradients(finder)
    """)
    user = load(tmp_path / "train.py", """
        def make(base, clip):
            class Mine(base):
                def configure_gradient_clipping(self, finder):
                    if finder is not None:
                        return self.clip_gradients(finder)  # line 6

                def training_step(self, finder):
                    return self.clip_gradients(finder)  # line 9
            m = Mine()
            m.clip = clip
            return m

        def fit(module, finder):
            return module.configure_gradient_clipping(finder)  # line 15
    """)
    finder = LocationFinder(relative_to=str(tmp_path))
    mine = user.make(module.LightningModule, torchish.clip_grad_norm_)
    assert (mine.configure_gradient_clipping(finder).line, mine.training_step(finder).line) == (6, 9)
    assert mine.training_step(finder).via == "lightning"
    # the default configure_gradient_clipping (Lightning's own call) still names the user's hook
    default = module.LightningModule()
    default.clip = torchish.clip_grad_norm_
    loc = user.fit(default, finder)
    assert (loc.line, loc.hook) == (15, "")


def test_train_in_eval_mode_fix_in_lightning_terms():
    """Lightning calls model.train() itself: the plain fix ("call model.train() at the start of
    every epoch") is no help against an eval() of the user's in a hook or training_step."""
    rule = find_rule("train-in-eval-mode")
    assert "self.train()" in rule.fix_for("lightning") and "model.train()" in rule.fix_for("transformers")
    assert rule.fix_for("") == rule.fix


def test_scheduler_never_stepped_fix_in_lightning_terms():
    """Lightning steps the schedulers configure_optimizers returns only under automatic
    optimization: the fix names self.lr_schedulers(), not a scheduler variable the user's
    training_step does not hold."""
    rule = find_rule("scheduler-never-stepped")
    assert "self.lr_schedulers().step()" in rule.fix_for("lightning")
    assert rule.fix_for("") == rule.fix and "lr_schedulers" not in rule.fix
