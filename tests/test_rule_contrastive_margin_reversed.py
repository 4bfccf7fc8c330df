"""contrastive-margin-reversed (GD335): the source reading of contrastive sums."""

from __future__ import annotations

import ast

from graddoctor.rules.contrastive_margin_reversed import reversed_margins


def found(src: str):
    return reversed_margins(ast.parse(src))


def test_the_dissimilar_pairs_hinged_on_d_minus_margin_are_found_either_way_round():
    assert found("l = same * d.pow(2) + (1 - same) * F.relu(d - m).pow(2)\n") == [
        (1, "(1 - same) * F.relu(d - m).pow(2)", "d")]
    assert len(found("l = (1 - y) * d ** 2 + y * torch.clamp(d - margin, min=0) ** 2\n")) == 1


def test_silent_on_the_right_hinge_a_double_margin_and_unrelated_indicators():
    for src in ("l = same * d.pow(2) + (1 - same) * F.relu(m - d).pow(2)\n",
                "l = y * F.relu(d - m_pos).pow(2) + (1 - y) * F.relu(m_neg - d).pow(2)\n",
                "l = a * d ** 2 + b * F.relu(d - m) ** 2\n",
                "l = y * x ** 2 + (1 - y) * F.relu(d - m) ** 2\n"):
        assert found(src) == [], src


def test_terms_bound_to_names_are_read_through_their_binding():
    src = ("def step(same, d, m):\n"
           "    pos = same * d.pow(2)\n"
           "    neg = (1 - same) * F.relu(d - m).pow(2)\n"
           "    return (pos + neg).mean()\n")
    (line, term, distance), = found(src)
    assert line == 3 and distance == "d" and term.startswith("(1 - same)")
    right = src.replace("F.relu(d - m)", "F.relu(m - d)")
    assert found(right) == []
    rebound = src.replace("    return", "    neg = (1 - same) * F.relu(m - d).pow(2)\n    return")
    assert found(rebound) == []  # the sum reads the last binding


from graddoctor.rules.contrastive_margin_reversed import reversed_preferences


def preferences(src: str):
    return reversed_preferences(ast.parse(src))


def test_a_preference_loss_raising_the_rejected_side_is_found():
    assert preferences("loss = -F.logsigmoid(r_rejected - r_chosen).mean()\n") == [
        (1, "F.logsigmoid(r_rejected - r_chosen)", "chosen")]
    assert len(preferences("loss = F.softplus(r_w - r_l).mean()\n")) == 1
    assert len(preferences("loss = F.relu(margin - loser_score + winner_score).mean()\n")) == 1
    assert len(preferences("loss = -torch.log(torch.sigmoid(bad - good)).mean()\n")) == 1


def test_dpo_log_ratios_are_read_through_their_bindings_the_reference_left_out():
    src = ("def dpo_loss(pc, pr, rc, rr):\n"
           "    pi_logratios = policy_rejected_logps - policy_chosen_logps\n"
           "    ref_logratios = reference_rejected_logps - reference_chosen_logps\n"
           "    logits = pi_logratios - ref_logratios\n"
           "    losses = -F.logsigmoid(beta * logits)\n"
           "    return losses.mean()\n")
    (line, _, side), = preferences(src)
    assert line == 2 and side == "chosen"
    right = src.replace("policy_rejected_logps - policy_chosen_logps",
                        "policy_chosen_logps - policy_rejected_logps").replace(
        "reference_rejected_logps - reference_chosen_logps",
        "reference_chosen_logps - reference_rejected_logps")
    assert preferences(right) == []
    ipo = "logits = rejected_logratios - chosen_logratios\nloss = ((logits - 1 / (2 * beta)) ** 2).mean()\n"
    assert [f[0] for f in preferences(ipo)] == [1]
    assert preferences(ipo.replace("rejected_logratios - chosen_logratios",
                                   "chosen_logratios - rejected_logratios")) == []


def test_silent_on_right_preferences_pos_neg_distances_and_values_not_minimised():
    for src in ("loss = -F.logsigmoid(r_chosen - r_rejected).mean()\n",
                "loss = F.softplus(r_rejected - r_chosen).mean()\n",
                "loss = F.logsigmoid(r_rejected - r_chosen).mean()\n",
                "loss = F.relu(d_pos - d_neg + margin).mean()\n",  # a triplet's distances
                "loss = -F.logsigmoid(pos_score - neg_score).mean()\n",
                "acc = -F.logsigmoid(r_rejected - r_chosen).mean()\n",  # not a loss
                "chosen_rewards = beta * (policy_chosen_logps - reference_chosen_logps)\n"):
        assert preferences(src) == [], src


def test_a_kl_penalty_added_to_a_reward_is_found():
    assert preferences("rewards = score + kl_coef * kl\n") == [(1, "score + kl_coef * kl", "kl")]
    assert len(preferences("rewards = -KL_COEF * (ref_logps - old_logps)\n")) == 1
    assert len(preferences("reward += beta * (logp - ref_logp)\n")) == 1
    for src in ("rewards = score - kl_coef * kl\n",
                "rewards = -KL_COEF * (old_logps - ref_logps)\n",
                "loss = pg_loss + beta * kl\n",
                "reward -= beta * (logp - ref_logp)\n"):
        assert preferences(src) == [], src


def test_a_preference_loss_called_with_its_sides_swapped():
    import ast as _ast

    from graddoctor.rules.contrastive_margin_reversed import swapped_preference_calls

    source = """
import torch.nn.functional as F
def dpo_loss(pi_chosen, pi_rejected, ref_chosen, ref_rejected, beta=0.1):
    return -F.logsigmoid(beta * ((pi_chosen - ref_chosen) - (pi_rejected - ref_rejected))).mean()
def pick(chosen, rejected):
    return chosen
a = dpo_loss(lp_rejected, lp_chosen, ref_rejected, ref_chosen)
b = dpo_loss(lp_chosen, lp_rejected, ref_chosen, ref_rejected)
c = dpo_loss(pi_rejected=lp_rejected, pi_chosen=lp_chosen, ref_chosen=ref_c, ref_rejected=ref_r)
d = dpo_loss(lp_rejected, lp_chosen, ref_chosen, ref_rejected)
e = pick(rejected, chosen)
"""
    found = swapped_preference_calls(_ast.parse(source))
    assert [(line, function, side) for line, _, function, side in found] == [(7, "dpo_loss", "chosen")]
