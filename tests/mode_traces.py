"""Hand-written traces of train/eval modes, BatchNorm and dropout layers, shared by the unit tests
of the mode rules (frozen-bn-train-mode, train-in-eval-mode, eval-in-train-mode,
teacher-in-train-mode). No torch."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.trace import TraceBuilder


def bn(t, mid, name=None, **kw):
    data = dict(mid=mid, name=name or f"model.bn{mid}", cls="BatchNorm2d", layer="batchnorm",
                has_params=True, frozen=False, owned=True, trainable=True, updated=False,
                track_running_stats=True, momentum=0.1, p=None, freeze=None)
    data.update(kw)
    return t.trace.add("mode_module", None, **data)


def drop(t, mid, name=None, p=0.1, model=None, unchanged=None, changed=False):
    """A dropout layer's facts; ``model``: the untrained model holding it, seen in train mode
    under no_grad, unchanged over ``unchanged`` steps or ``changed`` (an EMA copy)."""
    return t.put(ev.mode_module(
        mid=mid, name=name or f"{model or 'model'}.drop{mid}", cls="Dropout", layer="dropout",
        has_params=False, frozen=None, owned=None, trainable=None, updated=False,
        track_running_stats=None, momentum=None, p=p, model=model,
        model_unchanged=0 if model and unchanged is None else unchanged,
        model_changed=changed))


def mode_set(t, mode, modules, line, leaf=False, frozen=False):
    return t.event("train" if mode else "eval", line, mode=mode, leaf=leaf, root="Sequential", frozen=frozen,
                   modules=list(modules), calls=1)


def fwd(t, modules, line, training=True, grad=True, inference=False, grad_modules=None, calls=1,
        recalibrating=False, nested=False):
    if grad_modules is None:
        grad_modules = modules if grad and not inference else []
    return t.event("mode_forward", line, training=training, grad=grad, inference=inference,
                   modules=list(modules), grad_modules=list(grad_modules), calls=calls,
                   recalibrating=recalibrating, nested=nested)


def update(t, pids=(0,), line=None):
    t.backward(fresh=list(pids), line=line)
    t.step(0, line=None if line is None else line + 1)


def end(t, status="completed"):
    t.trace.add("run_end", None, status=status, steps=0)


def check(rule, t):
    return list(rule().check(Analysis(t.trace)))


def lines(findings):
    return sorted(f.location.line for f in findings)


def new():
    t = TraceBuilder()
    t.optimizer(0, [0])
    return t
