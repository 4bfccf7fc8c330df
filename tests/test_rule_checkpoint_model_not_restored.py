"""checkpoint-model-not-restored (GD339): a resume that restores the training state saved beside
a model's weights but never the weights (source only; the fixtures run the rule end to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.checkpoint_model_not_restored import unrestored_models

SAVED = ('torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(), '
         '"epoch": epoch}, path)\nckpt = torch.load(path)\n')


def test_training_state_restored_without_the_model():
    found = unrestored_models(ast.parse(SAVED + 'opt.load_state_dict(ckpt["optimizer"])\n'))
    assert [(line, key, owner, restored) for line, _, key, owner, restored in found] == \
        [(3, "model", "net", "optimizer")]


def test_the_model_read_anywhere_is_silent():
    assert unrestored_models(ast.parse(SAVED + 'net.load_state_dict(ckpt["model"])\n'
                                       'opt.load_state_dict(ckpt["optimizer"])\n')) == []
    assert unrestored_models(ast.parse(SAVED + 'w = ckpt.get("model")\n'
                                       'opt.load_state_dict(ckpt["optimizer"])\n')) == []
    looped = SAVED + 'for k in ("model",):\n    parts[k].load_state_dict(ckpt[k])\n' \
        'opt.load_state_dict(ckpt["optimizer"])\n'
    assert unrestored_models(ast.parse(looped)) == []
    assert unrestored_models(ast.parse(SAVED)) == []  # nothing restored: no resume
