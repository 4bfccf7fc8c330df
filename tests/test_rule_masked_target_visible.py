"""masked-target-visible (GD197): the per-position comparison of input and target, the mask
channel, the token labels' judgement, hand-written traces with the line the rule points at, and
the watcher in-process on a masked model whose loss counts the visible or the hidden positions."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.maskvisible import _filler, _mask_channel, _shows
from graddoctor.instrument.promptmask import labels_visible
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "masked-target-visible"


def test_an_input_that_holds_the_target_shows_it_exactly_affinely_and_normalised():
    x = torch.rand(10, 8)
    everywhere = torch.ones(10, dtype=torch.bool)
    assert bool(_shows(x, x.clone(), everywhere)[0].all())
    shown, normalised = _shows(x, 2 * x - 1, everywhere)
    assert bool(shown.all()) and normalised
    per_row = (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)
    assert bool(_shows(x, per_row, everywhere)[0].all())


def test_noise_or_zeros_do_not_show_the_target():
    x = torch.rand(10, 8)
    assert not bool(_shows(x + 0.3 * torch.randn(10, 8), x, torch.ones(10, dtype=torch.bool))[0].any())
    hidden = x.clone()
    hidden[:5] = 0
    counted = torch.arange(10) >= 5
    shown, _ = _shows(hidden, x, counted)
    assert shown.tolist() == [False] * 5 + [True] * 5


def test_a_mask_channel_is_found_as_is_or_inverted_and_not_otherwise():
    hole = (torch.rand(2, 1, 6, 6) > 0.5)
    counted = hole.expand(2, 3, 6, 6)
    assert _mask_channel(hole.float(), counted)
    assert _mask_channel((~hole).float(), counted)
    assert not _mask_channel(torch.rand(2, 1, 6, 6), counted)


def test_padding_rows_are_filler_and_data_rows_are_not():
    rows = torch.cat([torch.zeros(3, 4), torch.rand(2, 4)])
    assert _filler(rows).tolist() == [True, True, True, False, False]


def _mlm(kept_labels: bool, keep_share: float = 0.0):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 40, (16, 20), generator=g)
    chosen = torch.rand(16, 20, generator=g) < 0.2
    inputs = ids.clone()
    kept = chosen & (torch.rand(16, 20, generator=g) < keep_share)
    inputs[chosen & ~kept] = 1
    labels = ids.masked_fill(chosen if kept_labels else ~chosen, -100)
    return inputs, labels


def test_labels_at_the_kept_tokens_are_seen():
    inputs, labels = _mlm(kept_labels=True)
    found = labels_visible(inputs, labels, -100)
    assert found is not None and found["visible"] == 1.0 and found["by"] == "tokens"


def test_labels_at_the_masked_tokens_are_silent_with_or_without_80_10_10():
    assert labels_visible(*_mlm(kept_labels=False), -100) is None
    assert labels_visible(*_mlm(kept_labels=False, keep_share=0.1), -100) is None


def test_a_prompt_or_padding_run_at_the_row_ends_is_silent():
    ids = torch.randint(2, 40, (8, 16))
    labels = ids.clone()
    labels[:, :5] = -100  # a prompt
    labels[:, 13:] = -100  # padding
    assert labels_visible(ids, labels, -100) is None


def _put(by: str, line: int = 7, **extra):
    t = TraceBuilder()
    t.put(ev.masked_visible(how="product", counted=0.25, visible=1.0, hidden=1.0, by=by,
                            positions=64, features=16, normalised=False, **extra), line)
    return t


def test_the_event_is_a_warning_at_the_backward_without_a_script():
    f = only(_put("gradient"), SLUG)
    assert f.location.line == 7 and "dropped before" in f.message and "hidden positions" in f.fix


def test_the_statement_that_writes_the_mask_is_found(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "def forward(b, n, keep):\n"
        "    mask = torch.ones(b, n)\n"
        "    mask[:, keep:] = 0  # the kept patches\n"
        "    return mask\n"
        "mask = forward(2, 8, 2)\n"
        "per_patch = torch.rand(2, 8)\n"
        "loss = (per_patch * mask).sum() / mask.sum()\n"
        "loss.backward()\n")
    t = TraceBuilder(path=str(script))
    t.put(ev.masked_visible(how="product", counted=0.25, visible=1.0, hidden=1.0, by="gradient",
                            positions=16, features=4, normalised=False), 9)
    f = only(t, SLUG)
    assert f.location.line == 4 and "mask[:, keep:] = 0" in f.fix and "#" not in f.fix


def test_an_inversion_on_the_loss_line_is_the_line_to_change(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "hidden = torch.rand(4, 8) < 0.5\n"
        "hidden[:, 0] = True\n"
        "err = torch.rand(4, 8)\n"
        "loss = err[~hidden].mean()\n"
        "loss.backward()\n")
    t = TraceBuilder(path=str(script))
    t.put(ev.masked_visible(how="index", counted=0.5, visible=1.0, hidden=1.0, by="gradient",
                            positions=32, features=4, normalised=False), 6)
    f = only(t, SLUG)
    assert f.location.line == 5 and "inversion" in f.fix


def test_no_event_no_finding():
    assert findings(TraceBuilder(), SLUG) == []


class _Masked(nn.Module):
    """Patches embedded, the hidden ones dropped from the mixing (an MAE in miniature)."""

    def __init__(self):
        super().__init__()
        self.embed, self.mix, self.head = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 6)

    def forward(self, patches, hidden):
        tokens = self.embed(patches) * (~hidden)[..., None]
        context = self.mix(tokens.mean(1, keepdim=True))
        return self.head(torch.relu(tokens + context))


def _run(count_visible: bool):
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    model = _Masked()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Instrumentation(rec):
        for _ in range(2):
            patches = torch.rand(4, 10, 6)
            hidden = torch.rand(4, 10) < 0.5
            pred = model(patches, hidden)
            counted = (~hidden if count_visible else hidden).float()
            loss = (((pred - patches) ** 2).mean(-1) * counted).sum() / counted.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [e for e in rec.trace if e.kind == "masked_visible"]


def test_the_watcher_records_a_loss_on_the_visible_positions_and_not_on_the_hidden_ones():
    (e,) = _run(count_visible=True)
    assert e.get("by") == "gradient" and e.get("visible") == 1.0 and e.get("how") == "product"
    assert _run(count_visible=False) == []


def test_the_watcher_leaves_the_run_unchanged():
    """Only hooks that read: the same seed gives the same parameters with and without it."""
    def train(instrumented: bool):
        torch.manual_seed(1)
        model = _Masked()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        patches, hidden = torch.rand(4, 10, 6), torch.rand(4, 10) < 0.5
        counted = (~hidden).float()

        def step():
            loss = (((model(patches, hidden) - patches) ** 2).mean(-1) * counted).sum() / counted.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        if instrumented:
            with Instrumentation(Recorder(step_budget=None)):
                step()
        else:
            step()
        return torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.equal(train(True), train(False))


def test_token_targets_read_through_a_boolean_index_are_put_back_at_their_positions():
    from graddoctor.instrument.promptmask import _indexed_visible

    inputs, labels = _mlm(kept_labels=True)
    kept = labels != -100
    logits = torch.randn(16, 20, 5, requires_grad=True)
    found = _indexed_visible(inputs, logits[kept], labels[kept])
    assert found is not None and found["how"] == "index" and found["ignore_index"] is None
    masked = ~kept
    assert _indexed_visible(inputs, logits[masked], _mlm(kept_labels=False)[1][masked]) is None


def test_labels_taken_after_masking_are_left_to_labels_one_value():
    inputs, _ = _mlm(kept_labels=True)
    chosen = inputs == 1
    assert labels_visible(inputs, inputs.masked_fill(~chosen, -100), -100) is None


def test_ignored_real_tokens_are_no_hiding():
    """Labels at a random fifth of an unmasked batch: what is ignored holds real tokens, many
    ids, not one [MASK] id."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 40, (16, 20), generator=g)
    labels = ids.masked_fill(torch.rand(16, 20, generator=g) > 0.2, -100)
    assert labels_visible(ids, labels, -100) is None


def _run_dropped(count_visible: bool):
    """The loss computed inside a helper that returns only the loss: the prediction is no
    longer referenced by the script when the backward runs (MAE's ``loss, _, _ = model(x)``)."""
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    model = _Masked()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_of(patches, hidden):
        pred = model(patches, hidden)
        counted = (~hidden if count_visible else hidden).float()
        return (((pred - patches) ** 2).mean(-1) * counted).sum() / counted.sum()

    with Instrumentation(rec):
        for _ in range(2):
            loss = loss_of(torch.rand(4, 10, 6), torch.rand(4, 10) < 0.5)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [e for e in rec.trace if e.kind == "masked_visible"]


def test_a_prediction_the_script_drops_is_still_read_back():
    (e,) = _run_dropped(count_visible=True)
    assert e.get("by") == "gradient" and e.get("how") == "product"
    assert _run_dropped(count_visible=False) == []


# -- the mask id written into the labels instead of the inputs (instrument/tokencopy.py) -------

def _mask_id_batch(into_labels: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, 50, (8, 24), generator=g)
    masked = torch.rand(8, 24, generator=g) < 0.15
    inputs, labels = seq.clone(), seq.clone()
    (labels if into_labels else inputs)[masked] = 50
    labels[~masked] = -100
    return inputs, labels


def test_a_mask_id_in_the_labels_that_the_input_never_holds_is_seen():
    from graddoctor.instrument.tokencopy import mask_id_in_labels
    inputs, labels = _mask_id_batch(into_labels=True)
    found = mask_id_in_labels(inputs, [inputs], labels.reshape(-1), -100, 51)
    assert found is not None and found["mask_id"] == 50 and found["hidden"] == 1.0
    assert found["by"] == "mask_id" and found["ignore_index"] == -100


def test_a_mask_id_in_the_inputs_or_over_another_vocabulary_is_silent():
    from graddoctor.instrument.tokencopy import mask_id_in_labels
    inputs, labels = _mask_id_batch(into_labels=False)
    assert mask_id_in_labels(inputs, [inputs], labels.reshape(-1), -100, 51) is None
    inputs, labels = _mask_id_batch(into_labels=True)
    assert mask_id_in_labels(inputs, [inputs], labels.reshape(-1), -100, 40) is None  # id past the classes


def test_a_language_models_end_token_is_silent():
    from graddoctor.instrument.tokencopy import mask_id_in_labels
    g = torch.Generator().manual_seed(1)
    seq = torch.full((16, 10), 51)
    for i, n in enumerate(torch.randint(3, 9, (16,), generator=g).tolist()):
        seq[i, :n] = torch.randint(0, 50, (n,), generator=g)
        seq[i, n] = 50  # the end token, never an input
    inputs, labels = seq[:, :-1], seq[:, 1:].clone()
    labels[labels == 51] = -100
    assert mask_id_in_labels(inputs, [inputs], labels.reshape(-1), -100, 52) is None


def test_the_mask_id_event_points_at_the_write_into_the_labels(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "seq = torch.randint(0, 50, (8, 24))\n"
        "masked = torch.rand(8, 24) < 0.15\n"
        "inputs, labels = seq.clone(), seq.clone()\n"
        "labels[~masked] = -100\n"
        "labels[masked] = MASK_ID\n"
        "loss = model(inputs, labels)\n")
    t = TraceBuilder(path=str(script))
    t.put(ev.masked_visible(how="ignore_index", counted=0.15, visible=0.0, hidden=1.0, by="mask_id",
                            positions=192, features=1, normalised=False, ignore_index=-100,
                            mask_id=50), 7)
    f = only(t, SLUG)
    assert f.location.line == 6 and "id 50" in f.message and "inputs[masked] = MASK" in f.fix


def test_the_input_built_with_the_where_branches_swapped_is_the_line_to_change(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules.masked_target_visible import _input_keeps_counted
    from graddoctor.trace import TraceBuilder

    script = tmp_path / "train.py"
    script.write_text(
        "inp = torch.where(mask, tokens, torch.full_like(tokens, MASK))\n"          # 1
        "ok = torch.where(mask, torch.full_like(tokens, MASK), tokens)\n"           # 2
        "loss = F.cross_entropy(model(inp)[mask], tokens[mask])\n")                 # 3
    a = Analysis(TraceBuilder(str(script)).trace)
    text = "loss = F.cross_entropy(model(inp)[mask], tokens[mask])"
    line, fix = _input_keeps_counted(a, str(script), ["mask"], text)
    assert line == 1 and "torch.where(mask, torch.full_like(tokens, MASK), tokens)" in fix
    filled = tmp_path / "filled.py"
    filled.write_text("inp = tokens.masked_fill(~mask, MASK)\n")
    a = Analysis(TraceBuilder(str(filled)).trace)
    assert _input_keeps_counted(a, str(filled), ["mask"], text)[0] == 1
    assert _input_keeps_counted(a, str(filled), ["keep"], text) is None


# -- the mask id written at the positions the labels ignore (instrument/promptmask.py) ---------

def _mask_beside_batch(beside: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(4, 60, (8, 24), generator=g)
    masked = torch.rand(8, 24, generator=g) < 0.15
    draw = torch.rand(8, 24, generator=g)
    replaced = (draw < 0.8) & (~masked if beside else masked)
    randomized = masked & ~replaced & (draw >= 0.9)
    inputs = seq.clone()
    inputs[replaced] = 3
    inputs[randomized] = torch.randint(4, 60, (int(randomized.sum()),), generator=g)
    labels = seq.masked_fill(~masked, -100)
    return inputs, labels


def test_a_mask_id_at_the_ignored_positions_is_seen():
    from graddoctor.instrument.promptmask import mask_beside_labels
    inputs, labels = _mask_beside_batch(beside=True)
    found = mask_beside_labels(inputs, labels, -100, 60)
    assert found is not None and found["by"] == "mask_beside" and found["mask_id"] == 3
    assert found["hidden"] >= 0.7 and found["counted"] < 0.3


def test_a_mask_id_at_the_counted_positions_or_a_dense_loss_is_silent():
    from graddoctor.instrument.promptmask import mask_beside_labels
    inputs, labels = _mask_beside_batch(beside=False)
    assert mask_beside_labels(inputs, labels, -100, 60) is None
    # separators ignored between documents of a packed batch: most positions are counted
    ids = torch.randint(4, 60, (8, 24))
    ids[:, 8::8] = 2
    labels = ids.masked_fill(ids == 2, -100)
    assert mask_beside_labels(ids, labels, -100, 60) is None
    # tags of another vocabulary than the inputs' (a token classifier)
    inputs, labels = _mask_beside_batch(beside=True)
    assert mask_beside_labels(inputs, labels, -100, 40) is None


def test_the_mask_beside_event_points_at_the_inverted_selection(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "masked = torch.rand(8, 24) < 0.15\n"
        "labels = seq.masked_fill(~masked, -100)\n"
        "swap = (torch.rand(8, 24) < 0.8) & ~masked\n"
        "tokens = seq.clone()\n"
        "tokens[swap] = MASK_TOKEN\n"
        "loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())\n")
    t = TraceBuilder(path=str(script))
    t.put(ev.masked_visible(how="ignore_index", counted=0.15, visible=0.5, hidden=0.8,
                            by="mask_beside", positions=192, features=1, normalised=False,
                            ignore_index=-100, mask_id=3), 7)
    f = only(t, SLUG)
    assert f.location.line == 4 and "`swap`" in f.fix and "id 3" in f.message


def test_a_filler_left_out_beside_a_mask_id_at_the_counted_positions_is_silent():
    from graddoctor.instrument.promptmask import mask_beside_labels
    g = torch.Generator().manual_seed(2)
    seq = torch.randint(4, 60, (8, 24), generator=g)
    seq[torch.rand(8, 24, generator=g) < 0.6] = 0  # alignment gaps, never predicted
    chosen = (torch.rand(8, 24, generator=g) < 0.3) & (seq != 0)
    inputs = seq.masked_fill(chosen & (torch.rand(8, 24, generator=g) < 0.8), 3)
    labels = seq.masked_fill(~chosen, -100)
    assert mask_beside_labels(inputs, labels, -100, 60) is None


def test_labels_at_the_kept_tokens_point_at_an_inverted_mask_selection(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "select = torch.rand(8, 24) < 0.15\n"
        "labels = torch.where(select, seq, torch.full_like(seq, -100))\n"
        "hide = torch.rand(8, 24).lt(0.9).logical_and(select.logical_not())\n"
        "tokens = seq.clone()\n"
        "tokens[hide] = MASK_ID\n"
        "loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())\n")
    t = TraceBuilder(path=str(script))
    t.put(ev.masked_visible(how="ignore_index", counted=0.15, visible=1.0, hidden=0.9,
                            by="tokens", positions=192, features=1, normalised=False,
                            ignore_index=-100), 7)
    f = only(t, SLUG)
    assert f.location.line == 4 and "`hide`" in f.fix
