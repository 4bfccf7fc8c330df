"""Two facts that clip-clips-nothing and accumulation-never-accumulates read from existing
events, on real torch calls: whether a clip got an already-iterated generator (``clip.spent``),
and the loss terms below a constant factor (``backward.loss_terms``)."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.lossfactor import loss_scaling


def events(rec, kind):
    return [e for e in rec.trace if e.kind == kind]


# -- clip.spent -------------------------------------------------------------------------------
def test_clip_tells_a_used_up_generator_from_a_fresh_one_and_a_list():
    model = nn.Linear(4, 2)
    frozen = nn.Linear(4, 2).requires_grad_(False)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        params = model.parameters()
        opt = torch.optim.SGD(params, lr=0.1)  # reads the generator to the end
        trainable = filter(lambda p: p.requires_grad, model.parameters())
        torch.optim.SGD(trainable, lr=0.1)
        chain = itertools.chain(model.parameters())
        list(chain)
        model(torch.randn(3, 4)).sum().backward()
        clip = torch.nn.utils.clip_grad_norm_
        clip(params, 1.0)                                           # spent generator
        clip(trainable, 1.0)                                        # filter over a spent one
        clip(chain, 1.0)                                            # cannot look inside
        clip(model.parameters(), 1.0)                               # fresh generator
        clip((p for p in frozen.parameters() if p.requires_grad), 1.0)  # fresh, empty
        clip(list(model.parameters()), 1.0)                         # a list
        clip(model.weight, 1.0)                                     # one tensor
        clip([], 1.0)                                               # an empty list
        opt.step()
    got = [(c["spent"], len(c["params"]), c["untracked"]) for c in events(rec, "clip")]
    assert got == [(True, 0, 0), (True, 0, 0), (None, 0, 0), (False, 2, 0), (False, 0, 0),
                   (False, 2, 0), (False, 1, 0), (False, 0, 0)]
    assert not events(rec, "internal_error")


def test_a_clip_still_computes_the_same_on_a_partly_read_generator():
    model = nn.Linear(4, 2)
    model(torch.randn(3, 4)).sum().backward()
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        gen = model.parameters()
        next(gen)  # one parameter already taken
        norm = torch.nn.utils.clip_grad_norm_(gen, float("inf"))
    assert torch.isclose(norm, model.bias.grad.norm())
    [c] = events(rec, "clip")
    assert c["spent"] is True and len(c["params"]) == 1


# -- backward.loss_terms ----------------------------------------------------------------------
def test_loss_scaling_names_the_terms_below_the_factor():
    x = torch.randn(4, 3, requires_grad=True)
    y, z = torch.randint(0, 3, (4,)), torch.zeros(4, 3)
    soft = torch.full((4, 3), 1 / 3)
    assert loss_scaling(F.cross_entropy(x, y) / 4) == (0.25, ["mean"])
    assert loss_scaling(F.cross_entropy(x, y, reduction="sum") / x.size(0)) == (0.25, ["sum"])
    assert loss_scaling(F.kl_div(x.log_softmax(1), soft, reduction="batchmean")) == (0.25, ["sum"])
    assert loss_scaling(0.5 * F.mse_loss(x, z)) == (0.5, ["mean"])
    assert loss_scaling((F.mse_loss(x, z) + F.l1_loss(x, z)) / 2) == (0.5, ["mean", "mean"])
    assert loss_scaling(x.sum() * 0.1) == (0.1, ["sum"])
    assert loss_scaling(x.mean()) == (1.0, ["mean"])
    assert loss_scaling((x * x).mean() * x.sum()) == (1.0, [None])  # a product of two tensors
    assert loss_scaling(x.sum() / torch.tensor(4.0)) == (None, None)  # a computed divisor


def test_backward_events_carry_the_loss_terms():
    model = nn.Linear(3, 1)
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        x = torch.randn(4, 3)
        (F.mse_loss(model(x), torch.zeros(4, 1)) / 4).backward()
        (F.mse_loss(model(x), torch.zeros(4, 1), reduction="sum") / 4).backward()
        scaler = torch.amp.GradScaler("cpu")
        scaler.scale(F.mse_loss(model(x), torch.zeros(4, 1)) / 2).backward()
    got = [(b["loss_scale_factor"], b["loss_terms"]) for b in events(rec, "backward")]
    assert got == [(0.25, ["mean"]), (0.25, ["sum"]), (0.5, ["mean"])]
