"""Run the user's script (or ``-m module``) the way ``python`` would, and say how it ended.

Like ``coverage run``: ``sys.argv``, ``__main__``, ``sys.path[0]``, cwd unchanged. The replay is
ended by ``StopReplay`` (a BaseException) from the instrumentation, or by a wall-clock alarm.
Everything the runner changes in ``sys`` is put back afterwards.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import types
from dataclasses import dataclass, field

from .instrument.recorder import ReplayTimeout, StepLimitReached
from .location import LocationFinder
from .trace import Location


class ScriptError(Exception):
    """The target cannot be run at all (missing file, not Python, syntax error)."""


@dataclass
class RunOutcome:
    status: str = "completed"  # completed | step-limit | timeout | crashed | no-training-loop
    error: dict | None = None  # {type, message, location{path,line}}
    exit_code: int | None = None  # the script's own SystemExit code, if it raised one
    notes: list[str] = field(default_factory=list)
    namespace: dict | None = None  # the script's globals, kept alive until the check ends


def compile_script(path: str):
    """Read and compile a script, turning every reason it cannot run into ScriptError."""
    if not os.path.exists(path):
        raise ScriptError(f"no such file: {path}")
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "__main__.py")):
            path = os.path.join(path, "__main__.py")
        else:
            raise ScriptError(f"{path} is a directory, not a Python script")
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:
        raise ScriptError(f"cannot read {path}: {exc.strerror}") from None
    if b"\0" in source:
        raise ScriptError(f"{path} is not a Python script (binary file)")
    try:
        return compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise ScriptError(
            f"{path}:{exc.lineno}: syntax error: {exc.msg} — is this a Python script?"
        ) from None
    except ValueError as exc:
        raise ScriptError(f"{path} is not a Python script: {exc}") from None


def check_module(name: str) -> None:
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        raise ScriptError(f"cannot find module {name!r}: {exc}") from None
    if spec is None:
        raise ScriptError(f"no module named {name!r}")


class _Alarm:
    """Raise ReplayTimeout in the main thread after ``seconds`` (SIGALRM where available)."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self._old = None
        self._active = False

    def __enter__(self):
        usable = (self.seconds and self.seconds > 0 and hasattr(signal, "setitimer")
                  and threading.current_thread() is threading.main_thread())
        if usable:
            def on_alarm(signum, frame):
                raise ReplayTimeout(f"time limit of {self.seconds:g} s reached")

            self._old = signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
            self._active = True
        return self

    def __exit__(self, *exc):
        if self._active:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old)


def run_target(target: str, args: list[str], *, module: bool, timeout: float | None,
               finder: LocationFinder) -> RunOutcome:
    """Run a script path or module name as ``__main__``; never raises for the script's errors."""
    code = None if module else compile_script(target)
    if module:
        check_module(target)
    outcome = RunOutcome()
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    saved_main = sys.modules.get("__main__")
    saved_cwd = os.getcwd()
    try:
        with _Alarm(timeout):
            try:
                if module:
                    sys.argv = [target, *args]
                    sys.path[0:1] = [os.getcwd()] if sys.path else [os.getcwd()]
                    outcome.namespace = runpy.run_module(target, run_name="__main__", alter_sys=True)
                else:
                    path = os.path.abspath(code.co_filename)
                    sys.argv = [target, *args]
                    main = types.ModuleType("__main__")
                    main.__file__ = path
                    main.__builtins__ = __builtins__
                    main.__spec__ = None
                    main.__loader__ = None
                    sys.modules["__main__"] = main
                    outcome.namespace = main.__dict__
                    if sys.path:
                        sys.path[0] = os.path.dirname(path)
                    else:
                        sys.path.insert(0, os.path.dirname(path))
                    exec(code, main.__dict__)
            except StepLimitReached:
                outcome.status = "step-limit"
            except ReplayTimeout as exc:
                outcome.status = "timeout"
                outcome.error = {"type": "Timeout", "message": str(exc), "location": _loc(finder, exc)}
            except SystemExit as exc:
                outcome.exit_code = _exit_code(exc)
                if outcome.exit_code not in (0, None):
                    outcome.status = "crashed"
                    outcome.error = {"type": "SystemExit", "message": f"exit code {exc.code}",
                                     "location": _loc(finder, exc)}
            except BaseException as exc:  # the user's own failure, KeyboardInterrupt included
                outcome.status = "crashed"
                outcome.error = {"type": type(exc).__name__, "message": str(exc),
                                 "location": _loc(finder, exc)}
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        if os.getcwd() != saved_cwd:
            outcome.notes.append(f"the script changed the working directory to {os.getcwd()}")
            os.chdir(saved_cwd)
    return outcome


def _exit_code(exc: SystemExit):
    code = exc.code
    if code is None or isinstance(code, int):
        return code
    return 1  # sys.exit("message") exits with 1, like python does


def _loc(finder: LocationFinder, exc: BaseException) -> dict | None:
    loc: Location | None = finder.from_traceback(exc.__traceback__)
    return {"path": loc.path, "line": loc.line} if loc else None
