"""analysis.source.target_assignment: where a loss's labels are built, in a loop or in a per-batch
function with no loop around the loss (a Trainer's compute_loss, a loss helper)."""

from __future__ import annotations

import textwrap

from graddoctor.analysis.source import target_assignment

HOOK = textwrap.dedent("""\
    import torch.nn.functional as F

    class LMTrainer:
        def compute_loss(self, model, inputs):
            labels = inputs.pop("labels")
            logits = model(**inputs).logits[:, :-1]
            targets = labels[:, 1:].masked_fill(inputs["attention_mask"][:, 1:] == 1, -100)
            loss = F.cross_entropy(logits.reshape(-1, 32), targets.reshape(-1))
            return loss
    """)

LOOP = textwrap.dedent("""\
    import torch.nn.functional as F
    targets = None
    for ids in loader:
        targets = ids.masked_fill(ids == 0, -100)
        loss = F.cross_entropy(model(ids).reshape(-1, 32), targets.reshape(-1))
    """)

MODULE = textwrap.dedent("""\
    import torch.nn.functional as F
    targets = ids.masked_fill(ids == 0, -100)
    loss = F.cross_entropy(model(ids).reshape(-1, 32), targets.reshape(-1))
    """)


def _write(tmp_path, text, name):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_labels_built_in_a_hook_without_a_loop(tmp_path):
    found = target_assignment(_write(tmp_path, HOOK, "hook.py"), 8)
    assert found is not None and found[0] == 7 and found[1].startswith("targets = labels[:, 1:]")


def test_labels_built_in_the_loop(tmp_path):
    found = target_assignment(_write(tmp_path, LOOP, "loop.py"), 5)
    assert found is not None and found[0] == 4


def test_module_level_loss_without_a_loop_has_none(tmp_path):
    assert target_assignment(_write(tmp_path, MODULE, "module.py"), 3) is None
