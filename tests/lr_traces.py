"""Hand-written traces of learning-rate schedules for the scheduler rules' unit tests and the lr
timeline's: a scheduler's construction, its steps, optimizer steps that read the lr. No torch."""

from __future__ import annotations

from graddoctor import events as ev
from rule_traces import P, builder


def sched_init(t, cls="LinearLR", sched=0, opt=0, args=None, lrs=(0.001,), base=(0.1,),
               children=(), line=5):
    return t.put(ev.scheduler_init(sched=sched, cls=cls, opt=opt, args=dict(args or {}),
                                   children=list(children), base_lrs=list(base), lrs=list(lrs)), line)


def sched_step(t, sched=0, opt=0, cls="LinearLR", lrs=None, line=30, metric="none", grad=True):
    return t.put(ev.scheduler_step(sched=sched, cls=cls, opt=opt, lrs=None if lrs is None else list(lrs),
                                   metric=metric, grad=grad), line)


def update(t, opt=0, lr=0.1, batch=None, backward_line=11, step_line=12, params=P):
    t.clear(params, opt=opt, line=10)
    t.backward(fresh=params, line=backward_line, batch=batch)
    t.put(ev.step_begin(opt=opt, norm_pids=None, norms=None, lrs=[lr]), step_line)
    return t.step(opt, line=step_line)


def epoch(t, number, real_len=40, replay_len=17, loader=0):
    return t.put(ev.epoch_start(loader=loader, epoch=number, real_len=real_len,
                                replay_len=replay_len), 8)


def loader_run(t, epochs=2, batches=17, per_batch=None, per_epoch=None, accum=1, real_len=40,
               replay_len=17, lr=0.1):
    """``per_batch``/``per_epoch``: (sched, cls) stepped after every batch / every epoch."""
    for e in range(epochs):
        epoch(t, e, real_len=real_len, replay_len=replay_len)
        for i in range(batches):
            t.backward(fresh=P, line=11, batch=[0, e, i])
            if (i + 1) % accum == 0:
                t.put(ev.step_begin(opt=0, norm_pids=None, norms=None, lrs=[lr]), 12)
                t.step(0, line=12)
                t.clear(P, line=13)
            if per_batch:
                sched_step(t, sched=per_batch[0], cls=per_batch[1], line=14)
        if per_epoch:
            sched_step(t, sched=per_epoch[0], cls=per_epoch[1], line=16)


__all__ = ["P", "builder", "sched_init", "sched_step", "update", "epoch", "loader_run"]
