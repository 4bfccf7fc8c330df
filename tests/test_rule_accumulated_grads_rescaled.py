"""accumulated-grads-rescaled (GD351): the source reading of a gradient rescaled in place at
every micro-batch of an accumulation loop, and the rule on hand-written windows."""

from __future__ import annotations

import ast
import textwrap

from graddoctor.rules.accumulated_grads_rescaled import rescaled_per_micro_batch
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "accumulated-grads-rescaled"

LOOP = """\
for i, (x, y) in enumerate(loader):
    loss_fn(model(x), y).backward()
    {scale}
    if (i + 1) % k == 0:
        {inside}
        optimizer.step()
        optimizer.zero_grad()
"""


def _found(scale="pass", inside="pass"):
    src = LOOP.format(scale=scale, inside=inside)
    tree = ast.parse(src)
    return rescaled_per_micro_batch(tree, 1, len(src.splitlines()))


def test_a_rescaling_at_every_micro_batch_is_found():
    for scale in ("for p in model.parameters(): p.grad.mul_(1 / k)",
                  "for p in params: p.grad /= k",
                  "for name, p in model.named_parameters(): p.grad.data.div_(k)",
                  "model.fc.weight.grad *= 0.25"):
        found = _found(scale=scale)
        assert found is not None and found[0] == 3, scale


def test_a_rescaling_once_per_window_or_of_an_input_is_not():
    assert _found(inside="for p in model.parameters(): p.grad.mul_(1 / k)") is None
    assert _found(scale="x.grad.mul_(0.5)") is None  # not a parameter's gradient
    assert _found(scale="for p in model.parameters(): p.grad.add_(noise)") is None
    unconditional = ast.parse(textwrap.dedent("""\
        for x, y in loader:
            loss_fn(model(x), y).backward()
            for p in model.parameters():
                p.grad.mul_(0.5)
            optimizer.step()
    """))
    assert rescaled_per_micro_batch(unconditional, 1, 5) is None


def _trace(tmp_path, scale):
    path = tmp_path / "train.py"
    path.write_text(LOOP.format(scale=scale, inside="pass"))
    t = TraceBuilder(str(path))
    t.optimizer(0, P, line=1, cls="SGD")
    for w in range(3):
        for i in range(4):
            t.backward(fresh=P if i == 0 else (), accumulated=() if i == 0 else P, line=2,
                       batch=[0, 0, 4 * w + i])
        t.step(line=6)
        t.clear(P, line=7)
    return t


def test_the_rule_points_at_the_rescaling_when_windows_accumulate(tmp_path):
    f = only(_trace(tmp_path, "for p in model.parameters(): p.grad.mul_(1 / k)"), SLUG)
    assert f.location.line == 3 and f.evidence["k"] == 4 and "k - i + 1" in f.message
    assert findings(_trace(tmp_path, "pass"), SLUG) == []
