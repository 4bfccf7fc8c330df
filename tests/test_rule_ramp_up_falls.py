"""ramp-up-falls (GD424): the ramp-up functions of a script evaluated along their counter, and
the finding at the statement that makes the ramp's phase."""

from __future__ import annotations

from graddoctor.analysis.ramps import falling_ramps
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "ramp-up-falls"

_SIGMOID = (
    "import numpy as np\n"                                             # 1
    "def sigmoid_rampup(current, rampup_length):\n"                    # 2
    "    if rampup_length == 0:\n"                                     # 3
    "        return 1.0\n"                                             # 4
    "    current = np.clip(current, 0.0, rampup_length)\n"             # 5
    "    phase = {}\n"                                                 # 6
    "    return float(np.exp(-5.0 * phase * phase))\n"                 # 7
    "w = sigmoid_rampup(epoch, 5)\n")                                  # 8


def _script(tmp_path, text):
    path = tmp_path / "train.py"
    path.write_text(text)
    return str(path)


def test_an_inverted_sigmoid_ramp_falls_and_points_at_its_phase(tmp_path):
    found = falling_ramps(_script(tmp_path, _SIGMOID.format("current / rampup_length")))
    assert len(found) == 1
    line, name, values, _, counter, length = found[0]
    assert (line, name, counter, length) == (6, "sigmoid_rampup", "current", "rampup_length")
    assert values[0] == 1.0 and values[-1] < 0.01


def test_a_rising_ramp_a_ramp_down_a_warmup_then_decay_and_an_uncalled_ramp_are_silent(tmp_path):
    assert falling_ramps(_script(tmp_path, _SIGMOID.format("1.0 - current / rampup_length"))) == []
    text = (
        "import math\n"
        "def cosine_rampdown(current, length):\n"
        "    return 0.5 * (math.cos(math.pi * current / length) + 1)\n"
        "def warmup_cosine(step, total_steps, warmup_steps=10):\n"
        "    if step < warmup_steps:\n"
        "        return step / warmup_steps\n"
        "    return 0.5 * (1 + math.cos(math.pi * (step - warmup_steps) / (total_steps - warmup_steps)))\n"
        "def linear_rampup(step, length):\n"
        "    return 1.0 - step / length\n"
        "a = cosine_rampdown(1, 10) * warmup_cosine(1, 100)\n")
    assert falling_ramps(_script(tmp_path, text)) == []


def test_a_body_that_reads_a_global_is_not_judged(tmp_path):
    text = ("RAMP = 10\n"
            "def linear_rampup(step):\n"
            "    return 1.0 - step / RAMP\n"
            "w = linear_rampup(3)\n")
    assert falling_ramps(_script(tmp_path, text)) == []


def test_the_finding_names_the_function_and_the_phase_to_invert(tmp_path):
    path = _script(tmp_path, _SIGMOID.format("current / rampup_length"))
    t = TraceBuilder(path=path)
    t.optimizer(0, [0], line=8, cls="SGD")
    t.backward(fresh=[0], line=8)
    t.step(line=8)
    f = only(t, SLUG)
    assert f.location.line == 6 and "`sigmoid_rampup`" in f.message
    assert "`1.0 - current / rampup_length`" in f.fix


def test_no_backward_no_finding(tmp_path):
    path = _script(tmp_path, _SIGMOID.format("current / rampup_length"))
    assert findings(TraceBuilder(path=path), SLUG) == []
