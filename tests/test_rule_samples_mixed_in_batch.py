"""samples-mixed-in-batch (GD243): hand-written traces, and the ``dependency`` events the
dependency watcher (instrument/dependency.py) records."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.trace import TraceBuilder
from rule_traces import P, builder, findings, only

SLUG = "samples-mixed-in-batch"

SCRIPT = """import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        B, T = x.shape[:2]
        h = self.proj(x).view(B, T, -1)
        z = torch.softmax(h, dim=0)
        return self.head(h.view(T, B, -1))
"""


def _probe(t, mixed=True, op="ViewBackward0", op_at=None, line=30, source="loss_target",
           model="Model", forward=None):
    t.put(ev.dependency(model=model, batch=8, source=source, mixed=mixed, op=op if mixed else None,
                        op_at=op_at, seq=None, modules=[], forward=forward), line=line)


def _trace(*probes, path="train.py", layout=None, loss_input=None) -> TraceBuilder:
    t = builder()
    t.path = path
    for i in range(3):
        t.backward(fresh=P, line=31)
        t.step(line=32)
        if i == 0:
            for kwargs in probes:
                _probe(t, **kwargs)
            if layout:
                t.put(ev.batch_layout(cls="LSTM", layout=layout, shape=[8, 5], batch=8,
                                      source="loader", forwards=2, call=None), line=4)
            if loss_input:
                t.put(ev.loss_input(fn="nll_loss", problem=loss_input, classes=4, normalised=8),
                      line=30)
    return t


def test_a_mixed_probe_is_a_warning_at_the_line_that_made_the_op(tmp_path):
    script = tmp_path / "model.py"
    script.write_text(SCRIPT)
    path = str(script)
    f = only(_trace({"op_at": [path, 10, "forward"]}, path=path), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 10
    assert "`h.view(T, B, -1)` in `Model.forward` mixes them" in f.message
    assert "`h.transpose(0, 1)`" in f.fix
    assert f.evidence == {"model": "Model", "op": "ViewBackward0", "batch": 8,
                          "batch_from": "loss_target"}


def test_without_a_traceback_the_op_is_found_by_name_in_forward(tmp_path):
    script = tmp_path / "model.py"
    script.write_text(SCRIPT)
    path = str(script)
    f = only(_trace({"op": "SoftmaxBackward0", "forward": [path, 6]}, path=path), SLUG)
    assert f.location.line == 9
    assert "`torch.softmax(h, dim=0)`" in f.message
    assert f.fix.startswith("`torch.softmax(h, dim=1)`")


def test_the_located_probe_wins_and_one_model_is_one_finding(tmp_path):
    script = tmp_path / "model.py"
    script.write_text(SCRIPT)
    path = str(script)
    f = only(_trace({}, {"op_at": [path, 10, "forward"]}, path=path), SLUG)
    assert f.location.line == 10
    unknown = only(_trace({}), SLUG)  # no traceback, no source: the model's call
    assert unknown.location.line == 30 and "`ViewBackward0`" in unknown.message


def test_silent_when_not_mixed_or_when_another_rule_reports_it():
    assert findings(_trace({"mixed": False}), SLUG) == []
    assert findings(_trace({"mixed": None}), SLUG) == []
    assert findings(_trace({}, layout="batch_first"), SLUG) == []  # batch-first-mismatch's
    assert findings(_trace({"op": "LogSoftmaxBackward0"}, loss_input="dim"), SLUG) == []
    assert len(findings(_trace({}, layout="seq_first"), SLUG)) == 1


# -- the watcher -----------------------------------------------------------------------------

def _watch(script) -> list:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        script()
    errors = [("error", e["where"], e["error"]) for e in rec.trace.of_kind("internal_error")]
    assert not errors, errors
    return list(rec.trace.of_kind("dependency"))


class _Pool(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        self.encode = nn.Linear(6, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.tanh(self.encode(x))
        return self.head((torch.softmax(h, dim=self.dim) * h).sum(1))


def _train(model, steps=3, batch=8, shape=(5, 6), classes=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        x, y = torch.randn(batch, *shape), torch.randint(0, classes, (batch,))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_the_watcher_finds_the_mixing_op_and_its_line_at_the_next_forward():
    torch.manual_seed(0)
    events = _watch(lambda: _train(_Pool(0)))
    assert [(e["mixed"], e["op"], e["source"]) for e in events] == \
        [(True, "SoftmaxBackward0", "loss_target")] * 2
    assert events[0]["op_at"] is None
    assert events[1]["op_at"][2] == "forward" and events[1]["op_at"][1] == \
        _Pool.forward.__code__.co_firstlineno + 2


def test_the_watcher_is_silent_on_a_clean_model_and_batchnorm():
    torch.manual_seed(0)
    clean = nn.Sequential(nn.Flatten(), nn.Linear(30, 16), nn.BatchNorm1d(16), nn.ReLU(),
                          nn.Linear(16, 3))
    events = _watch(lambda: (_train(_Pool(1)), _train(clean)))
    assert [(e["model"], e["mixed"]) for e in events] == [("_Pool", False), ("Sequential", False)]


def test_the_watcher_skips_an_unknown_or_ambiguous_batch():
    torch.manual_seed(0)
    # the input's second dimension equals the batch: (T, B) or (B, T)?
    assert _watch(lambda: _train(_Pool(0), batch=5)) == []
    # no target and no loader: the batch size is not known
    def no_target():
        model = _Pool(0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randn(8, 5, 6)).pow(2).mean().backward()
            opt.step()
    assert _watch(no_target) == []


def test_the_probe_changes_nothing_the_script_sees():
    def run(instrumented: bool):
        torch.manual_seed(0)
        model = _Pool(0)
        seen = []
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            x, y = torch.randn(8, 5, 6), torch.randint(0, 3, (8,))
            out = model(x)
            out.register_hook(lambda g: seen.append(g.clone()))  # a tensor hook: not probed
            F.cross_entropy(out, y).backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in model.parameters()], seen, torch.rand(1)

    plain = run(False)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        watched = run(True)
    assert all(torch.equal(a, b) for a, b in zip(plain[0], watched[0]))
    assert len(watched[1]) == 3 and all(torch.equal(a, b) for a, b in zip(plain[1], watched[1]))
    assert torch.equal(plain[2], watched[2])  # the global RNG stream is the script's own
    assert not rec.trace.of_kind("dependency")  # a hook on the graph: not probed


def test_the_hooks_go_after_the_first_backwards():
    from torch.nn.modules import module as module_mod

    from graddoctor.instrument.dependency import DependencyWatcher

    before = (dict(module_mod._global_forward_pre_hooks), dict(module_mod._global_forward_hooks))
    rec = Recorder(step_budget=None)
    with Instrumentation(rec) as inst:
        [watcher] = [w for w in inst.watchers if isinstance(w, DependencyWatcher)]
        handles = list(watcher._handles)
        assert watcher.active and handles and all(handle.active for handle in handles)
        _train(_Pool(1), steps=6)
        assert not watcher.active  # this watcher's own hooks, whatever other watchers hold
        assert not any(handle.active for handle in handles)
    # the dispatching pair is gone with the last watcher's hooks, kwargs entry included
    assert (dict(module_mod._global_forward_pre_hooks), dict(module_mod._global_forward_hooks)) == before
    assert not [i for i in getattr(module_mod, "_global_forward_hooks_with_kwargs", {})
                if i not in before[1]]


class _BatchAsSequence(nn.Module):
    """Attention across the samples on purpose: the batch unsqueezed into one sequence."""

    def __init__(self):
        super().__init__()
        self.inp, self.out = nn.Linear(30, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = self.inp(x.flatten(1)).unsqueeze(0)  # (1, B, d): the batch at dim 1
        h = F.scaled_dot_product_attention(h, h, h, dropout_p=0.1)
        return self.out(h.squeeze(0))


def test_attention_over_a_batch_laid_out_as_a_sequence_is_passed_over():
    torch.manual_seed(0)
    events = _watch(lambda: _train(_BatchAsSequence()))
    assert [(e["model"], e["mixed"]) for e in events] == [("_BatchAsSequence", False)]


def test_a_view_that_splits_merged_rows_back_into_samples_reads_them_in_blocks():
    # frames of 16 clips merged into (16 * 8, 16, 6, 6) rows for a per-frame encoder of 16
    # channels: dim 1 looks like a batch, but the view back to (16, 8, -1) says the samples lead
    # in blocks of 8 rows, so a gradient of one clip's row is clean there
    from graddoctor.instrument.dependency import _blocks, _clean
    out = torch.zeros(16, 8, 576)
    out[3] = 1.0
    rows = out.reshape(128, 16, 6, 6)
    assert _blocks((out,), rows, 16)
    assert _clean(rows, 16, 3, axis=0)
    assert not _clean(rows, 16, 3)  # read with dim 1 as the batch, it looks mixed
    # (B, T, F) viewed as (T, B, F) with T twice the batch: no split of the samples' rows
    assert not _blocks((torch.zeros(12, 6, 16),), torch.zeros(6, 12, 16), 6)
