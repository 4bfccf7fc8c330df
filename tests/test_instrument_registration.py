"""What the model really registers and what moves between steps, in-process: the unregistered
containers found at the end of a run (named by their path, located at their assignment), the
non-parameter leaves followed only when they live across backwards, and the tensors no
optimizer owns whose values change between steps (fp16 master weights copied back)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.optim import MOVE_CHECKS


def run(fn, variables=None):
    rec = Recorder(step_budget=None)
    inst = Instrumentation(rec)
    with inst:
        result = fn()
        inst.namer.name_from(variables if variables is not None else {})
    return rec, result


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(3, 4)
        self.blocks = []  # assigned empty, filled below
        for _ in range(2):
            self.blocks.append(nn.Linear(4, 4))
        self.refs = [self.stem]  # a reference to a registered module

    def forward(self, x):
        x = self.stem(self.refs[0](torch.zeros(1, 3)) + x @ torch.zeros(3, 4)) if False else self.stem(x)
        for block in self.blocks:
            x = block(x)
        return x


def _train(model, steps=3):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(5, 3)).sum().backward()
        optimizer.step()


def test_a_plain_list_of_a_model_local_to_a_function_is_found_named_and_located():
    def script():
        _train(Blocks())  # the model dies with the function: found at the first step

    rec, _ = run(script)
    found, = [e for e in rec.trace if e.kind == "unregistered"]
    assert (found["owner"], found["attr"], found["holder"], found["name"]) == \
        ("Blocks", "blocks", "list", "model.blocks")  # _train's variable
    assert found.loc is not None and found.loc.function == "__init__"
    with open(__file__, encoding="utf-8") as f:
        assert "self.blocks = []" in f.readlines()[found.loc.line - 1]
    names = {e["name"] for e in rec.trace if e.kind == "param" and e["pid"] in found["pids"]}
    assert names == {"model.blocks[0].weight", "model.blocks[0].bias",
                     "model.blocks[1].weight", "model.blocks[1].bias"}


def test_nothing_is_looked_for_when_every_tensor_with_a_gradient_is_owned():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    rec, _ = run(lambda: _train(model), {"model": model})
    assert not [e for e in rec.trace if e.kind == "unregistered"]


def test_a_fresh_input_leaf_each_step_is_never_tracked_but_a_persistent_one_is():
    model = nn.Linear(3, 1)
    temperature = torch.ones((), requires_grad=True)

    def script():
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(40):
            x = torch.randn(4, 3, requires_grad=True)
            optimizer.zero_grad()
            (model(x) / temperature).sum().backward()
            optimizer.step()

    rec, _ = run(script, {"temperature": temperature})
    params = {e["pid"]: e for e in rec.trace if e.kind == "param"}
    plain = [e for e in params.values() if not e["is_parameter"]]
    assert [e["name"] for e in plain] == ["temperature"]
    backwards = [e for e in rec.trace if e.kind == "backward"]
    assert all(e["extra_leaves"] == 2 for e in backwards)  # still counted as extra leaves


def test_a_fresh_perturbation_each_step_scans_the_heap_a_bounded_number_of_times(monkeypatch):
    # PGD: a new leaf per update that lives across the attack's backwards is tracked each update;
    # naming it may not walk the whole heap each time (a tenth of a second or more per walk)
    import gc

    from graddoctor.instrument import names
    from graddoctor.instrument.naming import NEW_LEAF_SCANS

    scans = []
    real = gc.get_objects
    monkeypatch.setattr(names.gc, "get_objects", lambda *a: scans.append(1) or real(*a))
    model = nn.Linear(3, 2)

    def script():
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(12):
            x, y = torch.randn(4, 3), torch.randint(0, 2, (4,))
            delta = torch.zeros_like(x, requires_grad=True)
            for _ in range(2):
                F.cross_entropy(model(x + delta), y).backward()
                with torch.no_grad():
                    delta += 0.01 * delta.grad.sign()
                delta.grad = None
            optimizer.zero_grad()
            F.cross_entropy(model(x + delta.detach()), y).backward()
            optimizer.step()

    rec, _ = run(script, {"model": model})
    tracked_late = [e for e in rec.trace if e.kind == "param" and not e["is_parameter"]]
    assert len(tracked_late) >= 10  # each update's perturbation, tracked at its second backward
    assert len(scans) <= NEW_LEAF_SCANS + 2  # + the first step's naming and the end of the run


def _master_weights(copy, steps=4):
    model = nn.Linear(3, 2).to(torch.bfloat16)
    masters = [nn.Parameter(p.detach().float().clone()) for p in model.parameters()]
    optimizer = torch.optim.SGD(masters, lr=0.1)
    for _ in range(steps):
        model.zero_grad()
        model(torch.randn(4, 3, dtype=torch.bfloat16)).float().pow(2).sum().backward()
        for p, m in zip(model.parameters(), masters):
            m.grad = p.grad.float()
        optimizer.step()
        if copy:
            for p, m in zip(model.parameters(), masters):
                p.data.copy_(m.data)  # bypasses the version counter: the values tell


def test_values_copied_back_through_data_are_seen_moving_once():
    rec, _ = run(lambda: _master_weights(copy=True))
    moved = [pid for e in rec.trace if e.kind == "step_begin" for pid in e["moved"]]
    names = {e["pid"]: e["name"] for e in rec.trace if e.kind == "param"}
    assert sorted(names[pid].rsplit(".", 1)[-1] for pid in moved) == ["bias", "weight"]


def test_tensors_that_never_move_are_watched_a_bounded_number_of_steps():
    rec, _ = run(lambda: _master_weights(copy=False, steps=MOVE_CHECKS + 4))
    assert not [pid for e in rec.trace if e.kind == "step_begin" for pid in e["moved"]]


def test_parameters_built_once_an_optimizer_exists_are_recorded_where_they_are_built():
    from graddoctor.instrument import Instrumentation, Recorder

    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        body = torch.nn.Linear(3, 3)  # before any optimizer: how models are made
        optimizer = torch.optim.SGD(body.parameters(), lr=0.1)
        for _ in range(2):
            head = torch.nn.Linear(3, 1)  # built while training
            head(body(torch.randn(2, 3))).sum().backward()
            optimizer.step()
    created = rec.trace.of_kind("param_created")
    assert [(e["owner"], e["attr"], e["step"]) for e in created] == [
        ("Linear", "weight", 0), ("Linear", "bias", 0), ("Linear", "weight", 1), ("Linear", "bias", 1)]
    assert len({e.loc.line for e in created}) == 1
