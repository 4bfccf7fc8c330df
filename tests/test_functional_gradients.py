"""Scripts that train with torch.autograd.grad or torch.func: graddoctor does not follow those
gradients, so without a word such a script would read as "no-training-loop" (exit 2). The report
says what was not checked and why (a run note), and the exit code follows the findings."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from typer.testing import CliRunner

from graddoctor import events as ev
from graddoctor.run.session import CheckOptions, run_check
from graddoctor.cli import app
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.functional import entry_points
from report_samples import write

FUNC_GRAD = textwrap.dedent('''\
    import torch
    from torch.func import functional_call, grad

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(32, 4), torch.randn(32, 1)

    def loss_fn(p, x, y):
        return torch.nn.functional.mse_loss(functional_call(model, p, (x,)), y)

    for step in range(20):
        g = grad(loss_fn)(params, x, y)
        params = {k: params[k] - 0.1 * g[k] for k in params}
    print("final", round(loss_fn(params, x, y).item(), 6))
''')

AUTOGRAD_GRAD = textwrap.dedent('''\
    import torch

    torch.manual_seed(0)
    w = torch.randn(4, 1, requires_grad=True)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    for step in range(20):
        loss = ((x @ w - y) ** 2).mean()
        (g,) = torch.autograd.grad(loss, [w])
        with torch.no_grad():
            w -= 0.1 * g
    print("final", w.sum().item())
''')

JACOBIAN = textwrap.dedent('''\
    import torch
    from torch.autograd.functional import jacobian

    torch.manual_seed(0)
    w = torch.randn(3)
    for step in range(5):
        j = jacobian(lambda v: (v ** 2).sum(), w)
        w = w - 0.1 * j
''')

FUNC_GRAD_INTO_OPTIMIZER = textwrap.dedent('''\
    import torch
    from torch.func import functional_call, grad

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 4), torch.randn(32, 1)

    def loss_fn(p, x, y):
        return torch.nn.functional.mse_loss(functional_call(model, p, (x,)), y)

    for step in range(20):
        params = {k: v.detach() for k, v in model.named_parameters()}
        g = grad(loss_fn)(params, x, y)
        for name, p in model.named_parameters():
            p.grad = g[name]
        opt.step()
''')

INFERENCE_ONLY = textwrap.dedent('''\
    import torch
    from torch.func import functional_call
    model = torch.nn.Linear(4, 1)
    functional_call(model, dict(model.named_parameters()), (torch.randn(2, 4),))
''')


def check(path, *args):
    result = CliRunner().invoke(app, ["check", path, "-f", "json", *args])
    return result, json.loads(result.stdout)


@pytest.mark.parametrize("source, api, line", [
    (FUNC_GRAD, "torch.func.grad", 13),
    (AUTOGRAD_GRAD, "torch.autograd.grad", 8),
    (JACOBIAN, "torch.autograd.functional.jacobian", 7),
])
def test_a_script_training_with_functional_gradients_is_noted_not_failed(tmp_path, source, api, line):
    script = write(tmp_path, "train.py", source)
    result, report = check(script)
    assert result.exit_code == 0, result.output
    run = report["run"]
    assert run["status"] == "completed" and run["steps"] == run["backward_calls"] == 0
    [note] = [n for n in run["notes"] if "not followed" in n]
    assert note.startswith("nothing was checked: the script takes its gradients with ")
    assert f"{api} ({script}:{line})" in note
    assert "calls no backward() and no optimizer step" in note
    assert report["findings"] == [] and report["internal_errors"] == []
    text = CliRunner().invoke(app, ["check", script], env={"COLUMNS": "200"}).stdout
    assert text.rstrip().splitlines()[-1] == \
        "! nothing was checked: no backward() and no optimizer step (see the note)"


def test_functional_gradients_fed_to_an_optimizer_are_checked_steps_and_a_note(tmp_path):
    script = write(tmp_path, "train.py", FUNC_GRAD_INTO_OPTIMIZER)
    result, report = check(script, "--steps", "5")
    assert result.exit_code == 0, result.output
    assert report["findings"] == [] and report["run"]["steps"] == 5
    assert report["run"]["notes"] == [
        f"gradients taken with torch.func.grad ({script}:14) are not followed (graddoctor checks "
        "those backward() accumulates in .grad and the optimizer steps that apply them)"]


def test_functional_call_alone_is_no_training_loop(tmp_path):
    script = write(tmp_path, "infer.py", INFERENCE_ONLY)
    result, report = check(script)
    assert result.exit_code == 2 and report["run"]["status"] == "no-training-loop"
    assert report["run"]["notes"] == []


def test_the_script_computes_the_same_and_every_entry_point_is_restored(tmp_path, capfd):
    script = write(tmp_path, "train.py", FUNC_GRAD)
    originals = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in entry_points()]
    assert {shown for _, _, shown in entry_points()} >= {
        "torch.autograd.grad", "torch.func.grad", "torch.func.vjp", "torch.func.functional_call"}
    run_check(CheckOptions(target=script, steps=0))
    out = capfd.readouterr().out
    assert all(getattr(owner, attr) is original for owner, attr, original in originals)
    namespace: dict = {"__name__": "__main__"}
    exec(compile(FUNC_GRAD, script, "exec"), namespace)
    assert capfd.readouterr().out == out  # the same final loss, bit for bit


def test_each_call_line_is_recorded_once_and_torch_own_calls_not_at_all():
    rec = Recorder(step_budget=None)
    w = torch.randn(3, requires_grad=True)
    with Instrumentation(rec):
        for _ in range(3):
            torch.autograd.grad((w ** 2).sum(), w)
        torch.autograd.functional.vjp(lambda v: v * 2, w.detach(), torch.ones(3))
    found = [(e["api"], e.loc.line) for e in rec.trace if e.kind == "functional_grad"]
    assert [api for api, _ in found] == ["torch.autograd.grad", "torch.autograd.functional.vjp"]
    assert ev.functional_grad(api="torch.func.grad") == ("functional_grad", {"api": "torch.func.grad",
                                                                             "create_graph": None})
    assert [e["create_graph"] for e in rec.trace if e.kind == "functional_grad"] == [False, None]
    assert "functional_grad" in ev.ASIDE_KINDS
