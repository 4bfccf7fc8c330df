"""params-reset-every-step (GD123): hand-written traces, and the ``param_reset`` events the
reset watcher (instrument/resets.py) records."""

from __future__ import annotations

import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import P, builder, findings, only

SLUG = "params-reset-every-step"


def _loop(via="torch.nn.init.xavier_uniform_", steps=4, every=1, states=None):
    t = builder()
    for i in range(steps):
        if i % every == 0:
            state = None if states is None else states(i)
            t.put(ev.param_reset(via=via, params=[0], state=state), line=7)
        t.backward(fresh=P, line=8)
        t.step(line=9)
    return t


def test_a_reset_between_every_two_steps_is_an_error_at_the_resetting_call():
    f = only(_loop(), SLUG)
    assert f.severity is Severity.ERROR and f.location.line == 7
    assert "xavier_uniform_" in f.message and f.evidence["steps"] == 4


def test_silent_on_an_occasional_reset_and_too_few_steps():
    assert findings(_loop(every=2), SLUG) == []
    assert findings(_loop(steps=2), SLUG) == []


def test_load_state_dict_counts_only_when_it_loads_the_same_unchanged_state():
    assert only(_loop(via="load_state_dict", states=lambda i: [0, [1, 1]]), SLUG)
    assert findings(_loop(via="load_state_dict", states=lambda i: [i, [1, 1]]), SLUG) == []
    assert findings(_loop(via="load_state_dict", states=lambda i: [0, [i, 1]]), SLUG) == []


def test_the_watcher_records_owned_parameters_set_back_after_the_first_step():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = torch.nn.Linear(3, 1)
        copy = torch.nn.Linear(3, 1)  # no optimizer owns it
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        torch.nn.init.zeros_(model.bias)  # before any step: construction, not recorded
        for _ in range(2):
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
            torch.nn.init.zeros_(model.bias)
            torch.nn.init.zeros_(copy.bias)
            model.load_state_dict(saved)
    resets = [(e["via"], e["params"], e["state"]) for e in rec.trace.of_kind("param_reset")]
    bias = resets[0][1]
    assert resets == [("torch.nn.init.zeros_", bias, None),
                      ("load_state_dict", [0, 1], [0, [0, 0]]),
                      ("torch.nn.init.zeros_", bias, None),
                      ("load_state_dict", [0, 1], [0, [0, 0]])]
    assert torch.equal(model.weight.detach(), saved["weight"])  # the script's own calls ran


# -- hand edits between steps that take the update back (step_edit, instrument/undo.py) ---------

def _edited(back, share, home=None, home_share=None, steps=6):
    n = len(back)
    t = builder()
    for _ in range(steps):
        t.backward(fresh=P, line=8)
        t.step(line=9)
    t.put(ev.step_edit(opt=0, steps=list(range(1, n + 1)), back=back, share=share,
                       home=home if home is not None else [None] * n,
                       home_share=home_share if home_share is not None else [None] * n), line=9)
    return t


def test_an_edit_that_takes_every_update_back_is_an_error():
    f = only(_edited([1.0] * 4, [0.999] * 4, [1.0] * 4, [0.999] * 4), SLUG)
    assert f.severity is Severity.ERROR and "undone" in f.message
    assert f.evidence["via"] == "hand edit" and f.evidence["steps"] == 4


def test_an_edit_that_pulls_back_to_the_initial_values_by_a_fixed_share_is_a_warning():
    f = only(_edited([1.0, 0.95, 0.8, 0.55], [0.01, 0.012, 0.035, 0.04], [1.0] * 4, [0.01] * 4),
             SLUG)
    assert f.severity is Severity.WARNING and "1.00%" in f.message and "100 steps" in f.message


def test_silent_on_edits_that_keep_the_update():
    # WGAN clipping: a part of each update taken back, along the step (back == share ~ 0.7)
    assert findings(_edited([0.18, 0.77, 0.75, 0.78], [36.8, 0.77, 0.75, 0.78],
                            [0.18, -0.44, -0.45, -0.48], [36.8, 0.006, 0.005, 0.005]), SLUG) == []
    # Lookahead every 2 steps: some updates without an edit
    assert findings(_edited([None, 0.99, None, 0.99], [0.0, 0.95, 0.0, 0.95],
                            [None, 1.0, None, 0.97], [None, 0.5, None, 0.34]), SLUG) == []
    # half of each update taken back (federated averaging, Lookahead with k=1): it still trains
    assert findings(_edited([1.0] * 4, [0.5] * 4), SLUG) == []
    # too few updates measured
    assert findings(_edited([1.0] * 2, [1.0] * 2), SLUG) == []


def test_a_reset_reported_from_its_call_is_not_reported_again_from_the_values():
    t = _loop()
    t.put(ev.step_edit(opt=0, steps=[1, 2, 3, 4], back=[1.0] * 4, share=[1.0] * 4,
                       home=[1.0] * 4, home_share=[1.0] * 4), line=9)
    assert only(t, SLUG).location.line == 7


def _measure(edit, steps=6):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        start = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(8, 3)).pow(2).mean().backward()
            opt.step()
            with torch.no_grad():
                for p, p0 in zip(model.parameters(), start):
                    edit(p, p0)
    return [dict(e.data) for e in rec.trace.of_kind("step_edit")]


def test_the_watcher_measures_the_edits_of_the_first_updates_by_value():
    restored = _measure(lambda p, p0: p.data.copy_(p0))  # through .data: no version moves
    assert len(restored) == 1 and len(restored[0]["back"]) == 4
    assert all(b > 0.999 for b in restored[0]["back"]) and all(s > 0.999 for s in restored[0]["share"])
    halfway = _measure(lambda p, p0: p.lerp_(p0, 0.5))
    assert all(abs(s - 0.5) < 1e-6 for s in halfway[0]["home_share"])
    assert all(h > 0.999 for h in halfway[0]["home"])
    assert _measure(lambda p, p0: None) == []  # no edit: nothing recorded
    assert _measure(lambda p, p0: p.data.copy_(p0), steps=3) == []  # too few updates


def _redrawn(rows):
    t = _edited([0.0] * len(rows), [40.0] * len(rows), [0.0] * len(rows), [1.5] * len(rows))
    t.put(ev.step_edit(opt=0, steps=list(range(1, len(rows) + 1)), back=[0.0] * len(rows),
                       share=[40.0] * len(rows), home=[0.0] * len(rows),
                       home_share=[1.5] * len(rows), redrawn=rows), line=9)
    return t


def test_parameters_redrawn_after_every_update_are_an_error():
    f = only(_redrawn([[0, 1], [0], [0, 1], [0]]), SLUG)
    assert f.severity is Severity.ERROR and "unrelated" in f.message
    assert f.evidence["via"] == "redrawn by hand" and len(f.evidence["params"]) == 1


def test_silent_when_some_update_is_not_redrawn():
    # a head re-initialised every few steps (dead units revived, shrink and perturb)
    assert findings(_redrawn([[0], [], [0], [0]]), SLUG) == []


def _measure_wide(edit, steps=6):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(8, 64)).pow(2).mean().backward()
            opt.step()
            with torch.no_grad():
                edit(model)
    return [dict(e.data) for e in rec.trace.of_kind("step_edit")]


def test_the_watcher_tells_a_redraw_from_edits_that_keep_the_values():
    redrawn = _measure_wide(lambda m: m.weight.data.normal_(0, 0.1))
    assert len(redrawn) == 1 and all(len(r) == 1 for r in redrawn[0]["redrawn"])
    zeroed = _measure_wide(lambda m: m.bias.data.zero_())
    assert all(len(r) == 1 for r in zeroed[0]["redrawn"])
    kept = _measure_wide(lambda m: (m.weight.data.clamp_(-0.05, 0.05),
                                    m.weight.add_(torch.randn_like(m.weight) * 1e-3),
                                    m.weight.div_(m.weight.norm(dim=1, keepdim=True).clamp(min=0.2))))
    assert len(kept) == 1 and kept[0]["redrawn"] == [[]] * 4


# -- the model and its copy passed in each other's places to the script's EMA function --------

_EMA_SCRIPT = (
    "import torch\n"                                                           # 1
    "def ema_step(net, shadow, decay):\n"                                      # 2
    "    for s, p in zip(shadow.parameters(), net.parameters()):\n"            # 3
    "        s.mul_(decay).add_(p, alpha=1 - decay)\n"                         # 4
    "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"                        # 5
    "for step in range(4):\n"                                                  # 6
    "    opt.step()\n"                                                         # 7
    "    ema_step({}, 0.99)\n")                                                # 8


def _call_swapped_in(tmp_path, args: str):
    from graddoctor.analysis import Analysis
    from graddoctor.location import Location
    from graddoctor.rules.params_reset_every_step import _call_swapped
    from graddoctor.trace import TraceBuilder

    script = tmp_path / "train.py"
    script.write_text(_EMA_SCRIPT.format(args))
    t = TraceBuilder(str(script))
    t.optimizer(0, P, line=5, cls="SGD")
    a = Analysis(t.trace)
    return _call_swapped(a, 0, (Location(str(script), 4), "s.mul_(decay).add_(p, alpha=1 - decay)"))


def test_the_call_that_swaps_the_model_and_its_copy_is_the_line_to_change(tmp_path):
    found = _call_swapped_in(tmp_path, "shadow, net")
    assert found is not None and found[0].line == 8
    assert "ema_step(net, shadow, 0.99)" in found[2] and "ema_step(shadow, net, 0.99)" in found[1]


def test_a_call_in_the_function_s_order_or_with_other_names_is_not_swapped(tmp_path):
    assert _call_swapped_in(tmp_path, "net, shadow") is None
    assert _call_swapped_in(tmp_path, "teacher, net") is None  # one name only: not a swap of the two
