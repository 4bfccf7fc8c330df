"""scale-never-applied (GD400): which coefficients a function computes and never reads (source
only; the fixtures run the rule end to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.scale_never_applied import unapplied_scales


def _names(code: str) -> list[str]:
    return [name for _, name, _, _ in unapplied_scales(ast.parse(code))]


def test_unapplied_coefficients_are_found():
    assert _names("def f(x, s):\n    c_in = 1 / (s ** 2 + 1).sqrt()\n    c_out = s / (s ** 2 + 1).sqrt()\n"
                  "    return c_out * net(x)") == ["c_in"]
    assert _names("def loss(p, y, snr):\n    weights = snr.clamp(max=5) / snr\n"
                  "    return ((p - y) ** 2).mean()") == ["weights"]
    assert _names("def train():\n    scale = d ** -0.5\n    l = (q @ k).sum()\n    l.backward()") == ["scale"]


def test_applied_logged_constant_and_private_are_silent():
    assert _names("def f(x, s):\n    c_in = 1 / (s ** 2 + 1).sqrt()\n    return net(c_in * x)") == []
    assert _names("def f(x, s):\n    c_in = 1 / (1 + s ** 2).sqrt()\n"
                  "    return net(x / (s ** 2 + 1).sqrt())") == []  # written out inline
    assert _names("def f(e, s):\n    weight = s * 2\n    g = lambda v: v * weight\n    return g(e)") == []
    assert _names("def f(e, s):\n    scale = 0.5\n    return e") == []  # a constant
    assert _names("def f(e, s):\n    _scale = s * 2\n    return e") == []
    assert _names("def f(e, s):\n    acc = s * 2\n    return e") == []  # no coefficient's name
    assert _names("def f(e, s):\n    weight = s * 2\n    print(weight)") == []  # no return, no backward


def test_an_inverse_sqrt_scale_beside_default_scaled_attention():
    sdpa = "    return F.scaled_dot_product_attention(q, k, v{})\n"
    for value in ("q.size(-1) ** -0.5", "1 / math.sqrt(d)", "1.0 / d ** 0.5", "torch.rsqrt(d)"):
        src = f"def f(q, k, v, d):\n    scale = {value}\n" + sdpa.format("")
        assert _names(src) == [], value  # the kernel divides by sqrt(d) itself
    # a scale of another value, or one the call overrides, is still left unapplied
    assert _names("def f(q, k, v, d):\n    scale = 1 / d\n" + sdpa.format("")) == ["scale"]
    assert _names("def f(q, k, v, d):\n    scale = d ** -0.5\n" + sdpa.format(", scale=1.0")) == ["scale"]
    # without the kernel the scale is missing from the scores
    assert _names("def f(q, k, v, d):\n    scale = d ** -0.5\n    return (q @ k).softmax(-1) @ v\n") == ["scale"]
