"""mc-samples-in-eval-mode (GD371): the source search for Monte Carlo dropout passes run after
model.eval(), and the rule over a trace whose backward names the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.mc_samples_in_eval_mode import eval_mode_samples
from graddoctor.trace import TraceBuilder

SLUG = "mc-samples-in-eval-mode"
MODEL = "model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1))\n"


def _found(src: str):
    return eval_mode_samples(ast.parse(MODEL + src))


def test_passes_after_eval_are_found_at_the_eval():
    assert _found("model.eval()\nps = torch.stack([model(x) for _ in range(9)])\n") == [(2, "model", 3)]
    loop = "model.eval()\nout = []\nfor i in range(9):\n    out.append(model(x))\n"
    assert _found(loop) == [(2, "model", 5)]
    # two eval() calls before one sampling: the later one is the line to change
    twice = "model.eval()\ny = model(v)\nmodel.eval()\nps = [model(x) for _ in range(3)]\n"
    assert _found(twice) == [(4, "model", 5)]


def test_right_sampling_stays_silent():
    for src in (
        "model.eval()\nfor m in model.modules():\n    m.train()\nps = [model(x) for _ in range(9)]\n",
        "model.train()\nps = [model(x) for _ in range(9)]\n",
        "model.eval()\nps = [model(x[i]) for i in range(9)]\n",                # other inputs
        "model.eval()\nps = [model(x, mc=True) for _ in range(9)]\n",           # asks to sample
        "def on(m):\n    m.train()\nmodel.eval()\non(model)\nps = [model(x) for _ in range(9)]\n",
        "model.eval()\ny = model(x)\n",                                          # one pass
    ):
        assert _found(src) == [], src
    noisy = "class L(nn.Module):\n    def forward(self, x):\n        return x + torch.randn_like(x)\n"
    assert _found(noisy + "model.eval()\nps = [model(x) for _ in range(9)]\n") == []
    assert eval_mode_samples(ast.parse("model.eval()\nps = [model(x) for _ in range(9)]\n")) == []


def test_a_training_flag_written_directly_switches_dropout_on():
    # `m.training = True` is what `.train()` sets: the passes below sample
    direct = "model.eval()\nfor m in model.modules():\n    m.training = True\nps = [model(x) for _ in range(9)]\n"
    assert _found(direct) == []
    helper = "def mc_on(m):\n    m.training = True\nmodel.eval()\nmodel.apply(mc_on)\nps = [model(x) for _ in range(9)]\n"
    assert _found(helper) == []
    # `.train(False)` and `training = False` are eval(): the passes are still copies
    off = "model.eval()\nmodel.train(False)\nps = [model(x) for _ in range(9)]\n"
    assert _found(off) == [(2, "model", 4)]
    flag_off = "model.eval()\nfor m in model.modules():\n    m.training = False\nps = [model(x) for _ in range(9)]\n"
    assert _found(flag_off) == [(2, "model", 5)]


def test_the_finding_is_a_warning_at_the_eval(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(MODEL + "loss.backward()\nmodel.eval()\nps = [model(x) for _ in range(9)]\n")
    t = TraceBuilder(str(script))
    t.backward(line=2)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [3]
    assert found[0].severity is Severity.WARNING
