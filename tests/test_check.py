"""graddoctor check end to end: statuses, exit codes, usage errors, the user's numbers (each
``python -m graddoctor`` its own process, forked warm: see conftest.run_cli)."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from conftest import run_cli

BUGGY = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(6):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    if i == {crash_at}:
        raise RuntimeError("boom")
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_finding_in_text_and_json(tmp_path):
    write(tmp_path, "train.py", BUGGY.format(crash_at=-1))
    text = run_cli("check", "train.py", cwd=tmp_path)
    assert text.returncode == 1, text.stderr
    assert "missing-zero-grad" in text.stdout and "train.py:8" in text.stdout
    data = json.loads(run_cli("check", "train.py", "-f", "json", cwd=tmp_path).stdout)
    assert [(f["rule"], f["location"]["line"]) for f in data["findings"]] == [("missing-zero-grad", 8)]
    assert data["schema_version"] == 1 and data["run"]["status"] == "completed"
    assert data["summary"]["error"] == 1


def test_crash_after_two_steps_keeps_findings(tmp_path):
    write(tmp_path, "train.py", BUGGY.format(crash_at=1))
    result = run_cli("check", "train.py", "-f", "json", cwd=tmp_path)
    data = json.loads(result.stdout)
    assert data["run"]["status"] == "crashed"
    assert data["run"]["error"]["type"] == "RuntimeError"
    assert data["run"]["error"]["location"] == {"path": "train.py", "line": 11}
    assert data["run"]["steps"] == 2
    assert [f["rule"] for f in data["findings"]] == ["missing-zero-grad"]
    assert result.returncode == 2  # an incomplete check (--allow-incomplete: 1, by the findings)


def test_step_budget_stops_the_script(tmp_path):
    write(tmp_path, "train.py", BUGGY.format(crash_at=-1).replace("range(6)", "range(10**6)"))
    data = json.loads(run_cli("check", "train.py", "-f", "json", "--steps", "3", cwd=tmp_path).stdout)
    assert data["run"]["status"] == "step-limit" and data["run"]["steps"] == 3


def test_except_exception_cannot_swallow_the_stop(tmp_path):
    write(tmp_path, "train.py", """
        import torch
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        while True:
            try:
                opt.zero_grad()
                model(torch.ones(1, 2)).sum().backward()
                opt.step()
            except Exception:
                pass
    """)
    data = json.loads(run_cli("check", "train.py", "-f", "json", "--steps", "2", cwd=tmp_path).stdout)
    assert data["run"]["status"] == "step-limit"


def test_argv_main_and_sys_path(tmp_path):
    (tmp_path / "helper_mod.py").write_text("VALUE = 7\n")
    write(tmp_path, "train.py", """
        import sys, json
        import helper_mod
        assert __name__ == "__main__"
        print(json.dumps({"argv": sys.argv, "value": helper_mod.VALUE}), file=sys.stderr)
    """)
    result = run_cli("check", "train.py", "-f", "json", "--", "--lr", "0.1", "x", cwd=tmp_path)
    line = [ln for ln in result.stderr.splitlines() if ln.startswith("{")][0]
    assert json.loads(line) == {"argv": ["train.py", "--lr", "0.1", "x"], "value": 7}
    data = json.loads(result.stdout)
    assert data["run"]["status"] == "no-training-loop"
    assert result.returncode == 2


def test_module_mode(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(textwrap.dedent(BUGGY.format(crash_at=-1)))
    data = json.loads(run_cli("check", "-m", "pkg.train", "-f", "json", cwd=tmp_path).stdout)
    assert [f["rule"] for f in data["findings"]] == ["missing-zero-grad"]
    assert data["findings"][0]["location"]["path"] == os.path.join("pkg", "train.py")


@pytest.mark.parametrize("args, needle", [
    (["check", "nope.py"], "no such file"),
    (["check", "notes.txt"], "not a Python script"),
    (["check", "bad.py"], "syntax error"),
    (["check", "train.py", "--steps", "-1"], "steps"),
    (["check", "train.py", "--frobnicate"], "frobnicate"),
])
def test_usage_errors_exit_2_without_traceback(tmp_path, args, needle):
    (tmp_path / "notes.txt").write_text("hello world")
    (tmp_path / "bad.py").write_text("def f(:\n")
    write(tmp_path, "train.py", BUGGY.format(crash_at=-1))
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


def test_fail_on_levels(tmp_path):
    write(tmp_path, "train.py", BUGGY.format(crash_at=-1))
    assert run_cli("check", "train.py", "--fail-on", "never", cwd=tmp_path).returncode == 0
    assert run_cli("check", "train.py", "--ignore", "GD1", cwd=tmp_path).returncode == 0


SEEDED = """
import sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for i in range(5):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(torch.randn(32, 6)), torch.randint(0, 2, (32,)))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
torch.save(model.state_dict(), sys.argv[1])
"""


def test_parameters_bit_identical_with_and_without_graddoctor(tmp_path):
    import torch

    from conftest import run_python

    write(tmp_path, "train.py", SEEDED)
    plain = run_python("train.py", "plain.pt", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    checked = run_cli("check", "train.py", "--steps", "0", "--", "checked.pt", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    a = torch.load(tmp_path / "plain.pt")
    b = torch.load(tmp_path / "checked.pt")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("factor, expected", [("1e20", []), ("float('nan')", ["nonfinite-grad"])])
def test_huge_finite_gradients_are_not_called_nonfinite(tmp_path, factor, expected):
    # the batched norm overflows to inf for elements above ~1.8e19; the gradient is still finite
    write(tmp_path, "train.py", f"""
        import torch
        p = torch.nn.Parameter(torch.zeros(4))
        opt = torch.optim.SGD([p], lr=1e-30)
        for i in range(3):
            opt.zero_grad()
            (p * {factor}).sum().backward()
            opt.step()
    """)
    data = json.loads(run_cli("check", "train.py", "-f", "json", cwd=tmp_path).stdout)
    assert [f["rule"] for f in data["findings"]] == expected
