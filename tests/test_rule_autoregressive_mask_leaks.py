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


# -- a causal mask that keeps positions after the centre (mask_not_causal) ---------------------

def _leaks(mask):
    """The ``mask_not_causal`` events the watcher tells for one conv weight and mask."""
    import torch
    from graddoctor.instrument.maskonce import MaskOnceWatcher

    told = []
    watcher = MaskOnceWatcher.__new__(MaskOnceWatcher)
    watcher._tell_leak = lambda module, p, m, kernel, open_after: told.append(open_after)
    weight = torch.nn.Parameter(torch.randn(2, 1, *mask.shape))
    zeros = (mask == 0)[None, None].expand(2, 1, *mask.shape)
    watcher._causal(object(), [("weight", weight)], [("mask", zeros)])
    return told


def test_the_watcher_tells_masks_that_keep_positions_after_the_centre():
    import torch

    raster = torch.ones(3, 3)
    raster[1, 1:] = 0
    raster[2:] = 0
    assert _leaks(raster) == []
    vertical = torch.ones(3, 3)
    vertical[2:] = 0
    assert _leaks(vertical) == []
    checker = torch.ones(3, 3)
    checker[::2, ::2] = 0
    assert _leaks(checker) == []
    rows_kept = torch.ones(5, 5)
    rows_kept[2, 2:] = 0
    assert _leaks(rows_kept) and _leaks(rows_kept)[0][0] == [3, 0]
    partial = torch.ones(5, 5)
    partial[2, 3:] = 0
    partial[3:, 3:] = 0
    assert _leaks(partial)[0][0] == [3, 0]


def test_the_rule_points_at_the_mask_write_of_the_class(tmp_path):
    from graddoctor import events as ev

    script = tmp_path / "train.py"
    script.write_text(
        "class Conv(nn.Conv2d):\n"                              # 1
        "    def __init__(self, k):\n"                          # 2
        "        m = torch.ones(k, k)\n"                        # 3
        "        m[k // 2, k // 2:] = 0\n"                      # 4
        "        self.register_buffer('causal', m)\n"           # 5
        "loss.backward()\n")                                    # 6
    t = TraceBuilder(str(script))
    t.put(ev.mask_not_causal(cls="Conv", param="weight", mask="causal", kernel=[5, 5],
                             open_after=[[3, 0], [3, 1]], defined_at=[str(script), 1, 5]), 6)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [4]
    assert "kh // 2 + 1:" in found[0].fix


# -- masked linear layers that order their inputs and read their own (mask_sees_itself) -------

def _made_chains(hidden_cmp, out_cmp, *, interleave=False, d=5, hidden=20):
    """The maximal chains the watcher builds for a 3-layer MADE whose hidden and output masks
    compare degrees with the given operators, run once."""
    import operator

    import torch
    import torch.nn.functional as F
    from graddoctor.instrument.maskonce import MaskOnceWatcher

    ops = {">": operator.gt, ">=": operator.ge}
    g = torch.Generator().manual_seed(0)
    m_in = torch.arange(1, d + 1)
    m1 = torch.randint(1, d, (hidden,), generator=g)
    m2 = torch.randint(1, d, (hidden,), generator=g)
    m_out = m_in.repeat_interleave(2) if interleave else torch.cat([m_in, m_in])
    masks = [ops[hidden_cmp](m1[:, None], m_in[None, :]), ops[hidden_cmp](m2[:, None], m1[None, :]),
             ops[out_cmp](m_out[:, None], m2[None, :])]

    class Masked(torch.nn.Linear):
        def __init__(self, mask):
            super().__init__(mask.shape[1], mask.shape[0])
            self.register_buffer("mask", mask.float())

        def forward(self, x):
            return F.linear(x, self.weight * self.mask, self.bias)

    layers = [Masked(m) for m in masks]
    watcher = MaskOnceWatcher.__new__(MaskOnceWatcher)
    watcher._steps, watcher._outputs, watcher._extended, watcher._chain_loc = 0, {}, set(), {}
    watcher.rec = type("Rec", (), {"here": lambda self: None})()
    h = torch.randn(4, d)
    for i, layer in enumerate(layers):
        out = layer(h)
        params = [("weight", layer.weight)]
        watcher._chain(layer, params, [("mask", layer.mask == 0)], (h,), out)
        h = torch.relu(out) if i < 2 else out
    return [c for key, (_n, c) in watcher._outputs.items() if key not in watcher._extended]


def _judge(chain):
    import types
    from graddoctor.instrument.maskonce import MaskOnceWatcher

    told = []
    fake = types.SimpleNamespace(rec=types.SimpleNamespace(
        here=lambda: None, finder=types.SimpleNamespace(is_user_file=lambda p: False),
        emit_aside=lambda made, loc: told.append(made[1])))
    MaskOnceWatcher._sees_itself(fake, chain, None)
    return told


def test_the_watcher_chains_masked_layers_through_activations_and_tells_a_loose_output():
    chains = _made_chains(">=", ">=")
    assert [len(c) for c in chains] == [3]
    told = _judge(chains[0])
    assert told and told[0]["layers"] == 3 and told[0]["inputs"] == 5 and told[0]["blocks"] == 2
    assert told[0]["seen"] >= 1


def test_a_strict_output_shifted_or_interleaved_made_is_not_told():
    assert _judge(_made_chains(">=", ">")[0]) == []
    assert _judge(_made_chains(">=", ">", interleave=True)[0]) == []
    assert _judge(_made_chains(">=", ">=", interleave=True)[0])  # interleaved and loose: told


def test_random_and_block_diagonal_masks_are_not_told():
    import torch

    g = torch.Generator().manual_seed(1)
    rand = [((torch.rand(16, 4, generator=g) < 0.6), None), ((torch.rand(8, 16, generator=g) < 0.6), None)]
    assert _judge(rand) == []
    blocks = torch.block_diag(*[torch.ones(4, 2, dtype=torch.bool)] * 2)
    assert _judge([(blocks, None), (blocks.t(), None)]) == []


def test_the_rule_points_at_the_last_loose_degree_comparison(tmp_path):
    from graddoctor import events as ev

    script = tmp_path / "train.py"
    script.write_text(
        "class MADE(nn.Module):\n"                                           # 1
        "    def __init__(self):\n"                                          # 2
        "        self.l1.set_mask(m1[:, None] >= m0[None, :])\n"             # 3
        "        self.l2.set_mask(m_out[:, None] >= m1[None, :])\n"          # 4
        "loss.backward()\n")                                                 # 5
    t = TraceBuilder(str(script))
    t.put(ev.mask_sees_itself(cls="MaskedLinear", layers=2, inputs=4, blocks=2, seen=3,
                              defined_at=[str(script), 1, 4]), 5)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [4]
    assert found[0].severity is Severity.WARNING and "strict" in found[0].fix
    # a strict comparison in the file: the comparisons are not all loose, the forward's line stays
    script.write_text(script.read_text().replace("m_out[:, None] >= m1", "m_out[:, None] > m1"))
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [5]
