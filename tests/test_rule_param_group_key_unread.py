"""param-group-key-unread (GD324): the spelling judge, on hand-written traces (no source file:
the finding stays at the optimizer's line), and the optimizer watcher's record of the keys a
torch optimizer's step never reads."""

from __future__ import annotations

import torch
from torch import nn

from graddoctor import events as ev
from graddoctor.analysis.optimizer_settings import meant_setting
from graddoctor.findings import Severity
from graddoctor.instrument.optim import unread_keys
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "param-group-key-unread"
ADAMW = ["amsgrad", "betas", "capturable", "differentiable", "eps", "foreach", "fused", "lr",
         "maximize", "weight_decay"]
SGD = ["dampening", "differentiable", "foreach", "fused", "lr", "maximize", "momentum",
       "nesterov", "weight_decay"]


def test_misspellings_are_mapped_to_the_setting_they_mean():
    assert meant_setting("LR", ADAMW) == "lr"
    assert meant_setting("learning_rate", ADAMW) == "lr"
    assert meant_setting("weight_deacy", ADAMW) == "weight_decay"
    assert meant_setting("weightDecay", ADAMW) == "weight_decay"
    assert meant_setting("wd", ADAMW) == "weight_decay"
    assert meant_setting("beta", ADAMW) == "betas"
    assert meant_setting("maximise", ADAMW) == "maximize"
    assert meant_setting("momentun", SGD) == "momentum"


def test_keys_of_the_script_s_own_are_no_misspelling():
    for key in ("name", "lr_scale", "layer_id", "initial_lr", "max_lr", "min_lr", "lr_mult",
                "decay_mult", "group_name", "is_decay", "param_names_x"):
        assert meant_setting(key, ADAMW) is None, key
        assert meant_setting(key, SGD) is None, key


def trace(cls="AdamW", unread=(("LR", 0.01),), settings=ADAMW, steps=3):
    t = TraceBuilder()
    t._params([0, 1, 2])
    t.put(ev.optimizer_init(opt=0, cls=cls, params=[0], lrs=[1e-5]), 4)
    t.put(ev.optimizer_init(opt=0, cls=cls, params=[1, 2], lrs=[1e-5],
                            unread=[[list(k) for k in unread]] if unread else None,
                            settings=settings), 4)
    for _ in range(steps):
        t.backward(fresh=[0, 1, 2], line=8)
        t.step(0, line=9)
    return t


def test_a_misspelt_lr_is_a_warning_naming_the_setting_and_the_default_kept():
    f = only(trace(), SLUG)
    assert f.severity == Severity.WARNING and f.location.line == 4
    assert '`"LR" = 0.01` in param group 1 of AdamW' in f.message
    assert 'names it `"lr"`' in f.message and "(lr 1e-05)" in f.message
    assert "all 3 updates" in f.message and f.fix == 'rename the key to `"lr"`'


def test_a_setting_of_another_optimizer_is_reported_as_foreign():
    f = only(trace(unread=(("momentum", 0.9),)), SLUG)
    assert "a setting of other optimizers, not of AdamW" in f.message


def test_silent_on_own_keys_and_without_a_later_step():
    assert findings(trace(unread=(("name", None), ("lr_scale", 0.5))), SLUG) == []
    assert findings(trace(steps=0), SLUG) == []
    assert findings(trace(unread=()), SLUG) == []


def test_the_watcher_records_only_keys_torch_s_step_never_reads():
    model = nn.Linear(2, 2)
    opt = torch.optim.AdamW([{"params": model.parameters(), "LR": 1e-2, "name": "all"}], lr=1e-5)
    assert unread_keys(opt, opt.param_groups[0]) == [["LR", 0.01], ["name", None]]
    plain = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert unread_keys(plain, plain.param_groups[0]) is None


def test_an_optimizer_class_of_the_script_s_own_is_not_judged():
    class Mine(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 0.1})

        def step(self):
            pass

    opt = Mine([{"params": nn.Linear(2, 2).parameters(), "LR": 1.0}])
    assert unread_keys(opt, opt.param_groups[0]) is None
