"""augmentation-misaligned (GD191): the augmentation watcher (instrument/augalign.py) over real
DataLoader fetches, and the rule over its events."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from rule_traces import P, builder, only

SLUG = "augmentation-misaligned"


class _Pairs(Dataset):
    def __init__(self, augment):
        torch.manual_seed(0)
        self.images = torch.rand(16, 3, 10, 10)
        self.masks = (self.images[:, 0] > 0.5).long()
        self.augment = augment

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return self.augment(i, self.images[i], self.masks[i])


def _events(augment) -> list:
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        for _ in DataLoader(_Pairs(augment), batch_size=4):
            pass
    assert not rec.trace.of_kind("internal_error")
    return rec.trace.of_kind("augment_misaligned")


def test_an_image_moved_alone_or_another_way_is_found():
    (flipped,) = _events(lambda i, x, m: (x.flip(-1), m))
    assert (flipped["op"], flipped["moved"], flipped["shape"]) == ("flip", "image", [10, 10])
    (axis,) = _events(lambda i, x, m: (x.flip(-1), m.flip(0)))  # rows, not columns
    assert (axis["op"], axis["moved"]) == ("flip", "mask")
    (crop,) = _events(lambda i, x, m: (x[:, 1:9, 1:9], m[2:10, 0:8]))
    assert crop["moved"] == "mask" and crop["shape"] == [8, 8]
    (turned,) = _events(lambda i, x, m: (torch.rot90(x, 1, (1, 2)), m))
    assert turned["op"] == "rot90"


def test_the_same_move_and_photometric_changes_are_silent():
    same = [
        lambda i, x, m: (x.flip(-1), m.flip(-1)),
        lambda i, x, m: (torch.rot90(x, 1, (1, 2)), torch.rot90(m, 1, (0, 1))),
        lambda i, x, m: (x[:, 1:9, 1:9] * 1.2 + 0.1, m[1:9, 1:9]),
        lambda i, x, m: (F.interpolate(x[None], size=(5, 5), mode="bilinear", align_corners=False)[0],
                         F.interpolate(m[None, None].float(), size=(5, 5), mode="nearest")[0, 0].long()),
        lambda i, x, m: ((x - x.mean()) / x.std(), m),
        lambda i, x, m: (x.flip(-1), torch.tensor(i % 3)),  # a class label: no pixels
        lambda i, x, m: (x.flip(-1), x[:, :, :]),  # two images (a contrastive pair), no mask
        lambda i, x, m: (x.flip(-1), torch.ones(10, 10, dtype=torch.long)),  # a constant mask
    ]
    for augment in same:
        found = _events(augment)
        assert found == []


def test_the_watcher_draws_nothing_and_returns_the_same_batches():
    def augment(i, x, m):  # draws from torch's generator, as a random flip does
        return (x.flip(-1), m) if torch.rand(()) < 0.5 else (x, m)

    def run(instrumented: bool):
        torch.manual_seed(3)
        rec = Recorder(step_budget=None)
        loader = DataLoader(_Pairs(augment), batch_size=4, shuffle=True)
        if instrumented:
            with Instrumentation(rec):
                batches = list(loader)
        else:
            batches = list(loader)
        return batches, torch.get_rng_state(), rec

    plain, plain_state, _ = run(False)
    seen, seen_state, rec = run(True)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(plain, seen))
    assert torch.equal(plain_state, seen_state)
    assert rec.trace.of_kind("augment_misaligned")


def test_the_rule_names_the_op_and_what_to_move():
    t = builder()
    t.put(ev.augment_misaligned(cls="Shapes", image=0, mask=1, op="flip", moved="image",
                                shape=[16, 16]), line=25)
    for _ in range(3):
        t.backward(fresh=P, line=42)
        t.step(line=43)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 25
    assert "flips the image of Shapes" in f.message and "to the mask too" in f.fix
    t = builder()
    t.put(ev.augment_misaligned(cls="Shapes", image=0, mask=1, op="flip", moved="mask",
                                shape=[16, 16]), line=27)
    for _ in range(3):
        t.backward(fresh=P, line=42)
        t.step(line=43)
    f = only(t, SLUG)
    assert "another way than its image" in f.message and "dims=[-1]" in f.fix


def _crop(t, top, left):
    return t[..., top:top + 6, left:left + 6]


def test_a_crop_helper_called_twice_is_told_at_the_second_call():
    import inspect

    def augment(i, x, m):
        image = _crop(x, 1, 2)
        mask = _crop(m, 3, 0)  # another offset: the line to change
        return image, mask

    (found,) = _events(augment)
    line = inspect.getsourcelines(augment)[1] + 2
    assert found.loc.line == line and found["moved"] == "mask"
    assert _events(lambda i, x, m: (_crop(x, 1, 2), _crop(m, 1, 2))) == []


def test_a_one_hot_mask_put_channels_first_is_no_move():
    onehot = lambda m: F.one_hot(m, 2).permute(2, 0, 1).float()  # noqa: E731
    assert _events(lambda i, x, m: (x.flip(-1), onehot(m.flip(-1)))) == []
    assert _events(lambda i, x, m: (x, F.one_hot(m, 2).movedim(-1, 0).contiguous().float())) == []
    (apart,) = _events(lambda i, x, m: (x.flip(-1), onehot(m)))  # the image flipped alone
    assert (apart["op"], apart["moved"]) == ("flip", "image")
    (turned,) = _events(lambda i, x, m: (x, F.one_hot(m, 2).flip(0).permute(2, 0, 1).float()))
    assert (turned["op"], turned["moved"]) == ("flip", "mask")  # rows of the one-hot flipped


# -- the training loop's flips (instrument/flipalign.py) -------------------------------------------

def _flip(out, parent, axes, line):
    from graddoctor.instrument.flipalign import _Flip
    from graddoctor.trace import Location

    return _Flip(out, parent, frozenset(axes), Location("train.py", line))


def test_a_target_flipped_along_another_axis_than_the_read_input_is_paired_and_found():
    from graddoctor.instrument.flipalign import misaligned

    img, depth = torch.rand(2, 3, 8, 8), torch.rand(2, 1, 8, 8)
    flips = [_flip(img, None, [-1], 10), _flip(depth, None, [-2], 11)]
    source, target = misaligned(flips, {(img.data_ptr(), img.numel())})
    assert (source.loc.line, target.loc.line) == (10, 11)
    # the same axis: silent; nothing read: nothing judged
    assert misaligned([_flip(img, None, [-1], 10), _flip(depth, None, [-1], 11)],
                      {(img.data_ptr(), img.numel())}) is None
    assert misaligned(flips, set()) is None


def test_views_both_read_and_a_target_of_other_size_are_not_judged():
    from graddoctor.instrument.flipalign import misaligned

    a, b = torch.rand(2, 3, 8, 8), torch.rand(2, 3, 8, 8)
    read = {(a.data_ptr(), a.numel()), (b.data_ptr(), b.numel())}
    assert misaligned([_flip(a, None, [-1], 10), _flip(b, None, [-2], 11)], read) is None
    small = torch.rand(2, 1, 4, 4)
    assert misaligned([_flip(a, None, [-1], 10), _flip(small, None, [-2], 11)],
                      {(a.data_ptr(), a.numel())}) is None


def test_a_flip_feeding_a_later_flip_that_is_read_moves_the_input():
    from graddoctor.instrument.flipalign import misaligned

    x1, x2 = torch.rand(2, 3, 8, 8), torch.rand(2, 3, 8, 8)
    y1, y2 = torch.rand(2, 8, 8), torch.rand(2, 8, 8)
    flips = [_flip(x1, None, [-1], 10), _flip(y1, None, [-1], 11),
             _flip(x2, 0, [-2], 12), _flip(y2, 1, [-2], 13)]
    assert misaligned(flips, {(x2.data_ptr(), x2.numel())}) is None
    flips[3] = _flip(y2, 1, [-1], 13)
    assert misaligned(flips, {(x2.data_ptr(), x2.numel())})[1].loc.line == 13


def test_the_watcher_tells_a_loop_flip_at_the_targets_line():
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    net = torch.nn.Conv2d(3, 1, 3, padding=1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with Instrumentation(rec):
        for _ in range(3):
            x, z = torch.rand(2, 3, 8, 8), torch.rand(2, 1, 8, 8)
            x = x.flip(-1)
            z = torch.flip(z, dims=[2])
            loss = F.mse_loss(net(x), z)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert not rec.trace.of_kind("internal_error")
    told = rec.trace.of_kind("augment_misaligned")
    assert len(told) == 1 and told[0]["cls"] == "" and told[0]["mask"]["axes"] == [-2]
    assert told[0]["image"]["axes"] == [-1]


def test_the_rule_words_the_loop_flip():
    t = builder()
    t.put(ev.augment_misaligned(cls="", image={"line": 20, "axes": [-1]}, mask={"line": 21, "axes": [-2]},
                                op="flip", moved="mask", shape=[8, 8]), line=21)
    t.backward(fresh=P, line=30)
    t.step(0, line=31)
    f = only(t, SLUG)
    assert f.location.line == 21 and f.severity == Severity.WARNING
    assert "height (-2)" in f.message and "line 20" in f.message and "width (-1)" in f.message
    assert "dims=[-1]" in f.fix
