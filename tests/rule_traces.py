"""Hand-written traces shared by the rules' unit tests (tests/test_rule_*.py): a model of two
parameters, an optimizer over them, and the events of clips, epochs and updates; and
``fold_hard``, a recorded trace folded as a long run's would be. No torch."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.rules.engine import analyze
from graddoctor.instrument.fold import Folder
from graddoctor.rules import find_rule
from graddoctor.trace import Trace, TraceBuilder


P = [0, 1]  # the model's parameters


def clip(t, params=P, line=None, norm_only=False, via="clip_grad_norm_", edited=()):
    return t.event("clip", line, via=via, params=list(params), with_grad=list(params), untracked=0,
                   limit=float("inf") if norm_only else 1.0, norm_type=2.0, norm_only=norm_only,
                   total_norm=None, edited=list(edited))


def epoch(t, number, real_len=9, replay_len=9, loader=0, line=None):
    return t.event("epoch_start", line, loader=loader, epoch=number, real_len=real_len,
                   replay_len=replay_len)


def findings(trace_or_builder, slug):
    trace = trace_or_builder.trace if isinstance(trace_or_builder, TraceBuilder) else trace_or_builder
    return list(find_rule(slug)().check(Analysis(trace)))


def only(trace, slug):
    found = findings(trace, slug)
    assert len(found) == 1, found
    return found[0]


def builder(cls="SGD", params=P) -> TraceBuilder:
    t = TraceBuilder()
    t.optimizer(0, params, line=1, cls=cls)
    return t


def nan_step(t, skipped=False):
    t.event("step_begin", 102, opt=0, closure=False, norm_pids=P, norms=[float("nan"), 1.0],
            nonfinite=[0])
    t.step(line=102, skipped=skipped)


def ddp_window(t, syncs, step_line=20, zero=True):
    for s in syncs:
        t.put(ev.ddp_no_sync(ddp=0), 10) if not s else None
        t.backward(fresh=[0, 1], line=12, allreduce=s)
    t.step(0, line=step_line)
    if zero:
        t.clear([0, 1], line=21)


def plain_update(t, opt=0, params=P, factor=1.0, terms=("mean",), batch=None, line=11, step_line=12):
    t.clear(params, opt=opt, line=10)
    t.backward(fresh=params, line=line, loss_scale_factor=factor,
               loss_terms=list(terms) if terms is not None else None, batch=batch)
    return t.step(opt, line=step_line)


def slugs(trace) -> list[tuple[str, int]]:
    findings, errors = analyze(trace)
    assert not errors
    return sorted((f.rule, f.location.line) for f in findings if f.severity.value != "info")


def basic(t: TraceBuilder, with_clear: bool):
    t.optimizer(0, [0, 1], line=3)
    for i in range(3):
        if with_clear:
            t.clear([0, 1], line=5)
        if i == 0 or with_clear:
            t.backward(fresh=[0, 1], line=6)
        else:
            t.backward(accumulated=[0, 1], line=6)
        t.step(0, line=7)
    return t.trace


def lbfgs_loop(t: TraceBuilder, clear_inside: bool, evaluations: int = 4):
    """One ``step(closure)`` of an L-BFGS-like optimizer evaluating its closure several times."""
    from graddoctor import events as ev

    t.optimizer(0, [0, 1], line=3, cls="LBFGS")
    t.clear([0, 1], line=20)
    t.put(ev.step_begin(opt=0, norm_pids=[], norms=[], closure=True), line=21)
    for i in range(evaluations):
        if clear_inside:
            t.clear([0, 1], line=14)
        if clear_inside or i == 0:
            t.backward(fresh=[0, 1], line=16, in_step=0)
        else:
            t.backward(accumulated=[0, 1], line=16, in_step=0)
    t.step(0, line=21, closure=True)
    return t.trace


HARD = {"fold_after": 0, "keep": 1, "context": 1, "max_period": 2}


def fold_hard(trace: Trace) -> Trace:
    """The trace as the recorder would keep it folding from the first turn on, with one copy of
    a repeated block of up to two turns kept and one turn of context: what a long run's trace
    looks like to the rules, made from a short one."""
    folded = Trace()
    folder = Folder(folded, **HARD)
    for event in trace.events:
        folder.observe(event.kind, event.loc)
        folded.events.append(event)
    folder.finish()
    return folded
