"""noise-schedule-swapped (GD338): which sums of a clean sample and a noise have their
diffusion coefficients swapped (source only; the fixtures run the rule end to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.noise_schedule_swapped import swapped_forward_steps


def _hits(code: str) -> int:
    return len(swapped_forward_steps(ast.parse(code)))


def test_swapped_forward_steps_are_found():
    assert _hits("x_t = sqrt_one_minus_ab[t] * x0 + sqrt_ab[t] * noise") == 1
    assert _hits("x = torch.sqrt(1 - alphas_cumprod[t]) * x0 + torch.sqrt(alphas_cumprod[t]) * eps") == 1
    assert _hits("x = extract(self.sqrt_one_minus_alphas_cumprod, t, s) * x_start"
                 " + extract(self.sqrt_alphas_cumprod, t, s) * torch.randn_like(x_start)") == 1


def test_correct_sums_are_silent():
    assert _hits("x_t = sqrt_ab[t] * x0 + sqrt_one_minus_ab[t] * noise") == 0
    assert _hits("v = sqrt_ab * noise - sqrt_one_minus_ab * x0") == 0  # a v target: a difference
    assert _hits("x_prev = ab_prev.sqrt() * x0_pred + (1 - ab_prev).sqrt() * eps") == 0
    assert _hits("x_t = (1 - t) * x0 + t * noise") == 0  # flow matching: no alpha named
    assert _hits("y = a * x + b * noise") == 0


def test_a_sum_with_a_negated_term_is_no_forward_step():
    # v-prediction's target written as a sum: the minus on the clean sample's coefficient
    assert _hits("v = -sigma_t * x0 + alpha_t * noise") == 0
    assert _hits("v = alpha_t * noise + sigma_t * (-x0)") == 0
    assert _hits("v = sqrt_alphas_cumprod[t] * eps + -1.0 * sqrt_one_minus_alphas_cumprod[t] * x0") == 0
    # the swapped step itself is still found
    assert _hits("x_t = sigma_t * x0 + alpha_t * noise") == 1


def _velocity_hits(code: str) -> int:
    from graddoctor.rules.noise_schedule_swapped import swapped_velocity_targets
    return len(swapped_velocity_targets(ast.parse(code)))


def test_velocity_target_with_operands_swapped_is_found():
    step = "x_t = a * x0 + s * noise\n"
    assert _velocity_hits(step + "v = a * x0 - s * noise") == 1
    assert _velocity_hits(step + "v = x0 * a - noise * s") == 1
    assert _velocity_hits("def f(x0, t):\n    eps = torch.randn_like(x0)\n"
                          "    x_t = ab[t].sqrt() * x0 + (1 - ab[t]).sqrt() * eps\n"
                          "    return x_t, ab[t].sqrt() * x0 - (1 - ab[t]).sqrt() * eps") == 1


def test_velocity_targets_and_conversions_are_silent():
    step = "x_t = a * x0 + s * noise\n"
    assert _velocity_hits(step + "v = a * noise - s * x0") == 0
    assert _velocity_hits(step + "x0_hat = a * x_t - s * v_pred") == 0
    assert _velocity_hits(step + "d = b * x0 - c * noise") == 0  # other coefficients than the step's
    assert _velocity_hits("v = a * x0 - s * noise") == 0  # no forward step in the scope
    # the step in another function: each scope on its own
    assert _velocity_hits("def f():\n    x_t = a * x0 + s * noise\n"
                          "def g():\n    v = a * x0 - s * noise") == 0
