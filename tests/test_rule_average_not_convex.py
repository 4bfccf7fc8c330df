"""average-not-convex (GD352): running averages of tensors whose two weights cannot sum to 1,
read from the source."""

from __future__ import annotations

import ast
import textwrap

from graddoctor.rules.average_not_convex import averages, extrapolations
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "average-not-convex"


def found(text):
    return [(line, old, new) for line, _acc, old, new in averages(ast.parse(textwrap.dedent(text)))]


def test_the_same_weight_on_both_terms_of_an_in_place_average():
    assert found("""
        decay = 0.999
        for e, p in zip(ema.parameters(), model.parameters()):
            e.mul_(decay).add_(p, alpha=decay)
            e.data.mul_(self.decay).add_(p.data, alpha=self.decay)
            e.copy_(decay * e + decay * p)
            e.mul_(decay).add_(decay * p)
    """) == [(4, "decay", "decay"), (5, "self.decay", "self.decay"), (6, "decay", "decay"),
             (7, "decay", "decay")]


def test_numbers_that_do_not_sum_to_one():
    assert found("""
        tau = 0.005
        target = 0.99 * target + 0.1 * online
        t.mul_(1 - tau).add_(p, alpha=0.05)
    """) == [(3, "0.99", "0.1"), (4, "1 - tau", "0.05")]


def test_averages_buffers_and_recurrences_that_are_right_or_unknown():
    assert found("""
        decay, m = 0.99, 0.9
        e.mul_(decay).add_(p, alpha=1 - decay)
        e.copy_(decay * e + (1 - decay) * p)
        e.lerp_(p, 1 - decay)
        buf.mul_(m).add_(g)
        buf.mul_(m).add_(g, alpha=1)
        avg = 0.5 * avg + 0.5 * p
        s.mul_(n / (n + 1)).add_(p, alpha=1 / (n + 1))
        h = a * h + a * x
        loss = lam * loss + lam * reg
        decay = 0.5
    """) == []


def test_the_rule_reads_the_files_whose_backwards_ran(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("import torch\nd = 0.99\nfor i in range(3):\n    loss.backward()\n"
                    "    e.mul_(d).add_(p, alpha=d)\n")
    t = TraceBuilder(str(path))
    t.optimizer(0, [0], line=1)
    t.backward(fresh=[0], line=4)
    t.step(0, line=4)
    f = only(t, SLUG)
    assert f.location.line == 5 and f.evidence["old_weight"] == "d" and "1 - d" in f.fix
    assert findings(TraceBuilder(str(tmp_path / "other.py")), SLUG) == []


def stepped_away(text):
    return [(line, acc, other, weight)
            for line, acc, other, weight in extrapolations(ast.parse(textwrap.dedent(text)))]


def test_an_average_stepped_away_from_the_value_it_follows():
    assert stepped_away("""
        slow.add_(slow - p, alpha=self.alpha)
        ema_p.data.sub_(p.data - ema_p.data, alpha=1 - decay)
        avg += 0.1 * (avg - p)
        target_w.add_(tau * (target_w - w))
    """) == [(2, "slow", "p", "self.alpha"), (3, "ema_p", "p", "1 - decay"), (4, "avg", "p", "0.1"),
             (5, "target_w", "w", "tau")]


def test_steps_toward_and_extrapolations_of_plain_iterates_are_not_read():
    assert stepped_away("""
        slow.add_(p - slow, alpha=alpha)
        ema.sub_(ema - p, alpha=1 - decay)
        avg -= 0.1 * (avg - p)
        x.add_(x - x_prev, alpha=beta)
        slow.add_(slow - p, alpha=-0.5)
    """) == []


def test_the_rule_reports_a_step_away_at_its_line(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("for x in loader:\n    model(x).sum().backward()\n    opt.step()\n"
                    "    for s, p in zip(slow, params):\n        s.add_(s - p, alpha=0.5)\n")
    t = TraceBuilder(str(path))
    t.optimizer(0, [0, 1], line=1)
    for _ in range(2):
        t.backward(fresh=[0, 1], line=2)
        t.step(line=3)
    # `s` names no average: a plain iterate may extrapolate on purpose
    assert findings(t, SLUG) == []
    path.write_text(path.read_text().replace("s.add_(s - p", "slow_p.add_(slow_p - p").replace(
        "for s, p", "for slow_p, p"))
    f = only(t, SLUG)
    assert f.location.line == 5 and "away from `p`" in f.message


def test_a_file_whose_optimizer_stepped_without_a_backward_is_read(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("for x in loader:\n    g = torch.autograd.grad(model(x).sum(), params)\n"
                    "    opt.step()\n    for slow_p, p in zip(slow, params):\n"
                    "        slow_p.add_(slow_p - p, alpha=0.5)\n")
    t = TraceBuilder(str(path))
    t.optimizer(0, [0, 1], line=1)
    t.step(0, line=3)
    t.step(0, line=3)
    assert only(t, SLUG).location.line == 5
