"""no-decay-params-decayed (GD230): hand-written traces of param groups (their parameters'
names and shapes, lrs, weight decays) and where the finding points in the script's source."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.rules import find_rule
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "no-decay-params-decayed"

# a small transformer's parameters: pid -> (name, shape)
MODEL = {
    0: ("wte.weight", [40, 16]),
    1: ("h.0.attn.weight", [16, 16]),
    2: ("h.0.attn.bias", [16]),
    3: ("h.0.ln_1.weight", [16]),
    4: ("h.0.ln_1.bias", [16]),
    5: ("head.weight", [40, 16]),
    6: ("head.bias", [40]),
}
MATRICES = [0, 1, 5]
VECTORS = [2, 3, 4, 6]
BIASES = [2, 4, 6]


def _trace(groups, steps=2, model=MODEL, path="train.py"):
    """``groups``: (pids, lr, weight_decay) per param group, added in order at line 3."""
    t = TraceBuilder(path)
    for pid, (name, shape) in model.items():
        t.param(pid, name, shape=shape)
    for pids, lr, wd in groups:
        t.put(ev.optimizer_init(opt=0, cls="AdamW", params=list(pids), lrs=[lr],
                                hyper=[{"betas": [0.9, 0.95], "weight_decay": wd, "eps": 1e-8}]), 3)
    every = sorted(p for pids, _, _ in groups for p in pids)
    for _ in range(steps):
        t.clear(every, line=5)
        t.backward(fresh=every, line=6)
        t.step(line=7)
    return t


def test_no_decay_group_given_the_decay_is_found_at_the_construction():
    f = only(_trace([(MATRICES, 1e-3, 0.1), (VECTORS, 1e-3, 0.1)]), SLUG)
    assert f.location.line == 3 and f.evidence["form"] == "same"
    assert "spares nothing" in f.message and "h.0.ln_1.weight" in f.message
    assert f.fix == "give the group of biases and norm weights 'weight_decay': 0.0"


def test_swapped_groups():
    f = only(_trace([(VECTORS, 1e-3, 0.01), (MATRICES, 1e-3, 0.0)]), SLUG)
    assert f.evidence["form"] == "swapped" and "swap" in f.fix


def test_names_that_miss_the_norm_weights():
    f = only(_trace([([0, 1, 3, 5], 1e-3, 0.01), (BIASES, 1e-3, 0.0)]), SLUG)
    assert f.evidence["form"] == "names" and f.evidence["params"] == ["h.0.ln_1.weight"]


def test_correct_splits_and_their_look_alikes_are_silent():
    silent = [
        [(MATRICES, 1e-3, 0.1), (VECTORS, 1e-3, 0.0)],          # the split as meant
        [(MATRICES + VECTORS, 1e-3, 0.1)],                       # one group: decay everything
        [(MATRICES, 1e-3, 0.05), (VECTORS, 1e-3, 1e-4)],         # a lighter decay for vectors
        [(MATRICES, 1e-3, 0.0), (VECTORS, 1e-3, 0.0)],           # no decay anywhere
        [(MATRICES, 1e-2, 5e-4), (VECTORS, 2e-2, 5e-4)],         # Caffe: biases at twice the lr
        # detectron2: norm layers without decay, the other biases with it
        [([0, 1, 2, 5, 6], 1e-3, 1e-4), ([3, 4], 1e-3, 0.0)],
    ]
    for groups in silent:
        assert findings(_trace(groups), SLUG) == [], groups


def test_a_group_of_one_vector_or_of_free_tensors_is_no_split():
    # one vector alone (a learnable scale) in a group of its own
    assert findings(_trace([(MATRICES + [2, 3, 4], 1e-3, 0.1), ([6], 1e-3, 0.1)]), SLUG) == []
    free = {0: ("fc.weight", [4, 4]), 1: ("log_alpha", [1]), 2: ("temperature", [1])}
    assert findings(_trace([([0], 1e-3, 0.1), ([1, 2], 1e-3, 0.1)], model=free), SLUG) == []


def test_a_group_added_after_the_first_step_is_no_split():
    t = _trace([(MATRICES, 1e-3, 0.1)])
    t.put(ev.optimizer_init(opt=0, cls="AdamW", params=VECTORS, lrs=[1e-3],
                            hyper=[{"weight_decay": 0.1}]), 9)
    t.backward(fresh=MATRICES + VECTORS, line=6)
    t.step(line=7)
    assert findings(t, SLUG) == []


def test_an_optimizer_never_stepped_or_without_recorded_settings_is_silent():
    assert findings(_trace([(MATRICES, 1e-3, 0.1), (VECTORS, 1e-3, 0.1)], steps=0), SLUG) == []
    t = TraceBuilder()
    for pid, (name, shape) in MODEL.items():
        t.param(pid, name, shape=shape)
    t.put(ev.optimizer_init(opt=0, cls="AdamW", params=MATRICES, lrs=[1e-3], hyper=None), 3)
    t.put(ev.optimizer_init(opt=0, cls="AdamW", params=VECTORS, lrs=[1e-3], hyper=None), 3)
    t.backward(fresh=MATRICES + VECTORS, line=6)
    t.step(line=7)
    assert findings(t, SLUG) == []


def _check_file(tmp_path, source, groups):
    script = tmp_path / "train.py"
    script.write_text(source)
    t = _trace(groups, path="train.py")
    return list(find_rule(SLUG)().check(Analysis(t.trace, base_dir=str(tmp_path))))


def test_points_at_the_no_decay_dict_of_a_list_returned_by_a_helper(tmp_path):
    source = "\n".join([
        "def groups(model):",                                              # 1
        "    return [{'params': decay, 'weight_decay': 0.1},",              # 2
        "            {'params': no_decay, 'weight_deacy': 0.0}]",            # 3
        "",                                                                 # 4
        "opt = torch.optim.AdamW(groups(model), lr=1e-3, weight_decay=0.1)",  # 5
    ]) + "\n"
    script = tmp_path / "train.py"
    script.write_text(source)
    t = TraceBuilder("train.py")
    for pid, (name, shape) in MODEL.items():
        t.param(pid, name, shape=shape)
    for pids in (MATRICES, VECTORS):
        t.put(ev.optimizer_init(opt=0, cls="AdamW", params=pids, lrs=[1e-3],
                                hyper=[{"weight_decay": 0.1}]), 5)
    t.backward(fresh=MATRICES + VECTORS, line=6)
    t.step(line=7)
    f = list(find_rule(SLUG)().check(Analysis(t.trace, base_dir=str(tmp_path))))
    assert [x.location.line for x in f] == [3]
    assert [r.location.line for r in f[0].related][0] == 5


def test_points_at_the_list_of_names_when_the_names_miss(tmp_path):
    source = "\n".join([
        "import torch",                                   # 1
        "no_decay = ['bias', 'LayerNorm.weight']",        # 2
        "opt = torch.optim.AdamW(groups, lr=1e-3)",       # 3
    ]) + "\n"
    f = _check_file(tmp_path, source, [([0, 1, 3, 5], 1e-3, 0.01), (BIASES, 1e-3, 0.0)])
    assert [x.location.line for x in f] == [2]
