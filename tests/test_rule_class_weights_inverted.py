"""loss_inputs._inverted_weights: per-class weights that grow with the classes' frequency."""

from __future__ import annotations

import torch

from graddoctor.instrument.loss_inputs import _inverted_weights


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


def test_weights_proportional_to_the_counts_are_found_and_their_inverse_is_not():
    counts = t(700, 200, 70, 30)
    found = _inverted_weights("cross_entropy", counts, counts / counts.sum())
    assert found is not None and found["classes"] == [0, 3]
    assert _inverted_weights("cross_entropy", counts, counts.sum() / (4 * counts)) is None
    assert _inverted_weights("cross_entropy", counts, (counts.sum() / counts).sqrt()) is None


def test_balanced_targets_flat_weights_and_unordered_costs_are_left_alone():
    assert _inverted_weights("cross_entropy", t(100, 90, 80), t(3, 2, 1)) is None  # balanced
    assert _inverted_weights("cross_entropy", t(700, 200, 30), t(1.2, 1.0, 0.8)) is None  # flat
    assert _inverted_weights("cross_entropy", t(700, 200, 70, 30), t(1, 5, 2, 3)) is None
    assert _inverted_weights("cross_entropy", t(700, 0, 30), t(1, 9, 1)) is None  # two present, equal


def test_two_classes_and_pos_weight():
    assert _inverted_weights("cross_entropy", t(900, 100), t(0.9, 0.1)) is not None
    assert _inverted_weights("cross_entropy", t(900, 100), t(0.1, 0.9)) is None
    pos, neg = t(10, 50, 400), t(990, 950, 600)
    stack = torch.stack([pos, neg])
    assert _inverted_weights("binary_cross_entropy_with_logits", stack, pos / neg) is not None
    assert _inverted_weights("binary_cross_entropy_with_logits", stack, neg / pos) is None
    common = torch.stack([t(800.0), t(200.0)])
    assert _inverted_weights("binary_cross_entropy_with_logits", common, t(0.5)) is None


def test_the_finding_points_at_the_call_that_passes_the_weights(tmp_path):
    from graddoctor import events as ev
    from graddoctor.analysis import Analysis
    from graddoctor.rules.class_weights_inverted import ClassWeightsInverted
    from graddoctor.trace import Location, TraceBuilder

    path = tmp_path / "train.py"
    path.write_text("import torch\ncriterion = torch.nn.CrossEntropyLoss(weight=w)\n\n\nloss = criterion(out, y)\n")
    t = TraceBuilder(str(path))
    t.trace.put(ev.class_weights(fn="cross_entropy", classes=[0, 3], shares=[0.7, 0.03],
                                 weights=[0.7, 0.03]), Location(str(path), 5))
    [f] = ClassWeightsInverted().check(Analysis(t.trace))
    assert f.location.line == 2 and [r.location.line for r in f.related] == [5]
    assert "class 0 (70 % of the targets seen) weighs 0.7" in f.message
    t = TraceBuilder(str(path))
    t.trace.put(ev.class_weights(fn="binary_cross_entropy_with_logits", classes=[1], shares=[0.05],
                                 weights=[0.05]), Location(str(path), 5))
    [f] = ClassWeightsInverted().check(Analysis(t.trace))
    assert f.location.line == 5 and "pos_weight" in f.fix  # no BCEWithLogitsLoss(pos_weight=) call


def test_pos_weight_upside_down_for_a_minority_that_is_not_rare():
    counts = torch.tensor([[40.0, 60.0], [60.0, 40.0]], dtype=torch.float64)  # positives, negatives
    bce = "binary_cross_entropy_with_logits"
    found = _inverted_weights(bce, counts, torch.tensor([0.667, 1.5], dtype=torch.float64))
    assert found is not None and found["classes"] == [0]  # 40 % positives weighed 40 / 60
    assert _inverted_weights(bce, counts, torch.tensor([1.5, 0.667], dtype=torch.float64)) is None
    # a pos_weight below 1 that is not the ratio (a precision trade-off), a majority weighed down
    assert _inverted_weights(bce, counts, torch.tensor([0.3, 1.0], dtype=torch.float64)) is None


class _Rec:
    def __init__(self):
        self.emitted = []

    def emit_aside(self, made, loc):
        self.emitted.append(made)

    def here(self):
        return None

    def internal_error(self, what, exc):
        raise exc

    def retire(self, topic, fn):
        pass


def _labels():
    return torch.cat([torch.zeros(96), torch.ones(24), torch.full((8,), 2)]).long()


def test_a_class_table_multiplied_into_the_per_sample_loss_by_hand_is_read_from_the_graph():
    import torch.nn.functional as F

    from graddoctor.instrument.handweights import HandWeightWatcher

    torch.manual_seed(0)
    y = _labels()
    logits = torch.randn(128, 3, requires_grad=True)
    counts = torch.bincount(y, minlength=3).float()
    ce = F.cross_entropy(logits, y, reduction="none")
    rec = _Rec()
    watcher = HandWeightWatcher(rec)
    watcher.describe_loss(((counts.sum() / counts)[y] * ce).mean())  # inverse: as meant
    pt = torch.exp(-ce)
    watcher.describe_loss((torch.rand(128) * ce).mean())  # per-sample weights: no class table
    assert rec.emitted == []
    watcher.describe_loss(((counts / counts.sum())[y] * (1 - pt) ** 2 * ce).mean())  # focal beside
    assert len(rec.emitted) == 1
    kind, data = rec.emitted[0]
    assert kind == "class_weights" and data["by_hand"] and data["classes"][0] == 0


def test_the_hand_applied_finding_points_at_the_tables_statement(tmp_path):
    from graddoctor import events as ev
    from graddoctor.trace import TraceBuilder
    from rule_traces import P, only

    path = tmp_path / "train.py"
    path.write_text("import torch\n"
                    "counts = torch.bincount(labels).float()\n"
                    "w = counts / counts.sum()\n"
                    "w = w / w.mean()\n"
                    "for xb, yb in loader:\n"
                    "    ce = F.cross_entropy(model(xb), yb, reduction='none')\n"
                    "    loss = (w[yb] * ce).mean()\n"
                    "    loss.backward(); opt.step()\n")
    tb = TraceBuilder(str(path))
    tb.optimizer(0, P, line=1)
    tb.put(ev.class_weights(fn="cross_entropy", classes=[0, 2], shares=[0.75, 0.06],
                            weights=[2.4, 0.19], by_hand=True), 8)
    tb.backward(fresh=P, line=8)
    tb.step(line=8)
    f = only(tb, "class-weights-inverted")
    assert f.location.line == 3 and f.message.startswith("`w`, looked up by each sample's label")
    assert f.fix.startswith("invert it: w = 1 / counts")
