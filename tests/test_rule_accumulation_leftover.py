"""accumulation-leftover (GD205) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
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


def test_tail_made_by_the_replays_cut_is_silent_when_real_length_divisible():
    # replayed with 9-batch epochs, the real ones have 32 = 8 windows of 4: no tail in the real run
    t = builder()
    per_epoch_index(t, real_len=32)
    assert findings(t, "accumulation-leftover") == []


def test_not_shortened_divisible_length_cannot_leave_a_tail_and_an_undivided_one_is_reported():
    t = builder()
    per_epoch_index(t, real_len=35, length=17)
    f = only(t, "accumulation-leftover")
    assert f.severity is Severity.WARNING and "the real ones have 35" in f.message


def _script(tmp_path, test):
    """A file whose line 62 is the step under ``if <test>:`` (line 61), for the source check."""
    path = tmp_path / "train.py"
    path.write_text("\n" * 59 + "for i, (x, y) in enumerate(loader):\n"
                    f"    if {test}:\n        optimizer.step()\n        optimizer.zero_grad()\n")
    t = TraceBuilder(str(path))
    t.optimizer(0, P, line=1, cls="SGD")
    return t


def test_flush_at_the_scripts_own_count_is_silent_only_when_the_replay_cut_the_epoch(tmp_path):
    # ``or i + 1 == num_batches`` (35): the replay's 17-batch epochs never reach that batch
    for test in ("(i + 1) % k == 0 or i + 1 == num_batches", "i % k == k - 1 or is_last",
                 "(i + 1) % k == 0 or i == len(dataset) // bs - 1"):
        t = _script(tmp_path, test)
        per_epoch_index(t, real_len=35, length=17)
        assert findings(t, "accumulation-leftover") == [], test
    # the same test on whole epochs: the flush count is wrong, the tail is real
    t = _script(tmp_path, "(i + 1) % k == 0 or i + 1 == num_batches")
    per_epoch_index(t, real_len=17, length=17)
    assert only(t, "accumulation-leftover").severity is Severity.WARNING
    # no second way into the step: the real 35-batch epochs leave a tail too
    for test in ("(i + 1) % k == 0", "(i + 1) % k == 0 and i > 0"):
        t = _script(tmp_path, test)
        per_epoch_index(t, real_len=35, length=17)
        assert only(t, "accumulation-leftover").severity is Severity.WARNING, test


def test_tail_flush_global_counter_and_epoch_start_clear_are_silent():
    for build in (lambda t: per_epoch_index(t, flush=True), global_counter,
                  lambda t: per_epoch_index(t, clear_at_epoch_start=True)):
        t = builder()
        build(t)
        assert findings(t, "accumulation-leftover") == []
        assert findings(t, "misplaced-zero-grad") == []
        assert findings(t, "unscaled-accumulation") == []
