"""state-loaded-into-itself (GD140): what the load_state_dict wrapper reads of a state whose
tensors are the module's own (instrument/stateload.py), the source helper that names the alias
(analysis/source.py), and the rule over hand-written traces."""

from __future__ import annotations

import copy
import textwrap

from torch import nn

from graddoctor import events as ev
from graddoctor.analysis.source import self_load_alias
from graddoctor.findings import Severity
from graddoctor.instrument.stateload import loaded_into_itself
from rule_traces import builder, findings, only

SLUG = "state-loaded-into-itself"


def _net():
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def test_one_module_under_two_names_loads_its_own_tensors():
    online = _net()
    target = online
    assert loaded_into_itself(target, online.state_dict()) == {"cls": "Sequential", "params": 6}


def test_a_module_assembled_from_anothers_layers_loads_its_own_tensors():
    online, twin = _net(), _net()
    for i in range(3):
        twin[i] = online[i]
    assert loaded_into_itself(twin, online.state_dict())["params"] == 6


def test_copies_checkpoints_and_partly_shared_modules_are_not_reported():
    online = _net()
    assert loaded_into_itself(copy.deepcopy(online), online.state_dict()) is None
    assert loaded_into_itself(online, copy.deepcopy(online.state_dict())) is None
    assert loaded_into_itself(_net(), online.state_dict()) is None  # another constructor call
    twin = _net()
    twin[0] = online[0]  # one layer shared (tied), the others its own
    assert loaded_into_itself(twin, online.state_dict()) is None
    assert loaded_into_itself(online, {}) is None  # nothing named: nothing judged
    assert loaded_into_itself(online, [1, 2]) is None  # not a mapping: torch reports it


def test_the_alias_and_its_assignment_are_read_from_the_source(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch
        q = torch.nn.Linear(2, 2)
        tq = q
        for step in range(3):
            tq.load_state_dict(q.state_dict())
            q.load_state_dict(q.state_dict())
            tq.load_state_dict(state)
    """))
    assert self_load_alias(str(script), 5) == ("tq", "q", 3)
    assert self_load_alias(str(script), 6) is None  # one name: nothing to tell apart
    assert self_load_alias(str(script), 7) is None  # a state from a variable


def _trace(with_snapshot=False):
    t = builder()
    t.put(ev.state_self_load(cls="Net", params=4), 9)
    if with_snapshot:
        t.put(ev.snapshot_alias(via="load_state_dict", taken=None, params=[0, 1], tensors=2,
                                total=2, steps=3), 9)
    t.backward(fresh=[0, 1], line=11)
    t.step(line=12)
    return t


def test_the_rule_reports_the_load_as_a_warning():
    f = only(_trace(), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 9
    assert "copies the 4 parameters of Net onto themselves" in f.message
    assert "copy.deepcopy" in f.fix


def test_a_snapshot_restored_after_training_is_left_to_snapshot_aliases_params():
    assert findings(_trace(with_snapshot=True), SLUG) == []
