"""Whatever the script does to its process, graddoctor is never the reason it fails or leaves
something behind: deep autograd graphs, ``os.fork``, ``os.chdir``, training in
threads, the installed ``graddoctor`` command with ``-m``."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time

import torch

from conftest import ROOT, run_cli, run_python
from graddoctor.run import interim
from graddoctor.run.session import CheckOptions, run_check
from graddoctor.options import resolve
from graddoctor.instrument import graphkeep
from graddoctor.instrument.backward import _history_walk, _leaves
from graddoctor.report.formats import FORMATS, RenderOptions


def write(path, text: str):
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


# -- deep autograd graphs ---------------------------------------------------------------------
DEEP = """
import torch
w = torch.nn.Parameter(torch.ones(2))
opt = torch.optim.SGD([w], lr=0.1)
for it in range(2):
    x = w * 1.0
    for _ in range(60_000):
        x = x * 1.0
    loss = x.sum()  # drops the previous iteration's 60,000-node graph
    opt.zero_grad()
    loss.backward()
    opt.step()
print("survived")
"""


def test_deep_graph_is_released_without_a_crash(tmp_path):
    """A walked node has a Python object that lives as long as it, and such nodes are freed by
    recursion: without graddoctor's held nodes, dropping a 60,000-deep walked graph overflowed
    the C stack (signal 11) on the line that drops it."""
    write(tmp_path / "deep.py", DEEP)
    result = run_cli("check", "deep.py", "-f", "json", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert "survived" in result.stderr  # the script's prints go to stderr with -f json
    assert json.loads(result.stdout)["run"]["status"] == "completed"


def _chain(depth: int):
    w = torch.nn.Parameter(torch.ones(2))
    x = w * 1.0
    for _ in range(depth):
        x = x * 1.0
    return w, x.sum()


def test_walks_hold_one_node_in_every_keep_every_and_let_go_once_dropped():
    graphkeep.sweep()
    before = graphkeep.held()
    w, loss = _chain(3 * graphkeep.KEEP_EVERY + 10)
    assert _leaves(loss, None) == [w]
    assert graphkeep.held() - before == 3
    graphkeep.sweep()  # the graph is still the script's: nothing let go of
    assert graphkeep.held() - before == 3
    del loss
    assert graphkeep.sweep() == 3 and graphkeep.held() == before
    small_w, small = _chain(graphkeep.KEEP_EVERY - 2)  # a normal graph holds nothing
    assert _leaves(small, None) == [small_w] and graphkeep.held() == before
    w, loss = _chain(2 * graphkeep.KEEP_EVERY + 1)  # the history walk holds them the same way
    cell = [None, object()]
    leaves, nodes, _, _ = _history_walk(loss, cell)
    assert leaves == [w] and graphkeep.held() - before == 2
    del loss
    graphkeep.sweep()
    assert graphkeep.held() == before


# -- os.chdir ---------------------------------------------------------------------------------
CHDIR = """
import os
import torch
os.chdir("elsewhere")
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(4):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()  # BUG: never cleared
    opt.step()
"""


def test_chdir_keeps_locations_excerpts_and_uris_where_the_script_was_found(tmp_path, monkeypatch):
    write(tmp_path / "train.py", CHDIR)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    # every step's provisional report is wanted here, however long rendering all the formats
    # takes on a loaded machine: the bounded share of the run's time is not what is tested
    monkeypatch.setattr(interim, "CHECKPOINT_ALLOWANCE_S", 1e9)
    provisional = []

    def checkpoint(report):  # written while the script is in elsewhere/
        assert os.getcwd() == str(tmp_path / "elsewhere") or report.run.steps == 0
        provisional.append((report, {name: fmt.render(report, RenderOptions(to_terminal=False))
                                     for name, fmt in FORMATS.items()}))

    # the --trace of `graddoctor check train.py --trace trace.jsonl`, resolved where it starts
    options = resolve("train.py", values={"trace": "trace.jsonl"}, source="library",
                      use_config=False).options
    final = run_check(options, checkpoint=checkpoint)
    assert os.getcwd() == str(tmp_path)
    last, rendered = provisional[-1]
    assert last.run.steps == 4
    for report, text, sarif in ((final, None, None), (last, rendered["text"], rendered["sarif"])):
        assert [(f.rule, f.location.path, f.location.line) for f in report.findings] \
            == [("missing-zero-grad", "train.py", 9)]
    final_text = FORMATS["text"].render(final, RenderOptions(to_terminal=False))
    for text in (rendered["text"], final_text):
        assert "❱  9     loss.backward()" in text, text
        assert "elsewhere" not in text.split("note:")[0], text
    for sarif in (rendered["sarif"], FORMATS["sarif"].render(final, RenderOptions())):
        run = json.loads(sarif)["runs"][0]
        assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == (tmp_path.as_uri() + "/")
        assert run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] \
            == "train.py"
    assert (tmp_path / "trace.jsonl").exists() and not (tmp_path / "elsewhere" / "trace.jsonl").exists()


def test_chdir_output_files_land_where_the_user_started(tmp_path):
    write(tmp_path / "train.py", CHDIR)
    (tmp_path / "elsewhere").mkdir()
    result = run_cli("check", "train.py", "-f", "sarif", "-o", "out.sarif", "--trace", "t.jsonl",
                     cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "wrote out.sarif" in result.stderr
    assert sorted(os.listdir(tmp_path / "elsewhere")) == []  # no provisional report, no trace
    run = json.loads((tmp_path / "out.sarif").read_text(encoding="utf-8"))["runs"][0]
    assert run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] \
        == "train.py"
    assert (tmp_path / "t.jsonl").stat().st_size > 0


# -- the installed `graddoctor` command -------------------------------------------------------
def _console_script(folder) -> str:
    """The launcher pip writes for pyproject's ``[project.scripts] graddoctor``: run as a script
    from a bin folder, so ``sys.path[0]`` is that folder, not the working directory."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        module, func = tomllib.load(f)["project"]["scripts"]["graddoctor"].split(":")
    launcher = folder / "graddoctor"
    launcher.write_text(f"import sys\nfrom {module} import {func}\nsys.exit({func}())\n")
    return str(launcher)


def test_console_script_finds_a_module_in_the_working_directory(tmp_path):
    (tmp_path / "bin").mkdir()
    launcher = _console_script(tmp_path / "bin")
    scripts = os.path.join(ROOT, "tests", "scripts")
    result = run_python(launcher, "check", "-m", "gdpkg.train", "-f", "json", cwd=scripts)
    assert result.returncode == 1, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["run"]["status"] == "completed"
    assert [(f["rule"], f["location"]["path"]) for f in report["findings"]] \
        == [("missing-zero-grad", os.path.join("gdpkg", "train.py"))]
    missing = run_python(launcher, "check", "-m", "gdpkg.nothing", cwd=scripts)
    assert missing.returncode == 2 and "no module named 'gdpkg.nothing'" in missing.stderr


# -- os.fork ----------------------------------------------------------------------------------
FORK = """
import os, sys, time
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
started, ready = os.pipe()
pid = os.fork()
if pid == 0:
    print("child pid", os.getpid(), flush=True)
    os.write(ready, b"x")
    if sys.argv[1] == "raise":
        raise ValueError("the child failed")
    for i in range(10**6):  # the child trains on, without graddoctor
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.01)
os.close(ready)
os.read(started, 1)  # the child has started
if sys.argv[1] == "raise":
    os.read(started, 1)  # and ended (its end of the pipe closed)
time.sleep(0.2)
for i in range(20):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("parent done", flush=True)
"""


def test_fork_child_runs_uninstrumented_and_never_outlives_the_check(tmp_path):
    """A forked child must not block on faulthandler's lock once its script ends (the parent would
    wait until --timeout) nor outlive graddoctor."""
    write(tmp_path / "fork.py", FORK)
    for mode, ended in (("train", "it was still running when the check ended, so graddoctor stopped it"),
                        ("raise", "it ended with exit code 1")):
        started = time.monotonic()
        result = run_cli("check", "fork.py", "--steps", "3", "--timeout", "60", "-f", "json",
                         "--", mode, cwd=tmp_path, timeout=120)
        assert time.monotonic() - started < 40, result.stderr[-2000:]
        report = json.loads(result.stdout)  # one report: the child never writes one
        run = report["run"]
        assert run["status"] == "step-limit" and run["steps"] == 3, run
        child = int(result.stderr.split("child pid ")[1].split()[0])
        assert [n for n in run["notes"] if "forked" in n] == [
            f"the script forked a child process at fork.py:7 (pid {child}); it ran without "
            f"graddoctor, so its training is not checked; {ended}"
            + (" (signal SIGTERM)" if mode == "train" else "")]
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            pass
        else:
            raise AssertionError(f"the forked child {child} outlived the check")
        if mode == "raise":
            assert 'raise ValueError("the child failed")' in result.stderr
            assert "graddoctor" not in result.stderr.split("Traceback")[1].split("ValueError: the")[0]


# -- threads ----------------------------------------------------------------------------------
THREADS = """
import threading
import time
import torch


started = threading.Barrier(2)  # both threads train from the start, however loaded the machine


def train(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    started.wait()
    for _ in range(30):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        time.sleep(0.002)  # the other thread's zero_grad, backward and step run in between
        opt.step()


threads = [threading.Thread(target=train, args=(seed,)) for seed in (1, 2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("joined")
"""


def test_training_in_threads_stops_cleanly_with_a_true_status_and_distinct_names(tmp_path, capfd):
    write(tmp_path / "threads.py", THREADS)
    report = run_check(CheckOptions(target=str(tmp_path / "threads.py"), steps=12))
    err = capfd.readouterr().err
    assert "StepLimitReached" not in err and "Traceback" not in err, err
    assert report.run.status == "step-limit"  # the main thread ended normally; the replay was cut
    assert any("ended the replay in 2 threads" in n for n in report.run.notes), report.run.notes
    assert any("stepped in 2 threads" in n for n in report.run.notes), report.run.notes
    # a backward running in one thread no longer hides the other thread's, and the ledger follows
    # each thread's own loop: the interleaving is no stale gradient
    assert report.run.backward_calls >= report.run.steps
    assert [(f.rule, f.severity.value) for f in report.findings] == []
    assert report.internal_errors == []
    a = report.analysis
    assert sorted(a.param_name(pid) for pid in a.params) == sorted(
        f"model.{p} (SGD #{opt})" for p in ("weight", "bias") for opt in (0, 1))


def _two_threads(t, clear_a: bool, threads=(1, 2)):
    """Thread 1 trains opt 0 (pids 0, 1), thread 2 opt 1 (pids 2, 3); two whole updates of
    thread 2 run between thread 1's backward and its step. ``threads=(None, None)``: the same
    calls without thread keys."""
    a, b = ({"thread": n} if n is not None else {} for n in threads)
    t.optimizer(0, [0, 1], line=3)
    t.optimizer(1, [2, 3], line=3)
    for i in range(3):
        if clear_a:
            t.clear([0, 1], opt=0, line=5, **a)
        if clear_a or i == 0:
            t.backward(fresh=[0, 1], line=6, **a)
        else:
            t.backward(accumulated=[0, 1], line=6, **a)
        for _ in range(2):
            t.clear([2, 3], opt=1, line=5, **b)
            t.backward(fresh=[2, 3], line=6, **b)
            t.step(1, line=7, **b)
        t.step(0, line=7, **a)
    return t.trace


def _ledger_findings(trace):
    from graddoctor.rules.engine import analyze

    findings, errors = analyze(trace)
    assert not errors
    return sorted((f.rule, f.location.line) for f in findings if f.severity.value != "info")


def test_ledger_follows_each_threads_loop():
    from graddoctor.trace import TraceBuilder

    assert _ledger_findings(_two_threads(TraceBuilder(), clear_a=True)) == []
    assert _ledger_findings(_two_threads(TraceBuilder(), clear_a=False)) == [("missing-zero-grad", 6)]
    # the same calls without thread keys read as one loop: thread 1's step applies a gradient of
    # a phase before thread 2's steps (why events of other threads carry their thread)
    assert _ledger_findings(_two_threads(TraceBuilder(), clear_a=True, threads=(None, None))) \
        == [("stale-grad", 7)]
