"""The functional-dropout and loss-shape watchers in-process: what they record, where, how
rarely, that they change nothing the user's code computes, and that they leave no patch."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from graddoctor.instrument import Instrumentation, Recorder

ORIGINALS = {name: getattr(F, name) for name in ("dropout", "dropout1d", "dropout2d", "dropout3d", "mse_loss",
                                                 "l1_loss", "smooth_l1_loss", "huber_loss")}


def record(fn):
    rec = Recorder(step_budget=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own UserWarning on loss shapes
        with Instrumentation(rec):
            fn()
    return rec.trace


def of(trace, kind):
    return [e for e in trace if e.kind == kind]


def in_eval(trace):
    """The default-flag dropout calls recorded in eval mode (a train-mode call is recorded too,
    with ``mode="train"``, for a run that stops before the script evaluates)."""
    return [e for e in of(trace, "dropout_default") if e.get("mode", "eval") == "eval"]


def line_of(marker: str) -> int:
    with open(__file__, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if marker in text and "line_of(" not in text:
                return number
    raise AssertionError(marker)


class Net(nn.Module):
    def __init__(self, how="default"):
        super().__init__()
        self.fc, self.how = nn.Linear(4, 4), how
        self.bn, self.drop = nn.BatchNorm1d(4), nn.Dropout(0.5)

    def forward(self, x):
        h = self.bn(self.fc(x))
        if self.how == "default":
            return F.dropout(h, 0.5)  # mark: default
        if self.how == "kw-p":
            return F.dropout(h, p=0.5)  # mark: kw-p
        if self.how == "2d":
            return F.dropout2d(h[:, :, None, None], 0.5)  # mark: 2d
        if self.how == "helper":
            return self._helper(h)
        if self.how == "training":
            return F.dropout(h, 0.5, training=self.training)
        if self.how == "positional":
            return F.dropout(h, 0.5, self.training)
        if self.how == "mc":
            return F.dropout(h, 0.5, training=True)
        if self.how == "zero":
            return F.dropout(h, 0.0)
        if self.how == "module":
            return self.drop(h)
        raise AssertionError(self.how)

    def _helper(self, h):
        from torch.nn.functional import dropout  # bound now: the wrapper

        return dropout(h, 0.25)  # mark: helper


@pytest.mark.parametrize("how, p, fn", [("default", 0.5, "dropout"), ("kw-p", 0.5, "dropout"),
                                        ("2d", 0.5, "dropout2d"), ("helper", 0.25, "dropout")])
def test_default_training_in_eval_is_recorded_once_at_the_call(how, p, fn):
    model = Net(how)
    x = torch.randn(3, 4)

    def script():
        model(x)  # train mode: recorded once, as mode "train"
        model.eval()
        with torch.no_grad():
            for _ in range(5):
                model(x)  # mark: eval forward

    trace = record(script)
    [event] = in_eval(trace)
    assert event.loc.line == line_of(f"mark: {how}")
    assert dict(event.data) == {"fn": fn, "p": p, "cls": "Net", "name": "model", "grad": False,
                                "how": "default", "mode": "eval"}
    [trained] = [e for e in of(trace, "dropout_default") if e["mode"] == "train"]
    assert trained.loc.line == line_of(f"mark: {how}")
    # the mode watcher's aggregate of the eval forwards stays one event (an aside event)
    [eval_forward] = [e for e in of(trace, "mode_forward") if not e["training"]]
    assert eval_forward["calls"] == 5 and eval_forward.loc.line == line_of("mark: eval forward")


@pytest.mark.parametrize("how", ["training", "positional", "mc", "zero", "module", "default"])
def test_silent_when_training_is_given_p_is_zero_nn_dropout_or_train_mode(how):
    model = Net(how)
    x = torch.randn(3, 4)

    def script():
        if how != "default":  # default stays in train mode
            model.eval()
        model(x)

    assert in_eval(record(script)) == []


def test_the_innermost_module_decides_and_calls_outside_modules_are_left_alone():
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(F.dropout(x, 0.1))  # mark: head

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = nn.Linear(4, 4), Head()

        def forward(self, x):
            return self.head(self.body(x))

    model = Outer()
    x = torch.randn(2, 4)

    def script():
        F.dropout(x, 0.5)  # the loop itself: no module, not judged
        model.eval()
        model.head.train()
        model(x)  # the head is training: silent
        model.train()
        model.head.eval()
        model(x)  # the head is in eval mode although its parent trains

    [event] = in_eval(record(script))
    assert event.loc.line == line_of("mark: head")
    assert (event["cls"], event["name"]) == ("Head", "model.head")


def test_outputs_and_random_stream_are_unchanged():
    def run():
        torch.manual_seed(0)
        model = Net("default")
        model.eval()
        out = [model(torch.randn(3, 4)) for _ in range(3)]
        out.append(F.mse_loss(torch.randn(4, 1), torch.randn(4), reduction="none"))
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = run()
    got = []
    record(lambda: got.extend(run()))
    assert all(torch.equal(a, b) for a, b in zip(plain, got)) and len(plain) == len(got)


def test_patches_are_removed_on_exit():
    record(lambda: None)
    for name, original in ORIGINALS.items():
        assert getattr(F, name) is original, name


# -- losses ---------------------------------------------------------------------------------------
def test_column_prediction_against_a_vector_target_is_recorded_at_the_users_line():
    model = nn.Linear(3, 1)
    criterion = nn.MSELoss()
    x, y = torch.randn(6, 3), torch.randn(6)

    def script():
        for _ in range(3):
            F.l1_loss(model(x), y).backward()  # mark: functional loss
        criterion(y, model(x)).backward()  # mark: module loss
        with torch.no_grad():
            F.huber_loss(model(x), y, reduction="none")  # mark: metric

    events = of(record(script), "loss_broadcast")
    assert [(e.loc.line, e["fn"]) for e in events] == [(line_of("mark: functional loss"), "l1_loss"),
                                                      (line_of("mark: module loss"), "mse_loss"),
                                                      (line_of("mark: metric"), "huber_loss")]
    assert dict(events[0].data) == {"fn": "l1_loss", "input_shape": [6, 1], "target_shape": [6], "shape": [6, 6],
                                    "reduction": "mean", "grad": True}
    assert (events[1]["input_shape"], events[1]["target_shape"]) == ([6], [6, 1])
    assert (events[2]["grad"], events[2]["reduction"]) == (False, "none")


def test_intended_broadcasts_are_not_recorded_and_pairwise_ones_are_marked():
    out = torch.randn(5, 3, requires_grad=True)

    def script():
        F.mse_loss(out, torch.randn(5, 3))
        F.mse_loss(out, torch.tensor(0.0))  # a 0-d target
        F.l1_loss(out, torch.randn(3))  # per feature
        F.smooth_l1_loss(out, torch.randn(1, 3))
        F.mse_loss(torch.randn(1, 1), torch.randn(1))  # one sample: nothing is multiplied
        F.mse_loss(out[:, None], torch.randn(4, 3), size_average=False)  # mark: pairwise
        with pytest.raises(RuntimeError):
            F.mse_loss(out, torch.randn(4, 2))  # torch's own error, untouched

    trace = record(script)
    [event] = of(trace, "loss_broadcast")
    assert event.loc.line == line_of("mark: pairwise")
    assert (event["shape"], event["reduction"]) == ([5, 4, 3], "sum")
    assert of(trace, "internal_error") == []


def test_torchscript_compiles_torchs_own_functions_not_the_wrappers():
    class Scripted(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            h = F.dropout2d(F.dropout(self.fc(x), 0.1, self.training), 0.0, self.training)
            return h + F.mse_loss(h, x) + F.huber_loss(h, x) + F.smooth_l1_loss(h, x) + F.l1_loss(h, x)

    def script():
        scripted = torch.jit.script(Scripted().eval())
        assert scripted(torch.randn(2, 3)).shape == (2, 3)

    trace = record(script)
    assert of(trace, "internal_error") == []


def test_aside_events_are_held_in_order_with_their_seqs():
    rec = Recorder(step_budget=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Instrumentation(rec):
            model = Net("default").eval()
            with torch.no_grad():
                for _ in range(2):
                    model(torch.randn(3, 4))  # mode_module x2, mode_forward, then the aside event
                    F.mse_loss(torch.randn(3, 1), torch.randn(3))  # a second aside event, once
            emitted = len(rec.trace)
            held = rec.snapshot().events[emitted:]
            assert [e.seq for e in held] == list(range(emitted, emitted + len(held)))
            kinds = [e.kind for e in held]
            assert kinds.index("mode_forward") < kinds.index("dropout_default") < kinds.index("loss_broadcast")
            rec.internal_error("test", RuntimeError("x"))  # any other event closes them, as held
            assert [(e.seq, e.kind) for e in rec.trace.events[emitted:-1]] == [(e.seq, e.kind) for e in held]
            [forward] = [e for e in rec.trace.events[emitted:] if e.kind == "mode_forward"]
            assert forward["calls"] == 2  # the aggregate grew past the aside events
