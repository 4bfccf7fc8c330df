"""The analysis of a finished trace: every concept the rules and the report views share, computed
once, in one place. Pure Python over ``Trace``; no torch.

``Analysis(trace)`` is built once per check (``analysis.run_rules.analyze``); each rule's
``check(analysis)`` and each report view reads it. What lives where:

===================  ====================================================================
concept              where
===================  ====================================================================
step numbers         ``Analysis.step_number`` (1-based, replay order, GradScaler-skipped
                     steps included); ``next_step`` / ``next_step_number`` / ``steps_before``
parameters written   ``written(backward)`` (fresh + accumulated + cleared outside zero_grad)
  by a backward
user-facing names    ``param_name`` / ``names`` / ``optimizer_name`` (module names: ``modes``)
optimizers           ``optimizers`` (first construction), ``opt_params``, ``owners``
the ledger           ``ledger`` (analysis/ledger.py): phases, contributions, old uses,
                     discards, accumulation windows' backwards, the gradients' state at
                     every clip
accumulation         ``windows`` (analysis/windows.py): per optimizer, its steps' windows
mode timeline        ``modes`` (analysis/modes.py): BatchNorm/dropout forwards in context
loop turns           ``turns`` (analysis/turns.py): the calls of each turn of the training
                     loop, for the report's update timeline
gradient norms       ``last_update_norms`` (analysis/gradflow.py), for ``--grad-flow``
framework            ``framework``: the training framework that drove the optimizer steps
                     (``Location.via`` of the events; graddoctor/frameworks.py)
===================  ====================================================================

Two notions of "update" exist on purpose and are defined once each: the ledger's *phase* (a
run of backward calls and the optimizer steps after them: what a gradient belongs to) and the
timeline's *turn* (one pass of the loop body, from the call that starts it to the steps that
end it: what a person reads). A GAN turn holds two phases.
"""

from __future__ import annotations

import bisect
from functools import cached_property
from typing import Iterable

from ..trace import Event, Trace


def written(backward: Event) -> tuple[int, ...]:
    """The parameters a backward wrote: fresh, accumulated onto, or cleared outside zero_grad."""
    return (*backward.get("fresh", ()), *backward.get("accumulated", ()),
            *backward.get("cleared_outside", ()))


def listing(names, limit: int) -> str:
    """'fc.weight, fc.bias and 3 more': how messages list parameters and layers."""
    names = list(dict.fromkeys(names))
    text = ", ".join(names[:limit])
    return text + (f" and {len(names) - limit} more" if len(names) > limit else "")


class Analysis:
    """Everything rules and views read about one trace. Cheap facts are computed on
    construction (one pass); the larger analyses on first use, then kept."""

    def __init__(self, trace: Trace | Iterable[Event]):
        self.trace = trace if isinstance(trace, Trace) else Trace(trace)
        self.events: list[Event] = self.trace.events
        self._by_seq = {e.seq: i for i, e in enumerate(self.events)} \
            if any(e.seq != i for i, e in enumerate(self.events)) else None
        self.by_kind: dict[str, list[Event]] = {}
        self.params: dict[int, Event] = {}  # pid -> its latest ``param`` event
        self.optimizers: dict[int, Event] = {}  # opt -> its first ``optimizer_init``
        self.opt_params: dict[int, list[int]] = {}  # opt -> pids (every construction, in order)
        self.owners: dict[int, set[int]] = {}  # pid -> optimizers owning it
        self.steps: list[Event] = []
        self.step_number: dict[int, int] = {}  # seq of a ``step`` -> its 1-based number
        self._writers: dict[int, list[int]] = {}  # pid -> seqs of the backwards writing it
        for e in self.events:
            self.by_kind.setdefault(e.kind, []).append(e)
            kind = e.kind
            # malformed events (a hand-edited trace) are skipped here; a rule that needs them
            # fails alone, as an internal error
            if kind == "param" and "pid" in e.data:
                self.params[e["pid"]] = e
            elif kind == "optimizer_init" and "opt" in e.data:
                opt = e["opt"]
                self.optimizers.setdefault(opt, e)
                self.opt_params.setdefault(opt, []).extend(e.get("params") or ())
                for pid in e.get("params") or ():
                    self.owners.setdefault(pid, set()).add(opt)
            elif kind == "step":
                self.steps.append(e)
                self.step_number[e.seq] = len(self.steps)
            elif kind == "backward":
                for pid in written(e):
                    self._writers.setdefault(pid, []).append(e.seq)
        self._step_seqs = [s.seq for s in self.steps]

    # -- events ----------------------------------------------------------------------
    def of_kind(self, *kinds: str) -> list[Event]:
        if len(kinds) == 1:
            return list(self.by_kind.get(kinds[0], ()))
        return [e for e in self.events if e.kind in kinds]

    def event(self, seq: int | None) -> Event | None:
        """The event with that seq (e.g. the ``freeze`` a ``mode_module`` refers to)."""
        if seq is None:
            return None
        index = seq if self._by_seq is None else self._by_seq.get(seq)
        if index is None or not 0 <= index < len(self.events):
            return None
        return self.events[index]

    def after(self, seq: int) -> list[Event]:
        """The events after the one with that seq."""
        index = seq if self._by_seq is None else self._by_seq.get(seq, len(self.events))
        return self.events[index + 1:]

    @property
    def status(self) -> str | None:
        """The run's status (``run_end``), or None while it still runs (a provisional report)."""
        ends = self.by_kind.get("run_end")
        return ends[-1].get("status") if ends else None

    @property
    def backward_calls(self) -> int:
        return len(self.by_kind.get("backward", ()))

    # -- steps -----------------------------------------------------------------------
    def next_step(self, seq: int) -> Event | None:
        """The first optimizer step after the event with that seq."""
        i = bisect.bisect_right(self._step_seqs, seq)
        return self.steps[i] if i < len(self.steps) else None

    def next_step_number(self, seq: int) -> int | None:
        i = bisect.bisect_right(self._step_seqs, seq)
        return i + 1 if i < len(self.steps) else None

    def steps_before(self, seq: int) -> int:
        """How many optimizer steps ran before the event with that seq."""
        return bisect.bisect_left(self._step_seqs, seq)

    def last_writer(self, pid: int, before: int) -> Event | None:
        """The last backward before seq ``before`` that wrote ``pid``'s gradient."""
        seqs = self._writers.get(pid, [])
        i = bisect.bisect_left(seqs, before)
        return self.event(seqs[i - 1]) if i else None

    # -- names -----------------------------------------------------------------------
    def param_name(self, pid: int) -> str:
        event = self.params.get(pid)
        name = event.get("name") if event else None
        return name or f"param#{pid}"

    def param_names(self, pids, limit: int | None = None) -> list[str]:
        pids = list(dict.fromkeys(pids))
        return [self.param_name(p) for p in (pids if limit is None else pids[:limit])]

    def names(self, pids, limit: int = 4) -> str:
        """'fc.weight, fc.bias and 3 more' for messages."""
        return listing((self.param_name(p) for p in dict.fromkeys(pids)), limit)

    def optimizer_name(self, opt: int) -> str:
        """'AdamW' (or 'AdamW #1' when two of one class exist)."""
        classes = {o: e.get("cls", "optimizer") for o, e in self.optimizers.items()}
        cls = classes.get(opt, "optimizer")
        if list(classes.values()).count(cls) > 1:
            return f"{cls} #{opt}"
        return cls

    def optimizer_class(self, opt: int) -> str:
        init = self.optimizers.get(opt)
        return init.get("cls", "") if init is not None else ""

    # -- the larger analyses, each built once on first use ---------------------------
    @cached_property
    def framework(self) -> str:
        """The training framework that drove the run ("lightning", "accelerate",
        "transformers"; "" for a hand-written loop): the one whose frames the optimizer steps came
        through, else the first one any call came through."""
        for kinds in (("step", "step_begin"), None):
            for e in self.events:
                if e.loc is not None and e.loc.via and (kinds is None or e.kind in kinds):
                    return e.loc.via
        return ""

    @cached_property
    def ledger(self):
        from .ledger import build_ledger

        return build_ledger(self)

    @cached_property
    def windows(self):
        """opt -> its steps' accumulation windows (``Window``), in step order."""
        from .windows import windows_by_optimizer

        return windows_by_optimizer(self)

    @cached_property
    def modes(self):
        from .modes import build_timeline

        return build_timeline(self)

    @cached_property
    def turns(self):
        from .turns import turns

        return turns(self)

    @cached_property
    def last_update_norms(self):
        from .gradflow import last_update_norms

        return last_update_norms(self)
