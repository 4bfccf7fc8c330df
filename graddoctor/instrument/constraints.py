"""A constraint written into the parameters between the backward and the optimizer's step, which
the step then breaks (constraint-before-step).

Some scripts keep their weights inside a set by writing them in place: a pruning mask
multiplied in (``p.mul_(mask)``), WGAN's weight clipping (``p.data.clamp_(-c, c)``), a
non-negativity projection (``W.clamp_(min=0)``), max-norm or unit-norm rows (``torch.renorm``,
``w.div_(w.norm(dim=1, keepdim=True))``), a padding row kept at zero. Such a write only holds if
nothing changes the weights after it: written after ``loss.backward()`` but before
``optimizer.step()``, it is undone by the step at once (the gradient, momentum and weight decay
move the pruned weights off zero, push clipped weights past the clip), so the next forward runs
on weights outside the set at every iteration. Nothing fails; the constraint just never holds
when the model is used.

For each optimizer's first ``_WINDOW`` steps (script thread, CPU floating parameters, the first
whole rows of each up to ``_ELEMENTS`` values, ``_TENSORS`` parameters at most):

* at each backward (``DESCRIBE_LOSS``) the sampled values are kept: what the forward used (a
  parameter of at most ``_ELEMENTS`` values as one copy of it);
* at the step's start (``STEP_BEGINS``) they are compared with those values (one ``torch.equal``
  for such a parameter, the projections below read only where it differs). Entries the script
  changed in between are a constraint write when they read as one of three projections: a clamp
  (every changed entry now equals the sample's largest or smallest value and was beyond it), a
  mask (every changed entry is now exactly 0) or a row-norm bound (at least two rows changed,
  each a positive multiple of what it was, all to one norm that no row exceeds; a norm every
  row must have when some rows were scaled up to it). Any other
  write (SAM's restore, a hand update, a decay by hand) is no constraint and is left alone;
* right after the step (``STEPPED``) the constraint is read again: still held (a mask whose
  gradients were masked too, under plain SGD), it is dropped;
* at the next backward, what the forward used is read once more: still broken (nothing after
  the step re-applied it), the parameter counts one broken write.

Once a parameter has ``_TIMES`` such writes, a ``constraint_broken`` aside names the
optimizer's parameters so found (loc: the step; ``backward``: the backward before the write),
once per optimizer.

Cost: for the first ``_WINDOW`` steps of each optimizer, a copy of the sampled values at each
backward and an equality test per parameter at each step (the projections are read only for a
parameter the script changed, and after the step for one found constrained); nothing after them
(the topics are retired).
"""

from __future__ import annotations

from threading import get_ident

import torch

from .. import events as ev
from .recorder import Recorder
from .topics import DESCRIBE_LOSS, PARAMS_ADDED, STEP_BEGINS, STEPPED

_WINDOW = 8  # steps of each optimizer watched
_TIMES = 2  # writes undone by the step before a parameter is told
_ELEMENTS = 1 << 16  # values sampled per parameter (whole rows from the first)
_TENSORS = 64  # parameters sampled per optimizer
_MIN_WRITTEN = 2  # entries a constraint write changes, at least
_NORM_TOL = 1e-4  # relative spread of the rows' norms after a norm projection
_PARALLEL = 1 - 1e-6  # cosine of a row with its projection


def _rows(t: torch.Tensor) -> torch.Tensor | None:
    """The first whole rows of ``t`` (dim 0), at most ``_ELEMENTS`` values, as a 2-D float64 copy."""
    if t.dim() == 0:
        return t.detach().reshape(1, 1).to(torch.float64, copy=True)
    if t.dim() == 1:
        return t.detach()[:_ELEMENTS].reshape(1, -1).to(torch.float64, copy=True)
    width = t[0].numel()
    if width > _ELEMENTS:
        return None
    rows = max(1, min(t.shape[0], _ELEMENTS // max(width, 1)))
    return t.detach()[:rows].reshape(rows, width).to(torch.float64, copy=True)


def _keep(t: torch.Tensor) -> tuple | None:
    """What a backward keeps of ``t`` to compare at the step: ``(values, whole)``. A tensor
    whose sample is all of it (at most ``_ELEMENTS`` values) is kept as one copy in its own
    dtype (``whole``; ``_rows`` of it is ``_rows`` of ``t`` as it was, float64 holds every
    float exactly), so that an unchanged parameter costs one comparison at the step; a larger
    one as its sample (``_rows``), None when it has none. Called under no_grad."""
    if t.numel() <= _ELEMENTS:
        return t.clone(), True
    values = _rows(t)
    return (values, False) if values is not None else None


def _unchanged(kept: torch.Tensor, t: torch.Tensor) -> bool:
    """Whether ``t`` holds exactly the values ``kept`` (a whole copy of it) has: the same shape,
    dtype and device and equal elements (a NaN is never equal: such a tensor goes on to
    ``classify``, which turns it away)."""
    return kept.shape == t.shape and kept.dtype == t.dtype and kept.device == t.device \
        and torch.equal(kept, t)


def classify(old: torch.Tensor, new: torch.Tensor) -> tuple | None:
    """What a write that changed ``old`` into ``new`` (2-D samples) establishes, or None:
    ``("clamp", lower, upper, written)``, ``("zero", where, written)``, ``("norm", bound,
    exact, written)`` (exact: every row set to the norm, not only capped at it)."""
    if old.shape != new.shape or not bool(torch.isfinite(old).all()) or not bool(torch.isfinite(new).all()):
        return None
    changed = new != old
    written = int(changed.sum())
    if written < _MIN_WRITTEN:
        return None
    was, now = old[changed], new[changed]
    lo, hi = float(new.min()), float(new.max())
    to_hi = (now == hi) & (was > hi)
    to_lo = (now == lo) & (was < lo)
    if bool((to_hi | to_lo).all()) and bool(((new > lo) & (new < hi)).any()):
        return ("clamp", lo if bool(to_lo.any()) else None, hi if bool(to_hi.any()) else None, written)
    if bool((now == 0).all()):
        return ("zero", changed, written)
    rows = changed.any(dim=1)
    if int(rows.sum()) >= 2:
        a, b = old[rows], new[rows]
        norms = b.norm(dim=1)
        bound = float(norms.max())
        if bound > 0 and float(norms.min()) >= bound * (1 - _NORM_TOL):
            cos = (a * b).sum(1) / (a.norm(dim=1) * norms).clamp_min(1e-300)
            others = new[~rows].norm(dim=1)
            if bool((cos >= _PARALLEL).all()) and (others.numel() == 0
                                                   or float(others.max()) <= bound * (1 + _NORM_TOL)):
                # rows scaled up as well as down: every row is set to the norm (unit-norm
                # embeddings), not only capped at it (max-norm)
                exact = bool((a.norm(dim=1) < bound * (1 - _NORM_TOL)).any())
                return ("norm", bound, exact, written)
    return None


def broken(constraint: tuple, values: torch.Tensor) -> int:
    """How many sampled entries (rows, for a norm bound) of ``values`` break ``constraint``."""
    kind = constraint[0]
    if kind == "zero":
        where = constraint[1]
        if where.shape != values.shape:
            return 0
        return int((values[where] != 0).sum())
    if kind == "clamp":
        lower, upper = constraint[1], constraint[2]
        count = 0
        if upper is not None:
            count += int((values > upper + 1e-6 * max(1.0, abs(upper))).sum())
        if lower is not None:
            count += int((values < lower - 1e-6 * max(1.0, abs(lower))).sum())
        return count
    if kind == "norm":
        norms, bound = values.norm(dim=1), constraint[1]
        if constraint[2]:
            return int(((norms - bound).abs() > bound * 10 * _NORM_TOL).sum())
        return int((norms > bound * (1 + 10 * _NORM_TOL)).sum())
    return 0


class ConstraintWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._opts: dict[int, dict | None] = {}  # opt -> {"pids", "steps"}; None once done
        self._kept: dict[int, tuple] = {}  # pid -> ``_keep`` of it at the latest backward
        self._backward = None  # the latest backward's location
        # pid -> [opt, constraint, the step's location, the backward's, broken by the step]
        self._pending: dict[int, list] = {}
        self._counts: dict[int, int] = {}  # pid -> writes the step undid and nothing re-applied
        self._found: dict[int, dict] = {}  # pid -> what to tell of it
        self._told: set[int] = set()  # optimizers told
        rec.subscribe(DESCRIBE_LOSS, self.describe_loss)
        rec.subscribe(STEP_BEGINS, self.before_step)
        rec.subscribe(STEPPED, self.after_step)
        rec.subscribe(PARAMS_ADDED, self.params_added)

    def install(self, patcher) -> None:  # subscribed at construction
        pass

    # -- the window ---------------------------------------------------------------------------
    def params_added(self, opt: int, pids) -> None:
        if self._opts.get(opt, {}) is not None:
            self._resume()

    def _resume(self) -> None:
        self.rec.resume(DESCRIBE_LOSS, self.describe_loss)
        self.rec.resume(STEP_BEGINS, self.before_step)
        self.rec.resume(STEPPED, self.after_step)

    def _retire_when_done(self) -> None:
        if self._pending or not self._opts:
            return
        if all(state is None for state in self._opts.values()) \
                and all(self._opts.get(opt, {}) is None for opt in self.rec.opt_params):
            self._kept.clear()
            self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
            self.rec.retire(STEP_BEGINS, self.before_step)
            self.rec.retire(STEPPED, self.after_step)

    def _pids(self, opt: int) -> list[int]:
        tensor, pids = self.rec.tensor, []
        for pid in self.rec.opt_params.get(opt, ()):
            t = tensor(pid)
            if t is not None and t.device.type == "cpu" and t.is_floating_point() \
                    and t.layout == torch.strided and t.numel() > 0 and t.requires_grad:
                pids.append(pid)
                if len(pids) >= _TENSORS:
                    break
        return pids

    def _sample(self, pid: int) -> torch.Tensor | None:
        t = self.rec.tensor(pid)
        if t is None:
            return None
        with torch.no_grad():
            return _rows(t)

    # -- the hooks ----------------------------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        if get_ident() != self.rec.script_thread:
            return {}
        try:
            self._judge_pending()
            if not any(state is not None for state in self._opts.values()):
                return {}  # no optimizer in its window (an optimizer that never steps keeps us here)
            self._backward = self.rec.here()
            tensor, kept = self.rec.tensor, self._kept
            with torch.no_grad():
                for state in self._opts.values():
                    if state is None:
                        continue
                    for pid in state["pids"]:
                        t = tensor(pid)
                        values = _keep(t) if t is not None else None
                        if values is None:
                            kept.pop(pid, None)
                        else:
                            kept[pid] = values
        except Exception as exc:
            self._pending.clear()
            self.rec.internal_error("constraint writes", exc)
        finally:
            self._retire_when_done()
        return {}

    def before_step(self, opt: int, optimizer) -> None:
        if get_ident() != self.rec.script_thread:
            return
        state = self._opts.get(opt, {})
        if state is None:
            return
        try:
            if not state:
                pids = self._pids(opt)
                state = self._opts[opt] = {"pids": pids, "steps": 0}
                if not pids:
                    self._opts[opt] = None
                    return
            state["steps"] += 1
            if state["steps"] > _WINDOW:
                self._opts[opt] = None
                return
            loc = None
            for pid in state["pids"]:
                old = self._kept.pop(pid, None)
                if old is None:
                    continue
                t = self.rec.tensor(pid)
                if t is None:
                    continue
                old, whole = old
                if whole:
                    if _unchanged(old, t):
                        continue  # nothing written: no constraint (classify's answer too)
                    with torch.no_grad():
                        old = _rows(old)
                with torch.no_grad():
                    new = _rows(t)
                if new is None:
                    continue
                constraint = classify(old, new)
                if constraint is None:
                    continue
                if loc is None:
                    loc = self.rec.here()
                self._pending[pid] = [opt, constraint, loc, self._backward, False]
        except Exception as exc:
            self._opts[opt] = None
            self.rec.internal_error("constraint writes", exc)
        finally:
            self._retire_when_done()

    def after_step(self, opt: int, optimizer) -> None:
        if get_ident() != self.rec.script_thread:
            return
        try:
            for pid, row in list(self._pending.items()):
                if row[0] != opt:
                    continue
                values = self._sample(pid)
                if values is None or not broken(row[1], values):
                    del self._pending[pid]  # the step kept the constraint (or the parameter is gone)
                else:
                    row[4] = True
        except Exception as exc:
            self._pending.clear()
            self.rec.internal_error("constraint writes", exc)
        self._retire_when_done()

    def _judge_pending(self) -> None:
        """At a backward: the constraints the last steps broke, read on what this forward used."""
        told: dict[int, list[int]] = {}
        for pid, row in list(self._pending.items()):
            opt, constraint, step_loc, backward_loc, stepped = row
            if not stepped:
                continue  # its step has not run yet (a second backward before it)
            del self._pending[pid]
            values = self._sample(pid)
            if values is None:
                continue
            count = broken(constraint, values)
            if not count:
                continue  # re-applied after the step: the forward ran inside the constraint
            self._counts[pid] = self._counts.get(pid, 0) + 1
            self._found[pid] = {"opt": opt, "kind": constraint[0], "constraint": constraint,
                                "written": constraint[-1], "broken": count,
                                "step": step_loc, "backward": backward_loc}
            if self._counts[pid] >= _TIMES and opt not in self._told:
                told.setdefault(opt, []).append(pid)
        for opt, pids in told.items():
            self._tell(opt)

    def _tell(self, opt: int) -> None:
        self._told.add(opt)
        pids = sorted(pid for pid, n in self._counts.items()
                      if n >= _TIMES and self._found[pid]["opt"] == opt)
        first = self._found[pids[0]]
        kinds = sorted({self._found[pid]["kind"] for pid in pids})
        bounds = []
        for pid in pids:
            c = self._found[pid]["constraint"]
            if c[0] == "clamp":
                bounds.append([None if c[1] is None else round(c[1], 6),
                               None if c[2] is None else round(c[2], 6)])
            elif c[0] == "norm":
                bounds.append([None, round(c[1], 6)])
            else:
                bounds.append(None)
        backward = first["backward"]
        self.rec.emit_aside(ev.constraint_broken(
            opt=opt, params=pids[:64], kinds=kinds, bounds=bounds[:64],
            written=sum(self._found[pid]["written"] for pid in pids),
            broken=sum(self._found[pid]["broken"] for pid in pids),
            times=min(self._counts[pid] for pid in pids),
            backward=[backward.path, backward.line] if backward is not None else None),
            first["step"])
