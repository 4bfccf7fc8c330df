"""Hooks registered again and again on one parameter or module without removing the earlier ones.

``p.register_hook(fn)``, ``module.register_forward_hook(fn)`` and their relatives add a hook each
call and keep every earlier one until its handle is removed. Called inside the training loop (or
in ``forward``, or in a step helper) on the same parameter or module, the hooks pile up: at the
k-th update the gradient (or output, or input) goes through k copies of the transform, so a
scaling hook scales by 0.5**k, a noise hook adds k draws, a temperature divides by T**k.

The registration methods are wrapped (the call itself runs unchanged). A registration from the
user's code on an object whose hook dictionary still holds a hook registered at the same line is
a repeat; its function is then wrapped in a pass-through that snapshots the value it is given,
runs the function unchanged, and compares: the first time such a repeated copy changes the value
(returns another, or edits it in place) although the copies before it already applied the
transform once (a hook that clamps or records changes nothing the second time), one
``hook_stacked`` aside is recorded at the registration line, with how many copies were live and
at how many distinct update counts they were registered. The first copy at a line is never
wrapped, and none once ``torch.compile`` has run (a compiled graph sees the user's function).

Cost: a frame lookup and a walk over the live handles of that line per registration from the
user's code; for the repeated copies, a copy of the value given and one ``torch.equal`` per
tensor, until the line's event is recorded or its copies changed nothing ``_CHECKS`` times.
"""

from __future__ import annotations

import functools
import sys

import torch
from torch import nn

from .. import events as ev
from .dependency import close_before_compile
from .recorder import Recorder

_KEPT = 64  # handles kept per registration line and hook dictionary (the live count saturates)
_CHECKS = 32  # a line's repeated copies compared this many times without a change: no more

# method -> the attribute holding the hooks it adds (a tensor's is None before its first hook)
_HOOK_DICTS = {"register_hook": "_backward_hooks", "register_forward_hook": "_forward_hooks",
               "register_forward_pre_hook": "_forward_pre_hooks",
               "register_full_backward_hook": "_backward_hooks",
               "register_full_backward_pre_hook": "_backward_pre_hooks",
               "register_post_accumulate_grad_hook": "_post_accumulate_grad_hooks"}
_TENSOR = ((torch.Tensor, "register_hook"), (torch.Tensor, "register_post_accumulate_grad_hook"))
_MODULE = ((nn.Module, "register_forward_hook"), (nn.Module, "register_forward_pre_hook"),
           (nn.Module, "register_full_backward_hook"), (nn.Module, "register_full_backward_pre_hook"))


def _given(api: str, args: tuple, with_kwargs: bool):
    """The value a hook of ``api`` receives and may replace by returning another."""
    if api == "register_hook":
        return args[0]
    if api == "register_post_accumulate_grad_hook":
        return args[0].grad
    if api == "register_forward_hook":
        return args[3] if with_kwargs else args[2]
    if api == "register_forward_pre_hook":
        return (args[1], args[2]) if with_kwargs else args[1]  # with kwargs it returns the pair
    return args[1]  # grad_input (full backward hook), grad_output (backward pre-hook)


def _same(new, old) -> bool:
    """Whether a hook's result equals the value it was given (tensors by value; a bare value
    returned for a one-element tuple, as a pre-hook may, is compared with that element)."""
    if new is old:
        return True
    if isinstance(old, (tuple, list)) and len(old) == 1 and not isinstance(new, (tuple, list)):
        return _same(new, old[0])
    if isinstance(new, torch.Tensor) or isinstance(old, torch.Tensor):
        if not (isinstance(new, torch.Tensor) and isinstance(old, torch.Tensor)):
            return False
        if new.shape != old.shape or new.dtype != old.dtype or new.device != old.device:
            return False
        with torch.no_grad():
            return bool(torch.equal(new, old))
    if isinstance(new, (tuple, list)) and isinstance(old, (tuple, list)):
        return len(new) == len(old) and all(_same(a, b) for a, b in zip(new, old))
    if isinstance(new, dict) and isinstance(old, dict):
        return new.keys() == old.keys() and all(_same(new[k], old[k]) for k in new)
    try:
        return bool(new == old)
    except Exception:  # a value without a truthful ==: count it as changed
        return False


def _copy(value):
    """A snapshot of the tensors in ``value`` (nested tuples, lists, dicts), to tell afterwards
    whether a hook changed them in place."""
    if isinstance(value, torch.Tensor):
        with torch.no_grad():
            return value.detach().clone()
    if isinstance(value, tuple):
        return tuple(_copy(v) for v in value)
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def _live(handle) -> bool:
    hooks = handle.hooks_dict_ref()
    return hooks is not None and handle.id in hooks


class HookStackWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._sites: dict[tuple, list] = {}  # (path, line, id(hook dict)) -> [(handle, updates)]
        self._told: set[tuple] = set()  # (path, line): recorded
        self._checked: dict[tuple, int] = {}  # (path, line) -> repeated copies seen changing nothing
        self._compiled = False  # torch.compile ran: no more wrapping (a fullgraph trace cannot
        # call into graddoctor's code)

    @property
    def updates(self) -> int:
        """Optimizer steps so far: registrations are told apart by the steps before them (read
        from the recorder's count, so that no step pays for this watcher)."""
        return self.rec.progress.steps

    def _target(self, obj) -> dict:
        if isinstance(obj, torch.Tensor):
            pid = self.rec.tensors.get(obj)
            return {"target": "tensor", "pid": pid, "shape": list(obj.shape), "cls": None}
        pid = None
        for param in obj.parameters():
            pid = self.rec.tensors.get(param)
            if pid is not None:
                break
        return {"target": "module", "pid": pid, "shape": None, "cls": type(obj).__name__}

    def _observe(self, fn, api: str, key: tuple, facts: dict, with_kwargs: bool):
        watcher = self

        @functools.wraps(fn)
        def hook(*args, **kwargs):
            if key in watcher._told or watcher._checked.get(key, 0) >= _CHECKS:
                return fn(*args, **kwargs)
            try:
                given = _given(api, args, with_kwargs)
                before = _copy(given)
            except Exception as exc:
                watcher._told.add(key)
                watcher.rec.internal_error("hook-stack snapshot", exc)
                return fn(*args, **kwargs)
            result = fn(*args, **kwargs)
            try:
                # a returned value replaces the given one; None leaves it, edited in place or not
                after = given if result is None else result
                if api == "register_post_accumulate_grad_hook":
                    after = args[0].grad
                if _same(after, before):
                    watcher._checked[key] = watcher._checked.get(key, 0) + 1
                else:
                    watcher._told.add(key)
                    shown = {k: v for k, v in facts.items() if k != "_loc"}
                    watcher.rec.emit_aside(ev.hook_stacked(api=api, **shown), facts["_loc"])
            except Exception as exc:
                watcher._told.add(key)
                watcher.rec.internal_error("hook-stack comparison", exc)
            return result

        return hook

    def _wrap(self, original, api: str):
        watcher, rec = self, self.rec
        attribute = _HOOK_DICTS[api]

        @functools.wraps(original)
        def register(obj, hook, *args, **kwargs):
            wrapped = hook
            key = None
            try:
                caller = sys._getframe(1)
                if rec.finder.is_user_file(caller.f_code.co_filename):
                    site = rec.finder.location(caller)
                    key = (site.path, site.line)
                    hooks = getattr(obj, attribute, None)
                    earlier = [] if hooks is None or key in watcher._told else [
                        (h, n) for h, n in watcher._sites.get(key + (id(hooks),), ()) if _live(h)]
                    if earlier and not watcher._compiled:
                        updates = {n for _, n in earlier} | {watcher.updates}
                        facts = {"copies": len(earlier) + 1, "updates": len(updates),
                                 "caller": _json(rec.caller_of(3)), "_loc": site,
                                 **watcher._target(obj)}
                        wrapped = watcher._observe(hook, api, key, facts,
                                                   bool(kwargs.get("with_kwargs")))
            except Exception as exc:
                rec.internal_error(api, exc)
                key, wrapped = None, hook
            handle = original(obj, wrapped, *args, **kwargs)
            if key is not None:
                try:
                    watcher._remember(key, handle)
                except Exception as exc:
                    rec.internal_error(api, exc)
            return handle

        return register

    def _remember(self, key: tuple, handle) -> None:
        hooks = handle.hooks_dict_ref()
        if hooks is None:
            return
        kept = self._sites.setdefault(key + (id(hooks),), [])
        kept[:] = [(h, n) for h, n in kept if _live(h)][-_KEPT:]
        kept.append((handle, self.updates))

    def _before_compile(self) -> None:
        self._compiled = True

    def install(self, patcher) -> None:
        close_before_compile(patcher, self._before_compile)
        for owner, name in _TENSOR + _MODULE:
            patcher.patch(owner, name, self._wrap(getattr(owner, name), name))


def _json(location) -> list | None:
    return [location.path, location.line, location.function] if location is not None else None
