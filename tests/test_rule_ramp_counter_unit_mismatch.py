"""ramp-counter-unit-mismatch (GD359): a schedule's progress dividing a loop counter by a
length named in the other unit (source only; the fixtures run the rule end to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.ramp_counter_unit_mismatch import mismatched_ramps

NEST = ("step = 0\nfor epoch in range(E):\n    for x in loader:\n        step += 1\n"
        "        loss.backward()\n")


def _found(src):
    return [(line, counter, counts, length) for line, _, counter, counts, length, _ in
            mismatched_ramps(ast.parse(src))]


def test_an_epoch_counter_over_a_length_in_steps():
    src = NEST + "        beta = min(1.0, epoch / warmup_steps)\n"
    assert _found(src) == [(6, "epoch", "epoch", "warmup_steps")]
    src = NEST + "        beta = min(1.0, (epoch + 1) / cfg.kl_warmup_iters)\n"
    assert _found(src) == [(6, "epoch", "epoch", "cfg.kl_warmup_iters")]


def test_a_step_counter_over_a_length_in_epochs():
    src = ("def train():\n    it = 0\n    for ep in range(E):\n"
           "        for i, (x, y) in enumerate(loader):\n            it += 1\n"
           "            tau = max(0.5, 1 - it / args.anneal_epochs)\n"
           "            loss.backward()\n")
    assert _found(src) == [(6, "it", "step", "args.anneal_epochs")]


def test_same_units_rates_unnamed_lengths_and_rollout_loops_are_silent():
    for tail in ("        beta = min(1.0, step / warmup_steps)\n",
                 "        e = step / steps_per_epoch\n",
                 "        w = epoch / n_epochs\n",
                 "        w = epoch / warmup\n",
                 "        w = step / len(loader)\n"):
        assert _found(NEST + tail) == [], tail
    assert _found("for it in range(N):\n    for t in range(T):\n        pass\n"
                  "    beta = it / warmup_steps\n") == []
    assert _found("for it in range(N):\n    lr = 0.1 * (1 - it / MAX_ITER)\n"
                  "    for group in opt.param_groups:\n        group['lr'] = lr\n"
                  "    loss.backward()\n") == []
