"""The per-backward graph walk and the per-step grad-norm summary (kept lean for speed), and the
overhead benchmark's suspend/resume of the instrumentation (its A/B toggle)."""

import importlib.util
import math
import os

import torch
from torch import nn

from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.backward import _leaves
from graddoctor.instrument.optim import grad_norms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ids(tensors):
    return [id(t) for t in tensors]


def test_graph_walk_finds_each_leaf_once_params_and_inputs():
    torch.manual_seed(0)
    shared = nn.Linear(3, 3)
    frozen = nn.Linear(3, 3).requires_grad_(False)
    x = torch.randn(2, 3, requires_grad=True)  # an FGSM-style input leaf
    loss = shared(shared(frozen(x))).sum() + (x * 2).sum()
    leaves = _leaves(loss, None)
    assert sorted(map(id, leaves)) == sorted(map(id, [shared.weight, shared.bias, x]))
    assert len(_leaves([loss, loss * 2], None)) == 3  # several roots, shared graph
    assert _ids(_leaves(shared.weight.sum(), [shared.bias])) == _ids([shared.bias])  # inputs= wins


def test_graph_walk_on_a_leaf_itself():
    p = nn.Parameter(torch.ones(2))
    assert _ids(_leaves(p, None)) == _ids([p])
    assert _leaves(torch.ones(2), None) == []  # nothing requires grad


def test_grad_norms_mixed_dtypes_nonfinite_and_missing_grads():
    rec = Recorder(step_budget=None)
    a = nn.Parameter(torch.zeros(2))
    b = nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
    c = nn.Parameter(torch.zeros(2))
    d = nn.Parameter(torch.zeros(1))
    a.grad = torch.tensor([3.0, 4.0])
    b.grad = torch.tensor([6.0, 8.0], dtype=torch.bfloat16)
    d.grad = torch.tensor([float("nan")])
    pids = [rec.track(t) for t in (a, b, c, d)]
    got_pids, norms = grad_norms(rec, pids)
    assert got_pids == [pids[0], pids[1], pids[3]]  # c has no grad
    assert norms[:2] == [5.0, 10.0] and math.isnan(norms[2])
    assert all(type(n) is float for n in norms)


def _overhead_module():
    spec = importlib.util.spec_from_file_location("gd_overhead", os.path.join(ROOT, "benchmarks", "overhead.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_suspend_takes_every_patch_out_and_back():
    ob = _overhead_module()
    original_backward = torch.Tensor.backward
    rec = Recorder(step_budget=None)
    instrumentation = Instrumentation(rec)
    with instrumentation:
        patched = {(id(owner), name): owner.__dict__[name]
                   for kind, owner, name, _ in instrumentation.patcher._undo if kind == "attr"}
        assert torch.Tensor.backward is not original_backward
        with ob.suspended(instrumentation):
            assert torch.Tensor.backward is original_backward
            for kind, owner, name, old in instrumentation.patcher._undo:
                if kind == "attr":
                    assert owner.__dict__.get(name, None) is not patched[(id(owner), name)]
            plain = ob.build_mlp()
            plain.step()  # nothing of it may reach the recorder
        assert len(rec.trace) == 0 and rec.tracked_pids() == []
        for kind, owner, name, _ in instrumentation.patcher._undo:
            if kind == "attr":
                assert owner.__dict__[name] is patched[(id(owner), name)]
        instr = ob.build_mlp()
        instr.step()
        kinds = {e.kind for e in rec.trace}
        assert {"optimizer_init", "backward", "clear", "step_begin", "step"} <= kinds
        assert len(rec.tracked_pids()) == 20  # the instrumented session's own parameters only
    assert torch.Tensor.backward is original_backward


def test_deferred_device_values_are_read_once_at_the_end():
    import torch

    from graddoctor import events as ev
    from graddoctor.instrument import Instrumentation, Recorder
    from graddoctor.instrument.recorder import Deferred

    rec = Recorder(None)
    with Instrumentation(rec):
        event = rec.emit(ev.scaler_update(scaler=0, enabled=True, scale=Deferred(torch.tensor(1024.0))))
        assert isinstance(event["scale"], Deferred)  # nothing read while the script runs
    assert rec.trace.events[event.seq]["scale"] == 1024.0  # the final trace holds the value
    assert isinstance(event["scale"], Deferred)  # in a new event: the recorded one is unchanged


def test_the_hot_paths_script_runs_on_the_current_instrumentation():
    """benchmarks/hot_paths.py calls watcher internals directly: keep it in step with them."""
    from conftest import run_python

    result = run_python(os.path.join(ROOT, "benchmarks", "hot_paths.py"), "--only", "mlp",
                        "--steps", "10", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for piece in ("graph walk", "grads before + after a backward", "step pass", "grad_norms",
                  "total graddoctor"):
        assert piece in result.stdout


def test_grad_norms_of_grads_with_a_graph_build_no_graph_and_stay_floats():
    """``backward(create_graph=True)`` leaves grads that require grad: the norms are read under
    no_grad (no graph hangs off them) and are the values the batched path gives."""
    rec = Recorder(step_budget=None)
    w = nn.Parameter(torch.tensor([1.0, 2.0]))
    (w ** 3).sum().backward(create_graph=True)
    assert w.grad.requires_grad
    pid = rec.track(w)
    _, norms = grad_norms(rec, [pid])
    assert norms == [torch.stack(torch._foreach_norm([w.grad.detach()])).tolist()[0]]
    assert type(norms[0]) is float


def test_grad_norms_on_the_cpu_equal_the_batched_read():
    torch.manual_seed(0)
    rec = Recorder(step_budget=None)
    params = [nn.Parameter(torch.zeros(n, dtype=dtype)) for n, dtype in
              ((7, torch.float32), (3, torch.float64), (5, torch.bfloat16), (4, torch.float16))]
    for p in params:
        p.grad = torch.randn(p.shape).to(p.dtype)
    pids = [rec.track(p) for p in params]
    _, norms = grad_norms(rec, pids)
    assert norms == torch.stack(torch._foreach_norm([p.grad for p in params])).tolist()


def test_a_location_is_cached_per_instruction_not_per_function():
    """Two calls on different lines of one function, and one line reached again, each get
    their own line (the cache is keyed by the code object and the instruction)."""
    from graddoctor.location import LocationFinder

    finder = LocationFinder()

    def where():
        return finder.here(2)

    def two_calls():
        first = where()
        second = where()
        return first, second

    seen = [two_calls() for _ in range(3)]
    first, second = seen[0]
    assert second.line == first.line + 1
    assert all(pair == seen[0] for pair in seen)
    assert finder.here(1).line != first.line


def test_an_event_put_in_the_trace_is_the_event_its_constructor_makes():
    from graddoctor import events as ev
    from graddoctor.trace import Event, Location, Trace

    trace = Trace()
    loc = Location("train.py", 3, "main")
    put = trace.put(ev.step(opt=0, without_grad=[1]), loc)
    assert put == Event(0, "step", loc, ev.step(opt=0, without_grad=[1])[1])
    assert type(put.data).__name__ == "mappingproxy" and trace.next_seq == 1
    try:
        put.seq = 5
    except AttributeError:
        pass
    else:
        raise AssertionError("an event must stay frozen")


def test_clear_events_keep_the_params_they_cleared_when_a_group_is_added_later():
    """A zero_grad's event holds its optimizer's pid list without a copy: adding a param group
    afterwards gives the optimizer a new list, and the earlier events stay as they were."""
    rec = Recorder(step_budget=None)
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    with Instrumentation(rec):
        opt = torch.optim.SGD(first.parameters(), lr=0.1)
        opt.zero_grad()
        opt.add_param_group({"params": list(second.parameters())})
        opt.zero_grad()
    clears = [e for e in rec.trace if e.kind == "clear"]
    assert [len(e["params"]) for e in clears] == [2, 4]
    assert clears[1]["params"][:2] == clears[0]["params"]
    assert rec.opt_params[clears[0]["opt"]] == clears[1]["params"]

