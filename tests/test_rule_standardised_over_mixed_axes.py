"""standardised-over-mixed-axes (GD330): scripts written to a temporary folder with a backward
event on their loop's line (the rule reads the standardisations in the source), and the source
reading on its own."""

from __future__ import annotations

import ast
import textwrap

from graddoctor.findings import Severity
from graddoctor.rules.standardised_over_mixed_axes import mixed_axes_standardisations
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "standardised-over-mixed-axes"

SCRIPT = """\
import numpy as np
import torch
mean = X.mean(axis=0)
std = X.std()
x = torch.tensor((X - mean) / std)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    loss = model(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _script(tmp_path, text=SCRIPT):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _trace(path):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=6)
    for _ in range(4):
        t.backward(fresh=P, line=9)
        t.step(line=9)
    return t


def _found(text):
    return [(line, kind, axis, other, call)
            for line, _, kind, axis, other, call in mixed_axes_standardisations(ast.parse(textwrap.dedent(text)))]


def test_a_global_std_against_a_per_feature_mean_is_a_warning_at_the_std(tmp_path):
    f = only(_trace(_script(tmp_path)), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 4
    assert "standard deviation over every element and a mean over axis 0" in f.message
    assert f.fix.endswith("`X.std(axis=0)`")


def test_statistics_over_the_same_axes_are_silent(tmp_path):
    text = SCRIPT.replace("X.std()", "X.std(axis=0)")
    assert findings(_trace(_script(tmp_path, text)), SLUG) == []


def test_each_form_of_a_statistic_is_read():
    assert _found("z = (x - x.mean(0)) / x.std()") == [(1, "scale", None, (0,), "x.std(0)")]
    assert _found("z = (x - x.mean()) / x.std(dim=0)") == [(1, "centre", None, (0,), "x.mean(dim=0)")]
    assert _found("m, s = np.mean(a, axis=0), np.std(a)\nz = (a - m) / (s + 1e-8)") == \
        [(1, "scale", None, (0,), "np.std(a, axis=0)")]
    assert _found("m = t.mean(dim=1, keepdim=True)\ns = torch.sqrt(t.var(dim=0))\nz = (t - m) / s") == \
        [(2, "scale", (0,), (1,), "t.var(dim=1)")]
    assert _found("z = (x - x.mean(axis=(0, 2, 3))) / x.std(axis=(3, 2, 0))") == []
    assert _found("z = (x - x.mean()) / x.std()") == []
    assert _found("z = (v - x.mean(0)) / v.std()") == []  # two arrays: not this rule's
    assert _found("z = (x - m) / s") == []  # names never bound to statistics


def test_a_pandas_script_keeps_an_axis_less_statistic_against_axis_0():
    assert _found("import pandas as pd\nz = (df - df.mean()) / df.std(axis=0)") == []
    assert _found("import pandas as pd\nz = (df - df.mean(axis=1)) / df.std(axis=0)") != []
    assert _found("z = (df - df.mean()) / df.std(axis=0)") != []
