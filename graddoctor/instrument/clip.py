"""Gradient clipping: ``clip_grad_norm_``, ``clip_grad_value_`` (and ``clip_grads_with_norm_``).

The public names in ``torch.nn.utils`` and ``torch.nn.utils.clip_grad`` are patched before the
user's script is imported, so ``from torch.nn.utils import clip_grad_norm_`` binds the wrapper.
A name bound earlier (a library imported before graddoctor started) still reaches
``clip_grad._clip_grads_with_norm_``, which ``clip_grad_norm_`` looks up at call time: that one is
patched too and records the clip when no outer wrapper did.

Each call emits one ``clip`` event with the tracked parameters it was given and then refreshes
what graddoctor knows of their ``.grad`` (clipping changes it in place; the next backward must
still see an accumulation, not a manual clear). The event also says whether the iterable given
was a generator that had already been iterated (``spent``): ``params = model.parameters()``
handed to the optimizer and then to the clip reaches the clip used up, and it clips nothing.
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
import types
from threading import get_ident
from itertools import compress, repeat
from operator import and_, attrgetter, is_, is_not, ne

import torch
import torch.nn.utils
import torch.nn.utils.clip_grad as clip_grad

from .. import events as ev
from ..location import same_chain
from . import fold
from .gradstate import Tensor, grads_of, states_of
from .identities import call
from .gradstate import version as grad_version
from .recorder import SAME_LIST_MIN, Recorder
from .subclasses import Depth

_version = attrgetter("_version")


def _number(value):
    """A float for the trace (non-finite ones too: the trace's JSON lines write them as the
    strings "inf"/"nan" and read them back as floats)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _spent(iterator) -> bool | None:
    """Whether a one-shot iterator had already been iterated before the clip got it: a generator
    past its start (``model.parameters()`` an optimizer already read), or a ``filter`` / ``map``
    over one. None for iterators graddoctor cannot look into (``itertools.chain``, custom ones).
    A few attribute reads per clip call."""
    for _ in range(4):
        if isinstance(iterator, types.GeneratorType):
            return inspect.getgeneratorstate(iterator) != inspect.GEN_CREATED
        if type(iterator) not in (filter, map):
            return None
        args = iterator.__reduce__()[1]  # (function, iterable...) for both
        if len(args) != 2:
            return None
        iterator = args[1]
    return None


class Before:
    """The tracked grads a clip was given as they were before it: ``pids`` and their
    ``states`` (parallel lists); ``by_pid`` as a dict, built only when asked. On the fast path
    also the grad tensors themselves (held for the clip's call only), their ids, and whether
    all are plain tensors (not DTensors)."""

    __slots__ = ("pids", "states", "grads", "ids", "plain")

    def __init__(self, pids: list, states: list, grads: list | None = None,
                 ids: list | None = None, plain: bool = True):
        self.pids, self.states = pids, states
        self.grads, self.ids, self.plain = grads, ids, plain

    def by_pid(self) -> dict:
        return dict(zip(self.pids, self.states))


# clip_grad_value_ calls whose share of clipped elements is measured (the run's first ones):
# enough for three calls at each of two or three clip lines
VALUE_MEASURED = 8


def plain_limit(value) -> float | None:
    """A clip value given as a plain positive finite number (a tensor is not read)."""
    if type(value) not in (float, int) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def value_share(params: list, clip_value) -> tuple[float, float] | None:
    """What ``clip_grad_value_(params, clip_value)`` is about to do to the CPU gradients: the
    share of their elements beyond ``clip_value`` (those it sets to ±clip_value), and the norm
    it keeps (the clamped gradients' norm over the given one). None when something cannot be
    read without a device sync, or there is nothing to read."""
    value = plain_limit(clip_value)
    if value is None:
        return None
    over = total = 0
    before = after = 0.0
    with torch.no_grad():
        for p in params:
            g = p.grad if isinstance(p, torch.Tensor) else None
            if g is None:
                continue
            if type(g) is not Tensor or g.layout != torch.strided or g.device.type != "cpu" \
                    or not g.is_floating_point():
                return None
            if g.numel() == 0:
                continue
            magnitude = g.detach().abs()
            over += int((magnitude > value).sum())
            total += magnitude.numel()
            before += float(magnitude.double().square().sum())
            after += float(magnitude.clamp(max=value).double().square().sum())
    if total == 0 or not before > 0.0 or not math.isfinite(before):
        return None
    return round(over / total, 6), round(math.sqrt(after / before), 6)


# the types of a clip's other arguments (max_norm, norm_type, error_if_nonfinite, foreach) the
# skim compares by value: a tensor max_norm is never armed
_PLAIN_ARGUMENTS = (float, int, bool, type(None), str)


class ClipWatcher:
    def __init__(self, rec: Recorder, edit_factors=None):
        self.rec = rec
        # the optimizer watcher's gradient samples (instrument/editfactor.py): an edit through
        # ``.data`` before the clip (``p.grad.data.mul_(1 / n)``) moves no version counter, and
        # the clip's own in-place change would hide it from the step's pre hook
        self._edit_factors = edit_factors
        self._depth = Depth()
        self._value_left = VALUE_MEASURED  # clip_grad_value_ calls still to measure
        # (ids, pids, weak references) of the tensors the latest call was given, all tracked
        self._last_given: tuple | None = None
        # the skim (instrument/fold.py): what a call on a skimmed turn compares with, armed by
        # a full-path call whose event went onto the steady path (``_arm``); None: not armed
        self._armed: tuple | None = None

    def _untracked_before(self, before: "Before", edited: list) -> list:
        """``edited`` and the grads changed through ``.data`` since the latest sampled backward
        (only while the optimizer watcher samples, on the first backwards: no cost later)."""
        factors = self._edit_factors
        if factors is None or before.grads is None or not before.pids:
            return edited
        calls = self.rec.progress.backward_calls
        if not factors.sampled_at(calls):
            return edited
        found = factors.untracked(calls, before.pids, before.grads, set(edited))
        return edited + found if found else edited

    def _follow(self, before: "Before") -> None:
        """After the clip changed the sampled grads in place: later edits through ``.data`` are
        judged against the clipped values."""
        factors = self._edit_factors
        if factors is not None and before.grads is not None and before.pids \
                and factors.sampled_at(self.rec.progress.backward_calls):
            factors.follow(before.pids, before.grads)

    def _before(self, params: list) -> tuple[list, "Before", list]:
        """One pass before the clip: each param's pid (None if untracked), the state of each
        tracked grad, and which of those unwatched code changed since graddoctor last saw them."""
        rec = self.rec
        known, zeroed = rec.grads.known, rec.grads.zeroed
        # the pids of the parameters the latest call was given, when given the same tensors
        # again (a loop clips the same list each step): their ids, then each the live tensor of
        # its kept reference; else ``Identities.numbers`` (``map``s in C: no Python per
        # parameter), kept for the next call when every one is tracked
        ids = list(map(id, params))
        last = self._last_given
        if last is not None and last[0] == ids and all(map(is_, map(call, last[2]), params)):
            known_pids = last[1]  # the list the events of those calls hold (never changed)
        else:
            known_pids = rec.tensors.numbers(params)
            self._last_given = None if None in known_pids else (
                ids, known_pids, list(map(rec.tensors.refs.__getitem__, known_pids)))
        if None not in known_pids:  # every one a tracked tensor
            grads = grads_of(params)
            has = list(map(is_not, grads, repeat(None)))
            if all(has):
                pids = known_pids
            else:
                pids, grads = list(compress(known_pids, has)), list(compress(grads, has))
            plain = all(map(is_, map(type, grads), repeat(Tensor)))
            ids = list(map(id, grads))
            states = list(zip(ids, map(_version if plain else grad_version, grads)))
            seen = list(map(known.get, pids))
            edited = [] if seen == states else list(compress(
                pids, map(and_, map(ne, states, seen), map(ne, states, map(zeroed.get, pids)))))
            return known_pids, Before(pids, states, grads, ids, plain), edited
        pid_of, refs = rec.tensors.number, rec.tensors.refs
        known_pids, pids, states, edited = [], [], [], []
        for p in params:
            pid = pid_of.get(id(p))
            if pid is None or refs[pid]() is not p:  # untracked, or not a tensor (rec.pid, inlined)
                known_pids.append(None)
                continue
            known_pids.append(pid)
            grad = p.grad
            if grad is not None:
                state = (id(grad), grad._version if type(grad) is Tensor else grad_version(grad))
                pids.append(pid)
                states.append(state)
                if state != known.get(pid) and state != zeroed.get(pid):
                    edited.append(pid)
        return known_pids, Before(pids, states), edited

    def _record(self, via: str, params: list, known_pids: list, arguments: dict, result,
                before: "Before", edited: list, spent: bool | None,
                share: tuple[float, float] | None = None) -> None:
        rec = self.rec
        pids, with_grad, after, untracked = [], [], [], 0
        if None not in known_pids and before.grads is not None:
            # torch's clips change the grads in place, never set a ``.grad``: the same tensors
            # as before, at their new versions
            pids, with_grad = known_pids, list(before.pids)
            after = list(zip(before.ids, map(_version if before.plain else grad_version,
                                             before.grads)))
        elif None not in known_pids:  # every one tracked: ``map``s in C
            pids = known_pids
            grads = grads_of(params)
            has = list(map(is_not, grads, repeat(None)))
            if all(has):
                with_grad = list(pids)
            else:
                with_grad, grads = list(compress(pids, has)), list(compress(grads, has))
            after = list(states_of(grads))
        for p, pid in zip(params, known_pids) if not pids else ():
            if pid is None:
                if not isinstance(p, torch.Tensor):
                    continue
                if not (p.is_leaf and p.requires_grad):
                    untracked += 1
                    continue
                pid = rec.track(p)
            pids.append(pid)
            grad = p.grad
            if grad is not None:
                with_grad.append(pid)
                after.append((id(grad), grad._version if type(grad) is Tensor
                              else grad_version(grad)))
        rec.grads.note_known(with_grad, after)  # clipping changed the grads in place: still accumulated ones
        limit = _number(arguments.get("clip_value" if via == "clip_grad_value_" else "max_norm"))
        total_norm = result if via == "clip_grad_norm_" else arguments.get("total_norm")
        total = None
        if isinstance(total_norm, torch.Tensor) and total_norm.device.type == "cpu":
            total = _number(total_norm)  # only shown: never a device sync for it
        by_norm = via != "clip_grad_value_"
        if len(with_grad) >= SAME_LIST_MIN:  # (the backward's before it, most often)
            with_grad = rec.same_list(with_grad)
        event = rec.emit(ev.clip(via=via, params=pids, with_grad=with_grad, untracked=untracked,
                                 limit=limit,
                                 norm_type=_number(arguments.get("norm_type", 2.0)) if by_norm
                                 else None,
                                 norm_only=by_norm and limit == math.inf, total_norm=total,
                                 edited=edited, spent=spent, clipped=share[0] if share else None,
                                 kept=share[1] if share else None),
                         rec.here(2))
        self._note_finite(via, total, before, with_grad, after)
        return event

    def _note_finite(self, via: str, total, before: "Before", pids: list, after: list) -> None:
        """Keep ``Recorder.finite`` true to the clipped grads (it spares the step a norm pass).

        clip_grad_norm_ with a finite total saw every value finite. Otherwise clipping keeps
        finite grads finite only when the factor is finite: always for the elementwise clamp of
        clip_grad_value_; for clip_grad_norm_ only when every grad in the call was finite (one
        NaN makes the shared factor NaN)."""
        rec = self.rec
        if via == "clip_grad_norm_":
            if isinstance(total, float) and math.isfinite(total):
                rec.grads.vouch_finite(pids, after)
            elif all((v := rec.grads.finite.get(pid)) is not None and v[0] == state
                     for pid, state in zip(before.pids, before.states)):
                rec.grads.carry_finite(before.by_pid(), pids, after)
        elif via == "clip_grad_value_":
            rec.grads.carry_finite(before.by_pid(), pids, after)

    # -- the skim of a long steady state (instrument/fold.py, ``Folder.skimming``) -----------
    # On a skimmed turn the clip's reads before and after it are what the turn skips: the same
    # clip function, call site, arguments (the same tensors, in order; the same max_norm and
    # norm type) as on the armed turn, after a backward that was skimmed too (its grads caught
    # up unread, ``GradState.catch_up``: the clip's in-place changes with them), and the event
    # is the armed one with this call's total norm (read from a CPU tensor only, as the full
    # path does). A non-finite total ends the steady state: the clip's event is recorded the
    # usual way and the step reads its grads (the norm pass that finds the NaN).
    def _arm(self, event, via: str, params: list, known_pids: list, before: "Before",
             edited: list, spent, args: tuple, kwargs: dict, share, frame) -> None:
        rec = self.rec
        folder = rec.folder
        if (folder is None or event is None or share is not None or edited
                or via not in ("clip_grad_norm_", "clip_grad_value_")
                or None in known_pids or before.grads is None or not before.plain
                or get_ident() != rec.script_thread or event.data.get("untracked")):
            return
        place = folder.place_of(event)
        if place is None or not place[1]:
            return
        rest = (args[1:], {k: v for k, v in kwargs.items() if k != "parameters"})
        if not all(type(v) in _PLAIN_ARGUMENTS for v in (*rest[0], *rest[1].values())):
            return
        finder = rec.finder
        chain = finder.chain(frame)
        user = same_chain(frame, chain) if chain is not None else None
        if user is None or finder.instruction_location(user) is not event.loc:
            return
        self._armed = (*place, via, list(map(id, params)), spent, rest,
                       [type(v) for v in rest[0]], chain, event.loc, event.data,
                       len(rec.tensors.refs), event.data["with_grad"], [None])

    def _skims(self, armed: tuple, via: str, params: list, spent, args: tuple, kwargs: dict,
               frame) -> bool:
        """Whether this call is the armed one's on a skimmed turn (read only)."""
        steady, j, armed_via, ids, armed_spent, rest, types_, chain, loc, base, count, \
            with_grad, seen = armed
        rec = self.rec
        folder = rec.folder
        behind = rec.grads.behind_grads
        if (via != armed_via or folder is None or folder.steady is not steady
                or behind is None or rec.holder is not None or rec.shared
                or get_ident() != rec.script_thread or spent is not armed_spent
                or len(rec.tensors.refs) != count):
            return False
        if not ((steady.skim_answer and steady.skim_turn == steady.closed
                 and len(steady.open) == j) or folder.skimming(steady, j)):
            return False
        budget = rec.progress.step_budget  # (the step budget's last updates: read in full)
        if budget is not None and rec.progress.updates + 3 + fold.CONTEXT >= budget:
            return False
        codes, code, lasti = chain  # same_chain(frame, chain), inlined (a frame per turn)
        user = frame
        for expected in codes:
            if user is None or user.f_code is not expected:
                return False
            user = user.f_back
        if user is None or user.f_code is not code or user.f_lasti != lasti:
            return False
        others = args[1:]
        if (len(others) != len(types_) or list(map(type, others)) != types_ or others != rest[0]
                or len(kwargs) != len(rest[1]) + ("parameters" in kwargs)):
            return False
        for key, value in rest[1].items():
            if key not in kwargs or type(kwargs[key]) is not type(value) or kwargs[key] != value:
                return False
        # the grads this clip changes in place are among those the skimmed backward left
        # behind (caught up unread with them): tested once per steady state, the backward
        # hands the same list every turn
        if behind is not seen[0]:
            if not set(with_grad) <= set(behind):
                return False
            seen[0] = behind
        return list(map(id, params)) == ids

    def _skim_after(self, armed: tuple, result, via: str, params: list, spent, arguments) -> None:
        steady, j, _, _, _, _, _, _, loc, base, _, _, _ = armed
        rec = self.rec
        total = None
        if via == "clip_grad_norm_" and isinstance(result, torch.Tensor) \
                and result.device.type == "cpu":
            total = _number(result)
        folder = rec.folder
        if total is not None and not math.isfinite(total):
            # a NaN or an Inf: recorded in full, the steady state ended first (the step reads
            # its grads: the norm pass that reports it)
            self._armed = None
            rec.end_steady()
            self._record(via, params, list(base["params"]), arguments, result, Before([], []),
                         [], spent)
            return
        if total is not None:
            rec.grads.skimmed_clip(base["with_grad"])
        changes = None if total == base["total_norm"] else {"total_norm": total}
        with rec.lock:  # Folder.skim_take, its first branch inlined (a frame per turn)
            if folder is not None and folder.steady is steady and len(steady.open) == j:
                trace = folder.trace
                steady.open.append((trace.next_seq, "clip", loc, base, changes))
                trace.next_seq += 1
                return
            taken = folder is not None and folder.steady_take(steady, j, "clip", loc, base, changes)
        if not taken:
            self._armed = None
            rec.emit(ev.clip(**{**base, "params": list(base["params"]),
                                "with_grad": list(base["with_grad"]), "edited": [],
                                "total_norm": total}), loc)

    def _wrap(self, original, via: str):
        watcher, rec = self, self.rec
        names = list(inspect.signature(original).parameters)  # positional order, for _record

        @functools.wraps(original)
        def clip(*args, **kwargs):
            if watcher._depth.active or not (args or "parameters" in kwargs):
                return original(*args, **kwargs)  # nested, or a bad call torch reports itself
            given = args[0] if args else kwargs["parameters"]
            spent: bool | None = False
            if isinstance(given, torch.Tensor):
                params = [given]
            else:
                try:
                    iterator = iter(given)
                except TypeError:
                    return original(*args, **kwargs)  # not iterable: torch's own error
                if iterator is given:  # one-shot: was it used up before?
                    try:
                        spent = _spent(given)
                    except Exception as exc:
                        spent = None
                        rec.internal_error(f"{via} (iterable)", exc)
                params = list(iterator)  # a generator is read once, here; the list goes to torch
            if args:
                args = (params, *args[1:])
            else:
                kwargs["parameters"] = params
            armed, watcher._armed = watcher._armed, None
            if armed is not None:
                try:
                    skims = watcher._skims(armed, via, params, spent, args, kwargs,
                                           sys._getframe(1))
                except Exception as exc:
                    skims = False
                    rec.internal_error(f"{via} (skim)", exc)
                if skims:
                    watcher._armed = armed
                    with watcher._depth:
                        result = original(*args, **kwargs)
                    try:
                        arguments = dict(zip(names, args))
                        arguments.update(kwargs)
                        watcher._skim_after(armed, result, via, params, spent, arguments)
                    except Exception as exc:
                        watcher._armed = None
                        rec.internal_error(f"{via} (after)", exc)
                    return result
            known_pids: list = []
            before = Before([], [])
            edited: list = []
            try:
                known_pids, before, edited = watcher._before(params)
                edited = watcher._untracked_before(before, edited)
            except Exception as exc:
                rec.internal_error(f"{via} (before)", exc)
            share = None
            if via == "clip_grad_value_" and watcher._value_left > 0:
                watcher._value_left -= 1
                try:
                    share = value_share(params, args[1] if len(args) > 1
                                        else kwargs.get("clip_value"))
                except Exception as exc:
                    rec.internal_error(f"{via} (clipped share)", exc)
            with watcher._depth:
                result = original(*args, **kwargs)
            try:
                watcher._follow(before)
            except Exception as exc:
                rec.internal_error(f"{via} (edit samples)", exc)
            try:
                arguments = dict(zip(names, args))
                arguments.update(kwargs)
                event = watcher._record(via, params, known_pids or [None] * len(params),
                                        arguments, result, before, edited, spent, share)
                if known_pids and rec.folder is not None and rec.folder.steady is not None:
                    watcher._arm(event, via, params, known_pids, before, edited, spent, args,
                                 kwargs, share, sys._getframe(1))
            except Exception as exc:
                rec.internal_error(f"{via} (after)", exc)
            return result

        return clip

    def install(self, patcher) -> None:
        utils = torch.nn.utils
        norm = self._wrap(clip_grad.clip_grad_norm_, "clip_grad_norm_")
        value = self._wrap(clip_grad.clip_grad_value_, "clip_grad_value_")
        with_norm = self._wrap(clip_grad._clip_grads_with_norm_, "clip_grads_with_norm_")
        for owner in (utils, clip_grad):
            patcher.patch(owner, "clip_grad_norm_", norm)
            patcher.patch(owner, "clip_grad_value_", value)
        patcher.patch(clip_grad, "_clip_grads_with_norm_", with_norm)
        if hasattr(utils, "clip_grads_with_norm_"):
            patcher.patch(utils, "clip_grads_with_norm_", with_norm)
