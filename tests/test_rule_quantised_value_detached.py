"""quantised-value-detached (GD384): the source search for codes chosen by argmin/argmax, read
from a table, detached and given on to a network without a straight-through estimator; the rule
over a trace whose backward names the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.quantised_value_detached import detached_quantisations
from graddoctor.trace import TraceBuilder

SLUG = "quantised-value-detached"


def _lines(src):
    return [site["line"] for site in detached_quantisations(ast.parse(src))]


def test_each_lookup_detached_and_given_on_is_found():
    src = (
        "def a(z, book):\n"                                           # 1
        "    idx = torch.cdist(z, book.weight).argmin(dim=-1)\n"      # 2
        "    zq = book(idx).detach()\n"                               # 3
        "    return zq\n"                                             # 4
        "def b(z, w):\n"                                              # 5
        "    d = (z[:, None] - w[None]).pow(2).sum(-1)\n"             # 6
        "    i = d.min(dim=1)[1]\n"                                   # 7
        "    q = w[i]\n"                                              # 8
        "    out = q.data\n"                                          # 9
        "    return decoder(out)\n"                                   # 10
        "def c(z, w):\n"                                              # 11
        "    i = torch.argmin(torch.cdist(z, w), 1)\n"                # 12
        "    q = F.embedding(i, w)\n"                                 # 13
        "    zq = q.detach()\n"                                       # 14
        "    return head(zq.view(-1, 4))\n")                          # 15
    assert _lines(src) == [3, 9, 14]


def test_straight_through_losses_no_grad_and_gathers_are_left_alone():
    src = (
        "def a(z, book):\n"
        "    idx = torch.cdist(z, book.weight).argmin(dim=-1)\n"
        "    q = book(idx)\n"
        "    zq = q.detach()\n"
        "    return z + (q - z).detach(), zq\n"
        "def b(z, w):\n"
        "    idx = torch.cdist(z, w).argmin(1)\n"
        "    q = w[idx]\n"
        "    sg = q.detach()\n"
        "    return F.mse_loss(z, sg)\n"
        "def c(z, w):\n"
        "    with torch.no_grad():\n"
        "        idx = torch.cdist(z, w).argmin(1)\n"
        "        q = w[idx].detach()\n"
        "        update(q)\n"
        "def d(q_online, q_target):\n"
        "    best = q_online.argmax(1, keepdim=True)\n"
        "    nxt = q_target.gather(1, best).detach()\n"
        "    return torch.clamp(nxt, -1, 1)\n")
    assert _lines(src) == []


def test_a_straight_through_sum_beside_other_terms_counts():
    lookup = "def a(z, book):\n    idx = torch.cdist(z, book.weight).argmin(1)\n    q = book(idx)\n"
    for st in ("    zq = q.detach()\n    zq = zq + z - z.detach()\n",
               "    zq = q.detach()\n    zq = z - z.detach() + zq\n",
               "    zq = q.detach()\n    zq = -z.detach() + zq + z\n"):
        assert _lines(lookup + st + "    return dec(zq)\n") == [], st
    # a detached term taken away from another value adds no gradient path
    assert _lines(lookup + "    zq = q.detach()\n    zq = zq + x - z.detach()\n    return dec(zq)\n") == [4]


def test_the_finding_names_the_straight_through_fix(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"                                              # 1
        "z = enc(x)\n"                                                # 2
        "idx = torch.cdist(z, codes).argmin(1)\n"                     # 3
        "q = codes[idx]\n"                                            # 4
        "zq = q.detach()\n"                                           # 5
        "loss = F.mse_loss(dec(zq), x) + F.mse_loss(z, q.detach())\n"  # 6
        "loss.backward()\n")                                          # 7
    t = TraceBuilder(str(script))
    t.backward(line=7)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [5]
    assert found[0].severity is Severity.WARNING
    assert "z + (q - z).detach()" in found[0].fix


def test_silent_without_a_backward_in_the_script(tmp_path):
    script = tmp_path / "infer.py"
    script.write_text("idx = torch.cdist(z, codes).argmin(1)\nzq = codes[idx].detach()\nout = dec(zq)\n")
    t = TraceBuilder(str(script))
    assert list(find_rule(SLUG)().check(Analysis(t.trace))) == []


def test_a_lookup_through_one_hot_rows_is_a_table_read_too():
    src = (
        "def q(z, w):\n"                                              # 1
        "    idx = torch.cdist(z, w).argmin(1)\n"                     # 2
        "    enc = F.one_hot(idx, w.shape[0]).float()\n"              # 3
        "    q = enc @ w\n"                                           # 4
        "    zq = q.detach()\n"                                       # 5
        "    return dec(zq)\n")                                       # 6
    assert _lines(src) == [5]


def test_codes_chosen_for_outputs_made_without_gradient_are_left_alone():
    src = (
        "for step in range(3):\n"
        "    with torch.no_grad():\n"
        "        z = encoder(x)\n"
        "    idx = torch.cdist(z, codebook).argmin(-1)\n"
        "    q = codebook[idx].detach()\n"
        "    loss = F.cross_entropy(prior(q), idx)\n")
    assert _lines(src) == []
