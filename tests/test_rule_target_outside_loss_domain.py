"""target-outside-loss-domain: each loss's target is judged against the domain torch documents
for it (lossdomain.DOMAINS), on the first calls a gradient flows through; the messages and
fixes follow what the targets look like."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.lossdomain import DOMAINS, judge, judge_ctc
from graddoctor.rules.engine import analyze
from rule_traces import builder


def _problem(kind, target, **kw):
    found = judge(kind, target, **kw)
    return found and found["problem"]


def test_unit_targets_leave_zero_one_as_masks_signs_indices_and_scores():
    mask = ((torch.rand(4, 1, 5, 5) > 0.5) * 255).float()
    assert _problem("unit", mask) == "outside-unit"
    found = judge("unit", mask)
    assert found["high"] == 255 and found["integral"] is True
    assert _problem("unit", torch.tensor([-1.0, 1.0, 1.0])) == "outside-unit"
    assert _problem("unit", torch.tensor([0.0, 3.0, 1.0])) == "outside-unit"
    assert judge("unit", torch.randn(50) * 3)["integral"] is False
    # what BCE reads: labels, smoothed labels, probabilities, a 1.0 rounded above 1
    assert judge("unit", torch.tensor([0.0, 1.0, 1.0])) is None
    assert judge("unit", torch.tensor([0.05, 0.95])) is None
    assert judge("unit", torch.rand(40)) is None
    assert judge("unit", torch.tensor([1.0 + 1e-5, 0.0])) is None
    assert judge("unit", mask, maskable=True) is None  # reduction="none" or a weight may mask


def test_sign_targets_holding_zero_one_labels_and_not_ties():
    assert _problem("sign", torch.tensor([0.0, 1.0, 1.0, 0.0])) == "zero-one"
    assert _problem("sign", torch.tensor([0.0, 2.0, 1.0])) == "zero-one"  # class indices
    assert judge("sign", torch.tensor([-1.0, 1.0, 1.0])) is None
    assert judge("sign", torch.tensor([-1.0, 0.0, 1.0])) is None  # torch.sign of tied scores
    assert judge("sign", torch.ones(5)) is None  # a batch of positives only
    assert judge("sign", torch.tensor([0.0, 1.0]), maskable=True) is None


def test_distribution_rows_with_several_labels_or_negative_values():
    multi_hot = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    assert _problem("distribution", multi_hot, classes=3) == "multi-label"
    assert _problem("distribution", multi_hot * 0.8 + 0.1, classes=3) == "multi-label"
    assert _problem("distribution", torch.randn(4, 3), classes=3) == "negative"
    # (N, C, d) targets: the rows run along dim 1
    per_pixel = torch.zeros(2, 3, 4)
    per_pixel[:, 0], per_pixel[:, 2] = 1.0, 1.0
    assert _problem("distribution", per_pixel, classes=3) == "multi-label"
    one_hot = F.one_hot(torch.tensor([0, 2, 1, 1]), 3).float()
    assert judge("distribution", one_hot, classes=3) is None
    assert judge("distribution", 0.5 * one_hot + 0.5 * one_hot.flip(0), classes=3) is None  # mixup
    assert judge("distribution", one_hot * 0.9 + 0.1 / 3, classes=3) is None  # smoothed
    assert judge("distribution", torch.softmax(torch.randn(4, 3), 1), classes=3) is None
    assert judge("distribution", torch.tensor([[3.0, 0.0, 2.0]]), classes=3) is None  # counts
    assert judge("distribution", torch.zeros(2, 3), classes=3) is None  # rows masked to zero


def test_kl_counts_and_index_lists():
    log_q = F.log_softmax(torch.randn(4, 5), 1)
    assert _problem("kl", log_q) == "log-target"
    assert judge("kl", log_q, log_target=True) is None
    assert _problem("kl", log_q.exp(), log_target=True) == "prob-target"
    assert judge("kl", log_q.exp()) is None
    assert _problem("count", torch.randn(20)) == "negative"
    assert judge("count", torch.poisson(torch.full((20,), 2.0))) is None
    assert _problem("index-list", torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0]])) == "multi-label"
    assert judge("index-list", torch.tensor([[3, 0, -1, -1], [1, -1, -1, -1]])) is None
    assert judge("index-list", torch.tensor([[0, 1], [1, 0]])) is None  # two classes: both listed


def _ctc(targets, target_lengths, input_lengths=None, *, classes=10, blank=0, zero_infinity=False):
    batch = len(target_lengths) if not isinstance(target_lengths, int) else 1
    if input_lengths is None:
        input_lengths = [30] * batch
    found = judge_ctc(torch.as_tensor(targets), target_lengths, input_lengths, classes=classes,
                      batch=batch, blank=blank, zero_infinity=zero_infinity)
    return found and (found["problem"], found.get("detail"))


def test_ctc_labels_that_are_the_blank_or_past_the_classes_within_the_lengths():
    assert _ctc([0, 1, 2, 3, 0], [3, 2]) == ("blank", None)  # labels numbered from 0
    assert judge_ctc(torch.tensor([0, 1, 2, 3, 0]), [3, 2], [30, 30], classes=10, batch=2)["share"] == 0.4
    assert _ctc([1, 2, 9, 3], [2, 2], blank=9) == ("blank", None)  # blank=C-1 is a letter
    assert _ctc([1, 2, 9, 3], [2, 2], blank=-1) == ("blank", None)
    assert _ctc([[1, 10, 2], [3, 4, 0]], [3, 2]) == ("out-of-range", None)  # torch reads past C
    assert _ctc([[1, 2, -1], [3, 4, 5]], [3, 3]) == ("out-of-range", "negative")  # -1 padding read
    # padded rows whose lengths are the padded width: the padding (0, the blank) is read
    assert _ctc([[3, 1, 0, 0], [5, 8, 2, 6], [7, 0, 0, 0]], [4, 4, 4]) == ("blank", "padding")
    # a blank inside a row is a collision, not padding
    assert _ctc([[3, 0, 1, 0], [5, 8, 2, 6]], [4, 4]) == ("blank", None)


def test_ctc_targets_the_loss_reads_as_label_sequences():
    assert _ctc([1, 2, 3, 4, 5], [3, 2]) is None
    assert _ctc([[3, 1, 0, 0], [5, 8, 2, 6], [7, 0, 0, 0]], [2, 4, 1]) is None  # 0s past the lengths
    assert _ctc([[3, 1, -1], [5, 8, 2], [7, 99, -1]], [2, 3, 1]) is None  # anything past them
    assert _ctc([1, 2, 3, 7, 7], [3, 2], blank=9) is None  # blank last, labels 0..8
    assert _ctc([1, 2, 3, 0], [3, 1], blank=9) is None
    assert _ctc([4, 2, 6], 3) is None  # an unbatched call: one sequence, scalar length
    assert _ctc([], [0, 0]) is None
    assert _ctc([[1.0, 2.0]], [2]) is None  # float targets: torch rejects them
    assert _ctc([1, 2, 3], [3, 2]) is None  # lengths past the targets: torch rejects them
    assert judge_ctc(torch.tensor([1, 2]), [[1], [1]], [30, 30], classes=10, batch=2) is None
    assert judge_ctc(torch.tensor([1, 2]), "2", [30, 30], classes=10, batch=2) is None


def test_ctc_sequences_too_long_for_their_frames_only_with_zero_infinity_and_many():
    long_rows = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], [1, 2, 0, 0, 0, 0], [3, 0, 0, 0, 0, 0]]
    frames = [4, 4, 8, 8]
    assert _ctc(long_rows, [6, 6, 2, 1], frames, zero_infinity=True) == ("unalignable", None)
    assert _ctc(long_rows, [6, 6, 2, 1], frames) is None  # without zero_infinity the loss is inf
    # one outlier of eight: what zero_infinity is for
    assert _ctc(long_rows * 2, [6, 2, 2, 1, 2, 2, 2, 1], frames * 2, zero_infinity=True) is None
    # repeated labels need a blank between them: 3 labels with a repeat need 4 frames
    repeated = [[1, 1, 2], [2, 2, 3]]
    assert _ctc(repeated, [3, 3], [3, 3], zero_infinity=True) == ("unalignable", None)
    assert _ctc(repeated, [3, 3], [4, 4], zero_infinity=True) is None
    # a repeat across the boundary of two concatenated sequences is no repeat
    assert _ctc([1, 2, 2, 3], [2, 2], [2, 2], zero_infinity=True) is None


def test_the_watcher_reads_ctc_calls_of_the_function_and_the_module():
    def run():
        model = nn.Linear(4, 6)
        lp = model(torch.randn(12, 2, 4)).log_softmax(-1)
        F.ctc_loss(lp, torch.tensor([0, 1, 2, 3]), [12, 12], [2, 2]).backward(retain_graph=True)
        nn.CTCLoss(blank=5)(lp, torch.tensor([[1, 2], [3, 5]]), torch.tensor([12, 12]),
                            torch.tensor([2, 2])).backward(retain_graph=True)
        nn.CTCLoss()(lp, torch.tensor([[1, 2], [3, 6]]), [12, 12], [2, 2]).backward(retain_graph=True)
        F.ctc_loss(lp, torch.tensor([1, 2, 3, 4]), [12, 12], [2, 2]).backward(retain_graph=True)
        with torch.no_grad():
            F.ctc_loss(lp, torch.tensor([0, 0]), [12, 12], [1, 1])

    assert _recorded(run) == [("ctc_loss", "blank"), ("ctc_loss", "blank"),
                              ("ctc_loss", "out-of-range")]


def _recorded(run):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        run()
    return [(e["fn"], e["problem"]) for e in rec.trace.of_kind("target_domain")]


def test_the_watcher_reads_functions_and_modules_on_calls_with_a_gradient():
    def run():
        model = nn.Linear(4, 3)
        x = torch.randn(8, 4)
        zero_one = (torch.randn(8, 3) > 0).float()
        nn.BCEWithLogitsLoss()(model(x), zero_one * 255).backward()
        nn.SoftMarginLoss()(model(x), zero_one).backward()
        a, b = model(x), model(torch.randn(8, 4))
        F.margin_ranking_loss(a[:, 0], b[:, 0], target=zero_one[:, 0], margin=0.2).backward()
        F.cross_entropy(input=model(x), target=torch.ones(8, 3)).backward()
        nn.KLDivLoss(reduction="batchmean")(F.log_softmax(model(x), 1),
                                            F.log_softmax(torch.randn(8, 3), 1)).backward()
        F.poisson_nll_loss(model(x), torch.randn(8, 3)).backward()
        nn.MultiLabelMarginLoss()(model(x), zero_one.long()).backward()

    assert _recorded(run) == [("binary_cross_entropy_with_logits", "outside-unit"),
                              ("soft_margin_loss", "zero-one"), ("margin_ranking_loss", "zero-one"),
                              ("cross_entropy", "multi-label"), ("kl_div", "log-target"),
                              ("poisson_nll_loss", "negative"), ("multilabel_margin_loss", "multi-label")]


def test_metrics_masked_losses_and_late_calls_are_not_judged():
    def run():
        model = nn.Linear(4, 1)
        x = torch.randn(8, 4)
        mask = ((torch.rand(8, 1) > 0.5) * 255).float()
        with torch.no_grad():
            F.binary_cross_entropy_with_logits(model(x), mask)  # an evaluation metric
        F.binary_cross_entropy_with_logits(model(x).detach(), mask)  # no gradient flows
        (F.binary_cross_entropy_with_logits(model(x), mask, reduction="none") * (mask != 255)).mean().backward()
        F.binary_cross_entropy_with_logits(model(x), mask, weight=(mask != 255).float()).backward()
        for _ in range(8):  # the first calls of a function are judged, not the later ones
            F.soft_margin_loss(model(x), torch.sign(torch.randn(8, 1))).backward()
        F.soft_margin_loss(model(x), (mask > 0).float()).backward()

    assert _recorded(run) == []


def test_the_losses_compute_what_they_compute_without_graddoctor():
    torch.manual_seed(0)
    x, t = torch.randn(6, 4, requires_grad=True), (torch.rand(6, 4) > 0.5).float()

    def losses():  # one call per line: a line is recorded once
        bce = F.binary_cross_entropy_with_logits(x, t * 255)
        margin = F.soft_margin_loss(x, t)
        ce = F.cross_entropy(x, t)
        poisson = F.poisson_nll_loss(x, -t)
        ctc = F.ctc_loss(x.log_softmax(-1).unsqueeze(1).expand(6, 2, 4), torch.tensor([0, 1, 2, 2]),
                         [6, 6], [2, 2], reduction="sum")
        return torch.stack([bce, margin, ce, poisson, ctc])

    plain = losses()
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        watched = losses()
    assert torch.equal(plain, watched)
    assert len(rec.trace.of_kind("target_domain")) == 5


def _finding(**data):
    t = builder()
    t.event("target_domain", **{"share": None, "integral": None, "classes": None, **data})
    found, errors = analyze(t.trace)
    assert not errors
    [finding] = [f for f in found if f.rule == "target-outside-loss-domain"]
    return finding.message, finding.fix


@pytest.mark.parametrize("data, said, fix", [
    ({"fn": "binary_cross_entropy_with_logits", "problem": "outside-unit", "low": 0.0, "high": 255.0,
      "integral": True, "share": 0.4}, "0/255", "divide the mask by 255"),
    ({"fn": "binary_cross_entropy_with_logits", "problem": "outside-unit", "low": -1.0, "high": 1.0,
      "integral": True}, "-1/+1", "(y + 1) / 2"),
    ({"fn": "binary_cross_entropy_with_logits", "problem": "outside-unit", "low": 0.0, "high": 4.0,
      "integral": True}, "class indices", "cross_entropy"),
    ({"fn": "binary_cross_entropy_with_logits", "problem": "outside-unit", "low": -3.2, "high": 2.5,
      "integral": False}, "no probabilities", "torch.sigmoid"),
    ({"fn": "soft_margin_loss", "problem": "zero-one", "low": 0.0, "high": 1.0, "integral": True},
     "log 2", "2 * y - 1"),
    ({"fn": "margin_ranking_loss", "problem": "zero-one", "low": 0.0, "high": 1.0}, "= margin", "2 * y - 1"),
    ({"fn": "cosine_embedding_loss", "problem": "zero-one", "low": 0.0, "high": 1.0},
     "never pushed apart", "-1 for dissimilar"),
    ({"fn": "cross_entropy", "problem": "multi-label", "low": 0.0, "high": 1.0, "classes": 5},
     "compete through the softmax", "BCEWithLogitsLoss"),
    ({"fn": "multilabel_margin_loss", "problem": "multi-label", "low": 0, "high": 1},
     "classes 0 and 1", "padded with -1"),
    ({"fn": "kl_div", "problem": "log-target", "low": -3.0, "high": -0.1}, "NaN", "log_target=True"),
    ({"fn": "kl_div", "problem": "prob-target", "low": 0.01, "high": 0.9}, "log_target=True", "F.log_softmax"),
    ({"fn": "poisson_nll_loss", "problem": "negative", "low": -1.7, "high": 2.0}, "no minimum", "raw counts"),
    ({"fn": "cross_entropy", "problem": "negative", "low": -2.5, "high": 3.0}, "soft targets", "F.softmax"),
    ({"fn": "ctc_loss", "problem": "blank", "low": 0, "high": 7, "share": 0.2, "blank": 0, "classes": 9},
     "20 % of the labels", "start=1"),
    ({"fn": "ctc_loss", "problem": "blank", "low": 0, "high": 9, "share": 0.1, "blank": 9, "classes": 10},
     "the blank 9", "len(vocab) + 1"),
    ({"fn": "ctc_loss", "problem": "blank", "low": 0, "high": 8, "share": 0.3, "blank": 0, "classes": 9,
      "detail": "padding"}, "padded width", "real length"),
    ({"fn": "ctc_loss", "problem": "out-of-range", "low": 1, "high": 6, "share": 0.1, "blank": 0,
      "classes": 6}, "6 classes", "6 + 1 outputs"),
    ({"fn": "ctc_loss", "problem": "out-of-range", "low": -1, "high": 8, "share": 0.1, "blank": 0,
      "classes": 10, "detail": "negative"}, "padding read as a label", "real length"),
    ({"fn": "ctc_loss", "problem": "unalignable", "low": 1, "high": 13, "share": 0.5, "blank": 0,
      "classes": 14}, "zero_infinity=True", "input_lengths after"),
])
def test_messages_and_fixes_fit_the_targets(data, said, fix):
    message, given_fix = _finding(**data)
    assert said in message and fix in given_fix
    assert data["fn"] in message


def test_every_patched_loss_exists_in_torch():
    assert all(callable(getattr(F, fn, None)) for fn in DOMAINS)


def test_class_indices_on_masked_scores_and_smoothing_over_minus_infinity():
    from graddoctor.instrument.lossdomain import judge_indices
    sim = torch.randn(6, 6)
    sim.fill_diagonal_(float("-inf"))
    assert judge_indices(sim, torch.arange(6))["problem"] == "masked-target"
    assert judge_indices(sim, torch.tensor([1, 0, 3, 2, 5, 4])) is None  # each row's other view
    fill = torch.randn(4, 6) - 1e9 * torch.eye(4, 6)
    assert judge_indices(fill, torch.arange(4))["problem"] == "masked-target"
    # enormous logits are a diverging model, not a mask, even repeated by a duplicated sample
    diverged = torch.randn(4, 6) * 1e5
    diverged[1] = diverged[0]
    diverged[0, 0] = diverged[1, 0] = -3e5
    assert judge_indices(diverged, torch.tensor([0, 0, 2, 3])) is None
    # an ignored row may sit on a masked entry; one that is read may not
    assert judge_indices(sim, torch.tensor([1, 0, -100, 2, 5, 4])) is None
    assert judge_indices(sim, torch.tensor([0, 0, -100, 2, 5, 4]))["share"] == 0.2
    # (N, C, d) scores: the class axis is 1
    scores = torch.randn(2, 5, 7)
    assert judge_indices(scores, torch.randint(0, 5, (2, 7))) is None
    scores[:, 3] = float("-inf")
    assert judge_indices(scores, torch.full((2, 7), 3))["problem"] == "masked-target"
    assert judge_indices(sim, torch.tensor([1, 0, 3, 2, 5, 4]), smoothing=0.1)["problem"] == "smoothing-masked"
    assert judge_indices(sim.clamp_min(-1e4), torch.tensor([1, 0, 3, 2, 5, 4]), smoothing=0.1) is None


def test_soft_target_rows_summing_to_one_constant_above_one():
    one_hot = F.one_hot(torch.arange(8) % 5, 5).float()
    assert _problem("distribution", one_hot * 0.9 + 0.1, classes=5) == "over-summed"
    assert judge("distribution", one_hot * 0.9 + 0.1, classes=5)["detail"] == "1.4"
    assert _problem("distribution", 0.7 * one_hot + one_hot.flip(0), classes=5) == "over-summed"
    assert judge("distribution", one_hot * 0.9 + 0.1 / 5, classes=5) is None
    assert judge("distribution", one_hot * torch.rand(8, 1), classes=5) is None  # confidence-weighted
    assert judge("distribution", torch.poisson(torch.full((8, 5), 2.0)), classes=5) is None  # counts
    two_labels = one_hot + one_hot.roll(1, dims=1)  # every row two labels: sums to 2
    assert _problem("distribution", two_labels, classes=5) == "multi-label"


def test_hand_written_cross_entropy_reads_its_soft_targets():
    from graddoctor.instrument.handloss import soft_targets
    logits = torch.randn(8, 5, requires_grad=True)
    t = F.one_hot(torch.arange(8) % 5, 5).float() * 0.9 + 0.1
    loss = torch.sum(-t * F.log_softmax(logits, dim=-1), dim=-1).mean()
    (factor, dim), = soft_targets(loss.grad_fn)
    assert torch.equal(factor, -t) and dim == 1
    loss = -(t * torch.log(F.softmax(logits, 1))).sum(1).mean()
    assert len(soft_targets(loss.grad_fn)) == 1
    # a per-sample weight (N, 1) beside the log-probabilities is not a target
    loss = -(torch.rand(8, 1) * F.log_softmax(logits, 1)).sum(1).mean()
    assert soft_targets(loss.grad_fn) == []


def test_rows_without_a_label_beside_rows_peaking_at_one_column():
    import torch
    from graddoctor.instrument.lossdomain import judge
    y = torch.tensor([3, 1, 4, 1, 0, 2, 2, 4])
    wrong = torch.full((8, 5), 0.1 / 4).scatter_(0, y[:, None], 0.9)  # along the batch axis
    found = judge("distribution", wrong, classes=5)
    assert found["problem"] == "unlabelled" and found["detail"] == "0" and 0 < found["share"] < 1
    plain = torch.zeros(8, 5).scatter_(0, y[:, None], 1.0)
    assert judge("distribution", plain, classes=5)["problem"] == "unlabelled"
    right = torch.full((8, 5), 0.1 / 4).scatter_(1, y[:, None], 0.9)
    assert judge("distribution", right, classes=5) is None
    outliers = torch.cat([torch.nn.functional.one_hot(y, 5).float(), torch.full((4, 5), 0.2)])
    assert judge("distribution", outliers, classes=5) is None  # uniform 1/C rows, one-hot floor 0
    masked = torch.nn.functional.one_hot(y, 5).float() * (torch.arange(8) % 3 != 0)[:, None]
    assert judge("distribution", masked, classes=5) is None  # zero rows beside several classes
    one_class = torch.nn.functional.one_hot(torch.full((8,), 2), 5).float()
    assert judge("distribution", one_class, classes=5) is None  # every row labelled


POINTER = """\
def forward(self, h, sent_mask):
    scores = self.score(h).squeeze(-1)
    scores = scores.masked_fill(sent_mask, -1e9)
    return scores


for doc, sent_mask, oracle in loader:
    scores = model(doc, sent_mask)
    loss = F.cross_entropy(scores, oracle)
    loss.backward()
"""


def _masked_target_findings(tmp_path, text, share, line=9):
    from graddoctor import events as ev
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder
    script = tmp_path / "pointer.py"
    script.write_text(text)
    t = TraceBuilder(str(script))
    t.put(ev.target_domain(fn="cross_entropy", problem="masked-target", low=-1e9, high=-1e9,
                           share=share), line)
    t.backward(line=line + 1)
    return list(find_rule("target-outside-loss-domain")().check(Analysis(t.trace)))


def test_every_target_on_a_filled_position_points_at_the_inverted_fill(tmp_path):
    [found] = _masked_target_findings(tmp_path, POINTER, 1.0)
    assert found.location.line == 3
    assert "`scores.masked_fill(~sent_mask, ...)`" in found.fix
    assert "sent_mask" in found.message


def test_some_targets_a_diagonal_mask_or_made_targets_keep_the_loss_line(tmp_path):
    [some] = _masked_target_findings(tmp_path, POINTER, 0.4)
    assert some.location.line == 9
    eye = POINTER.replace("masked_fill(sent_mask, -1e9)", "masked_fill(diag, -1e9)").replace(
        "    scores = self.score", "    diag = torch.eye(h.size(0), dtype=torch.bool)\n    scores = self.score")
    [diagonal] = _masked_target_findings(tmp_path, eye, 1.0, line=10)
    assert diagonal.location.line == 10
    assert "contrastive" in diagonal.message
