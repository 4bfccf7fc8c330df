"""ranks-same-batches (GD404): the ranks' batch fingerprints compared when their reports are
merged (pure: hand-built process facts and reports), and the DataLoader watcher's
batch_fingerprint events under a single-rank process group (in-process)."""

from __future__ import annotations

import inspect
import json
from dataclasses import replace

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from graddoctor.findings import ProcessFacts
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.dataloader import PRINT_BATCHES
from graddoctor.report.json_format import from_dict, to_dict
from graddoctor.report.merge import Part, merge, single
from graddoctor.report.model import Report, RunInfo
from graddoctor.rules import ALL_RULES, find_rule
from reliability_helpers import validate

RULE = find_rule("ranks-same-batches")
DDP = [{"opt": 0, "step": 1, "value": 3.0, "path": "train.py", "line": 20}]


def prints(values, sampler="RandomSampler", replicas=None, line=9):
    return tuple({"loader": 0, "epoch": 0, "index": i, "value": v, "sampler": sampler,
                  "replicas": replicas, "path": "train.py", "line": line}
                 for i, v in enumerate(values))


def facts(*per_rank, checksums=DDP, **kw):
    return [ProcessFacts(r, f"rank {r}", tuple(checksums), prints(values, **kw))
            for r, values in enumerate(per_rank)]


def found(processes):
    return list(RULE().check_processes(processes))


def test_every_rank_on_the_same_batches_is_a_warning_at_the_loader():
    [f] = found(facts([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]))
    assert (f.rule, f.code, f.severity.value, f.ranks) == ("ranks-same-batches", "GD404", "warning",
                                                           (0, 1))
    assert (f.location.path, f.location.line) == ("train.py", 9)
    assert "identical on rank 0–1" in f.message and "no DistributedSampler" in f.message
    assert "DistributedSampler(dataset)" in f.fix and "set_epoch" in f.fix
    assert f.evidence["batches"] == [[0, 0, 0], [0, 0, 1], [0, 0, 2]]
    [f4] = found(facts(*[[5.0, -1.0, 7.5]] * 4))
    assert f4.ranks == (0, 1, 2, 3) and "4 copies of one gradient" in f4.message


def test_a_distributed_sampler_told_one_rank_says_so():
    [f] = found(facts([1.0, 2.0], [1.0, 2.0], sampler="DistributedSampler", replicas=[1, 0]))
    assert "num_replicas=1, rank=0" in f.message
    assert "without num_replicas and rank" in f.fix
    [f] = found(facts([1.0, 2.0], [1.0, 2.0], sampler=None))
    assert "IterableDataset" in f.message and "shard the stream" in f.fix


def test_silent_when_the_ranks_draw_other_batches():
    # DistributedSampler, a Subset per rank, seeds per rank: other fingerprints
    assert found(facts([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])) == []
    # one batch in common is not enough to tell; two ranks alike among three are not every rank
    assert found(facts([1.0, 2.0, 3.0], [1.0, 9.0, 8.0])) == []
    assert found(facts([1.0, 2.0], [1.0, 2.0], [3.0, 4.0])) == []
    # last bits apart are the same batch; a real difference is not
    assert found(facts([1.0, 2.0], [1.0 * (1 + 1e-12), 2.0]))
    assert found(facts([1.0, 2.0], [1.0 * (1 + 1e-6), 2.0])) == []


def test_silent_on_constant_data_a_single_process_and_missing_values():
    assert found(facts([4.0, 4.0, 4.0], [4.0, 4.0, 4.0])) == []  # torch.ones batches
    assert found(facts([1.0, 2.0, 3.0])) == []  # one rank
    assert found(facts([None, "unread", float("nan")], [None, "unread", float("nan")])) == []
    main = [ProcessFacts(None, "main process", tuple(DDP), prints([1.0, 2.0])),
            ProcessFacts(0, "rank 0", tuple(DDP), prints([1.0, 2.0]))]
    assert found(main) == []  # a process without a rank is no rank to compare


def test_silent_unless_the_ranks_are_replicas_of_one_model():
    assert found(facts([1.0, 2.0], [1.0, 2.0], checksums=())) == []  # no step, or sharded params
    unwrapped = [{**DDP[0], "layout": 7, "initial": 5.0}]
    assert found(facts([1.0, 2.0], [1.0, 2.0], checksums=unwrapped))  # same shapes and start
    stages = [ProcessFacts(r, f"rank {r}", ({**DDP[0], "layout": 7 + r, "initial": 5.0},),
                           prints([1.0, 2.0])) for r in (0, 1)]
    seeded = [ProcessFacts(r, f"rank {r}", ({**DDP[0], "layout": 7, "initial": 5.0 + r},),
                           prints([1.0, 2.0])) for r in (0, 1)]
    assert found(stages) == [] and found(seeded) == []  # a pipeline; models seeded per rank


def _part(rank, values):
    report = Report(run=RunInfo(script="train.py", argv=[], status="step-limit", steps=10,
                                backward_calls=10, step_budget=10, torch_version="2.13.0+cpu"),
                    findings=[])
    report = replace(report, run=replace(report.run, checksums=list(DDP),
                                         batch_fingerprints=[dict(e) for e in prints(values)]))
    return Part(report, rank, f"rank {rank}")


def test_the_merge_compares_the_fingerprints_a_rank_report_carries():
    same = merge([_part(0, [1.0, 2.0, 3.0]), _part(1, [1.0, 2.0, 3.0])], world_size=2, rules=ALL_RULES)
    assert [(f.rule, f.ranks, f.location.line) for f in same.findings] == \
        [("ranks-same-batches", (0, 1), 9)]
    apart = merge([_part(0, [1.0, 2.0, 3.0]), _part(1, [3.0, 1.0, 2.0])], world_size=2,
                  rules=ALL_RULES)
    assert apart.findings == []
    skipped = merge([_part(0, [1.0, 2.0]), _part(1, [1.0, 2.0])], world_size=2,
                    rules=[r for r in ALL_RULES if r is not RULE])
    assert skipped.findings == []  # --ignore ranks-same-batches
    # a rank's own report keeps its fingerprints in JSON, so that graddoctor merge can compare them
    data = to_dict(single(_part(1, [1.0, 2.0]).report, 1, "rank 1", None, 2))
    validate(data)
    assert [e["value"] for e in data["run"]["batch_fingerprints"]] == [1.0, 2.0]
    back = from_dict(json.loads(json.dumps(data)))
    assert back.run.batch_fingerprints == data["run"]["batch_fingerprints"]


# -- the watcher: fingerprints of the first batches that feed a backward ----------------------

def _train(loader, backward_every=1, epochs=1):
    model = torch.nn.Linear(4, 1)
    for _ in range(epochs):
        for i, (x, y) in enumerate(loader):
            if i % backward_every == 0:
                torch.nn.functional.mse_loss(model(x), y).backward()


def _recorded(body, group=True):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    rec = Recorder(step_budget=None)
    if group:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with Instrumentation(rec):
            body(data)
    finally:
        if group:
            dist.destroy_process_group()
    return rec.trace


def test_the_first_batches_that_feed_a_backward_get_a_fingerprint():
    def body(data):
        loader = DataLoader(data, batch_size=8, shuffle=False)  # the construction: the location
        _train(DataLoader(data, batch_size=8), epochs=0)
        _train(loader, epochs=2)

    trace = _recorded(body)
    events = trace.of_kind("batch_fingerprint")
    assert len(events) == PRINT_BATCHES
    assert [(e["loader"], e["epoch"], e["index"]) for e in events] == [(0, 0, 0), (0, 0, 1), (0, 0, 2)]
    assert {(e["sampler"], e["replicas"]) for e in events} == {("SequentialSampler", None)}
    torch.manual_seed(0)
    x = torch.randn(64, 4)  # the data of body, seeded alike
    for e in events:  # the position-weighted sum of the batch's first tensor, read at the end
        batch = x[8 * e["index"]:8 * (e["index"] + 1)].reshape(-1).double()
        assert abs(e["value"] - float(batch @ torch.arange(1, 33, dtype=torch.float64))) < 1e-9
    line = events[0].loc.line
    assert all(e.loc.line == line for e in events)
    source, first = inspect.getsourcelines(body)
    assert "shuffle=False" in source[line - first]


def test_batches_that_feed_no_backward_and_runs_without_a_process_group_get_none():
    def validation_then_train(data):
        loader = DataLoader(data, batch_size=8)
        model = torch.nn.Linear(4, 1)
        with torch.no_grad():
            for x, _ in loader:  # validation: no backward
                model(x)
        _train(loader, backward_every=2)  # batches 0, 2, 4 feed a backward

    events = _recorded(validation_then_train).of_kind("batch_fingerprint")
    assert [(e["epoch"], e["index"]) for e in events] == [(1, 0), (1, 2)]  # the 4th: too late
    assert _recorded(lambda data: _train(DataLoader(data, batch_size=8)), group=False) \
        .of_kind("batch_fingerprint") == []
    sharded = _recorded(lambda data: _train(DataLoader(
        data, batch_size=8, sampler=torch.utils.data.DistributedSampler(data))))
    assert {(e["sampler"], tuple(e["replicas"])) for e in sharded.of_kind("batch_fingerprint")} \
        == {("DistributedSampler", (1, 0))}


def test_a_distributed_sampler_told_one_rank_points_at_its_rank_argument():
    # DistributedSampler(dataset, num_replicas=world, rank=0) at line 7: that argument is the bug
    per_rank = []
    for r in range(2):
        own = tuple({**p, "sampler_line": 7} for p in prints([1.0, 2.0, 3.0], sampler="DistributedSampler",
                                                              replicas=[2, 0]))
        per_rank.append(ProcessFacts(r, f"rank {r}", tuple(DDP), own))
    (f,) = found(per_rank)
    assert f.location.line == 7 and "rank=0 on every rank" in f.message


def test_without_a_given_rank_the_loader_stays_the_location():
    per_rank = []
    for r in range(2):
        own = tuple({**p, "sampler_line": 7} for p in prints([1.0, 2.0, 3.0]))
        per_rank.append(ProcessFacts(r, f"rank {r}", tuple(DDP), own))
    (f,) = found(per_rank)
    assert f.location.line == 9
