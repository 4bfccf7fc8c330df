"""warmup-ramp-maxed (GD399): which max calls floor a rising warm-up ramp at its cap (source
only; the fixtures run the rule end to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.warmup_ramp_maxed import maxed_ramps


def _hits(code: str) -> int:
    return len(maxed_ramps(ast.parse(code)))


def test_ramps_maxed_at_their_cap_are_found():
    assert _hits("lr = max(1.0, step / warmup)") == 1
    assert _hits("d = max(ema_decay, (1 + it) / (10 + it))") == 1
    assert _hits("f = lambda s: max(1, (s + 1) / warmup_steps)") == 1
    assert _hits("class E:\n    def __init__(self, decay=0.999):\n        self.decay = decay\n"
                 "    def get(self, step):\n        value = (1 + step) / (10 + step)\n"
                 "        return max(self.decay, value)") == 1
    assert _hits("beta = max(1.0, float(epoch) / anneal_epochs)") == 1


def test_floors_decays_and_capped_windows_are_silent():
    assert _hits("lr = min(1.0, step / warmup)") == 0
    assert _hits("d = min(decay, (1 + step) / (10 + step))") == 0
    assert _hits("x = max(0.1, step / warm)") == 0  # a floor below the ramp's start
    assert _hits("x = min(1.0, max(0.9, step / w))") == 0  # a window: capped by min
    assert _hits("x = max(0.9, step / w)\ny = min(1.0, x)") == 0
    assert _hits("x = max(0.0, 1 - step / total)") == 0  # a falling fraction
    assert _hits("x = max(0.01, 1 / (1 + step))") == 0
    assert _hits("x = max(1, step // 5)") == 0  # integer division: a count
    assert _hits("n = max(1, len(x) / bs)") == 0  # no counter
    assert _hits("f = lambda s, t: max(1.0, s / t)") == 0  # a lambda of two: no step told
