"""grads-always-zero (GD124): hand-written traces, and the ``grad_stops`` diagnosis the
gradient-stop watcher (instrument/gradstop.py) records."""

from __future__ import annotations

import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import builder, findings, only

SLUG = "grads-always-zero"
PARAMS = [0, 1, 2, 3]  # enc.weight, enc.bias, head.weight, head.bias


def _loop(norms_of, updates=4, stops=("RoundBackward0",), reached=(0, 1), loss_zero=False,
          diagnose_at=1, names=None):
    """Updates whose step_begin carries ``norms_of(i)``; a diagnosis after update ``diagnose_at``."""
    t = TraceBuilder()
    for pid, name in zip(PARAMS, names or ()):
        t.param(pid, name)
    t.optimizer(0, PARAMS, line=1)
    for i in range(updates):
        t.clear(PARAMS, line=20)
        t.backward(fresh=PARAMS, line=21)
        if i == diagnose_at and stops is not None:
            t.put(ev.grad_stops(params=list(reached), stops=list(stops), loss_zero=loss_zero), 21)
        t.event("step_begin", 22, opt=0, closure=False, norm_pids=PARAMS, norms=list(norms_of(i)),
                nonfinite=[])
        t.step(line=22)
    return t


def test_parameters_zero_at_every_update_behind_a_zero_derivative_op_are_a_warning():
    f = only(_loop(lambda i: [0.0, 0.0, 1.0, 0.5]), SLUG)
    assert f.severity is Severity.WARNING
    assert f.evidence["params"] == ["p0", "p1"] and f.evidence["stops_at"] == "RoundBackward0"
    assert not f.evidence["all_parameters"] and "zero derivative" in f.message


def test_silent_when_a_gradient_is_zero_only_at_first():
    # LoRA's A, a ReZero gate's block: zero at the first update, then they train
    assert findings(_loop(lambda i: [0.0 if i == 0 else 0.3, 0.1, 1.0, 0.5]), SLUG) == []


def test_silent_without_a_diagnosis_or_with_too_few_measured_updates():
    assert findings(_loop(lambda i: [0.0, 0.0, 1.0, 0.5], stops=None), SLUG) == []
    assert findings(_loop(lambda i: [0.0, 0.0, 1.0, 0.5], updates=1, diagnose_at=0), SLUG) == []


def test_a_multiplication_by_zero_counts_only_when_every_gradient_is_zero():
    # part of a model behind `0 * sum(p.sum())` (kept in DDP's graph on purpose): silent
    assert findings(_loop(lambda i: [0.0, 0.0, 1.0, 0.5], stops=("MulBackward0",)), SLUG) == []
    f = only(_loop(lambda i: [0.0] * 4, stops=("MulBackward0",), reached=PARAMS, loss_zero=True), SLUG)
    assert f.evidence["all_parameters"] and "factor that is 0" in f.message


def test_every_gradient_zero_from_some_update_on_names_that_update():
    f = only(_loop(lambda i: [0.2] * 4 if i < 2 else [0.0] * 4, updates=5, diagnose_at=2,
                   stops=("ClampBackward1",), reached=PARAMS), SLUG)
    assert f.evidence["all_parameters"] and "from update 3 on" in f.message
    assert "saturated" in f.message


def test_silent_on_a_hinge_loss_at_exactly_zero():
    assert findings(_loop(lambda i: [0.0] * 4, stops=("ClampMinBackward0",), reached=PARAMS,
                          loss_zero=True), SLUG) == []


def test_silent_when_the_zero_is_a_clear_by_hand():
    t = builder(params=PARAMS)
    for i in range(3):
        t.clear(PARAMS, line=20)
        t.backward(fresh=PARAMS, line=21)
        if i == 1:
            t.put(ev.grad_stops(params=[0, 1], stops=["RoundBackward0"], loss_zero=False), 21)
        t.put(ev.grad_edit(opt=0, params=[0, 1]), 22)
        t.event("step_begin", 22, opt=0, closure=False, norm_pids=PARAMS, norms=[0.0, 0.0, 1.0, 0.5],
                nonfinite=[])
        t.step(line=22)
    assert findings(t, SLUG) == []


def test_the_watcher_finds_where_the_gradient_stops_and_leaves_the_backward_unchanged():
    def run(instrumented: bool):
        torch.manual_seed(0)
        enc, head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)
        opt = torch.optim.SGD([*enc.parameters(), *head.parameters()], lr=0.1)
        grads = []
        for _ in range(3):
            x = torch.randn(16, 4)
            loss = head(torch.round(torch.sigmoid(enc(x)) * 3) / 3).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            grads.append([p.grad.clone() for p in head.parameters()])
            opt.step()
        return grads

    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        checked = run(True)
    plain = run(False)
    assert all(torch.equal(a, b) for ga, gb in zip(checked, plain) for a, b in zip(ga, gb))
    stops = rec.trace.of_kind("grad_stops")
    assert len(stops) == 1 and stops[0]["stops"] == ["RoundBackward0"]
    assert len(stops[0]["params"]) == 2 and stops[0]["loss_zero"] is False


def test_the_watcher_reads_nothing_on_a_healthy_loop():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(16, 4)).pow(2).mean().backward()
            opt.step()
    assert rec.trace.of_kind("grad_stops") == []


def test_silent_on_a_perfect_fit_but_not_on_a_loss_multiplied_by_zero():
    # a regression that reproduces its data exactly: the loss is 0, nothing left to learn
    assert findings(_loop(lambda i: [0.0] * 4, stops=("MseLossBackward0",), reached=PARAMS,
                          loss_zero=True), SLUG) == []
    assert only(_loop(lambda i: [0.0] * 4, stops=("MulBackward0",), reached=PARAMS,
                      loss_zero=True), SLUG)


def test_a_selection_that_drops_part_of_a_modules_output_points_at_the_modules_call(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("class M:\n    def forward(self, x):\n        _, (h, _) = self.lstm(x)\n"
                      "        return self.fc(h[-1])\n")
    monkeypatch.chdir(tmp_path)
    t = _loop(lambda i: [0.0, 0.0, 1.0, 0.5], stops=("StackBackward0",))
    t.trace.params()[0] = t.param(0, name="model.lstm.weight_ih_l0")
    f = only(t, SLUG)
    assert f.location.line == 3 and "only part of the output" in f.message
    assert "h_n[-2], h_n[-1]" in f.fix


def test_a_layer_whose_weights_are_all_zero_is_named_and_the_init_call_found(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("import torch\nfor m in layers:\n"
                      "    torch.nn.init.zeros_(m.bias); torch.nn.init.zeros_(m.weight)\n")
    monkeypatch.chdir(tmp_path)
    f = only(_loop(lambda i: [0.0, 0.0, 1.0, 0.5], stops=("AddmmBackward0:zero_weights",)), SLUG)
    assert f.location.line == 3 and "zeros_(m.weight)" in f.message
    assert "weights are all zero" in f.message and "default initialisation" in f.fix
    # a matmul whose weights are not zero is no reason the rule knows
    assert findings(_loop(lambda i: [0.0, 0.0, 1.0, 0.5], stops=("AddmmBackward0",)), SLUG) == []


def test_the_watcher_marks_a_stop_at_a_zero_weight_matrix():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        first, second = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)
        torch.nn.init.zeros_(second.weight)
        second.weight.requires_grad_(False)  # stays zero: the gradient never passes it
        opt = torch.optim.SGD([*first.parameters(), second.bias], lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            second(torch.tanh(first(torch.randn(16, 4)))).pow(2).mean().backward()
            opt.step()
    stops = rec.trace.of_kind("grad_stops")
    assert stops and stops[0]["stops"] == ["AddmmBackward0:zero_weights"]


def test_a_round_inside_an_autograd_function_is_not_the_call_site():
    import ast
    from graddoctor.rules.grads_always_zero import _autograd_function_lines
    src = ("import torch\n"
           "class Q(torch.autograd.Function):\n"
           "    @staticmethod\n"
           "    def forward(ctx, x):\n"
           "        return torch.round(x)\n"
           "class Layer:\n"
           "    def forward(self, x):\n"
           "        return torch.round(x)\n")
    lines = _autograd_function_lines(ast.parse(src))
    assert 5 in lines and 8 not in lines


def test_a_matmuls_weight_is_read_from_the_parameter_itself():
    import torch
    from graddoctor.instrument.gradstop import _parameter_all_zero
    x = torch.randn(4, 3)
    b = torch.nn.Parameter(torch.zeros(5, 2))
    a = torch.nn.Parameter(torch.randn(2, 3))
    out = x @ a.t() @ b.t()  # LoRA's product: the last matmul reads B (zero) as its weight
    assert _parameter_all_zero(out.grad_fn) is True
    out = x @ a.t()
    assert _parameter_all_zero(out.grad_fn) is False
    assert _parameter_all_zero((x @ (a * 2).t()).grad_fn) is None  # a computed weight: not read


def test_two_zero_factors_multiplied_are_named_at_their_init(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("import torch\nwith torch.no_grad():\n"
                      "    users.weight.zero_()\n    items.weight.zero_()\n")
    monkeypatch.chdir(tmp_path)
    f = only(_loop(lambda i: [0.0] * 4, stops=("MulBackward0:zero_factors",), reached=PARAMS), SLUG)
    assert f.location.line == 3 and "two factors that are both all zero" in f.message
    assert "factor that is 0" not in f.message and "randomly" in f.fix


def test_the_watcher_marks_a_product_of_two_zero_embeddings_sparse_or_dense():
    for sparse in (True, False):
        rec = Recorder(step_budget=None)
        with Instrumentation(rec):
            users = torch.nn.Embedding(20, 4, sparse=sparse)
            items = torch.nn.Embedding(30, 4, sparse=sparse)
            torch.nn.init.zeros_(users.weight)
            torch.nn.init.zeros_(items.weight)
            opt = torch.optim.SGD([users.weight, items.weight], lr=0.1)
            for _ in range(3):
                u, i = torch.randint(0, 20, (16,)), torch.randint(0, 30, (16,))
                opt.zero_grad()
                ((users(u) * items(i)).sum(-1) - 1.0).pow(2).mean().backward()
                opt.step()
        stops = rec.trace.of_kind("grad_stops")
        assert stops and stops[0]["stops"] == ["MulBackward0:zero_factors"], sparse
        norms = rec.trace.of_kind("step_begin")[-1]["norms"]
        assert norms == [0.0, 0.0], sparse  # the sparse grads measured like the dense ones


def test_a_product_with_one_zero_factor_is_no_stop_of_both():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        a = torch.nn.Parameter(torch.zeros(8))
        b = torch.nn.Parameter(torch.randn(8))
        opt = torch.optim.SGD([a, b], lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            (a * b).sum().backward()
            opt.step()
    assert not any("zero_factors" in s for e in rec.trace.of_kind("grad_stops") for s in e["stops"])


def test_a_sparse_grad_that_is_not_finite_is_told_without_an_internal_error():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        emb = torch.nn.Embedding(10, 3, sparse=True)
        opt = torch.optim.SGD(emb.parameters(), lr=0.1)
        opt.zero_grad()
        (emb(torch.tensor([1, 2])).sum() * float("nan")).backward()
        opt.step()
    assert rec.internal_errors == 0 and not rec.trace.of_kind("internal_error")
    begin = rec.trace.of_kind("step_begin")[-1]
    assert begin["nonfinite"] and begin["norm_pids"] == begin["nonfinite"]


def test_the_watcher_marks_a_product_with_a_constant_zero_factor():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        branch, head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        gate = torch.zeros(1)  # a plain tensor: never moves
        opt = torch.optim.SGD([*branch.parameters(), *head.parameters()], lr=0.1)
        for _ in range(3):
            x = torch.randn(16, 4)
            opt.zero_grad()
            head(x + branch(x) * gate.tanh()).pow(2).mean().backward()
            opt.step()
    stops = rec.trace.of_kind("grad_stops")
    assert stops and stops[0]["stops"] == ["MulBackward0:zero_constant"]


_GATED = """import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(4, 4)
        self.gate = torch.zeros(1)

    def forward(self, x):
        return x + self.enc(x) * self.gate.tanh()
"""


_NAMES = ("block.enc.weight", "block.enc.bias", "head.weight", "head.bias")


def test_a_gate_kept_as_a_plain_zero_tensor_is_named_at_its_assignment(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(_GATED)
    monkeypatch.chdir(tmp_path)
    f = only(_loop(lambda i: [0.0, 0.0, 1.0, 0.5], stops=("MulBackward0:zero_constant",), names=_NAMES), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 9
    assert "not a parameter" in f.message and "self.gate" in f.message
    assert "nn.Parameter(torch.zeros(1))" in f.fix


def test_a_constant_zero_factor_without_a_plain_gate_stays_silent(tmp_path, monkeypatch):
    # DDP's `0 * sum(p.sum() ...)`; a gate the file sets from a schedule; a gate that is a parameter
    (tmp_path / "train.py").write_text("import torch\nloss = loss + 0 * sum(p.sum() for p in enc.parameters())\n")
    monkeypatch.chdir(tmp_path)
    loop = lambda: _loop(lambda i: [0.0, 0.0, 1.0, 0.5], stops=("MulBackward0:zero_constant",),  # noqa: E731
                         names=_NAMES)
    assert findings(loop(), SLUG) == []
    (tmp_path / "train.py").write_text(_GATED + "\nblock.gate = torch.ones(1)\n")
    assert findings(loop(), SLUG) == []
    (tmp_path / "train.py").write_text(_GATED.replace("torch.zeros(1)", "nn.Parameter(torch.zeros(1))"))
    assert findings(loop(), SLUG) == []
    # the whole loss times a constant 0 is still the loss's factor
    f = only(_loop(lambda i: [0.0] * 4, stops=("MulBackward0:zero_constant",), reached=PARAMS,
                   names=_NAMES), SLUG)
    assert "factor" in f.fix
