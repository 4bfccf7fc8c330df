"""autoregressive-mask-leaks (GD320): the source search for masked layer classes built only
with mask type 'B', and the rule over a trace whose backward names the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.autoregressive_mask_leaks import leaking_layers
from graddoctor.trace import TraceBuilder

SLUG = "autoregressive-mask-leaks"

CLASS = (
    "import torch\n"                                                        # 1
    "class MaskedConv2d(torch.nn.Conv2d):\n"                                # 2
    "    def __init__(self, mask_type, *args, **kwargs):\n"                 # 3
    "        super().__init__(*args, **kwargs)\n"                           # 4
    "        k, self.mask = self.weight.shape[-1], torch.ones(5, 5)\n"       # 5
    "        self.centre = k // 2 + (mask_type == 'B')\n")                  # 6


def test_only_type_b_is_found_at_the_first_construction():
    src = CLASS + (
        "net = torch.nn.Sequential(MaskedConv2d('B', 1, 8, 5), MaskedConv2d('B', 8, 8, 3))\n"  # 7
        "head = MaskedConv2d(mask_type='B', in_channels=8, out_channels=2, kernel_size=1)\n")  # 8
    assert leaking_layers(ast.parse(src)) == [(7, "MaskedConv2d", [7, 7, 8])]


def test_an_a_layer_an_expression_or_unpacked_arguments_keep_it_silent():
    for tail in ("net = [MaskedConv2d('B', 8, 8, 3), MaskedConv2d('A', 1, 8, 5)]\n",
                 "net = [MaskedConv2d('A' if i == 0 else 'B', 8, 8, 3) for i in range(3)]\n",
                 "net = [MaskedConv2d(kind, 8, 8, 3) for kind in 'ABB']\n",
                 "net = [MaskedConv2d(*spec) for spec in specs] + [MaskedConv2d('B', 8, 8, 3)]\n",
                 ""):
        assert leaking_layers(ast.parse(CLASS + tail)) == [], tail


def test_only_a_masked_class_with_an_a_b_type_is_read():
    src = ("class Block:\n"
           "    def __init__(self, kind):\n"
           "        self.mask_centre = kind == 'B'\n"
           "x = Block('B')\n")
    assert leaking_layers(ast.parse(src)) == [(4, "Block", [4])]
    for init in ("        self.big = kind == 'large'\n",     # not an A/B type
                 "        self.base = kind == 'B'\n"):       # ViT('B'): a size, no mask
        src = "class Block:\n    def __init__(self, kind):\n" + init + "x = Block('B')\n"
        assert leaking_layers(ast.parse(src)) == [], init


def test_the_finding_is_a_warning_at_the_first_layer(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(CLASS + "net = torch.nn.Sequential(MaskedConv2d('B', 1, 8, 5), MaskedConv2d('B', 8, 8, 3))\n"
                      "loss.backward()\n")
    t = TraceBuilder(str(script))
    t.backward(line=8)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [7]
    assert found[0].severity is Severity.WARNING and "'A'" in found[0].fix
