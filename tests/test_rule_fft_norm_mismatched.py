"""fft-norm-mismatched (GD391): a Fourier transform and its inverse in one function under
different norm conventions (source only; the fixtures run the rule end to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.fft_norm_mismatched import mismatched_fft_pairs


def _found(src):
    return [(line, norm, other, other_norm) for line, _, norm, other, _, other_norm
            in mismatched_fft_pairs(ast.parse(src))]


def test_an_ortho_transform_undone_with_the_default_norm():
    src = ("def f(x):\n    x_ft = torch.fft.rfft2(x, norm='ortho')\n"
           "    return torch.fft.irfft2(x_ft, s=(4, 4))\n")
    assert _found(src) == [(2, "ortho", 3, "backward")]


def test_the_finding_goes_to_the_side_that_spells_its_norm():
    src = "def f(x):\n    y = fft.fft(x)\n    return fft.ifft(y, norm='forward')\n"
    assert _found(src) == [(3, "forward", 2, "backward")]


def test_matched_pairs_one_sided_scopes_and_names_are_silent():
    assert _found("def f(x):\n    return torch.fft.irfft(torch.fft.rfft(x))\n") == []
    assert _found("def f(x):\n    return torch.fft.ifft(torch.fft.fft(x, norm='ortho'), norm='ortho')\n") == []
    assert _found("def f(x):\n    return torch.fft.rfft(x, norm='ortho').abs()\n"
                  "def g(y):\n    return torch.fft.irfft(y)\n") == []
    assert _found("def f(x, n):\n    return torch.fft.irfft(torch.fft.rfft(x, norm=n))\n") == []


def test_an_inverse_must_be_of_what_a_transform_produced():
    # noise synthesised from a random spectrum beside a spectral loss: no inverse undoes a transform
    unpaired = ("def f(x):\n    spec = torch.randn(4, 9, dtype=torch.cfloat)\n"
                "    noise = torch.fft.irfft(spec, n=16)\n"
                "    return torch.fft.rfft(x + noise, norm='ortho').abs()\n")
    assert _found(unpaired) == []
    # the spectrum reaches the inverse through an item write and a helper's result: a pair
    through = ("def f(x, w):\n    x_ft = torch.fft.rfft2(x, norm='ortho')\n"
               "    out_ft = torch.zeros_like(x_ft)\n"
               "    out_ft[:, :, :4] = mul(x_ft[:, :, :4], w)\n"
               "    return torch.fft.irfft2(out_ft, s=(8, 8))\n")
    assert _found(through) == [(2, "ortho", 5, "backward")]


def test_a_scope_mixing_norms_on_one_side_is_left_alone():
    src = ("def f(x):\n    a = torch.fft.rfft(x, norm='ortho')\n    b = torch.fft.rfft(x)\n"
           "    return torch.fft.irfft(a)\n")
    assert _found(src) == []


def test_module_level_calls_are_not_mixed_with_a_functions():
    src = ("a = torch.fft.rfft(x, norm='ortho')\n"
           "def f(y):\n    return torch.fft.irfft(y)\n")
    assert _found(src) == []
