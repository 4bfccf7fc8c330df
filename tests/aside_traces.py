"""Hand-written traces of aside events (a functional dropout call, a regression loss's shapes),
shared by the unit tests of functional-dropout-in-eval and loss-shape-broadcast. No torch."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.analysis import Analysis


def check(rule, t):
    return list(rule().check(Analysis(t.trace)))


def update(t, line=None):
    t.backward(fresh=[0], line=line)
    t.step(0, line=None if line is None else line + 1)


def dropout(t, line, p=0.3, name="model", cls="MLP", fn="dropout", grad=False, how="default"):
    return t.put(ev.dropout_default(fn=fn, p=p, cls=cls, name=name, grad=grad, how=how), line)


def loss(t, line, a=(8, 1), b=(8,), shape=(8, 8), grad=True, fn="mse_loss", reduction="mean"):
    return t.put(ev.loss_broadcast(fn=fn, input_shape=list(a), target_shape=list(b), shape=list(shape),
                                   reduction=reduction, grad=grad), line)
