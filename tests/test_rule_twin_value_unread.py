"""twin-value-unread (GD429): the source reading over scripts written to a temporary folder, and
the rule over a trace whose backward ran in them."""

from __future__ import annotations

import textwrap

from graddoctor.analysis.unread_twins import unread_twins
from graddoctor.findings import Severity
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "twin-value-unread"

CONSISTENCY = """\
import torch
for x, u in loader:
    logits = model(torch.cat([x, weak(u), strong(u)]))
    logits_x = logits[:n]
    logits_w, logits_s = logits[n:].chunk(2)
    target = logits_w.detach().argmax(1)
    loss = F.cross_entropy(logits_x, y) + F.cross_entropy(logits_w, target)
    loss.backward()
"""


def _script(tmp_path, text):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _trace(path, line=8):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=1)
    for _ in range(2):
        t.backward(fresh=P, line=line)
        t.step(line=line)
    return t


def test_an_unread_piece_of_a_split_is_reported_where_its_twin_is_read_with_gradient(tmp_path):
    f = only(_trace(_script(tmp_path, CONSISTENCY)), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 7
    assert [r.location.line for r in f.related] == [5]
    assert "`logits_s`" in f.message and "`logits_w`" in f.message
    assert "F.cross_entropy(logits_s, target)" in f.fix


def test_a_piece_that_is_read_is_silent(tmp_path):
    text = CONSISTENCY.replace("F.cross_entropy(logits_w, target)", "F.cross_entropy(logits_s, target)")
    assert findings(_trace(_script(tmp_path, text)), SLUG) == []


def test_a_piece_rebound_from_its_twin_in_a_forward_is_reported_at_the_rebinding(tmp_path):
    path = _script(tmp_path, """\
        class Head(nn.Module):
            def forward(self, h):
                start, end = self.out(h).unbind(-1)
                start = start.masked_fill(~self.mask, -1e4)
                end = start.masked_fill(~self.mask, -1e4)
                return start, end
        """)
    [found] = unread_twins(path)
    assert found["line"] == 5 and found["how"] == "overwritten"
    assert found["name"] == "end" and found["twin"] == "start" and found["dead_line"] == 3


def test_an_unread_copy_of_the_batch_made_by_a_script_function_is_reported(tmp_path):
    path = _script(tmp_path, """\
        def attack(model, x, y):
            return x + 0.1
        for xb, yb in loader:
            x_adv = attack(model, xb, yb)
            out = model(xb)
            F.cross_entropy(out, yb).backward()
        """)
    [found] = unread_twins(path)
    assert (found["line"], found["name"], found["twin"], found["how"]) == (5, "x_adv", "xb", "unread")


def test_different_kinds_metrics_side_reads_and_later_reads_are_silent(tmp_path):
    path = _script(tmp_path, """\
        def accuracy(p, y):
            return (p.argmax(1) == y).float().mean()
        for batch in loader:
            x, y = batch
            values, idx = model(x).max(1)
            acc = accuracy(model(x), y)
            a, b = model(x).chunk(2)
            print(a.size(0), a.detach())
            xs, xq = x[:4], x[4:]
            loss = model(xq).sum() + xs.mean()
            loss.backward()
        print(b)
        """)
    assert unread_twins(path) == []


def test_code_outside_training_loops_and_forwards_is_not_read(tmp_path):
    path = _script(tmp_path, """\
        x_train, x_val = X[:800], X[800:]
        loader = DataLoader(TensorDataset(x_train))
        def evaluate(model, x):
            a, b = model(x).chunk(2)
            return model(a)
        """)
    assert unread_twins(path) == []


def test_a_second_view_encoded_and_never_read_is_reported_where_the_first_stands_in(tmp_path):
    path = _script(tmp_path, """\
        for x in loader:
            z1 = encoder(augment(x))
            z2 = encoder(augment(x) + 0.1)
            loss = nt_xent(z1, z1)
            loss.backward()
        """)
    [found] = unread_twins(path)
    assert (found["line"], found["name"], found["twin"]) == (4, "z2", "z1")


def test_a_twin_read_only_by_a_logging_call_is_silent(tmp_path):
    path = _script(tmp_path, """\
        for x, y in loader:
            out = model(x)
            acc1 = accuracy(out, y)
            acc5 = accuracy(out, y, 5)
            logger.log(acc1)
            F.cross_entropy(out, y).backward()
        """)
    assert unread_twins(path) == []


def test_fields_of_a_batch_different_callees_and_library_draws_are_not_twins(tmp_path):
    path = _script(tmp_path, """\
        for batch in loader:
            inputs, targets = batch[0], batch[1]
            recon = model(inputs)
            a, b = prep(batch), label_of(batch)
            noise = torch.randn_like(recon)
            spare = torch.randn_like(inputs)
            out = add_noise(inputs, noise, a)
            F.mse_loss(recon, out).backward()
        """)
    assert unread_twins(path) == []
