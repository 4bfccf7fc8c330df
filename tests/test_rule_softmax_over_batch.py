"""softmax-over-batch (GD185): hand-written ``softmax_batch`` events over scripts written to a
temporary folder (the rule finds the dim=0 call in the source), the watcher's test of a
result's layout, and the source reading on its own."""

from __future__ import annotations

import textwrap

import torch

from graddoctor import events as ev
from graddoctor.analysis.source import softmax_first_axis_calls
from graddoctor.findings import Severity
from graddoctor.instrument.softmaxbatch import SoftmaxBatchWatcher, over_batch
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "softmax-over-batch"

SCRIPT = """\
import torch
model = make()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    logits = model(x)
    probs = torch.softmax(logits, dim=0)
    loss = dice(probs, y)
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _script(tmp_path, text=SCRIPT):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _trace(path, extra=()):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=3)
    t.put(ev.softmax_batch(fn="softmax", shape=[4, 3, 8, 8], batch=4), 8)
    for kind, line in extra:
        t.put(kind, line)
    for _ in range(4):
        t.backward(fresh=P, line=8)
        t.step(line=8)
    return t


def test_a_softmax_over_the_batch_is_a_warning_at_its_call(tmp_path):
    f = only(_trace(_script(tmp_path)), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 6
    assert "4×3×8×8" in f.message and "4 samples" in f.message
    assert f.fix.startswith("`torch.softmax(logits, dim=1)`")


def test_without_a_dim_0_call_in_the_source_nothing_is_reported(tmp_path):
    text = SCRIPT.replace("dim=0", "dim=axis")
    assert findings(_trace(_script(tmp_path, text)), SLUG) == []


def test_left_to_the_rules_that_already_report_it(tmp_path):
    path = _script(tmp_path)
    in_forward = ev.dependency(model="model", batch=4, source="loader", mixed=True,
                               op="SoftmaxBackward0", op_at=None, seq=None, modules=[], forward=None)
    assert findings(_trace(path, [(in_forward, 5)]), SLUG) == []
    at_the_loss = ev.loss_input(fn="nll_loss", problem="log-dim", classes=3)
    assert findings(_trace(path, [(at_the_loss, 7)]), SLUG) == []
    elsewhere = ev.dependency(model="model", batch=4, source="loader", mixed=True,
                              op="ViewBackward0", op_at=None, seq=None, modules=[], forward=None)
    assert only(_trace(path, [(elsewhere, 5)]), SLUG)


def test_the_layout_of_a_batch_of_samples():
    data = {4}
    assert over_batch((4, 3, 8, 8), 0, data, None)
    assert over_batch((4, 3), -2, data, None)
    assert not over_batch((4, 3, 8, 8), 1, data, None)  # over the classes
    assert not over_batch((4, 4), 0, data, None)  # a (B, B) similarity matrix
    assert not over_batch((4, 1), 0, data, None)  # the instances of one bag
    assert not over_batch((4,), 0, data, None)  # weights over a 1-D batch
    assert not over_batch((4, 3), 0, {7}, None)  # dim 0 is not the data's
    assert not over_batch((4, 3), 0, data, 1)  # the loader serves one bag at a time


class _Rec:
    def subscribe(self, topic, subscriber):  # LossWindow's PARAMS_ADDED
        pass

    def __init__(self):
        self.emitted = []

    def emit_aside(self, made, loc):
        self.emitted.append(made)

    def here(self):
        return None

    def internal_error(self, what, exc):
        raise exc


def test_the_watcher_reads_the_graph_of_the_loss():
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(6, 5)
    rec = _Rec()
    watcher = SoftmaxBatchWatcher(rec)
    bad = (torch.softmax(x @ w, dim=0) * torch.randn(6, 3)).sum()
    watcher.describe_loss(bad)
    good = (torch.softmax(x @ w, dim=1) * torch.randn(6, 3)).sum()
    watcher.describe_loss(good)
    assert rec.emitted == [ev.softmax_batch(fn="softmax", shape=[6, 3], batch=6)]


def test_the_source_reading_finds_each_form_of_dim_0(tmp_path):
    path = _script(tmp_path, """\
        a = torch.softmax(x, 0)
        b = F.log_softmax(x, dim=0)
        c = x.softmax(0)
        d = nn.Softmax(dim=0)
        e = torch.softmax(x, 1)
        f = x.log_softmax(dim=1)
        g = nn.LogSoftmax(0)
        h = x.softmax(-1)
        """)
    assert [line for line, _ in softmax_first_axis_calls(path)] == [1, 2, 3, 4, 7]


def test_the_source_reading_finds_gumbel_softmax_over_dim_0(tmp_path):
    path = _script(tmp_path, """\
        a = F.gumbel_softmax(logits, tau=0.5, hard=True, dim=0)
        b = F.gumbel_softmax(logits, 0.5, True, 1e-10, 0)
        c = F.gumbel_softmax(logits, 0)
        d = F.gumbel_softmax(logits, tau=1.0, dim=-1)
        e = F.gumbel_softmax(logits, 1.0, False, 1e-10, 1)
        """)
    # a lone positional 0 is the temperature, not the dim
    assert [line for line, _ in softmax_first_axis_calls(path)] == [1, 2]


# -- a soft target (without gradient) normalised over the batch -------------------------------

class _TargetRec:
    def subscribe(self, topic, subscriber):  # LossWindow's PARAMS_ADDED
        pass

    def __init__(self):
        self.made = []

    def emit_aside(self, made, loc):
        self.made.append(made[1])

    def here(self):
        return None

    def internal_error(self, what, exc):
        raise exc


def _targets(loss):
    rec = _TargetRec()
    SoftmaxBatchWatcher(rec).describe_loss(loss)
    return [m for m in rec.made if m.get("target")]


def test_a_teacher_target_over_the_batch_is_seen_by_its_values():
    torch.manual_seed(0)
    s = torch.randn(32, 10, requires_grad=True)
    t = torch.randn(32, 10)
    dino = torch.sum(-torch.softmax(t / 0.04, dim=0).chunk(2)[0] * torch.log_softmax(s[:16], -1), -1).mean()
    assert _targets(dino) == [{"fn": "softmax", "shape": [16, 10], "batch": 16, "target": True}]
    kl = torch.nn.functional.kl_div(torch.log_softmax(s, 1), torch.softmax(t, 0), reduction="batchmean")
    assert len(_targets(kl)) == 1
    ce = torch.nn.functional.cross_entropy(s, torch.softmax(t / 2, dim=0))
    assert len(_targets(ce)) == 1


def test_targets_that_are_distributions_over_the_classes_are_not_reported():
    torch.manual_seed(0)
    s = torch.randn(32, 10, requires_grad=True)
    t = torch.randn(32, 10)
    right = torch.sum(-torch.softmax(t / 0.04, dim=-1) * torch.log_softmax(s, -1), -1).mean()
    smooth = torch.nn.functional.one_hot(torch.arange(32) % 10, 10).float() * 0.9 + 0.01
    multi_hot = (t > 0).float()  # 0/1 rows: target-outside-loss-domain's, not this one's
    loss = right + torch.sum(-smooth * torch.log_softmax(s, -1), -1).mean() \
        + torch.sum(-multi_hot * torch.log_softmax(s, -1), -1).mean()
    assert _targets(loss) == []


def test_a_target_event_gets_the_target_message(tmp_path):
    path = _script(tmp_path, SCRIPT.replace("probs = torch.softmax(logits, dim=0)",
                                            "probs = torch.softmax(teacher(x), dim=0)"))
    t = TraceBuilder(path)
    t.optimizer(0, P, line=3)
    t.put(ev.softmax_batch(fn="softmax", shape=[16, 10], batch=16, target=True), 8)
    for _ in range(2):
        t.backward(fresh=P, line=8)
        t.step(line=8)
    f = only(t, SLUG)
    assert f.location.line == 6 and "soft target" in f.message
    assert f.fix.startswith("`torch.softmax(teacher(x), dim=-1)`")


SHARPENED = """\
import torch
model = make()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    q = probs ** 2
    q = q / q.sum(dim=0, keepdim=True)
    loss = -(q * F.log_softmax(model(x), dim=1)).sum(1).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _target_trace(path):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=3)
    t.put(ev.softmax_batch(fn="softmax", shape=[16, 10], batch=16, target=True), 8)
    for _ in range(2):
        t.backward(fresh=P, line=8)
        t.step(line=8)
    return t


def test_a_target_normalised_by_its_sum_over_the_batch_is_named_at_the_division(tmp_path):
    f = only(_target_trace(_script(tmp_path, SHARPENED)), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 6
    assert "`q / q.sum(dim=0, keepdim=True)`" in f.message and "sum over dim 0" in f.message
    assert f.fix.startswith("`q / q.sum(dim=-1, keepdim=True)`")
    inplace = SHARPENED.replace("q = q / q.sum(dim=0, keepdim=True)", "q /= q.sum(0)")
    f = only(_target_trace(_script(tmp_path, inplace)), SLUG)
    assert f.location.line == 6 and f.fix.startswith("`q /= q.sum(-1, keepdim=True)`")


def test_a_sum_over_the_batch_that_makes_no_target_is_not_named(tmp_path):
    # the division feeds no product with a log-probability: features scaled by column sums
    text = SHARPENED.replace("q = q / q.sum(dim=0, keepdim=True)",
                             "x = x / x.sum(dim=0, keepdim=True)")
    assert findings(_target_trace(_script(tmp_path, text)), SLUG) == []


def test_the_fix_names_the_class_axis_of_each_layout():
    from graddoctor.rules.softmax_over_batch import _class_dim
    assert _class_dim({"fn": "softmax", "shape": [32, 6, 5]}, "F.gumbel_softmax(logits, tau=t, dim=0)")[0] == -1
    assert _class_dim({"fn": "softmax", "shape": [16, 7, 11]}, "out(h).log_softmax(dim=0)")[0] == -1
    assert _class_dim({"fn": "softmax", "shape": [32, 4]}, "torch.softmax(x, dim=0)")[0] == 1
    assert _class_dim({"fn": "softmax", "shape": [8, 3, 16, 16]}, "torch.softmax(x, dim=0)")[0] == 1


def test_a_hand_written_cross_entropys_gathered_classes_give_the_targets_batch():
    import torch
    from graddoctor.instrument.graphpaths import post_order
    from graddoctor.instrument.softmaxbatch import _target_leading
    probs = torch.softmax(torch.randn(6, 3, requires_grad=True), dim=1)
    y = torch.randint(0, 3, (6,))
    loss = -torch.log(probs.gather(1, y[:, None])).mean()
    assert _target_leading(post_order(loss.grad_fn, 1000)) == {6}
    # a gather along the first axis picks steps, not classes: no target read
    picked = -torch.log(probs.gather(0, torch.zeros(1, 3, dtype=torch.long))).mean()
    assert _target_leading(post_order(picked.grad_fn, 1000)) == set()


def test_a_sequence_first_tensor_whose_axis_1_is_the_targets_batch_is_not_over_the_batch():
    from graddoctor.instrument.softmaxbatch import over_batch
    # (T=9, B=16, 1) attention weights over time: the targets are 16 long, the data 9 long first
    assert not over_batch((9, 16, 1), 0, {9}, None, {16})
    # (B=16, C=5) probabilities over the batch: the targets are as long as dim 0
    assert over_batch((16, 5), 0, {16}, None, {16})
    # no target read: as before
    assert over_batch((9, 16, 1), 0, {9}, None, set())


# -- a pseudo-label's top class read from a softmax over the batch (source only) ---------------

def _pseudo_label_trace(tmp_path, body: str):
    from graddoctor.trace import TraceBuilder

    script = tmp_path / "train.py"
    script.write_text("import torch\n" + body + "loss.backward()\n")
    line = len(body.splitlines()) + 2
    t = TraceBuilder(path=str(script))
    t.backward(fresh=[0], line=line)
    return t


def test_a_pseudo_label_taken_from_a_softmax_over_the_batch_is_found(tmp_path):
    from rule_traces import only

    t = _pseudo_label_trace(tmp_path, (
        "p = torch.softmax(weak.detach(), dim=0)\n"      # 2
        "conf, pseudo = torch.max(p, dim=-1)\n"          # 3
        "loss = (ce(strong, pseudo) * (conf > 0.9)).mean()\n"))
    f = only(t, "softmax-over-batch")
    assert f.location.line == 2 and "dim=-1" in f.fix and f.evidence["pseudo_label"]


def test_a_renormalised_softmax_or_a_single_vector_is_silent(tmp_path):
    from rule_traces import findings

    t = _pseudo_label_trace(tmp_path, (
        "q = torch.softmax(scores, dim=0)\n"
        "q = q / q.sum(dim=1, keepdim=True)\n"
        "codes = q.argmax(dim=1)\n"
        "probs = torch.softmax(policy(state), dim=0)\n"
        "action = probs.argmax()\n"
        "loss = ce(scores, codes)\n"))
    assert findings(t, "softmax-over-batch") == []
