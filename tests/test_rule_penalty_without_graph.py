"""penalty-without-graph (GD237): hand-written traces over small scripts on disk (the rule
follows the autograd.grad result through the source to the backpropagated loss)."""

from __future__ import annotations

import textwrap

from graddoctor import events as ev
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "penalty-without-graph"

PENALTY = """\
import torch
for x, y in data:
    x.requires_grad_(True)
    out = model(x)
    g, = torch.autograd.grad(out.sum(), x, retain_graph=True)
    penalty = ((g.norm(2, dim=1) - 1) ** 2).mean()
    loss = crit(out, y) + 10 * penalty
    loss.backward()
"""

FGSM = """\
import torch
for x, y in data:
    x.requires_grad_(True)
    g, = torch.autograd.grad(crit(model(x), y), x)
    x_adv = (x + 0.1 * g.sign()).detach()
    loss = crit(model(x_adv), y)
    loss.backward()
"""

HELPER = """\
import torch
def gradient_penalty(d, real):
    real.requires_grad_(True)
    g = torch.autograd.grad(outputs=d(real).sum(), inputs=real)[0]
    return g.pow(2).sum(1).mean()
for real in data:
    gp = gradient_penalty(D, real)
    loss = D(real).mean() + gp
    loss.backward()
"""


def traced(tmp_path, text, grad_line, create_graph=False, of_data=False):
    path = tmp_path / "train.py"
    path.write_text(text)
    t = TraceBuilder(str(path))
    t.optimizer(0, [0], line=1)
    for _ in range(2):
        t.put(ev.functional_grad(api="torch.autograd.grad", create_graph=create_graph, of_data=of_data),
              grad_line)
        t.backward(fresh=[0], line=8)
        t.step(0, line=8)
    return t


def test_a_penalty_without_create_graph_is_a_warning_at_the_grad_call(tmp_path):
    f = only(traced(tmp_path, PENALTY, 5), SLUG)
    assert f.location.line == 5 and "line 8" in f.message


def test_create_graph_true_is_silent(tmp_path):
    assert findings(traced(tmp_path, PENALTY, 5, create_graph=True), SLUG) == []


def test_fgsm_is_silent(tmp_path):
    assert findings(traced(tmp_path, FGSM, 4), SLUG) == []


def test_a_helper_that_returns_the_penalty_is_followed(tmp_path):
    f = only(traced(tmp_path, HELPER, 4), SLUG)
    assert "line 9" in f.message


FGSM_HELPER = """\
import torch
def perturb(model, x, y, eps=0.1):
    x = x.clone().requires_grad_(True)
    g, = torch.autograd.grad(crit(model(x), y), x)
    return torch.clamp(x + eps * g.sign(), -3, 3)
for x, y in data:
    loss = crit(model(perturb(model, x, y)), y)
    loss.backward()
"""


def test_a_helper_whose_result_the_caller_hands_to_a_model_is_an_input_not_a_penalty(tmp_path):
    assert findings(traced(tmp_path, FGSM_HELPER, 4), SLUG) == []


def test_a_helper_result_the_caller_adds_to_its_loss_still_warns(tmp_path):
    text = FGSM_HELPER.replace("crit(model(perturb(model, x, y)), y)",
                               "crit(model(x), y) + perturb(model, x, y).pow(2).mean()")
    f = only(traced(tmp_path, text, 4), SLUG)
    assert "line 8" in f.message


REFERENCE = """\
import torch
pos.requires_grad_(True)
ref_forces = -torch.autograd.grad(potential(pos).sum(), pos)[0]
for idx in batches:
    p = pos[idx].detach().requires_grad_(True)
    f = -torch.autograd.grad(model(p).sum(), p, create_graph=True)[0]
    loss = (f - ref_forces[idx]).pow(2).mean()
    loss.backward()
"""


def test_reference_forces_taken_once_before_the_loop_are_data(tmp_path):
    assert findings(traced(tmp_path, REFERENCE, 3), SLUG) == []


def test_the_same_grad_inside_the_loop_still_warns(tmp_path):
    text = REFERENCE.replace("create_graph=True", "retain_graph=True")
    f = only(traced(tmp_path, text, 6), SLUG)
    assert f.location.line == 6


ON_THE_FLY = """\
import torch
for pos in batches:
    p = pos.clone().requires_grad_(True)
    ref_forces = -torch.autograd.grad(potential(p).sum(), p)[0]
    pos.requires_grad_(True)
    f = -torch.autograd.grad(model(pos).sum(), pos, create_graph=True)[0]
    loss = (f - ref_forces).pow(2).mean()
    loss.backward()
"""


def test_labels_from_a_function_of_data_alone_are_silent_inside_the_loop(tmp_path):
    # the reference potential's graph holds no trainable leaf: the gradient is data
    assert findings(traced(tmp_path, ON_THE_FLY, 4, of_data=True), SLUG) == []
    # the same call whose graph reaches a parameter is a penalty without graph
    assert only(traced(tmp_path, ON_THE_FLY, 4), SLUG).location.line == 4


def test_the_watcher_tells_a_gradient_of_data_from_one_through_parameters():
    import torch

    from graddoctor.instrument.functional import _of_data

    w = torch.nn.Parameter(torch.ones(3))
    x = torch.randn(4, 3, requires_grad=True)
    assert _of_data((x ** 2).sum(), x)
    assert _of_data([(x ** 2).sum()], [x])
    assert not _of_data((x * w).sum(), x)
    assert not _of_data((w ** 2).sum(), w)  # taken for a parameter: the model's own gradient
    assert not _of_data(torch.ones(2), x)  # no graph at all: unknown, not "of data"


# -- a penalty on the parameters computed from values cut from the graph ------------------------

CUT = """\
import torch
for x, y in data:
    out = model(x)
    l2 = sum((p.data ** 2).sum() for p in model.parameters())
    loss = crit(out, y) + 1e-2 * l2
    loss.backward()
"""

LOGGED = """\
import torch
for x, y in data:
    out = model(x)
    logged = sum(p.detach().pow(2).sum() for p in model.parameters())
    loss = 0
    loss += crit(out.detach(), y)
    loss.backward()
"""


def constant_loss(tmp_path, text, flags, line=6):
    path = tmp_path / "train.py"
    path.write_text(text)
    t = TraceBuilder(str(path))
    t.optimizer(0, [0], line=1)
    for flag in flags:
        t.backward(fresh=[0], line=line, loss_constant=flag or None)
        t.step(0, line=line)
    return t


def test_a_loss_that_adds_a_penalty_on_cut_parameters_is_a_warning_at_the_penalty(tmp_path):
    f = only(constant_loss(tmp_path, CUT, [True] * 4), SLUG)
    assert f.location.line == 4 and f.evidence["via"] == "cut" and f.evidence["backwards"] == 4
    # the checks stop after the first backwards: later ones carry no mark
    assert only(constant_loss(tmp_path, CUT, [True] * 3 + [False] * 5), SLUG)


def test_silent_unless_every_checked_loss_adds_a_term_without_graph(tmp_path):
    assert findings(constant_loss(tmp_path, CUT, [True, False, True, True]), SLUG) == []
    assert findings(constant_loss(tmp_path, CUT, [False] * 4), SLUG) == []
    assert findings(constant_loss(tmp_path, CUT, [True]), SLUG) == []  # one backward
    # a term without graph the source does not show cut from the parameters (a sum from 0)
    assert findings(constant_loss(tmp_path, LOGGED, [True] * 4, line=7), SLUG) == []


def test_the_loss_walk_finds_a_term_without_graph_at_the_top_sum():
    import torch

    from graddoctor.instrument.lossfactor import constant_term

    w = torch.nn.Parameter(torch.ones(3))
    loss = (w * 2).sum()
    assert constant_term(loss + 0.1 * (w.data ** 2).sum())
    assert constant_term((loss + w.detach().sum()) / 2)
    assert not constant_term(loss + 0.1 * (w ** 2).sum())
    assert constant_term(loss + 1.0)  # a Python number looks the same: the source tells them apart
    assert not constant_term(sum([loss, loss * 2]))  # sum() from 0: the 0 is at the bottom
    assert not constant_term(loss)


# -- a loss function's term computed on a prediction with no graph ------------------------------

BOXES = """\
import torch
for feats, gt in data:
    out = head(feats)
    boxes = decode(out.detach(), anchors)
    box_loss = F.smooth_l1_loss(boxes, gt)
    loss = F.cross_entropy(out, labels) + box_loss
    loss.backward()
"""

NO_GRAD = """\
import torch
for x, y in data:
    with torch.no_grad():
        aux = model.aux(x)
    loss = crit(model(x), y) + 0.5 * F.mse_loss(aux, y)
    loss.backward()
"""

HELPER_DICT = """\
import torch
def to_host(t):
    return torch.from_numpy(t.detach().numpy())
def losses(out, y):
    return {"a": F.l1_loss(to_host(out), y), "b": F.mse_loss(out, y)}
for x, y in data:
    total = sum(losses(model(x), y).values())
    total.backward()
"""

LOGGED_LOSS = """\
import torch
for x, y in data:
    out = model(x)
    shown = F.l1_loss(out.detach(), y)
    loss = F.mse_loss(out, y) + torch.tensor(0.0)
    loss.backward()
"""


FROZEN = """\
import torch
for x, y in data:
    task = F.mse_loss(frozen_backbone(x), y)
    loss = task + 0.1 * F.mse_loss(adapter(x), x)
    loss.backward()
"""


def no_graph_losses(tmp_path, text, call_line, backward_line, constants, fn="smooth_l1_loss"):
    path = tmp_path / "train.py"
    path.write_text(text)
    t = TraceBuilder(str(path))
    t.optimizer(0, [0], line=1)
    for count in constants:
        t.put(ev.loss_no_graph(fn=fn, constants=count, backward=backward_line), call_line)
        t.backward(fresh=[0], line=backward_line)
        t.step(0, line=backward_line)
    return t


def test_a_loss_term_on_a_detached_prediction_is_a_warning_at_the_detach(tmp_path):
    f = only(no_graph_losses(tmp_path, BOXES, 5, 7, [1] * 4), SLUG)
    assert f.location.line == 4 and f.evidence["via"] == "loss" and f.evidence["how"] == ".detach()"
    assert "line 5" in f.message and "line 7" in f.message


def test_a_loss_term_under_no_grad_points_at_the_statement_in_the_block(tmp_path):
    f = only(no_graph_losses(tmp_path, NO_GRAD, 5, 6, [1, 1], fn="mse_loss"), SLUG)
    assert f.location.line == 4 and f.evidence["how"] == "torch.no_grad()"


def test_a_module_that_gets_no_gradient_at_all_is_left_to_param_without_grad(tmp_path):
    t = no_graph_losses(tmp_path, NO_GRAD, 5, 6, [1, 1], fn="mse_loss")
    t.put(ev.idle_forward(mid=0, cls="Linear", params=[0], grad=False, inference=False,
                          training=True), 4)
    assert findings(t, SLUG) == []


def test_a_term_returned_by_a_helper_is_followed_to_the_backward(tmp_path):
    f = only(no_graph_losses(tmp_path, HELPER_DICT, 5, 8, [1, 1], fn="l1_loss"), SLUG)
    assert f.location.line == 3 and f.evidence["how"] in (".detach()", "torch.from_numpy()")


OWN_LOSS = """\
import torch
def spectral_loss(pred, target):
    p, t = torch.stft(pred, 64).abs(), torch.stft(target, 64).abs()
    return F.l1_loss(p.log(), t.log())
for x, y in data:
    out = model(x)
    loss = spectral_loss(out.detach(), y) + F.l1_loss(out, y)
    loss.backward()
    shown = spectral_loss(out.detach(), y)
"""

OWN_LOSS_LOGGED = """\
import torch
def spectral_loss(pred, target):
    p, t = torch.stft(pred, 64).abs(), torch.stft(target, 64).abs()
    return F.l1_loss(p.log(), t.log())
for x, y in data:
    out = model(x)
    loss = spectral_loss(out, y) + F.l1_loss(out, y)
    loss.backward()
    shown = spectral_loss(out.detach(), y)
"""


def test_a_prediction_cut_where_the_script_calls_its_own_loss_helper_is_found_at_that_call(tmp_path):
    # the helper's loss call reads its parameter; the cut is in the caller's argument, and only
    # the call whose value reaches the backward counts (the one for the log is not blamed)
    f = only(no_graph_losses(tmp_path, OWN_LOSS, 4, 8, [1] * 3, fn="l1_loss"), SLUG)
    assert f.location.line == 7 and f.evidence["how"] == ".detach()"
    # every call that cuts it is one for the log: no cut is named, nothing is said
    assert findings(no_graph_losses(tmp_path, OWN_LOSS_LOGGED, 4, 8, [1] * 3, fn="l1_loss"), SLUG) == []


def test_silent_when_the_term_reaches_no_backward_or_the_sum_has_no_constant(tmp_path):
    # a loss for the log: the sum's constant is another term (a tensor 0 added)
    assert findings(no_graph_losses(tmp_path, LOGGED_LOSS, 4, 6, [1] * 4, fn="l1_loss"), SLUG) == []
    # the sum holds no operand without graph at one of the backwards
    assert findings(no_graph_losses(tmp_path, BOXES, 5, 7, [1, 0, 1]), SLUG) == []
    assert findings(no_graph_losses(tmp_path, BOXES, 5, 7, [1]), SLUG) == []  # one backward
    # nothing cut in the source: a frozen model's loss reported in the sum, a constant by design
    assert findings(no_graph_losses(tmp_path, FROZEN, 3, 5, [1] * 4, fn="mse_loss"), SLUG) == []


def test_the_watcher_counts_the_operands_without_graph_of_the_loss_sums():
    import torch

    from graddoctor.instrument.constloss import constant_operands

    w = torch.nn.Parameter(torch.ones(3))
    term = (w * 2).sum()
    assert constant_operands((term + 0.5 * (w.detach() ** 2).sum()).grad_fn) == 1
    assert constant_operands(sum([term, w.detach().sum(), term * 3]).grad_fn) == 2  # the 0 too
    assert constant_operands((term + term * 2).grad_fn) == 0
    assert constant_operands((term * w.sum()).grad_fn) == 0  # a product of two graphs ends the walk


def test_hard_cut_term_finds_an_argmax_or_threshold_term_beside_a_term_with_graph(tmp_path):
    from graddoctor.analysis.source import hard_cut_term

    script = tmp_path / "seg.py"
    script.write_text(textwrap.dedent("""\
        for x, y in loader:
            logits = model(x)
            pred = F.one_hot(logits.argmax(dim=1), C).float()
            loss = ce(logits, y) + dice(pred, onehot)
            loss.backward()
        for x, y in loader:
            logits = model(x)
            hard = (torch.sigmoid(logits) > 0.5).float()
            loss = bce(logits, y) + iou(hard, y)
            loss.backward()
        for x, y in loader:
            logits = model(x)
            pred = F.one_hot(logits.argmax(dim=1), C).float()
            loss = dice(pred, onehot)
            loss.backward()
        for x, y in loader:
            logits = model(x)
            loss = ce(logits, y) + dice(logits.softmax(1), onehot)
            loss.backward()
        """))
    path = str(script)
    assert hard_cut_term(path, 5)[1:] == ("pred = F.one_hot(logits.argmax(dim=1), C).float()",
                                          ".argmax()", "logits")
    assert hard_cut_term(path, 10)[0] == 8 and "threshold" in hard_cut_term(path, 10)[2]
    assert hard_cut_term(path, 15) is None  # no other term reads logits: it would not backprop
    assert hard_cut_term(path, 19) is None  # a soft Dice
    data = tmp_path / "bin.py"
    data.write_text(textwrap.dedent("""\
        for step in range(6):
            x = torch.randn(4, 1, 16, 16)
            mask = (x > 1.0).float()
            logits = net(x)
            loss = bce(logits, mask) + iou(torch.sigmoid(logits), mask)
            loss.backward()
        """))
    # a target thresholded from the model's input: data, not a prediction cut from the graph
    assert hard_cut_term(str(data), 6) is None


ITEM = """\
import torch
def train(model, anchor, lam, penalty=None):
    for x, y in data:
        loss = crit(model(x), y)
        if penalty is not None:
            loss = loss + penalty().item()
        loss += lam * prox(model, anchor).item()
        loss.backward()
"""

ITEM_SCALED = """\
import torch
for x, y in data:
    loss = crit(model(x), y, reduction="sum")
    loss = loss / mask.sum().item()
    prox = sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
    loss = loss + prox
    logged = loss.item() + prox.item()
    loss.backward()
"""


def test_a_term_added_with_item_is_a_warning_at_its_statement(tmp_path):
    f = only(constant_loss(tmp_path, ITEM, [None, None], line=8), SLUG)
    assert f.location.line == 6 and f.evidence["via"] == "item"
    assert "penalty().item()" in f.message and ".item()" in f.fix


def test_item_scaling_the_loss_or_summed_for_a_log_is_silent(tmp_path):
    assert findings(constant_loss(tmp_path, ITEM_SCALED, [None, None], line=8), SLUG) == []


def test_gradient_norms_weighing_a_trainable_factor_are_data_on_purpose():
    import ast

    from graddoctor.rules.penalty_without_graph import _scaled_by_learnable

    gradnorm = ("w = nn.Parameter(torch.ones(2))\n"
                "g = torch.stack([torch.autograd.grad(l[k], W, retain_graph=True)[0].norm()\n"
                "                 for k in range(2)])\n"
                "norms = w * g\n"
                "gn = (norms - norms.mean().detach()).abs().sum()\n"
                "gn.backward()\n")
    assert _scaled_by_learnable(ast.parse(gradnorm), 2, 6)
    r1 = ("w = torch.ones(2, requires_grad=True)\n"
          "grad, = torch.autograd.grad(d.sum(), x)\n"
          "r1 = grad.pow(2).sum()\n"
          "loss = d_loss + 10.0 * r1\n"
          "loss.backward()\n")
    assert not _scaled_by_learnable(ast.parse(r1), 2, 5)


def test_a_loss_in_a_generator_is_followed_to_the_cut_of_its_zipped_input(tmp_path):
    # `sum(F.mse_loss(a, b) for a, b in zip(feats_sr, feats_hr))`: `a` is read from feats_sr
    # (cut), not from feats_hr (made under no_grad, the target)
    from graddoctor.analysis.source import graph_cut
    script = tmp_path / "sr.py"
    script.write_text(textwrap.dedent("""\
        sr = model(lr)
        feats_sr = vgg(sr.detach())
        with torch.no_grad():
            feats_hr = vgg(hr)
        perceptual = sum(F.mse_loss(a, b) for a, b in zip(feats_sr, feats_hr))
        """))
    line, _text, how = graph_cut(str(script), 5, "mse_loss")
    assert (line, how) == (2, ".detach()")
    script.write_text(textwrap.dedent("""\
        sr = model(lr)
        feats_sr = vgg(sr)
        with torch.no_grad():
            feats_hr = vgg(hr)
        perceptual = sum(F.mse_loss(a, b) for a, b in zip(feats_sr, feats_hr))
        styles = [F.mse_loss(g, t) for i, (g, t) in enumerate(zip(feats_sr, feats_hr))]
        """))
    assert graph_cut(str(script), 5, "mse_loss") is None
    assert graph_cut(str(script), 6, "mse_loss") is None
