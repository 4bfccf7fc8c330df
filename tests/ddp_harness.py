"""Run several fixture scripts in one distributed launch (each rank checks them in turn,
in-process, through ``run_check``): ``python tests/ddp_harness.py OUT_DIR FIXTURE...`` under
``torch.distributed.run``. Each rank writes ``OUT_DIR/<name>.rank<r>.json`` (its own report as
one part of the run, report/merge.py) for the test to merge: a 2-rank launch costs seconds of
start-up, paid once for every DDP fixture."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fixture_marks import read_marks  # noqa: E402
from graddoctor.run.session import run_check  # noqa: E402
from graddoctor.run.ranks import rank_env  # noqa: E402
from graddoctor.options import CheckOptions  # noqa: E402
from graddoctor.report.json_format import render  # noqa: E402
from graddoctor.report.merge import single  # noqa: E402


def main(out_dir: str, paths: list[str]) -> None:
    import torch.distributed as dist

    env = rank_env()
    start = os.getcwd()
    agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, wait_for_workers=False)
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"  # each fixture: a store of its own
    for n, path in enumerate(paths):
        if env.rank == 0:  # a fresh port per fixture (re-initialising on one store can hang)
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                agent.set(f"harness/port/{n}", str(s.getsockname()[1]))
        os.environ["MASTER_PORT"] = agent.get(f"harness/port/{n}").decode()
        path = os.path.abspath(path)
        _, extra = read_marks(path)
        steps = int(extra[extra.index("--steps") + 1]) if "--steps" in extra else 10
        name = os.path.basename(path)
        os.chdir(os.path.dirname(path))
        try:
            report = run_check(CheckOptions(target=name, steps=steps,
                                            emulate_cuda="--emulate-cuda" in extra))
        finally:
            os.chdir(start)
            if dist.is_initialized():  # the replay stopped the script before its own teardown
                dist.destroy_process_group()
        part = single(report, env.rank, env.label, os.getpid(), env.world_size)
        with open(os.path.join(out_dir, f"{name}.rank{env.rank}.json"), "w") as f:
            f.write(render(part))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
