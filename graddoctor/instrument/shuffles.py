"""Inputs and labels shuffled by two different draws: ``x = x[np.random.permutation(n)]`` and
``y = y[np.random.permutation(n)]``, or ``random.shuffle(xs); random.shuffle(ys)``. Each array
is in a random order of its own, so every input row meets another row's label; nothing fails.

What is seen: the random orders the script draws (``torch.randperm``, ``numpy.random.permutation``,
``numpy.random.shuffle``, ``random.shuffle``) from its own code, from the start until the
``_WINDOWS``-th backward (then put back). Two draws of one length (8 or more) from two different
lines with no backward between them, that differ (two permutations with other values; two
shuffles of two different sequences whose generator state differs after each: reseeding before
each shuffle, which orders both alike, stays silent), make a ``shuffled_apart`` aside at the
second one. The rule (rules/rows_shuffled_apart.py) reads the source for what each order was
applied to: two different arrays, neither order applied to both.

Cost: a wrapper call per draw until the first backwards; a draw keeps its length, line and (for
a permutation) a reference to its result until the next backward.
"""

from __future__ import annotations

import random
import sys

import torch

from .. import events as ev
from .dependency import close_before_compile
from .inlinable import watched_call
from .recorder import Recorder
from .topics import DESCRIBE_LOSS
from .patcher import put_back

_WINDOWS = 3  # backwards the wrappers stay for
_SMALLEST = 8  # shorter orders are not judged (a handful of items)
_DRAWS = 16  # draws kept between two backwards
_NAMED = 32  # variables of the drawing frame described at most
_LABEL = "shuffled apart"


def _numpy_random():
    try:
        import numpy.random
    except ImportError:  # numpy is a dependency, but a broken install must not stop a check
        return None
    return numpy.random


class ShuffleWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._open = True
        self._windows = 0
        self._draws: list = []  # (kind, length, (file, line), fingerprint, sequence id) since the last backward
        self._told: set = set()
        self._restore: list = []

    def install(self, patcher) -> None:
        targets = [(torch, "randperm", "permutation"), (random, "shuffle", "shuffle")]
        np_random = _numpy_random()
        if np_random is not None:
            targets += [(np_random, "permutation", "permutation"), (np_random, "shuffle", "shuffle")]
        for owner, name, kind in targets:
            original = getattr(owner, name, None)
            if original is None:
                continue
            wrapper = watched_call(original, self._after(kind, owner))
            patcher.patch(owner, name, wrapper)
            self._restore.append((owner, name, original, wrapper))
        close_before_compile(patcher, self._close)

    def _after(self, kind: str, owner):
        def after(args, kwargs, result) -> None:
            if self._open and args:
                caller = sys._getframe(2)
                while caller is not None and caller.f_code.co_filename.startswith("<graddoctor"):
                    caller = caller.f_back  # another watcher's wrapper of the same function
                if caller is not None:
                    self._seen(kind, owner, args[0], result, caller)
        return after

    def _seen(self, kind, owner, given, result, caller) -> None:
        try:
            if not self.rec.finder.is_user_file(caller.f_code.co_filename):
                return
            if kind == "permutation":
                if not hasattr(result, "__len__") or isinstance(given, (list, tuple)):
                    return
                length = len(result)
                fingerprint, sequence = result, None
            else:
                length = len(given)
                fingerprint = _state(owner)
                sequence = id(given)
            if length < _SMALLEST:
                return
            line = (self.rec.finder.display_path(caller.f_code.co_filename), caller.f_lineno)
            for other in self._draws:
                if other[0] != kind or other[1] != length or other[2] == line:
                    continue
                if kind == "shuffle" and (other[4] == sequence or other[3] == fingerprint):
                    continue  # one sequence shuffled twice, or both in the same order (reseeded)
                if kind == "permutation" and _equal(other[3], fingerprint):
                    continue
                key = (other[2], line)
                if key in self._told:
                    continue
                self._told.add(key)
                self.rec.emit_aside(ev.shuffled_apart(kind=kind, length=length, first=list(other[2]),
                                                      arrays=_arrays(caller, length)), self.rec.here())
                return
            if len(self._draws) < _DRAWS:
                self._draws.append((kind, length, line, fingerprint, sequence))
        except Exception as exc:
            self._close()
            self.rec.internal_error(_LABEL, exc)

    def describe_loss(self, tensors) -> dict:
        if self._open:
            self._draws = []
            self._windows += 1
            if self._windows >= _WINDOWS:
                self._close()
        return {}

    def _close(self) -> None:
        if not self._open:
            return
        self._open = False
        self._draws = []
        self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
        for owner, name, original, wrapper in self._restore:
            try:
                put_back(owner, name, original, wrapper)  # not from under another's wrapper
            except Exception as exc:
                self.rec.internal_error(_LABEL, exc)


def _arrays(frame, length: int) -> dict:
    """The caller's variables that hold ``length`` rows (arrays, tensors, lists), each as
    ``"labels"`` (one value a row, or whole numbers) or ``"rows"`` (a vector or more a row):
    what the rule needs to tell inputs shuffled apart from their labels (two datasets of
    inputs shuffled each on its own are unpaired on purpose)."""
    out: dict = {}
    scopes = [frame.f_locals] + ([frame.f_globals] if frame.f_globals is not frame.f_locals else [])
    for name, value in [item for scope in scopes for item in list(scope.items())]:
        if len(out) >= _NAMED:
            break
        if name in out:
            continue
        try:
            shape = getattr(value, "shape", None)
            if shape is not None and len(shape) >= 1 and int(shape[0]) == length:
                dtype = str(getattr(value, "dtype", ""))
                whole = "int" in dtype or "long" in dtype or "bool" in dtype
                one = len(shape) == 1 or (len(shape) == 2 and int(shape[1]) == 1)
                out[name] = "labels" if one or whole else "rows"
            elif isinstance(value, list) and len(value) == length:
                first = value[0]
                out[name] = "labels" if isinstance(first, (int, float)) else "rows"
        except Exception:
            continue
    return out


def _state(owner):
    """A fingerprint of the generator's state after a shuffle: equal after two shuffles of one
    length from one seed."""
    try:
        if owner is random:
            return hash(random.getstate())
        state = owner.get_state()
        return (int(state[2]), hash(state[1].tobytes()))
    except Exception:
        return None


def _equal(a, b) -> bool:
    try:
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return bool(torch.equal(a, b))
        import numpy
        return bool(numpy.array_equal(numpy.asarray(a), numpy.asarray(b)))
    except Exception:
        return True  # not told apart: no finding
