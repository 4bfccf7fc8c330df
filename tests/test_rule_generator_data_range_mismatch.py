"""The ranges a discriminator's two inputs come from (instrument/samplerange.py) and the line
the rule follows the data to."""

import textwrap

import torch
from torch import nn

from graddoctor.analysis.source import value_origin
from graddoctor.instrument.samplerange import SampleRange, _mismatch


def test_data_on_one_side_of_a_symmetric_range():
    assert _mismatch(torch.rand(512).double(), -1.0, 1.0) == "half"
    assert _mismatch(-torch.rand(512).double(), -1.0, 1.0) == "half"
    assert _mismatch(torch.rand(512).double() * 2 - 1, -1.0, 1.0) is None
    assert _mismatch(torch.rand(512).double() - 0.5, -1.0, 1.0) is None  # both sides, half the width
    assert _mismatch(torch.rand(512).double() * 0.1, -1.0, 1.0) is None  # too narrow to say


def test_data_outside_the_range():
    assert _mismatch(torch.rand(512).double() * 2 - 1, 0.0, 1.0) == "excludes"
    assert _mismatch(torch.randint(0, 256, (512,)).double(), -1.0, 1.0) == "excludes"
    assert _mismatch(torch.rand(512).double(), 0.0, 1.0) is None
    assert _mismatch(torch.rand(512).double() * 5, 0.0, float("inf")) is None  # no upper bound


def test_data_in_range_with_instance_noise_is_near_it():
    # bars of -1 and +1 with a little noise added (instance noise): half the values spill just
    # past tanh's bounds, none far past them; a generator reaches within a hair of each
    g = torch.Generator().manual_seed(0)
    bars = torch.where(torch.rand(4096, generator=g) < 0.5, -1.0, 1.0).double()
    noisy = bars + 0.05 * torch.randn(4096, generator=g).double()
    assert float((noisy.abs() > 1).double().mean()) > 0.4
    assert _mismatch(noisy, -1.0, 1.0) is None
    assert _mismatch(bars * 1.5, -1.0, 1.0) == "excludes"  # data past the bounds by a quarter of the range


class _Rec:
    def __init__(self):
        self.events = []
        self.finder = type("F", (), {"user_frames": staticmethod(lambda frame: iter(()))})()

    def here(self):
        return None

    def emit_aside(self, made, loc):
        self.events.append(made)


def test_told_once_both_inputs_are_seen_with_one_shape():
    rec = _Rec()
    ranges = SampleRange(rec)
    g, d = nn.Sequential(nn.Linear(2, 4), nn.Tanh()), nn.Linear(4, 1)
    fake = g(torch.randn(8, 2))
    ranges.plain(d, torch.rand(8, 5))  # another shape: not the samples' data
    ranges.generated(d, g, fake)
    assert rec.events == []
    ranges.plain(d, torch.rand(8, 4))
    assert [kind for kind, _ in rec.events] == ["sample_range"]
    assert rec.events[0][1]["how"] == "half" and rec.events[0][1]["activation"] == "tanh"
    ranges.plain(d, torch.rand(8, 4))
    assert len(rec.events) == 1


def test_unbounded_or_rescaled_samples_are_not_judged():
    rec = _Rec()
    ranges = SampleRange(rec)
    g, d = nn.Sequential(nn.Linear(2, 4), nn.Tanh()), nn.Linear(4, 1)
    ranges.generated(d, g, (g(torch.randn(8, 2)) + 1) / 2)  # not the activation's range any more
    ranges.generated(d, g, nn.Linear(2, 4)(torch.randn(8, 2)))
    ranges.generated(d, g, torch.relu(nn.Linear(2, 4)(torch.randn(8, 2))))  # bounded below only
    ranges.plain(d, torch.rand(8, 4))
    assert rec.events == []


def test_value_origin_follows_rows_and_helpers(tmp_path):
    script = tmp_path / "gan.py"
    script.write_text(textwrap.dedent("""\
        import torch
        data = torch.rand(64, 4)
        data = data * 2 - 1
        def prep(b):
            return b / 255.0
        for i in range(3):
            real = data[i * 8:(i + 1) * 8]
            other = prep(real)
            D(real), D(other)
        """))
    assert value_origin(str(script), 9, "real")[0] == 3
    assert value_origin(str(script), 9, "other")[0] == 5
    assert value_origin(str(script), 9, "missing") is None
