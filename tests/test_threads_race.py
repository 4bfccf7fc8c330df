"""Threads of the script that train at the same time: graddoctor must never read a tensor that
another thread's running backward writes (autograd writes a leaf's ``.grad`` without the GIL).
Before each backward read the gradients of every tracked tensor, the other thread's included,
this script crashed the process (heap corruption or a segfault) in nearly every check. Many
short checks, in-process through the API and through the CLI, each in its own process: a crash
is an exit code, not a lost pytest worker."""

from __future__ import annotations

import textwrap

from conftest import run_cli, run_python

# two threads, a deep model each (many tensors: a long read before each backward), no pause
HOT_THREADS = """
import threading
import torch


def train(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(24)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(120):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()


threads = [threading.Thread(target=train, args=(seed,)) for seed in (1, 2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("joined")
"""

CHECKS = 4


def test_threads_training_their_own_models_never_crash_a_check_through_the_api(tmp_path):
    script = tmp_path / "hot_threads.py"
    script.write_text(HOT_THREADS)
    driver = tmp_path / "many_checks.py"
    driver.write_text(textwrap.dedent(f"""
        import graddoctor
        for _ in range({CHECKS}):
            report = graddoctor.check_script({str(script)!r}, steps=0)
            assert report.run.status.value == "completed", report.run.status
            assert not [f for f in report.findings if f.severity != "info"], report.findings
        print("checks done")
    """))
    done = run_python(str(driver), cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0 and "checks done" in done.stdout, (done.returncode, done.stderr[-3000:])


def test_threads_training_their_own_models_never_crash_a_check_through_the_cli(tmp_path):
    script = tmp_path / "hot_threads.py"
    script.write_text(HOT_THREADS)
    for _ in range(2):
        done = run_cli("check", str(script), "--steps", "0", cwd=str(tmp_path), timeout=300)
        assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
        assert "joined" in done.stdout + done.stderr
