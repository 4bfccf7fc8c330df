"""eval-in-train-mode (GD303) on hand-written traces: where it reports, at which severity, and
the look-alikes it stays silent on."""

from __future__ import annotations

import pytest

from graddoctor.rules.eval_in_train_mode import EvalInTrainMode
from mode_traces import bn, check, end, fwd, lines, mode_set, new, update


def test_validation_loop_without_eval_is_reported():
    t = new()
    mode_set(t, True, [0], line=2)
    bn(t, 0)
    fwd(t, [0], line=4)
    update(t, line=5)
    t.event("epoch_start", 6, loader=1, epoch=0, real_len=3, replay_len=3)
    fwd(t, [0], line=8, grad=False, calls=3)
    t.event("epoch_start", 3, loader=0, epoch=1, real_len=4, replay_len=4)
    fwd(t, [0], line=4)
    end(t, "step-limit")
    (finding,) = check(EvalInTrainMode, t)
    assert finding.location.line == 8
    assert [r.location.line for r in finding.related] == [2]
    assert "torch.no_grad()" in finding.message and finding.step == 1


def test_single_inference_mode_forward_before_next_epoch_is_reported():
    t = new()
    bn(t, 0)
    fwd(t, [0], line=4)
    update(t, line=5)
    fwd(t, [0], line=8, grad=False, inference=True)
    t.event("epoch_start", 3, loader=0, epoch=1, real_len=4, replay_len=4)
    end(t)
    (finding,) = check(EvalInTrainMode, t)
    assert finding.location.line == 8 and "inference_mode" in finding.message


def test_validation_loop_inside_batch_loop_is_reported_even_with_backward_after():
    t = new()
    bn(t, 0)
    fwd(t, [0], line=4)
    update(t, line=5)
    fwd(t, [0], line=9, grad=False, calls=2)
    t.clear([0], line=3)
    fwd(t, [0], line=4)
    update(t, line=5)
    end(t)
    assert lines(check(EvalInTrainMode, t)) == [9]


def test_forward_at_the_end_of_a_completed_run_is_reported():
    t = new()
    bn(t, 0)
    fwd(t, [0], line=4)
    update(t, line=5)
    fwd(t, [0], line=20, grad=False)
    end(t, "completed")
    assert lines(check(EvalInTrainMode, t)) == [20]


def no_grad_forward_then(t, tail):
    bn(t, 0)
    fwd(t, [0], line=4)
    update(t, line=5)
    tail(t)


@pytest.mark.parametrize("tail", [
    # GAN discriminator step: fakes drawn under no_grad, then D's forward, backward, step
    lambda t: (fwd(t, [0], line=8, grad=False), fwd(t, [1], line=9), update(t, line=10), end(t)),
    # no-grad forward between backward and step (metrics on the batch)
    lambda t: (t.backward(fresh=[0], line=7), fwd(t, [0], line=8, grad=False), t.step(0, line=9), end(t)),
    # the replay was cut before anything told what the forward was for
    lambda t: (fwd(t, [0], line=8, grad=False), end(t, "step-limit")),
    # swa_utils.update_bn
    lambda t: (t.event("update_bn", 8), fwd(t, [0], line=8, grad=False, calls=4, recalibrating=True),
               end(t)),
    # recalibration by hand after reset_running_stats()
    lambda t: (t.event("bn_reset", 8, modules=[0], calls=1), fwd(t, [0], line=10, grad=False, calls=4),
               end(t)),
    # momentum=None: a cumulative average on purpose
    lambda t: (bn(t, 0, momentum=None), fwd(t, [0], line=10, grad=False, calls=4), end(t)),
    # track_running_stats=False
    lambda t: (bn(t, 0, track_running_stats=False), fwd(t, [0], line=10, grad=False, calls=4), end(t)),
    # validation in eval mode
    lambda t: (mode_set(t, False, [0], line=7), fwd(t, [0], line=8, training=False, grad=False, calls=3),
               end(t)),
    # a grad-enabled forward outside the update is not a no-grad pass
    lambda t: (fwd(t, [0], line=8, calls=3), end(t)),
])
def test_eval_in_train_silent_on(tail):
    t = new()
    no_grad_forward_then(t, tail)
    assert check(EvalInTrainMode, t) == []


def test_reset_before_an_earlier_step_does_not_silence_later_validation():
    t = new()
    bn(t, 0)
    t.event("bn_reset", 2, modules=[0], calls=1)
    fwd(t, [0], line=4)
    update(t, line=5)
    fwd(t, [0], line=8, grad=False, calls=2)
    end(t)
    assert lines(check(EvalInTrainMode, t)) == [8]


def test_no_grad_calls_inside_the_training_forward_are_not_a_validation_loop():
    # MoCo v3: the momentum encoder runs twice under no_grad inside the module's training
    # forward (nested in a grad-enabled outermost call) to make the targets
    t = new()
    mode_set(t, True, [0, 1], line=2)
    bn(t, 0)
    bn(t, 1, frozen=True)
    for _ in range(2):
        fwd(t, [0], line=4)
        fwd(t, [1], line=4, grad=False, calls=2, nested=True)
        update(t, line=5)
    end(t)
    assert check(EvalInTrainMode, t) == []
    t = new()
    mode_set(t, True, [0, 1], line=2)
    bn(t, 0)
    bn(t, 1, frozen=True)
    for _ in range(2):
        fwd(t, [0], line=4)
        fwd(t, [1], line=4, grad=False, calls=2)  # the same calls, not nested: a loop
        update(t, line=5)
    end(t)
    assert lines(check(EvalInTrainMode, t)) == [4]


def test_an_ema_teacher_called_per_view_before_the_backward_is_not_a_validation_loop():
    def run(updated):
        t = new()
        bn(t, 0)
        bn(t, 1, frozen=True, owned=False, updated=updated)
        for _ in range(2):
            fwd(t, [1], line=3, grad=False, calls=2)  # [teacher(v) for v in views]
            fwd(t, [0], line=4)
            update(t, line=5)
        end(t)
        return check(EvalInTrainMode, t)
    assert run(updated=True) == []
    assert lines(run(updated=False)) == [3]  # a frozen model nothing updates: still a loop


def test_an_ema_teacher_whose_views_ran_just_before_the_replay_was_cut_is_not_judged():
    """The step budget stops the replay after the teacher's views of the next turn, before its
    backward: nothing tells what they were for, and the turns before were targets."""
    def run(updated, status="step-limit"):
        t = new()
        bn(t, 0)
        bn(t, 1, frozen=True, owned=False, updated=updated)
        for _ in range(2):
            fwd(t, [0], line=4)
            fwd(t, [1], line=3, grad=False, calls=2)
            update(t, line=5)
        fwd(t, [0], line=4)
        fwd(t, [1], line=3, grad=False, calls=2)
        end(t, status)
        return check(EvalInTrainMode, t)
    assert run(updated=True) == []
    assert lines(run(updated=False)) == [3]  # nothing updates that model: a loop of no-grad calls
    assert lines(run(updated=True, status="completed")) == [3]  # the script's own last pass


def gan_run(t, preview, turns=2):
    """A GAN: D (opt 0, BatchNorm 0) and G (opt 1, BatchNorm 1) updated in turn, each after its
    own backward; ``preview(t)`` runs after the turns."""
    t.optimizer(1, [1])
    bn(t, 0, name="netD.1")
    bn(t, 1, name="netG.1")
    for _ in range(turns):
        fwd(t, [0], line=4)
        fwd(t, [1], line=5)
        t.backward(fresh=[0], line=6)
        t.step(0, line=7)
        fwd(t, [0], line=8)
        t.backward(fresh=[1], accumulated=[0], line=9)
        t.step(1, line=10)
    preview(t)
    end(t)


def test_gan_preview_of_a_generator_never_in_eval_mode_is_silent():
    # the DCGAN tutorial: `with torch.no_grad(): fake = netG(fixed_noise)`, G never eval()'d
    t = new()
    gan_run(t, lambda t: fwd(t, [1], line=12, grad=False))
    assert t and check(EvalInTrainMode, t) == []


@pytest.mark.parametrize("preview", [
    # a loop of no-grad calls: a validation loader, not a preview
    lambda t: fwd(t, [1], line=12, grad=False, calls=3),
    # the generator is put in eval mode elsewhere in the run: its running statistics are read
    lambda t: (mode_set(t, False, [1], line=11), mode_set(t, True, [1], line=12),
               fwd(t, [1], line=14, grad=False)),
])
def test_gan_validation_loop_or_evaluated_generator_is_still_reported(preview):
    t = new()
    gan_run(t, preview)
    assert len(check(EvalInTrainMode, t)) == 1


def test_two_optimizers_stepped_after_one_loss_are_not_a_gan():
    # backbone and head optimizers step after the same backward: one update, not two in turn
    t = new()
    t.optimizer(1, [1])
    bn(t, 0)
    for _ in range(2):
        fwd(t, [0], line=4)
        t.backward(fresh=[0, 1], line=5)
        t.step(0, line=6)
        t.step(1, line=7)
    fwd(t, [0], line=9, grad=False)
    end(t)
    assert lines(check(EvalInTrainMode, t)) == [9]


def test_statistics_estimated_before_training_then_eval_is_silent():
    # a frozen loss network's BatchNorm statistics estimated once under no_grad, then eval()
    # before the first step, never in train mode again (a perceptual loss's VGG)
    t = new()
    bn(t, 1, name="vgg.bn1")
    fwd(t, [1], line=3, grad=False)
    mode_set(t, False, [1], line=4)
    for _ in range(2):
        mode_set(t, True, [0], line=8)
        bn(t, 0)
        fwd(t, [0], line=10)
        fwd(t, [1], line=11, training=False, grad=False)
        update(t, line=12)
    end(t)
    assert lines(check(EvalInTrainMode, t)) == []


@pytest.mark.parametrize("later", [
    # the layers train afterwards: a validation pass before training, not an estimate kept
    lambda t: (mode_set(t, True, [1], line=8), fwd(t, [1], line=10), update(t, line=12)),
    # the next mode call is train(), not eval(): the pass was meant to run in eval mode
    lambda t: (mode_set(t, True, [1], line=6), mode_set(t, False, [1], line=7), update(t, line=12)),
])
def test_no_grad_pass_in_train_mode_before_training_still_reported(later):
    t = new()
    bn(t, 1, name="model.bn1")
    fwd(t, [1], line=3, grad=False, calls=3)
    later(t)
    end(t)
    assert 3 in lines(check(EvalInTrainMode, t))


def _validation_after_update(path):
    from graddoctor.trace import TraceBuilder
    t = TraceBuilder(str(path))
    t.optimizer(0, [0])
    mode_set(t, True, [0], line=1)
    bn(t, 0)
    fwd(t, [0], line=2)
    update(t, line=3)
    fwd(t, [0], line=8, grad=False, calls=3)
    end(t, "step-limit")
    return t


def test_a_bare_eval_above_the_no_grad_pass_is_the_line_reported(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("model.train()\nout = model(x)\nloss.backward()\nopt.step()\n"
                    "def evaluate(loader):\n    model.eval\n    with torch.no_grad():\n"
                    "        for x, y in loader: acc = model(x).argmax(1)\n")
    (finding,) = check(EvalInTrainMode, _validation_after_update(path))
    assert finding.location.line == 6 and finding.fix == "call it: model.eval()"
    assert "names the method without calling it" in finding.message
    assert 8 in [r.location.line for r in finding.related]


def test_a_bare_eval_in_another_function_is_not_the_line_reported(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("model.train()\nout = model(x)\nloss.backward()\nopt.step()\n"
                    "def unused():\n    model.eval\ndef evaluate(loader):\n"
                    "    for x, y in loader: acc = model(x).argmax(1)\n")
    (finding,) = check(EvalInTrainMode, _validation_after_update(path))
    assert finding.location.line == 8 and finding.fix == EvalInTrainMode.fix


@pytest.mark.parametrize("statement", ["model(x)", "_ = model(x)", "output = model(x)"])
def test_a_no_grad_pass_whose_result_nothing_keeps_re_estimates_statistics(tmp_path, statement):
    path = tmp_path / "train.py"
    path.write_text("model.train()\nout = model(x)\nloss.backward()\nopt.step()\n\n\n"
                    f"with torch.no_grad():\n    {statement}\n")
    assert check(EvalInTrainMode, _validation_after_update(path)) == []
    path.write_text("model.train()\nout = model(x)\nloss.backward()\nopt.step()\n\n\n"
                    "with torch.no_grad():\n    out = model(x)\nprint(out.argmax(1))\n")  # kept: a validation pass
    assert lines(check(EvalInTrainMode, _validation_after_update(path))) == [8]


def test_a_result_bound_to_a_name_its_function_never_reads_is_dropped(tmp_path):
    """SWA's original bn_update: ``output = model(input)`` in a function that never reads
    ``output`` re-estimates the statistics; the same binding read in its function is kept."""
    path = tmp_path / "train.py"
    body = ("model.train()\nout = model(x)\nloss.backward()\nopt.step()\ndef bn_update(loader):\n"
            "    for x, _ in loader:\n        with torch.no_grad():\n            output = model(x)\n")
    path.write_text(body)
    assert check(EvalInTrainMode, _validation_after_update(path)) == []
    path.write_text(body + "        print(output.shape)\n")
    assert lines(check(EvalInTrainMode, _validation_after_update(path))) == [8]


def _evaluation_after_a_train_call(path, steps_after=False):
    """Each epoch: train() (line 1), a forward and an update, then train() again (line 6) and a
    no-grad pass (line 8); ``steps_after``: an update follows that second train() call too."""
    from graddoctor.trace import TraceBuilder
    t = TraceBuilder(str(path))
    t.optimizer(0, [0])
    bn(t, 0)
    for _epoch in range(2):
        mode_set(t, True, [0], line=1)
        fwd(t, [0], line=2)
        update(t, line=3)
        mode_set(t, True, [0], line=6)
        fwd(t, [0], line=8, grad=False, calls=3)
        if steps_after:
            fwd(t, [0], line=2)
            update(t, line=3)
    end(t)
    return t


EVALUATE_AFTER_TRAIN = ("model.train()\nout = model(x)\nloss.backward()\nopt.step()\n"
                        "def evaluate(loader):\n    model.train()  # copied\n    with torch.no_grad():\n"
                        "        for x, y in loader: acc = model(x).argmax(1)\n")


def test_a_train_call_that_only_precedes_no_grad_passes_is_the_line_reported(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(EVALUATE_AFTER_TRAIN)
    (finding,) = check(EvalInTrainMode, _evaluation_after_a_train_call(path))
    assert finding.location.line == 6 and finding.fix == "`model.eval()`"
    assert finding.evidence["train_call_meant_eval"] is True
    assert "eval() was meant" in finding.message
    assert [r.location.line for r in finding.related] == [8]


def test_a_train_call_followed_by_a_step_is_not_the_line_reported(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(EVALUATE_AFTER_TRAIN)
    (finding,) = check(EvalInTrainMode, _evaluation_after_a_train_call(path, steps_after=True))
    assert finding.location.line == 8 and "train_call_meant_eval" not in finding.evidence
    path.write_text(EVALUATE_AFTER_TRAIN.replace("model.train()  # copied", "model.train(True)"))
    (finding,) = check(EvalInTrainMode, _evaluation_after_a_train_call(path))
    assert finding.location.line == 8  # not a bare train() call: the usual report
