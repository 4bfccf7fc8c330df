"""The batch reductions of a loss's terms (instrument/batchreduce.py) and where the rule points."""

import textwrap

import torch
import torch.nn.functional as F

from graddoctor.analysis.source import term_assignment
from graddoctor.instrument.batchreduce import mixed_terms


def _activations(n=8, d=5):
    torch.manual_seed(0)
    w = torch.randn(3, d, requires_grad=True)
    x = torch.randn(n, 3)
    return x @ w  # (n, d), a per-sample activation with a gradient


def test_sum_over_batch_next_to_mean_is_found():
    h = _activations()
    mean_term = F.mse_loss(h, torch.zeros_like(h))
    sum_term = h.pow(2).sum()
    pair = mixed_terms((mean_term + 4.0 * sum_term).grad_fn)
    assert pair is not None
    summed, averaged = pair
    assert summed.how == "sum" and summed.n == 8
    assert averaged.averaged and not summed.averaged


def test_sum_divided_by_batch_size_is_averaged():
    h = _activations()
    loss = F.mse_loss(h, torch.zeros_like(h)) + 4.0 * h.pow(2).sum() / h.size(0)
    assert mixed_terms(loss.grad_fn) is None


def test_a_sum_of_sums_divided_by_batch_size_as_a_whole_is_averaged():
    # BPR's regulariser: `1e-4 * (eu.pow(2).sum() + ep.pow(2).sum() + en.pow(2).sum()) / n`
    h = _activations()
    reg = 1e-4 * (h.pow(2).sum() + h.abs().sum() + (2 * h).pow(2).sum()) / h.size(0)
    assert mixed_terms((F.mse_loss(h, torch.zeros_like(h)) + reg).grad_fn) is None
    reg = 1e-4 * (h.pow(2).sum() + h.abs().sum()) / 2  # divided by a weight, not the batch
    assert mixed_terms((F.mse_loss(h, torch.zeros_like(h)) + reg).grad_fn) is not None
    reg = (h.pow(2).sum() + h.abs().sum()) * 0.125  # a product is a weight
    assert mixed_terms((F.mse_loss(h, torch.zeros_like(h)) + reg).grad_fn) is not None


def test_weight_alone_normalises_nothing():
    h = _activations()
    loss = F.mse_loss(h, torch.zeros_like(h)) + 0.3 * h.pow(2).sum() / 2  # a weight, and 2 of 8
    assert mixed_terms(loss.grad_fn) is not None
    loss = h.pow(2).sum() + 0.125 * h.abs().sum()  # 1/8 of a batch of 8: still a weight
    assert mixed_terms(loss.grad_fn) is None


def test_mean_over_pairs_is_not_a_mean_over_samples():
    h = _activations()
    kernel = torch.exp(-torch.cdist(h, h))  # (8, 8)
    assert mixed_terms((h.pow(2).sum() + kernel.mean()).grad_fn) is None


def test_both_summed_or_both_averaged_is_silent():
    h = _activations()
    assert mixed_terms((h.pow(2).sum() + h.abs().sum()).grad_fn) is None
    assert mixed_terms((h.pow(2).mean() + h.abs().sum(1).mean()).grad_fn) is None


def test_sum_over_features_then_mean_over_batch_is_averaged():
    h = _activations()
    loss = F.mse_loss(h, torch.zeros_like(h)) + torch.mean(h.pow(2).sum(dim=1), dim=0)
    assert mixed_terms(loss.grad_fn) is None
    # the mean over features first, then a sum over the batch: summed
    loss = F.mse_loss(h, torch.zeros_like(h)) + h.pow(2).mean(dim=1).sum()
    assert mixed_terms(loss.grad_fn) is not None


def test_parameter_penalty_with_batch_many_rows_is_silent():
    torch.manual_seed(0)
    w = torch.randn(8, 3, requires_grad=True)  # as many rows as the batch
    x = torch.randn(8, 8)
    out = x @ w
    loss = F.mse_loss(out, torch.zeros_like(out)) + 1e-4 * w.pow(2).sum()
    assert mixed_terms(loss.grad_fn) is None


def test_terms_of_unrelated_activations_are_silent():
    torch.manual_seed(0)
    w = torch.randn(3, 4, requires_grad=True)
    a, b = torch.randn(8, 3) @ w, torch.randn(8, 3) @ w
    loss = a.pow(2).mean() + b.pow(2).sum()  # no per-sample activation in common
    assert mixed_terms(loss.grad_fn) is None


def test_per_token_mean_and_per_sequence_sum_are_found():
    torch.manual_seed(0)
    w = torch.randn(4, 6, requires_grad=True)
    h = torch.randn(3, 5, 4) @ w  # (B, T, V)
    tokens = F.cross_entropy(h.reshape(-1, 6), torch.zeros(15, dtype=torch.long))
    per_sequence = h[:, -1, 0].pow(2).sum()
    pair = mixed_terms((tokens + per_sequence).grad_fn)
    assert pair is not None and pair[0].n == 3 and pair[1].n == 15


def test_term_assignment_points_at_the_summed_term_or_its_criterion(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch
        crit = torch.nn.CrossEntropyLoss(reduction="sum")
        for step in range(3):
            kl = torch.zeros(()).sum()
            aux = crit(a, b)
            loss = kl + aux
            loss.backward()
        """))
    assert term_assignment(str(script), 7, "kl")[0] == 4
    assert term_assignment(str(script), 7, "aux")[0] == 2
    assert term_assignment(str(script), 7, "missing") is None


def test_computed_counts_and_normalised_weights_are_not_sums_over_the_batch():
    h = _activations()
    mean_term = F.mse_loss(h, torch.zeros_like(h))
    mask = (torch.rand(8, 5) > 0.3).float()
    assert mixed_terms((mean_term + (h * mask).sum() / mask.sum()).grad_fn) is None
    w = torch.softmax(torch.randn(8, 1), 0).expand(8, 5) / 5  # weights adding up to 1
    assert mixed_terms((mean_term + (w * h).sum()).grad_fn) is None
    advantage = torch.randn(8, 5)  # weights of their own: still a sum over the batch
    assert mixed_terms((mean_term + (advantage * h).sum()).grad_fn) is not None


def test_a_sum_divided_by_a_count_near_the_batch_is_a_mean_over_the_rows_kept():
    from graddoctor.instrument.batchreduce import Term

    def term(divisor, n):
        return Term(None, (), None, None, n, "sum", divisor)

    # torch's label smoothing with ignore_index: the smoothing sum over 320 targets / 213 kept
    assert term(213.0, 320).averaged and term(320.0, 320).averaged
    assert not term(2.0, 32).averaged and not term(1.0, 320).averaged  # `kl.sum() / 2`: a sum
    assert not term(50.0, 320).averaged  # a constant far below N: still a sum
    assert term(1000.0, 320).averaged  # the tokens of a whole accumulation window


# -- a sum over the batch broadcast into every sample's value before the mean ------------------

def _coupling_loss(per_sample_logdet: bool, n=16):
    """A two-layer affine coupling flow's NLL; its log-det summed per sample (dim=1) or over
    the whole batch (``s.sum()``), the 0/1 masks a coupling layer multiplies by."""
    torch.manual_seed(0)
    net = torch.nn.Linear(2, 4)
    x = torch.randn(n, 2)
    log_det = torch.zeros(n)
    for mask in (torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])):
        s, t = net(x * mask).chunk(2, dim=1)
        s = torch.tanh(s) * (1 - mask)
        x = x * mask + (1 - mask) * (x * torch.exp(s) + t)
        log_det = log_det + (s.sum(dim=1) if per_sample_logdet else s.sum())
    log_prob = -0.5 * (x ** 2).sum(dim=1)
    return -(log_prob + log_det).mean()


def test_log_det_summed_over_the_batch_then_averaged_is_found():
    pair = mixed_terms(_coupling_loss(per_sample_logdet=False).grad_fn)
    assert pair is not None
    summed, averaged = pair
    assert summed.inside is averaged and summed.how == "sum" and summed.n == 16


def test_log_det_summed_per_sample_is_silent():
    # the (1 - mask) factor adds up to 1 but weighs features, not samples: no weighted mean
    assert mixed_terms(_coupling_loss(per_sample_logdet=True).grad_fn) is None


def test_kl_summed_inside_the_mean_is_found_and_its_per_sample_twin_is_not():
    h = _activations()
    recon = h.pow(2).sum(dim=1)
    bad = (recon + 0.5 * h.abs().sum()).mean()
    assert mixed_terms(bad.grad_fn) is not None
    good = (recon + 0.5 * h.abs().sum(dim=1)).mean()
    assert mixed_terms(good.grad_fn) is None


def test_broadcast_scalars_that_are_no_batch_sum_are_silent():
    h = _activations()
    per = h.pow(2).sum(dim=1)
    # centred by the batch mean, by a sum divided by the batch size, or shifted by a penalty
    # on a weight: none is a sum over the samples left whole
    assert mixed_terms((per - per.mean()).pow(2).mean().grad_fn) is None
    assert mixed_terms((per - h.sum() / h.size(0)).abs().mean().grad_fn) is None
    w = torch.randn(3, 7, requires_grad=True)
    assert mixed_terms((per + 1e-3 * w.pow(2).sum()).mean().grad_fn) is None
    assert mixed_terms((per + w.pow(2).sum()).mean().grad_fn) is None


def test_a_broadcast_sum_of_another_batch_is_silent():
    # a term from data that shares no per-sample activation with the mean's value
    h = _activations()
    other = torch.randn(8, 3, requires_grad=True)
    assert mixed_terms((h.pow(2).sum(dim=1) + other.pow(2).sum()).mean().grad_fn) is None


def test_full_sums_lists_sums_over_every_axis():
    from graddoctor.analysis.source import full_sums
    import tempfile, os
    text = textwrap.dedent('''
        import torch
        def f(s, x):
            a = s.sum()
            b = torch.sum(x)
            c = s.sum(dim=1) + torch.sum(x, 0) + s.sum(-1)
            return a + b + c
    ''')
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.py")
        with open(path, "w") as fh:
            fh.write(text)
        assert [line for line, _ in full_sums(path)] == [4, 5]


def test_a_product_by_exactly_one_over_n_is_noted_and_a_weight_is_not():
    h = _activations()  # N = 8
    pair = mixed_terms((F.mse_loss(h, torch.zeros_like(h)) + 6.0 * ((1.0 / 8) * h.pow(2).sum())).grad_fn)
    assert pair is not None and pair[0].times_reciprocal  # TRADES' `(1.0 / batch_size) * kl_sum`
    pair = mixed_terms((F.mse_loss(h, torch.zeros_like(h)) + 0.1 * h.pow(2).sum()).grad_fn)
    assert pair is not None and not pair[0].times_reciprocal


def _rule_findings(statement: str, times_reciprocal: bool):
    """The rule's findings for one batch_reduction event whose summed term is assigned by
    ``statement`` in a script of its own."""
    import tempfile
    from pathlib import Path

    from graddoctor.analysis import Analysis
    from graddoctor.rules.loss_terms_mixed_reduction import LossTermsMixedReduction
    from graddoctor.trace import Event, Location, Trace

    script = textwrap.dedent(f"""\
        for step in range(3):
            {statement}
            loss = natural + kl
            loss.backward()
        """)
    path = Path(tempfile.mkdtemp()) / "train.py"
    path.write_text(script)
    event = Event(seq=1, kind="batch_reduction", loc=Location(str(path), 4), data={
        "summed": "KlDiv(reduction=sum)", "averaged": "mean", "batch": 8, "averaged_rows": 8,
        "summed_name": "kl", "averaged_name": "natural", "broadcast": False,
        "times_reciprocal": times_reciprocal})
    return list(LossTermsMixedReduction().check(Analysis(Trace(events=[event]))))


def test_a_reciprocal_written_in_the_statement_is_a_mean_only_with_the_event_saying_so():
    assert _rule_findings("kl = (1.0 / batch_size) * kl_sum", True) == []
    assert len(_rule_findings("kl = (1.0 / batch_size) * kl_sum", False)) == 1
    assert len(_rule_findings("kl = 0.125 * kl_sum", True)) == 1  # a weight that is 1 / 8
