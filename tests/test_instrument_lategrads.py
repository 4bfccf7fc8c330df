"""The late-gradient sweep (instrument/lategrads.py): a parameter unfrozen with
``p.requires_grad = True`` after the backward line's graph walks is tracked at the next sweep,
so param-not-in-optimizer sees the gradients no optimizer owns."""

from __future__ import annotations

import textwrap

from graddoctor.api import check_script
from graddoctor.instrument import lategrads

UNFROZEN_AT_STEP = """
import torch
from torch import nn

def main():
    torch.manual_seed(0)
    body, head = nn.Linear(6, 6), nn.Linear(6, 2)
    body.weight.requires_grad = False
    body.bias.requires_grad = False
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    x, y = torch.randn(8, 6), torch.randint(0, 2, (8,))
    for step in range(9):
        if step == {unfreeze}:
            body.weight.requires_grad = True
            body.bias.requires_grad = True
        opt.zero_grad()
        nn.functional.cross_entropy(head(body(x)), y).backward()
        opt.step()

main()
"""


def _unowned(tmp_path, unfreeze: int):
    script = tmp_path / "unfrozen.py"
    script.write_text(textwrap.dedent(UNFROZEN_AT_STEP.format(unfreeze=unfreeze)))
    report = check_script(script, config=False)
    return [f for f in report.findings if f.rule == "param-not-in-optimizer"]


def test_parameters_unfrozen_after_the_walks_are_found_and_named_from_the_function(tmp_path):
    # the line's graph is walked at its first 3 backwards; unfrozen at the 6th, only the sweep
    # after the 6th step sees the gradient
    [finding] = _unowned(tmp_path, unfreeze=5)
    assert finding.location.line == 10
    assert finding.evidence["cause"] == "gradients-after-optimizer"
    assert sorted(finding.evidence["params"]) == ["body.bias", "body.weight"]


def test_without_the_sweep_nothing_is_seen(tmp_path, monkeypatch):
    monkeypatch.setattr(lategrads.LateGradWatcher, "_sweep", lambda self: None)
    assert _unowned(tmp_path, unfreeze=5) == []


def test_the_sweep_runs_at_every_step_then_at_doubling_counts():
    class Rec:
        def __init__(self):
            self.subscribed = []

        def subscribe(self, topic, fn):
            self.subscribed.append(topic)

    watcher = lategrads.LateGradWatcher(Rec())
    swept = []
    watcher._sweep = lambda: swept.append(watcher._steps)
    watcher._gather = lambda: None
    for _ in range(100):
        watcher.after_step(0, None)
    assert swept == [*range(1, lategrads.EVERY_STEP_UNTIL + 1), 32, 64]
