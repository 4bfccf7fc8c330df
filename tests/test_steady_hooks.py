"""The straight-line hooks of a steady turn (``Folder.steady_take``; the zero_grad wrapper, the
backward wrapper, the optimizer step's pre and post hooks) record what their full paths record:
long in-process loops with deviations injected at random turns (a NaN gradient, ``p.grad /= 2``,
a parameter changed by hand, an lr change, a skipped zero_grad, a second backward, another call
site, ...) give the same trace, event for event, with and without them."""

from __future__ import annotations

import random

import pytest
import torch

from graddoctor.instrument import Instrumentation, fold
from graddoctor.instrument.recorder import Recorder
from graddoctor.location import LocationFinder

DEVIATIONS = ("nan", "grad_div", "param_edit", "lr", "skip_zero_grad", "second_backward",
              "other_site", "helper_site", "keep_grads", "frozen", "clip", "no_step", "snapshot",
              "new_param", "retain", "grad_none", "closure")


def _other_site(opt):
    opt.zero_grad()  # a zero_grad called from a helper: another call site and a caller


def _loop(rec: Recorder, plan: dict[int, str], turns: int, seed: int,
          clip_every: bool = False) -> None:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(6, 4), torch.randn(6, 1)
    params = list(model.parameters())
    for i in range(turns):
        what = plan.get(i)
        if what == "other_site":
            opt.zero_grad()
        elif what == "helper_site":
            _other_site(opt)
        elif what == "keep_grads":
            opt.zero_grad(set_to_none=False)
        elif what != "skip_zero_grad":
            opt.zero_grad()
        if what == "frozen":
            params[0].requires_grad_(False)
        xb = x
        if what == "nan":
            xb = x.clone()
            xb[0, 0] = float("nan")
        loss = torch.nn.functional.mse_loss(model(xb), y)
        if what == "retain":
            loss.backward(retain_graph=True)
        else:
            loss.backward()
        if what == "second_backward":
            torch.nn.functional.mse_loss(model(x), y).backward()
        if what == "grad_div":
            params[1].grad /= 2
        if what == "grad_none":
            params[2].grad = None
        if clip_every == "value":
            torch.nn.utils.clip_grad_value_(params, 0.5 if what != "clip_limit" else 0.25)
        elif clip_every:  # a loop that clips every turn (its clip skimmed with the turn)
            if what == "clip_limit":
                torch.nn.utils.clip_grad_norm_(params, 2.0)
            elif what == "clip_subset":
                torch.nn.utils.clip_grad_norm_(params[:2], 1.0)
            elif what == "clip_generator":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            else:
                torch.nn.utils.clip_grad_norm_(params, 1.0)
        if what == "clip":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if what == "lr":
            opt.param_groups[0]["lr"] = 0.01 * (1 + i % 3)
        if what == "param_edit":
            with torch.no_grad():
                params[2].mul_(0.999)
        if what == "snapshot":
            rec.snapshot()
        if what == "new_param":
            extra = torch.nn.Parameter(torch.zeros(2))
            opt.add_param_group({"params": [extra]})
        if what == "closure":
            opt.step(lambda: None)
        elif what != "no_step":
            opt.step()
        if what == "frozen":
            params[0].requires_grad_(True)
        if what == "nan":  # back to finite weights (itself a change by hand)
            torch.manual_seed(seed + i)
            with torch.no_grad():
                for p in params:
                    p.copy_(torch.randn_like(p) * 0.1)


def _trace(plan: dict[int, str], turns: int, seed: int, hooks: bool, grad_flow: bool,
           monkeypatch) -> tuple[str, int]:
    monkeypatch.setattr(fold, "STEADY_HOOKS", hooks)
    taken = [0]
    original = fold.Folder.steady_take

    def counting(self, *args):
        ok = original(self, *args)
        taken[0] += ok
        return ok

    monkeypatch.setattr(fold.Folder, "steady_take", counting)
    rec = Recorder(step_budget=None, finder=LocationFinder())
    with Instrumentation(rec, grad_flow=grad_flow):
        _loop(rec, plan, turns, seed)
    return rec.trace.dumps(), taken[0]


@pytest.mark.parametrize("seed", range(8))
def test_steady_hooks_record_what_the_full_paths_record(seed, monkeypatch):
    monkeypatch.setattr(fold, "FOLD_AFTER", 4)
    monkeypatch.setattr(fold, "MAX_PERIOD", 3)
    monkeypatch.setattr(fold, "STEADY_AFTER", 3 + seed % 3)
    rng = random.Random(seed)
    turns = 400
    plan = {}
    for i in sorted(rng.sample(range(20, turns), 14)):
        plan[i] = rng.choice(DEVIATIONS)
    grad_flow = seed % 2 == 1
    with_hooks, taken = _trace(plan, turns, seed, True, grad_flow, monkeypatch)
    without, none = _trace(plan, turns, seed, False, grad_flow, monkeypatch)
    assert none == 0
    assert taken > 100  # the straight-line paths ran (a param without grads stops two of them)
    assert with_hooks.splitlines() == without.splitlines()


@pytest.mark.parametrize("what", DEVIATIONS)
def test_each_deviation_is_recorded_in_full(what, monkeypatch):
    monkeypatch.setattr(fold, "FOLD_AFTER", 4)
    monkeypatch.setattr(fold, "MAX_PERIOD", 3)
    monkeypatch.setattr(fold, "STEADY_AFTER", 3)
    plan = {60: what, 61: what, 90: what}
    with_hooks, taken = _trace(plan, 140, 1, True, False, monkeypatch)
    without, _ = _trace(plan, 140, 1, False, False, monkeypatch)
    assert taken > 100
    assert with_hooks.splitlines() == without.splitlines()


def _loader_loop(rec: Recorder, plan: dict[int, str]) -> None:
    torch.manual_seed(3)
    data = torch.utils.data.TensorDataset(torch.randn(480, 4), torch.randn(480, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    i = 0
    for _epoch in range(3):
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            if plan.get(i) == "grad_div":
                model[0].weight.grad /= 2
            opt.step()
            i += 1
        scheduler.step()


@pytest.mark.parametrize("hooks_first", [True, False])
def test_a_loader_loop_records_the_same_with_the_straight_line_paths(hooks_first, monkeypatch):
    monkeypatch.setattr(fold, "FOLD_AFTER", 4)
    monkeypatch.setattr(fold, "MAX_PERIOD", 3)
    monkeypatch.setattr(fold, "STEADY_AFTER", 5)
    plan = {70: "grad_div", 200: "grad_div"}
    traces = {}
    for hooks in (hooks_first, not hooks_first):
        monkeypatch.setattr(fold, "STEADY_HOOKS", hooks)
        taken = [0]
        original = fold.Folder.steady_take

        def counting(self, *args, original=original, taken=taken):
            ok = original(self, *args)
            taken[0] += ok
            return ok

        monkeypatch.setattr(fold.Folder, "steady_take", counting)
        rec = Recorder(step_budget=None, finder=LocationFinder())
        with Instrumentation(rec, epoch_batches=0):
            _loader_loop(rec, plan)
        traces[hooks] = (rec.trace.dumps(), taken[0])
        monkeypatch.setattr(fold.Folder, "steady_take", original)
    assert traces[False][1] == 0
    assert traces[True][1] > 1000  # the backward's too (912 without), its next batch each turn
    assert traces[True][0].splitlines() == traces[False][0].splitlines()


# -- the skim of a long steady state (fold.SKIM_AFTER, SKIM_EVERY): the hooks of a skimmed turn
# read only what tells the turn's shape; every SKIM_EVERY-th turn is sampled (the straight-line
# reads). Findings must match the run without the skim where a deviation changes the turn's shape
# (any turn) or lands on a sampled turn; on a skimmed turn a deviation that shows only in the
# skipped reads may be missed (docs/performance.md), but the skim never adds a finding.
SHAPE = ("skip_zero_grad", "second_backward", "other_site", "helper_site", "keep_grads",
         "clip", "no_step", "snapshot", "new_param", "retain", "closure")
READS = ("nan", "grad_div", "param_edit", "lr", "frozen", "grad_none")


def _skim_constants(monkeypatch) -> None:
    monkeypatch.setattr(fold, "FOLD_AFTER", 4)
    monkeypatch.setattr(fold, "MAX_PERIOD", 3)
    monkeypatch.setattr(fold, "STEADY_AFTER", 3)
    monkeypatch.setattr(fold, "SKIM_AFTER", 6)
    monkeypatch.setattr(fold, "SKIM_EVERY", 4)


def _skim_run(plan: dict[int, str], turns: int, skim: bool, monkeypatch,
              grad_flow: bool = False, clip_every: bool = False) -> tuple[list, set[int], str]:
    """(findings as comparable tuples, the loop's turns whose step hook skimmed, the trace).
    ``clip_every``: the loop clips every turn, and the turns returned are those whose clip
    skimmed too."""
    from graddoctor.instrument.clip import ClipWatcher
    from graddoctor.instrument.optim import OptimizerWatcher
    from graddoctor.rules.engine import analyze

    monkeypatch.setattr(fold, "SKIM", skim)
    skimmed: set[int] = set()
    clipped: set[int] = set()
    original = OptimizerWatcher._skim_begin
    original_clip = ClipWatcher._skim_after

    def noting(self, *args):
        skimmed.add(self.rec.progress.steps)  # the loop's index: steps are counted after
        return original(self, *args)

    def noting_clip(self, *args):
        clipped.add(self.rec.progress.steps)
        return original_clip(self, *args)

    monkeypatch.setattr(OptimizerWatcher, "_skim_begin", noting)
    monkeypatch.setattr(ClipWatcher, "_skim_after", noting_clip)
    rec = Recorder(step_budget=None, finder=LocationFinder())
    with Instrumentation(rec, grad_flow=grad_flow):
        _loop(rec, plan, turns, 5, clip_every=clip_every)
    monkeypatch.setattr(OptimizerWatcher, "_skim_begin", original)
    monkeypatch.setattr(ClipWatcher, "_skim_after", original_clip)
    findings, errors = analyze(rec.trace)
    assert not errors
    assert rec.internal_errors == 0
    if clip_every:
        skimmed = clipped
    key = [(f.rule, f.message, f.location, f.step) for f in findings]
    return key, skimmed, _unsampled(rec.trace.dumps())


def _unsampled(trace: str) -> list[dict]:
    """The trace less the norms of each step_begin (a skimmed step's are its last sample's)."""
    import json

    events = [json.loads(line) for line in trace.splitlines()]
    for event in events:
        if event["kind"] == "step_begin":
            event["data"].pop("norms")
    return events


def test_the_skim_runs_and_changes_no_finding_of_a_clean_loop(monkeypatch):
    _skim_constants(monkeypatch)
    with_skim, skimmed, _ = _skim_run({}, 300, True, monkeypatch, grad_flow=True)
    without, none, _ = _skim_run({}, 300, False, monkeypatch, grad_flow=True)
    assert not none
    assert len(skimmed) > 200  # three turns of four skimmed
    sampled = [i for i in range(min(skimmed), 300) if i not in skimmed]
    gaps = [b - a for a, b in zip(sampled, sampled[1:])]
    assert sampled and 3 <= min(gaps) and max(gaps) <= 5  # about one turn in four
    assert len({i % 4 for i in sampled}) > 1  # not every 4th
    assert with_skim == without


def test_the_sampled_turns_fall_on_every_residue_of_any_period():
    """About one turn in ``every`` sampled, two samples never more than ``every + every // 8``
    turns apart, and over a long run every turn number modulo any period up to 64 is sampled
    at some point: a deviation that repeats with a period cannot hide between the samples."""
    for every in (4, 16):
        schedule = fold.SampleSchedule(every)
        sampled = [t for t in range(40_000) if schedule.sampled(t)]
        gaps = [b - a for a, b in zip(sampled, sampled[1:])]
        assert every - every // 8 - 1 <= min(gaps) and max(gaps) <= every + max(1, every // 8)
        assert abs(len(sampled) - 40_000 / every) < 40_000 / every / 50
        for period in range(2, 65):
            assert {t % period for t in sampled} == set(range(period)), (every, period)


def test_the_samples_of_a_long_steady_state_thin_out_to_a_bounded_gap():
    """The gap doubles each time the samples have covered ``longer`` turns at one gap, up to
    ``longest``: never more than ``longest + longest // 8`` turns between two samples (what a
    sample reads is found at most that late), and every residue of any period up to 64 still
    sampled within 40,000 turns. A steady state taken up again after a snapshot keeps the gap
    the one before had reached."""
    schedule = fold.SampleSchedule(16, 64, 2048)
    sampled = [t for t in range(40_000) if schedule.sampled(t)]
    gaps = {lo: [b - a for a, b in zip(sampled, sampled[1:]) if lo <= a < hi]
            for lo, hi in ((0, 2000), (2100, 4000), (4200, 40_000))}
    assert 14 <= min(gaps[0]) and max(gaps[0]) <= 18
    assert 28 <= min(gaps[2100]) and max(gaps[2100]) <= 36
    assert 56 <= min(gaps[4200]) and max(gaps[4200]) <= 72
    assert abs(sum(gaps[4200]) / len(gaps[4200]) - 64) < 1
    for period in range(2, 65):
        assert {t % period for t in sampled} == set(range(period)), period
    resumed = fold.SampleSchedule(16, 64, 2048, lasted=5000)
    later = [t for t in range(4000) if resumed.sampled(t)]
    assert all(56 <= b - a <= 72 for a, b in zip(later[1:], later[2:]))
    assert fold.SKIM_EVERY_MAX + fold.SKIM_EVERY_MAX // 8 <= 72  # the bound the docs give


def test_a_nan_late_in_a_long_skim_is_found_within_the_thinned_gap(monkeypatch):
    """A bug that appears only late (a NaN gradient, read on sampled turns only) in a steady
    state that has thinned its samples to the widest gap is still found, at most
    ``SKIM_EVERY_MAX + SKIM_EVERY_MAX // 8 - 1`` steps after the step it appears at, and it is
    the finding the run without the skim makes (its step aside)."""
    _skim_constants(monkeypatch)
    monkeypatch.setattr(fold, "SKIM_EVERY_MAX", 16)
    monkeypatch.setattr(fold, "SKIM_LONGER", 24)
    _, skimmed, _ = _skim_run({}, 260, True, monkeypatch)
    sampled = [i for i in range(min(skimmed), 260) if i not in skimmed]
    assert max(b - a for a, b in zip(sampled, sampled[1:]) if a > 120) > 5  # thinned (4 → 16)
    at = next(i for i in sampled if i > 180) + 1  # the turn after a sample: the longest delay
    plan = {t: "nan" for t in range(at, 260)}  # from then on, as a diverged run goes on
    with_skim, _, _ = _skim_run(plan, 260, True, monkeypatch)
    without, _, _ = _skim_run(plan, 260, False, monkeypatch)
    assert [(k[0], k[2]) for k in with_skim] == [(k[0], k[2]) for k in without]
    found = [k[3] for k in with_skim if k[0] == "nonfinite-grad"]
    first = [k[3] for k in without if k[0] == "nonfinite-grad"]
    assert found and first and 0 <= found[0] - first[0] <= 16 + 16 // 8 - 1, (found, first)


def test_the_skim_leaves_the_trace_as_it_was_but_for_the_norms_of_skimmed_steps(monkeypatch):
    _skim_constants(monkeypatch)
    _, skimmed, with_skim = _skim_run({}, 300, True, monkeypatch)
    _, _, without = _skim_run({}, 300, False, monkeypatch)
    assert len(skimmed) > 200
    assert with_skim == without  # the seqs, the folded events' counts, the last turns' events


def test_a_snapshot_in_the_skim_lets_the_next_turns_skim_again_and_changes_nothing(monkeypatch):
    """A provisional report's snapshot ends the steady state (the trace as if every turn had
    been recorded); nothing deviated, so the next turn that repeats takes it up again and skims
    from its third turn, instead of waiting STEADY_AFTER + SKIM_AFTER turns."""
    _skim_constants(monkeypatch)
    monkeypatch.setattr(fold, "STEADY_AFTER", 40)
    monkeypatch.setattr(fold, "SKIM_AFTER", 40)
    findings, skimmed, trace = _skim_run({150: "snapshot"}, 300, True, monkeypatch)
    plain, _, plain_trace = _skim_run({}, 300, True, monkeypatch)
    assert findings == plain and trace == plain_trace
    assert {153, 160, 170} & skimmed and len([t for t in range(151, 200) if t in skimmed]) > 30


# the clean loop's sampled and skimmed turns by the fold's constants: the same loop, run once per
# test process instead of once per test (the schedule is a fixed function of the constants)
_CLEAN_TURNS: dict[tuple, tuple[list[int], list[int]]] = {}


def _sampled_and_skimmed(monkeypatch) -> tuple[list[int], list[int]]:
    constants = tuple(getattr(fold, name) for name in (
        "FOLD_AFTER", "MAX_PERIOD", "STEADY_AFTER", "SKIM_AFTER", "SKIM_EVERY", "STEADY_HOOKS"))
    if constants not in _CLEAN_TURNS:
        _, skimmed, _ = _skim_run({}, 160, True, monkeypatch)
        first = min(skimmed)
        sampled = [i for i in range(first, 160) if i not in skimmed]
        _CLEAN_TURNS[constants] = (sampled, sorted(skimmed))
    sampled, skimmed = _CLEAN_TURNS[constants]
    return list(sampled), list(skimmed)


@pytest.mark.parametrize("what", SHAPE)
def test_a_deviation_that_changes_the_turn_is_found_on_any_turn(what, monkeypatch):
    _skim_constants(monkeypatch)
    sampled, skimmed = _sampled_and_skimmed(monkeypatch)
    for at in (skimmed[10], sampled[3]):
        plan = {at: what, at + 30: what}
        with_skim, _, trace = _skim_run(plan, 200, True, monkeypatch)
        without, _, trace_without = _skim_run(plan, 200, False, monkeypatch)
        assert with_skim == without, (what, at)
        assert trace == trace_without, (what, at)  # the ledger caught up: the same events


@pytest.mark.parametrize("what", READS)
def test_a_deviation_on_a_sampled_turn_is_found_and_one_on_a_skimmed_turn_adds_nothing(
        what, monkeypatch):
    _skim_constants(monkeypatch)
    sampled, skimmed = _sampled_and_skimmed(monkeypatch)
    plan = {sampled[3]: what}
    with_skim, _, _ = _skim_run(plan, 200, True, monkeypatch)
    without, _, _ = _skim_run(plan, 200, False, monkeypatch)
    assert with_skim == without, what
    plan = {skimmed[10]: what}
    with_skim, _, _ = _skim_run(plan, 200, True, monkeypatch)
    without, _, _ = _skim_run(plan, 200, False, monkeypatch)
    assert set(with_skim) <= set(without), what  # missed at most, never a finding of its own


def _edit_every_turn(through_data: bool, turns: int) -> None:
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(6, 4), torch.randn(6, 1)
    for _ in range(turns):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            (p.grad.data if through_data else p.grad).zero_()
        opt.step()


@pytest.mark.parametrize("through_data", [False, True])
def test_a_loop_that_edits_its_grads_every_turn_is_judged_alike_with_the_skim(monkeypatch,
                                                                              through_data):
    """A backward is skimmed only when its turn's step is on the straight-line path too: a
    skimmed backward's grads are caught up unread, which would hide the edit before a step
    that goes the full path (every step of this loop: its grads are edited)."""
    from graddoctor.rules.engine import analyze

    _skim_constants(monkeypatch)
    found = {}
    for skim in (True, False):
        monkeypatch.setattr(fold, "SKIM", skim)
        rec = Recorder(step_budget=None, finder=LocationFinder())
        with Instrumentation(rec):
            _edit_every_turn(through_data, 120)
        findings, errors = analyze(rec.trace)
        assert not errors
        found[skim] = [(f.rule, f.location, f.step) for f in findings]
    assert found[True] == found[False]
    assert "grads-cleared-before-step" in [rule for rule, _, _ in found[True]]


@pytest.mark.parametrize("plan", [{}, {60: "closure", 61: "closure", 90: "closure"},
                                  {70: "no_step", 100: "second_backward"}])
def test_the_updates_are_numbered_alike_with_skimmed_stretches_counted_afterwards(plan, monkeypatch):
    """``Divergence`` is told only the first skimmed update of each stretch and counts the
    others from ``Progress.stepped`` when the stretch ends (a sampled update, or a closure
    step): each optimizer's updates keep the numbers they get when every update is observed."""
    _skim_constants(monkeypatch)
    counts = {}
    for skim in (True, False):
        monkeypatch.setattr(fold, "SKIM", skim)
        rec = Recorder(step_budget=None, finder=LocationFinder())
        with Instrumentation(rec) as instrumentation:
            _loop(rec, plan, 200, 5)
            divergence = instrumentation.optimizers._divergence
            told = dict(divergence.skimming)
            for opt in list(told):
                divergence.settle(opt)
            counts[skim] = ({opt: state[0] for opt, state in divergence._state.items()}, told)
    assert counts[True][0] == counts[False][0] and counts[True][0][0] > 150
    assert not counts[False][1]


def test_the_step_counting_watchers_leave_the_step_topic():
    """Watchers that only count steps while they have nothing else to do are off ``STEPPED``
    (``Progress.stepped`` counts for them): the DDP checksums without a DDP module or a
    process group of several ranks; the anchor and same-value watchers once done."""
    from graddoctor.instrument import anchors, samevalue
    from graddoctor.instrument.topics import DESCRIBE_LOSS, STEPPED
    rec = Recorder(step_budget=None, finder=LocationFinder())
    with Instrumentation(rec):
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(max(anchors._SEEN, samevalue._SEEN) + 2):
            optimizer.zero_grad()
            model(torch.ones(4, 3)).sum().backward()
            optimizer.step()
        stepped = {getattr(s, "__qualname__", "") for s in rec.subscribers(STEPPED).now}
        losses = {getattr(s, "__qualname__", "") for s in rec.subscribers(DESCRIBE_LOSS).now}
        assert not {"DDPWatcher.after_step", "AnchorAliasWatcher.after_step",
                    "SameValueWatcher.after_step"} & stepped, stepped
        assert not {"AnchorAliasWatcher.describe_loss", "SameValueWatcher.describe_loss"} & losses
        assert rec.progress.stepped(rec.optimizer_id(optimizer)) == max(anchors._SEEN,
                                                                         samevalue._SEEN) + 2


# -- the skim of a loop that clips its gradients every turn: the clip's reads before and after
# it skipped on skimmed turns, the step's norm pass skipped as the clip's finite total allows
CLIP_SHAPE = ("skip_zero_grad", "second_backward", "other_site", "clip", "no_step", "snapshot",
              "new_param", "retain", "closure", "clip_limit", "clip_subset", "clip_generator")


def _clip_turns(monkeypatch) -> tuple[list[int], list[int]]:
    _, skimmed, _ = _skim_run({}, 160, True, monkeypatch, clip_every=True)
    first = min(skimmed)
    return [i for i in range(first, 160) if i not in skimmed], sorted(skimmed)


def test_a_loop_that_clips_every_turn_skims_and_changes_no_finding_nor_event(monkeypatch):
    _skim_constants(monkeypatch)
    with_skim, skimmed, trace = _skim_run({}, 300, True, monkeypatch, clip_every=True)
    without, none, trace_without = _skim_run({}, 300, False, monkeypatch, clip_every=True)
    assert not none
    assert len(skimmed) > 200  # three turns of four: the clip and the step skimmed
    assert with_skim == without
    assert trace == trace_without  # the clip's total norm read on skimmed turns too


@pytest.mark.parametrize("what", CLIP_SHAPE)
def test_a_deviation_of_a_clip_loop_that_changes_the_turn_is_found_on_any_turn(what, monkeypatch):
    _skim_constants(monkeypatch)
    sampled, skimmed = _clip_turns(monkeypatch)
    for at in (skimmed[10], sampled[3]):
        plan = {at: what, at + 30: what}
        with_skim, _, trace = _skim_run(plan, 200, True, monkeypatch, clip_every=True)
        without, _, trace_without = _skim_run(plan, 200, False, monkeypatch, clip_every=True)
        assert with_skim == without, (what, at)
        assert trace == trace_without, (what, at)


@pytest.mark.parametrize("what", READS)
def test_a_deviation_of_a_clip_loop_on_a_sampled_turn_is_found(what, monkeypatch):
    """As in a loop without a clip; and a NaN on a skimmed turn is found as well: the clip's
    total (read on skimmed turns too) is not finite, which ends the steady state before the
    step, whose norm pass then reports it."""
    _skim_constants(monkeypatch)
    sampled, skimmed = _clip_turns(monkeypatch)
    plan = {sampled[3]: what}
    with_skim, _, _ = _skim_run(plan, 200, True, monkeypatch, clip_every=True)
    without, _, _ = _skim_run(plan, 200, False, monkeypatch, clip_every=True)
    assert with_skim == without, what
    plan = {skimmed[10]: what}
    with_skim, _, _ = _skim_run(plan, 200, True, monkeypatch, clip_every=True)
    without, _, _ = _skim_run(plan, 200, False, monkeypatch, clip_every=True)
    if what == "nan":
        assert with_skim == without and with_skim
    assert set(with_skim) <= set(without), what


@pytest.mark.parametrize("plan", [{}, {60: "clip_limit", 150: "nan"}])
def test_a_loop_that_clips_by_value_skims_and_changes_no_finding_nor_event(plan, monkeypatch):
    """``clip_grad_value_`` vouches nothing (the step measures its norms): its clip skims with
    the turn, the step as in a loop without a clip (its last sampled norms)."""
    _skim_constants(monkeypatch)
    with_skim, skimmed, trace = _skim_run(plan, 200, True, monkeypatch, clip_every="value")
    without, none, trace_without = _skim_run(plan, 200, False, monkeypatch, clip_every="value")
    assert not none and len(skimmed) > 100
    assert set(with_skim) <= set(without)
    if not plan:
        assert with_skim == without and trace == trace_without


# -- a routed loop (a mixture of experts): each turn's top-k routing picks which experts get a
# gradient, so its backward's ``fresh``, its clip's ``with_grad`` and its step's ``without_grad``
# change from turn to turn. Such turns are not copies of one another (the rules read those lists:
# an expert never routed is a parameter without a gradient), so they fold only where the routing
# repeats, and take the steady path and the skim only where it repeats every turn.
def _routed_loop(turns: int, routing: str) -> None:
    torch.manual_seed(7)
    experts = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(6))
    params = list(experts.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    x = torch.randn(8, 4)
    draw = random.Random(11)
    for i in range(turns):
        # the last expert is never routed: its parameters never get a gradient (a finding)
        chosen = (draw.sample(range(5), 2) if routing == "random" else
                  [i % 5, (i + 1) % 5] if routing == "period5" else [0, 3])
        opt.zero_grad()
        out = sum(experts[e](x) for e in sorted(chosen))
        out.pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()


@pytest.mark.parametrize("routing", ["random", "period5", "fixed"])
def test_a_routed_loop_is_judged_alike_whatever_the_folding_takes(routing, monkeypatch):
    """With the starts scaled down, a routed loop gives the same findings and trace with the
    skim and the straight-line hooks on or off, and its trace folded as hard as the folder can
    fold it gives the same findings: random routing never takes the steady path (no two turns
    alike), routing that repeats every fifth turn folds with period 5 but takes no steady path
    (period 1 only), routing that never changes takes it and skims."""
    from graddoctor.analysis import Analysis
    from graddoctor.rules.engine import analyze
    from rule_traces import fold_hard

    _skim_constants(monkeypatch)
    runs = {}
    for hooks, skim in ((True, True), (True, False), (False, False)):
        monkeypatch.setattr(fold, "STEADY_HOOKS", hooks)
        monkeypatch.setattr(fold, "SKIM", skim)
        taken = [0]
        original = fold.Folder.steady_take

        def counting(self, *args, original=original, taken=taken):
            ok = original(self, *args)
            taken[0] += ok
            return ok

        monkeypatch.setattr(fold.Folder, "steady_take", counting)
        rec = Recorder(step_budget=None, finder=LocationFinder())
        with Instrumentation(rec):
            _routed_loop(150, routing)
        monkeypatch.setattr(fold.Folder, "steady_take", original)
        assert rec.internal_errors == 0
        findings, errors = analyze(rec.trace)
        assert not errors
        hard, errors = analyze(Analysis(fold_hard(rec.trace)))
        assert not errors
        key = [(f.rule, f.message, f.location, f.step) for f in findings]
        assert [(f.rule, f.message, f.location, f.step) for f in hard] == key
        events = _unsampled(rec.trace.dumps())
        for event in events:  # a module's number there is not the same from run to run
            if event["kind"].startswith("idle_"):
                event["data"].pop("mid", None)
        runs[hooks, skim] = key, events, taken[0]
    found, trace, taken = runs[True, True]
    assert runs[True, False][0] == runs[False, False][0] == found
    assert runs[True, False][1] == runs[False, False][1]
    if routing == "fixed":
        assert taken > 50
    else:
        assert taken == 0 and trace == runs[False, False][1]
    assert "param-without-grad" in [rule for rule, *_ in found]  # the expert never routed
