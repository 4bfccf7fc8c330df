"""schedule-rises-after-zero (GD407): the shape of an lr sequence that decays to zero and climbs
back step by step, and the look-alikes it leaves alone."""

from __future__ import annotations

import math

from graddoctor.rules.schedule_rises_after_zero import _rises_after_zero


def cosine(total, steps, warmup=0):
    out = []
    for s in range(steps):
        if s < warmup:
            out.append((s + 1) / warmup)
        else:
            out.append(0.5 * (1 + math.cos(math.pi * (s - warmup) / (total - warmup))))
    return out


def test_a_cosine_past_its_end_rises_again():
    found = _rises_after_zero(cosine(12, 30, warmup=3))
    assert found is not None
    bottom, back = found
    assert bottom == 12 and back > bottom + 2


def test_decays_warmups_and_restarts_are_not_a_rise():
    assert _rises_after_zero(cosine(30, 30, warmup=3)) is None  # ends at the end of the run
    assert _rises_after_zero([min(1.0, (s + 1) / 10) for s in range(20)]) is None  # a warm-up
    assert _rises_after_zero([max(0.0, 1 - s / 10) for s in range(30)]) is None  # stays at 0
    restart = cosine(10, 11) * 3  # SGDR: back to the top in one step
    assert _rises_after_zero(restart) is None
    # a floor that is not zero (a cyclical schedule between two values) is not a decay ended
    assert _rises_after_zero([0.2 + 0.8 * abs(math.sin(s / 3)) for s in range(40)]) is None
