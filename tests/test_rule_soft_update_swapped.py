"""soft-update-swapped (GD186): hand-written ``model_copy`` events over scripts written to a
temporary folder (the rule reads the script's hand-written writes to find the update's line),
and the measure of a copy's move (``copies._followed``) on real tensors."""

from __future__ import annotations

import textwrap

import torch

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument.copies import _followed
from graddoctor.trace import TraceBuilder
from rule_traces import P, findings, only

SLUG = "soft-update-swapped"

TD3 = """\
import copy
critic = make()
critic_target = copy.deepcopy(critic)
opt = torch.optim.Adam(critic.parameters())
for step in range(10):
    with torch.no_grad():
        y = r + gamma * critic_target(s2)
    loss = ((critic(s) - y) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    for p, tp in zip(critic.parameters(), critic_target.parameters()):
        tp.data.copy_(tau * tp.data + (1 - tau) * p.data)
"""

TWO_LINES = """\
import copy
critic = make()
critic_target = copy.deepcopy(critic)
opt = torch.optim.Adam(critic.parameters())
for step in range(10):
    with torch.no_grad():
        y = r + gamma * critic_target(s2)
    loss = ((critic(s) - y) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    for p, tp in zip(critic.parameters(), critic_target.parameters()):
        tp.data.mul_(tau)
        tp.data.add_((1 - tau) * p.data)
"""


def _script(tmp_path, text, name="train.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _trace(path, shares=(0.995,) * 4, cos=1.0, exact=False, equal=True, targets=9,
           copy="critic_target", model="critic", forward_line=7):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=4)
    for _ in range(len(shares) + 1):
        t.backward(fresh=P, line=9)
        t.step(line=9)
    follows = [[i + 1, share, cos, exact] for i, share in enumerate(shares)]
    t.put(ev.model_copy(copy=copy, model=model, opt=0, params=4, equal=equal, forwards=targets,
                        targets=targets, written=True, written_step=1, measured=len(shares),
                        pulls=[], follows=follows), forward_line)
    return t


def test_a_copy_moved_most_of_the_way_at_a_constant_weight_is_a_warning_at_its_update(tmp_path):
    f = only(_trace(_script(tmp_path, TD3)), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 11
    assert "99.5% of the way" in f.message and "critic_target" in f.message
    assert "0.005" in f.fix and "0.995" in f.fix


def test_a_blend_split_over_two_lines_is_reported_where_the_model_is_added(tmp_path):
    assert only(_trace(_script(tmp_path, TWO_LINES)), SLUG).location.line == 12


def test_silent_when_the_copy_keeps_most_of_itself_or_covers_half_the_way(tmp_path):
    path = _script(tmp_path, TD3)
    assert findings(_trace(path, shares=(0.005,) * 4), SLUG) == []
    assert findings(_trace(path, shares=(0.5,) * 4), SLUG) == []  # SWA's first average


def test_silent_on_hard_syncs_and_on_a_single_update(tmp_path):
    path = _script(tmp_path, TD3)
    assert findings(_trace(path, shares=(1.0,) * 4, exact=True), SLUG) == []
    assert findings(_trace(path, shares=(0.999999,) * 4), SLUG) == []  # a sync by arithmetic
    assert findings(_trace(path, shares=(0.995,)), SLUG) == []


def test_silent_on_a_decay_that_warms_up(tmp_path):
    path = _script(tmp_path, TD3)
    tf_style = [1 - (1 + n) / (10 + n) for n in range(1, 6)]  # 0.82, 0.75, ...: all over 1/2
    assert findings(_trace(path, shares=tf_style), SLUG) == []
    assert findings(_trace(path, shares=(0.9995, 0.999, 0.9985)), SLUG) == []  # a slow ramp


def test_silent_on_a_move_off_the_way_to_the_model_or_a_copy_that_is_no_follower(tmp_path):
    path = _script(tmp_path, TD3)
    assert findings(_trace(path, cos=0.5), SLUG) == []


EVAL_EMA = """\
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
model = make()
ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.01))
opt = torch.optim.Adam(model.parameters())
for step in range(10):
    loss = F.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    ema.update_parameters(model)
"""


def _eval_trace(path, shares=(0.99,) * 4, pulls=()):
    t = TraceBuilder(path)
    t.optimizer(0, P, line=4)
    for _ in range(len(shares) + 1):
        t.backward(fresh=P, line=7)
        t.step(line=7)
    follows = [[i + 1, share, 1.0, False] for i, share in enumerate(shares)]
    t.trace.put(ev.model_copy(copy="ema", model="model", opt=0, params=4, equal=True, forwards=0,
                        targets=0, written=True, written_step=1, measured=len(shares),
                        pulls=list(pulls), follows=follows))  # no forward: no location
    return t


def test_an_average_kept_for_evaluation_is_reported_where_it_is_made_with_its_decay(tmp_path):
    f = only(_eval_trace(_script(tmp_path, EVAL_EMA)), SLUG)
    assert f.location.line == 3 and f.severity is Severity.WARNING
    assert "kept to evaluate or save" in f.message and "updates are not changed" in f.message
    assert "decay" in f.fix and "0.99" in f.fix and "tp.lerp_" not in f.fix


def test_an_evaluation_average_written_by_hand_is_reported_at_its_blend(tmp_path):
    text = EVAL_EMA.replace("    ema.update_parameters(model)\n", "    for e, p in zip(ema.parameters(), "
                            "model.parameters()):\n        e.mul_(0.01).add_(p, alpha=0.99)\n")
    f = only(_eval_trace(_script(tmp_path, text)), SLUG)
    assert f.location.line == 9 and "tp.lerp_" in f.fix


def test_silent_on_slow_weights_the_model_is_reset_to(tmp_path):
    path = _script(tmp_path, EVAL_EMA)
    reset = [[2, 1.0, 1.0, True], [4, 1.0, 1.0, True]]  # Lookahead, Reptile: model := copy
    assert findings(_eval_trace(path, shares=(0.8,) * 2, pulls=reset), SLUG) == []
    assert findings(_eval_trace(path, shares=(0.3,) * 4), SLUG) == []  # an EMA that keeps most


def test_a_copy_already_a_rounding_away_at_the_first_step_is_still_judged(tmp_path):
    # MoCo's update runs before the backward: at the first step the copy is 0.01 * k + 0.99 * q
    assert only(_trace(_script(tmp_path, TD3), equal=False), SLUG).location.line == 11


def test_without_a_write_in_the_script_the_finding_stays_at_the_copys_forward(tmp_path):
    path = _script(tmp_path, TD3.replace("        tp.data.copy_(tau * tp.data + (1 - tau) * p.data)\n",
                                         "        blend(tp, p)\n"))
    assert only(_trace(path), SLUG).location.line == 7


def test_the_write_that_names_the_copy_is_chosen_among_several(tmp_path):
    text = TD3 + textwrap.dedent("""\
        for p, ep in zip(critic.parameters(), ema.parameters()):
            ep.mul_(0.99).add_(p, alpha=0.01)
    """)
    assert only(_trace(_script(tmp_path, text)), SLUG).location.line == 11


def test_the_move_of_a_copy_is_measured_as_its_share_of_the_way_to_the_model():
    torch.manual_seed(0)
    copy, model = torch.randn(300, dtype=torch.float64), torch.randn(300, dtype=torch.float64)
    share, cos, exact = _followed(copy, 0.995 * model + 0.005 * copy, model)
    assert abs(share - 0.995) < 1e-6 and cos > 0.999999 and not exact
    assert _followed(copy, model.clone(), model)[2] is True
    assert _followed(copy, copy.clone(), model) is None
    assert _followed(model, model + 1.0, model) is None  # no way left to cover


def test_a_hard_sync_beside_the_blend_is_not_taken_for_it(tmp_path):
    text = TD3 + "    if step % 100 == 0:\n        critic_target.load_state_dict(critic.state_dict())\n"
    assert only(_trace(_script(tmp_path, text)), SLUG).location.line == 11


def test_blends_in_several_loops_none_naming_the_copy_leave_the_finding_at_its_forward(tmp_path):
    text = TD3.replace("zip(critic.parameters(), critic_target.parameters())",
                       "zip(net.parameters(), tgt.parameters())") + textwrap.dedent("""\
        for p, ep in zip(net.parameters(), ema.parameters()):
            ep.mul_(0.99).add_(p, alpha=0.01)
    """)
    assert only(_trace(_script(tmp_path, text)), SLUG).location.line == 7
