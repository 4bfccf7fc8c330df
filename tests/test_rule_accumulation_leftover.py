"""accumulation-leftover (GD205) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor.findings import Severity
from rule_traces import P, builder, epoch, findings, only


def per_epoch_index(t, epochs=3, length=9, k=4, flush=False, clear_at_epoch_start=False,
                    real_len=9):
    """``if (i + 1) % k == 0`` on the per-epoch index (optionally ``or (i + 1) == length``)."""
    fresh = True
    for e in range(epochs):
        if clear_at_epoch_start:
            t.clear(P, line=59)
            fresh = True
        epoch(t, e, real_len=real_len, replay_len=length, line=60)
        for i in range(length):
            t.backward(fresh=P if fresh else (), accumulated=() if fresh else P, line=61,
                       loss_scale_factor=1 / k, batch=[0, e, i])
            fresh = False
            if (i + 1) % k == 0 or (flush and i + 1 == length):
                t.step(line=62)
                t.clear(P, line=63)
                fresh = True


def global_counter(t, epochs=3, length=9, k=4):
    n = 0
    for e in range(epochs):
        epoch(t, e, line=60)
        for i in range(length):
            t.backward(fresh=P if n % k == 0 else (), accumulated=() if n % k == 0 else P, line=61,
                       loss_scale_factor=1 / k, batch=[0, e, i])
            n += 1
            if n % k == 0:
                t.step(line=62)
                t.clear(P, line=63)


def test_accumulation_leftover_found():
    t = builder()
    per_epoch_index(t)
    f = only(t, "accumulation-leftover")
    assert f.location.line == 62 and f.severity is Severity.WARNING
    assert f.evidence["k"] == 4 and f.evidence["leftover_batches"] == 1
    assert f.evidence["real_len"] == 9 and f.evidence["replay_len"] == 9
    assert any(r.location.line == 61 for r in f.related)


def test_accumulation_leftover_is_info_when_real_length_divisible():
    t = builder()
    per_epoch_index(t, real_len=32)
    f = only(t, "accumulation-leftover")
    assert f.severity is Severity.INFO
    assert (f.evidence["real_len"], f.evidence["replay_len"], f.evidence["k"]) == (32, 9, 4)


def test_tail_flush_global_counter_and_epoch_start_clear_are_silent():
    for build in (lambda t: per_epoch_index(t, flush=True), global_counter,
                  lambda t: per_epoch_index(t, clear_at_epoch_start=True)):
        t = builder()
        build(t)
        assert findings(t, "accumulation-leftover") == []
        assert findings(t, "misplaced-zero-grad") == []
        assert findings(t, "unscaled-accumulation") == []
