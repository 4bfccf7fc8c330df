"""norm-over-batch (GD189): hand-written ``norm_batch`` events, and the watcher's reading of
real graphs: which nodes reduce the batch axis, and which results the loss pulls to a target."""

from __future__ import annotations

import textwrap

import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.normbatch import pulled_to_target, reduced
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "norm-over-batch"

SCRIPT = """\
import torch
opt = torch.optim.Adam(D.parameters())
for step in range(4):
    g = torch.autograd.grad(D(mix).sum(), mix, create_graph=True)[0]
    gp = ((g.norm(2, dim=0) - 1) ** 2).mean()  # the penalty
    loss = D(fake).mean() - D(real).mean() + 10 * gp
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _trace(tmp_path, *made):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT))
    t = TraceBuilder(str(path))
    t.optimizer(0, P, line=2)
    for item in made:
        t.put(item, 5)
    for _ in range(4):
        t.backward(fresh=P, line=7)
        t.step(line=7)
    return t


def test_a_norm_over_the_batch_is_a_warning_at_its_call(tmp_path):
    made = ev.norm_batch(shape=[64, 2], dims=[0], batch=64, penalty="square")
    f = only(_trace(tmp_path, made), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 5
    assert "64×2" in f.message and "64 samples" in f.message and "axis 0" in f.message
    assert "# the penalty" not in f.message
    assert f.fix.startswith("take the norm per sample, over its features: `dim=1`")
    whole = ev.norm_batch(shape=[16, 1, 8, 8], dims=None, batch=16, penalty="relu")
    f = only(_trace(tmp_path, whole), SLUG)
    assert "every axis" in f.message and "flatten(1)" in f.fix


def test_a_later_phase_finding_at_the_backward_is_placed_at_the_norm_call(tmp_path):
    made = ev.norm_batch(shape=[64, 2], dims=[0], batch=64, penalty="square", at_backward=True)
    t = _trace(tmp_path)
    t.put(made, 7)  # a later phase's graph read alone: the event is at its backward
    assert only(t, SLUG).location.line == 5


def test_a_later_phase_finding_with_no_norm_call_in_the_source_is_left(tmp_path):
    made = ev.norm_batch(shape=[64, 2], dims=[0], batch=64, penalty="square", at_backward=True)
    t = _trace(tmp_path)
    t.put(made, 2)  # no norm call of the script reaches a backward at line 2
    assert findings(t, SLUG) == []


def test_nothing_without_an_event(tmp_path):
    assert findings(_trace(tmp_path), SLUG) == []


def _parents(root):
    from graddoctor.instrument.graphpaths import post_order
    parents: dict = {}
    for node in post_order(root, 1000):
        for child, _ in node.next_functions:
            if child is not None:
                parents.setdefault(child, []).append(node)
    return parents


def test_the_reduced_axes_of_a_norm_and_of_a_root_of_a_sum_of_squares():
    x = torch.randn(5, 3, requires_grad=True)
    assert reduced(x.norm(2, dim=0).grad_fn) == ((5, 3), (0,))
    assert reduced(x.norm(2).grad_fn) == ((5, 3), None)
    assert reduced(torch.linalg.vector_norm(x, dim=-1).grad_fn) == ((5, 3), (1,))
    assert reduced(torch.sqrt((x ** 2).sum(0) + 1e-12).grad_fn) == ((5, 3), (0,))
    assert reduced(torch.sqrt(x.var(0) + 1e-4).grad_fn) is None  # a standard deviation
    assert reduced(torch.sqrt((x ** 2).mean(0)).grad_fn) is None  # an RMS: averaged


def test_which_results_are_pulled_to_a_target():
    x = torch.randn(5, 3, requires_grad=True)

    def judged(make):
        norm = x.norm(dim=0)
        loss = make(norm)
        return pulled_to_target(norm.grad_fn, _parents(loss.grad_fn))

    assert judged(lambda n: ((n - 1) ** 2).mean()) == "square"
    assert judged(lambda n: F.relu(1 - n).mean()) == "relu"
    radius = torch.tensor(1.0, requires_grad=True)
    assert judged(lambda n: (n - radius).abs().mean()) == "abs"
    assert judged(lambda n: F.mse_loss(n, torch.ones(3))) == "mse_loss"
    assert judged(lambda n: n.mean()) is None  # the norm is the loss
    assert judged(lambda n: (x / n).sum()) is None  # a normaliser
    other = torch.randn(3, requires_grad=True)
    assert judged(lambda n: ((n - other) ** 2).mean()) is None  # compared with a per-feature value
