"""dropout-keep-probability (GD133): hand-written traces of a dropout layer seen in training
forwards (``mode_module``, ``mode_forward``) over a script written to a temporary folder."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.trace import TraceBuilder

SLUG = "dropout-keep-probability"


def _check(tmp_path, script: str, p: float, training=True, forwards=3):
    (tmp_path / "train.py").write_text(script)
    t = TraceBuilder()
    t.optimizer(0, [0], line=1)
    t.put(ev.mode_module(mid=0, name="model.drop", cls="Dropout", layer="dropout",
                         has_params=False, frozen=None, owned=None, trainable=None, updated=False,
                         track_running_stats=None, momentum=None, p=p))
    for _ in range(forwards):
        t.put(ev.mode_forward(training=training, grad=training, inference=False, modules=[0],
                              grad_modules=[0]), 3)
        t.backward(fresh=[0], line=4)
        t.step(line=4)
    return list(find_rule(SLUG)().check(Analysis(t.trace, base_dir=str(tmp_path))))


LAYER = "keep_prob = 0.9\ndrop = nn.Dropout({rate})\nout = model(x)\nloss.backward()\n"


def test_a_keep_probability_given_as_the_rate_is_a_warning_at_the_construction(tmp_path):
    found = _check(tmp_path, LAYER.format(rate="keep_prob"), 0.9)
    assert len(found) == 1 and found[0].severity is Severity.WARNING
    assert found[0].location.line == 2 and "`1 - keep_prob`" in found[0].fix
    # a keep probability of 0.7 given as the rate drops 70%: still the bug
    assert _check(tmp_path, LAYER.format(rate="p=keep_prob"), 0.7)[0].severity is Severity.WARNING


def test_a_very_high_rate_is_an_info(tmp_path):
    found = _check(tmp_path, LAYER.format(rate="0.9"), 0.9)
    assert len(found) == 1 and found[0].severity is Severity.INFO


def test_silent_on_usual_rates_converted_keep_probabilities_and_layers_never_trained(tmp_path):
    assert _check(tmp_path, LAYER.format(rate="0.5"), 0.5) == []
    assert _check(tmp_path, LAYER.format(rate="0.7"), 0.7) == []
    assert _check(tmp_path, LAYER.format(rate="1 - keep_prob"), 0.1) == []
    assert _check(tmp_path, LAYER.format(rate="keep_prob"), 0.5) == []  # drops half either way
    assert _check(tmp_path, LAYER.format(rate="0.9"), 0.9, training=False) == []


def test_functional_dropout_with_a_high_literal_rate_in_forward(tmp_path):
    script = ("class Net(nn.Module):\n    def forward(self, x):\n"
              "        return F.dropout(x, 0.85, self.training)\n"
              "def other(x):\n    return F.dropout(x, 0.9)\n")
    found = _check(tmp_path, script, 0.1)  # no dropout layer with a high rate
    assert [f.location.line for f in found] == [3] and found[0].severity is Severity.INFO


SMOOTHED = ("criterion = nn.CrossEntropyLoss(label_smoothing={value})\nconfidence = 0.8\n"
            "loss = criterion(out, y)\nloss2 = F.cross_entropy(out, y, label_smoothing=confidence)\n")


def _smoothing(tmp_path, smoothing: float, line: int, classes=5):
    (tmp_path / "train.py").write_text(SMOOTHED.format(value=smoothing))
    t = TraceBuilder()
    t.optimizer(0, [0], line=1)
    t.put(ev.smoothing_high(label_smoothing=smoothing, classes=classes), line)
    t.backward(fresh=[0], line=4)
    t.step(line=4)
    return list(find_rule(SLUG)().check(Analysis(t.trace, base_dir=str(tmp_path))))


def test_a_label_smoothing_given_as_a_confidence_is_a_warning_at_the_construction(tmp_path):
    (f,) = _smoothing(tmp_path, 0.9, line=3)
    assert f.severity is Severity.WARNING and f.location.line == 1
    assert "0.28" in f.message and "label_smoothing=0.1" in f.fix
    (g,) = _smoothing(tmp_path, 0.8, line=4)  # the functional call that passes it
    assert g.location.line == 4 and "1 - confidence" in g.fix
