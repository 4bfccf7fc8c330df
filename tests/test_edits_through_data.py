"""Edits of ``.grad`` through ``.data`` (no version bump) are read from the values the
backward left (instrument/editfactor.py ``untracked``)."""

import math

import torch

from graddoctor.instrument.editfactor import EditFactors


def _sampled(*grads):
    factors = EditFactors()
    factors.observe(1, list(range(len(grads))), list(grads))
    return factors


def test_an_edit_through_data_is_found_and_nothing_else():
    edited, untouched, bumped = torch.randn(5), torch.randn(5), torch.randn(5)
    factors = _sampled(edited, untouched, bumped)
    edited.data.mul_(0.5)  # through .data: the version stays
    bumped.mul_(0.5)  # an ordinary in-place edit: the version moves (the version check's)
    assert edited._version == 0 and bumped._version == 1
    found = factors.untracked(1, [0, 1, 2], [edited, untouched, bumped], skip=set())
    assert found == [0]
    assert factors.untracked_seen and not factors.done  # every later backward is sampled


def test_skipped_stale_and_replaced_grads_are_not_judged():
    grad = torch.randn(4)
    factors = _sampled(grad)
    grad.data.zero_()
    assert factors.untracked(1, [0], [grad], skip={0}) == []
    assert factors.untracked(2, [0], [grad], skip=set()) == []  # a later backward: no sample
    assert factors.untracked(1, [0], [torch.zeros(4)], skip=set()) == []  # another tensor
    assert factors.untracked(1, [0], [grad], skip=set()) == [0]


def test_a_nan_left_alone_is_no_edit():
    grad = torch.tensor([1.0, math.nan, 2.0])
    factors = _sampled(grad)
    assert factors.untracked(1, [0], [grad], skip=set()) == []
    assert not factors.untracked_seen


def test_unscale_rebases_what_an_edit_is_judged_against():
    grad = torch.randn(6) * 1024
    factors = _sampled(grad)
    grad.data.mul_(1 / 1024)  # what GradScaler.unscale_ does: no version bump
    factors.rebase([0], [grad])
    assert factors.untracked(1, [0], [grad], skip=set()) == []
    grad.data.div_(2)  # then the script's own edit
    assert factors.untracked(1, [0], [grad], skip=set()) == [0]


def test_unscale_rebases_only_the_samples_of_the_latest_backward(monkeypatch):
    """``GradScaler.unscale_`` re-bases the samples only while they are the latest backward's:
    older ones are never compared again, and re-basing them on every later step was dead work."""
    from graddoctor.instrument import Instrumentation, Recorder
    from graddoctor.location import LocationFinder

    rebased = []
    rebase = EditFactors.rebase
    monkeypatch.setattr(EditFactors, "rebase",
                        lambda self, pids, grads: (rebased.append(self._at), rebase(self, pids, grads)))
    torch.manual_seed(0)
    rec = Recorder(step_budget=None, finder=LocationFinder())
    with Instrumentation(rec):
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        x = torch.randn(8, 4)
        for _ in range(20):
            opt.zero_grad()
            scaler.scale(model(x).pow(2).mean()).backward()
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
    assert rebased and rebased == list(range(1, len(rebased) + 1)) and len(rebased) < 20
