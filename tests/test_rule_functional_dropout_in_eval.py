"""functional-dropout-in-eval (GD304) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from aside_traces import check, dropout, update
from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.rules.functional_dropout_in_eval import FunctionalDropoutInEval
from graddoctor.trace import TraceBuilder


def test_dropout_default_in_eval_is_reported_at_the_call():
    t = TraceBuilder()
    t.optimizer(0, [0])
    update(t, 20)
    t.event("eval", 30, mode=False, leaf=False, root="MLP", frozen=False, modules=[], calls=1)
    dropout(t, 15)
    [f] = check(FunctionalDropoutInEval, t)
    assert (f.location.line, f.severity, f.step) == (15, Severity.WARNING, 1)
    assert "F.dropout" in f.message and "30%" in f.message and "model (MLP) is in eval mode" in f.message
    assert f.evidence == {"function": "dropout", "p": 0.3, "module": "model", "class": "MLP", "grad": False,
                          "how": "default"}


def test_dropout_without_a_name_names_the_class_and_each_line_once():
    t = TraceBuilder()
    dropout(t, 15, name=None, cls="Block", fn="dropout2d", p=0.1)
    dropout(t, 40, name="net.head", cls="Head")
    found = check(FunctionalDropoutInEval, t)
    assert [f.location.line for f in found] == [15, 40]
    assert "F.dropout2d" in found[0].message and "although Block is in eval mode" in found[0].message
    assert found[0].step is None  # before any step


def test_no_dropout_event_no_finding():
    t = TraceBuilder()
    t.optimizer(0, [0])
    update(t, 20)
    assert check(FunctionalDropoutInEval, t) == []


def test_a_gradient_enabled_pass_in_eval_mode_says_so():
    t = TraceBuilder()
    dropout(t, 15, grad=True)
    [f] = check(FunctionalDropoutInEval, t)
    assert "gradient-enabled pass" in f.message and f.evidence["grad"] is True


def test_each_way_of_dropping_names_its_cause_and_its_own_fix():
    t = TraceBuilder()
    dropout(t, 10, fn="scaled_dot_product_attention", how="sdpa", p=0.1, name="model.attn",
            cls="SelfAttention")
    dropout(t, 20, fn="nn.Dropout", how="unregistered", p=0.5, cls="Classifier")
    dropout(t, 30, fn="torch.dropout", how="explicit", p=0.1)
    dropout(t, 40, fn="alpha_dropout", how="explicit", p=0.1)
    sdpa, module, torch_fn, alpha = check(FunctionalDropoutInEval, t)
    assert "dropout_p=0.1" in sdpa.message and "SDPA has no training argument" in sdpa.message
    assert "if self.training else 0.0" in sdpa.fix
    assert "no submodule of model" in module.message and "model.eval() never reaches it" in module.message
    assert "__init__" in module.fix and "nn.ModuleList" in module.fix
    assert torch_fn.message.startswith("torch.dropout here is called with training true")
    assert alpha.message.startswith("F.alpha_dropout here") and "mc_dropout" in alpha.fix
    assert {f.evidence["how"] for f in (sdpa, module, torch_fn, alpha)} == {"sdpa", "unregistered", "explicit"}
    assert all(f.severity == Severity.WARNING for f in (sdpa, module, torch_fn, alpha))


def test_the_words_that_say_monte_carlo_dropout_is_meant():
    from graddoctor.instrument.dropout import MC_WORDS, words

    assert words("MCDropoutNet") == {"mc", "dropout", "net"}
    assert words("def predict_with_uncertainty(model, x):") >= {"predict", "uncertainty"}
    for meant in ("mc_predict", "BayesianMLP", "num_samples", "training=self.training or self.mc"):
        assert not words(meant).isdisjoint(MC_WORDS), meant
    for plain in ("Upsample", "sample = next(loader)", "TransformerBlock", "self.use_dropout"):
        assert words(plain).isdisjoint(MC_WORDS), plain


def test_a_default_call_seen_only_in_training_needs_an_eval_call_in_the_source():
    t = TraceBuilder()
    t.put(ev.dropout_default(fn="dropout", p=0.3, cls="MLP", name="model", grad=True, how="default",
                             mode="train"), 15)
    assert check(FunctionalDropoutInEval, t) == []  # no source that evaluates: nothing said


_SCRIPT = """\
import torch
from torch import nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 1)

    def forward(self, x):
        {guard}return self.b(F.dropout(torch.relu(self.a(x)), 0.3))


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
{after}
"""


def _run(tmp_path, guard="", after="model.eval()\nprint(model(torch.randn(2, 4)))"):
    import runpy

    from graddoctor.analysis import Analysis
    from graddoctor.instrument import Instrumentation, Recorder

    path = tmp_path / f"train_dropout_{len(list(tmp_path.iterdir()))}.py"
    path.write_text(_SCRIPT.format(guard=guard, after=after))
    rec = Recorder(step_budget=2)
    try:
        with Instrumentation(rec):
            runpy.run_path(str(path), run_name="__main__")
    except BaseException:
        pass  # the step budget ends the run before model.eval()
    return list(FunctionalDropoutInEval().check(Analysis(rec.trace)))


def test_a_run_cut_before_model_eval_reports_the_default_call(tmp_path):
    [f] = _run(tmp_path)
    assert f.location.line == 12 and "`model.eval()` (line 21)" in f.message
    assert f.evidence["mode"] == "train"


def test_no_eval_call_or_a_mode_guard_keeps_it_silent(tmp_path):
    assert _run(tmp_path, after="print(1)") == []
    guard = "if self.training:\n            return self.b(F.dropout(torch.relu(self.a(x)), 0.3))\n        "
    assert _run(tmp_path, guard=guard) == []
