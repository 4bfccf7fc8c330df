"""The analysis of a finished trace: every concept the rules and the report views share, computed
once, in one place. Pure Python over ``Trace``; no torch.

``Analysis(trace)`` is built once per check (``rules.engine.analyze``); each rule's
``check(analysis)`` and each report view reads it. What lives where:

===================  ====================================================================
concept              where
===================  ====================================================================
step numbers         ``Analysis.step_number`` (1-based, replay order, GradScaler-skipped
                     steps included); ``next_step`` / ``next_step_number`` / ``steps_before``;
                     ``step_count``
folded turns         a long run's repeated turns folded by the recorder (instrument/fold.py):
                     ``weight(event)`` / ``count(events)`` count their copies, ``by_epoch``
                     counts per DataLoader epoch; rules count through these, never ``len()``
parameters written   ``written(backward)`` (fresh + accumulated + cleared outside zero_grad)
  by a backward
user-facing names    ``param_name`` / ``names`` / ``optimizer_name`` (module names: ``modes``)
applied steps        ``applied_steps``: per optimizer, its steps that applied gradients (no
                     GradScaler skip, no closure); ``measured_at(step, since)``: the gradient
                     norms that step measured and the gradients edited by hand before it
optimizers           ``optimizers`` (first construction), ``opt_params``, ``owners``,
                     ``replaced`` (an optimizer rebuilt over other parameters), ``moved``
                     (unowned tensors whose values change between steps),
                     ``replacements`` / ``replaced_pids`` (owned parameters replaced in their
                     module while their optimizer still steps)
the ledger           ``ledger`` (analysis/ledger.py): phases, contributions, old uses,
                     discards, accumulation windows' backwards, the gradients' state at
                     every clip
crossed steps        ``crossings`` (analysis/crossed.py): two optimizers each stepped after
                     the backward of the other's loss; ``crossed_old_uses``: the old uses
                     they account for
accumulation         ``windows`` (analysis/windows.py): per optimizer, its steps' windows
mode timeline        ``modes`` (analysis/modes.py): BatchNorm/dropout forwards in context
loop turns           ``turns`` (analysis/turns.py): the calls of each turn of the training
                     loop, for the report's update timeline
learning rates       ``lr_timeline`` (analysis/lr.py): per optimizer and param group, the lr at
                     each step and what wrote it; ``schedulers``: each scheduler, its
                     construction, its steps; ``lr_collapses``: groups whose lr fell
                     below 1e-4 of its start while the script still stepped
gradient norms       ``last_update_norms`` (analysis/gradflow.py), for ``--grad-flow``
the script's source  ``source`` (analysis/source.py): loops and call text around an event's
                     line, its paths read relative to ``base_dir`` (where the check started)
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
from typing import Callable, Hashable, Iterable

from ..trace import Event, Trace
from .basics import listing, written


class Analysis:
    """Everything rules and views read about one trace. Cheap facts are computed on
    construction (one pass); the larger analyses on first use, then kept."""

    def __init__(self, trace: Trace | Iterable[Event], base_dir: str | None = None):
        from .source import ScriptSource

        self.trace = trace if isinstance(trace, Trace) else Trace(trace)
        self.source = ScriptSource(base_dir)  # the trace's paths are relative to base_dir
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
        # turns the recorder folded out of a long run (instrument/fold.py): their steps count in
        # the step numbers, their backwards in ``backward_calls``, and each folded turn adds one
        # to the ``weight`` of the events of the kept turn it repeated
        self.folded_steps = 0
        self._folded_backwards = 0
        self._fold_seqs: list[int] = []  # seqs of the ``folded`` events
        self._fold_steps: list[int] = []  # folded steps up to and including each of them
        copies: list[tuple[int, int, int]] = []
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
                self.step_number[e.seq] = len(self.steps) + self.folded_steps
            elif kind == "backward":
                for pid in written(e):
                    self._writers.setdefault(pid, []).append(e.seq)
            elif kind == "folded":
                self.folded_steps += e.get("steps", 0)
                self._folded_backwards += e.get("backwards", 0)
                self._fold_seqs.append(e.seq)
                self._fold_steps.append(self.folded_steps)
                copies.extend((first, last, n) for first, last, n in e.get("copies", ()))
        self._step_seqs = [s.seq for s in self.steps]
        self._copies: dict[int, int] = {}  # seq -> folded copies of it
        self._seqs: list[int] | None = None
        for first, last, n in copies:
            for e in self.span(first, last):
                self._copies[e.seq] = self._copies.get(e.seq, 0) + n

    def span(self, first: int, last: int) -> list[Event]:
        """The events with seqs from ``first`` to ``last`` (a kept turn a ``folded`` event names)."""
        if self._seqs is None:
            self._seqs = [e.seq for e in self.events]
        seqs = self._seqs
        return self.events[bisect.bisect_left(seqs, first):bisect.bisect_right(seqs, last)]

    def copies_in(self, fold: Event) -> list[tuple[list[Event], int]]:
        """What a ``folded`` event stands for: (the events of a kept turn, how many copies)."""
        return [(self.span(first, last), n) for first, last, n in fold.get("copies", ())]

    def replayed(self, most: int = 2):
        """The events in order, each ``folded`` event replaced by its kept turns, each repeated
        as many times as it stood for but at most ``most``: enough to see what alternates from
        turn to turn (two optimizers taking turns) in a long run's folded trace."""
        for e in self.events:
            if e.kind == "folded":
                for turn, n in self.copies_in(e):
                    for _ in range(min(n, most)):
                        yield from turn
            else:
                yield e

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
        return len(self.by_kind.get("backward", ())) + self._folded_backwards

    @property
    def step_count(self) -> int:
        """Optimizer steps in the run (``len(steps)`` plus those folded out of a long run)."""
        return len(self.steps) + self.folded_steps

    def weight(self, event: Event) -> int:
        """How many times this event happened: 1, plus the folded copies of its turn."""
        return 1 + self._copies.get(event.seq, 0)

    def count(self, events: Iterable[Event]) -> int:
        """How many times these events happened (folded copies included): what a message
        that counts occurrences says."""
        copies = self._copies
        if not copies:
            return sum(1 for _ in events)
        return sum(1 + copies.get(e.seq, 0) for e in events)

    def by_epoch(self, key: Callable[[Event], Hashable | None]) -> dict[tuple, tuple[list[Event], int]]:
        """Events grouped by ``key(event)`` (events it maps to None are left out) and by the
        DataLoader epoch they happened in, that of the batch the latest backward used
        (``(loader, epoch)``; None without a DataLoader): ``(key, epoch)`` -> (its recorded
        events, how many times they happened). The count includes folded copies, in the epoch
        their fold lies in; a fold that crossed an epoch boundary counts in none (a lower bound).
        A group may hold copies only: its list is then empty."""
        found: dict[tuple, list] = {}
        epoch = None
        for e in self.events:
            if e.kind == "folded":
                if e.get("epochs") and epoch is not None:
                    continue
                for turn, n in self.copies_in(e):
                    for copy in turn:
                        k = key(copy)
                        if k is not None:
                            found.setdefault((k, epoch), [[], 0])[1] += n
                continue
            if e.kind == "backward":
                batch = e.get("batch")
                epoch = (batch[0], batch[1]) if batch else None
            k = key(e)
            if k is not None:
                group = found.setdefault((k, epoch), [[], 0])
                group[0].append(e)
                group[1] += 1
        return {g: (events, n) for g, (events, n) in found.items()}

    # -- steps -----------------------------------------------------------------------
    def next_step(self, seq: int) -> Event | None:
        """The first optimizer step after the event with that seq."""
        i = bisect.bisect_right(self._step_seqs, seq)
        return self.steps[i] if i < len(self.steps) else None

    def next_step_number(self, seq: int) -> int | None:
        i = bisect.bisect_right(self._step_seqs, seq)
        return self.step_number[self.steps[i].seq] if i < len(self.steps) else None

    def steps_before(self, seq: int) -> int:
        """How many optimizer steps ran before the event with that seq (folded ones included)."""
        return self.step_index(seq) + self._folded_before(seq)

    def step_index(self, seq: int) -> int:
        """How many of ``steps`` (the recorded ones) come before the event with that seq."""
        return bisect.bisect_left(self._step_seqs, seq)

    def _folded_before(self, seq: int) -> int:
        i = bisect.bisect_left(self._fold_seqs, seq)
        return self._fold_steps[i - 1] if i else 0

    def last_writer(self, pid: int, before: int) -> Event | None:
        """The last backward before seq ``before`` that wrote ``pid``'s gradient."""
        seqs = self._writers.get(pid, [])
        i = bisect.bisect_left(seqs, before)
        return self.event(seqs[i - 1]) if i else None

    # -- names -----------------------------------------------------------------------
    def param_name(self, pid: int) -> str:
        """The parameter's name; one that several parameters share (two models trained in two
        threads, each held by a local ``model``) gets its optimizer: ``model.weight (opt_a)``, or
        ``model.weight (SGD #1)`` where the optimizers' variables do not tell them apart."""
        shown = self._shown_names.get(pid)
        if shown is not None:
            return shown
        event = self.params.get(pid)
        name = event.get("name") if event else None
        return name or f"param#{pid}"

    @cached_property
    def _shown_names(self) -> dict[int, str]:
        """pid -> its name told apart from the other parameters of that name, by the optimizer
        that owns it when that alone tells them apart, else by its number (``param#3``)."""
        by_name: dict[str, list[int]] = {}
        for pid, event in self.params.items():
            name = event.get("name")
            if name:
                by_name.setdefault(name, []).append(pid)
        shown: dict[int, str] = {}
        for name, pids in by_name.items():
            if len(pids) < 2:
                continue
            owner = {pid: min(self.owners[pid]) if self.owners.get(pid) else None for pid in pids}
            mates = [owner[pid] for pid in pids]
            for pid in pids:
                opt = owner[pid]
                if opt is not None and mates.count(opt) == 1:
                    shown[pid] = f"{name} ({self._distinct_variable(opt) or self.optimizer_name(opt)})"
                else:
                    shown[pid] = f"{name} (param#{pid})"
        return shown

    def param_names(self, pids, limit: int | None = None) -> list[str]:
        pids = list(dict.fromkeys(pids))
        return [self.param_name(p) for p in (pids if limit is None else pids[:limit])]

    def names(self, pids, limit: int = 4) -> str:
        """'fc.weight, fc.bias and 3 more' for messages."""
        return listing((self.param_name(p) for p in dict.fromkeys(pids)), limit)

    def optimizer_name(self, opt: int) -> str:
        """'AdamW'; when two of one class exist, what the script calls it ('opt_g (Adam)'),
        or 'AdamW #1' where the script's names do not tell them apart."""
        classes = {o: e.get("cls", "optimizer") for o, e in self.optimizers.items()}
        cls = classes.get(opt, "optimizer")
        if list(classes.values()).count(cls) > 1:
            name = self._distinct_variable(opt)
            return f"{name} ({cls})" if name else f"{cls} #{opt}"
        return cls

    def optimizer_variable(self, opt: int) -> str | None:
        """The variable the script built the optimizer into (``decoder_opt``), when no other
        optimizer's has that name; None otherwise."""
        return self._distinct_variable(opt)

    def _distinct_variable(self, opt: int) -> str | None:
        """The variable the optimizer was built into, if no other optimizer's is the same."""
        names = self._optimizer_variables
        name = names.get(opt)
        return name if name and list(names.values()).count(name) == 1 else None

    @cached_property
    def _optimizer_variables(self) -> dict[int, str | None]:
        """opt -> the variable its construction is assigned to (``opt_g``), where it is."""
        out: dict[int, str | None] = {}
        for opt, init in self.optimizers.items():
            loc = init.loc
            out[opt] = self.source.assigned_name(loc.path, loc.line) \
                if loc is not None and not loc.via else None
        return out

    def optimizer_class(self, opt: int) -> str:
        init = self.optimizers.get(opt)
        return init.get("cls", "") if init is not None else ""

    # -- who owns what ---------------------------------------------------------------
    @cached_property
    def replaced(self) -> dict[int, Event]:
        """opt -> the ``optimizer_init`` of the optimizer that replaced it: built after its
        last step (or after it, if it never stepped) over some of the same parameters, and
        stepped since, while the replaced one never stepped again (an optimizer rebuilt at a
        stage switch; awd-lstm's SGD -> ASGD). The replaced optimizer's parameters that the new
        one does not own are then owned by no optimizer that still steps."""
        last_step: dict[int, int] = {}
        stepped_after: dict[int, int] = {}  # opt -> seq of its last step
        for e in self.steps:
            last_step[e.get("opt")] = e.seq
            stepped_after[e.get("opt")] = e.seq
        out: dict[int, Event] = {}
        inits = sorted(self.optimizers.values(), key=lambda e: e.seq)
        for old in inits:
            opt = old["opt"]
            since = max(old.seq, last_step.get(opt, -1))
            mine = set(self.opt_params.get(opt, ()))
            for new in inits:
                other = new["opt"]
                if (other != opt and new.seq > since and stepped_after.get(other, -1) > new.seq
                        and mine & set(self.opt_params.get(other, ()))):
                    out[opt] = new
                    break
        return out

    @cached_property
    def replacements(self) -> list[Event]:
        """The ``param_replaced`` events that broke the parameters' life: an optimizer owned
        the replaced tensors and stepped again afterwards (it steps tensors the model no
        longer uses). Rules that see the symptoms (new tensors no optimizer owns, owned ones
        that get no gradient) leave those tensors to param-replaced."""
        out = []
        last: dict[int, int] = {}
        for e in self.steps:
            last[e.get("opt")] = e.seq
        successors: set[int] = set()  # new tensors of a kept replacement (replaced again later)
        for e in self.by_kind.get("param_replaced", ()):
            old = e.get("old") or ()
            if any(pid in successors for pid in old) or any(
                    last.get(opt, -1) > e.seq for pid in old for opt in self.owners.get(pid, ())):
                out.append(e)
                successors.update(e.get("new") or ())
        return out

    @cached_property
    def replaced_pids(self) -> set[int]:
        """Old and new tensors of ``replacements``."""
        return {pid for e in self.replacements for key in ("old", "new") for pid in e.get(key) or ()}

    @cached_property
    def optimizers_on_copies(self) -> dict[int, dict]:
        """Optimizers built over a copy of the model the loss trains (``SGD(model_ema.parameters())``
        for ``SGD(model.parameters())``): over at least two steps no tensor the optimizer owns
        (and that requires grad) got a gradient, while the model's own tensors, of the same
        names past a prefix and the same shapes, get gradients no optimizer owns. ``opt ->
        {"idle": [pid], "trained": [pid], "copy": prefix, "model": prefix}`` (``idle[i]`` is the
        copy of ``trained[i]``; the prefixes are the names' heads: ``model_ema.module``,
        ``model``). param-not-in-optimizer reports the wrong optimizer; the rules that see its
        symptoms (owned tensors without gradient, the model's BatchNorm layers owned by none)
        leave them to it."""
        led = self.ledger
        skip = self.moved | self.replaced_pids
        orphans: dict[str, int] = {}  # name -> pid: tensors with gradients no optimizer owns
        for pid in led.first_contribution:
            event = self.params.get(pid)
            if (event is None or pid in skip or self.owners.get(pid)
                    or not event.get("is_parameter") or not event.get("name")):
                continue
            orphans.setdefault(event["name"], pid)
        if not orphans:
            return {}
        out: dict[int, dict] = {}
        for opt in self.optimizers:
            steps = [s for s in self.steps if s.get("opt") == opt and not s.get("skipped")]
            if self.count(steps) < 2:
                continue
            every = list(dict.fromkeys(self.opt_params.get(opt, ())))
            owned = [pid for pid in every
                     if (self.params.get(pid) is None or self.params[pid].get("requires_grad", True))]
            owned = owned or every  # a copy frozen with requires_grad_(False) (timm's ModelEma)
            if not owned or any(pid in led.first_contribution for pid in owned):
                continue
            if any(set(owned) - set(s.get("without_grad", ())) for s in steps):
                continue  # some owned tensor had a gradient at a step
            names = [(self.params[pid].get("name") if pid in self.params else None) for pid in owned]
            if not all(names):
                continue
            match = _copy_of(names, owned, orphans, self.params)
            if match is not None:
                out[opt] = match
        return out

    @cached_property
    def moved(self) -> set[int]:
        """Tracked tensors no optimizer owns whose values changed between optimizer steps
        (``step_begin``'s ``moved``): trained by a copy from what an optimizer stepped (fp16
        master weights) or by hand."""
        return {pid for e in self.by_kind.get("step_begin", ()) for pid in e.get("moved") or ()}

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
    def crossings(self):
        """Pairs of optimizer steps each taken after the other one's backward
        (analysis/crossed.py)."""
        from .crossed import find_crossings

        return find_crossings(self)

    @cached_property
    def crossed_old_uses(self) -> set[tuple[int, int]]:
        """(step seq, pid) of the ledger's old uses a crossing accounts for."""
        from .crossed import explained_old_uses

        return explained_old_uses(self)

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
    def schedulers(self):
        """sched -> its ``Schedule`` (analysis/lr.py)."""
        from .lr import schedules

        return schedules(self)

    @cached_property
    def lr_timeline(self):
        """opt -> group index -> [``LrPoint(step, lr, writer)``] (analysis/lr.py)."""
        from .lr import timeline

        return timeline(self)

    @cached_property
    def lr_collapses(self):
        """[``Collapse``]: param groups whose lr fell below 1e-4 of its start while the script
        went on stepping (analysis/lr.py)."""
        from .lr import collapses

        return collapses(self)

    @cached_property
    def lr_growths(self):
        """[``Growth``]: param groups whose lr rose far past every lr the script set, with no
        ceiling, while the script went on stepping (analysis/lr.py)."""
        from .lr import growths

        return growths(self)

    @cached_property
    def applied_steps(self) -> dict[int, list[Event]]:
        """opt -> its steps that applied gradients (neither skipped by a GradScaler nor closure
        steps, which recompute their own), in order."""
        out: dict[int, list[Event]] = {}
        for step in self.steps:
            if not (step.get("skipped") or step.get("closure")):
                out.setdefault(step["opt"], []).append(step)
        return out

    def measured_at(self, step: Event, since: int) -> tuple[dict[int, float] | None, set[int]]:
        """``({pid: norm}, edited)`` of an optimizer step: the gradient norms its ``step_begin``
        measured (None when it measured none: vouched finite by a clip or ``unscale_``) and the
        pids a ``grad_edit`` changed by hand, both between the event ``since`` and the step."""
        between = self.span(since + 1, step.seq - 1)
        begin = next((e for e in reversed(between) if e.kind == "step_begin"
                      and e.get("opt") == step["opt"]), None)
        edited = {p for e in between if e.kind == "grad_edit" for p in e.get("params") or ()}
        if begin is None or begin.get("norms") is None:
            return None, edited
        return dict(zip(begin.get("norm_pids") or (), begin["norms"])), edited

    @cached_property
    def last_update_norms(self):
        from .gradflow import last_update_norms

        return last_update_norms(self)

    @cached_property
    def heatmaps(self):
        """Every update's per-layer gradient norms, one heatmap per optimizer (the pictures)."""
        from .gradflow import heatmaps

        return heatmaps(self)


def _copy_of(names: list[str], owned: list[int], orphans: dict[str, int],
             params: dict) -> dict | None:
    """Prefixes ``copy``/``model`` such that every owned name is ``copy.<rest>`` and
    ``model.<rest>`` names a tensor of the same shape in ``orphans`` (see
    ``Analysis.optimizers_on_copies``); None when no split of the first name does."""
    first = names[0].split(".")
    # the rest keeps two parts at least (``0.weight``): ``a.fc.weight`` and ``b.conv.weight``
    # share only the tensor's own name, which every layer has
    for cut in range(1, len(first) - 1):
        copy, rest = ".".join(first[:cut]), ".".join(first[cut:])
        heads = {name[:-len(rest) - 1] for name in orphans
                 if name.endswith("." + rest) and len(name) > len(rest) + 1}
        for model in sorted(heads):
            if model == copy:
                continue
            trained = []
            for name, pid in zip(names, owned):
                if not name.startswith(copy + "."):
                    break
                twin = orphans.get(model + name[len(copy):])
                if twin is None or (params[twin].get("shape") != params[pid].get("shape")):
                    break
                trained.append(twin)
            else:
                return {"idle": list(owned), "trained": trained, "copy": copy, "model": model}
    return None
