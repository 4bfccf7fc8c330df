"""The global random number generators set to a seed: ``torch.manual_seed`` and its relatives.

A seed set once before the loop makes a run reproducible; the same seed set again inside the
loop makes every turn draw the same random numbers: the same dropout masks, the same
``randperm`` batches, the same shuffle order of every epoch. The seeding functions are wrapped
(the call itself runs unchanged) and each call from the user's code is recorded as a
``reseed`` aside event with the seed given, so the analysis can tell one seed from a seed set
again between updates (rules/reseed_in_loop.py).

Cost: a frame lookup per seeding call; scripts seed a handful of times.
"""

from __future__ import annotations

import functools
import random
import sys

import torch

from .. import events as ev
from .recorder import Recorder


def _seed_value(args, kwargs) -> int | None:
    seed = args[0] if args else kwargs.get("seed", kwargs.get("a"))
    if isinstance(seed, bool):
        return None
    if isinstance(seed, int):
        return seed
    try:  # a numpy integer
        import numbers
        if isinstance(seed, numbers.Integral):
            return int(seed)
    except Exception:
        pass
    return None


def entry_points() -> list[tuple[object, str, str]]:
    """(namespace, attribute, name shown) of every seeding function watched."""
    names = [(torch, "manual_seed", "torch.manual_seed"),
             (torch.random, "manual_seed", "torch.random.manual_seed"),
             (torch.cuda, "manual_seed", "torch.cuda.manual_seed"),
             (torch.cuda, "manual_seed_all", "torch.cuda.manual_seed_all"),
             (random, "seed", "random.seed")]
    numpy = sys.modules.get("numpy")
    if numpy is not None and callable(getattr(getattr(numpy, "random", None), "seed", None)):
        names.append((numpy.random, "seed", "numpy.random.seed"))
    return [(owner, attr, shown) for owner, attr, shown in names if callable(getattr(owner, attr, None))]


def _json(location) -> list | None:
    return [location.path, location.line, location.function] if location is not None else None


class RngSeedWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._busy = False  # torch.manual_seed calls torch.cuda.manual_seed_all: record the outer one

    def _wrap(self, original, fn: str):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def seed(*args, **kwargs):
            if watcher._busy:
                return original(*args, **kwargs)
            watcher._busy = True
            try:
                try:
                    caller = sys._getframe(1)  # the user's own call only (not a library's helper)
                    if rec.finder.is_user_file(caller.f_code.co_filename):
                        rec.emit_aside(ev.reseed(fn=fn, seed=_seed_value(args, kwargs),
                                                 caller=_json(rec.caller_of(3))),
                                       rec.finder.location(caller))
                except Exception as exc:
                    rec.internal_error(fn, exc)
                return original(*args, **kwargs)
            finally:
                watcher._busy = False

        return seed

    def install(self, patcher) -> None:
        for owner, attr, shown in entry_points():
            patcher.patch(owner, attr, self._wrap(getattr(owner, attr), shown))
