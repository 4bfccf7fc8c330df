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
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time

ENV = "GRADDOCTOR_CHILD"
HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_hook")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Children:
    """The main process's side: the hook's environment while the script runs, the processes
    it started, and afterwards their reports."""

    def __init__(self, options):
        self.options = options
        self.dir: str | None = None
        self.started: list[dict] = []  # {pid, method, target}
        self._saved: dict[str, str | None] = {}
        self._patch = None

    @contextlib.contextmanager
    def watching(self, rec=None):
        """``rec``: the main process's recorder; in a child forked from it, it never stops the
        child (a stop raised there would end the worker with graddoctor's traceback)."""
        global _forked_from
        _forked_from = rec
        _register_at_fork()
        self.dir = tempfile.mkdtemp(prefix="graddoctor-workers-")
        config = {"dir": self.dir, "root": _ROOT, "script": self.options.target,
                  "steps": self.options.steps, "epoch_batches": self.options.epoch_batches,
                  "select": list(self.options.select), "ignore": list(self.options.ignore)}
        for key, value in ((ENV, json.dumps(config)),
                           ("PYTHONPATH", os.pathsep.join(
                               [HOOK_DIR, *filter(None, [os.environ.get("PYTHONPATH")])]))):
            self._saved[key] = os.environ.get(key)
            os.environ[key] = value
        self._install()
        try:
            yield self
        finally:
            _forked_from = None
            self._uninstall()
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

        mpp.BaseProcess.start = start
        self._patch = (mpp.BaseProcess, original)

    def _uninstall(self) -> None:
        if self._patch is not None:
            owner, original = self._patch
            owner.start = original
            self._patch = None

    def reports(self) -> tuple[list, list[str]]:
        """(parts of the children that trained, notes on the processes that ran unchecked)."""
        from .report.merge import Part, from_json

        parts, notes = [], []
        if self.dir is None:
            return parts, notes
        try:
            names = os.listdir(self.dir)
            for name in sorted(names):
                if name.endswith(".json"):
                    with open(os.path.join(self.dir, name), encoding="utf-8") as f:
                        report = from_json(json.load(f))
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


_forked_from = None  # the recorder of the run in progress (a forked child inherits it)
_at_fork_registered = False


def _after_fork_in_child() -> None:
    rec = _forked_from
    if rec is None:
        return
    try:  # the copy records into a trace nobody reads: never stop the child's own work
        rec._asked = {moment: [] for moment in rec._asked}
        rec._stop = None
    except Exception:
        pass


def _register_at_fork() -> None:
    global _at_fork_registered
    if not _at_fork_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)  # cannot be removed: once
        _at_fork_registered = True


def merge_children(report, children: Children):
    """The main process's report with the workers' reports merged in (or as it was)."""
    from .report.merge import Part, merge

    parts, notes = children.reports()
    if not parts:
        report.run.notes.extend(notes)
        return report
    ranks = {p.rank for p in parts if p.rank is not None}
    world = max(ranks) + 1 if ranks else 1
    main = Part(report, None, "main process", os.getpid())
    merged = merge([main, *parts], world_size=world)
    if report.run.status == "no-training-loop":  # the timeline of a worker that trained
        merged.analysis = None
    merged.run.notes.extend(notes)
    return merged


# -- the worker's side ----------------------------------------------------------------------------

_state: dict = {}


def start_child() -> None:
    """In a multiprocessing worker, from the start-up hook: instrument it until it ends."""
    config = json.loads(os.environ[ENV])
    from .instrument import Instrumentation, Recorder
    from .location import LocationFinder
    from .options import CheckOptions

    rec = Recorder(step_budget=config.get("steps") or None, finder=LocationFinder())
    instrumentation = Instrumentation(rec, config.get("epoch_batches", 17))
    instrumentation.__enter__()
    options = CheckOptions(target=config.get("script") or "?", steps=config.get("steps", 10),
                           select=tuple(config.get("select", ())),
                           ignore=tuple(config.get("ignore", ())))
    _state.update(rec=rec, instrumentation=instrumentation, options=options, dir=config["dir"],
                  started=time.perf_counter(), rank=None, done=False)
    with open(os.path.join(config["dir"], f"{os.getpid()}.started"), "w"):
        pass

    def note_rank(*_args) -> None:
        if _state["rank"] is None:
            try:
                import torch.distributed as dist

                if dist.is_available() and dist.is_initialized():
                    _state["rank"] = dist.get_rank()
            except Exception:
                pass

    rec.subscribe("stepped", note_rank)

    def maybe_stop() -> None:  # the step budget: report and end the worker cleanly
        if rec.stop_requested:
            exception, _reason = rec._stop
            _finish(getattr(exception, "status", "step-limit"))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    rec.maybe_stop = maybe_stop
    atexit.register(_finish, "completed")


def _finish(status: str) -> None:
    if not _state or _state.get("done"):
        return
    _state["done"] = True
    try:
        from .check import build_report
        from .report.json_format import render
        from .report.merge import single

        rec, instrumentation = _state["rec"], _state["instrumentation"]
        instrumentation.__exit__(None, None, None)
        if rec.steps == 0 and rec.backward_calls == 0:
            return  # trained nothing: no report
        report = build_report(_state["options"], rec, rec.trace, status=status, error=None, notes=[],
                              duration=time.perf_counter() - _state["started"])
        rank, pid = _state["rank"], os.getpid()
        label = f"rank {rank}" if rank is not None else f"worker pid {pid}"
        part = single(report, rank, label, pid, (rank or 0) + 1)
        path = os.path.join(_state["dir"], f"{pid}.json")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(render(part))
        os.replace(path + ".tmp", path)
    except Exception as exc:
        sys.stderr.write(f"graddoctor: worker pid {os.getpid()} could not write its report: "
                         f"{type(exc).__name__}: {exc}\n")
