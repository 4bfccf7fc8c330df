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
import sys
import types

import torch

from .patcher import alias_for_jit as _alias_for_jit, on_covered, per_check, stand_in

_SOURCE = """
def make(before, original, is_compiling, transform):
    def wrapper(*args, **kwargs):
        if not is_compiling() and transform() is None:
            before(args, kwargs)
        return original(*args, **kwargs)
    return wrapper
"""
_CODE = compile(_SOURCE, "<graddoctor: watched call>", "exec")


@functools.lru_cache(maxsize=None)
def _many_code(count: int):
    """The wrapper of a function several watchers watch (the regression losses have four): one
    frame that calls each ``before`` in turn, outermost (last installed) first, as the stacked
    wrappers did; the calls written out, not looped over (fewer bytecodes per call)."""
    names = [f"before{i}" for i in range(count)]
    calls = "".join(f"            {name}(args, kwargs)\n" for name in names)
    source = (f"def make(befores, original, is_compiling, transform):\n"
              f"    {', '.join(names)}, = befores\n"
              f"    def wrapper(*args, **kwargs):\n"
              f"        if not is_compiling() and transform() is None:\n"
              f"{calls}"
              f"        return original(*args, **kwargs)\n"
              f"    return wrapper\n")
    return compile(source, "<graddoctor: watched call>", "exec")


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


# the ``make`` of each wrapper code run in one copy of a namespace per check: torch's for the
# wrappers of builtins (no module of their own), keyed by the code; an imported module's for the
# wrappers of its functions, keyed by the code and the namespace; emptied as each check starts,
# so that the wrappers it makes get a copy of their function's namespace as it is now, and as
# it ends
_makers: dict = per_check({})


def _maker(code, function):
    """The ``make`` of ``code`` (a wrapper factory above) run in a copy of the names
    ``function``'s module holds, as torch.jit.script resolves the names of its source there
    (a copy: the module's stays as it is). A builtin has no module of its own: its wrappers get
    torch's namespace, copied once per check and per code (about 1,500 names: a copy for each of
    the hundred wrapped builtins was most of the time a check took to install its watchers);
    the wrapper's own code reads none of them. The functions of one of torch's modules share
    one copy of its names per check and per code the same way (~650 wrapped functions have a
    module: ~100 copies instead, ``torch.nn.functional`` and the ~40 of
    ``torch.distributions``); any other function (the script's, whose namespace grows as it
    runs, a library's) gets a copy of its own."""
    names = getattr(function, "__globals__", None)
    if names:
        module_name = getattr(function, "__module__", None) or ""
        module = sys.modules.get(module_name) if module_name.partition(".")[0] == "torch" else None
        if getattr(module, "__dict__", None) is not names:  # not one of torch's modules
            scope = dict(names)
            exec(code, scope)
            return scope.pop("make")
        key = (code, id(names))
        make = _makers.get(key)
        if make is None:
            scope = dict(names)
            exec(code, scope)
            make = _makers[key] = scope.pop("make")
        return make
    make = _makers.get(code)
    if make is None:
        scope = dict(vars(torch))
        exec(code, scope)
        make = _makers[code] = scope.pop("make")
    return make


def _own_code(wrapper):
    """``wrapper`` with a code object of its own. Under torch.compile, a wrapper called from
    eager code inside a compiled function (after a graph break: the script's ``backward()``,
    and graddoctor's watchers under it) is compiled by Dynamo as a frame of its own, which caches
    the result on the code object and puts the functions it resumes in into the frame's globals.
    Wrappers that shared one code object but had their own globals (each check makes new ones)
    then ran another's cached code and failed on its missing ``__resume_at_...`` name."""
    wrapper.__code__ = wrapper.__code__.replace()
    return wrapper


# What a wrapper ``watched`` made runs: ``(its code, its befores outermost first, the function
# they run ahead of)``, kept on the wrapper itself under this name, not in a table keyed by the
# wrapper: a table's entry holds the befores, whose watchers hold the patcher, which holds the
# wrapper, so that a weak-keyed table never let one go and every finished check stayed alive
# (its recorder, watchers, wrappers, the script's model). On the wrapper, the cycle is the
# collector's. The code (each wrapper has its own, ``_own_code``) tells the wrapper the entry
# was made for from another function ``functools.wraps`` copied the entry onto.
_ENTRY = "__graddoctor_watching__"


def _watching(function):
    """``(befores, function)`` of a wrapper made by ``watched``, else None."""
    if type(function) is not types.FunctionType:
        return None
    entry = function.__dict__.get(_ENTRY)
    if entry is None or entry[0] is not function.__code__:
        return None
    return entry[1], entry[2]


def _mark(wrapper, befores, function):
    setattr(wrapper, _ENTRY, (wrapper.__code__, befores, function))


def watched(original, before):
    """``original`` with ``before(args, kwargs)`` called ahead of each eager call. ``before`` is
    graddoctor's own code and must not raise; its caller's caller (``sys._getframe(2)``) is the
    code that made the call. When ``original`` is itself a wrapper made here, the new one calls
    ``before`` and then that wrapper's befores ahead of the function it wraps: one Python
    frame per call however many watchers watch it (the one given stays as it was, for a
    patcher to put back)."""
    inner = _watching(original)
    if inner is None:
        wrapper = _maker(_CODE, original)(before, original, torch.compiler.is_compiling,
                                          in_transform)
        befores, function = (before,), original
    else:
        befores, function = (before, *inner[0]), inner[1]
        wrapper = _maker(_many_code(len(befores)), function)(
            befores, function, torch.compiler.is_compiling, in_transform)
    wrapper = functools.wraps(original)(_own_code(wrapper))
    _mark(wrapper, befores, function)
    return _alias_for_jit(wrapper, function)


def watched_result(original, after):
    """``original`` with ``after(result)`` called on each eager call's result (the same
    see-through wrapper as ``watched``). ``after`` is graddoctor's own code and must not raise."""
    wrapper = _maker(_RESULT_CODE, original)(after, original, torch.compiler.is_compiling,
                                             in_transform)
    return _alias_for_jit(functools.wraps(original)(_own_code(wrapper)), original)


_CALL_SOURCE = """
def make(after, original, is_compiling, transform):
    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        if not is_compiling() and transform() is None:
            after(args, kwargs, result)
        return result
    return wrapper
"""
_CALL_CODE = compile(_CALL_SOURCE, "<graddoctor: watched call>", "exec")


def watched_call(original, after):
    """``original`` with ``after(args, kwargs, result)`` called after each eager call (the same
    see-through wrapper as ``watched``): for a watcher that needs both what an op was given and
    what it made. ``after`` is graddoctor's own code and must not raise; its caller's caller
    (``sys._getframe(2)``) is the code that made the call."""
    wrapper = _maker(_CALL_CODE, original)(after, original, torch.compiler.is_compiling,
                                           in_transform)
    return _alias_for_jit(functools.wraps(original)(_own_code(wrapper)), original)


def unwatch(owner, name: str, before) -> bool:
    """Take ``before`` out of the ``watched`` wrapper installed as ``owner.<name>``, once its
    watcher's window is over: the wrapper is rebuilt with the other befores (or the function
    itself when none is left), so a call no longer runs the finished watcher's test. False when
    the attribute is no such wrapper or ``before`` is not in it. The patcher still puts back
    what was there before the first wrapper when the check ends."""
    current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    entry = _watching(current)
    if entry is None or before not in entry[0]:
        return False
    befores = tuple(b for b in entry[0] if b is not before)
    function = entry[1]
    if not befores:  # nobody's call left: the function itself (the wrapper's watcher, finding
        # it, leaves it: ``put_back``)
        setattr(owner, name, function)
        return True
    if len(befores) == 1:
        wrapper = _maker(_CODE, function)(befores[0], function, torch.compiler.is_compiling,
                                          in_transform)
    else:
        wrapper = _maker(_many_code(len(befores)), function)(
            befores, function, torch.compiler.is_compiling, in_transform)
    wrapper = functools.wraps(function)(_own_code(wrapper))
    _mark(wrapper, befores, function)
    setattr(owner, name, _alias_for_jit(wrapper, function))
    stand_in(wrapper, current)
    return True


def _reroute(owner, name: str, wrapper, original) -> bool:
    """``patcher.put_back``'s reroute: the ``watched`` wrapper installed as ``owner.<name>``
    calls ``wrapper`` (a retired watcher's) as its function: rebuilt with the same befores
    around ``original``, so that no call goes through the retired one."""
    current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    entry = _watching(current)
    if entry is None or entry[1] is not wrapper:
        return False
    befores = entry[0]
    if len(befores) == 1:
        rebuilt = _maker(_CODE, original)(befores[0], original, torch.compiler.is_compiling,
                                          in_transform)
    else:
        rebuilt = _maker(_many_code(len(befores)), original)(
            befores, original, torch.compiler.is_compiling, in_transform)
    rebuilt = functools.wraps(original)(_own_code(rebuilt))
    _mark(rebuilt, befores, original)
    setattr(owner, name, _alias_for_jit(rebuilt, original))
    stand_in(rebuilt, current)
    return True


on_covered(_reroute)
