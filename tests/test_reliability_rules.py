"""Robustness of the rules: random but well-formed event sequences (built like real traces:
optimizers before their steps, parameter events first or at the end, some calls without a
location) fed to every rule in ALL_RULES. None may crash; every finding is well-formed and
points at a real place (path + line >= 1) — ``location`` is None only where the documented
case applies: the event it points at had no frame in the user's code.

A rule that reads a new event kind should add a generator for it to ``EVENT_KINDS``.
"""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graddoctor.analysis import Analysis
from graddoctor.rules.engine import analyze
from graddoctor.findings import Finding, Related, Severity
from graddoctor.jsonsafe import json_safe
from graddoctor.report.json_format import finding_to_dict
from graddoctor.rules import ALL_RULES
from graddoctor.trace import Location, Trace, TraceBuilder

floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.none())


class World:
    """What a generated trace has declared so far, so that later events stay well-formed."""

    def __init__(self, draw, n_params: int, n_opts: int):
        self.draw = draw
        self.pids = list(range(n_params))
        self.dead = set(draw(st.lists(st.sampled_from(self.pids), unique=True, max_size=1)))
        self.live = [p for p in self.pids if p not in self.dead]  # the others get gradients
        self.n_opts = n_opts
        self.owned: dict[int, list[int]] = {}  # opt -> pids (after its optimizer_init)
        self.n_modules = draw(st.integers(0, 3))  # BatchNorm/dropout layers (mode events)
        self.freeze_seqs: list[int] = []  # seqs of freeze events so far

    def subset(self, pool=None, min_size=0):
        pool = self.pids if pool is None else pool
        if not pool:
            return []
        return self.draw(st.lists(st.sampled_from(pool), unique=True, min_size=min(min_size, len(pool)),
                                  max_size=len(pool)))

    def declared_opt(self):
        return self.draw(st.sampled_from(sorted(self.owned))) if self.owned else None


def gen_optimizer_init(w: World):
    if w.n_opts == 0:
        return None
    opt = w.draw(st.integers(0, w.n_opts - 1))  # again for the same opt: add_param_group
    params = w.subset(min_size=1)
    w.owned.setdefault(opt, []).extend(params)
    return "optimizer_init", {"opt": opt, "cls": w.draw(st.sampled_from(["SGD", "AdamW", "LBFGS"])),
                              "params": params}


def backward_data(w: World, fresh, accumulated, cleared_outside=(), scaled=None) -> dict:
    scaled = w.draw(st.booleans()) if scaled is None else scaled
    batch = w.draw(st.one_of(st.none(), st.tuples(*[st.integers(0, 3)] * 3).map(list)))
    return {"fresh": list(fresh), "accumulated": list(accumulated),
            "cleared_outside": list(cleared_outside), "extra_leaves": w.draw(st.integers(0, 2)),
            "in_step": w.declared_opt() if w.draw(st.integers(0, 4)) == 0 else None,
            "scaled": scaled, "scale": w.draw(floats) if scaled else None,
            "loss_scale_factor": w.draw(st.sampled_from([None, 1.0, 0.5, 0.25, 0.125])),
            "loss_terms": w.draw(st.one_of(st.none(), st.lists(
                st.sampled_from(["mean", "sum", "none", None]), max_size=3))),
            "scaler": 0 if scaled else None, "scaler_enabled": w.draw(st.booleans()) if scaled else None,
            "batch": batch}


def gen_backward(w: World):
    states = {pid: w.draw(st.sampled_from(["none", "fresh", "accumulated", "cleared_outside"]))
              for pid in w.live}
    return "backward", backward_data(w, *([p for p, s in states.items() if s == k]
                                          for k in ("fresh", "accumulated", "cleared_outside")))


def gen_clear(w: World):
    opt = w.declared_opt() if w.draw(st.booleans()) else None
    pool = w.owned.get(opt, w.pids) if opt is not None else w.pids
    return "clear", {"via": "optimizer.zero_grad" if opt is not None else "module.zero_grad",
                     "opt": opt, "set_to_none": w.draw(st.booleans()),
                     "params": w.subset(list(dict.fromkeys(pool)))}


def gen_step(w: World):
    """step_begin + step of a declared optimizer (returned as two events)."""
    opt = w.declared_opt()
    return None if opt is None else gen_step_of(w, opt)


def gen_step_of(w: World, opt: int):
    owned = list(dict.fromkeys(w.owned[opt]))
    closure = w.draw(st.booleans())
    norm_pids = [] if closure else w.subset(owned)
    norms = [abs(w.draw(st.floats(allow_nan=True, allow_infinity=True))) for _ in norm_pids]
    begin = ("step_begin", {"opt": opt, "closure": closure, "norm_pids": norm_pids, "norms": norms,
                            "nonfinite": [p for p, n in zip(norm_pids, norms) if not math.isfinite(n)]})
    step = ("step", {"opt": opt, "closure": closure, "skipped": w.draw(st.booleans()),
                     "without_grad": w.subset(owned)})
    return [begin, step]


def gen_iteration(w: World):
    """A loop body like users write (right or wrong): maybe a clear of all or part of an
    optimizer's parameters, 1-3 backward calls, a step."""
    opt = w.declared_opt()
    if opt is None:
        return None
    owned = list(dict.fromkeys(w.owned[opt]))
    cleared = set(owned if w.draw(st.booleans()) else w.subset(owned))
    events = []
    if cleared:
        events.append(("clear", {"via": "optimizer.zero_grad", "opt": opt, "set_to_none": True,
                                 "params": sorted(cleared)}))
    amp = w.draw(st.booleans())
    if w.n_modules and w.draw(st.booleans()):  # the model's forward, with gradients
        mids = w.subset(list(range(w.n_modules)), min_size=1)
        events.append(("mode_forward", {"training": w.draw(st.booleans()), "grad": True,
                                        "inference": False, "modules": mids, "grad_modules": mids,
                                        "calls": 1, "recalibrating": False}))
    for k in range(w.draw(st.integers(1, 3))):
        fresh = [p for p in sorted(cleared) if p not in w.dead] if k == 0 else []
        events.append(("backward", backward_data(
            w, fresh, [p for p in owned if p not in fresh and p not in w.dead], scaled=amp)))
    if amp and w.draw(st.booleans()):
        events.append(("unscale", {"scaler": 0, "opt": opt, "enabled": True, "implicit": False,
                                   "scale": 65536.0}))
    if w.draw(st.booleans()):
        events.append(gen_clip(w, owned))
    step = gen_step_of(w, opt)
    events.extend(step)
    if amp:
        skipped = step[-1][1]["skipped"]
        events.append(("scaler_step", {"scaler": 0, "opt": opt, "enabled": True, "fused": False,
                                       "skipped": skipped, "found_inf": skipped}))
        events.append(("scaler_update", {"scaler": 0, "enabled": True, "scale": w.draw(floats)}))
    if w.draw(st.integers(0, 3)) == 0:
        events.append(gen_scheduler_step(w))
    return events


def gen_clip(w: World, pool=None):
    params = w.subset(pool)
    return "clip", {
        "via": w.draw(st.sampled_from(["clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_"])),
        "params": params, "with_grad": w.subset(params), "untracked": w.draw(st.integers(0, 2)),
        "limit": w.draw(st.one_of(st.floats(0, 10), st.just(math.inf))), "norm_type": 2.0,
        "norm_only": w.draw(st.booleans()), "total_norm": w.draw(floats), "edited": w.subset(params),
        "spent": w.draw(st.sampled_from([True, False, None]))}


def gen_grad_edit(w: World):
    opt = w.declared_opt()
    return None if opt is None else ("grad_edit", {"opt": opt, "params": w.subset(w.owned[opt])})


def gen_scheduler_step(w: World):
    return "scheduler_step", {"sched": w.draw(st.integers(0, 1)),
                              "cls": w.draw(st.sampled_from(["StepLR", "ReduceLROnPlateau"])),
                              "opt": w.declared_opt()}


def gen_unscale(w: World):
    return "unscale", {"scaler": 0, "opt": w.declared_opt(), "enabled": w.draw(st.booleans()),
                       "implicit": w.draw(st.booleans()), "scale": w.draw(floats)}


def gen_mode_call(w: World):
    mode = w.draw(st.booleans())
    return ("train" if mode else "eval"), {
        "mode": mode, "leaf": w.draw(st.booleans()), "root": "Net", "frozen": w.draw(st.booleans()),
        "modules": w.subset(list(range(w.n_modules))), "calls": w.draw(st.integers(1, 3))}


def gen_mode_forward(w: World):
    mids = w.subset(list(range(w.n_modules)))
    grad = w.draw(st.booleans())
    return "mode_forward", {
        "training": w.draw(st.booleans()), "grad": grad, "inference": not grad and w.draw(st.booleans()),
        "modules": mids, "grad_modules": w.subset(mids) if grad else [],
        "calls": w.draw(st.integers(1, 3)), "recalibrating": w.draw(st.booleans())}


def gen_mode_module(w: World, mid: int):
    layer = w.draw(st.sampled_from(["batchnorm", "dropout"]))
    has_params = layer == "batchnorm" and w.draw(st.booleans())
    return "mode_module", {
        "mid": mid, "name": w.draw(st.sampled_from([f"bn{mid}", None])),
        "cls": "BatchNorm1d" if layer == "batchnorm" else "Dropout", "layer": layer,
        "has_params": has_params, "frozen": w.draw(st.booleans()), "owned": w.draw(st.booleans()),
        "trainable": w.draw(st.booleans()), "updated": w.draw(st.booleans()),
        "track_running_stats": w.draw(st.booleans()), "momentum": w.draw(st.sampled_from([0.1, None])),
        "p": 0.5 if layer == "dropout" else None,
        "freeze": w.draw(st.sampled_from([None, *w.freeze_seqs]))}


def gen_mode_state(w: World):  # a layer's state changes mid-run (frozen, owned, ...)
    return gen_mode_module(w, w.draw(st.integers(0, w.n_modules - 1))) if w.n_modules else None


def gen_mode_misc(w: World):
    kind = w.draw(st.sampled_from(["freeze", "bn_reset", "update_bn"]))
    if kind == "freeze":
        return "freeze", {"calls": w.draw(st.integers(1, 3))}
    if kind == "bn_reset":
        return "bn_reset", {"modules": w.subset(list(range(w.n_modules))),
                            "calls": w.draw(st.integers(1, 2))}
    return "update_bn", {}


def gen_epoch_start(w: World):
    real = w.draw(st.one_of(st.none(), st.integers(0, 50)))
    return "epoch_start", {"loader": w.draw(st.integers(0, 2)), "epoch": w.draw(st.integers(0, 5)),
                           "real_len": real, "replay_len": real}


def gen_internal_error(w: World):
    return "internal_error", {"where": "gradient hook", "error": "RuntimeError: x"}


def gen_unknown(w: World):  # rules ignore kinds they do not know
    return "some_future_kind", {"value": w.draw(st.integers())}


EVENT_KINDS = {
    "optimizer_init": gen_optimizer_init, "backward": gen_backward, "clear": gen_clear,
    "step": gen_step, "iteration": gen_iteration, "epoch_start": gen_epoch_start,
    "clip": gen_clip, "grad_edit": gen_grad_edit, "scheduler_step": gen_scheduler_step,
    "unscale": gen_unscale, "mode_call": gen_mode_call, "mode_forward": gen_mode_forward,
    "mode_state": gen_mode_state, "mode_misc": gen_mode_misc, "internal_error": gen_internal_error,
    "unknown": gen_unknown,
}


@st.composite
def traces(draw, located: bool = True) -> Trace:
    w = World(draw, n_params=draw(st.integers(1, 6)), n_opts=draw(st.integers(0, 3)))
    t = TraceBuilder(path=draw(st.sampled_from(["train.py", "src/my train.py", "träin.py"])))

    def params():
        for pid in w.pids:
            t.param(pid, name=draw(st.sampled_from([f"layer{pid}.weight", None])),
                    is_parameter=draw(st.booleans()), requires_grad=draw(st.booleans()))

    t.trace.add("run_start", None, script="train.py", argv=[], device="cpu", torch_version="x")
    for mid in range(w.n_modules):  # BatchNorm/dropout layers: at first sight
        kind, data = gen_mode_module(w, mid)
        t.trace.add(kind, None, **data)
    params_first = draw(st.booleans())
    if params_first:
        params()
    weights = st.sampled_from(["optimizer_init", "backward", "backward", "backward", "clear",
                               "clear", "step", "step", "iteration", "iteration", "iteration",
                               "epoch_start", "epoch_start", "internal_error", "unknown", "clip",
                               "grad_edit", "scheduler_step", "unscale", "mode_call", "mode_forward",
                               "mode_forward", "mode_state", "mode_misc"])
    for _ in range(draw(st.integers(0, 40))):
        made = EVENT_KINDS[draw(weights)](w)
        for kind, data in ([made] if isinstance(made, tuple) else made or []):
            if kind == "freeze":
                w.freeze_seqs.append(len(t.trace))
            if located or draw(st.integers(0, 3)):
                t.event(kind, **data)
            else:  # a call made from library code: no user frame
                t.trace.add(kind, None, **data)
    if not params_first:
        params()
    t.trace.add("run_end", None, status=draw(st.sampled_from(["completed", "step-limit", "crashed"])),
                steps=len(t.trace.of_kind("step")))
    return t.trace


def _valid_location(loc) -> bool:
    return (isinstance(loc, Location) and isinstance(loc.path, str) and bool(loc.path)
            and isinstance(loc.line, int) and not isinstance(loc.line, bool) and loc.line >= 1)


def _check_findings(trace: Trace, located: bool) -> None:
    for rule in ALL_RULES:
        findings = list(rule().check(Analysis(trace)))  # must not raise
        for f in findings:
            assert isinstance(f, Finding)
            assert (f.rule, f.code) == (rule.slug, rule.code)
            assert isinstance(f.severity, Severity)
            assert isinstance(f.message, str) and f.message.strip()
            if located:
                assert _valid_location(f.location), (rule.slug, f)
            else:
                assert f.location is None or _valid_location(f.location), (rule.slug, f)
            for r in f.related:
                assert isinstance(r, Related) and _valid_location(r.location) and r.note
            assert f.step is None or (isinstance(f.step, int) and f.step >= 1), f.step
            json.dumps(finding_to_dict(f))  # serialisable for the JSON report


SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(traces(located=True))
def test_rules_never_crash_and_always_point_at_a_line(trace):
    _check_findings(trace, located=True)


@SETTINGS
@given(traces(located=False))
def test_rules_survive_calls_without_a_location(trace):
    _check_findings(trace, located=False)


@settings(max_examples=100, deadline=None)
@given(traces(located=True))
def test_findings_survive_the_json_lines_round_trip(trace):
    """A trace written with --trace and read back gives the same findings, as the report shows
    them (rules are pure; JSON lines carry a non-finite number as the string "inf"/"nan")."""
    before, errors_before = analyze(trace)
    after, errors_after = analyze(Trace.loads(trace.dumps()))
    assert errors_before == errors_after == []

    def shown(findings):
        return json.dumps(json_safe([finding_to_dict(f) for f in findings]), allow_nan=False)

    assert shown(before) == shown(after)
