"""accumulation-term-undivided (GD151) over hand-written traces: accelerate's backward divides
its loss by gradient_accumulation_steps; a plain backward beside it, once per micro-batch
inside accumulate(), does not."""

from __future__ import annotations

from graddoctor.analysis import Analysis
from graddoctor.rules import find_rule
from graddoctor.trace import TraceBuilder

SLUG = "accumulation-term-undivided"
P = [0, 1]

# lines 10-14 sit in the accumulate() block
INSIDE = ("\n" * 8 + "for x, y in loader:\n"                                  # 9
          "    with accelerator.accumulate(model):\n"                        # 10
          "        out = model(x)\n"                                         # 11
          "        accelerator.backward(loss_fn(out, y), retain_graph=True)\n"  # 12
          "        (1e-2 * out.pow(2).mean()).backward()\n"                  # 13
          "        optimizer.step()\n")                                      # 14
# the same calls in a loop that accumulates by hand (no accumulate() block)
BY_HAND = INSIDE.replace("    with accelerator.accumulate(model):\n", "    if True:\n")


def _check(tmp_path, script=INSIDE, k=4, plain_per_window=None, plain_params=P, windows=3):
    (tmp_path / "train.py").write_text(script)
    plain_per_window = k if plain_per_window is None else plain_per_window
    t = TraceBuilder()
    t.optimizer(0, P, line=1)
    for _ in range(windows):
        t.via = ""
        t.clear(P, line=8)
        for i in range(k):
            t.via = "accelerate"
            t.backward(fresh=P if i == 0 else (), accumulated=() if i == 0 else P, line=12)
            if i >= k - plain_per_window:
                t.via = ""
                t.backward(accumulated=plain_params, line=13)
        t.via = "accelerate"
        t.step(0, line=14)
    t.via = ""
    return list(find_rule(SLUG)().check(Analysis(t.trace, base_dir=str(tmp_path))))


def test_a_plain_backward_per_micro_batch_beside_accelerate_is_reported_at_its_line(tmp_path):
    (f,) = _check(tmp_path)
    assert f.location.line == 13 and f.evidence["k"] == 4 and f.evidence["main_line"] == 12
    assert "4x more" in f.message and "accelerator.backward" in f.fix


def test_silent_on_once_per_update_other_parameters_no_accumulation_and_hand_loops(tmp_path):
    assert _check(tmp_path, plain_per_window=1) == []  # a regulariser under sync_gradients
    assert _check(tmp_path, plain_params=[7]) == []  # another model's parameters
    assert _check(tmp_path, k=1) == []  # no accumulation: nothing is divided
    assert _check(tmp_path, script=BY_HAND) == []  # the script divides both terms itself
