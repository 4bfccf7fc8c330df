"""prompt-mask-inverted (GD196): the judgement over targets and token batches, the statement
found in the script's text, hand-written traces, and the watcher in-process."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.analysis.promptlines import mask_line
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.promptmask import prompt_trained
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "prompt-mask-inverted"
ROWS, T, PAD = 6, 12, 0


def sft_batch(inverted: bool, pad: bool = True):
    """(ids, labels): prompts of 3-5 tokens, responses after them, right padding with PAD."""
    g = torch.Generator().manual_seed(0)
    prompt_len = torch.randint(3, 6, (ROWS,), generator=g)
    length = prompt_len + torch.randint(4, 7, (ROWS,), generator=g)
    positions = torch.arange(T)[None, :]
    ids = torch.randint(1, 30, (ROWS, T), generator=g)
    if pad:
        ids[positions >= length[:, None]] = PAD
    labels = ids.clone()
    prompt = positions < prompt_len[:, None]
    labels[~prompt if inverted else prompt] = -100
    labels[ids == PAD] = -100
    return ids, labels


def test_an_inverted_mask_is_seen_with_shifted_flat_targets():
    ids, labels = sft_batch(inverted=True)
    found = prompt_trained(ids, [PAD], labels[:, 1:].reshape(-1), -100)
    assert found is not None and found["inverted_rows"] == ROWS and found["offset"] == 1


def test_an_inverted_mask_is_seen_unshifted_and_unpadded():
    ids, labels = sft_batch(inverted=True, pad=False)
    found = prompt_trained(ids, [], labels, -100)
    assert found is not None and found["offset"] == 0


def test_the_prompt_masked_at_the_start_is_silent():
    ids, labels = sft_batch(inverted=False)
    assert prompt_trained(ids, [PAD], labels[:, 1:].reshape(-1), -100) is None
    assert prompt_trained(ids, [PAD], labels, -100) is None


def test_padding_alone_at_the_end_is_silent_even_without_a_known_pad():
    ids, labels = sft_batch(inverted=False)
    labels = ids.masked_fill(ids == PAD, -100)  # no prompt mask: plain padded LM
    assert prompt_trained(ids, [], labels, -100) is None


def test_the_last_position_masked_is_silent():
    ids = torch.randint(1, 30, (ROWS, T))
    labels = torch.roll(ids, -1, 1)
    labels[:, -1] = -100
    assert prompt_trained(ids, [], labels, -100) is None


def test_targets_that_are_not_the_tokens_are_silent():
    ids, labels = sft_batch(inverted=True)
    other = torch.randint(1, 30, ids.shape)
    assert prompt_trained(other, [PAD], labels, -100) is None


def test_a_few_inverted_rows_are_not_enough():
    ids, labels = sft_batch(inverted=False)
    bad_ids, bad_labels = sft_batch(inverted=True)
    labels[:1] = bad_labels[:1]
    assert prompt_trained(ids, [PAD], labels, -100) is None


def test_the_event_is_a_warning_at_the_loss_line_without_a_script():
    t = TraceBuilder()
    t.put(ev.prompt_trained(fn="cross_entropy", ignore_index=-100, rows=8, inverted_rows=8,
                            offset=1, kept=4.5, ignored_real=7.0), 21)
    f = only(t, SLUG)
    assert f.location.line == 21 and "8 of 8 rows" in f.message and "prompt" in f.fix


def test_no_event_no_finding():
    assert findings(TraceBuilder(), SLUG) == []


def test_the_statement_that_masks_by_prompt_and_response_is_found(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "IGNORE = -100\n"
        "def collate(ids, attn, response_mask):\n"
        "    labels = ids.masked_fill(response_mask.bool(), IGNORE)\n"
        "    labels = labels.masked_fill(attn == 0, -100)\n"
        "    return labels\n")
    assert mask_line(str(script), -100)[0] == 3


def test_several_candidates_and_no_part_named_give_no_statement(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("a[m] = -100\nb[n] = -100\n")
    assert mask_line(str(script), -100) is None
    assert mask_line(str(tmp_path / "missing.py"), -100) is None


def _run(inverted: bool):
    rec = Recorder(step_budget=None)
    emb, head = nn.Embedding(30, 8, padding_idx=PAD), nn.Linear(8, 30)
    ids, labels = sft_batch(inverted)
    with Instrumentation(rec):
        logits = head(emb(ids))
        F.cross_entropy(logits[:, :-1].reshape(-1, 30), labels[:, 1:].reshape(-1)).backward()
    return [e for e in rec.trace if e.kind == "prompt_trained"]


def test_the_watcher_records_an_inverted_mask_and_not_a_correct_one():
    (e,) = _run(inverted=True)
    assert e.get("inverted_rows") == ROWS and e.get("ignore_index") == -100
    assert _run(inverted=False) == []


def test_the_watcher_closes_on_a_script_whose_losses_never_qualify():
    """A run with no token loss (a regression) must not keep the listener and the embedding
    wrapper on every call of a long run."""
    from graddoctor.instrument.promptmask import _HEARD, PromptMaskWatcher

    watcher = PromptMaskWatcher(Recorder(step_budget=None))
    pred, target = torch.randn(4, 1, requires_grad=True), torch.randn(4, 1)
    for _ in range(_HEARD - 1):
        watcher.loss_call("mse_loss", pred, target, (pred, target), {})
    assert watcher.open
    watcher.loss_call("mse_loss", pred, target, (pred, target), {})
    assert not watcher.open
