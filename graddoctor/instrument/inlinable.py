"""Wrappers of functions that run inside compiled or scripted code (module forwards, F.dropout,
the regression losses): made so that torch.compile and torch.jit.script see through them.

* torch.compile (Dynamo) refuses to inline code from graddoctor's folder (it is on Dynamo's skip
  list, see compile.py), so inside ``fullgraph=True`` a model whose forward reaches one of our
  wrappers failed ("Attempted to inline function marked as skipped"). The wrapper's code is
  therefore compiled from source under a file name of its own: Dynamo inlines it, sees
  ``is_compiling()`` and traces only the original.
* torch.jit.script compiles a wrapped function's source (``__wrapped__``) but resolves its names
  (``F``, ``Tensor``) in the wrapper's globals: the wrapper gets a copy of the original's.

Compiled or scripted code is not watched (the README says so for compiled graphs), nor code
run under a torch.func transform (``vmap``, ``grad``: per-sample gradients, DP-SGD): its tensors
are wrappers without storage that graddoctor's reads cannot look into, and its gradients never
reach a ``.grad`` graddoctor watches.
"""

from __future__ import annotations

import functools

import torch

_SOURCE = """
def make(before, original, is_compiling, transform):
    def wrapper(*args, **kwargs):
        if not is_compiling() and transform() is None:
            before(args, kwargs)
        return original(*args, **kwargs)
    return wrapper
"""
_CODE = compile(_SOURCE, "<graddoctor: watched call>", "exec")
_RESULT_SOURCE = """
def make(after, original, is_compiling, transform):
    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        if not is_compiling() and transform() is None:
            after(result)
        return result
    return wrapper
"""

# the innermost torch.func transform running (vmap, grad, jvp), None outside any
in_transform = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None) \
    or (lambda: None)
_RESULT_CODE = compile(_RESULT_SOURCE, "<graddoctor: watched result>", "exec")


def watched(original, before):
    """``original`` with ``before(args, kwargs)`` called ahead of each eager call. ``before`` is
    graddoctor's own code and must not raise; its caller's caller (``sys._getframe(2)``) is the
    code that made the call."""
    scope = dict(getattr(original, "__globals__", None) or vars(torch))  # a copy: torch's stays as it is
    exec(_CODE, scope)
    wrapper = scope.pop("make")(before, original, torch.compiler.is_compiling, in_transform)
    return functools.wraps(original)(wrapper)


def watched_result(original, after):
    """``original`` with ``after(result)`` called on each eager call's result (the same
    see-through wrapper as ``watched``). ``after`` is graddoctor's own code and must not raise."""
    scope = dict(getattr(original, "__globals__", None) or vars(torch))
    exec(_RESULT_CODE, scope)
    wrapper = scope.pop("make")(after, original, torch.compiler.is_compiling, in_transform)
    return functools.wraps(original)(wrapper)
