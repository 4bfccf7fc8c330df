"""input-written-in-place (GD337): which writes in a forward's source are in-place arithmetic on
its input, and the rule over hand-written ``input_written`` events (the watcher runs in the
data fixtures)."""

from __future__ import annotations

import ast

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.rules.input_written_in_place import input_writes
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "input-written-in-place"

SCRIPT = """\
class Net(nn.Module):
    def forward(self, x, bank):
        x.sub_(mean).div_(std)
        bank[0] = x.detach()
        return self.fc(x)
"""


def test_in_place_arithmetic_on_the_argument_before_it_is_rebound():
    assert [(line, op) for line, _, op in input_writes(ast.parse(SCRIPT), 2, "x")] == \
        [(3, "sub_"), (3, "div_")]
    assert input_writes(ast.parse(SCRIPT), 2, "bank") == []  # a slot assigned: a memory bank
    rebound = "def forward(self, x):\n    x = self.emb(x)\n    x += self.pos\n    return x\n"
    assert input_writes(ast.parse(rebound), 1, "x") == []
    same_line = "def forward(self, x):\n    x = x.mul_(2)\n    x.add_(1)\n"
    assert [op for _, _, op in input_writes(ast.parse(same_line), 1, "x")] == ["mul_"]
    aug = "def forward(self, x):\n    x[:, 0] -= 1\n    x.clamp_(0, 1)\n    F.relu(x, inplace=True)\n"
    assert [op for _, _, op in input_writes(ast.parse(aug), 1, "x")] == ["-="]
    dropped = "def forward(self, x):\n    F.dropout(x, 0.1, inplace=True)\n"
    assert [op for _, _, op in input_writes(ast.parse(dropped), 1, "x")] == ["F.dropout(inplace=True)"]


def _trace(path, argument="x", view=True):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=9)
    t.put(ev.input_written(module="Net", argument=argument, forward=[path, 2], view=view,
                           rows=256, batch=32), 9)
    for _ in range(3):
        t.backward(fresh=P, line=9)
        t.step(line=9)
    return t


def _script(tmp_path, text=SCRIPT):
    path = tmp_path / "train.py"
    path.write_text(text + "\n" * 5)
    return str(path)


def test_a_write_into_the_data_is_a_warning_at_the_write(tmp_path):
    path = _script(tmp_path)
    f = only(_trace(path), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 3
    assert "256-row tensor" in f.message and "`x.sub_(mean).div_(std)`" in f.message
    assert "x = x.sub(" in f.fix
    g = only(_trace(path, view=False), SLUG)
    assert "the same tensor at every call" in g.message


def test_writes_the_source_does_not_show_are_silent(tmp_path):
    path = _script(tmp_path)
    assert findings(_trace(path, argument="bank"), SLUG) == []
    clean = _script(tmp_path, SCRIPT.replace("        x.sub_(mean).div_(std)\n", "        x = (x - mean) / std\n"))
    assert findings(_trace(clean), SLUG) == []


def test_inference_tensors_are_passed_over(tmp_path, monkeypatch):
    from graddoctor.api import check_script
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "infer.py"
    script.write_text(
        "import torch\nfrom torch import nn\n"
        "net = nn.Linear(4, 2)\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for step in range(5):\n"
        "    loss = net(torch.randn(8, 4)).pow(2).mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
        "    with torch.inference_mode():\n"
        "        net(torch.randn(8, 4))\n")
    report = check_script(str(script))
    assert not report.internal_errors, report.internal_errors
    assert report.findings == []
