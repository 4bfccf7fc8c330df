"""tied-weight-detached (GD439): a tied weight applied through .data in one use and read with
its gradient in another (source only; the fixtures run the rule end to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.tied_weight_detached import detached_tied_reads
from graddoctor.trace import TraceBuilder
from rule_traces import findings


def _found(body: str):
    src = "class M(nn.Module):\n" + "".join(f"    {l}\n" for l in body.splitlines())
    return [(line, attribute, other) for line, _, attribute, other in detached_tied_reads(ast.parse(src))]


def test_a_decoder_reading_the_encoder_weight_through_data():
    body = ("def encode(self, x):\n    return self.enc(x)\n"
            "def decode(self, z):\n    return F.linear(z, self.enc.weight.data.t(), self.b)\n")
    assert _found(body) == [(5, "self.enc.weight", 3)]


def test_a_matmul_and_the_parameter_read_itself():
    body = ("def forward(self, ids):\n    h = self.embed(ids)\n    return h @ self.embed.weight.data.T\n")
    assert _found(body) == [(4, "self.embed.weight", 3)]
    body = ("def forward(self, x):\n    h = torch.tanh(x @ self.W)\n    return torch.matmul(h, self.W.data.t())\n")
    assert _found(body) == [(4, "self.W", 3)]


def test_silent_on_tied_reads_with_gradient_no_grad_and_set_up():
    assert _found("def decode(self, z):\n    return F.linear(self.enc(z), self.enc.weight.t())\n") == []
    assert _found("def forward(self, x):\n    y = self.enc(x)\n"
                  "    with torch.no_grad():\n        self.enc.weight.data.copy_(F.linear(y, self.enc.weight.data))\n"
                  "    return y\n") == []
    # never read with its gradient anywhere but where it is built
    assert _found("def __init__(self):\n    nn.init.zeros_(self.table.weight)\n"
                  "def forward(self, x):\n    return F.linear(x, self.table.weight.data)\n") == []
    # a stop-gradient written with detach() is left alone
    assert _found("def forward(self, z):\n    d = z @ self.code.weight.detach().t()\n"
                  "    return self.code(d.argmin(1))\n") == []


def test_the_rule_needs_a_trained_parameter_of_that_name(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("class AE(nn.Module):\n    def forward(self, x):\n        h = self.enc(x)\n"
                    "        return F.linear(h, self.enc.weight.data.t())\n")
    t = TraceBuilder(str(path))
    t.param(0, name="enc.weight")
    t.optimizer(0, [0])
    t.backward(fresh=[0], line=9)
    t.step(0, line=10)
    (f,) = findings(t, "tied-weight-detached")
    assert f.location.line == 4 and "line 3" in f.message
    assert f.fix == "apply `self.enc.weight` itself: `return F.linear(h, self.enc.weight.t())`"
    t = TraceBuilder(str(path))
    t.param(0, name="dec.weight")
    t.optimizer(0, [0])
    t.backward(fresh=[0], line=9)
    t.step(0, line=10)
    assert findings(t, "tied-weight-detached") == []
