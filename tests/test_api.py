"""The public Python API (graddoctor/api.py): ``graddoctor.watch()`` and
``graddoctor.check_script()`` — options from the one table, the same findings as the CLI, one
check at a time, torch restored, the user's code and exceptions left alone; and the docs'
"Use it from Python" / "Use it in your tests" examples, run as written."""

from __future__ import annotations

import inspect
import os
import runpy
import sys
import threading

import pytest
import torch

import graddoctor
from conftest import FIXTURES, ROOT
from graddoctor import ScriptError, WatchError, check_script, watch
from graddoctor.options import SCRIPT_OPTIONS, WATCH_OPTIONS
from readme_examples import readme_blocks

BUGGY = os.path.join(FIXTURES, "zero_grad", "bad_missing_zero_grad_basic.py")


def make(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train(model, optimizer, zero_grad=True, steps=3):
    for _ in range(steps):
        if zero_grad:
            optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()


def patched_state():
    """What the instrumentation patches or hooks, as identities and counts."""
    from torch.optim import optimizer as optim_module

    return (torch.Tensor.backward, torch.autograd.backward, torch.optim.Optimizer.zero_grad,
            torch.optim.Optimizer.add_param_group, torch.nn.Module.zero_grad,
            torch.nn.Module.train, torch.nn.functional.dropout, torch.nn.utils.clip_grad_norm_,
            torch.utils.data.DataLoader.__iter__, torch.compile,
            len(optim_module._global_optimizer_pre_hooks),
            len(optim_module._global_optimizer_post_hooks))


# -- one definition of the options ------------------------------------------------------------

def test_check_script_takes_every_option_of_a_check_by_its_python_name():
    params = inspect.signature(check_script).parameters
    # config: whether to read pyproject.toml; isolate: how to run it; grad_flow: record for the
    # pictures — how to check, not what: no CLI option
    options = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY
               and n not in ("config", "isolate", "grad_flow")]
    assert options == list(SCRIPT_OPTIONS)
    assert all(params[n].default is None for n in options)  # None: config, else the default


def test_watch_takes_the_watch_options_with_their_table_defaults():
    params = inspect.signature(watch).parameters
    assert list(params) == list(WATCH_OPTIONS)
    assert {n: p.default for n, p in params.items()} == {n: o.watch for n, o in WATCH_OPTIONS.items()}
    assert "timeout" not in params and "device" not in params  # options of scripts only


@pytest.mark.parametrize("call, message", [
    (lambda: watch(steps=-1), "steps must be a whole number >= 0 (0 = run to the end), not -1"),
    (lambda: watch(fail_on="fatal"), "fail_on must be one of error, warning, info, never, not 'fatal'"),
    (lambda: watch(select="no-such-rule"), "select: no rule is named 'no-such-rule'"),
    (lambda: check_script(BUGGY, epoch_batches=True), "epoch_batches must be a whole number >= 0"),
    (lambda: check_script(BUGGY, timeout=-1), "timeout must be a number of seconds >= 0"),
    (lambda: check_script(BUGGY, device="tpu"), "device must be one of auto, cpu, cuda, not 'tpu'"),
    (lambda: check_script(BUGGY, ignore=["GD9"]), "ignore: no rule is named 'GD9'"),
    (lambda: check_script("no/such/train.py"), "no such file: no/such/train.py"),
])
def test_bad_options_are_refused_by_keyword(call, message):
    with pytest.raises(ScriptError) as raised:
        call()
    assert message in str(raised.value)


def test_unknown_watch_option():
    with pytest.raises(TypeError, match="unknown option"):
        graddoctor.Watch(timeout=3)


# -- check_script: what the CLI does ------------------------------------------------------------

def test_check_script_finds_what_the_cli_finds(cli, monkeypatch):
    import json

    monkeypatch.chdir(os.path.dirname(BUGGY))
    report = check_script(os.path.basename(BUGGY), steps=4)
    done = cli("check", os.path.basename(BUGGY), "--steps", "4", "--format", "json",
               cwd=os.path.dirname(BUGGY))
    assert done.returncode == report.exit_code("warning") == 1
    from_cli = json.loads(done.stdout)
    assert report.to_json()["findings"] == from_cli["findings"]
    assert report.run.status == from_cli["run"]["status"] == "step-limit"


def test_check_script_reads_the_config_unless_given_or_told_not_to(tmp_path):
    script = tmp_path / "train.py"
    with open(BUGGY, encoding="utf-8") as f:
        script.write_text(f.read())
    (tmp_path / "pyproject.toml").write_text('[tool.graddoctor]\nsteps = 3\nignore = ["GD101"]\n')
    configured = check_script(script)
    assert configured.run.step_budget == 3 and configured.run.config
    assert "missing-zero-grad" not in [f.rule for f in configured.findings]
    given = check_script(script, steps=5, ignore=[])
    assert given.run.step_budget == 5 and "missing-zero-grad" in [f.rule for f in given.findings]
    unconfigured = check_script(script, config=False)
    assert unconfigured.run.step_budget == 10 and unconfigured.run.config is None


def test_check_script_passes_argv_and_restores_the_interpreter(tmp_path):
    script = tmp_path / "args.py"
    script.write_text("import sys\nassert sys.argv[1:] == ['--epochs', '1'], sys.argv\n"
                      "sys.argv.append('changed')\n")
    argv = list(sys.argv)
    report = check_script(script, argv=["--epochs", "1"])
    assert report.run.status == "no-training-loop" and report.run.error is None
    assert sys.argv == argv


# -- watch() ---------------------------------------------------------------------------------

def test_watch_reports_the_bug_at_the_users_line():
    model, optimizer = make()
    with watch() as w:
        train(model, optimizer, zero_grad=False)
    [finding] = w.report.active()
    assert finding.rule == "missing-zero-grad" and w.failed
    assert finding.location.path == os.path.relpath(__file__)
    assert finding.location.line == inspect.getsourcelines(train)[1] + 4  # the backward line
    assert "model.weight" in finding.message  # named after the caller's variable
    assert w.report.run.status == "completed" and w.report.run.steps == 3
    assert w.report.run.script.startswith("watch() at ")


def test_watch_is_silent_on_a_correct_loop_and_changes_nothing_it_computes():
    model_a, opt_a = make()
    train(model_a, opt_a)  # warm-up, then compare a plain and a watched run from equal states
    model_b, opt_b = make()
    train(model_b, opt_b)
    torch.manual_seed(1)
    train(model_a, opt_a)
    torch.manual_seed(1)
    with watch() as w:
        train(model_b, opt_b)
    assert w.report.findings == [] and not w.failed
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(a, b)


def test_a_step_budget_ends_the_block_quietly():
    model, optimizer = make()
    after = []
    with watch(steps=2) as w:
        train(model, optimizer, steps=50)
        after.append("not reached")
    after.append("after the block")
    assert after == ["after the block"]
    assert w.report.run.status == "step-limit" and w.report.run.steps == 2


def test_an_exception_in_the_block_goes_on_and_torch_is_restored():
    before = patched_state()
    model, optimizer = make()
    w = watch()
    with pytest.raises(KeyError, match="mine"):
        with w:
            train(model, optimizer, zero_grad=False)
            assert patched_state() != before
            raise KeyError("mine")
    assert patched_state() == before
    assert w.report.run.status == "crashed"
    assert w.report.run.error["type"] == "KeyError"
    assert w.report.run.error["location"]["line"] > 0
    assert [f.rule for f in w.report.active()] == ["missing-zero-grad"]
    with watch() as again:  # the lock was released
        train(model, optimizer)
    assert again.report.findings == []


def test_nested_watch_is_a_clear_error_and_leaves_the_outer_one_working():
    model, optimizer = make()
    with watch() as outer:
        with pytest.raises(WatchError, match="already active in this process"):
            with watch():
                pass
        with pytest.raises(WatchError):
            check_script(BUGGY)
        train(model, optimizer, zero_grad=False)
    assert [f.rule for f in outer.report.active()] == ["missing-zero-grad"]


def test_a_watch_from_another_thread_at_the_same_time_is_refused():
    errors = []

    def other():
        try:
            with watch():
                pass
        except WatchError as exc:
            errors.append(exc)

    with watch():
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert len(errors) == 1


def test_a_script_that_uses_watch_under_the_cli_gets_the_error(tmp_path):
    script = tmp_path / "uses_watch.py"
    script.write_text("import graddoctor\nwith graddoctor.watch():\n    pass\n")
    report = check_script(script)
    assert report.run.status == "crashed" and report.run.error["type"] == "WatchError"


def test_as_a_decorator_each_call_gets_its_report():
    w = watch()
    model, optimizer = make()

    @w
    def epoch(zero_grad):
        train(model, optimizer, zero_grad=zero_grad)

    epoch(True)
    assert w.report.findings == []
    epoch(False)
    assert [f.rule for f in w.report.active()] == ["missing-zero-grad"]


def test_optimizers_made_before_the_block():
    class Trainer:
        def __init__(self):
            self.model, self.optimizer = make()

    stale_model, stale_optimizer = make(seed=3)  # alive, never used in the block  # noqa: F841
    trainer = Trainer()
    with watch() as w:
        train(trainer.model, trainer.optimizer, zero_grad=False)
    [finding] = w.report.active()
    assert finding.rule == "missing-zero-grad"
    assert "#" not in finding.message  # one optimizer in the report: no "SGD #2"
    assert finding.location.line == inspect.getsourcelines(train)[1] + 4

    class Deep:  # two attributes deep: registered when the block first steps or zero_grads it
        def __init__(self):
            self.inner = Trainer()

    deep = Deep()
    with watch() as w:
        train(deep.inner.model, deep.inner.optimizer, steps=4)
    assert w.report.active() == [] and w.report.run.steps == 4
    lazily = [e for e in w.report.trace.events if e.kind == "optimizer_init"
              and e.loc.line == inspect.getsourcelines(train)[1] + 3]  # at its first zero_grad
    assert len(lazily) == 1


def test_report_renders_like_the_cli():
    import io
    import json

    import jsonschema
    from rich.console import Console

    from graddoctor.report.json_format import load_schema

    model, optimizer = make()
    with watch() as w:
        train(model, optimizer, zero_grad=False)
    jsonschema.validate(w.report.to_json(), load_schema())
    assert json.loads(w.report.render("json")) == json.loads(json.dumps(w.report.to_json()))
    assert "error GD101 missing-zero-grad" in str(w.report)
    console = Console(file=io.StringIO(), width=100, no_color=True)
    console.print(w.report)
    assert "✗ 1 error, 0 warnings, 0 info" in console.file.getvalue()


def test_import_graddoctor_stays_light():
    import subprocess

    code = "import sys, graddoctor; graddoctor.watch; assert 'torch' not in sys.modules"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


# -- the examples of docs/api.md, as written ----------------------------------------------------------

def test_readme_use_it_from_python(tmp_path, monkeypatch, capsys):
    [block] = readme_blocks("Use it from Python", page="docs/api.md")
    example = tmp_path / "example.py"
    example.write_text(block)
    monkeypatch.chdir(ROOT)  # the example checks examples/buggy_train.py
    runpy.run_path(str(example), run_name="__main__")
    out = capsys.readouterr().out
    assert "error GD101 missing-zero-grad" in out
    assert "step-limit [('GD102', 20)]" in out  # examples/buggy_train.py's bug


def test_readme_use_it_in_your_tests(pytester):
    from test_pytest_plugin import PLUGIN

    [block] = readme_blocks("Use it in your tests", page="docs/api.md")
    pytester.makepyfile(test_training=block)
    pytester.runpytest(*PLUGIN).assert_outcomes(passed=2)
    pytester.makepyfile(test_training=block.replace("optimizer.zero_grad()\n", "pass\n"))
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*error GD101 missing-zero-grad  test_training.py:16*"])


def test_graddoctors_own_failure_at_the_end_does_not_replace_the_users_exception(monkeypatch):
    import graddoctor.run.session

    def broken(*args, **kwargs):
        raise RuntimeError("analysis broke")

    monkeypatch.setattr(graddoctor.run.session, "build_report", broken)
    model, optimizer = make()
    w = watch()
    with pytest.raises(ValueError, match="the user's"):
        with w:
            train(model, optimizer)
            raise ValueError("the user's")
    assert w.report.run.status == "crashed"
    assert w.report.internal_errors == [{"where": "building the report",
                                         "error": "RuntimeError: analysis broke"}]
