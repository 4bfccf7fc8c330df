"""loss-input-mismatch: what made a loss's input is read from the autograd graph through the
operations that keep values, and the messages state the bound the wrong input imposes."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from graddoctor.instrument.loss_inputs import has_log_nearby, producer
from graddoctor.rules.engine import analyze
from rule_traces import builder


def test_producer_sees_through_value_keeping_operations():
    x = torch.randn(4, 3, 5, requires_grad=True)
    probs = x.softmax(-1)
    assert producer(probs.reshape(-1, 5)[:6].float().clamp(1e-6, 1)) == "softmax"
    assert producer(torch.sigmoid(x).squeeze(0).permute(1, 0, 2)) == "sigmoid"
    assert producer(torch.cat([probs, probs.detach().requires_grad_().softmax(-1)])) == "softmax"
    assert producer(torch.cat([probs, x])) is None  # parts disagree
    assert producer(x.log_softmax(-1).view(-1, 5)) == "log"
    assert producer(probs * 2) is None  # scaled: no longer probabilities
    assert producer(x) is None


def test_a_log_op_a_few_levels_up_marks_log_probabilities():
    x = torch.randn(4, 5, requires_grad=True)
    assert has_log_nearby(F.log_softmax(x, 1) * torch.rand(4, 5))
    assert not has_log_nearby(x * 3 + 1)


def _messages(**data):
    t = builder()
    t.event("loss_input", **data)
    found, errors = analyze(t.trace)
    assert not errors
    return [(f.rule, f.message, f.fix) for f in found if f.rule == "loss-input-mismatch"]


def test_messages_state_the_bound_and_fit_the_input():
    [(_, message, fix)] = _messages(fn="cross_entropy", problem="softmax", classes=10)
    assert "23%" in message and "1.46" in message and "drop the softmax" in fix
    [(_, message, fix)] = _messages(fn="binary_cross_entropy_with_logits", problem="sigmoid", classes=1)
    assert "0.5" in message and "drop the sigmoid" in fix
    [(_, message, fix)] = _messages(fn="nll_loss", problem="logits", classes=5)
    assert "without limit" in message and "log_softmax" in fix
    [(_, message, fix)] = _messages(fn="cross_entropy", problem="probabilities", classes=12)
    assert "sums to 1" in message and "softmax" not in fix.split(",")[0]


def test_the_normalised_dimension_is_read_from_the_log_softmax_node():
    from graddoctor.instrument.loss_inputs import normalised_size, producer_node

    x = torch.randn(4, 7, 5, requires_grad=True)
    assert normalised_size(producer_node(x.log_softmax(-1).reshape(-1, 5))[1]) == 5
    assert normalised_size(producer_node(x.log_softmax(0))[1]) == 4
    assert normalised_size(producer_node(x.softmax(-1))[1]) is None
    assert producer(torch.relu(x)) == "relu"


def test_messages_for_a_wrong_dimension_and_a_relu():
    [(_, message, fix)] = _messages(fn="nll_loss", problem="dim", classes=6, normalised=32)
    assert "size 32" in message and "6 classes" in message and "dim=-1" in fix
    [(_, message, fix)] = _messages(fn="cross_entropy", problem="relu", classes=4)
    assert "ReLU" in message and "no gradient" in message and "drop the ReLU" in fix


def test_swapped_arguments_say_so_and_the_fix_swaps_the_scripts_call(tmp_path, monkeypatch):
    [(_, message, fix)] = _messages(fn="binary_cross_entropy_with_logits", problem="swapped", classes=1)
    assert "swapped" in message and "output first" in fix
    script = tmp_path / "train.py"
    script.write_text("import torch\n\nloss = criterion(labels, model(x))\n")
    monkeypatch.chdir(tmp_path)
    t = builder()
    t.event("loss_input", 3, fn="binary_cross_entropy_with_logits", problem="swapped", classes=1)
    [finding] = [f for f in analyze(t.trace)[0] if f.rule == "loss-input-mismatch"]
    assert finding.fix.endswith("criterion(model(x), labels)")


def test_the_watcher_records_swapped_arguments_only_where_the_target_carries_the_gradient():
    from graddoctor.instrument import Instrumentation, Recorder

    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = torch.nn.Linear(4, 3)
        x = torch.randn(8, 4)
        soft = torch.softmax(torch.randn(8, 3), 1)
        F.cross_entropy(soft, model(x)).backward()  # swapped
        F.cross_entropy(model(x), soft).backward()  # right way round
        F.kl_div(torch.log(soft), torch.softmax(model(x), 1), reduction="batchmean").backward()  # KL(q || p)
        with torch.no_grad():
            F.cross_entropy(soft, model(x))  # no gradient: a metric
    problems = [(e["fn"], e["problem"]) for e in rec.trace.of_kind("loss_input")]
    assert problems == [("cross_entropy", "swapped")]


def test_ctc_loss_takes_log_probabilities_over_the_last_dimension():
    """ctc_loss's (T, N, C) input: probabilities or a log_softmax over the batch (dim=1) are
    recorded, with the classes read from the last dimension; log_softmax over the classes,
    before or after a transpose, positional or keyword arguments, is not."""
    from graddoctor.instrument import Instrumentation, Recorder

    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        head = torch.nn.Linear(4, 5)
        scores = head(torch.randn(6, 3, 4))  # (T, N, C)
        lengths, target_lengths = torch.full((3,), 6), torch.full((3,), 2)
        targets = torch.randint(1, 5, (3, 2))
        F.ctc_loss(scores.softmax(-1), targets, lengths, target_lengths).backward()
        F.ctc_loss(head(torch.randn(6, 3, 4)).log_softmax(1), targets, lengths, target_lengths).backward()
        batch_first = head(torch.randn(3, 6, 4)).log_softmax(-1)
        F.ctc_loss(log_probs=batch_first.transpose(0, 1), targets=targets, input_lengths=lengths,
                   target_lengths=target_lengths).backward()
        torch.nn.CTCLoss()(head(torch.randn(6, 3, 4)).log_softmax(2), targets, lengths,
                           target_lengths).backward()
    recorded = [(e["fn"], e["problem"], e["classes"]) for e in rec.trace.of_kind("loss_input")]
    assert recorded == [("ctc_loss", "softmax", 5), ("ctc_loss", "dim", 5)]
    [(_, message, fix)] = _messages(fn="ctc_loss", problem="dim", classes=5, normalised=3)
    assert "dim=1)" in message and "dim=-1" in fix and "dim=1 for" not in fix
    [(_, message, fix)] = _messages(fn="ctc_loss", problem="softmax", classes=5)
    assert "log-probabilities" in message and "F.log_softmax(scores, dim=-1)" in fix


def test_kl_div_given_raw_scores_is_recorded_and_log_probabilities_are_not():
    from torch import nn

    from graddoctor.instrument import Instrumentation, Recorder

    def recorded(make_input):
        torch.manual_seed(0)
        rec = Recorder(step_budget=None)
        model = nn.Linear(6, 5)
        target = torch.softmax(torch.randn(8, 5), 1)
        with Instrumentation(rec):
            F.kl_div(make_input(model(torch.randn(8, 6))), target, reduction="batchmean").backward()
        return [(e["fn"], e["problem"]) for e in rec.trace.of_kind("loss_input")]

    assert recorded(lambda z: z / 2.0) == [("kl_div", "logits")]  # a distillation's scaled logits
    assert recorded(lambda z: F.log_softmax(z, -1)) == []
    assert recorded(lambda z: z - z.logsumexp(-1, keepdim=True)) == []  # normalised by hand
    [(_, message, fix)] = _messages(fn="kl_div", problem="logits", classes=5)
    assert "raw scores" in message and "log_softmax" in fix


def test_rows_that_cut_across_the_reshaped_tensor_are_found():
    import torch

    from graddoctor.instrument.loss_inputs import rows_cut_across

    def flat(shape, move=False):
        t = torch.randn(*shape, requires_grad=True)
        return (t.movedim(1, -1) if move else t).reshape(-1, shape[1])

    assert rows_cut_across(flat((4, 7, 12))) == [4, 7, 12]  # (B, C, T) viewed as (-1, C)
    assert rows_cut_across(flat((4, 7, 3, 5))) == [4, 7, 3, 5]
    assert rows_cut_across(flat((4, 7, 12), move=True)) is None  # classes moved last first
    assert rows_cut_across(flat((4, 7, 1, 1))) is None  # a CNN head's (B, C, 1, 1)
    packed = torch.randn(4, 3 * 7, requires_grad=True).view(-1, 7)  # K heads packed
    assert rows_cut_across(packed) is None
    assert rows_cut_across(torch.log_softmax(flat((4, 7, 12)), dim=-1)) == [4, 7, 12]
    assert rows_cut_across(torch.randn(8, 7, requires_grad=True) * 2) is None  # no reshape


def test_targets_are_matched_against_the_embedded_tokens_in_both_layouts():
    import torch

    from graddoctor.instrument.loss_inputs import _tokens_of

    torch.manual_seed(0)
    data = torch.randint(0, 50, (6, 13))
    ids, nxt = data[:, :-1], data[:, 1:]  # (B, T) inputs and next-token targets
    assert _tokens_of(ids, nxt, -100)  # shifted along the positions
    assert _tokens_of(ids.t(), nxt.t(), -100)  # seq-first: shifted along dim 0
    assert _tokens_of(ids, ids.clone(), -100)  # unshifted (an autoencoder's targets)
    assert not _tokens_of(ids, nxt.t().reshape(6, 12), -100)  # flattened in the other order
    assert not _tokens_of(ids, (ids * 3 + 1) % 50, -100)  # tags, not tokens


def test_a_second_sigmoid_before_bce_is_recorded_and_one_sigmoid_is_not():
    from torch import nn

    from graddoctor.instrument import Instrumentation, Recorder

    def recorded(make_input):
        torch.manual_seed(0)
        rec = Recorder(step_budget=None)
        model = nn.Linear(6, 1)
        target = torch.randint(0, 2, (8, 1)).float()
        with Instrumentation(rec):
            F.binary_cross_entropy(make_input(model(torch.randn(8, 6))), target).backward()
        return [(e["fn"], e["problem"]) for e in rec.trace.of_kind("loss_input")]

    assert recorded(lambda z: torch.sigmoid(torch.sigmoid(z))) == [("binary_cross_entropy", "sigmoid-twice")]
    assert recorded(lambda z: torch.sigmoid(nn.Sigmoid()(z).view(-1, 1))) == [
        ("binary_cross_entropy", "sigmoid-twice")]  # a model's last layer, then the loss code
    assert recorded(lambda z: torch.sigmoid(z)) == []
    assert recorded(lambda z: torch.sigmoid(z) * torch.sigmoid(z + 1)) == []  # a gate
    assert recorded(lambda z: torch.sigmoid(torch.softmax(torch.cat([z, -z], 1), 1)[:, :1])) == [
        ("binary_cross_entropy", "sigmoid-twice")]
    [(_, message, fix)] = _messages(fn="binary_cross_entropy", problem="sigmoid-twice", classes=1)
    assert "0.5" in message and "sigmoid once" in fix


def test_the_normalised_dimension_is_read_through_the_log_of_a_softmax():
    """log(softmax(x, dim) + eps), or of a clamped softmax: the softmax's dimension is read
    past the epsilon; a log of a sum with something trained, or of no softmax, tells nothing."""
    from graddoctor.instrument.loss_inputs import normalised_size, producer_node

    x = torch.randn(6, 4, requires_grad=True)
    assert normalised_size(producer_node(torch.log(F.softmax(x, dim=0) + 1e-8))[1]) == 6
    assert normalised_size(producer_node(torch.log(F.softmax(x, dim=1) + 1e-8))[1]) == 4
    assert normalised_size(producer_node(x.softmax(0).clamp(min=1e-7).log())[1]) == 6
    assert normalised_size(producer_node(torch.log(x.softmax(0) + x.sigmoid()))[1]) is None
    assert normalised_size(producer_node(torch.log(x.sigmoid()))[1]) is None


def test_the_log_of_a_softmax_over_the_batch_is_recorded_and_over_the_classes_is_not():
    from graddoctor.instrument import Instrumentation, Recorder

    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = torch.nn.Linear(4, 3)
        x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
        F.nll_loss(torch.log(F.softmax(model(x), dim=1) + 1e-8), y).backward()
        F.nll_loss(torch.log(F.softmax(model(x), dim=0) + 1e-8), y).backward()
    found = [(e["problem"], e["normalised"]) for e in rec.trace.of_kind("loss_input")]
    assert found == [("log-dim", 8)]
    [(_, message, fix)] = _messages(fn="nll_loss", problem="log-dim", classes=3, normalised=8)
    assert "the log of a softmax" in message and "size 8" in message
    assert "F.log_softmax(scores, dim=-1)" in fix and "in place of torch.log" in fix


def test_a_sigmoid_applied_in_a_statement_of_its_own_is_pointed_at(tmp_path):
    from graddoctor import events as ev
    from graddoctor.trace import TraceBuilder
    from rule_traces import only
    script = tmp_path / "train.py"
    script.write_text(
        "for user, item, label in loader:\n"
        "    prediction = torch.sigmoid(model(user, item))\n"
        "    loss = criterion(prediction, label)\n"
        "    loss.backward()\n"
        "    opt.step()\n")
    t = TraceBuilder(path=str(script))
    t.optimizer(0, [0, 1], line=1)
    t.put(ev.loss_input(fn="binary_cross_entropy_with_logits", problem="sigmoid", classes=2), line=3)
    t.backward(fresh=[0, 1], line=4)
    t.step(0, line=5)
    assert only(t, "loss-input-mismatch").location.line == 2
    # the sigmoid inside the loss call itself: the call's line
    script.write_text(script.read_text().replace(
        "    prediction = torch.sigmoid(model(user, item))\n    loss = criterion(prediction, label)\n",
        "    prediction = model(user, item)\n    loss = criterion(torch.sigmoid(prediction), label)\n"))
    assert only(t, "loss-input-mismatch").location.line == 3
# -- the model's last operation: the line to change ---------------------------------------------

def _end(src: str, kind: str, zero_dim: bool = False):
    import ast
    from graddoctor.rules.model_end import model_end_line
    return model_end_line(ast.parse(src), kind, zero_dim)


def test_the_model_end_is_a_sequentials_last_element_or_a_forwards_return():
    assert _end("m = nn.Sequential(\n  nn.Linear(4, 3),\n  nn.Softmax(dim=1),\n)\n", "softmax") == 3
    assert _end("m = nn.Sequential(nn.Softmax(1), nn.Linear(4, 3))\n", "softmax") is None  # not last
    forward = ("class Net(nn.Module):\n"
               "    def __init__(self):\n"
               "        self.fc = nn.Linear(4, 3)\n"
               "        self.act = nn.Sigmoid()\n"
               "    def forward(self, x):\n"
               "        x = self.act(self.fc(x))\n"
               "        return x\n")
    assert _end(forward, "sigmoid") == 6 and _end(forward, "softmax") is None
    assert _end("class N:\n    def forward(self, x):\n        return F.relu(self.out(x))\n", "relu") == 3
    assert _end("class N:\n    def forward(self, x):\n        return self.out(x).softmax(-1)\n", "softmax") == 3
    # an activation inside the forward, not its last operation
    assert _end("class N:\n    def forward(self, x):\n        x = F.relu(x)\n        return self.out(x)\n",
                "relu") is None


def test_the_model_end_follows_forwards_return_into_a_method_of_the_model():
    vae = ("class VAE(nn.Module):\n"                                         # 1
           "    def decode(self, z):\n"                                      # 2
           "        return torch.sigmoid(self.fc(z))\n"                      # 3
           "    def encode(self, x):\n"                                      # 4
           "        return torch.sigmoid(self.enc(x))\n"                     # 5
           "    def forward(self, x):\n"                                     # 6
           "        mu = self.encode(x)\n"                                   # 7
           "        return self.decode(mu), mu\n")                           # 8
    assert _end(vae, "sigmoid") == 3  # the output comes first; encode's sigmoid is inside
    assert _end(vae.replace("return self.decode(mu), mu", "return mu, self.decode(mu)"), "sigmoid") == 5
    assert _end(vae.replace("return self.decode(mu), mu", "return self.fc2(mu)"), "sigmoid") is None


def test_a_batch_axis_log_softmax_needs_dim_zero_and_two_model_ends_are_ambiguous():
    src = "class N:\n    def forward(self, x):\n        return F.log_softmax(self.fc(x), dim={})\n"
    assert _end(src.format(0), "log_softmax", zero_dim=True) == 3
    assert _end(src.format(1), "log_softmax", zero_dim=True) is None
    assert _end("class N:\n    def forward(self, x):\n        return x.log_softmax(0)\n", "log_softmax", True) == 3
    two = "a = nn.Sequential(nn.Linear(2, 2), nn.Softmax(1))\nb = nn.Sequential(nn.Linear(2, 2), nn.Softmax(1))\n"
    assert _end(two, "softmax") is None


def test_the_finding_points_at_the_models_softmax_with_the_loss_call_related(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("import torch\n"
                      "model = nn.Sequential(nn.Linear(8, 3),\n"
                      "                      nn.Softmax(dim=1))\n"
                      "out = model(x)\n"
                      "loss = criterion(out, y)\n")
    monkeypatch.chdir(tmp_path)
    t = builder()
    t.event("loss_input", 5, fn="cross_entropy", problem="softmax", classes=3)
    [finding] = [f for f in analyze(t.trace)[0] if f.rule == "loss-input-mismatch"]
    assert finding.location.line == 3
    assert [(r.location.line, r.note) for r in finding.related] == [(5, "the loss call that is given these scores")]


def test_a_softmax_computed_beside_the_loss_is_reported_there_not_at_the_models_end(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("import torch\n"
                      "model = nn.Sequential(nn.Linear(8, 3), nn.Softmax(dim=1))\n"
                      "probs = F.softmax(logits, dim=1)\n"
                      "loss = F.cross_entropy(probs, y)\n")
    monkeypatch.chdir(tmp_path)
    t = builder()
    t.event("loss_input", 4, fn="cross_entropy", problem="softmax", classes=3)
    [finding] = [f for f in analyze(t.trace)[0] if f.rule == "loss-input-mismatch"]
    # the statement that applies it, not the model's end (line 2)
    assert finding.location.line == 3 and not finding.related


def test_the_model_end_is_what_a_self_attribute_was_built_as_whatever_its_name():
    import ast

    from graddoctor.rules.model_end import model_end_line
    source = """
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.log_softmax = nn.LogSoftmax()
        self.softmax = nn.Identity()
    def forward(self, x):
        return self.log_softmax(x)
"""
    tree = ast.parse(source)
    assert model_end_line(tree, "log_softmax", True) == 5  # no dim: the constructor line
    assert model_end_line(tree, "softmax", False) is None  # an Identity named softmax
    built_with_dim = source.replace("nn.LogSoftmax()", "nn.LogSoftmax(dim=-1)")
    assert model_end_line(ast.parse(built_with_dim), "log_softmax", True) is None


def test_one_sigmoid_ending_the_model_given_to_two_loss_calls_is_told_once(tmp_path, monkeypatch):
    # L1aoXingyu's logistic regression: `out = F.sigmoid(out)` ends forward, and both the training
    # loss and the evaluation loss get it: one bug, one finding at the model's last line
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "import torch.nn.functional as F\n"
        "class Logistic(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        out = self.logistic(x)\n"
        "        out = F.sigmoid(out)\n"
        "        return out\n"
        "loss = criterion(model(x), y)\n"
        "model.eval()\n"
        "loss = criterion(model(x_test), y_test)\n")
    monkeypatch.chdir(tmp_path)
    t = builder()
    t.event("loss_input", 8, fn="cross_entropy", problem="sigmoid", classes=10)
    t.event("loss_input", 10, fn="cross_entropy", problem="sigmoid", classes=10)
    [finding] = [f for f in analyze(t.trace)[0] if f.rule == "loss-input-mismatch"]
    assert finding.location.line == 6
    assert sorted(r.location.line for r in finding.related) == [8, 10]
