"""mean-pools-padding (GD408): the ``padding_pooled`` event of instrument/padmask.py for a mean
over the token axis of a padded batch with no mask of the padding below it, the source lookup of
that mean, and the rule on small scripts run in process."""

from __future__ import annotations

import ast
import textwrap

import pytest

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.options import CheckOptions
from graddoctor.rules.mean_pools_padding import token_means
from graddoctor.run.session import run_check
from rule_traces import builder, findings, only

SLUG = "mean-pools-padding"

SCRIPT = """\
import torch
from torch import nn

torch.manual_seed(0)
PAD = 0
embed = nn.Embedding(30, 8, padding_idx=PAD)
rnn = nn.GRU(8, 8, batch_first=True)
head = nn.Linear(8, 2)
opt = torch.optim.SGD([*embed.parameters(), *rnn.parameters(), *head.parameters()], lr=0.1)
for step in range(4):
    lengths = torch.tensor([5, 3, 2, 4, 5, 1])
    tokens = torch.randint(1, 30, (6, 5))
    tokens[torch.arange(5)[None, :] >= lengths[:, None]] = {fill}
    h = {features}
    keep = (tokens != PAD).unsqueeze(-1).float()
    pooled = {pool}
    loss = nn.functional.cross_entropy(head(pooled), lengths % 2)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _run(tmp_path, pool: str, features: str = "rnn(embed(tokens))[0]", fill: str = "PAD"):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(pool=pool, features=features, fill=fill))
    report = run_check(CheckOptions(target=str(script)))
    assert not report.internal_errors, report.internal_errors
    return [f for f in report.findings if f.rule == SLUG]


@pytest.mark.parametrize("pool, features", [
    ("h.mean(1)", "rnn(embed(tokens))[0]"),
    ("torch.mean(h, dim=1)", "rnn(embed(tokens))[0]"),
    ("h.mean(dim=-2)", "torch.tanh(embed(tokens) + 1.0)"),
])
def test_a_mean_over_the_padded_positions_is_found_at_the_mean(tmp_path, pool, features):
    found = _run(tmp_path, pool, features)
    assert len(found) == 1 and found[0].severity is Severity.WARNING
    assert found[0].location.line == 16
    assert "(h * keep).sum(" in found[0].fix and "pad id 0" in found[0].message


@pytest.mark.parametrize("pool, features, fill", [
    ("(h * keep).sum(1) / keep.sum(1)", "rnn(embed(tokens))[0]", "PAD"),  # a masked mean
    ("(h * keep).mean(1) * 5 / lengths[:, None]", "rnn(embed(tokens))[0]", "PAD"),  # masked
    ("h.masked_fill(keep == 0, 0.0).mean(1)", "rnn(embed(tokens))[0]", "PAD"),  # filled
    ("h.mean(1)", "embed(tokens) * 2.0", "PAD"),  # zero rows of padding_idx: a scale only
    ("h.mean(2)", "rnn(embed(tokens))[0].transpose(1, 2)", "PAD"),  # channels-first: not read
    ("h[:, 0]", "rnn(embed(tokens))[0]", "PAD"),
    ("h.mean(1)", "rnn(embed(tokens))[0]", "torch.randint(1, 30, (6, 5))"),  # no padding
])
def test_masked_scaled_or_unpadded_means_stay_silent(tmp_path, pool, features, fill):
    assert _run(tmp_path, pool, features, fill) == []


def test_the_means_the_source_shows():
    tree = ast.parse(textwrap.dedent("""
        a = h.mean(1)
        b = torch.mean(states, dim=1)
        c = x.mean(-1)
        d = out.last_hidden_state.mean(dim=1)
        e = y.mean(0)
    """))
    assert token_means(tree, "batch-first") == [(2, "h"), (3, "states"),
                                                (5, "out.last_hidden_state")]
    assert token_means(tree, "length-first") == [(6, "y")]


def test_the_event_without_source_is_reported_at_the_backward_once_per_location():
    t = builder()
    t.put(ev.padding_pooled(fill=0, rows=8, shape=[8, 12], padded=0.4, axis="batch-first"), 21)
    t.put(ev.padding_pooled(fill=0, rows=8, shape=[8, 10], padded=0.3, axis="batch-first"), 21)
    f = only(t, SLUG)
    assert f.location.line == 21 and "8×12" in f.message and f.evidence["padded"] == 0.4


def test_no_event_no_finding():
    t = builder()
    t.put(ev.padding_kept(op="mul", fill=0, rows=8, shape=[8, 12], kept=0.4), 21)
    assert findings(t, SLUG) == []
