"""Hyper-parameters written into an optimizer's ``defaults`` (optimizer-attribute-hyperparameter).

torch's optimizers copy ``defaults`` into each param group when the group is added and read
only ``param_groups[i][key]`` at each step; ``optimizer.defaults["lr"] = x`` after
construction changes nothing the step reads (only a group added later takes it). At each
optimizer's registration (``PARAMS_ADDED``) its ``defaults`` dict is replaced by a copy of a
dict subclass whose ``__setitem__`` and ``update`` note a write by the user's code of a key the
groups hold, as an ``optimizer_attr`` event (``name`` ``defaults["lr"]``), unless every group
already holds that value. Reads stay dict's own (torch reads ``defaults["differentiable"]`` at
every step). A copy or pickle of the dict is a plain dict, and the plain dicts are put back
when the instrumentation is removed, so nothing of graddoctor stays on the script's objects.
"""

from __future__ import annotations

import sys
import weakref

from .. import events as ev
from .recorder import Recorder
from .topics import PARAMS_ADDED

_ACTIVE: list = []  # the watcher while installed (a dict's write finds it here: no reference held)


class WatchedDefaults(dict):
    """An optimizer's ``defaults`` whose writes are noted; copied or pickled as a plain dict."""

    __slots__ = ("opt",)

    def __setitem__(self, key, value) -> None:
        dict.__setitem__(self, key, value)
        if _ACTIVE:
            _ACTIVE[0].written(self, [key], sys._getframe(1))

    def update(self, *args, **kwargs) -> None:
        dict.update(self, *args, **kwargs)
        if _ACTIVE:
            keys = list(dict(*args, **kwargs))
            _ACTIVE[0].written(self, keys, sys._getframe(1))

    def __reduce_ex__(self, protocol):
        return dict, (dict(self),)

    def __copy__(self):
        return dict(self)

    def __deepcopy__(self, memo):
        import copy
        return copy.deepcopy(dict(self), memo)


def _number(value) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, (int, float)) for v in value):
        return None  # betas: shown, not compared as one number
    try:
        return float(value)  # a 0-d tensor
    except Exception:
        return None


class DefaultsWatcher:
    # the handle only puts back the instrumented session's own optimizers' dicts: a plain
    # session has none of them (benchmarks/overhead.py leaves it in while it suspends patches)
    session_only = True

    def __init__(self, rec: Recorder):
        self.rec = rec
        self._watched: list[weakref.ref] = []
        self._seen: set[tuple] = set()
        rec.subscribe(PARAMS_ADDED, self.params_added)

    def install(self, patcher) -> None:
        _ACTIVE[:] = [self]
        patcher.handle(self)

    def remove(self) -> None:
        """Patcher's handle: the plain dicts put back."""
        if _ACTIVE and _ACTIVE[0] is self:
            _ACTIVE.clear()
        for ref in self._watched:
            optimizer = ref()
            if optimizer is None:
                continue
            defaults = optimizer.__dict__.get("defaults")
            if type(defaults) is WatchedDefaults:
                optimizer.__dict__["defaults"] = dict(defaults)
        self._watched.clear()

    def params_added(self, opt: int, pids) -> None:
        try:
            optimizer = self.rec.optimizer_id.object(opt)
            if optimizer is None:
                return
            attrs = getattr(optimizer, "__dict__", None)
            defaults = attrs.get("defaults") if isinstance(attrs, dict) else None
            if type(defaults) is not dict:  # watched already, or an optimizer's own kind of dict
                return
            watched = WatchedDefaults(defaults)
            watched.opt = opt
            attrs["defaults"] = watched  # not through __setattr__: no attribute of the user's
            self._watched.append(weakref.ref(optimizer))
        except Exception as exc:
            self.rec.internal_error("optimizer defaults", exc)

    def written(self, defaults: WatchedDefaults, keys: list, frame) -> None:
        rec = self.rec
        try:
            if not rec.finder.is_user_file(frame.f_code.co_filename):
                return  # torch or a library keeping its own defaults
            opt = getattr(defaults, "opt", None)
            optimizer = rec.optimizer_id.object(opt) if opt is not None else None
            if optimizer is None or optimizer.__dict__.get("defaults") is not defaults:
                return
            step_module = getattr(getattr(type(optimizer), "step", None), "__module__", None) or ""
            if not step_module.startswith("torch."):
                return  # an optimizer of the script's own may read its defaults
            groups = optimizer.param_groups
            for key in keys:
                if not isinstance(key, str) or not groups or any(key not in g for g in groups):
                    continue  # no hyper-parameter the groups step with
                value = defaults[key]
                number = _number(value)
                kept = [_number(g.get(key)) for g in groups]
                if all(g.get(key) == value for g in groups):
                    continue  # the groups step with that value anyway
                loc = rec.finder.location(frame)
                seen = (loc.path, loc.line, opt, key)
                if seen in self._seen:
                    continue
                self._seen.add(seen)
                rec.emit_aside(ev.optimizer_attr(opt=opt, cls=type(optimizer).__name__,
                                                 name=f'defaults["{key}"]', key=key, value=number,
                                                 kept=kept), loc)
        except Exception as exc:
            rec.internal_error("optimizer defaults", exc)
