"""labels-remapped-wrongly (GD312): the ``target_remapped`` event of instrument/targetmap.py
(a loss target made element by element from a served batch's labels so that it no longer
means them), the judgements it is made from, and the rule's finding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.targetmap import judge_classes, judge_scale
from rule_traces import builder, findings

SLUG = "labels-remapped-wrongly"


def _mask(void=255):
    torch.manual_seed(0)
    m = torch.randint(0, 4, (4, 8, 8))
    m[:, 0] = void
    return m


def test_a_void_value_made_a_kept_class_is_told():
    m = _mask()
    found = judge_classes(m, m.clamp(0, 3), 4, -100)
    assert found["how"] == "void" and found["raw"] == 255 and found["new"] == 3
    assert found["count"] == 32
    assert judge_classes(m, torch.where(m == 255, 0, m), 4, -100)["new"] == 0
    assert judge_classes(m, m % 4, 4, -100)["how"] == "void"
    assert judge_classes(_mask(-1), _mask(-1).clamp(min=0), 4, -100)["raw"] == -1


def test_void_sent_to_the_ignore_index_or_kept_is_silent():
    m = _mask()
    assert judge_classes(m, m, 4, 255) is None  # as served
    assert judge_classes(m, torch.where(m == 255, -100, m), 4, -100) is None
    lut = torch.full((256,), 255)
    lut[torch.tensor([0, 1, 2, 3])] = torch.tensor([3, 2, 1, 0])
    assert judge_classes(m, lut[m], 4, 255) is None  # a permutation and the void to ignore
    coarse = torch.arange(40).reshape(4, 10) % 10
    assert judge_classes(coarse, (coarse // 4).clamp(max=2), 3, -100) is None  # merged classes


def test_ids_shifted_onto_the_ignore_index_are_told_and_a_one_based_shift_is_not():
    y = torch.arange(24) % 6
    found = judge_classes(y, y - 1, 6, -1)
    assert found["how"] == "shifted" and found["shift"] == -1 and found["raw"] == 0
    assert found["count"] == 4
    assert judge_classes(y + 1, y, 6, -1) is None  # 1..6 to 0..5
    assert judge_classes(y, y - 1, 6, -100) is None  # -1 is not ignored: torch raises
    few = torch.arange(24) % 3
    assert judge_classes(few, few - 1, 6, -1) is None  # labels that do not cover the classes


def test_a_target_scaled_again_is_told_and_one_scaling_is_not():
    torch.manual_seed(0)
    raw = torch.randn(64) * 40 + 300
    z = (raw - raw.mean()) / raw.std()
    found = judge_scale(z, (z - 300) / 40)
    assert found["how"] == "rescaled" and found["served"] == "standardised"
    assert abs(found["scale"] - 0.025) < 1e-6
    unit = torch.rand(64)
    assert judge_scale(unit, unit / 100)["served"] == "unit"
    assert judge_scale(raw, (raw - 300) / 40) is None  # raw served, standardised once
    assert judge_scale(z, z * 40 + 300) is None  # put back into units
    assert judge_scale(z, z + 0.01 * torch.randn(64)) is None  # not an affine map


def test_a_target_put_back_into_units_against_a_standardised_prediction_is_told():
    torch.manual_seed(0)
    raw = torch.randn(64) * 40 + 300
    z = (raw - raw.mean()) / raw.std()
    prediction = 0.1 * torch.randn(64)  # a fresh model's output, on the served scale
    found = judge_scale(z, z * 40 + 300, prediction)
    assert found["how"] == "unscaled" and found["served"] == "standardised"
    assert abs(found["scale"] - 40) < 1e-4 and abs(found["offset"] - 300) < 1e-3
    assert judge_scale(z, z * 40 + 300, prediction * 40 + 300) is None  # both in units
    assert judge_scale(z, z * 40 + 300, torch.full((64,), 300.0)) is None  # a last layer at the mean
    assert judge_scale(z, z * 2 + 1, prediction) is None  # barely scaled
    assert judge_scale(raw, raw * 40 + 300, prediction) is None  # served in units


def _run(remap, ignore_index=-100) -> list[dict]:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        torch.manual_seed(0)
        masks = torch.randint(0, 3, (16, 6, 6))
        masks[:, :, 0] = 255
        images = torch.rand(16, 2, 6, 6)
        loader = DataLoader(TensorDataset(images, masks), batch_size=4)
        model = nn.Conv2d(2, 3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for image, mask in loader:
            loss = F.cross_entropy(model(image), remap(mask), ignore_index=ignore_index)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [dict(e.data) for e in rec.trace.of_kind("target_remapped")]


def test_the_watcher_notes_a_clamped_void_once():
    found = _run(lambda m: m.clamp(0, 2))
    assert len(found) == 1 and found[0]["how"] == "void" and found[0]["fn"] == "cross_entropy"
    assert _run(lambda m: m, ignore_index=255) == []
    assert _run(lambda m: m.long(), ignore_index=255) == []


def test_the_findings_name_the_values_and_the_fix():
    t = builder()
    t.put(ev.target_remapped(fn="cross_entropy", shape=[8, 20, 20], how="void", raw=255, new=0,
                             classes=3, ignore_index=-100, count=640, values=3200,
                             labels=[0, 1, 2, 255]), 7)
    t.put(ev.target_remapped(fn="cross_entropy", shape=[192], how="shifted", raw=0, new=-1,
                             classes=5, ignore_index=-1, count=40, values=192, shift=-1,
                             labels=[0, 1, 2, 3, 4]), 9)
    t.put(ev.target_remapped(fn="mse_loss", shape=[16], how="rescaled", scale=0.025,
                             offset=-7.5, served="standardised", mean=0.1, std=1.0,
                             target_mean=-7.49, target_std=0.03, values=16), 11)
    void, shifted, rescaled = findings(t, SLUG)
    assert void.severity is Severity.WARNING and void.location.line == 7
    assert "value 255" in void.message and "class 0" in void.message
    assert "ignore_index=255" in void.fix
    assert shifted.location.line == 9 and "by - 1" in shifted.message and "class 0 is never trained" in shifted.message
    assert rescaled.location.line == 11 and "0.025" in rescaled.message
    assert findings(builder(), SLUG) == []
