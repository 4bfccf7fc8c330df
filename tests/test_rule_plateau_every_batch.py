"""plateau-every-batch (GD210) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import P, builder, findings, only, plain_update


def sched(t, line=30, cls="ReduceLROnPlateau", opt=0, sched_id=0):
    return t.put(ev.scheduler_step(sched=sched_id, cls=cls, opt=opt), line)


def epoch(t, number, loader=0):
    return t.put(ev.epoch_start(loader=loader, epoch=number, real_len=17, replay_len=17), 5)


def loader_loop(t, epochs=2, batches=17, every=1, cls="ReduceLROnPlateau", step_every=1):
    for e in range(epochs):
        epoch(t, e)
        for i in range(batches):
            t.backward(fresh=P, line=11, batch=[0, e, i])
            if (i + 1) % step_every == 0:
                t.step(0, line=12)
                t.clear(P, line=13)
            if (i + 1) % every == 0:
                sched(t, cls=cls)


def test_plateau_stepped_every_batch_of_an_epoch_is_a_warning_at_the_call():
    t = builder()
    loader_loop(t)
    f = only(t, "plateau-every-batch")
    assert (f.location.line, f.severity) == (30, Severity.WARNING)
    assert f.evidence["calls"] == 17 and f.evidence["steps"] == 17 and f.evidence["epoch"] == [0, 0]
    assert "epoch 0 of the DataLoader" in f.message


def test_plateau_stepped_every_micro_batch_is_found_too():
    t = builder()
    loader_loop(t, step_every=4)
    f = only(t, "plateau-every-batch")
    assert f.evidence["calls"] == 17 and f.evidence["steps"] == 4


def test_plateau_without_dataloader_is_info():
    t = builder()
    for _ in range(5):
        plain_update(t)
        sched(t)
    f = only(t, "plateau-every-batch")
    assert f.severity is Severity.INFO and "full-batch" in f.message


def test_plateau_silent_cases():
    t = builder()
    loader_loop(t, every=17)                 # once per epoch
    assert findings(t, "plateau-every-batch") == []
    t = builder()
    loader_loop(t, every=4)                  # after each of four validations per epoch
    assert findings(t, "plateau-every-batch") == []
    t = builder()
    loader_loop(t, cls="OneCycleLR")         # a per-batch schedule stepped per batch
    assert findings(t, "plateau-every-batch") == []
    t = builder()
    loader_loop(t, epochs=6, batches=1)      # full-batch through a DataLoader: 1 batch an epoch
    assert findings(t, "plateau-every-batch") == []
    t = builder()
    loader_loop(t, epochs=1, batches=2)      # two calls are not "every batch" yet
    assert findings(t, "plateau-every-batch") == []
    t = builder()
    for _ in range(2):                       # without a DataLoader: too few steps
        plain_update(t)
        sched(t)
    assert findings(t, "plateau-every-batch") == []
    t = builder()
    for e in range(4):                       # without a DataLoader, an inner loop of 3 steps
        for _ in range(3):
            plain_update(t)
        sched(t)
    assert findings(t, "plateau-every-batch") == []


def test_plateau_of_another_optimizer_counts_its_own_steps():
    t = TraceBuilder()
    t.optimizer(0, [0], line=1)
    t.optimizer(1, [1], line=2)
    for e in range(2):
        epoch(t, e)
        for i in range(17):
            t.backward(fresh=P, line=11, batch=[0, e, i])
            t.step(0, line=12)
            if (i + 1) % 17 == 0:
                t.step(1, line=14)
            sched(t, opt=1)  # drives optimizer 1, which steps once per epoch
    f = only(t, "plateau-every-batch")
    assert f.evidence["steps"] == 1 and f.evidence["optimizer"] == 1


def _validated_every_batch(evidence, metric="number"):
    t = builder()
    for e in range(2):
        epoch(t, e)
        for i in range(17):
            t.backward(fresh=P, line=11, batch=[0, e, i])
            t.step(0, line=12)
            t.clear(P, line=13)
            evidence(t, e, i)
            t.put(ev.scheduler_step(sched=0, cls="ReduceLROnPlateau", opt=0, metric=metric), 30)
    return t


def test_plateau_after_a_validation_pass_every_batch_is_silent():
    # Pytorch-UNet: the validation interval, computed from the dataset size, is every batch
    def val_loader(t, e, i):
        t.put(ev.mode_set(mode=False, leaf=False, root="UNet", frozen=False, modules=[]), 20)
        t.put(ev.epoch_start(loader=1, epoch=e * 17 + i, real_len=2, replay_len=2), 21)
        t.put(ev.mode_set(mode=True, leaf=False, root="UNet", frozen=False, modules=[]), 22)

    def no_grad_forward(t, e, i):
        t.put(ev.mode_forward(training=False, grad=False, inference=True, modules=[0],
                              grad_modules=[]), 21)

    assert findings(_validated_every_batch(val_loader), "plateau-every-batch") == []
    assert findings(_validated_every_batch(no_grad_forward), "plateau-every-batch") == []


def test_plateau_on_a_training_loss_tensor_counts_whatever_came_before():
    def no_grad_forward(t, e, i):
        t.put(ev.mode_forward(training=True, grad=False, inference=False, modules=[0],
                              grad_modules=[]), 21)

    f = only(_validated_every_batch(no_grad_forward, metric="grad_tensor"), "plateau-every-batch")
    assert f.severity is Severity.WARNING
