"""hard-negative-draws-positive (GD395): analysis/hard_negatives.py's reading of the script's
source, and the rule's finding at the weights' assignment."""

from __future__ import annotations

import textwrap

from graddoctor.analysis.hard_negatives import positive_drawn_as_negative
from graddoctor.findings import Severity
from rule_traces import builder, findings, only

SLUG = "hard-negative-draws-positive"

_DRAWN = """
import torch
import torch.nn.functional as F

def itm(text_feat, image_feat, image_embeds):
    sim_t2i = text_feat @ image_feat.t() / 0.07
    with torch.no_grad():
        weights_t2i = F.softmax(sim_t2i, dim=1) + 1e-4
    neg_idx = torch.multinomial(weights_t2i, 1).squeeze(1)
    return image_embeds[neg_idx]
"""


def _found(tmp_path, text):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return [(line, weights, draw_line) for line, _, weights, draw_line, _ in positive_drawn_as_negative(str(path))]


def test_a_draw_from_a_similarity_softmax_with_its_diagonal_is_found(tmp_path):
    assert _found(tmp_path, _DRAWN) == [(8, "weights_t2i", 9)]
    # an argmax of the matrix itself, an einsum, torch.mm, one row at a time
    assert _found(tmp_path, "def f(a, b):\n    s = torch.mm(a, b.T)\n    return b[s.argmax(1)]\n") == [(2, "s", 3)]
    assert _found(tmp_path, "def f(a, b):\n    s = torch.einsum('nd,md->nm', a, b)\n"
                            "    i = torch.topk(s, 1).indices\n    return b[i]\n") == [(2, "s", 3)]
    rows = "def f(a, b):\n    s = a @ b.t()\n    out = []\n    for r in range(8):\n" \
           "        j = torch.multinomial(s[r].softmax(0), 1).item()\n        out.append(b[j])\n    return out\n"
    assert _found(tmp_path, rows) == [(2, "s", 5)]


def test_a_diagonal_taken_out_or_no_similarity_or_no_index_is_silent(tmp_path):
    for fix in ("        weights_t2i.fill_diagonal_(0)\n",
                "        weights_t2i = weights_t2i.masked_fill(torch.eye(len(weights_t2i), dtype=torch.bool), 0)\n",
                "        weights_t2i.diagonal().zero_()\n",
                "        weights_t2i[same] = 0\n"):
        text = _DRAWN.replace("        weights_t2i = F.softmax(sim_t2i, dim=1) + 1e-4\n",
                              "        weights_t2i = F.softmax(sim_t2i, dim=1) + 1e-4\n" + fix)
        assert _found(tmp_path, text) == [], fix
    assert _found(tmp_path, _DRAWN.replace("/ 0.07", "/ 0.07\n    sim_t2i = sim_t2i - 1e4 * torch.eye(len(sim_t2i))")) == []
    # sampling tokens from a tied head: a product with a parameter
    assert _found(tmp_path, "def f(h, emb):\n    p = (h @ emb.weight.t()).softmax(-1)\n"
                            "    t = torch.multinomial(p, 1)\n    return emb.weight[t]\n") == []
    # an accuracy's argmax indexes nothing; the diagonal read for the positives is no mask
    assert _found(tmp_path, "def f(a, b):\n    s = a @ b.t()\n    pos = s.diag()\n"
                            "    return (s.argmax(1) == torch.arange(len(s))).float().mean()\n") == []
    # a retrieval accuracy reading the retrieved item's label
    assert _found(tmp_path, "def f(a, b, y):\n    return (y[(a @ b.t()).argmax(1)] == y).float().mean()\n") == []


def test_the_finding_is_a_warning_at_the_weights_assignment(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(textwrap.dedent(_DRAWN))
    monkeypatch.chdir(tmp_path)
    t = builder()
    t.backward(fresh=[0, 1], line=9)
    f = only(t, SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 8
    assert "weights_t2i.fill_diagonal_(0)" in f.fix and "line 9" in f.message
    (tmp_path / "train.py").write_text(textwrap.dedent(_DRAWN).replace(
        "    neg_idx", "        weights_t2i.fill_diagonal_(0)\n    neg_idx"))
    t = builder()
    t.backward(fresh=[0, 1], line=9)
    assert findings(t, SLUG) == []


def test_a_memory_queue_carried_across_iterations_holds_no_positive(tmp_path):
    loop = ("queue = torch.randn(64, 8)\ntemp = 0.07\nfor step in range(3):\n"
            "    fi, ft = enc(x), enc(y)\n    sim = fi @ {other}.t() / temp\n"
            "    neg = {other}[sim.argmax(1)]\n    queue = torch.cat([ft.detach(), queue])[:64]\n")
    assert _found(tmp_path, loop.format(other="queue")) == []
    # the batch's own features, made in the loop (a temperature set before it is no bank)
    assert _found(tmp_path, loop.format(other="ft")) == [(5, "sim", 6)]


def test_a_draw_returned_by_a_helper_is_judged_where_the_caller_indexes(tmp_path):
    helper = "def mine(a, b):\n    w = (a @ b.t()).softmax(1)\n    return torch.multinomial(w, 1).squeeze(1)\n"
    assert _found(tmp_path, helper + "def step(a, b):\n    return b[mine(a, b)]\n") == [(2, "w", 3)]
    assert _found(tmp_path, helper + "def step(a, b):\n    idx = mine(a, b)\n    neg = b[idx]\n"
                            "    return neg\n") == [(2, "w", 3)]
    # the caller compares (an accuracy) or never indexes: no negative is drawn
    assert _found(tmp_path, helper + "def acc(a, b, y):\n    return (y[mine(a, b)] == y).float()\n") == []
    assert _found(tmp_path, helper + "def log(a, b):\n    print(mine(a, b))\n") == []
