"""checkpoint-state-not-restored (GD365): a resume that restores part of the training state it
saved (the optimizer) while another part (the scheduler, the scaler, the epoch counter) is read
nowhere (source only; the fixtures run the rule end to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.checkpoint_state_not_restored import unrestored_state

SAVED = ('torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(), '
         '"scheduler": sched.state_dict(), "epoch": epoch}, path)\nckpt = torch.load(path)\n'
         'net.load_state_dict(ckpt["model"])\n')


def _found(src):
    return [(line, key, kind) for line, _, key, kind, _, _ in unrestored_state(ast.parse(src))]


def test_a_scheduler_left_unrestored_is_reported_at_the_last_restore():
    src = SAVED + 'opt.load_state_dict(ckpt["optimizer"])\nstart = ckpt["epoch"] + 1\n'
    assert _found(src) == [(4, "scheduler", "scheduler")]


def test_an_epoch_counter_left_unread_is_reported_at_the_loop_over_it():
    src = SAVED + ('opt.load_state_dict(ckpt["optimizer"])\nsched.load_state_dict(ckpt["scheduler"])\n'
                   'for epoch in range(10):\n    pass\n')
    assert _found(src) == [(6, "epoch", "counter")]


def test_everything_read_back_is_silent():
    src = SAVED + ('opt.load_state_dict(ckpt["optimizer"])\n'
                   'sched.load_state_dict(ckpt.get("scheduler"))\nstart = ckpt["epoch"]\n')
    assert _found(src) == []


def test_weights_only_fine_tune_and_a_positioned_scheduler_are_silent():
    assert _found(SAVED) == []  # no training state restored: a fine-tune
    src = SAVED + ('opt.load_state_dict(ckpt["optimizer"])\nstart = ckpt["epoch"] + 1\n'
                   'sched = CosineAnnealingLR(opt, T_max=100, last_epoch=start - 1)\n')
    assert _found(src) == []


def test_keys_read_in_a_loop_say_nothing():
    src = SAVED + ('for k, obj in (("optimizer", opt), ("scheduler", sched)):\n'
                   '    obj.load_state_dict(ckpt[k])\nopt.load_state_dict(ckpt["optimizer"])\n')
    assert _found(src) == []
