"""The pytest plugin (graddoctor/pytest_plugin.py), run inside pytest with ``pytester``: the
fixture, the marker and ``--graddoctor`` on passing, failing and raising tests, and under
pytest-xdist; unused, it changes nothing and imports no torch."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata

import pytest

from conftest import ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def _entry_point_installed() -> bool:
    return any(ep.value == "graddoctor.pytest_plugin"
               for ep in metadata.entry_points(group="pytest11"))


# the plugin by its module until this checkout's entry point is installed (pip install -e .)
PLUGIN = [] if _entry_point_installed() else ["-p", "graddoctor.pytest_plugin"]

TRAINING = '''
import pytest
import torch


def make():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train(model, optimizer, zero_grad=True, steps=3):
    for _ in range(steps):
        if zero_grad:
            optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()  # LINE_BACKWARD
        optimizer.step()
'''


@pytest.fixture(scope="module", autouse=True)
def _warm():
    """pytester's in-process runs forget the modules imported during each run (a snapshot of
    sys.modules is restored), and re-importing torch's or graddoctor's modules is not safe:
    everything a checked test imports is imported here first, by a check like theirs."""
    import torch

    import graddoctor.pytest_plugin  # noqa: F401
    from graddoctor import watch

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch() as w:
        for _ in range(2):
            model(torch.randn(3, 2)).sum().backward()
            optimizer.step()
    w.report.render("text")


@pytest.fixture
def training(pytester):
    pytester.makepyfile(training_lib=TRAINING)
    return pytester


def test_pyproject_declares_the_pytest11_entry_point():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["entry-points"]["pytest11"] == {"graddoctor": "graddoctor.pytest_plugin"}


def test_fixture_passes_a_correct_loop_and_fails_a_buggy_one(training):
    training.makepyfile(test_loops='''
        from training_lib import make, train

        def test_correct(graddoctor):
            model, optimizer = make()
            with graddoctor:
                train(model, optimizer)
            assert graddoctor.report.run.steps == 3
            assert not graddoctor.report.findings

        def test_buggy(graddoctor):
            model, optimizer = make()
            with graddoctor:
                train(model, optimizer, zero_grad=False)
    ''')
    result = training.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*graddoctor: 1 finding(s) at or above fail_on='warning'*",
        "error GD101 missing-zero-grad  training_lib.py:15",
        "*fix: call optimizer.zero_grad()*",
    ])
    assert "\x1b[" not in result.stdout.str()  # plain text, no colours
    assert "Traceback" not in result.stdout.str()


def test_findings_below_fail_on_are_attached_not_failed(training):
    training.makepyfile(test_loops='''
        from training_lib import make, train

        def test_buggy_but_only_errors_fail(graddoctor):
            model, optimizer = make()
            with graddoctor(ignore="missing-zero-grad", fail_on="error"):
                train(model, optimizer, zero_grad=False)
            with graddoctor(fail_on="never"):
                train(model, optimizer, zero_grad=False)
            assert [f.rule for f in graddoctor.report.findings] == ["missing-zero-grad"]
            assert len(graddoctor.reports) == 2
    ''')
    result = training.runpytest(*PLUGIN, "-rA")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*Captured graddoctor call*", "*GD101 missing-zero-grad*"])


def test_an_error_inside_the_block_is_the_tests_own_and_torch_is_restored(training):
    training.makepyfile(test_loops='''
        import torch
        from training_lib import make, train

        BACKWARD = torch.Tensor.backward

        def test_raises(graddoctor):
            model, optimizer = make()
            with graddoctor:
                train(model, optimizer, zero_grad=False)
                raise KeyError("the test's own")

        def test_after(graddoctor):
            assert torch.Tensor.backward is BACKWARD
            assert graddoctor.reports == []
    ''')
    result = training.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "KeyError: \"the test's own\"" in out
    assert "status crashed" in out  # the report is attached to the failing test
    assert "at or above fail_on" not in out  # not a second failure on top of the test's own


def test_marker_checks_the_whole_test(training):
    training.makepyfile(test_loops='''
        import pytest
        from training_lib import make, train

        @pytest.mark.graddoctor(select="GD1", fail_on="error")
        def test_buggy():
            model, optimizer = make()
            train(model, optimizer, zero_grad=False)

        @pytest.mark.graddoctor(select="GD3")
        def test_buggy_unselected():
            model, optimizer = make()
            train(model, optimizer, zero_grad=False)

        @pytest.mark.graddoctor
        def test_never_trains():
            assert 1 + 1 == 2
    ''')
    result = training.runpytest(*PLUGIN)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_buggy - Failed: graddoctor: 1 finding(s)*"])


def test_off_unless_used_and_opt_in_with_the_flag(training):
    training.makepyfile(test_loops='''
        from training_lib import make, train

        def test_buggy_unchecked():
            model, optimizer = make()
            train(model, optimizer, zero_grad=False)

        def test_no_training():
            assert True
    ''')
    quiet = training.runpytest(*PLUGIN, "-rA")
    quiet.assert_outcomes(passed=2)
    assert "GD101" not in quiet.stdout.str() and "Captured graddoctor" not in quiet.stdout.str()
    checked = training.runpytest(*PLUGIN, "--graddoctor")
    checked.assert_outcomes(passed=1, failed=1)
    checked.stdout.fnmatch_lines(["*test_buggy_unchecked - Failed: graddoctor*"])
    lenient = training.runpytest(*PLUGIN, "--graddoctor", "--graddoctor-fail-on", "never")
    lenient.assert_outcomes(passed=2)


def test_under_xdist(training, monkeypatch):
    pytest.importorskip("xdist")
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    training.makepyfile(test_loops='''
        import pytest
        from training_lib import make, train

        def test_correct(graddoctor):
            model, optimizer = make()
            with graddoctor:
                train(model, optimizer)

        def test_buggy(graddoctor):
            model, optimizer = make()
            with graddoctor:
                train(model, optimizer, zero_grad=False)

        @pytest.mark.graddoctor
        def test_marked_buggy():
            model, optimizer = make()
            train(model, optimizer, zero_grad=False)
    ''')
    result = training.runpytest_subprocess(*PLUGIN, "-n", "1", "-p", "no:cacheprovider",
                                           timeout=240)
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*error GD101 missing-zero-grad  training_lib.py:15*"])


def test_loading_the_plugin_imports_no_torch():
    code = ("import sys, graddoctor.pytest_plugin, graddoctor; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
