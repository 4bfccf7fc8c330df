"""Worker processes the checked script starts with ``multiprocessing`` (``torch.multiprocessing
.spawn``, ``Process`` in a spawn or forkserver context): instrumented through a start-up hook in
the child's interpreter, and their reports merged into the one report.

While the script runs, ``GRADDOCTOR_CHILD`` (the options, a folder for the reports) is set and
``graddoctor/_hook`` comes first on ``PYTHONPATH``: its ``sitecustomize`` runs in every Python
child, does nothing unless the child is a multiprocessing worker, and there calls
``start_child``: the same instrumentation as the main process, from the first line. A worker
writes ``<pid>.started`` at once and ``<pid>.json`` (its report as one part of the run,
report/merge.py) when it ends or reaches the step budget — then it exits 0 right away, since a
stop raised into the user's function would be reported by ``mp.spawn`` as the worker's crash.

Workers started with ``fork`` (``multiprocessing.Process`` on Linux by default) are copies of
the instrumented process: they are not checked, and the report names them (``started``).
DataLoader workers train nothing and are left out.

This module is the main process's side; the worker's own is run/in_worker.py: a ``Session``
(run/session.py) begun at start-up and ended when the worker stops or exits. The main
process's session merges the workers' parts (``Workers.reports``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile

from ..instrument.patcher import Patcher
from ..report.json_format import from_dict
from ..report.merge import Part
from .atfork import undone_in_forked_child

ENV = "GRADDOCTOR_CHILD"
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOOK_DIR = os.path.join(_PKG, "_hook")
_ROOT = os.path.dirname(_PKG)


class Workers:
    """The main process's side: the hook's environment while the script runs, the processes
    it started, and afterwards their reports."""

    def __init__(self, options):
        self.options = options
        self.dir: str | None = None
        self.started: list[dict] = []  # {pid, method, target}
        self._saved: dict[str, str | None] = {}
        self._patches = Patcher()

    @contextlib.contextmanager
    def watching(self, rec):
        """``rec``: the main process's recorder; in a child forked from it, it never stops the
        child (a stop raised there would end the worker with graddoctor's traceback)."""
        with undone_in_forked_child(lambda: rec.progress.divert_stop(None)), self._environment():
            yield self

    @contextlib.contextmanager
    def _environment(self):
        self.dir = tempfile.mkdtemp(prefix="graddoctor-workers-")
        config = {"dir": self.dir, "root": _ROOT, "script": self.options.target,
                  "steps": self.options.steps, "epoch_batches": self.options.epoch_batches,
                  "select": list(self.options.select), "ignore": list(self.options.ignore),
                  "emulate_cuda": self.options.emulate_cuda}
        for key, value in ((ENV, json.dumps(config)),
                           ("PYTHONPATH", os.pathsep.join(
                               [HOOK_DIR, *filter(None, [os.environ.get("PYTHONPATH")])]))):
            self._saved[key] = os.environ.get(key)
            os.environ[key] = value
        self._install()
        try:
            yield
        finally:
            # nothing started (an input error, a script without workers): no folder left behind;
            # one the workers wrote into is read and removed by ``reports``
            with contextlib.suppress(OSError):
                os.rmdir(self.dir)
            self._patches.undo()
            for key, value in self._saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def _install(self) -> None:
        import multiprocessing.process as mpp

        original = mpp.BaseProcess.start
        children = self

        def start(process, *args, **kwargs):
            target = getattr(process, "_target", None)  # start() deletes it
            result = original(process, *args, **kwargs)
            try:
                name = getattr(target, "__qualname__", None) or repr(target)
                module = getattr(target, "__module__", "") or ""
                if not module.startswith("torch.utils.data"):  # DataLoader workers train nothing
                    import multiprocessing

                    method = getattr(process, "_start_method", None) or \
                        multiprocessing.get_start_method(allow_none=True) or "fork"
                    children.started.append({"pid": process.pid, "method": method,
                                             "target": f"{module}.{name}" if module else name})
            except Exception:
                pass
            return result

        self._patches.patch(mpp.BaseProcess, "start", start)

    def discard(self) -> None:
        """The process ends without reading the workers' reports (the watchdog's hard exit)."""
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def reports(self) -> tuple[list, list[str]]:
        """(parts of the children that trained, notes on the processes that ran unchecked)."""
        parts, notes = [], []
        if self.dir is None:
            return parts, notes
        try:
            try:
                names = os.listdir(self.dir)
            except FileNotFoundError:  # empty, removed when the script ended
                names = []
            for name in sorted(names):
                if name.endswith(".json"):
                    with open(os.path.join(self.dir, name), encoding="utf-8") as f:
                        report = from_dict(json.load(f))
                    entry = report.run.ranks[0]
                    parts.append(Part(report, entry["rank"], entry["process"], entry["pid"]))
            hooked = {int(n.split(".")[0]) for n in names if n.endswith(".started")}
        except Exception as exc:
            notes.append(f"graddoctor could not read the workers' reports: {exc!r}")
            hooked = set()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
        unchecked = []
        for child in self.started:
            if child["method"] == "fork":
                unchecked.append(f"pid {child['pid']} ({child['target']}, started with fork: a "
                                 f"copy of this process, not instrumented)")
            elif child["pid"] not in hooked:
                unchecked.append(f"pid {child['pid']} ({child['target']}, {child['method']}: the "
                                 f"start-up hook did not run in it)")
        if unchecked:
            notes.append(f"{len(unchecked)} worker process{'es' if len(unchecked) > 1 else ''} "
                         f"ran unchecked: {'; '.join(unchecked)}. graddoctor instruments workers "
                         f"started with spawn or forkserver (torch.multiprocessing.spawn does)")
        return parts, notes
