"""cumulative-out-of-order (GD275): a cumulative op whose running order is not the order its
loss needs (a Cox risk set over unsorted rows, an inclusive transmittance)."""

from __future__ import annotations

from threading import get_ident

import torch

from graddoctor import events as ev
from graddoctor.instrument.cumorder import CumulativeOrderWatcher
from rule_traces import builder, findings, only

SLUG = "cumulative-out-of-order"


class _Finder:
    def user_frames(self, frame):
        while frame is not None:
            if frame.f_code.co_filename == __file__:
                yield frame
            frame = frame.f_back


class _Rec:
    def __init__(self):
        self.events = []
        self.finder = _Finder()
        self.script_thread = get_ident()

    def here(self, skip=2):
        return _Loc(len(self.events))

    def emit_aside(self, made, loc=None):
        self.events.append(made)

    def internal_error(self, where, exc):
        raise exc

    def retire(self, topic, subscriber):
        self.retired = True

    def subscribe(self, topic, subscriber):  # LossWindow's PARAMS_ADDED: no later phase here
        pass


class _Loc:
    path = "x.py"

    def __init__(self, line):
        self.line = line


def _cox(watcher, scores, times, events, *, sort=None, flip=False):
    """``-(h - logcumsumexp(h)) * e`` as the script writes it; ``times`` is a local the watcher
    may read."""
    if sort is not None:
        order = torch.argsort(times, descending=sort)
        scores, events = scores[order], events[order]
    inner = scores.flip(0) if flip else scores
    total = torch.logcumsumexp(inner, 0)
    watcher._note("logcumsumexp", total)
    if flip:
        total = total.flip(0)
    return -((scores - total) * events).sum()


def _run(**kw):
    torch.manual_seed(0)
    watcher = CumulativeOrderWatcher(_Rec())
    w = torch.randn(3, requires_grad=True)
    x = torch.randn(32, 3)
    times = torch.rand(32) * 10
    if kw.pop("presorted", None) is not None:
        times = times.sort(descending=False).values
    events = (torch.rand(32) < 0.7).float()
    loss = _cox(watcher, x @ w, times, events, **kw)
    watcher.describe_loss(loss)
    return [made for made in watcher.rec.events]


def test_unsorted_rows_under_a_risk_set_are_recorded():
    made = _run()
    assert [kind for kind, _ in made] == ["cumulative_order"]
    assert made[0][1]["case"] == "unsorted" and made[0][1]["key"] == "times"
    assert made[0][1]["rows"] == 32


def test_rows_sorted_by_descending_time_inside_the_loss_are_silent():
    assert _run(sort=True) == []


def test_ascending_rows_under_a_prefix_sum_and_an_event_indicator_are_reversed():
    made = _run(presorted=True)
    assert made and made[0][1]["case"] == "reversed"


def test_ascending_rows_with_the_sum_flipped_are_silent():
    assert _run(presorted=True, flip=True) == []


def test_no_key_in_the_frames_says_nothing():
    watcher = CumulativeOrderWatcher(_Rec())
    w = torch.randn(3, requires_grad=True)
    h = torch.randn(32, 3) @ w
    total = torch.logcumsumexp(h, 0)
    watcher._note("logcumsumexp", total)
    del total
    watcher.describe_loss(-(h - torch.logcumsumexp(h, 0)).sum())
    assert watcher.rec.events == []


def test_a_running_total_not_compared_with_its_rows_is_silent():
    watcher = CumulativeOrderWatcher(_Rec())
    w = torch.randn(3, requires_grad=True)
    target = torch.rand(32)
    total = torch.cumsum(torch.randn(32, 3) @ w, 0)
    watcher._note("cumsum", total)
    watcher.describe_loss(((total - target) ** 2).mean())
    assert watcher.rec.events == [] and target is not None


def _render(watcher, exclusive: bool, log_space: bool = False):
    sigma = torch.rand(4, 8, requires_grad=True)
    delta = torch.full((4, 8), 0.2)
    alpha = 1 - torch.exp(-sigma * delta)
    if log_space:
        inner = torch.cumsum(-sigma * delta, -1)
        watcher._note("cumsum", inner)
        trans = torch.exp(inner)
    elif exclusive:
        inner = torch.cumprod(torch.cat([torch.ones(4, 1), 1 - alpha + 1e-10], -1), -1)
        watcher._note("cumprod", inner)
        trans = inner[:, :-1]
    else:
        trans = torch.cumprod(1 - alpha + 1e-10, -1)
        watcher._note("cumprod", trans)
    return (alpha * trans).sum()


def test_an_inclusive_transmittance_is_recorded_and_an_exclusive_one_is_not():
    for exclusive, log_space, expected in ((False, False, ["inclusive"]), (True, False, []),
                                           (False, True, ["inclusive"])):
        watcher = CumulativeOrderWatcher(_Rec())
        watcher.describe_loss(_render(watcher, exclusive, log_space))
        assert [m[1]["case"] for m in watcher.rec.events] == expected


def test_the_window_closes_after_three_backwards():
    watcher = CumulativeOrderWatcher(_Rec())
    for _ in range(3):
        watcher.describe_loss(_render(watcher, True))
    assert not watcher.active
    watcher._note("cumprod", torch.cumprod(torch.rand(3, requires_grad=True), 0))
    assert watcher._noted == {}


def _trace(case):
    t = builder(params=[0])
    t.put(ev.cumulative_order(op="logcumsumexp", case=case, key="time", rows=64, dim=0), line=9)
    t.clear([0], line=10)
    t.backward(fresh=[0], line=11)
    t.step(0, line=12)
    return t


def test_the_rule_points_at_the_op_and_names_the_key():
    f = only(_trace("unsorted"), SLUG)
    assert f.location.line == 9 and "time" in f.message and "argsort(time" in f.fix
    f = only(_trace("reversed"), SLUG)
    assert "ascending" in f.message and "descending=True" in f.fix
    f = only(_trace("inclusive"), SLUG)
    assert "exclusive" in f.fix


def test_the_rule_is_silent_without_events():
    t = builder(params=[0])
    t.backward(fresh=[0], line=11)
    assert findings(t, SLUG) == []


def test_an_exclusive_transmittance_along_the_rays_is_the_wrong_axis():
    for axis, expected in ((0, ["axis"]), (1, [])):
        watcher = CumulativeOrderWatcher(_Rec())
        sigma = torch.rand(4, 8, requires_grad=True)
        rgb = torch.rand(4, 8, 3)
        alpha = 1 - torch.exp(-sigma * 0.3)
        if axis == 0:
            c = torch.cumprod(torch.cat([torch.ones_like(alpha[:1]), 1 - alpha + 1e-10], 0), 0)
            trans = c[:-1]
        else:
            c = torch.cumprod(torch.cat([torch.ones_like(alpha[:, :1]), 1 - alpha + 1e-10], -1), -1)
            trans = c[:, :-1]
        watcher._note("cumprod", c)
        watcher.describe_loss(((alpha * trans)[..., None] * rgb).sum(-2).sum())
        assert [m[1]["case"] for m in watcher.rec.events] == expected
        if expected:
            assert watcher.rec.events[0][1]["rows"] == 1 and watcher.rec.events[0][1]["dim"] == 0


def test_the_rule_names_both_axes():
    t = builder(params=[0])
    t.put(ev.cumulative_order(op="cumprod", case="axis", key=None, rows=1, dim=0), line=9)
    t.backward(fresh=[0], line=11)
    t.step(0, line=12)
    f = only(t, SLUG)
    assert "axis 0" in f.message and "axis 1" in f.message and "dim=1" in f.fix


def test_a_product_along_the_samples_summed_along_the_rays_points_at_the_sum(tmp_path):
    from graddoctor.trace import TraceBuilder
    script = tmp_path / "render.py"
    script.write_text("alpha = 1 - torch.exp(-sigma * delta)\n"                      # 1
                      "ones = torch.ones_like(alpha[..., :1])\n"                    # 2
                      "trans = torch.cumprod(torch.cat([ones, 1 - alpha], -1), -1)[..., :-1]\n"  # 3
                      "weights = alpha * trans\n"                                    # 4
                      "rgb_map = (weights[..., None] * rgb).sum(dim=0)\n")           # 5
    t = TraceBuilder(str(script))
    t.optimizer(0, [0], line=1)
    t.put(ev.cumulative_order(op="cumprod", case="axis", key=None, rows=0, dim=-1), line=3)
    t.backward(fresh=[0], line=5)
    t.step(0, line=5)
    f = only(t, SLUG)
    assert f.location.line == 5 and f.evidence["at"] == "sum" and "sum(dim=0)" in f.message
    # the product along another axis than the last: which side is wrong is not told by the sum
    t = TraceBuilder(str(script))
    t.optimizer(0, [0], line=1)
    t.put(ev.cumulative_order(op="cumprod", case="axis", key=None, rows=1, dim=0), line=3)
    t.backward(fresh=[0], line=5)
    t.step(0, line=5)
    assert only(t, SLUG).location.line == 3
