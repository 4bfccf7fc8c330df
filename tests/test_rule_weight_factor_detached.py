"""weight-factor-detached (GD366): in a forward, a product or quotient reading a module
attribute through .data/.detach() in one factor and with its gradient in another (source only;
the fixtures run the rule end to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.weight_factor_detached import detached_factors


def _found(body: str):
    src = "class M:\n    def forward(self, x):\n" + "".join(f"        {l}\n" for l in body.splitlines())
    return [(line, attribute) for line, _, attribute in detached_factors(ast.parse(src))]


def test_weight_norm_with_v_data_in_the_numerator():
    assert _found("w = self.g * self.v.data / self.v.norm(dim=1, keepdim=True)\nreturn w") == [(3, "self.v")]


def test_the_gradient_read_through_a_local_name_and_a_shape_only_view():
    body = "n = self.v.flatten(1).norm(dim=1)\nw = self.v.detach().view(4, -1) / n\nreturn w"
    assert _found(body) == [(4, "self.v")]


def test_straight_through_no_grad_and_another_tensor_are_silent():
    assert _found("w = self.w + (torch.round(self.w) - self.w).detach()\nreturn w") == []
    assert _found("with torch.no_grad():\n    self.u.copy_(self.w.data * 2 / self.w.norm())\nreturn x") == []
    assert _found("w = self.teacher.detach() * self.w\nreturn w") == []
    assert _found("w = self.g * self.v / self.v.norm()\nreturn w") == []


def test_outside_forward_is_not_read():
    src = "class M:\n    def update(self):\n        w = self.g * self.v.data / self.v.norm()\n"
    assert detached_factors(ast.parse(src)) == []
