"""mask-keeps-padding (GD332): the ``padding_kept`` event of instrument/padmask.py for a 0/1
mask that keeps exactly the padded positions of a token batch, the source lookup of the
comparison that makes it, and the rule on small scripts run in process."""

from __future__ import annotations

import ast
import textwrap

import pytest
import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.padmask import _as_kept
from graddoctor.options import CheckOptions
from graddoctor.rules.mask_keeps_padding import flipped, padding_comparisons
from graddoctor.run.session import run_check
from rule_traces import builder, only

SLUG = "mask-keeps-padding"

SCRIPT = """\
import torch
from torch import nn

torch.manual_seed(0)
PAD = 0
embed = nn.Embedding(30, 8, padding_idx=PAD)
head = nn.Linear(8, 2)
opt = torch.optim.SGD([*embed.parameters(), *head.parameters()], lr=0.1)
for step in range(4):
    lengths = torch.tensor([5, 3, 2, 4, 5, 1])
    tokens = torch.randint(1, 30, (6, 5))
    tokens[torch.arange(5)[None, :] >= lengths[:, None]] = PAD
    h = embed(tokens)
    mask = {mask}
    pooled = {pool}
    loss = nn.functional.cross_entropy(head(pooled), lengths % 2)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _run(tmp_path, mask: str, pool: str):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(mask=mask, pool=pool))
    report = run_check(CheckOptions(target=str(script)))
    assert not report.internal_errors, report.internal_errors
    return [f for f in report.findings if f.rule == SLUG]


@pytest.mark.parametrize("mask, pool", [
    ("torch.arange(5)[None, :] >= lengths[:, None]", "(h * mask.unsqueeze(-1)).sum(1) / lengths[:, None]"),
    ("(tokens == PAD).float()", "(h * mask[..., None]).sum(1)"),
    ("tokens.ne(PAD)", "h.masked_fill(mask.unsqueeze(-1), 0.0).sum(1)"),
])
def test_a_mask_of_the_padding_is_found_at_its_comparison(tmp_path, mask, pool):
    found = _run(tmp_path, mask, pool)
    assert len(found) == 1 and found[0].severity is Severity.WARNING
    assert found[0].location.line == 14
    assert "keep the real tokens" in found[0].fix


@pytest.mark.parametrize("mask, pool", [
    ("torch.arange(5)[None, :] < lengths[:, None]", "(h * mask.unsqueeze(-1)).sum(1) / lengths[:, None]"),
    ("(tokens != PAD).float()", "(h * mask[..., None]).sum(1)"),
    ("tokens.eq(PAD)", "h.masked_fill(mask.unsqueeze(-1), 0.0).sum(1)"),
    ("torch.rand(6, 5) < 0.5", "(h * mask.unsqueeze(-1)).sum(1)"),
])
def test_a_mask_of_the_words_stays_silent(tmp_path, mask, pool):
    assert _run(tmp_path, mask, pool) == []


def test_as_kept_reads_products_and_fills():
    padding = torch.tensor([[False, True], [False, False]])
    assert torch.equal(_as_kept(padding.float().unsqueeze(-1), "mul", (2, 2)), padding)
    assert torch.equal(_as_kept(~padding, "masked_fill", (2, 2)), padding)
    assert _as_kept(torch.tensor([[0.5, 1.0], [0.0, 1.0]]), "mul", (2, 2)) is None
    assert _as_kept(padding.float().requires_grad_(), "mul", (2, 2)) is None
    assert _as_kept(padding, "mul", (2, 3)) is None


def test_the_comparisons_the_source_shows_and_their_flip():
    tree = ast.parse(textwrap.dedent("""
        keep = arange(T)[None] >= lengths[:, None]
        other = x > 3
        y = (h * keep.unsqueeze(-1)).sum(1)
        z = h.masked_fill(tokens.ne(PAD)[..., None], 0)
    """))
    muls = padding_comparisons(tree, "mul")
    assert [(line, text) for line, text, _ in muls] == [(2, "keep = arange(T)[None] >= lengths[:, None]")]
    assert flipped(muls[0][2]) == "arange(T)[None] < lengths[:, None]"
    fills = padding_comparisons(tree, "masked_fill")
    assert [line for line, _, _ in fills] == [5] and flipped(fills[0][2]) == "tokens.eq(PAD)"


def test_the_event_without_source_is_reported_at_the_backward():
    t = builder()
    t.put(ev.padding_kept(op="mul", fill=0, rows=8, shape=[8, 12], kept=0.4), 21)
    f = only(t, SLUG)
    assert f.location.line == 21 and "pad id 0" in f.message and f.evidence["kept"] == 0.4
