"""ordinal-level-always-on (GD358): the loss wrapper's reading of cumulative level targets,
and the rule over hand-written ``ordinal_shifted`` events pointing at the targets' statement."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import P, only

SLUG = "ordinal-level-always-on"


def _levels(y, shifted):
    ranks = torch.arange(4)
    return ((y[:, None] >= ranks) if shifted else (y[:, None] > ranks)).float()


def _emitted(targets_per_call):
    from graddoctor.instrument.loss_inputs import LossInputWatcher

    class Rec:
        emitted = []

        class progress:
            steps = 0

        def emit_aside(self, made, loc):
            self.emitted.append(made)

        def here(self):
            return None

    watcher = LossInputWatcher.__new__(LossInputWatcher)
    watcher.rec = Rec()
    watcher._value_checks = {}
    watcher._ordinal_done, watcher._ordinal_rows = False, 0
    watcher._ordinal_calls, watcher._ordinal_varies = 0, False
    for t in targets_per_call:
        if not watcher._ordinal_done:
            watcher._ordinal_levels("binary_cross_entropy_with_logits", t)
    return watcher.rec.emitted


def test_levels_built_with_ge_are_seen_after_enough_rows():
    torch.manual_seed(0)
    calls = [_levels(torch.randint(0, 5, (128,)), shifted=True) for _ in range(3)]
    assert _emitted(calls[:1]) == []  # one call: a rare lowest rank could be missing
    assert _emitted(calls) == [ev.ordinal_shifted(fn="binary_cross_entropy_with_logits",
                                                  levels=4, rows=256)]


def test_correct_levels_multi_label_and_soft_targets_are_not():
    torch.manual_seed(0)
    assert _emitted([_levels(torch.randint(0, 5, (128,)), shifted=False) for _ in range(3)]) == []
    tags = torch.stack([torch.ones(128), torch.zeros(128), (torch.rand(128) > 0.5).float()], 1)
    assert _emitted([tags] * 3) == []  # ones after a zero: no prefix, no ordinal encoding
    soft = _levels(torch.randint(0, 5, (128,)), shifted=True) * 0.9 + 0.05
    assert _emitted([soft] * 3) == []


def test_the_finding_points_at_the_targets_statement(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("import torch\n"
                    "crit = torch.nn.BCEWithLogitsLoss()\n"
                    "for x, y in loader:\n"
                    "    levels = (y[:, None] >= torch.arange(4)[None, :]).float()\n"
                    "    loss = crit(model(x), levels)\n"
                    "    loss.backward()\n")
    t = TraceBuilder(str(path))
    t.optimizer(0, P, line=2)
    t.put(ev.ordinal_shifted(fn="binary_cross_entropy_with_logits", levels=4, rows=256), 5)
    t.backward(fresh=P, line=6)
    t.step(line=6)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 4
    assert [r.location.line for r in f.related] == [5]
    assert f.fix.startswith("`levels = (y[:, None] > torch.arange(4)[None, :]).float()`")
