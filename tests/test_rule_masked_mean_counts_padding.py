"""masked-mean-counts-padding (GD171): hand-written traces, the graph reading of
instrument/maskmean.py, and the ``masked_mean`` events its watcher records."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.maskmean import masked_means, per_sample
from rule_traces import P, builder, findings, only

SLUG = "masked-mean-counts-padding"


def _trace(*kept, same=False, how="product", reduced="mean", line=17, at_mean=True, operand=1,
           path="train.py"):
    t = builder()
    t.path = path
    for i in range(3):
        t.backward(fresh=P, line=20)
        t.step(line=21)
        if i < len(kept):
            t.put(ev.masked_mean(how=how, reduced=reduced, kept=kept[i], elements=40,
                                 same_mask=same or i == 0, at_mean=at_mean,
                                 mask_operand=operand if how == "product" else None), line=line)
    return t


def test_a_kept_share_that_varies_is_a_warning_at_the_mean():
    f = only(_trace(0.5, 0.8, 0.65), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 17
    assert "50%, 80%, 65%" in f.message and "smaller step" in f.message
    assert f.evidence["kept"] == [0.5, 0.8, 0.65]


def test_a_constant_share_is_info_and_a_fixed_mask_is_silent():
    f = only(_trace(0.6, 0.6, 0.61), SLUG)
    assert f.severity is Severity.INFO and "constant factor" in f.message
    assert only(_trace(0.7), SLUG).severity is Severity.INFO  # one batch: the variation is unknown
    assert findings(_trace(0.5, 0.5, 0.5, same=True), SLUG) == []
    assert findings(_trace(), SLUG) == []


def test_the_fix_names_what_the_line_masks_with(tmp_path):
    script = tmp_path / "train.py"
    lines = ["pass\n"] * 16 + ["loss = (per_token * pad_mask).mean()\n"]
    script.write_text("".join(lines))
    t = _trace(0.5, 0.8, path=str(script))
    f = only(t, SLUG)
    assert f.fix.endswith("(per_token * pad_mask).sum() / pad_mask.sum().clamp(min=1)"), f.fix
    f = only(_trace(0.5, 0.8, operand=0, path=str(script)), SLUG)
    assert f.fix.endswith("/ per_token.sum().clamp(min=1)"), f.fix
    f = only(_trace(0.5, 0.8, how="where", path=str(script)), SLUG)
    assert "loss[keep].mean()" in f.fix
    f = only(_trace(0.5, 0.8, reduced="sum/numel", path=str(script)), SLUG)
    assert "not by the number of elements" in f.fix and "summed and divided" in f.message


# -- the graph ---------------------------------------------------------------------------------

def _loss_and_mask(share=0.6, shape=(4, 10)):
    logits = torch.randn(*shape, 5, requires_grad=True)
    per = F.cross_entropy(logits.transpose(1, 2), torch.randint(0, 5, shape), reduction="none")
    mask = torch.zeros(shape)
    mask.view(-1)[: int(share * mask.numel())] = 1
    return per, mask


def _found(loss) -> list:
    return [how for *_, how in [(m, top, reduced) for m, top, reduced, _ in masked_means(loss.grad_fn)]]


def test_means_over_every_position_are_found():
    per, mask = _loss_and_mask()
    assert _found((per * mask).mean()) == ["mean"]
    assert _found((mask * per).mean(1).mean()) == ["mean+mean"]
    assert _found((per * mask).sum() / per.numel()) == ["sum/numel"]
    assert _found((per * mask).sum() / 4 / 10 / 2) == ["sum/numel"]  # B, T, then accumulation
    assert _found(0.5 * (per * mask).mean() / 3) == ["mean"]
    assert _found(torch.where(mask.bool(), per, 0.0).mean()) == ["mean"]
    assert _found(per.masked_fill(mask == 0, 0.0).view(-1).mean()) == ["mean"]
    # the unreduced loss's own mean is a candidate too (its ignored targets are its mask)
    assert _found(per.mean() + (per * mask).mean()) == ["mean", "mean"]


def test_means_over_the_kept_positions_are_not():
    per, mask = _loss_and_mask()
    assert _found((per * mask).sum() / mask.sum()) == []
    assert _found((per * mask).sum() / mask.sum().clamp(min=1)) == []
    assert _found(((per * mask).sum(1) / mask.sum(1)).mean()) == []
    assert _found((per * mask).sum(1).mean()) == []  # a per-sequence sum averaged over the batch
    assert _found((per * mask).sum() / 4) == []
    assert _found(per[mask.bool()].mean()) == []
    assert _found(per.masked_select(mask.bool()).mean()) == []
    assert _found(F.cross_entropy(torch.randn(8, 3, requires_grad=True), torch.randint(0, 3, (8,)))) == []


# -- the watcher ---------------------------------------------------------------------------------

def _events(reduce, steps=4, fixed=False, lengths=None, weights=False):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        embed, head = nn.Embedding(9, 6), nn.Linear(6, 9)
        opt = torch.optim.SGD([*embed.parameters(), *head.parameters()], lr=0.1)
        fixed_mask = torch.triu(torch.ones(4, 8))[:, :8]
        for step in range(steps):
            length = torch.randint(2, 9, (4,)) if lengths is None else torch.tensor(lengths)
            mask = (torch.arange(8)[None] < length[:, None]).float()
            if fixed:
                mask = fixed_mask
            if weights:
                mask = mask * 0.5 + 0.25
            tokens = torch.randint(0, 9, (4, 8))
            per = F.cross_entropy(head(embed(tokens)).transpose(1, 2), tokens, reduction="none")
            loss = reduce(per, mask)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [(e["how"], e["reduced"], e["same_mask"], e.loc.line if e.loc else None)
            for e in rec.trace.of_kind("masked_mean")], rec


def test_the_watcher_records_each_backward_at_the_line_of_the_mean():
    events, _ = _events(lambda per, mask: (per * mask).mean())
    assert len(events) == 4
    assert {how for how, *_ in events} == {"product"}
    line = events[0][3]
    assert line is not None and all(e[3] == line for e in events)
    assert [e[2] for e in events][0] is True and not all(e[2] for e in events)


def test_the_watcher_is_silent_on_correct_means_weights_and_no_padding():
    assert _events(lambda per, mask: (per * mask).sum() / mask.sum())[0] == []
    assert _events(lambda per, mask: (per * mask).mean(), weights=True)[0] == []
    assert _events(lambda per, mask: (per * mask).mean(), lengths=[8, 8, 8, 8])[0] == []


def test_a_fixed_mask_reads_the_same_at_every_backward():
    events, rec = _events(lambda per, mask: (per * mask).mean(), fixed=True)
    assert len(events) == 4 and all(same for _, _, same, _ in events)


def test_the_wrappers_are_gone_after_the_window():
    mean = torch.Tensor.mean
    _events(lambda per, mask: (per * mask).mean(), steps=5)
    assert torch.Tensor.mean is mean


def test_two_halves_whose_masks_split_every_position_are_one_mean():
    def halves(per, mask):
        positive = (per.detach() > 2.2).float()
        return (positive * per).mean() + ((1 - positive) * per ** 2).mean()

    assert _events(halves)[0] == []
    one_half, _ = _events(lambda per, mask: ((per.detach() > 2.2).float() * per).mean())
    assert len(one_half) == 4


def test_torch_mean_keeps_its_identity_during_the_run():
    seen = []
    _events(lambda per, mask: (seen.append((torch.mean, torch.sum)), (per * mask).mean())[1], steps=6)
    assert all(fn is torch.mean and sums is torch.sum for fn, sums in seen)  # Lightning compares them


def _masking(loss):
    """The masking node under ``loss``'s reductions."""
    (found,) = masked_means(loss.grad_fn)
    return found[0]


def test_a_mask_over_samples_is_told_from_a_mask_over_flattened_positions():
    logits = torch.randn(6, 4, 5, requires_grad=True)
    mask = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    per_sample = F.cross_entropy(logits[:, 0], torch.zeros(6, dtype=torch.long), reduction="none")
    assert per_sample_mask((per_sample * mask).mean())
    flat = F.cross_entropy(logits.reshape(-1, 5), torch.zeros(24, dtype=torch.long), reduction="none")
    assert not per_sample_mask((flat * mask.repeat(4)).mean())
    rows = F.cross_entropy(logits.transpose(1, 2), torch.zeros(6, 4, dtype=torch.long), reduction="none")
    assert not per_sample_mask((rows * mask[:, None]).mean())
    # a (B, 1) column squeezed to (B,) keeps one element per sample: an off-policy estimator's
    # importance weight times a 0/1 reward, averaged over every logged sample
    picked = torch.softmax(logits[:, 0], -1).gather(1, torch.zeros(6, 1, dtype=torch.long)).squeeze(1)
    assert per_sample_mask((picked / 0.3 * mask).mean())


def per_sample_mask(loss) -> bool:
    node = _masking(loss)
    index = next(i for i, (child, _) in enumerate(node.next_functions) if child is not None)
    return per_sample(node, index)


# -- an unreduced token loss whose ignored targets give 0 ---------------------------------------

def test_ignored_targets_of_an_unreduced_loss_are_its_mask():
    from graddoctor.instrument.maskmean import masked_share
    logits = torch.randn(4, 10, 7, requires_grad=True)
    labels = torch.randint(0, 7, (4, 10))
    labels[:, 6:] = -100
    per = F.cross_entropy(logits.reshape(-1, 7), labels.reshape(-1), reduction="none")
    (masking, _, reduced, _), = masked_means(per.mean().grad_fn)
    mask, how, _ = masked_share(masking)
    assert how == "ignore_index" and reduced == "mean" and abs(float(mask.float().mean()) - 0.6) < 1e-6
    per2d = F.cross_entropy(logits.transpose(1, 2), labels.masked_fill(labels == -100, 0),
                            reduction="none", ignore_index=0)
    (masking, *_), = masked_means(torch.mean(per2d).grad_fn)
    assert masked_share(masking)[1] == "ignore_index"
    reduced_loss = F.cross_entropy(logits.reshape(-1, 7), labels.reshape(-1))
    assert masked_means(reduced_loss.grad_fn) == []


def test_the_watcher_records_an_unreduced_loss_averaged_over_its_ignored_targets():
    def run(reduce):
        rec = Recorder(step_budget=None)
        with Instrumentation(rec):
            torch.manual_seed(0)
            embed, head = nn.Embedding(9, 6), nn.Linear(6, 9)
            opt = torch.optim.SGD([*embed.parameters(), *head.parameters()], lr=0.1)
            for step in range(4):
                tokens = torch.randint(0, 9, (4, 8))
                labels = tokens.masked_fill(torch.rand(4, 8) < 0.5, -100)
                per = F.cross_entropy(head(embed(tokens)).reshape(-1, 9), labels.reshape(-1),
                                      reduction="none")
                loss = reduce(per, labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
        return [e["how"] for e in rec.trace.of_kind("masked_mean")]
    assert run(lambda per, labels: per.mean()) == ["ignore_index"] * 4
    assert run(lambda per, labels: per.sum() / (labels != -100).sum()) == []


def test_a_mean_taken_by_torch_mean_is_placed_at_the_loss_assignment(tmp_path):
    script = tmp_path / "train.py"
    lines = ["pass\n"] * 16 + ["loss = torch.mean(losses)\n", "pass\n", "pass\n",
                                "loss.backward()\n"]
    script.write_text("".join(lines))
    f = only(_trace(0.5, 0.8, how="ignore_index", at_mean=False, line=20, path=str(script)), SLUG)
    assert f.location.line == 17 and "ignore_index" in f.message and "reduction='none'" in f.fix
