"""Human names for tracked parameters (``encoder.layers.0.linear1.weight``)."""

from __future__ import annotations

import gc

import torch

from .recorder import Recorder


def name_parameters(rec: Recorder) -> None:
    """Name every tracked, still unnamed parameter after the largest live module holding it
    (the root model, usually). One ``gc`` scan: call rarely (first step, end of run)."""
    unnamed = {id(t): pid for pid in rec.tracked_pids()
               if pid not in rec.param_names and (t := rec.tensor(pid)) is not None}
    if not unnamed:
        return
    best: dict[int, tuple[int, str]] = {}  # pid -> (size of the module, name in it)
    for obj in gc.get_objects():
        if not issubclass(type(obj), torch.nn.Module):  # type(): no __class__ tricks
            continue
        named = list(obj.named_parameters())
        size = len(named)
        for name, p in named:
            pid = unnamed.get(id(p))
            if pid is not None and size > best.get(pid, (-1, ""))[0]:
                best[pid] = (size, name)
    for pid, (_, name) in best.items():
        rec.param_names[pid] = name


def emit_param_events(rec: Recorder) -> None:
    """One ``param`` event per tracked tensor with its final flags (end of run)."""
    for pid in rec.tracked_pids():
        t = rec.tensor(pid)
        if t is not None:
            rec.requires_grad[pid] = t.requires_grad
        rec.emit(
            "param", None, pid=pid, name=rec.param_names.get(pid), shape=rec.shapes.get(pid),
            is_parameter=rec.is_parameter.get(pid, False),
            requires_grad=rec.requires_grad.get(pid),
        )
