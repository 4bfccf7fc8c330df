"""optimizer-group-frozen (GD145): a param group given at construction holding only parameters
that do not require grad and never get a gradient, in a script that freezes nothing itself."""

from __future__ import annotations

import textwrap

import pytest

from graddoctor.findings import Severity
from graddoctor.options import CheckOptions
from graddoctor.run.session import run_check

SLUG = "optimizer-group-frozen"

SCRIPT = """
import torch
import torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
emb = nn.Embedding.from_pretrained(torch.randn(20, 4){kw})
head = nn.Linear(4, 2)
{extra}
optimizer = torch.optim.SGD({groups}, lr=0.1)
t, y = torch.randint(0, 20, (8, 3)), torch.randint(0, 2, (8,))
for step in range(6):
    optimizer.zero_grad()
    F.cross_entropy(head(emb(t).mean(1)), y).backward()
    optimizer.step()
"""

OWN = '[{"params": emb.parameters(), "lr": 0.01}, {"params": head.parameters()}]'


def _check(tmp_path, kw="", groups=OWN, extra=""):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(kw=kw, groups=groups, extra=extra)))
    report = run_check(CheckOptions(target=str(script)))
    return [f for f in report.findings if f.rule == SLUG]


def test_a_from_pretrained_table_in_its_own_group_is_a_warning_at_the_table(tmp_path):
    (f,) = _check(tmp_path)
    assert f.severity is Severity.WARNING and f.location.line == 6
    assert "freeze=False" in f.fix and "a param group of its own" in f.message
    assert f.evidence["params"] == ["emb.weight"]


@pytest.mark.parametrize("kw, groups, extra", [
    (", freeze=False", OWN, ""),  # fine-tuned as meant
    (", freeze=True", OWN, ""),  # frozen on purpose, written out
    ("", "list(emb.parameters()) + list(head.parameters())", ""),  # one group with trainable ones
    ("", OWN, "emb.weight.requires_grad_(False)"),  # the script freezes itself
    ("", OWN, "# the comment says: freeze nothing\ndef unfreeze(m): pass"),  # an unfreeze helper
])
def test_silent(tmp_path, kw, groups, extra):
    assert _check(tmp_path, kw, groups, extra) == []
