"""balance-residual-signs (GD360): a GFlowNet balance residual with a term on the wrong side
(source only; the fixtures run the rule end to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.balance_residual_signs import misaligned_balances


def _found(src):
    return [(line, kind, against) for line, _, kind, against in misaligned_balances(ast.parse(src))]


def test_a_backward_policy_added_on_the_forward_side():
    assert _found("loss = (log_z + log_pf - log_reward(x) + log_pb).pow(2).mean()\n") == [
        (1, "backward", "forward")]
    assert _found("loss = F.mse_loss(logZ + logPF + logPB, log_r)\n") == [(1, "backward", "forward")]


def test_a_residual_assigned_then_squared_and_a_detailed_balance():
    src = "def f():\n    delta = log_F + log_pf - log_F_next + log_pb\n    return torch.square(delta)\n"
    assert _found(src) == [(2, "backward", "forward")]


def test_the_one_term_against_the_others_is_named():
    assert _found("l = (log_z + log_pf + log_reward - log_pb) ** 2\n") == [(1, "reward", "forward")]
    assert _found("l = (log_z - log_pf - log_reward - log_pb) ** 2\n") == [(1, "forward", "partition")]


def test_consistent_balances_and_unsquared_sums_are_silent():
    for src in ("l = (log_z + log_pf - log_r - log_pb).pow(2)\n",
                "l = ((log_r + log_pb.sum(1) - self.log_z - log_pf.sum(1)) ** 2).mean()\n",
                "l = F.mse_loss(logZ + traj_logpf, log_r + traj_logpb)\n",
                "l = (model.log_z + log_pf - log_reward(seq)).pow(2)\n",
                "logged = (log_pf + log_pb).mean()\n",
                "l = (log_pf + log_pb - log_pf + log_pb) ** 2\n"):
        assert _found(src) == [], src
