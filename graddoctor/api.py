"""The public Python API: ``check_script`` (what ``graddoctor check`` does, returning the
``Report``) and ``watch()`` (the same instrumentation around a block of the caller's own code).

Both take the options of the option table (options.py) as keyword arguments, by their python
names, resolved and validated there (``options.resolve``, ``options.resolve_watch``): one
definition for the CLI, ``[tool.graddoctor]`` and Python. Both
enter a run's ``Session`` (run/session.py), which records, ends the run, decides its status
and builds the report, under the process's one-check lock.

Nothing here imports torch until a check starts (``import graddoctor`` stays light).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Sequence

from .errors import ScriptError, WatchError
from .report.model import Report
from .status import ReplayTimeout, StopReplay

__all__ = ["check_script", "watch", "Watch", "merge_reports", "Report", "ScriptError",
           "WatchError"]


# -- options --------------------------------------------------------------------------------

def _given(**values: Any) -> dict[str, Any]:
    """The keyword arguments the caller gave (None: not given)."""
    return {name: value for name, value in values.items() if value is not None}


# -- check_script ---------------------------------------------------------------------------

def check_script(
    path: "str | os.PathLike[str]",
    argv: Sequence[str] = (),
    *,
    module: bool | None = None,
    steps: int | None = None,
    epoch_batches: int | None = None,
    timeout: float | None = None,
    device: str | None = None,
    emulate_cuda: bool | None = None,
    fail_on: str | None = None,
    trace: "str | os.PathLike[str] | None" = None,
    select: "str | Sequence[str] | None" = None,
    ignore: "str | Sequence[str] | None" = None,
    allow_incomplete: bool | None = None,
    config: bool = True,
    isolate: bool = False,
    grad_flow: bool = False,
) -> Report:
    """Run a training script (or, with ``module=True``, a module, like ``python -m``) under
    graddoctor, as ``graddoctor check PATH -- ARGV`` does, and return the ``Report``.

    The keyword options are the CLI's (``graddoctor check --help``), by python name; None
    means "not given": the value of ``[tool.graddoctor]`` in the closest pyproject.toml above
    the script (unless ``config=False``), else the CLI's default. ``timeout=0``: no limit.

    The script runs in this process, as ``python`` would run it; the interpreter state it
    changes (``sys.argv``, ``sys.path``, cwd, ...) and torch are put back afterwards.
    Whatever the script does (crash, ``sys.exit``, time limit) ends up in ``report.run``.
    Put back too: warnings filters, the recursion limit, names set or replaced in
    ``builtins`` (``builtins.print = ...``). Not put back: attributes the script sets on
    classes or modules (``torch.Tensor.foo = ...``, a monkeypatched library function), modules
    it imported, threads it left running. ``isolate=True`` runs the check in a child process
    (``python -m graddoctor check``) and returns the report read back from its JSON: nothing
    the script does reaches this process, and the report has no ``analysis`` (no update
    timeline in its text view).
    Raises ``ScriptError`` when the target cannot be run at all or an option is bad, and
    ``WatchError`` inside another check or ``watch()`` block. ``grad_flow=True`` records every
    update's gradient norms for the pictures (``report.render("html")``, a notebook's view).
    ``emulate_cuda=True`` runs the script's GPU path with every tensor on the CPU
    (docs/emulate-cuda.md).
    """
    from .run.session import run_check

    values = _given(module=module, steps=steps, epoch_batches=epoch_batches, timeout=timeout,
                    device=device, emulate_cuda=emulate_cuda, fail_on=fail_on, select=select,
                    ignore=ignore, allow_incomplete=allow_incomplete,
                    # where the caller is: a script that changes directory moves no file
                    trace=os.path.abspath(os.fspath(trace)) if trace is not None else None)
    from .options import resolve

    target = path if (module and isinstance(path, str)) else os.fspath(path)
    options = resolve(target, [str(a) for a in argv], values, values, source="python",
                      use_config=config, pictures=grad_flow).options
    if isolate:
        return _check_in_child(options)
    return run_check(options)


def _check_in_child(options) -> Report:
    """``check_script(isolate=True)``: the resolved options as the CLI's flags, the report read
    back from the JSON file the child writes."""
    import json
    import subprocess
    import sys
    import tempfile

    from .errors import ScriptError
    from .report.json_format import from_dict

    args = [sys.executable, "-m", "graddoctor", "check", options.target,
            "--steps", str(options.steps), "--epoch-batches", str(options.epoch_batches),
            "--timeout", f"{options.timeout or 0:g}", "--device", options.device,
            "--fail-on", options.fail_on,
            "--allow-incomplete" if options.allow_incomplete else "--no-allow-incomplete"]
    if options.module:
        args.insert(4, "-m")
    if options.emulate_cuda:
        args.append("--emulate-cuda")
    if options.select:
        args += ["--select", ",".join(options.select)]
    if options.ignore:
        args += ["--ignore", ",".join(options.ignore)]
    if options.trace_path:
        args += ["--trace", options.trace_path]
    with tempfile.TemporaryDirectory(prefix="graddoctor-isolate-") as folder:
        out = os.path.join(folder, "report.json")
        done = subprocess.run([*args, "--format", "json", "-o", out, "--", *options.args],
                              stdin=subprocess.DEVNULL, stdout=sys.stdout.fileno()
                              if _has_fileno(sys.stdout) else None, stderr=subprocess.PIPE,
                              text=True)
        if not os.path.exists(out):
            lines = [ln for ln in done.stderr.splitlines() if ln.startswith("graddoctor: error:")]
            raise ScriptError(lines[-1].split("error: ", 1)[1] if lines else
                              f"the isolated check ended with exit code {done.returncode} "
                              f"and no report: {done.stderr[-2000:]}")
        sys.stderr.write("".join(ln for ln in done.stderr.splitlines(keepends=True)
                                 if not ln.startswith("graddoctor: wrote ")))
        with open(out, encoding="utf-8") as f:
            report = from_dict(json.load(f))
    import dataclasses

    return dataclasses.replace(report, fail_on=options.fail_on,
                               allow_incomplete=options.allow_incomplete)


def _has_fileno(stream) -> bool:
    try:
        stream.fileno()
        return True
    except Exception:
        return False


# -- merge_reports ---------------------------------------------------------------------------

def merge_reports(paths: "Sequence[str | os.PathLike[str]]", *, fail_on: str = "warning",
                  allow_incomplete: bool = False) -> Report:
    """Join the per-rank JSON reports of a distributed run (``graddoctor check --format json
    -o 'report.{rank}.json'`` under torchrun) into one ``Report``, as ``graddoctor merge``
    does: each finding says on which ranks it was seen, a rank without a report makes the run
    incomplete. Raises ``ScriptError`` for a bad option or files that cannot be joined."""
    from .options import check_values  # the one resolver (options.py), looked up per call
    from .report.merge import MergeError, merge_files

    checked = check_values({"fail_on": fail_on, "allow_incomplete": allow_incomplete}, "python")
    try:
        return merge_files([os.fspath(p) for p in paths], **checked)
    except MergeError as exc:
        raise ScriptError(str(exc)) from None


# -- watch ----------------------------------------------------------------------------------

class Watch(contextlib.ContextDecorator):
    """Instruments what runs inside it (``with``, or as a decorator) in this process; when the
    block ends, ``report`` holds the ``Report`` (findings, update timeline, summary) — the one
    ``graddoctor check`` renders.

    An exception raised in the block is recorded (``report.run.status == "crashed"``) and goes
    on to the caller; a step budget (``steps=N``) ends the block quietly after N optimizer
    steps (status ``step-limit``). Every patch is removed on exit, also after an exception.
    One watch (or check) at a time per process: entering a second raises ``WatchError``.
    A ``Watch`` may be entered again once it has ended (a decorated function, called twice):
    ``report`` is then the latest block's.
    """

    def __init__(self, **options: Any) -> None:
        from .options import resolve_watch  # the one resolver (options.py), looked up per call

        self._options = resolve_watch(options)
        self.fail_on: str = self._options.fail_on
        self.report: Report | None = None
        self.label: str | None = None  # the report's title; default: "watch() at <file:line>"
        # variables of the watched code besides the caller's frames' (a notebook's namespace):
        # they hold optimizers made before the block and name the parameters
        self.namespace: dict | None = None
        self._run = None  # the Session of the block that runs
        self._failed: BaseException | None = None  # see failed_with

    # -- results ----------------------------------------------------------------------------
    @property
    def findings(self):
        """The findings of the latest block (all of them, suppressed ones included)."""
        return self.report.findings if self.report is not None else []

    @property
    def failed(self) -> bool:
        """Whether the latest block had a finding at or above ``fail_on``."""
        return bool(self.report is not None and self.report.at_or_above(self.fail_on))

    def __repr__(self) -> str:
        if self.report is None:
            state = "running" if self._run is not None else "not run"
        else:
            state = f"{len(self.report.active())} findings, status {self.report.run.status}"
        return f"<graddoctor.Watch {state}>"

    # -- the block --------------------------------------------------------------------------
    def __enter__(self) -> "Watch":
        import dataclasses

        from .run.session import Session

        label = self.label or f"watch() at {_caller()}"
        frame = sys._getframe(1)
        session = Session(dataclasses.replace(self._options, target=label), claim=label).begin(
            lambda finder: {**(self.namespace or {}), **_user_variables(finder, frame)})
        self.report = None
        self._run = session
        self._failed = None
        return self

    def failed_with(self, error: BaseException) -> None:
        """The block's code raised ``error`` and something else handled it (IPython shows a
        cell's error and goes on): the block ends as if it had raised it."""
        self._failed = error

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._run is None:  # not entered (or entered and failed)
            return False
        session, self._run = self._run, None
        frame = sys._getframe(1)
        self.report = session.end(exc if exc is not None else self._failed,
                                  lambda finder: {**(self.namespace or {}),
                                                  **_user_variables(finder, frame)})
        self._failed = None
        return isinstance(exc, StopReplay) and not isinstance(exc, ReplayTimeout)


def _caller() -> str:
    """``path:line`` of the user's code that entered the watch (for the report's header)."""
    from .location import LocationFinder

    for frame in LocationFinder().user_frames(sys._getframe(2)):
        path = os.path.abspath(frame.f_code.co_filename)
        try:
            rel = os.path.relpath(path)
            path = path if rel.startswith("..") else rel
        except ValueError:
            pass
        return f"{path}:{frame.f_lineno}"
    return "<unknown>"


def _user_variables(finder, frame) -> dict[str, object]:
    """The variables of the user's frames around the block (locals first): the names the
    report gives parameters (``model.fc1.weight``)."""
    found: dict[str, object] = {}
    for user_frame in finder.user_frames(frame):
        for scope in (user_frame.f_locals, user_frame.f_globals):
            for key, value in list(scope.items()):
                found.setdefault(key, value)
    return found


def watch(
    *,
    steps: int = 0,
    epoch_batches: int = 0,
    emulate_cuda: bool = False,
    fail_on: str = "warning",
    trace: "str | os.PathLike[str] | None" = None,
    select: "str | Sequence[str]" = (),
    ignore: "str | Sequence[str]" = (),
) -> Watch:
    """Watch the code that runs inside a ``with`` block (or a decorated function) in this
    process, with the rules of ``graddoctor check``::

        with graddoctor.watch() as w:
            train_one_epoch(model, loader, optimizer)
        print(w.report)                  # the text report; w.report.findings, .to_json()
        assert not w.failed              # no finding at or above fail_on

    Options (the CLI's, validated by the same table): ``steps`` — end the block quietly after
    this many optimizer steps (0: watch it whole); ``epoch_batches`` — cut DataLoader epochs
    to this many batches (0: their real length); ``select`` / ``ignore`` — rules by slug or
    code prefix; ``fail_on`` — the severity ``failed`` (and the pytest plugin) treats as a
    failure; ``trace`` — also write the recorded events to this file (JSON lines);
    ``emulate_cuda`` — CUDA answers as present and every tensor stays on the CPU
    (docs/emulate-cuda.md).
    """
    return Watch(steps=steps, epoch_batches=epoch_batches, fail_on=fail_on,
                 trace=os.fspath(trace) if trace is not None else None,
                 select=select, ignore=ignore, emulate_cuda=emulate_cuda)
