"""ema-target-same-input (GD398): which pairs of calls give a network and its averaged copy the
same arguments and compare the results (source only; the fixtures run the rule end to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.ema_target_same_input import averaged_copies, same_input_pairs


def _hits(code: str) -> list:
    return same_input_pairs(ast.parse(code), code)


_HEAD = "ema = AveragedModel(model)\n"


def test_copies_are_read_from_deepcopy_and_update_loops():
    assert averaged_copies(ast.parse("t = AveragedModel(s).eval()")) == {("t", "s"), ("t.module", "s")}
    assert averaged_copies(ast.parse("t = copy.deepcopy(s)")) == set()  # a frozen reference
    loop = ("for a, b in zip(online.parameters(), target.parameters()):\n"
            "    b.data.mul_(0.99).add_(a.data, alpha=0.01)\n")
    assert averaged_copies(ast.parse(loop)) == {("target", "online")}


def test_same_arguments_compared_are_found():
    assert len(_hits(_HEAD + "p = model(x, t)\ntg = ema(x, t)\nloss = ((p - tg) ** 2).mean()")) == 1
    assert len(_hits(_HEAD + "p = f(model, x + s * z, s)\nwith torch.no_grad():\n"
                     "    tg = f(ema, x + s * z, s)\nloss = mse(p, tg)")) == 1
    assert len(_hits(_HEAD + "loss = mse(model(x, s), ema(x, s).detach())")) == 1


def test_different_or_uncompared_inputs_are_silent():
    assert _hits(_HEAD + "p = f(model, x + s1 * z, s1)\ntg = f(ema, x + s0 * z, s0)\nl = mse(p, tg)") == []
    assert _hits(_HEAD + "p = model(aug(x), s)\ntg = ema(aug(x), s)\nl = mse(p, tg)") == []  # draws
    assert _hits(_HEAD + "p = model(x, s)\nx = x + n\ntg = ema(x, s)\nl = mse(p, tg)") == []  # rebound
    assert _hits(_HEAD + "p = model(x, s)\ntg = ema(x, s)\nl1 = mse(p, y)\nl2 = mse(tg, y)") == []  # logged
    assert _hits("p = student(x, s)\ntg = teacher(x, s)\nl = mse(p, tg)") == []  # no copy: distillation
    assert _hits("ref = copy.deepcopy(policy)\np = lp(policy, ids, m)\nr = lp(ref, ids, m)\n"
                 "kl = p - r") == []  # a frozen reference, never averaged
    assert _hits(_HEAD + "p = model(x)\ntg = ema(x)\nl = mse(p, tg)") == []  # one argument
    assert _hits(_HEAD + "net = nn.Sequential(nn.Dropout(0.1))\np = model(x, s)\ntg = ema(x, s)\n"
                 "l = mse(p, tg)") == []  # dropout makes the two differ


def test_a_gap_logged_under_no_grad_is_no_loss():
    logged = (_HEAD + "p = model(x, t)\nloss = mse(p, eps)\nwith torch.no_grad():\n"
              "    tg = ema(x, t)\n    gap = (p.detach() - tg).pow(2).mean()\n")
    assert _hits(logged) == []
    assert _hits(_HEAD + "p = model(x, t)\ntg = ema(x, t)\ngap = ((p - tg) ** 2).mean().item()") == []
    # the target under no_grad and the loss outside it is the bug
    assert len(_hits(logged.replace("    gap = (p.detach() - tg).pow(2).mean()\n",
                                    "loss = ((p - tg) ** 2).mean()\n"))) == 1


def test_the_averaged_models_module_is_the_copy():
    assert len(_hits(_HEAD + "p = model(x, t)\nwith torch.no_grad():\n    tg = ema.module(x, t)\n"
                     "loss = ((p - tg) ** 2).mean()")) == 1
    assert _hits(_HEAD + "p = model(x2, t2)\nwith torch.no_grad():\n    tg = ema.module(x, t)\n"
                 "loss = ((p - tg) ** 2).mean()") == []
