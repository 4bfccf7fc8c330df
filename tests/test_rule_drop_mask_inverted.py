"""drop-mask-inverted (GD321): the source search for a drop (keep) mask drawn with the
comparison turned around, and the rule over a trace whose backward names the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.drop_mask_inverted import inverted_masks
from graddoctor.trace import TraceBuilder

SLUG = "drop-mask-inverted"


def _found(src):
    return [(line, name, role) for line, name, _, _, role in inverted_masks(ast.parse(src))]


def test_each_inversion_is_found_with_the_role_its_use_gives():
    src = (
        "import torch\n"                                                          # 1
        "P_UNCOND, NULL = 0.1, 10\n"                                               # 2
        "class Model:\n"                                                           # 3
        "    def __init__(self, cond_drop_prob=0.2):\n"                            # 4
        "        self.cond_drop_prob = cond_drop_prob\n"                           # 5
        "    def forward(self, y, c, null):\n"                                     # 6
        "        keep = torch.rand(y.shape[0]) < self.cond_drop_prob\n"            # 7
        "        c = torch.where(keep[:, None], c, null)\n"                        # 8
        "        m = torch.rand_like(y.float()) > P_UNCOND\n"                      # 9
        "        y = torch.where(m, torch.full_like(y, NULL), y)\n"                # 10
        "        t = torch.rand(y.shape) < 1 - 0.15\n"                             # 11
        "        y[t] = NULL\n"                                                    # 12
        "        u = 0.1 < torch.rand(4)\n"                                        # 13
        "        y = y.masked_fill(u, NULL)\n")                                    # 14
    assert _found(src) == [(7, "keep", "keep"), (9, "m", "drop"), (11, "t", "drop"), (13, "u", "drop")]


def test_right_ways_high_rates_unknown_rates_and_unknown_roles_are_left_alone():
    src = (
        "import torch\n"
        "p = 0.1\n"
        "rate = 0.2\n"
        "rate = 0.3\n"                                       # bound twice: not one number
        "def f(y, c, null, args):\n"
        "    keep = torch.rand(8) > p\n"
        "    y = torch.where(keep, y, null)\n"
        "    drop = torch.rand(8) < p\n"
        "    y = torch.where(drop, null, y)\n"
        "    k = torch.rand(8) < 1 - p\n"
        "    c = c * k[:, None]\n"
        "    word = torch.rand(8) < 0.75\n"                  # meant: a high word dropout
        "    y[~word] = null\n"
        "    a = torch.rand(8) > args.p_uncond\n"
        "    y = torch.where(a, null, y)\n"
        "    b = torch.rand(8) > rate\n"
        "    y = torch.where(b, null, y)\n"
        "    sel = torch.rand(8) > p\n"                      # used for nothing that says drop or keep
        "    y = y[sel]\n")
    assert _found(src) == []


def test_the_finding_points_at_the_comparison(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"                                                     # 1
        "p_uncond = 0.1\n"                                                   # 2
        "drop = torch.rand(16) > p_uncond\n"                                 # 3
        "y = torch.where(drop, torch.full_like(y, 4), y)\n"                  # 4
        "loss.backward()\n")                                                 # 5
    t = TraceBuilder(str(script))
    t.backward(line=5)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [3]
    assert found[0].severity is Severity.WARNING and "90%" in found[0].message


def test_a_mask_named_drop_but_multiplied_in_is_a_keep_mask():
    # public CFG code: "drop_mask" is 0 for the dropped labels, and multiplies them
    src = (
        "import torch\n"
        "p_uncond = 0.1\n"
        "def step(label):\n"
        "    drop_mask = (torch.rand(label.shape[0], 1) > p_uncond).float()\n"
        "    label = label * drop_mask\n"
        "    uncond = torch.rand(label.shape[0]) > p_uncond\n"
        "    emb = label * (1 - uncond.float()[:, None])\n")
    assert _found(src) == [(6, "uncond", "drop")]


def test_dit_label_dropout_to_the_last_class_index():
    src = (
        "import torch\n"                                                          # 1
        "class LabelEmbedder:\n"                                                  # 2
        "    def __init__(self, num_classes, dropout_prob=0.1):\n"                # 3
        "        self.num_classes, self.dropout_prob = num_classes, dropout_prob\n"  # 4
        "        self.p = dropout_prob\n"                                          # 5
        "    def token_drop(self, labels):\n"                                      # 6
        "        ids = torch.rand(labels.shape[0]) > self.p\n"                     # 7
        "        return torch.where(ids, self.num_classes, labels)\n"             # 8
        "    def right(self, labels):\n"                                           # 9
        "        ok = torch.rand(labels.shape[0]) < self.p\n"                      # 10
        "        return torch.where(ok, self.num_classes, labels)\n")             # 11
    assert _found(src) == [(7, "ids", "drop")]


def _kept(src):
    from graddoctor.rules.drop_mask_inverted import kept_at_drop_rate
    return [(line, rate) for line, _, rate, _ in kept_at_drop_rate(ast.parse(src))]


def test_a_bernoulli_keep_mask_drawn_at_the_drop_rate_is_found():
    src = (
        "import torch\n"                                                              # 1
        "def drop_path(x, drop_prob):\n"                                              # 2
        "    keep_prob = drop_prob\n"                                                 # 3
        "    mask = x.new_empty((x.shape[0], 1)).bernoulli_(keep_prob)\n"             # 4
        "    return x * mask / keep_prob\n"                                           # 5
        "def direct(x, drop_rate):\n"                                                 # 6
        "    m = torch.bernoulli(torch.full((x.shape[0], 1), drop_rate))\n"           # 7
        "    return x * m\n"                                                          # 8
        "class DropPath:\n"                                                           # 9
        "    def forward(self, x):\n"                                                 # 10
        "        keep = self.drop_prob\n"                                             # 11
        "        r = torch.bernoulli(torch.full((x.shape[0], 1), keep))\n"            # 12
        "        return x / keep * r\n")                                              # 13
    assert _kept(src) == [(3, "drop_prob"), (7, "drop_rate"), (11, "self.drop_prob")]


def test_keep_probabilities_and_drop_masks_at_the_drop_rate_are_left_alone():
    src = (
        "import torch\n"
        "def drop_path(x, drop_prob=0.0):\n"
        "    keep_prob = 1 - drop_prob\n"
        "    random_tensor = x.new_empty((x.shape[0], 1)).bernoulli_(keep_prob)\n"
        "    random_tensor.div_(keep_prob)\n"
        "    return x * random_tensor\n"
        "def unit_dropout(h, drop_rate):\n"
        "    dropped = torch.bernoulli(torch.full(h.shape, drop_rate))\n"
        "    return h * (1 - dropped)\n"
        "def filled(h, drop_rate):\n"
        "    gone = torch.bernoulli(torch.full(h.shape, drop_rate))\n"
        "    return h.masked_fill(gone.bool(), 0.0)\n"
        "def sparse(h, p):\n"                                   # a rate not named for dropping
        "    m = torch.bernoulli(torch.full(h.shape, p))\n"
        "    return h * m\n")
    assert _kept(src) == []


def test_a_mask_rescaled_by_one_minus_its_rate_is_a_keep_mask_of_a_drop_rate():
    src = (
        "import torch\n"                                                          # 1
        "class D:\n"                                                               # 2
        "    def __init__(self, p=0.1):\n"                                         # 3
        "        self.p = p\n"                                                     # 4
        "    def forward(self, x, h):\n"                                           # 5
        "        sel = (torch.rand_like(x) < self.p).float()\n"                     # 6
        "        x = x * sel / (1 - self.p)\n"                                     # 7
        "        m = torch.rand(h.shape) < 0.2\n"                                  # 8
        "        h = h.div(1 - 0.2) * m\n"                                         # 9
        "        ok = torch.rand_like(x) >= self.p\n"                              # 10
        "        x = x * ok / (1 - self.p)\n"                                      # 11
        "        v = torch.rand(h.shape) < 0.3\n"                                  # 12
        "        h = h * v / 0.3\n"                                                # 13
        "        return x, h\n")
    assert _found(src) == [(6, "sel", "keep"), (8, "m", "keep")]
