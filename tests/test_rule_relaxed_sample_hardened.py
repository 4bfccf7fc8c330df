"""relaxed-sample-hardened (GD356): a Gumbel-softmax sample replaced by its hard one-hot with
no straight-through estimator (source only; the fixtures run the rule end to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.relaxed_sample_hardened import hardened_samples


def _found(src):
    return [(s["line"], s["hard"], s["soft"]) for s in hardened_samples(ast.parse(src))]


def test_a_hard_one_hot_returned_without_straight_through():
    src = ("def gumbel_softmax(logits, tau):\n"
           "    y = F.softmax((logits + sample_gumbel(logits)) / tau, dim=-1)\n"
           "    y_hard = F.one_hot(y.argmax(dim=-1), 8).float()\n"
           "    return y_hard\n")
    assert _found(src) == [(4, "y_hard", "y")]


def test_a_scattered_one_hot_given_to_a_decoder():
    src = ("def q(self, logits, temperature):\n"
           "    soft = F.softmax(logits / temperature, -1)\n"
           "    idx = soft.max(-1)[1]\n"
           "    hard = torch.zeros_like(soft).scatter_(-1, idx.unsqueeze(-1), 1.0)\n"
           "    return self.decoder(hard)\n")
    assert _found(src) == [(5, "hard", "soft")]


def test_straight_through_both_returned_no_grad_and_predictions_are_silent():
    head = ("def f(logits, tau):\n    y = F.softmax(logits / tau, -1)\n"
            "    y_hard = F.one_hot(y.argmax(-1), 4).float()\n")
    assert _found(head + "    return (y_hard - y).detach() + y\n") == []
    assert _found(head + "    return y_hard - y.detach() + y\n") == []
    assert _found(head + "    return y_hard, y\n") == []
    assert _found(head + "    return F.mse_loss(y_hard, target)\n") == []
    assert _found("def predict(x):\n    p = F.softmax(net(x), -1)\n"
                  "    return F.one_hot(p.argmax(-1), 4)\n") == []
    assert _found("def act(logits, tau):\n    with torch.no_grad():\n"
                  "        y = F.softmax(logits / tau, -1)\n"
                  "        a = F.one_hot(y.argmax(-1), 4)\n        env.step(a)\n") == []
