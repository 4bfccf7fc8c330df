"""dropout-on-output (GD160): the ``dropout_on_output`` event of instrument/dropoutout.py for a
loss whose prediction is a dropout module's output, the graph walk it judges with, and the
rule's finding and its line."""

from __future__ import annotations

import textwrap

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.dropoutout import loss_predictions
from graddoctor.rules.dropout_on_output import _rate
from graddoctor.trace import Location
from rule_traces import builder, findings, only

SLUG = "dropout-on-output"


def test_the_event_is_a_warning_at_the_dropouts_line():
    t = builder()
    t.put(ev.dropout_on_output(module="Dropout", p=0.5, fn="cross_entropy", direct=True), 9)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 9
    assert f.evidence == {"module": "Dropout", "p": 0.5, "fn": "cross_entropy"}
    assert "50% of the logits" in f.message and "before the last layer" in f.fix
    assert findings(builder(), SLUG) == []


def test_a_model_call_moves_to_the_one_construction_with_that_rate(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2),
                              nn.Linear(8, 2), nn.Dropout(p=0.25))
        loss = F.mse_loss(model(x), y)
        """))
    t = builder()
    t.trace.put(ev.dropout_on_output(module="Dropout", p=0.25, fn="mse_loss", direct=False),
                Location(str(script), 3, "<module>"))
    f = only(t, SLUG)
    assert f.location.line == 2 and "`nn.Dropout(p=0.25)`" in f.message
    t = builder()
    t.trace.put(ev.dropout_on_output(module="Dropout", p=0.25, fn="mse_loss", direct=True),
                Location(str(script), 3, "forward"))
    assert only(t, SLUG).location.line == 3  # the user's own call of the dropout: the fix's place


def test_rate_reads_a_literal_rate_only():
    assert _rate("nn.Dropout(0.5)") == 0.5 and _rate("nn.Dropout(p=0.3, inplace=True)") == 0.3
    assert _rate("nn.Dropout(cfg.rate)") is None and _rate("nn.Dropout()") is None


def test_loss_predictions_see_past_log_softmax_reshapes_and_loss_sums():
    x = torch.randn(4, 3, requires_grad=True)
    made = x * 2
    loss = F.cross_entropy(made.reshape(2, 2, 3).reshape(-1, 3), torch.randint(0, 3, (4,))) \
        + 0.5 * F.mse_loss(made[:, 0], torch.zeros(4))
    found = loss_predictions(loss.grad_fn)
    assert sorted(fn for fn, _ in found) == ["cross_entropy", "mse_loss"]
    assert all(type(node).__name__ == "MulBackward0" for _, node in found)
    hidden = torch.tanh(made)  # a layer between: the prediction is the tanh, not the product
    assert [type(n).__name__ for _, n in loss_predictions(F.mse_loss(hidden, x.detach()).grad_fn)] \
        == ["TanhBackward0"]


def _events(model) -> list[dict]:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(2):
            loss = F.cross_entropy(model(torch.randn(8, 6)), torch.randint(0, 3, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [dict(e.data) for e in rec.trace.of_kind("dropout_on_output")]


def test_the_watcher_notes_a_dropout_after_the_last_layer_only():
    assert _events(nn.Sequential(nn.Linear(6, 3), nn.Dropout(0.4))) == \
        [{"module": "Dropout", "p": 0.4, "fn": "cross_entropy", "direct": False}]
    linear, drop = nn.Linear(6, 3), nn.Dropout(0.4)

    class Direct(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear, self.drop = linear, drop

        def forward(self, x):
            return self.drop(self.linear(x))

    assert _events(Direct())[0]["direct"] is True
    assert _events(nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.4), nn.Linear(8, 3))) == []
    assert _events(nn.Sequential(nn.Linear(6, 3), nn.Dropout(0.0))) == []
