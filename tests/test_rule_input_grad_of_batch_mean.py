"""input-grad-of-batch-mean (GD392): torch.autograd.grad of a whole batch mean with respect to
inputs the script made differentiable (source; the fixtures run the rule end to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.input_grad_of_batch_mean import batch_mean_input_grads


def _found(src):
    return [(line, averaged, inputs) for line, _, averaged, inputs in batch_mean_input_grads(ast.parse(src))]


FORCES = ("pos = batch.clone().requires_grad_(True)\n"
          "e = model(pos)\n"
          "f = -torch.autograd.grad(e.mean(), pos, create_graph=True)[0]\n")


def test_forces_from_the_mean_energy():
    assert _found(FORCES) == [(3, "e", "pos")]


def test_keyword_form_torch_mean_and_requires_grad_keyword():
    src = ("x = torch.rand(8, 1, requires_grad=True)\n"
           "g = grad(outputs=torch.mean(net(x)), inputs=[x])\n")
    assert _found(src) == [(2, "net(x)", "x")]


def test_sum_ones_like_and_a_mean_over_a_dim_are_silent():
    assert _found(FORCES.replace("e.mean()", "e.sum()")) == []
    assert _found(FORCES.replace("e.mean()", "e.mean(1)")) == []
    assert _found(FORCES.replace("e.mean(), pos", "e, pos, grad_outputs=torch.ones_like(e)")) == []


def test_parameters_and_scale_free_uses_are_silent():
    assert _found("g = torch.autograd.grad(loss.mean(), params)\n") == []
    assert _found(FORCES + "x_adv = pos + 0.1 * f.sign()\n") == []
    assert _found(FORCES + "step = f / f.norm()\n") == []


def test_a_derivative_multiplied_back_by_the_batch_size_is_silent():
    grad = "torch.autograd.grad(e.mean(), pos, create_graph=True)[0]"
    for scaled in (f"-{grad} * pos.shape[0]", f"pos.size(0) * -{grad}", f"-{grad} * len(pos)",
                   f"-{grad} * n"):
        src = FORCES.replace(f"-{grad}", scaled).replace("f = ", "n = pos.shape[0]\nf = ")
        assert _found(src) == [], scaled
    through_name = FORCES + "f = f * pos.shape[0]\n"
    assert _found(through_name) == []
    # multiplied by something else than the batch size: still the mean's derivative
    assert _found(FORCES.replace(f"-{grad}", f"-{grad} * 2.0")) == [(3, "e", "pos")]
    assert _found(FORCES.replace(f"-{grad}", f"-{grad} * pos.shape[1]")) == [(3, "e", "pos")]
