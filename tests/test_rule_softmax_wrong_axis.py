"""softmax-wrong-axis (GD248): attention weights normalised over another axis than the one the
matrix product after them sums over."""

from __future__ import annotations

import math

import pytest
import torch

from graddoctor import events as ev
from graddoctor.instrument.attnaxis import (SoftmaxAxisWatcher, _misnormalised, _softmax_below,
                                            _through_reshape, cosine_misnormalised)
from graddoctor.rules.softmax_wrong_axis import _dim_of, _norm_dim_of, _with_dim, normalize_line
from graddoctor.trace import TraceBuilder
from rule_traces import builder, findings, only

SLUG = "softmax-wrong-axis"


def _product(weights_of, shape=(2, 5, 5), keys=5, d=3):
    """The product node of ``weights_of(scores) @ v`` and what ``_softmax_below`` finds."""
    scores = torch.randn(*shape, requires_grad=True)
    v = torch.randn(*shape[:-2], keys, d, requires_grad=True)
    out = torch.matmul(weights_of(scores), v)
    node = out.grad_fn
    while not type(node).__name__.startswith(("BmmBackward", "MmBackward")):
        node = node.next_functions[0][0]
    left = node._saved_self
    return _softmax_below(node.next_functions[0][0], tuple(left.shape), left.dim() - 1)


def test_the_walk_reaches_the_softmax_and_maps_the_summed_axis_back():
    found = _product(lambda s: torch.softmax(s, dim=1))
    assert found is not None and found[1] == 1 and found[2] == 2  # normalised 1, summed 2
    assert _product(lambda s: torch.softmax(s, dim=-1))[1:3] == (2, 2)
    # four dims through expand and a reshape, dropout's mask on the way
    four = _product(lambda s: torch.nn.functional.dropout(s.softmax(dim=2), 0.1),
                    shape=(2, 3, 5, 5))
    assert four is not None and four[1:3] == (2, 3)
    masked = _product(lambda s: s.softmax(dim=1).masked_fill(torch.rand(5, 5) > 0.8, 0.0))
    assert masked is not None and masked[1:3] == (1, 2)
    # a 2-D softmax over the rows, unsqueezed into a batched product: still the rows
    scores = torch.randn(4, 6, requires_grad=True)
    h = torch.randn(4, 6, 3, requires_grad=True)
    out = torch.bmm(torch.softmax(scores, dim=0).unsqueeze(1), h)
    bmm = out.grad_fn
    assert _softmax_below(bmm.next_functions[0][0], (4, 1, 6), 2)[1:3] == (0, 1)


@pytest.mark.parametrize("turned", [
    lambda s: (lambda a: a / a.sum(-1, keepdim=True))(torch.softmax(s, dim=1) + 1e-8),  # slots
    lambda s: torch.softmax(s, dim=1) * torch.rand(2, 5, 1, requires_grad=True),  # a gate
    lambda s: torch.softmax(s.reshape(2, 25), dim=1).reshape(2, 5, 5),  # the summed axis split
])
def test_the_walk_stops_at_weights_renormalised_gated_or_reshaped_across_the_axis(turned):
    assert _product(turned) is None


def test_a_reshape_maps_a_dimension_only_when_it_survives_whole():
    assert _through_reshape((6, 5, 4), 1, (2, 3, 5, 4, 1)) == 2
    assert _through_reshape((6, 5, 4), 2, (2, 3, 5, 4, 1)) == 3
    assert _through_reshape((6, 5, 4), 0, (2, 3, 5, 4, 1)) is None  # merged
    assert _through_reshape((2, 3, 20), 2, (2, 3, 5, 4)) is None  # merged
    assert _through_reshape((2, 1, 5), 2, (2, 5, 1)) == 1


def _einsum_found(equation, weights, other, weights_first=True):
    operands = (weights, other) if weights_first else (other, weights)
    node = torch.einsum(equation, *operands).grad_fn
    while not type(node).__name__.startswith("BmmBackward"):
        node = node.next_functions[0][0]
    found = [f for f in SoftmaxAxisWatcher._operands(node) if f is not None]
    assert len(found) == 1
    return found[0]


def _leaf(*shape):
    return torch.randn(*shape, requires_grad=True)


@pytest.mark.parametrize("equation, first, dim, bad", [
    ("bhqk,bhkd->bhqd", True, -2, True),
    ("bhqk,bhkd->bhqd", True, -1, False),
    ("bhkd,bhqk->bhqd", False, 2, True),  # the weights second
    ("bhkd,bhqk->bhqd", False, 3, False),
    ("bhqk,bhkd->bqhd", True, 1, True),  # the output's labels rearranged, a softmax over heads
    ("bhkq,bhkd->bhqd", True, 2, False),  # laid out (keys, queries), normalised over the keys
])
def test_einsum_is_read_through_its_lowering_not_its_equation(equation, first, dim, bad):
    weights = torch.softmax(_leaf(2, 3, 5, 5), dim=dim)
    found = _einsum_found(equation, weights, _leaf(2, 3, 5, 4), first)
    assert found[3] == (2, 3, 5, 5) and found[1] == dim % 4
    assert _misnormalised(found) is bad


def test_pooling_dispatch_and_gates_written_with_einsum_stay_silent():
    pool = _einsum_found("bt,btd->bd", torch.softmax(_leaf(2, 5), dim=1), torch.randn(2, 5, 4))
    assert pool[1:3] == (1, 1) and not _misnormalised(pool)
    diffpool = _einsum_found("bnk,bnd->bkd", torch.softmax(_leaf(2, 5, 3), -1), _leaf(2, 5, 4))
    assert diffpool[1:3] == (2, 1) and not _misnormalised(diffpool)  # the nodes summed on purpose
    dispatch = _einsum_found("ne,nd->ed", torch.softmax(_leaf(6, 3), -1), _leaf(6, 4))
    assert dispatch[1:3] == (1, 0) and not _misnormalised(dispatch)
    gate = _einsum_found("be,bed->bd", torch.softmax(_leaf(2, 3), -1), _leaf(2, 3, 4))
    assert gate[1:3] == (1, 1) and not _misnormalised(gate)


def test_the_right_operand_is_followed_through_its_transpose():
    weights = torch.softmax(_leaf(2, 5, 5), dim=1)
    out = _leaf(2, 5, 4).transpose(1, 2) @ weights.transpose(1, 2)
    bmm = out.grad_fn.next_functions[0][0]
    found = [f for f in SoftmaxAxisWatcher._operands(bmm) if f is not None]
    assert [f[1:] for f in found] == [(1, 2, (2, 5, 5))] and _misnormalised(found[0])


def test_diffpool_turned_by_a_transpose_is_mapped_and_left_alone():
    found = _product(lambda s: torch.softmax(s, dim=-1).transpose(1, 2))
    assert found is not None and found[1:3] == (2, 1) and not _misnormalised(found)


def test_a_sinkhorn_plan_normalised_over_the_summed_axis_just_before_is_left_alone():
    scores = _leaf(5, 6)
    values = _leaf(6, 4)
    plain = torch.softmax(scores, dim=0) @ values
    found = next(f for f in SoftmaxAxisWatcher._operands(plain.grad_fn) if f is not None)
    assert found[1:3] == (0, 1) and _misnormalised(found)
    for step in (lambda p: torch.softmax(p, dim=1).log(),
                 lambda p: p - p.logsumexp(1, keepdim=True)):
        plan = torch.softmax(step(scores), dim=0) @ values
        found = next(f for f in SoftmaxAxisWatcher._operands(plan.grad_fn) if f is not None)
        assert found[1:3] == (0, 1) and not _misnormalised(found)
    # normalised over the other axis before: no Sinkhorn, the columns alone sum to 1
    plan = torch.softmax(torch.softmax(scores, dim=0).log(), dim=0) @ values
    found = next(f for f in SoftmaxAxisWatcher._operands(plan.grad_fn) if f is not None)
    assert _misnormalised(found)


def test_the_watcher_reports_once_and_only_a_mismatch(monkeypatch):
    events = []

    class _Rec:
        from graddoctor.instrument.identities import Identities
        tensors = Identities()

        def subscribe(self, topic, subscriber):  # LossWindow's PARAMS_ADDED
            pass

        def here(self, skip=2):
            return None

        def emit_aside(self, made, loc=None):
            events.append(made)

        def internal_error(self, where, exc):
            raise exc

    watcher = SoftmaxAxisWatcher(_Rec())
    q = torch.randn(2, 4, 3, requires_grad=True)
    for dim in (1, 1, -1):
        scores = q @ q.transpose(1, 2) / math.sqrt(3)
        loss = (torch.softmax(scores, dim=dim) @ q).sum()
        watcher.describe_loss(loss)
    assert [made[0] for made in events] == ["softmax_axis"]
    assert events[0][1]["dim"] == 1 and events[0][1]["summed"] == 2
    assert events[0][1]["shape"] == [2, 4, 4]


def test_the_literal_dim_is_read_from_each_form_of_call():
    assert _dim_of("F.softmax(scores, dim=1)") == 1
    assert _dim_of("torch.softmax(scores, 1)") == 1
    assert _dim_of("scores.softmax(-2)") == -2
    assert _dim_of("nn.Softmax(dim=2)") == 2
    assert _dim_of("nn.Softmax(2)") == 2
    assert _dim_of("F.softmax(scores, dim=d)") is None
    assert _dim_of("nn.functional.softmax(scores, 1)") == 1
    assert _dim_of("torch.nn.functional.softmax(scores, 2)") == 2
    assert _dim_of("torch.einsum('bqd,bkd->bqk', q, k).softmax(-2)") == -2
    assert _dim_of("(q @ k.mT).softmax(1)") == 1


def _trace(params, stepped=(0, 1), dim=1):
    t = builder(params=list(stepped))
    t.put(ev.softmax_axis(dim=dim, summed=2, shape=[16, 8, 8], params=list(params)), line=9)
    t.clear(list(stepped), line=10)
    t.backward(fresh=list(stepped), line=11)
    t.step(0, line=12)
    return t


def test_the_rule_warns_when_an_optimizer_trains_the_scores():
    f = only(_trace([0, 1]), SLUG)
    assert f.evidence["dim"] == 1 and f.evidence["summed"] == 2
    assert "dim=-1" in f.fix


def test_the_rule_is_silent_when_nothing_trained_makes_the_scores():
    assert findings(_trace([5]), SLUG) == []


def test_a_softmax_over_the_batch_is_left_to_samples_mixed_in_batch():
    t = _trace([0, 1], dim=0)
    assert len(findings(t, SLUG)) == 1
    t.put(ev.dependency(model="M", batch=16, source="loss_target", mixed=True,
                        op="SoftmaxBackward0", op_at=None, seq=None, modules=[],
                        forward=None), line=13)
    assert findings(t, SLUG) == []


def _similarity(left_of, right_of, n=6, d=4):
    """What ``_softmax_below`` finds below each operand of ``left_of(z1) @ right_of(z2)``, with
    z1, z2 (n, d) embeddings made by a trained layer."""
    w = torch.randn(d, d, requires_grad=True)
    z1, z2 = torch.randn(n, d) @ w, torch.randn(n, d) @ w
    out = left_of(z1) @ right_of(z2)
    node = out.grad_fn
    while not type(node).__name__.startswith(("BmmBackward", "MmBackward")):
        node = node.next_functions[0][0]
    return list(SoftmaxAxisWatcher._operands(node))


def test_a_normalisation_over_the_batch_before_a_similarity_product_is_found():
    F = torch.nn.functional
    for normalise in (lambda z: F.normalize(z, dim=0), lambda z: z / z.norm(dim=0, keepdim=True),
                      lambda z: z / (z.pow(2).sum(0, keepdim=True).sqrt() + 1e-6)):
        left, right = _similarity(normalise, lambda z: normalise(z).T)
        assert left[1:3] == (0, 1) and right[1:3] == (0, 1)  # normalised 0, summed 1
        assert _misnormalised(left) and _misnormalised(right)
    # a learned temperature times the embeddings is followed to the normalisation
    scale = torch.tensor(2.0, requires_grad=True)
    [left, _] = _similarity(lambda z: scale.exp() * F.normalize(z, dim=0), lambda z: z.T)
    assert left is not None and _misnormalised(left)


def test_normalisations_over_the_summed_axis_and_standardisations_are_left_alone():
    F = torch.nn.functional
    unit = lambda z: F.normalize(z, dim=-1)  # noqa: E731
    assert not any(f is not None and _misnormalised(f) for f in _similarity(unit, lambda z: unit(z).T))
    # Barlow Twins / a column-normalised correlation: z.T @ z sums the normalised batch axis
    columns = lambda z: F.normalize(z, dim=0).T  # noqa: E731
    found = _similarity(columns, lambda z: F.normalize(z, dim=0))
    assert all(f is not None and f[1] == f[2] == 0 for f in found)
    assert not any(_misnormalised(f) for f in found)
    standardised = lambda z: (z - z.mean(0)) / z.std(0)  # noqa: E731
    assert _similarity(standardised, lambda z: standardised(z).T) == [None, None]
    # a parameter normalised (a cosine classifier's weight) has no batch: not followed
    weight = torch.randn(5, 4, requires_grad=True)
    out = torch.randn(6, 4) @ F.normalize(weight, dim=0).t()
    assert list(SoftmaxAxisWatcher._operands(out.grad_fn))[-1] is None


def test_the_literal_dim_is_read_from_each_form_of_normalisation():
    assert _norm_dim_of("F.normalize(z, dim=0)") == 0
    assert _norm_dim_of("F.normalize(z, 2, 0)") == 0
    assert _norm_dim_of("F.normalize(z)") is None
    assert _norm_dim_of("z.norm(dim=0, keepdim=True)") == 0
    assert _norm_dim_of("z.norm(2, 0, True)") == 0
    assert _norm_dim_of("torch.linalg.norm(z, 2, 0, keepdim=True)") == 0
    assert _norm_dim_of("torch.linalg.vector_norm(z, dim=-1)") == -1


def test_the_rule_speaks_of_a_normalisation_and_defers_to_samples_mixed_in_batch():
    t = builder(params=[0, 1])
    t.put(ev.softmax_axis(dim=0, summed=1, shape=[24, 32], params=[0, 1], op="normalize"), line=9)
    t.clear([0, 1], line=10)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    f = only(t, SLUG)
    assert "unit vectors" in f.message and "F.normalize(z, dim=-1)" in f.fix
    assert f.evidence["op"] == "normalize"
    t.put(ev.dependency(model="M", batch=24, source="loss_target", mixed=True,
                        op="LinalgVectorNormBackward0", op_at=None, seq=None, modules=[],
                        forward=None), line=13)
    assert findings(t, SLUG) == []


def _product_of(out):
    node = out.grad_fn
    while not type(node).__name__.startswith(("BmmBackward", "MmBackward", "AddmmBackward")):
        node = node.next_functions[0][0]
    return node


def test_a_cosine_product_with_a_weight_normalised_over_another_axis_is_found():
    F = torch.nn.functional
    weight = torch.randn(5, 4, requires_grad=True)  # (classes, features)
    x = torch.randn(6, 4, requires_grad=True) * 1.0
    for out in (F.linear(F.normalize(x), F.normalize(weight, dim=0)),
                F.linear(F.normalize(x), F.normalize(weight, dim=0), torch.zeros(5)),  # addmm
                F.normalize(x, dim=1) @ (weight / weight.norm(dim=0, keepdim=True)).t()):
        [(division, normalised, summed, shape)] = cosine_misnormalised(_product_of(out))
        assert (normalised, summed, shape) == (0, 1, (5, 4))
        assert division.next_functions[0][0].variable is weight
    columns = torch.randn(4, 5, requires_grad=True)  # (features, classes): summed over dim 0
    [found] = cosine_misnormalised(_product_of(F.normalize(x) @ F.normalize(columns, dim=1)))
    assert found[1:] == (1, 0, (4, 5))


def test_cosine_products_normalised_over_the_summed_axis_or_not_cosines_are_left_alone():
    F = torch.nn.functional
    weight = torch.randn(5, 4, requires_grad=True)
    columns = torch.randn(4, 5, requires_grad=True)
    x = torch.randn(6, 4, requires_grad=True) * 1.0
    silent = [
        F.linear(F.normalize(x), F.normalize(weight)),  # rows: the summed axis
        F.normalize(x) @ F.normalize(columns, dim=0),  # columns of a (features, classes) weight
        x @ F.normalize(weight, dim=0).t(),  # raw features: weight normalisation, no cosine
        F.normalize(x) @ F.normalize(columns, p=1, dim=1),  # L1: a stochastic matrix
        F.normalize(x, dim=0).T @ F.normalize(x * 2, dim=0),  # Barlow Twins' columns
    ]
    for out in silent:
        assert cosine_misnormalised(_product_of(out)) == []


def test_the_cosine_finding_names_the_weight_and_points_at_its_normalisation(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch.nn.functional as F\n"
                      "z = F.normalize(h, dim=1)\n"
                      "p = F.normalize(self.proto, dim=1)\n"
                      "loss = (z @ p).sum()\n")
    t = TraceBuilder(str(script))
    t.param(1, "model.proto")
    t.optimizer(0, [0, 1], line=1)
    t.put(ev.softmax_axis(dim=1, summed=0, shape=[8, 6], params=[0, 1], op="normalize",
                          cosine=True, param=1), line=4)
    t.clear([0, 1], line=5)
    t.backward(fresh=[0, 1], line=5)
    t.step(0, line=6)
    f = only(t, SLUG)
    assert f.location.line == 3  # the weight's normalisation, not the first call with dim=1
    assert "model.proto" in f.message and "no cosines" in f.message
    assert "`F.normalize(self.proto, dim=0)`" in f.fix


def test_the_fix_rewrites_the_dim_of_the_call_shown():
    assert _with_dim("F.normalize(self.weight, dim=0)", -1) == "F.normalize(self.weight, dim=-1)"
    assert _with_dim("proto.norm(dim=1, keepdim=True)", 0) == "proto.norm(dim=0, keepdim=True)"
    assert _with_dim("F.normalize(w, 2, 0)", 1) is None
