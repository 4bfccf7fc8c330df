"""``%%graddoctor`` in an in-process IPython shell (terminal IPython's behaviour, no kernel),
and ``get_ipython()`` in a notebook run as a script."""

from __future__ import annotations

import pytest

IPython = pytest.importorskip("IPython")

SETUP = ("import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(4, 2)\n"
         "opt = torch.optim.SGD(model.parameters(), lr=0.1)")
LOOP = ("for _ in range(5):\n    loss = model(torch.randn(8, 4)).pow(2).mean()\n"
        "    loss.backward()\n    opt.step()")


@pytest.fixture(scope="module")
def shell():
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    ip.run_cell("%load_ext graddoctor")
    return ip


def test_a_step_budget_ends_the_cell_quietly_and_the_report_is_text(shell, capsys):
    shell.run_cell(SETUP)
    result = shell.run_cell("%%graddoctor --steps 2\n" + LOOP)
    out = capsys.readouterr().out
    assert result.error_in_exec is None and result.success
    assert "StepLimitReached" not in out and "Traceback" not in out
    report = shell.user_ns["_graddoctor"].report
    assert report.run.status == "step-limit" and report.run.steps == 2
    assert "\nerror GD101 missing-zero-grad  In [" in out  # printed text, not a string's repr
    assert "\\n" not in out
    import re

    [title] = re.findall(r"graddoctor  cell \[(\d+)\]", out)
    assert f"missing-zero-grad  In [{title}], line 3" in out  # the title names the same cell


def test_an_exception_before_training_is_a_crash(shell, capsys):
    shell.run_cell("%%graddoctor\nraise ValueError('before any step')")
    assert shell.user_ns["_graddoctor"].report.run.status == "crashed"


def test_a_notebook_that_calls_get_ipython_runs_as_a_script(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    v4 = nbformat.v4
    from graddoctor import check_script

    nb = v4.new_notebook()
    nb.cells = [
        v4.new_code_cell("get_ipython().run_line_magic('matplotlib', 'inline')\n"
                         "get_ipython().system('nvidia-smi')\n" + SETUP),
        v4.new_code_cell("get_ipython().run_line_magic('time', 'x = 3')\nassert x == 3\n"
                         "get_ipython().run_cell_magic('time', '', " + repr(LOOP) + ")"),
    ]
    path = tmp_path / "train.ipynb"
    nbformat.write(nb, str(path))
    report = check_script(path, config=False)
    assert report.run.status == "completed", report.run.error
    assert report.run.steps == 5
    assert "missing-zero-grad" in [f.rule for f in report.findings]


def test_a_cell_that_cannot_compile_is_a_crash_not_no_training_loop(shell):
    shell.run_cell("%%graddoctor\nfor x in :\n    pass")
    assert shell.user_ns["_graddoctor"].report.run.status == "crashed"
