"""What the watchers that follow values through a window of torch calls share: reparam.py
(samples and noise followed to the loss) and freshsample.py (samples read, or only scored).

* the ``torch.distributions`` classes that define a method of their own (what they wrap);
* the tensors among a call's arguments and in its result;
* ``FollowMode``, a ``TorchFunctionMode`` that hands every call made while a window is open to
  its watcher's ``follow(func, args, kwargs, out)``, outside the watcher's own wrapped calls
  (``watcher.inside``), an error becoming an internal-error line and the end of the window;
* pushing that mode, and popping it only when it is on top of this thread's stack (a mode the
  script pushed after it and still holds stays, passing every call through);
* ``UninstallHandle``: the patcher's handle that ends the window when the instrumentation is
  removed (no hook of its own: benchmarks/overhead.py's suspension passes over it);
* ``wrap_distribution_calls``: ``sample``/``log_prob`` of every distribution class (and
  ``torch.randn_like`` as "noise") wrapped so that the watcher hears of each outermost call's
  result, all of it ended before ``torch.compile`` and when the instrumentation is removed.

A watcher using them has ``rec``, ``closed``, ``following``, ``inside``, ``follow``,
``before_compile`` and ``uninstall``.
"""

from __future__ import annotations

import inspect
import threading

import torch
import torch.distributions as D
from torch.overrides import TorchFunctionMode

from .dependency import close_before_compile
from .inlinable import watched, watched_result


def distribution_classes(method: str, base: bool = False) -> list[type]:
    """The distribution classes whose own ``vars`` define ``method`` (``Distribution`` itself
    only with ``base``)."""
    return [value for value in vars(D).values()
            if inspect.isclass(value) and issubclass(value, D.Distribution)
            and method in vars(value) and (base or value is not D.Distribution)]


def tensors_in(args, kwargs):
    """The tensors among a call's arguments (one level into lists and tuples)."""
    for value in (*args, *(kwargs or {}).values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    yield item


def tensors_out(out):
    """The tensors of a call's result (one level into lists and tuples)."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (list, tuple)):
        for item in out:
            if isinstance(item, torch.Tensor):
                yield item


class FollowMode(TorchFunctionMode):
    """Hands each call to ``watcher.follow`` while ``watcher.following`` (calls named in
    ``skip`` left out: reads of metadata)."""

    def __init__(self, watcher, label: str, skip: frozenset = frozenset()):
        super().__init__()
        self.watcher, self.label, self.skip = watcher, label, skip

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        watcher = self.watcher
        if watcher.following and not watcher.inside \
                and (not self.skip or getattr(func, "__name__", None) not in self.skip):
            try:
                watcher.follow(func, args, kwargs, out)
            except Exception as exc:
                watcher.following = False
                watcher.rec.internal_error(self.label, exc)
        return out


def push_mode(mode: FollowMode, rec, label: str) -> int | None:
    """Enter ``mode``; the thread it was entered on, or None when it could not be."""
    try:
        mode.__enter__()
    except Exception as exc:
        rec.internal_error(label, exc)
        return None
    return threading.get_ident()


def pop_mode(mode: FollowMode | None, thread: int | None, rec, label: str) -> bool:
    """Exit ``mode`` when it is on top of this thread's stack; True when it was exited."""
    if mode is None or threading.get_ident() != thread:
        return False
    try:
        depth = torch._C._len_torch_function_stack()
        if depth and torch._C._get_function_stack_at(depth - 1) is mode:
            mode.__exit__(None, None, None)
            return True
    except Exception as exc:
        rec.internal_error(label, exc)
    return False


def remove_mode(mode: FollowMode | None, thread: int | None, rec, label: str) -> bool:
    """Take ``mode`` off this thread's stack wherever it is: exited when on top, else the modes
    above it are lifted off, it is exited, and they are put back in their order (another mode
    of graddoctor's, or the script's, entered after it and still open). True when it is off."""
    if mode is None or threading.get_ident() != thread:
        return False
    try:
        depth = torch._C._len_torch_function_stack()
        stack = [torch._C._get_function_stack_at(i) for i in range(depth)]
        if not any(m is mode for m in stack):
            return True
        above = []
        while torch._C._len_torch_function_stack() and \
                torch._C._get_function_stack_at(torch._C._len_torch_function_stack() - 1) is not mode:
            above.append(torch._C._pop_torch_function_stack())
        mode.__exit__(None, None, None)
        for other in reversed(above):
            torch._C._push_on_torch_function_stack(other)
        return True
    except Exception as exc:
        rec.internal_error(label, exc)
    return False


class UninstallHandle:
    """The patcher's handle that ends a watcher's window when the instrumentation is removed."""

    follows_a_patch = True

    def __init__(self, watcher):
        self.watcher = watcher

    def remove(self) -> None:
        self.watcher.uninstall()


_WATCHERS = "graddoctor.instrument."


def script_mode_above(modes_below: int) -> bool:
    """Whether a mode that is no watcher's (the script's own) sits on this thread's stack above
    the ``modes_below`` entered before the run: a mode pushed now would be popped by its exit.
    Another watcher's mode is no reason to wait: each takes its own off wherever it is."""
    depth = torch._C._len_torch_function_stack()
    return any(not type(torch._C._get_function_stack_at(i)).__module__.startswith(_WATCHERS)
               for i in range(modes_below, depth))


def remove_leftover_modes() -> int:
    """Take every watcher's mode (a class of ``graddoctor.instrument``) off this thread's
    torch-function stack, every other mode left in its order (the script's own, and the run's
    emulated GPU, which the run pops itself): the last step of removing the instrumentation, so
    that a window one watcher could not close (another watcher's mode above it when it tried)
    never outlives the run. How many were taken off."""
    depth = torch._C._len_torch_function_stack()
    stack = [torch._C._get_function_stack_at(i) for i in range(depth)]
    ours = [m for m in stack if type(m).__module__.startswith(_WATCHERS)]
    if not ours:
        return 0
    kept = []
    while torch._C._len_torch_function_stack():
        mode = torch._C._pop_torch_function_stack()
        if not type(mode).__module__.startswith(_WATCHERS):
            kept.append(mode)
    for mode in reversed(kept):
        torch._C._push_on_torch_function_stack(mode)
    return len(ours)


def wrap_distribution_calls(patcher, watcher, label: str, handlers: dict,
                            base_sample: bool = False) -> list:
    """Wrap ``sample`` (of ``Distribution`` itself too with ``base_sample``) and ``log_prob`` of
    the distribution classes, and ``torch.randn_like`` when ``handlers`` has "noise", so that
    ``handlers[method](subject, result)`` hears of each outermost call once it returned (the
    subject: the distribution for "sample", the tensor shaped like for "noise", the value scored
    for "log_prob"); ``watcher.inside`` counts the wrapped calls running (the mode passes over
    what they do). Returns the list of the calls running, innermost last (the watcher clears
    it when a window closes: a call that raised left its entry)."""
    calls: list = []

    # plain functions: Dynamo wraps no bound method in a closure; torch.compile inlines the
    # wrappers and traces only the original (inlinable.py)
    def enter_sample(args, kwargs) -> None:
        watcher.inside += 1
        calls.append(("sample", args[0] if args else None))

    def enter_noise(args, kwargs) -> None:
        watcher.inside += 1
        calls.append(("noise", args[0] if args else kwargs.get("input")))

    def enter_log_prob(args, kwargs) -> None:
        watcher.inside += 1
        calls.append(("log_prob", args[1] if len(args) > 1 else kwargs.get("value")))

    def after(result) -> None:
        if not calls:
            return
        method, subject = calls.pop()
        watcher.inside = max(0, watcher.inside - 1)
        if calls and method == "sample" and calls[-1][0] == "sample":
            return  # a sample inside another distribution's sample: only the outermost counts
        if watcher.closed:
            return
        try:
            handlers[method](subject, result)
        except Exception as exc:
            watcher.rec.internal_error(label, exc)

    close_before_compile(patcher, watcher.before_compile)
    patcher.handle(UninstallHandle(watcher))
    for cls in distribution_classes("sample", base=base_sample):
        patcher.patch(cls, "sample", watched(watched_result(vars(cls)["sample"], after), enter_sample))
    if "noise" in handlers:
        patcher.patch(torch, "randn_like", watched(watched_result(torch.randn_like, after), enter_noise))
    for cls in distribution_classes("log_prob"):
        patcher.patch(cls, "log_prob",
                      watched(watched_result(vars(cls)["log_prob"], after), enter_log_prob))
    return calls
