"""The side of a multiprocessing worker the checked script spawned (run/workers.py says how the
start-up hook gets here): the worker's life is a ``Session`` begun at start-up and ended once,
at the step budget or when the worker exits; its report goes to the folder the main process
reads, as one part of the run (report/merge.py).
"""

from __future__ import annotations

import atexit
import json
import os
import sys

from ..options import CheckOptions
from ..report.json_format import render
from ..report.merge import single
from ..instrument.topics import STEPPED
from .session import Session
from .workers import ENV


def start_child() -> None:
    """In a multiprocessing worker, from the start-up hook: instrument it until it ends."""
    config = json.loads(os.environ[ENV])
    options = CheckOptions(target=config.get("script") or "?", steps=config.get("steps", 10),
                           epoch_batches=config.get("epoch_batches", 17),
                           select=tuple(config.get("select", ())),
                           ignore=tuple(config.get("ignore", ())),
                           emulate_cuda=bool(config.get("emulate_cuda")))
    worker = _Worker(Session(options, announce=False).begin(), config["dir"])
    with open(os.path.join(config["dir"], f"{os.getpid()}.started"), "w"):
        pass
    worker.session.rec.subscribe(STEPPED, worker.note_rank)
    worker.session.rec.progress.divert_stop(worker.stopped)
    atexit.register(worker.finish)


class _Worker:
    """A spawned worker's session, ended once: at the step budget or when the worker exits."""

    def __init__(self, session, folder: str):
        self.session = session
        self.folder = folder
        self.rank: int | None = None
        self.done = False

    def note_rank(self, *_args) -> None:
        if self.rank is None:
            try:
                import torch.distributed as dist

                if dist.is_available() and dist.is_initialized():
                    self.rank = dist.get_rank()
            except Exception:
                pass

    def stopped(self, exception) -> None:
        """The step budget: report and end the worker cleanly (a stop raised into the user's
        function would be reported by ``mp.spawn`` as the worker's crash)."""
        self.finish(exception())
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def finish(self, ended_by: BaseException | None = None) -> None:
        if self.done:
            return
        self.done = True
        try:
            rec = self.session.rec
            if rec.progress.steps == 0 and rec.progress.backward_calls == 0:
                self.session.discard()
                return  # trained nothing: no report
            report = self.session.end(ended_by)
            pid = os.getpid()
            label = f"rank {self.rank}" if self.rank is not None else f"worker pid {pid}"
            part = single(report, self.rank, label, pid, (self.rank or 0) + 1)
            path = os.path.join(self.folder, f"{pid}.json")
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write(render(part))
            os.replace(path + ".tmp", path)
        except Exception as exc:
            sys.stderr.write(f"graddoctor: worker pid {os.getpid()} could not write its report: "
                             f"{type(exc).__name__}: {exc}\n")
