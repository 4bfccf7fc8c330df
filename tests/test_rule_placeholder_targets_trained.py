"""placeholder-targets-trained (GD288): the ``placeholder_targets`` event of
instrument/placeholders.py for a regression loss taken over a target canvas whose empty entries
are 0, the value test it is judged with, and the rule's finding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.placeholders import judge_targets
from rule_traces import builder, findings, only

SLUG = "placeholder-targets-trained"


def test_judge_targets_finds_zero_rows_among_filled_ones():
    torch.manual_seed(0)
    boxes = torch.rand(64, 4) + 0.1
    canvas = torch.zeros(64, 4)
    canvas[:5] = boxes[:5]
    found = judge_targets(canvas)
    assert found["how"] == "rows" and found["width"] == 4 and abs(found["share"] - 59 / 64) < 1e-3
    assert judge_targets(boxes) is None  # every row filled
    one = torch.zeros(64, 4)
    one[0] = boxes[0]
    assert judge_targets(one) is None  # a single filled row: nothing to tell the canvas by
    onehot = F.one_hot(torch.randint(0, 4, (64,)), 4).float()
    assert judge_targets(onehot) is None  # zeros inside every row: values, not filler
    few = boxes.clone()
    few[:4] = 0
    assert judge_targets(few) is None  # under a fifth of the rows
    assert judge_targets(torch.zeros(64, 16)) is None  # rows too wide to be coordinates
    grad = canvas.clone().requires_grad_()
    assert judge_targets(grad) is None  # a target with a gradient is the model's


def test_judge_targets_finds_a_sparse_map_whose_zeros_stand_apart():
    torch.manual_seed(0)
    dense = 2.0 + 60.0 * torch.rand(2, 1, 16, 16)
    sparse = dense * (torch.rand(2, 1, 16, 16) < 0.3)
    assert judge_targets(sparse)["how"] == "sparse"
    assert judge_targets(dense) is None
    dark = (torch.randn(2, 1, 16, 16) - 0.5).clamp(min=0)  # values reaching down to 0
    assert judge_targets(dark) is None
    counts = torch.poisson(torch.full((2, 1, 16, 16), 0.5))  # integers: 0 is a count
    assert judge_targets(counts) is None
    signed = sparse - 30.0 * (sparse > 0)
    assert judge_targets(signed) is None  # negative values: not a measurement that is missing


def test_the_event_is_a_warning_at_the_loss_call():
    t = builder()
    t.put(ev.placeholder_targets(fn="smooth_l1_loss", shape=[64, 4], how="rows", share=0.92,
                                 rows=64, width=4, low=-0.2, high=0.3), 7)
    t.put(ev.placeholder_targets(fn="l1_loss", shape=[2, 1, 8, 8], how="sparse", share=0.7,
                                 rows=128, width=1, low=2.0, high=61.0), 9)
    rows, sparse = findings(t, SLUG)
    assert rows.severity is Severity.WARNING and rows.location.line == 7
    assert "92% of its 64 rows of 4 are all 0" in rows.message
    assert "smooth_l1_loss(pred[pos], target[pos])" in rows.fix
    assert sparse.location.line == 9 and "70% exact zeros" in sparse.message
    assert "valid = target > 0" in sparse.fix
    assert findings(builder(), SLUG) == []


def _events(loss_of) -> list[dict]:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = nn.Linear(8, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(3):
            x = torch.randn(32, 8)
            target = torch.zeros(32, 4)
            pos = torch.arange(32) % 4 == 0
            target[pos] = torch.rand(int(pos.sum()), 4) + 0.1
            loss = loss_of(model(x), target, pos)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [dict(e.data) for e in rec.trace.of_kind("placeholder_targets")]


def test_the_watcher_notes_a_canvas_once_and_stays_silent_on_the_filled_rows():
    found = _events(lambda p, t, pos: F.smooth_l1_loss(p, t))
    assert len(found) == 1 and found[0]["fn"] == "smooth_l1_loss" and found[0]["how"] == "rows"
    assert _events(lambda p, t, pos: F.smooth_l1_loss(p[pos], t[pos])) == []
    # a per-element loss the script masks afterwards, and a weight that is a mask
    assert _events(lambda p, t, pos: (F.mse_loss(p, t, reduction="none").sum(1) * pos).mean()) == []
    assert _events(lambda p, t, pos: F.mse_loss(p, t, weight=pos[:, None].float().expand(-1, 4))) == []
    assert _events(lambda p, t, pos: nn.HuberLoss()(p, t))[0]["fn"] == "huber_loss"


def test_the_log_watcher_notes_a_sparse_target_map_and_leaves_a_dense_one():
    def run(mask_out) -> list[dict]:
        rec = Recorder(step_budget=None)
        original = torch.log
        with Instrumentation(rec):
            torch.manual_seed(0)
            conv = nn.Conv2d(1, 1, 1)
            opt = torch.optim.SGD(conv.parameters(), lr=0.01)
            for _ in range(4):
                gt = (1.0 + 40.0 * torch.rand(2, 1, 8, 8)) * (torch.rand(2, 1, 8, 8) < mask_out)
                pred = F.softplus(conv(torch.rand(2, 1, 8, 8))) + 1e-3
                valid = gt > 0
                loss = (pred[valid].log() - torch.log(gt[valid].clamp(min=1e-3)).mean()).mean() \
                    + 0 * torch.log(gt + 1).mean()
                if mask_out < 1:
                    loss = loss + 0 * torch.log(gt.clamp(min=0) + (gt == 0)).mean()
                    torch.log(gt)  # the map with its holes
                opt.zero_grad()
                loss.backward()
                opt.step()
            put_back = torch.log is original
        return [dict(e.data) for e in rec.trace.of_kind("placeholder_targets")], put_back

    found, put_back = run(0.4)
    assert [e["fn"] for e in found] == ["log"] and found[0]["how"] == "sparse" and put_back
    found, put_back = run(1.0)
    assert found == [] and put_back


def test_the_log_finding_says_log_zero():
    t = builder()
    t.put(ev.placeholder_targets(fn="log", shape=[2, 1, 8, 8], how="sparse", share=0.6,
                                 rows=128, width=1, low=1.0, high=41.0), 5)
    f = only(t, SLUG)
    assert f.location.line == 5 and "log(0) = -inf" in f.message and "target[valid]" in f.fix


def test_integer_rows_are_counts_not_a_canvas():
    returns = torch.zeros(16, 6)
    returns[:5] = torch.arange(6, 0, -1).float()  # undiscounted returns of 0/1 rewards
    assert judge_targets(returns) is None


def _padded_batch(lengths, frames=20, width=8, time_axis=1):
    torch.manual_seed(0)
    t = torch.zeros(len(lengths), frames, width)
    for i, n in enumerate(lengths):
        t[i, :n] = torch.randn(n, width) - 4.0  # log-mel levels: negative, never exactly 0
    return t if time_axis == 1 else t.transpose(1, 2).contiguous()


def test_judge_padding_finds_frames_past_each_rows_end():
    from graddoctor.instrument.placeholders import judge_padding
    target = _padded_batch([20, 12, 15, 9, 20, 17])
    pred = torch.randn_like(target)
    found = judge_padding(pred, target)
    assert found["how"] == "padded" and found["rows"] == 4 and (found["low"], found["high"]) == (9, 20)
    assert found["width"] == 8
    mels_first = _padded_batch([20, 12, 15, 9, 20, 17], time_axis=2)  # (B, n_mels, T)
    assert judge_padding(torch.randn_like(mels_first), mels_first)["rows"] == 4


def test_judge_padding_stays_silent_on_masked_predictions_and_other_zeros():
    from graddoctor.instrument.placeholders import judge_padding
    target = _padded_batch([20, 12, 15, 9, 20, 17])
    masked = torch.randn_like(target).masked_fill(target.eq(0).all(-1, keepdim=True), 0.0)
    assert judge_padding(masked, target) is None  # Tacotron 2's masked_fill on the output
    same = _padded_batch([14, 14, 14, 14])
    assert judge_padding(torch.randn_like(same), same) is None  # one length: a fixed-size crop
    rests = _padded_batch([20, 12, 15, 9, 20, 17])
    rests[:, 2:5] = 0.0  # zero frames inside the sequences: silence is a value here
    assert judge_padding(torch.randn_like(rests), rests) is None
    assert judge_padding(torch.randn(6, 20, 8), torch.randn(6, 20, 8)) is None


def test_the_padded_event_reads_as_a_warning_at_the_loss_call():
    t = builder()
    t.put(ev.placeholder_targets(fn="l1_loss", shape=[6, 20, 8], how="padded", share=0.3,
                                 rows=4, width=8, low=9, high=20), line=12)
    t.backward(line=13)
    f = only(t, SLUG)
    assert f.severity == Severity.WARNING and f.location.line == 12
    assert "padded batch of sequences" in f.message and "pred[mask]" in f.fix


def test_reads_target_tells_an_autoencoder_from_a_slice_of_the_same_tensor():
    from graddoctor.instrument.placeholders import is_colour, reads_target

    torch.manual_seed(0)
    conv = nn.Conv2d(3, 3, 3, padding=1)
    images = (torch.rand(4, 3, 8, 8) > 0.6).float() * (0.3 + torch.rand(4, 3, 8, 8))
    assert is_colour(images)
    assert reads_target(conv(images), images)
    # an image and its depth sliced from one tensor share memory but not values
    stacked = torch.rand(4, 4, 8, 8)
    rgb, depth = stacked[:, :3], stacked[:, 3:]
    assert not reads_target(nn.Conv2d(3, 1, 3, padding=1)(rgb), depth)
    assert not is_colour(depth)
    flat = nn.Linear(192, 192)
    assert reads_target(flat(images.flatten(1)).view_as(images), images)


def test_colour_rows_predicted_in_the_unit_range_are_colours_not_a_canvas():
    from graddoctor.instrument.placeholders import is_colour_rows

    g = torch.Generator().manual_seed(0)
    colours = torch.rand(64, 3, generator=g)
    colours[::2] = 0.0  # black pixels (a disc on a black background)
    assert judge_targets(colours)["how"] == "rows"  # the rows alone read as a canvas
    assert is_colour_rows(torch.sigmoid(torch.randn(64, 3, generator=g)), colours)
    assert not is_colour_rows(torch.randn(64, 3, generator=g), colours)  # an unbounded head
    offsets = colours * 4 - 1
    offsets[::2] = 0.0
    assert not is_colour_rows(torch.rand(64, 3, generator=g), offsets)  # values outside [0, 1]
    keypoints = torch.rand(64, 2, generator=g)
    assert not is_colour_rows(torch.rand(64, 2, generator=g), keypoints)  # (x, y): coordinates
