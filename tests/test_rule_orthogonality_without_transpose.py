"""orthogonality-without-transpose (GD418): the graph search of instrument/lossterms.py, the
source lookup of the product's line, and the rule over hand-written traces."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.analysis.source import self_product_lines
from graddoctor.instrument.lossterms import offset_self_products
from rule_traces import builder, findings, only

SLUG = "orthogonality-without-transpose"

A = torch.randn(4, 5, 5, requires_grad=True)
W = torch.randn(6, 6, requires_grad=True)
EYE5, EYE6 = torch.eye(5), torch.eye(6)


def _found(loss) -> int:
    return len(offset_self_products(loss.grad_fn))


def test_a_matrix_times_itself_held_to_a_constant_is_found():
    t = A * 2
    assert _found(torch.norm(torch.bmm(t, t) - EYE5[None], dim=(1, 2)).mean()) == 1
    assert _found(F.mse_loss(t @ t, EYE5.expand(4, 5, 5))) == 1
    assert _found(((W @ W) - EYE6).pow(2).sum()) == 1
    assert _found((EYE6 - torch.mm(W, W)).abs().sum()) == 1


def test_the_transpose_a_value_and_two_matrices_are_not():
    t = A * 2
    assert _found(torch.norm(torch.bmm(t, t.transpose(1, 2)) - EYE5)) == 0
    assert _found(torch.norm(torch.bmm(t.transpose(2, 1), t) - EYE5)) == 0
    assert _found(((W @ W.t()) - EYE6).pow(2).sum()) == 0
    z = torch.randn(3, 6)
    assert _found(F.mse_loss(z @ (W @ W), torch.randn(3, 6))) == 0  # K @ K applied to a state
    assert _found(((W @ (W * 2)) - EYE6).pow(2).sum()) == 0
    assert _found((t @ t).sum()) == 0  # not compared with a constant


def test_a_symmetric_matrix_times_itself_is_its_gram_matrix():
    sym = 0.5 * (W + W.t())  # S @ S is S @ S.T: the orthogonality penalty, written shorter
    assert _found(F.mse_loss(sym @ sym, EYE6)) == 0
    batch = 0.5 * (A + A.transpose(1, 2))
    assert _found(torch.norm(torch.bmm(batch, batch) - EYE5, dim=(1, 2)).mean()) == 0
    assert _found(F.mse_loss(W @ W, EYE6)) == 1  # W itself is not symmetric


def test_the_products_line_is_found(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "reg = torch.norm(torch.bmm(trans, trans) - eye)\n"
        "ok = torch.norm(torch.bmm(trans, trans.transpose(2, 1)) - eye)\n"
        "w = W @ W.T\n"
        "k = z @ (K @ K)\n"
        "m = A.matmul(A)\n")
    assert [(line, x) for line, _, x in self_product_lines(str(script))] == [(1, "trans"), (4, "K"), (5, "A")]


def _trace(params):
    t = builder(params=[0, 1])
    t.clear([0, 1], line=10)
    t.put(ev.self_product_offset(op="BmmBackward0", shape=[5, 5], params=list(params), line=11), line=11)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    return t


def test_the_rule_warns_at_the_backward_without_a_single_product_line():
    f = only(_trace([1]), SLUG)
    assert f.location.line == 11 and f.evidence["shape"] == [5, 5]
    assert "5x5" in f.message and "involution" in f.message and "transpose" in f.fix


def test_the_rule_is_silent_on_tensors_no_optimizer_steps():
    assert findings(_trace([7]), SLUG) == []
