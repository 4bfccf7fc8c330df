"""label-map-interpolated (GD310): the label lineage of the augmentation watcher
(instrument/augalign.py: an averaging resize of a label map followed to the sample's field),
over real DataLoader fetches, and the rule over its events."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import builder, findings, only

SLUG = "label-map-interpolated"


class _Maps(Dataset):
    def __init__(self, resize, classes=5):
        g = torch.Generator().manual_seed(0)
        self.images = torch.rand(8, 3, 12, 12, generator=g)
        self.masks = torch.randint(0, classes, (8, 3, 3), generator=g).repeat_interleave(4, 0 + 1)
        self.masks = self.masks.repeat_interleave(4, 2)
        self.resize = resize

    def __len__(self):
        return 8

    def __getitem__(self, i):
        image = F.interpolate(self.images[i][None], size=(9, 9), mode="bilinear", align_corners=False)[0]
        return image, self.resize(self.masks[i][None, None].float())


def _events(resize, classes=5) -> list:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        for _ in DataLoader(_Maps(resize, classes), batch_size=4):
            pass
    assert not rec.trace.of_kind("internal_error")
    return [dict(e.data) for e in rec.trace.of_kind("label_map_averaged")]


def test_an_averaging_resize_cast_back_to_ids_is_found():
    (bilinear,) = _events(lambda m: F.interpolate(m, size=(7, 7), mode="bilinear")[0, 0].round().long())
    assert bilinear["mode"] == "bilinear" and bilinear["field"] == 1 and bilinear["share"] > 0
    assert set(bilinear["levels"]) <= {0, 1, 2, 3, 4} and len(bilinear["levels"]) >= 3 and bilinear["shape"] == [7, 7]
    (area,) = _events(lambda m: F.interpolate(m, size=(7, 7), mode="area")[0, 0].long())
    assert area["mode"] == "area"
    (antialias,) = _events(lambda m: F.interpolate(m, size=(5, 5), mode="bilinear",
                                                   antialias=True)[0, 0].round().to(torch.int64))
    assert antialias["share"] > 0


def test_nearest_binary_and_soft_resizes_are_silent():
    assert _events(lambda m: F.interpolate(m, size=(9, 9), mode="nearest")[0, 0].long()) == []
    assert _events(lambda m: F.interpolate(m, size=(9, 9), mode="nearest-exact")[0, 0].long()) == []
    # a soft target kept as values between the classes
    assert _events(lambda m: F.interpolate(m, size=(9, 9), mode="bilinear")[0, 0]) == []
    # two classes: a bilinear resize and a threshold only move the boundary
    assert _events(lambda m: (F.interpolate(m, size=(9, 9), mode="bilinear")[0, 0] > 0.5).long(),
                   classes=2) == []
    # the same size: the resize changes nothing
    assert _events(lambda m: F.interpolate(m, size=(12, 12), mode="bilinear")[0, 0].round().long()) == []


def test_the_finding_names_the_mode_and_the_fix():
    t = builder()
    t.put(ev.label_map_averaged(cls="Scenes", field="mask", op="interpolate", mode="bilinear",
                                levels=[0, 1, 2, 3, 4], new=[1, 2, 3], share=0.052,
                                shape=[32, 32]), 23)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 23
    assert 'mode="bilinear"' in f.message and "5.2%" in f.message and "(1, 2, 3)" in f.message
    assert 'mode="nearest"' in f.fix
    assert findings(builder(), SLUG) == []


def _loop(resize) -> tuple[list, bool]:
    rec = Recorder(step_budget=None)
    original = F.interpolate
    with Instrumentation(rec):
        torch.manual_seed(0)
        masks = torch.randint(0, 4, (8, 4, 4)).repeat_interleave(5, 1).repeat_interleave(5, 2)
        conv = torch.nn.Conv2d(1, 4, 1)
        opt = torch.optim.SGD(conv.parameters(), lr=0.01)
        for i in range(0, 8, 4):
            mask = masks[i:i + 4]
            logits = conv(torch.rand(4, 1, 7, 7))
            loss = F.cross_entropy(logits, resize(mask))
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert not rec.trace.of_kind("internal_error")
    return [dict(e.data) for e in rec.trace.of_kind("label_map_averaged")], F.interpolate is original


def test_a_label_map_resized_in_the_loop_for_the_loss_is_found():
    found, put_back = _loop(lambda m: F.interpolate(m[:, None].float(), size=(7, 7),
                                                    mode="bilinear")[:, 0].round().long())
    assert put_back and len(found) == 1
    assert found[0]["cls"] is None and found[0]["field"] == "target" and found[0]["share"] > 0
    found, _ = _loop(lambda m: F.interpolate(m[:, None].float(), size=(7, 7), mode="area")[:, 0].long())
    assert len(found) == 1 and found[0]["mode"] == "area"
    found, put_back = _loop(lambda m: F.interpolate(m[:, None].float(), size=(7, 7),
                                                    mode="nearest")[:, 0].long())
    assert found == [] and put_back


def test_the_loop_finding_names_the_target():
    t = builder()
    t.put(ev.label_map_averaged(cls=None, field="target", op="interpolate", mode="bilinear",
                                levels=[0, 1, 2, 3], new=[1, 2], share=0.1, shape=[8, 8]), 14)
    f = only(t, SLUG)
    assert f.location.line == 14 and "the target given to the loss" in f.message
