"""backward-after-batch-loop (GD291): loss.backward() after the DataLoader loop whose body
reassigns the loss: only the last batch of each pass is backpropagated."""

from __future__ import annotations

import ast

from graddoctor.rules.backward_after_batch_loop import _after_loop
from rule_traces import P, builder, epoch, findings

SLUG = "backward-after-batch-loop"

DEDENTED = """\
for epoch in range(3):
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""


def _at(src: str, line: int):
    return _after_loop(ast.parse(src), line)


def test_a_backward_right_after_the_loop_that_reassigns_its_loss_is_found():
    assert _at(DEDENTED, 5) == ("loss", 2, 4)
    assert _at(DEDENTED, 6) is None  # the step is no backward


def test_a_summed_or_rebuilt_loss_and_a_backward_inside_the_loop_are_not():
    summed = DEDENTED.replace("loss = criterion(model(x), y)", "loss = loss + criterion(model(x), y)")
    assert _at(summed, 5) is None
    augmented = DEDENTED.replace("loss = criterion(model(x), y)", "loss += criterion(model(x), y)")
    assert _at(augmented, 5) is None
    rebuilt = DEDENTED.replace("    loss.backward()", "    loss = torch.stack(losses).mean()\n    loss.backward()")
    assert _at(rebuilt, 6) is None
    inside = "for x, y in loader:\n    loss = f(x)\n    loss.backward()\n"
    assert _at(inside, 3) is None


def _trace(backwards_per_pass=1, replay_len=8, source=DEDENTED, tmp_path=None, monkeypatch=None):
    (tmp_path / "train.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    t = builder()
    for e in range(3):
        epoch(t, e, real_len=replay_len, replay_len=replay_len, line=2)
        for _ in range(backwards_per_pass):
            t.clear(P, line=3)
            t.backward(fresh=P, line=5)
            t.step(line=6)
    return t


def test_the_rule_points_at_the_backward_with_the_loop_and_step_related(tmp_path, monkeypatch):
    t = _trace(tmp_path=tmp_path, monkeypatch=monkeypatch)
    [f] = findings(t, SLUG)
    assert f.location.line == 5 and [r.location.line for r in f.related] == [2, 6]
    assert "`loss.backward()`" in f.message and "8 batches" in f.message


def test_a_loader_of_one_batch_or_several_backwards_a_pass_is_silent(tmp_path, monkeypatch):
    assert findings(_trace(replay_len=1, tmp_path=tmp_path, monkeypatch=monkeypatch), SLUG) == []
    assert findings(_trace(backwards_per_pass=2, tmp_path=tmp_path, monkeypatch=monkeypatch), SLUG) == []
