"""The AMP / clipping / scheduler / DataLoader watchers, in process, on real torch calls."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from graddoctor.instrument import Instrumentation, Recorder, StepLimitReached
from graddoctor.instrument.lossfactor import loss_factor


def events(rec, kind):
    return [e for e in rec.trace if e.kind == kind]


def recorder(budget=None):
    return Recorder(step_budget=budget)


# -- the loss factor ----------------------------------------------------------------------------
def test_loss_factor_reads_constant_divisions():
    w = nn.Parameter(torch.randn(3))
    loss = (w * 2).sum()
    other = (w ** 2).mean()
    assert loss_factor(loss) == 1.0
    assert loss_factor(loss / 4) == 0.25
    assert loss_factor(loss * (1 / 4)) == 0.25
    assert loss_factor(0.25 * loss) == 0.25
    assert loss_factor(loss.div(4)) == 0.25
    inplace = loss.clone()
    inplace /= 4
    assert loss_factor(inplace) == 0.25
    assert loss_factor(loss / 4 + other / 4) == 0.25
    assert loss_factor(loss + other) == 1.0
    scaler = torch.amp.GradScaler("cpu")
    assert loss_factor(scaler.scale(loss / 3), skip_top=True) == pytest.approx(1 / 3)


def test_loss_factor_is_unknown_for_computed_divisors_and_mixed_terms():
    w = nn.Parameter(torch.randn(3))
    loss = (w * 2).sum()
    assert loss_factor(loss / torch.tensor(4.0)) is None      # a tensor the script computed
    assert loss_factor(loss + 0.1 * (w ** 2).sum()) is None   # a weighted auxiliary term
    assert loss_factor([loss, loss]) is None
    assert loss_factor(w) is None                              # backward on a leaf


# -- DataLoader epochs ------------------------------------------------------------------------
def loader_of(batches, batch_size=4):
    return DataLoader(TensorDataset(torch.randn(batches * batch_size, 2)), batch_size=batch_size)


def test_epochs_are_short_in_iter_and_len_and_record_both_lengths():
    loader = loader_of(100)
    rec = recorder()
    with Instrumentation(rec, epoch_batches=17):
        assert len(loader) == 17
        iterator = iter(loader)
        assert len(iterator) == 17
        assert sum(1 for _ in iterator) == 17
        assert sum(1 for _ in loader) == 17
        small = loader_of(5)
        assert len(small) == 5 and sum(1 for _ in small) == 5
    assert len(loader) == 100 and sum(1 for _ in loader) == 100  # all undone
    starts = events(rec, "epoch_start")
    assert [(e["epoch"], e["real_len"], e["replay_len"]) for e in starts[:2]] == [(0, 100, 17), (1, 100, 17)]
    assert (starts[2]["real_len"], starts[2]["replay_len"]) == (5, 5)


def test_epoch_batches_zero_keeps_real_epochs_and_streams_are_not_cut():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.arange(40).float().view(40, 1))

    rec = recorder()
    with Instrumentation(rec, epoch_batches=0):
        assert len(loader_of(100)) == 100
        assert sum(1 for _ in loader_of(100)) == 100
    with Instrumentation(recorder(), epoch_batches=17):
        assert sum(1 for _ in DataLoader(Stream(), batch_size=1)) == 40


def train(loader, epochs, model=None):
    model = model or nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(epochs):
        for (x,) in loader:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()


def test_budget_goes_on_until_the_third_epoch_has_begun():
    rec = recorder(budget=10)
    with Instrumentation(rec, epoch_batches=17), pytest.raises(StepLimitReached):
        train(loader_of(100), epochs=5)
    assert rec.progress.steps == 35  # 17 + 17 + the first step of epoch 3
    assert len(events(rec, "epoch_start")) == 3
    rec = recorder(budget=10)
    with Instrumentation(rec, epoch_batches=0), pytest.raises(StepLimitReached):
        train(loader_of(100), epochs=5)
    assert rec.progress.steps == 10


def test_backward_carries_its_batch():
    rec = recorder()
    with Instrumentation(rec, epoch_batches=3):
        train(loader_of(10), epochs=2)
    batches = [e["batch"] for e in events(rec, "backward")]
    assert batches == [[0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 1, 2]]


# -- schedulers -------------------------------------------------------------------------------
def test_only_the_users_scheduler_steps_are_recorded():
    model = nn.Linear(2, 1)
    rec = recorder()
    with Instrumentation(rec):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step_lr = torch.optim.lr_scheduler.StepLR(opt, step_size=1)  # its initial step is PyTorch's
        opt2 = torch.optim.SGD(model.parameters(), lr=0.1)
        seq = torch.optim.lr_scheduler.SequentialLR(
            opt2, [torch.optim.lr_scheduler.LinearLR(opt2, total_iters=2),
                   torch.optim.lr_scheduler.ExponentialLR(opt2, gamma=0.9)], milestones=[2])
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
        assert events(rec, "scheduler_step") == []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(3):
                step_lr.step()
                seq.step()
            plateau.step(1.0)
    got = [(e["cls"], e["opt"]) for e in events(rec, "scheduler_step")]
    assert got == [("StepLR", 0), ("SequentialLR", 1)] * 3 + [("ReduceLROnPlateau", 0)]


# -- clipping ---------------------------------------------------------------------------------
def test_clip_names_bound_before_and_after_instrumentation_are_seen():
    early = torch.nn.utils.clip_grad_norm_  # bound before graddoctor started
    model = nn.Linear(4, 2)
    rec = recorder()
    with Instrumentation(rec):
        from torch.nn.utils import clip_grad_norm_, clip_grad_value_

        model(torch.randn(3, 4)).sum().backward()
        clip_grad_norm_(model.parameters(), 0.1)  # a generator
        early(model.parameters(), 0.1)
        clip_grad_value_(model.parameters(), 0.01)
        torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        model(torch.randn(3, 4)).sum().backward()
    clips = events(rec, "clip")
    assert [c["via"] for c in clips] == ["clip_grad_norm_", "clip_grads_with_norm_",
                                         "clip_grad_value_", "clip_grad_norm_"]
    assert [c["norm_only"] for c in clips] == [False, False, False, True]
    assert all(len(c["params"]) == 2 and c["edited"] == [] for c in clips)
    last = events(rec, "backward")[-1]
    assert sorted(last["accumulated"]) == [0, 1] and last["cleared_outside"] == []


def test_clipping_under_instrumentation_computes_the_same():
    torch.manual_seed(0)
    a = nn.Linear(4, 2)
    b = nn.Linear(4, 2)
    b.load_state_dict(a.state_dict())
    x = torch.randn(5, 4) * 100
    a(x).sum().backward()
    norm_a = torch.nn.utils.clip_grad_norm_(a.parameters(), 0.5)
    with Instrumentation(recorder()):
        b(x).sum().backward()
        norm_b = torch.nn.utils.clip_grad_norm_((p for p in b.parameters()), 0.5)
    assert torch.equal(norm_a, norm_b)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters()))


def test_hand_edited_grads_are_noticed_before_the_step():
    model = nn.Linear(4, 2)
    rec = recorder()
    with Instrumentation(rec):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(3, 4)).sum().backward()
        for p in model.parameters():
            p.grad /= 4
        opt.step()
    assert [e["params"] for e in events(rec, "grad_edit")] == [[0, 1]]


# -- GradScaler -------------------------------------------------------------------------------
def amp_steps(rec, scaler, n, dtype=torch.bfloat16, explicit_unscale=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    with Instrumentation(rec):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(n):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=dtype):
                loss = nn.functional.cross_entropy(model(torch.randn(16, 8)), torch.randint(0, 4, (16,)))
            scaler.scale(loss / 2).backward()
            if explicit_unscale:
                scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()


def test_scaled_backward_and_implicit_unscale_are_recorded():
    rec = recorder()
    amp_steps(rec, torch.amp.GradScaler("cpu"), 2)
    backward = events(rec, "backward")[0]
    assert backward["scaled"] and backward["scaler_enabled"] and backward["scale"] == 65536.0
    assert backward["loss_scale_factor"] == 0.5
    assert [e["implicit"] for e in events(rec, "unscale")] == [True, True]
    assert [e["skipped"] for e in events(rec, "step")] == [False, False]
    rec = recorder()
    amp_steps(rec, torch.amp.GradScaler("cpu"), 1, explicit_unscale=True)
    assert [e["implicit"] for e in events(rec, "unscale")] == [False]


def test_skipped_steps_are_recorded_and_counted():
    rec = recorder()
    amp_steps(rec, torch.amp.GradScaler("cpu", init_scale=2.0 ** 24), 8, dtype=torch.float16)
    skipped = [e["skipped"] for e in events(rec, "step")]
    assert len(skipped) == 8 == rec.progress.steps
    assert skipped[0] and not skipped[-1]
    assert [e["skipped"] for e in events(rec, "scaler_step")] == skipped
    assert len(events(rec, "step_begin")) == skipped.count(False)


def test_disabled_scaler_is_still_watched():
    rec = recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scaler = torch.cuda.amp.GradScaler(enabled=False)
    amp_steps(rec, scaler, 1, explicit_unscale=True)
    backward = events(rec, "backward")[0]
    assert backward["scaled"] and backward["scaler_enabled"] is False and backward["scale"] is None
    assert backward["loss_scale_factor"] == 0.5
    assert [e["enabled"] for e in events(rec, "unscale")] == [False]
    assert [e["skipped"] for e in events(rec, "step")] == [False]


def run_amp_clip_accum():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=20)
    scaler = torch.amp.GradScaler("cpu")
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,))), batch_size=4)
    for i, (x, y) in enumerate(loader):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y) / 2
        scaler.scale(loss).backward()
        if (i + 1) % 2 == 0:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            scaler.step(opt)
            scaler.update()
            sched.step()
            opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def test_instrumentation_does_not_change_what_the_script_computes():
    plain = run_amp_clip_accum()
    with Instrumentation(recorder(), epoch_batches=0):
        watched = run_amp_clip_accum()
    assert all(torch.equal(a, b) for a, b in zip(plain, watched))


def test_a_shortened_len_read_is_recorded_once_per_loader():
    loader, small = loader_of(100), loader_of(5)
    rec = recorder()
    with Instrumentation(rec, epoch_batches=17):
        for _ in range(3):
            assert len(loader) == 17
        assert len(small) == 5  # not shortened: nothing to say
    reads = events(rec, "short_len")
    assert [(e["real_len"], e["replay_len"]) for e in reads] == [(100, 17)]
    rec = recorder()
    with Instrumentation(rec, epoch_batches=0):
        assert len(loader) == 100
    assert events(rec, "short_len") == []


def test_a_crash_after_a_shortened_len_says_how_to_run_whole_epochs(tmp_path):
    # the script asserts len(loader) % accum == 0: true for its 32 batches, not for the replay's 17
    from graddoctor.api import check_script
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "loader = DataLoader(TensorDataset(torch.randn(256, 2)), batch_size=8)\n"
        "assert len(loader) % 4 == 0\n")
    report = check_script(str(script), fail_on="never")
    assert report.run.status == "crashed"
    [note] = [n for n in report.run.notes if "len() of a DataLoader" in n]
    assert "train.py:4" in note and "17 of its 32" in note and "--epoch-batches 0" in note
    assert not [n for n in check_script(str(script), epoch_batches=0, fail_on="never").run.notes
                if "len() of a DataLoader" in n]
