"""Workers started with multiprocessing: instrumented through the start-up hook
(graddoctor/_hook/sitecustomize.py, graddoctor/run/workers.py, graddoctor/run/in_worker.py)
and merged into the one report; workers started with fork are named as unchecked."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from graddoctor.run.session import run_check
from graddoctor.run.workers import ENV, HOOK_DIR
from graddoctor.options import CheckOptions

WORKERS = textwrap.dedent('''\
    import multiprocessing as mp
    import torch


    def train(seed):
        torch.manual_seed(seed)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(30):
            model(torch.randn(8, 4)).pow(2).mean().backward()  # BUG: no zero_grad
            opt.step()


    if __name__ == "__main__":
        for method in ("spawn", "fork"):
            worker = mp.get_context(method).Process(target=train, args=(0,))
            worker.start()
            worker.join()
            assert worker.exitcode == 0, worker.exitcode
        print("workers done")
''')


def test_a_spawned_worker_is_checked_and_a_forked_one_is_named(tmp_path, monkeypatch):
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    monkeypatch.chdir(tmp_path)
    report = run_check(CheckOptions(target="workers.py", steps=5))
    assert report.run.status == "step-limit", report.run  # the worker's; the main one trained nothing
    assert [(f.rule, f.location.line, f.processes) for f in report.findings] == \
        [("missing-zero-grad", 10, (report.run.ranks[1]["process"],))]
    statuses = [(e["process"].split(" pid")[0], e["status"], e["steps"]) for e in report.run.ranks]
    assert statuses == [("main process", "completed", 0), ("worker", "step-limit", 5)] or \
        statuses == [("main process", "no-training-loop", 0), ("worker", "step-limit", 5)]
    assert any("ran unchecked" in n and "started with fork" in n and "train" in n
               for n in report.run.notes), report.run.notes
    assert ENV not in os.environ and HOOK_DIR not in os.environ.get("PYTHONPATH", "")


def test_the_hook_is_inert_outside_workers_and_chains_to_another_sitecustomize(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE'] = 'ran'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HOOK_DIR, str(other)]))
    env[ENV] = '{"dir": "/nonexistent"}'  # set, but this is not a multiprocessing worker
    done = subprocess.run(
        [sys.executable, "-c", "import os, sys; print(os.environ.get('OTHER_SITE'), "
         "'graddoctor' in sys.modules, 'torch' in sys.modules)"],
        env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["ran", "False", "False"], done.stderr
