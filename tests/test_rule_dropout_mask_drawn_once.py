"""dropout-mask-drawn-once (GD325): the source reading on small modules, drawn once or not."""

from __future__ import annotations

import ast
import textwrap

from graddoctor.rules.dropout_mask_drawn_once import masks_drawn_once


def found(src: str) -> list[dict]:
    return masks_drawn_once(ast.parse(textwrap.dedent(src)))


DRAWN_ONCE = """
class M(nn.Module):
    def __init__(self, h, p):
        super().__init__()
        self.mask = torch.bernoulli(torch.full((h,), 1 - p))
    def forward(self, x):
        if self.training:
            x = x * self.mask
        return x
"""


def test_a_mask_drawn_in_init_and_applied_in_training_is_found_at_the_draw():
    (hit,) = found(DRAWN_ONCE)
    assert hit["cls"] == "M" and hit["mask"] == "mask" and hit["drawn"] == 5 and hit["applied"] == 8


def test_a_compared_uniform_draw_kept_as_a_buffer_counts_too():
    src = DRAWN_ONCE.replace("self.mask = torch.bernoulli(torch.full((h,), 1 - p))",
                             "self.register_buffer('mask', (torch.rand(h) < 1 - p).float())")
    assert len(found(src)) == 1


def test_silent_when_redrawn_in_place_or_reassigned_elsewhere():
    resample = DRAWN_ONCE + """
    def resample(self):
        self.mask.bernoulli_(0.5)
"""
    assert found(resample) == []
    reassigned = DRAWN_ONCE + """
model = M(4, 0.5)
for step in range(3):
    model.mask = torch.bernoulli(torch.full((4,), 0.5))
"""
    assert found(reassigned) == []


def test_silent_on_a_weight_mask_and_on_a_mask_used_in_both_modes():
    weight = DRAWN_ONCE.replace("x = x * self.mask", "w = self.fc.weight * self.mask")
    assert found(weight) == []
    both = DRAWN_ONCE.replace("        if self.training:\n            x = x * self.mask",
                              "        x = x * self.mask")
    assert found(both) == []


def test_silent_on_random_features_that_are_not_masks():
    src = DRAWN_ONCE.replace("torch.bernoulli(torch.full((h,), 1 - p))", "torch.randn(h, h)")
    assert found(src) == []


def test_a_scaled_mask_drawn_before_the_loop_is_found_at_its_draw():
    from graddoctor.rules.dropout_mask_drawn_once import loop_masks_drawn_once
    src = textwrap.dedent("""\
        drop = torch.bernoulli(torch.full((1, 64), 0.5)) * 2
        for step in range(9):
            h = torch.relu(enc(x)) * drop
            loss = dec(h).pow(2).mean()
        """)
    (hit,) = loop_masks_drawn_once(ast.parse(src))
    assert hit["drawn"] == 1 and hit["applied"] == 3 and hit["mask"] == "drop"
    inside = "def train():\n" + textwrap.indent(src, "    ")
    assert [h["drawn"] for h in loop_masks_drawn_once(ast.parse(inside))] == [2]
    unscaled = src.replace(" * 2\n", "\n")  # a 0/1 mask of observed entries: data
    assert loop_masks_drawn_once(ast.parse(unscaled)) == []
    redrawn = src.replace("    loss =", "    drop = torch.bernoulli(torch.full((1, 64), 0.5)) * 2\n    loss =")
    assert loop_masks_drawn_once(ast.parse(redrawn)) == []


def test_a_scaled_mask_drawn_at_the_top_and_applied_in_a_function_is_found():
    from graddoctor.rules.dropout_mask_drawn_once import loop_masks_drawn_once
    src = textwrap.dedent("""\
        mask = torch.bernoulli(torch.ones(40) * 0.5) / 0.5
        def forward(x):
            h = torch.relu(x @ W1) * mask
            return h @ W2
        for step in range(9):
            loss = forward(x).sum()
        """)
    (hit,) = loop_masks_drawn_once(ast.parse(src))
    assert hit["drawn"] == 1 and hit["method"] == "forward"
    redrawn = src.replace("    loss =", "    mask = torch.bernoulli(torch.ones(40) * 0.5) / 0.5\n    loss =")
    assert loop_masks_drawn_once(ast.parse(redrawn)) == []
