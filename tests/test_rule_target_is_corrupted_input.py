"""target-is-corrupted-input (GD166): a loss target that is the corrupted value the model was
given (noise added, a random mask written in), not the clean value it was made from."""

from __future__ import annotations

import textwrap

import torch

from graddoctor import events as ev
from graddoctor.api import check_script
from graddoctor.instrument.corruption import _unwrapped
from graddoctor.instrument.inlinable import watched
from rule_traces import builder, findings, only

SLUG = "target-is-corrupted-input"

_HEAD = """\
import torch
import torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
lm = nn.Sequential(nn.Embedding(20, 8), nn.Linear(8, 20))
opt = torch.optim.SGD([*model.parameters(), *lm.parameters()], lr=0.01)
data = torch.randn(64, 8)
corpus = torch.randint(2, 20, (64, 6))
for step in range(4):
    x = data[step * 16:(step + 1) * 16]
    ids = corpus[step * 16:(step + 1) * 16].clone()
"""
_TAIL = """\
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _lines(tmp_path, body: str) -> list[int]:
    """The lines GD166 reports for a loop body after ``_HEAD`` (lines counted from 1 in the
    body: its first line is 1)."""
    script = tmp_path / "train.py"
    script.write_text(_HEAD + textwrap.indent(textwrap.dedent(body), "    ") + _TAIL)
    report = check_script(str(script))
    offset = _HEAD.count("\n")
    return [f.location.line - offset for f in report.findings if f.rule == SLUG]


def test_a_denoiser_whose_target_is_the_noisy_input_is_reported_at_the_loss(tmp_path):
    assert _lines(tmp_path, """\
        noisy = x + 0.1 * torch.randn_like(x)
        loss = F.mse_loss(model(noisy), noisy)
    """) == [2]


def test_a_denoiser_whose_target_is_the_clean_input_is_not(tmp_path):
    assert _lines(tmp_path, """\
        noisy = x + 0.1 * torch.randn_like(x)
        loss = F.mse_loss(model(noisy), x)
    """) == []


def test_a_plain_autoencoder_is_not(tmp_path):
    assert _lines(tmp_path, "loss = F.mse_loss(model(x), x)\n") == []


def test_labels_cloned_after_masking_are_reported_at_the_clone(tmp_path):
    assert _lines(tmp_path, """\
        chosen = torch.rand(ids.shape) < 0.3
        ids[chosen] = 1
        labels = ids.clone()
        labels[~chosen] = -100
        loss = F.cross_entropy(lm(ids).view(-1, 20), labels.view(-1))
    """) == [3]


def test_labels_cloned_before_masking_are_not(tmp_path):
    assert _lines(tmp_path, """\
        chosen = torch.rand(ids.shape) < 0.3
        labels = ids.clone()
        ids[chosen] = 1
        labels[~chosen] = -100
        loss = F.cross_entropy(lm(ids).view(-1, 20), labels.view(-1))
    """) == []


def test_a_zeroed_selection_of_the_input_as_target_is_reported(tmp_path):
    assert _lines(tmp_path, """\
        hidden = torch.rand(16, 8) < 0.5
        shown = x * (~hidden).float()
        pred = model(shown)
        loss = F.mse_loss(pred[hidden], shown[hidden])
    """) == [4]


def test_noisy_labels_the_model_was_not_given_are_not(tmp_path):
    assert _lines(tmp_path, """\
        y = x.flip(1)
        loss = F.mse_loss(model(x), y + 0.1 * torch.randn_like(y))
    """) == []


def test_a_write_whose_mask_comes_from_the_data_itself_is_not(tmp_path):
    # random data clipped where it is negative: the mask is drawn no later than the data
    assert _lines(tmp_path, """\
        sparse = torch.randn(16, 8)
        sparse[sparse < 0] = 0
        loss = F.mse_loss(model(sparse), sparse)
    """) == []


def test_synthetic_data_whose_clean_part_is_gone_is_not(tmp_path):
    assert _lines(tmp_path, """\
        samples = torch.sin(x) + 0.1 * torch.randn(16, 8)
        loss = F.mse_loss(model(samples), samples)
    """) == []


def test_one_value_of_noise_per_sample_is_no_corruption(tmp_path):
    # a random brightness per sample: augmentation, input and target alike
    assert _lines(tmp_path, """\
        brighter = x + torch.randn(16, 1)
        loss = F.mse_loss(model(brighter), brighter)
    """) == []


def test_the_run_computes_what_it_computes_without_graddoctor(tmp_path):
    body = """\
        noisy = x + 0.1 * torch.randn_like(x)
        chosen = torch.rand(ids.shape) < 0.3
        ids[chosen] = 1
        labels = ids.clone()
        loss = F.mse_loss(model(noisy), noisy) + F.cross_entropy(lm(ids).view(-1, 20), labels.view(-1))
        LOSSES.append(loss.item())
    """
    script = tmp_path / "train.py"
    script.write_text("LOSSES = []\n" + _HEAD + textwrap.indent(textwrap.dedent(body), "    ") + _TAIL
                      + "import json, sys\nopen(sys.argv[1], 'w').write(json.dumps([LOSSES, torch.rand(3).tolist()]))\n")
    plain, checked = tmp_path / "plain.json", tmp_path / "checked.json"
    import runpy
    import sys
    saved = sys.argv
    try:
        sys.argv = [str(script), str(plain)]
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved
    report = check_script(str(script), argv=[str(checked)])
    assert [f.rule for f in report.findings if f.rule == SLUG] == [SLUG, SLUG]
    assert plain.read_text() == checked.read_text()
    assert torch._C._len_torch_function_stack() == 0


def test_the_mode_follows_the_loop_and_not_the_models_forward(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch
        from torch import nn
        DEPTHS = []
        class Net(nn.Linear):
            def forward(self, x):
                DEPTHS.append(("forward", torch._C._len_torch_function_stack()))
                return super().forward(x)
        net = Net(4, 4)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for step in range(5):
            DEPTHS.append(("loop", torch._C._len_torch_function_stack()))
            loss = net(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert DEPTHS[:6] == [("loop", 1), ("forward", 0)] * 3, DEPTHS
        assert DEPTHS[6:] == [("loop", 0), ("forward", 0)] * 2, DEPTHS
    """))
    report = check_script(str(script))
    assert report.run.status == "completed" and report.run.error is None, report.run.error


def test_the_mode_calls_torch_functions_without_graddoctors_wrappers():
    def original(a, b):
        return a + b

    calls = []
    wrapper = watched(original, lambda args, kwargs: calls.append(args))
    outer = watched(wrapper, lambda args, kwargs: calls.append(args))
    assert _unwrapped(outer) is original
    assert outer(1, 2) == 3 and len(calls) == 2

    import functools

    @functools.wraps(original)
    def users_own(a, b):
        return original(a, b)

    assert _unwrapped(users_own) is users_own


def test_the_mode_calls_what_a_patch_replaced_even_without_wrapped():
    # a patch that keeps no __wrapped__ (Tensor.register_hook's, which notes the script's
    # hooks): a call graddoctor made to the original must not reach it through the mode
    from graddoctor.instrument.patcher import Patcher

    class Owner:
        @staticmethod
        def method():
            return "original"

    original = Owner.__dict__["method"]
    patcher = Patcher()
    patcher.patch(Owner, "method", lambda: "patched")
    try:
        assert _unwrapped(Owner.method, patcher) is original
        assert _unwrapped(Owner.method) is Owner.method
    finally:
        patcher.undo()
    assert Owner.method() == "original"


def test_a_loss_is_heard_once_per_call_while_the_mode_follows(tmp_path):
    # F.mse_loss hands its call to a torch function mode under its module's name, which is
    # graddoctor's wrapper: without unwrapping, every listener heard each call twice
    from graddoctor.instrument import corruption

    heard = []
    original = corruption.CorruptedTargetWatcher.loss_call

    def loss_call(self, fn, input, target, args=(), kwargs=None):
        heard.append(fn)
        return original(self, fn, input, target, args, kwargs)

    corruption.CorruptedTargetWatcher.loss_call = loss_call
    try:
        _lines(tmp_path, "loss = F.mse_loss(model(x), x) + F.l1_loss(model(x), x)\n")
    finally:
        corruption.CorruptedTargetWatcher.loss_call = original
    assert heard[:4] == ["mse_loss", "l1_loss", "mse_loss", "l1_loss"]


def _trace(params, how="noise", copied=False, stepped=(0, 1)):
    t = builder(params=list(stepped))
    t.put(ev.target_corrupted(fn="mse_loss", how=how, corrupted_line=7, copied=copied,
                              positions=128, numel=128, params=list(params)), line=9)
    t.clear(list(stepped), line=10)
    t.backward(fresh=list(stepped), line=11)
    t.step(0, line=12)
    return t


def test_the_rule_warns_where_the_event_points_with_a_fix_for_its_corruption():
    f = only(_trace([0, 1]), SLUG)
    assert f.location.line == 9 and f.evidence["corrupted_line"] == 7
    assert "noise was added" in f.message and "randn_like(x)" in f.fix
    g = only(_trace([0, 1], how="mask", copied=True), SLUG)
    assert "copy made here" in g.message and "labels = ids.clone()" in g.fix


def test_the_rule_is_silent_when_no_optimizer_steps_the_model():
    assert findings(_trace([5]), SLUG) == []
