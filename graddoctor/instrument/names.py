"""Names after the user's own variables, in one place: tracked parameters (``encoder.layers.0.linear1.weight``,
``name_parameters``) and the module a user's frame holds (``model``, ``self.backbone``, ``variable_name``)."""

from __future__ import annotations

import gc
import sys
from itertools import compress

import torch

from .. import events as ev
from .recorder import Recorder


def user_variables(rec: Recorder) -> dict[str, object]:
    """Variables of the user's frames on the current stack (locals first, then globals)."""
    found: dict[str, object] = {}
    for frame in rec.finder.user_frames(sys._getframe(1)):
        for scope in (frame.f_locals, frame.f_globals):
            for key, value in list(scope.items()):
                found.setdefault(key, value)
    return found


class LiveModules:
    """Every live ``nn.Module``, found by one scan of ``gc`` on first use and kept for one
    naming round: a scan walks the whole heap (slow in a large process), so the namers share
    it and skip it when the user's variables already answered."""

    def __init__(self, scan: bool = True) -> None:
        self._found: list | None = None if scan else []  # scan=False: the stack's variables only
        self.scanned = False

    def get(self) -> list:
        if self._found is None:
            self.scanned = True
            self._found = live_modules()
        return self._found


def live_modules() -> list:
    """Every live ``nn.Module`` (``issubclass(type(obj), nn.Module)``: no ``__class__``
    tricks), in ``gc``'s order. The heap is filtered in C, by the set of ``nn.Module``'s
    subclasses (every class whose MRO holds it is below one of its bases): a scan visits every
    object of the process, a million in a large one."""
    classes, todo = {torch.nn.Module}, [torch.nn.Module]
    while todo:
        for sub in type.__subclasses__(todo.pop()):
            if sub not in classes:
                classes.add(sub)
                todo.append(sub)
    objects = gc.get_objects()
    return list(compress(objects, map(classes.__contains__, map(type, objects))))


def name_parameters(rec: Recorder, variables: dict[str, object] | None = None,
                    use_gc: bool = True, live: LiveModules | None = None) -> None:
    """Name every tracked, still unnamed parameter: ``model.fc1.weight`` after the user's own
    variable when one holds its module, else (``use_gc``) after the largest live module holding
    it. Scans the stack and ``gc``: call rarely (an optimizer's first step, the end of the run);
    without ``use_gc`` only the stack (an optimizer's construction), and not after ``self``: a
    method that builds the optimizer is named better from the loop that steps it."""
    unnamed = {id(t): pid for pid in rec.tracked_pids()
               if pid not in rec.param_names and (t := rec.tensor(pid)) is not None}
    if not unnamed:
        return
    best: dict[int, tuple[int, str]] = {}  # pid -> (rank, name); the higher rank wins
    for var, value in (variables if variables is not None else user_variables(rec)).items():
        if not use_gc and var == "self":
            continue
        if issubclass(type(value), torch.nn.Module) and not var.startswith("_"):
            named = list(value.named_parameters())
            for name, p in named:
                pid = unnamed.get(id(p))
                if pid is not None and len(named) + 10**9 > best.get(pid, (-1, ""))[0]:
                    best[pid] = (len(named) + 10**9, f"{var}.{name}")
        elif isinstance(value, torch.Tensor) and id(value) in unnamed:  # also a plain leaf tensor
            best.setdefault(unnamed[id(value)], (10**9, var))
    if len(best) == len(unnamed) and all(rank >= 10**9 for rank, _ in best.values()):
        use_gc = False  # every one named after a variable: no live module names it better
    for obj in (live or LiveModules()).get() if use_gc else ():
        named = list(obj.named_parameters())
        for name, p in named:
            pid = unnamed.get(id(p))
            if pid is not None and len(named) > best.get(pid, (-1, ""))[0]:
                best[pid] = (len(named), name)
    rec.name_params({pid: name for pid, (_, name) in best.items()})


def emit_param_events(rec: Recorder, into=None) -> None:
    """One ``param`` event per tracked tensor with its final flags (end of run), into the
    recorder's trace or ``into`` (a snapshot of it; its events get their own shape lists)."""
    emit = rec.emit if into is None else into.put
    # as the steps read them (GradState notes each owned parameter's flag at every step),
    # before the refresh reads what the script set since (a layer unfrozen after the last step)
    stepped = rec.stepped_requires_grad()
    rec.refresh_params()
    for pid in rec.tracked_pids():
        shape = rec.shapes.get(pid)
        emit(ev.param(pid=pid, name=rec.param_names.get(pid),
                      shape=list(shape) if shape is not None else None,
                      is_parameter=rec.is_parameter.get(pid, False),
                      requires_grad=rec.requires_grad.get(pid),
                      stepped_requires_grad=stepped.get(pid)))


def variable_name(root, frame) -> str | None:
    """The name under which the user's frame holds ``root``: ``model`` or ``self.model``."""
    if frame is None:
        return None
    scopes = (frame.f_locals, frame.f_globals)
    for scope in scopes:
        for name, value in list(scope.items()):
            if value is root and not name.startswith("_"):
                return name
    for name, value in list(frame.f_locals.items()):  # one attribute deep: self.model
        attrs = getattr(value, "__dict__", None)
        if isinstance(attrs, dict) and not isinstance(value, type):
            for attr, inner in list(attrs.items()):
                if inner is root:
                    return f"{name}.{attr}"
        if isinstance(value, torch.nn.Module):
            for attr, inner in value._modules.items():
                if inner is root:
                    return f"{name}.{attr}"
    return None
