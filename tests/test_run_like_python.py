"""The script runs as under ``python script.py`` and graddoctor's own output stays intact:
``__main__``'s globals, warnings naming the script's line, ``PYTHONSAFEPATH``, file names
without ``.py``, the source as it ran, and stdout holding one JSON document in every ending.
In-process where the process does not matter (``run_check``)."""

from __future__ import annotations

import json
import textwrap

from conftest import run_cli
from graddoctor.options import CheckOptions
from graddoctor.report.formats import FORMATS, RenderOptions
from graddoctor.run.session import run_check

LOOP = """
m = torch.nn.Linear(2, 1)
o = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(3):
    o.zero_grad()
    m(torch.randn(4, 2)).sum().backward()
    o.step()
"""


def check(tmp_path, text, name="train.py", **options):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return run_check(CheckOptions(target=str(path), timeout=120, **options))


def assert_ran_clean(report):
    assert report.run.status == "completed", (report.run.error, report.run.notes)


def test_main_globals_are_those_python_gives(tmp_path):
    report = check(tmp_path, textwrap.dedent("""
        import builtins, importlib.machinery, sys, torch
        g = globals()
        assert g["__builtins__"] is builtins, type(g["__builtins__"])
        assert isinstance(__loader__, importlib.machinery.SourceFileLoader), __loader__
        assert __loader__.name == "__main__" and __loader__.path == __file__
        assert __cached__ is None and __spec__ is None and __package__ is None
        assert sys.modules["__main__"].__dict__ is g
    """) + LOOP)
    assert_ran_clean(report)


WARNS = """
import warnings, torch
m = torch.nn.Linear(4, 1)
o = torch.optim.SGD(m.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.StepLR(o, 1)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loss = torch.nn.functional.mse_loss(m(torch.randn(8, 4)), torch.randn(8))  # line 7
    sched.step()  # line 8: before the optimizer's step
where = [(w.filename == __file__, w.lineno) for w in caught]
assert where == [(True, 7), (True, 8)], where
loss.backward()
o.step()
"""


def test_torch_warnings_name_the_scripts_line_not_graddoctors(tmp_path):
    assert_ran_clean(check(tmp_path, WARNS))


def test_a_warnings_filter_on_main_matches_torch_warnings(tmp_path):
    report = check(tmp_path, """
        import warnings, torch
        warnings.filterwarnings("error", category=UserWarning, module="__main__")
        m = torch.nn.Linear(4, 1)
        loss = torch.nn.functional.mse_loss(m(torch.randn(8, 4)), torch.randn(8))
        loss.backward()
    """)
    assert report.run.status == "crashed"
    assert report.run.error["type"] == "UserWarning"
    assert report.run.error["location"]["line"] == 4


def test_a_cpp_warning_under_graddoctors_torch_function_mode_names_the_scripts_line(tmp_path):
    # torch warns from C++ at the Python frame running the op, which is the __torch_function__
    # of a mode graddoctor pushes between a model's calls in the first steps; the "default"
    # filter must still show it once per line of the script, not once for graddoctor's frame
    report = check(tmp_path, """
        import warnings, torch
        m = torch.nn.Linear(4, 1)
        o = torch.optim.SGD(m.parameters(), lr=0.1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            for _ in range(3):
                out = m(torch.randn(8, 4))
                a = torch.tensor(out)  # line 8
                b = torch.tensor(out)  # line 9
                o.zero_grad()
                out.pow(2).mean().backward()
                o.step()
        where = [(w.filename == __file__, w.lineno) for w in caught if "copy construct" in str(w.message)]
        assert where == [(True, 8), (True, 9)], where
    """)
    assert_ran_clean(report)


def test_a_warning_raised_inside_backward_names_the_scripts_backward_line(tmp_path):
    # torch's full backward hook warns from inside the autograd engine with stacklevel=5, which
    # python resolves to the script's `loss.backward()`; graddoctor's wrapper around
    # torch.autograd.backward sits between torch's frames and must not shift it into torch
    report = check(tmp_path, """
        import warnings, torch
        m = torch.nn.Linear(2, 1)
        m.register_full_backward_hook(lambda mod, gi, go: None)
        o = torch.optim.SGD(m.parameters(), lr=0.1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m(torch.randn(3, 2)).sum().backward()  # line 7
        o.step()
        hook = [w for w in caught if "Full backward hook" in str(w.message)]
        assert [(w.filename, w.lineno) for w in hook] == [(__file__, 7)], \
            [(w.filename, w.lineno) for w in hook]
    """)
    assert_ran_clean(report)


def test_graddoctors_watchdog_is_invisible_to_the_scripts_threading(tmp_path):
    # a clean-shutdown idiom joins every thread but the main one: it must not wait on graddoctor
    # (the watchdog of the time limit was one of them, and the join waited until the limit)
    import json
    import threading

    before = sorted(t.name for t in threading.enumerate())  # (pytest's own, under xdist)
    report = check(tmp_path, textwrap.dedent("""
        import json, os, threading, torch
        with open(os.path.join(os.path.dirname(__file__), "threads.json"), "w") as f:
            json.dump([sorted(t.name for t in threading.enumerate()), threading.active_count()], f)
    """) + LOOP)
    assert_ran_clean(report)
    names, count = json.loads((tmp_path / "threads.json").read_text())
    assert names == before and count == len(before)


def test_a_script_without_a_py_suffix_runs(tmp_path):
    report = check(tmp_path, "import torch\n" + LOOP, name="train")
    assert_ran_clean(report)
    assert report.run.steps == 3


def test_excerpts_and_suppressions_are_the_source_that_ran(tmp_path):
    report = check(tmp_path, """
        import torch
        m = torch.nn.Linear(2, 1)
        o = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(3):
            m(torch.randn(4, 2)).sum().backward()  # the line that ran
            o.step()
        open(__file__, "w").write("# rewritten\\n" * 3 + "x = 1  # graddoctor: ignore\\n" * 20)
    """)
    [finding] = report.findings
    assert (finding.rule, finding.location.line, finding.suppressed) == ("missing-zero-grad", 5, False)
    text = FORMATS["text"].render(report, RenderOptions(to_terminal=False))
    assert "the line that ran" in text and "rewritten" not in text


def test_pythonsafepath_puts_nothing_in_front_of_sys_path(tmp_path):
    (tmp_path / "helper.py").write_text("X = 1\n")
    (tmp_path / "train.py").write_text(
        "import sys, torch\n"
        "try:\n    import helper\nexcept ImportError:\n    print('SAFE')\n"
        "else:\n    print('UNSAFE')\n" + textwrap.dedent(LOOP))
    plain = run_cli("check", "train.py", cwd=tmp_path)
    safe = run_cli("check", "train.py", cwd=tmp_path, PYTHONSAFEPATH="1")
    assert "UNSAFE" in plain.stdout and "SAFE\n" in safe.stdout, (plain.stdout, safe.stdout)


# -- stdout: one JSON document -----------------------------------------------------------------
def test_json_stdout_stays_one_document_after_atexit_prints(tmp_path):
    (tmp_path / "train.py").write_text(
        "import atexit, torch\natexit.register(lambda: print('bye'))\n" + textwrap.dedent(LOOP))
    result = run_cli("check", "train.py", "-f", "json", cwd=tmp_path)
    assert json.loads(result.stdout)["run"]["status"] == "completed"
    assert "bye" in result.stderr


def test_the_watchdogs_report_of_a_stuck_script_goes_to_stdout(tmp_path):
    (tmp_path / "train.py").write_text("import time, torch\n" + textwrap.dedent(LOOP) + (
        "while True:\n    try:\n        time.sleep(0.1)\n    except BaseException:\n        pass\n"))
    result = run_cli("check", "train.py", "-f", "json", "--timeout", "1", cwd=tmp_path)
    assert json.loads(result.stdout)["run"]["status"] == "timeout", result.stderr
    assert result.returncode == 2


def test_a_script_that_closes_stdout_still_gets_its_report(tmp_path):
    (tmp_path / "train.py").write_text(
        "import os, sys, torch\nsys.stdout = open('log.txt', 'w')\nos.close(1)\n"
        + textwrap.dedent(LOOP).replace("    o.zero_grad()\n", ""))
    result = run_cli("check", "train.py", cwd=tmp_path)
    assert "missing-zero-grad" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr and result.returncode == 1, result.stderr


# -- check_script() leaves the caller's process as it was ---------------------------------------
LEAKS = """
import builtins, sys, warnings, torch
warnings.simplefilter("ignore")
sys.setrecursionlimit(123456)
builtins.print = lambda *a, **k: None
builtins.graddoctor_leak = 1
torch.nn.Module.graddoctor_leak = 1
""" + LOOP


def test_check_script_restores_warnings_recursion_limit_and_builtins(tmp_path):
    import builtins
    import sys
    import warnings

    import torch

    from graddoctor import check_script

    (tmp_path / "train.py").write_text(LEAKS)
    filters, limit, printer = list(warnings.filters), sys.getrecursionlimit(), builtins.print
    try:
        report = check_script(tmp_path / "train.py", config=False)
        assert report.run.status == "completed"
        # (a module torch imports lazily may add its own filter, as under python)
        assert ("ignore", None, Warning, None, 0) not in warnings.filters
        assert all(f in warnings.filters for f in filters)
        assert sys.getrecursionlimit() == limit
        assert builtins.print is printer and not hasattr(builtins, "graddoctor_leak")
    finally:
        vars(torch.nn.Module).get("graddoctor_leak") and delattr(torch.nn.Module, "graddoctor_leak")


def test_check_script_isolated_leaves_even_class_patches_out(tmp_path):
    import torch

    from graddoctor import check_script

    (tmp_path / "train.py").write_text(LEAKS.replace("    o.zero_grad()\n", ""))
    report = check_script(tmp_path / "train.py", config=False, isolate=True, fail_on="error")
    assert not hasattr(torch.nn.Module, "graddoctor_leak")
    assert report.run.status == "completed" and report.fail_on == "error"
    assert [f.rule for f in report.findings] == ["missing-zero-grad"]
    assert report.exit_code() == 1


def test_no_workers_folder_is_left_after_an_input_error(tmp_path, monkeypatch):
    import tempfile

    import pytest

    from graddoctor.errors import ScriptError

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    (tmp_path / "bad.py").write_text("def f(:\n")
    for target in (tmp_path / "bad.py", tmp_path / "tmp"):
        with pytest.raises(ScriptError):
            run_check(CheckOptions(target=str(target)))
    assert list(scratch.iterdir()) == []
