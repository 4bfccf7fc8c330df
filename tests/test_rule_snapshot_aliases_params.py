"""snapshot-aliases-params (GD125): hand-written traces, the source reading that tells a move to
the host (a copy on a GPU) apart, and the ``snapshot_alias`` events the snapshot watcher
(instrument/snapshots.py) records."""

from __future__ import annotations

import copy
import gc
import sys

import torch

from graddoctor import events as ev
from graddoctor.analysis.source import moves_to_host
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import P, builder, findings, only

SLUG = "snapshot-aliases-params"


def _run(t, via="load_state_dict", taken_line=3, steps=3, params=P, at=20, restores=1):
    """An optimizer stepped ``steps`` times after a snapshot taken at ``taken_line``, then the
    snapshot restored (or saved) at line ``at``."""
    for _ in range(steps):
        t.backward(fresh=P, line=8)
        t.step(line=9)
    for _ in range(restores):
        t.put(ev.snapshot_alias(via=via, taken=[t.path, taken_line, "<module>"], params=list(params),
                                tensors=len(params), total=len(params), steps=steps), line=at)
    return t


def test_a_restored_snapshot_is_a_warning_at_the_state_dict_call():
    f = only(_run(builder()), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 3
    assert "load_state_dict(...) at line 20" in f.message and "3 optimizer steps" in f.message
    assert [r.location.line for r in f.related] == [20]
    assert f.evidence["steps"] == 3 and f.evidence["via"] == "load_state_dict"
    assert "copy.deepcopy(model.state_dict())" in f.fix  # the source is not readable: "model"


def test_a_saved_snapshot_names_the_save():
    f = only(_run(builder(), via="torch.save", steps=1), SLUG)
    assert "torch.save(...) at line 20" in f.message and "1 optimizer step " in f.message


def test_one_finding_per_snapshot_line():
    assert len(findings(_run(builder(), restores=3), SLUG)) == 1


def test_silent_without_steps_or_stepped_parameters():
    assert findings(_run(builder(), steps=0), SLUG) == []
    assert findings(_run(builder(), params=[]), SLUG) == []
    assert findings(builder(), SLUG) == []


def _script(tmp_path, text: str) -> TraceBuilder:
    path = tmp_path / "train.py"
    path.write_text(text)
    return TraceBuilder(path=str(path))


def test_a_move_to_the_host_is_a_copy_on_a_gpu(tmp_path):
    for line in ("best = {k: v.cpu() for k, v in model.state_dict().items()}",
                 "best = {k: v.to('cpu') for k, v in model.state_dict().items()}",
                 "best = {k: v.to(device=torch.device('cpu')) for k, v in model.state_dict().items()}"):
        t = _script(tmp_path, f"import torch\nmodel = None\n{line}\n")
        t.optimizer(0, P, line=1)
        assert findings(_run(t), SLUG) == [], line
    for line in ("best = {k: v for k, v in model.state_dict().items()}",
                 "best = {k: v.to(device) for k, v in model.state_dict().items()}",  # the model's device
                 "best = dict(model.state_dict())"):
        t = _script(tmp_path, f"import torch\nmodel = None\n{line}\n")
        t.optimizer(0, P, line=1)
        f = only(_run(t), SLUG)
        assert "copy.deepcopy(model.state_dict())" in f.fix, line


def test_moves_to_host_reads_the_statement_and_the_next_use_of_its_name(tmp_path):
    path = tmp_path / "s.py"
    path.write_text(
        "state = model.state_dict()\n"                         # 1
        "other = 1\n"                                          # 2
        "best = {k: v.cpu() for k, v in state.items()}\n"      # 3
        "snap = model.state_dict()\n"                          # 4
        "snap = {k: v.cpu() for k, v in snap.items()}\n"       # 5: reads it, then rebinds it
        "kept = model.state_dict()\n"                          # 6
        "kept = None\n"                                        # 7
        "x = [v.cpu() for v in other]\n"                       # 8
        "best = {\n"                                           # 9
        "    k: v.to('cpu:0')\n"                               # 10
        "    for k, v in model.state_dict().items()\n"         # 11
        "}\n"                                                  # 12
        "if True:\n"                                           # 13
        "    inner = model.state_dict()\n")                    # 14
    assert moves_to_host(str(path), 1) is True
    assert moves_to_host(str(path), 4) is True
    assert moves_to_host(str(path), 6) is False  # rebound before any move
    assert moves_to_host(str(path), 11) is True  # the statement spans lines 9-12
    assert moves_to_host(str(path), 14) is False
    assert moves_to_host(str(tmp_path / "missing.py"), 1) is None


def test_the_watcher_records_snapshots_restored_or_saved_after_a_step(tmp_path):
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                                    torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        best = model.state_dict(); best_line = sys._getframe().f_lineno  # noqa: E702
        same = {k: v for k, v in model.state_dict().items()}; same_line = sys._getframe().f_lineno  # noqa: E702
        deep = copy.deepcopy(model.state_dict())
        cloned = {k: v.detach().clone() for k, v in model.state_dict().items()}
        kept = model.state_dict(keep_vars=True)
        for _ in range(2):
            model(torch.randn(4, 3)).sum().backward()
            optimizer.step()
        fresh = model.state_dict()
        assert all(torch.equal(fresh[k], best[k]) for k in fresh)  # the snapshot followed along
        model.load_state_dict(best); load_line = sys._getframe().f_lineno  # noqa: E702
        model.load_state_dict(deep)
        model.load_state_dict(cloned)
        model.load_state_dict(kept)
        model.load_state_dict(fresh)  # taken after the last step: the current weights
        torch.save({"model": same, "epoch": 2}, tmp_path / "best.pt"); save_line = sys._getframe().f_lineno  # noqa: E702
        torch.save(model.state_dict(), tmp_path / "now.pt")
        model.load_state_dict(torch.load(tmp_path / "now.pt"))
    events = [(e["via"], e["taken"][1], e.loc.line, e["params"], e["tensors"], e["total"], e["steps"])
              for e in rec.trace.of_kind("snapshot_alias")]
    params = sorted(rec.opt_params[0])
    assert len(params) == 6
    assert events == [("load_state_dict", best_line, load_line, params, 9, 9, 2),
                      ("torch.save", same_line, save_line, params, 9, 9, 2)]
    assert not rec.trace.of_kind("internal_error")
    # the wrappers returned what torch returns, and are gone
    assert isinstance(best, dict) and list(best) == list(fresh)
    assert torch.nn.Module.state_dict.__module__ == "torch.nn.modules.module"
    assert torch.save.__module__ == "torch.serialization"


def test_the_watcher_keeps_no_tensor_alive():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec) as inst:
        watcher = next(w for w in inst.watchers if type(w).__name__ == "SnapshotWatcher")
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        state = model.state_dict()  # its submodules' state_dict() calls are inside this one
        assert len(watcher._refs) == 4
        assert len({id(r.taken) for r in watcher._refs.values()}) == 1
        del state
        gc.collect()
        assert len(watcher._refs) == 0


# -- a snapshot restored after the loop, which the check does not reach ----------------------

_EARLY_STOPPING = (
    "import copy, torch\n"                                              # 1
    "best, best_state, last = 1e9, None, None\n"                        # 2
    "for epoch in range(100):\n"                                        # 3
    "    train_one_epoch()\n"                                           # 4
    "    if val < best:\n"                                              # 5
    "        best, best_state = val, model.state_dict()\n"              # 6
    "    last = model.state_dict()\n"                                   # 7
    "    if epoch % 5 == 0:\n"                                          # 8
    "        ckpt = model.state_dict()\n"                               # 9
    "model.load_state_dict(best_state)\n"                               # 10
    "torch.save(last, 'last.pt')\n"                                     # 11
    "torch.save(ckpt, 'ckpt.pt')\n")                                    # 12


def test_snapshot_restored_later_reads_a_snapshot_taken_in_an_if_of_a_loop(tmp_path):
    from graddoctor.analysis.source import snapshot_restored_later
    path = tmp_path / "s.py"
    path.write_text(_EARLY_STOPPING)
    assert snapshot_restored_later(str(path), 6, "best_state") == (10, "load_state_dict")
    assert snapshot_restored_later(str(path), 9, "ckpt") == (12, "torch.save")
    assert snapshot_restored_later(str(path), 7, "last") is None  # taken at every iteration
    assert snapshot_restored_later(str(path), 6, "best") is None  # bound there, never restored
    assert snapshot_restored_later(str(tmp_path / "missing.py"), 6, "best_state") is None


def _held(t, line, name="best_state", steps=2, params=P):
    for _ in range(steps):
        t.backward(fresh=P, line=4)
        t.step(line=4)
    t.put(ev.snapshot_held(name=name, params=list(params), steps=steps), line=line)
    return t


def test_a_held_snapshot_restored_after_the_loop_is_a_warning(tmp_path):
    t = _script(tmp_path, _EARLY_STOPPING)
    t.optimizer(0, P, line=1)
    f = only(_held(t, 6), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 6
    assert "`best_state`" in f.message and "load_state_dict(...) at line 10" in f.message
    assert f.fix.startswith("copy the tensors when taking it: best_state = copy.deepcopy(model.state_dict())")
    assert f.evidence["used_at"] == 10 and f.evidence["via"] == "load_state_dict"


def test_a_held_snapshot_is_silent_when_taken_every_iteration_or_never_restored(tmp_path):
    t = _script(tmp_path, _EARLY_STOPPING)
    t.optimizer(0, P, line=1)
    assert findings(_held(t, 7, name="last"), SLUG) == []
    t = _script(tmp_path, _EARLY_STOPPING)
    t.optimizer(0, P, line=1)
    assert findings(_held(t, 6, params=[]), SLUG) == []
    assert findings(_held(builder(), 6), SLUG) == []  # no readable source


def test_the_watcher_tells_a_snapshot_still_held_at_the_next_step():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        best = model.state_dict(); best_line = sys._getframe().f_lineno  # noqa: E702
        deep = copy.deepcopy(model.state_dict())
        used = model.state_dict()
        model.load_state_dict(used)  # given to a load before any step: used
        for _ in range(2):
            model(torch.randn(4, 3)).sum().backward()
            optimizer.step()
        assert deep is not None and best is not None
    held = [(e["name"], e.loc.line, e["steps"], len(e["params"])) for e in rec.trace.of_kind("snapshot_held")]
    assert held == [("best", best_line, 1, 4)]
    assert not rec.trace.of_kind("internal_error")


def test_snapshots_collected_from_one_model_are_a_warning_at_the_state_dict_call():
    t = builder()  # no source needed: the run saw the entries share storage
    t.optimizer(0, P, line=1)
    for _ in range(2):
        t.backward(fresh=P, line=4)
        t.step(line=4)
    t.put(ev.snapshot_held(name="states", params=list(P), steps=2, alike=3), line=9)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 9
    assert "collected in `states`" in f.message and "3 of its entries" in f.message
    assert f.evidence["via"] == "collected" and f.evidence["alike"] == 3
    assert "copy.deepcopy(model.state_dict())" in f.fix


def _local_state(model):
    return model.state_dict()


def test_the_watcher_tells_state_dicts_of_one_model_collected_in_a_list():
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
        copies = []
        states = []
        for _ in range(3):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model(torch.randn(4, 3)).sum().backward()
            optimizer.step()
            states.append(_local_state(model))  # the same model each time: no copy
            copies.append(copy.deepcopy(model.state_dict()))
        assert len(states) == 3 and len(copies) == 3
    held = [(e["name"], e["alike"]) for e in rec.trace.of_kind("snapshot_held")]
    assert held and all(name == "states" and alike >= 2 for name, alike in held)
    assert not rec.trace.of_kind("internal_error")
