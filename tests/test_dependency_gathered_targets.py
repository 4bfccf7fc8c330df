"""The tokens a hand-written log-likelihood gathers out of a log_softmax are read as its targets
(dependency.py's ``_gathered_targets``), and nothing else is."""

from __future__ import annotations

import torch

from graddoctor.instrument.dependency import _gathered_targets


def _logits():
    return torch.randn(3, 5, 7, requires_grad=True)


def test_the_index_of_a_gather_over_log_probabilities_is_a_target():
    ids = torch.randint(0, 7, (3, 5))
    loss = -_logits().log_softmax(-1).gather(2, ids.unsqueeze(-1)).sum()
    found = _gathered_targets([loss], 8)
    assert len(found) == 1
    index, fn, ignore, loc, logits = found[0]
    assert fn == "gather" and ignore == -100 and loc is None
    assert logits is not None and "AccumulateGrad" in logits.name()  # the logits' node (a leaf here)
    assert torch.equal(index, ids)


def test_other_gathers_are_not_targets():
    ids = torch.randint(0, 3, (3, 5, 7))
    over_batch = _logits().log_softmax(-1).gather(0, ids).sum()  # not along the classes
    probs = _logits().softmax(-1).gather(2, ids[..., :1]).sum()  # not log-probabilities
    assert _gathered_targets([over_batch], 8) == []
    assert _gathered_targets([probs], 8) == []
    assert _gathered_targets([torch.tensor(1.0)], 8) == []


def test_room_bounds_what_is_read():
    ids = torch.randint(0, 7, (3, 5, 1))
    logp = _logits().log_softmax(-1)
    loss = logp.gather(2, ids).sum() + logp.gather(2, ids.flip(1)).sum()
    assert len(_gathered_targets([loss], 1)) == 1
    assert len(_gathered_targets([loss], 8)) == 2


def test_rows_compared_reads_a_loss_over_the_output_rows_pairwise():
    """The loss compares the rows of an (N, D) output with each other (cdist, or a similarity
    out @ out.T): the rows are the samples, a batch size the data need not tell."""
    from graddoctor.instrument.dependency import _rows_compared

    lin = torch.nn.Linear(6, 4)
    out = lin(torch.randn(12, 6))
    assert _rows_compared(torch.cdist(out, out).mean(), out)  # small sizes: _euclidean_dist
    big = lin(torch.randn(40, 6))
    assert _rows_compared(torch.cdist(big, big, compute_mode="donot_use_mm_for_euclid_dist").sum(), big)
    assert _rows_compared((out @ out.T).logsumexp(1).mean(), out)
    assert _rows_compared([(out @ out.t()).sum(), out.sum()], out)
    other = lin(torch.randn(12, 6))
    assert not _rows_compared((out @ other.T).sum(), out)  # two sets: a cross-similarity
    assert not _rows_compared((out @ lin.weight).sum(), out)  # a product with a parameter
    assert not _rows_compared(out.pow(2).sum(), out)
    assert not _rows_compared(torch.cdist(out[:3], out[:3]).sum(), out[:3])  # fewer than 4 rows
    assert not _rows_compared(torch.tensor(1.0), out)


def test_logits_gathered_beside_their_logsumexp_are_a_log_likelihood():
    ids = torch.randint(0, 7, (3, 5))
    z = _logits()
    nll = (torch.logsumexp(z, -1) - z.gather(-1, ids[..., None]).squeeze(-1)).sum()
    found = _gathered_targets([nll], 8)
    assert len(found) == 1 and torch.equal(found[0][0], ids)
    assert _gathered_targets([z.gather(-1, ids[..., None]).sum()], 8) == []  # no normaliser: a score


def test_the_log_of_a_softmax_gathered_is_a_log_likelihood():
    ids = torch.randint(0, 7, (3, 5, 1))
    loss = -_logits().softmax(-1).log().gather(2, ids).sum()
    found = _gathered_targets([loss], 8)
    assert len(found) == 1 and torch.equal(found[0][0], ids.squeeze(-1))


def test_a_one_hot_times_log_probabilities_gives_its_classes():
    ids = torch.randint(0, 7, (3, 5))
    logp = _logits().log_softmax(-1)
    for loss in (-(logp * torch.nn.functional.one_hot(ids, 7)).sum(),
                 -(torch.nn.functional.one_hot(ids, 7).float() * logp).sum()):
        found = _gathered_targets([loss], 8)
        assert len(found) == 1 and torch.equal(found[0][0], ids)
    weights = torch.rand(3, 5, 1)  # a per-position weight, not a distribution over the classes
    assert _gathered_targets([(logp * weights).sum()], 8) == []
    two = torch.zeros(3, 5, 7)
    two[..., :2] = 0.5  # no top class
    assert _gathered_targets([(logp * two).sum()], 8) == []


def test_every_dimension_indexed_picks_the_tokens():
    ids = torch.randint(0, 7, (3, 5))
    probs = _logits().softmax(-1)
    picked = probs[torch.arange(3)[:, None], torch.arange(5)[None, :], ids]
    found = _gathered_targets([-torch.log(picked).sum()], 8)
    assert len(found) == 1 and torch.equal(found[0][0], ids)
    shuffled = probs[torch.arange(3)[:, None], torch.arange(5).flip(0)[None, :], ids]
    assert _gathered_targets([shuffled.sum()], 8) == []  # positions not read in order
    raw = _logits()[torch.arange(3)[:, None], torch.arange(5)[None, :], ids]
    assert _gathered_targets([raw.sum()], 8) == []  # neither probabilities nor log-probs
