"""averaged-copy-stale-norms (GD281): the copy's BatchNorm statistics against the model's
(instrument/copies.py) and the rule on small scripts run in process."""

from __future__ import annotations

import copy
import textwrap

import torch
from torch import nn

from graddoctor.findings import Severity
from graddoctor.instrument.copies import _norm_pairs, _stale_norms
from graddoctor.options import CheckOptions
from graddoctor.run.session import run_check

SLUG = "averaged-copy-stale-norms"


def _nets():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))
    return model, copy.deepcopy(model)


def test_a_copy_whose_statistics_stay_while_the_models_move_is_stale():
    model, ema = _nets()
    norms = _norm_pairs(ema, model, "ema")
    model(torch.randn(8, 4) + 3)  # train mode: the model's statistics move
    assert _stale_norms(norms) == ["ema.1"]


def test_a_copy_given_the_models_buffers_or_run_in_train_mode_is_not():
    model, ema = _nets()
    norms = _norm_pairs(ema, model, "ema")
    model(torch.randn(8, 4) + 3)
    for b_ema, b in zip(ema.buffers(), model.buffers()):
        b_ema.copy_(b)
    assert _stale_norms(norms) == []
    model, ema = _nets()
    norms = _norm_pairs(ema, model, "ema")
    model(torch.randn(8, 4) + 3)
    ema(torch.randn(8, 4) + 3)  # its own forward in train mode: BYOL's target, MoCo's key encoder
    assert _stale_norms(norms) == []


def test_a_model_whose_statistics_never_moved_tells_nothing():
    model, ema = _nets()
    norms = _norm_pairs(ema, model, "ema")
    assert _stale_norms(norms) == []


SCRIPT = """
    import copy
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    ema = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        x, y = torch.randn(16, 6) + 1, torch.randint(0, 2, (16,))
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.mul_(0.9).add_(p, alpha=0.1)
            {buffers}
"""


def _check(tmp_path, buffers="pass"):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.replace("{buffers}", buffers)))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule == SLUG]


def test_an_ema_over_parameters_only_is_a_warning_at_its_loop(tmp_path):
    (f,) = _check(tmp_path)
    assert f.severity is Severity.WARNING and f.location.line == 18
    assert f.evidence["stale_norms"] == ["ema.1"] and "state_dict" in f.fix


def test_an_ema_that_copies_the_buffers_too_is_silent(tmp_path):
    assert _check(tmp_path, "for e, b in zip(ema.buffers(), model.buffers()): e.copy_(b)") == []
