"""Run the user's script (or ``-m module``) the way ``python`` would, and say how it ended
(``RunOutcome``: what ended it, the error; the session decides the status from it).

Like ``coverage run``: ``sys.argv``, ``__main__``, ``sys.path[0]``, cwd unchanged. The replay is
ended by ``StopReplay`` (a BaseException) from the instrumentation, or by the time limit
(``Deadline``). Whatever the script changes in the process (``sys.argv``, ``sys.path``,
``__main__``, cwd, streams, signal handlers, environment, torch's global modes) is put back
afterwards (``ProcessState``), so that an in-process caller gets its interpreter back as it was.
"""

from __future__ import annotations

import builtins
import ctypes
import faulthandler
import os
import runpy
import signal
import sys
import threading
import traceback
import types
import warnings
from dataclasses import dataclass, field
from typing import Callable

from .. import scriptfile
from ..errors import ScriptError
from ..instrument.patcher import Patcher
from ..location import LocationFinder
from ..notebook import (ShellStandIn, compile_notebook, is_notebook, location_json,
                        notebook_display)
from ..status import ReplayTimeout, ScriptExit, StopReplay, exit_code
from ..textsafe import strip_escapes
from ..trace import Location
from .atfork import undone_in_forked_child

_RUNPY_FILE = os.path.abspath(runpy.__file__)
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_MESSAGE = 2000  # characters of the script's exception message kept in the report


@dataclass
class RunOutcome:
    ended_by: BaseException | None = None  # what ended the target early (None: it returned)
    error: dict | None = None  # {type, message, location{path,line}, traceback}
    exit_code: int | None = None  # the script's own SystemExit code, if it raised one
    notes: list[str] = field(default_factory=list)
    namespace: dict | None = None  # the script's globals, kept alive until the check ends


def compile_script(path: str):
    """Read and compile a script, turning every reason it cannot run into ScriptError
    (scriptfile.py); its text is kept as it ran."""
    full, source, code = scriptfile.compile_script(path)
    _remember_source(full, source)
    return code


def _remember_source(path: str, source: bytes) -> None:
    """The text the script ran, for the report's excerpts and suppression comments (read
    through ``linecache``): a script that rewrites its own file is shown as it ran. No mtime:
    ``linecache.checkcache`` keeps such an entry."""
    import importlib.util
    import linecache

    try:
        lines = importlib.util.decode_source(source).splitlines(keepends=True)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return
    linecache.cache[path] = (len(source), None, lines, path)


def check_module(name: str) -> None:
    """Whether ``python -m name`` would find the module: looked up with the working directory
    first on ``sys.path``, as ``python -m`` puts it (the installed ``graddoctor`` command starts
    with its own bin folder there instead)."""
    import importlib.util

    saved = list(sys.path)
    if not getattr(sys.flags, "safe_path", False):
        sys.path[0:1] = [os.getcwd()]
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        raise ScriptError(f"cannot find module {name!r}: {exc}") from None
    finally:
        sys.path[:] = saved
    if spec is None:
        raise ScriptError(f"no module named {name!r}")


# -- the process state a script may change ------------------------------------------------
_MISSING = object()


def _signal_handlers() -> dict:
    if threading.current_thread() is not threading.main_thread():
        return {}
    handlers = {}
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        if handler is not None:  # None: installed outside Python, cannot be put back
            handlers[sig] = handler
    return handlers


class ProcessState:
    """A snapshot of what a script can change in this interpreter, and ``restore()``.

    ``python train.py`` gets a fresh process; an in-process check must leave the caller's as it
    was, also after a crash or a time limit.
    """

    def __init__(self) -> None:
        import torch

        self.argv = list(sys.argv)
        self.argv_list = sys.argv
        self.path = list(sys.path)
        self.main = sys.modules.get("__main__", _MISSING)
        self.cwd = os.getcwd()
        self.streams = (sys.stdin, sys.stdout, sys.stderr)
        self.tracer, self.profiler = sys.gettrace(), sys.getprofile()
        self.excepthook = sys.excepthook
        self.environ = dict(os.environ)
        self.signals = _signal_handlers()
        self.warnings = (list(warnings.filters), warnings.showwarning, warnings.formatwarning)
        self.recursion_limit = sys.getrecursionlimit()
        self.builtins = dict(vars(builtins))  # builtins.print = ... and the like
        self.torch = (torch.is_grad_enabled(), torch.get_default_dtype(), torch.is_anomaly_enabled(),
                      torch.are_deterministic_algorithms_enabled(),
                      torch.is_deterministic_algorithms_warn_only_enabled(), torch.get_num_threads())

    def restore(self) -> list[str]:
        """Put everything back; returns notes for the report on what the script had changed."""
        import torch

        notes = []
        self.argv_list[:] = self.argv
        sys.argv = self.argv_list
        sys.path[:] = self.path
        if self.main is _MISSING:
            sys.modules.pop("__main__", None)
        else:
            sys.modules["__main__"] = self.main
        try:
            cwd = os.getcwd()
        except OSError:  # the script removed its working directory
            cwd = None
        if cwd != self.cwd:
            notes.append(f"the script changed the working directory to {cwd}; graddoctor "
                         f"changed it back")
            os.chdir(self.cwd)
        sys.stdin, sys.stdout, sys.stderr = self.streams
        if sys.gettrace() is not self.tracer:
            sys.settrace(self.tracer)
        if sys.getprofile() is not self.profiler:
            sys.setprofile(self.profiler)
        sys.excepthook = self.excepthook
        if dict(os.environ) != self.environ:
            for key in set(os.environ) - set(self.environ):
                del os.environ[key]
            for key, value in self.environ.items():
                if os.environ.get(key) != value:
                    os.environ[key] = value
        for sig, handler in self.signals.items():
            try:
                if signal.getsignal(sig) is not handler:
                    signal.signal(sig, handler)
            except (OSError, ValueError, TypeError):
                pass
        filters, showwarning, formatwarning = self.warnings
        if warnings.filters != filters:
            warnings.filters[:] = filters
            warnings._filters_mutated()  # the C module's cache of the filters
        warnings.showwarning, warnings.formatwarning = showwarning, formatwarning
        if sys.getrecursionlimit() != self.recursion_limit:
            sys.setrecursionlimit(self.recursion_limit)
        now = vars(builtins)
        for name in [n for n in now if n not in self.builtins]:
            del now[name]
        for name, value in self.builtins.items():
            if now.get(name, _MISSING) is not value:
                now[name] = value
        grad, dtype, anomaly, deterministic, warn_only, threads = self.torch
        torch.set_grad_enabled(grad)
        torch.set_default_dtype(dtype)
        torch.set_anomaly_enabled(anomaly)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return notes


# -- the time limit ---------------------------------------------------------------------------
def _start_hidden_thread(target: Callable[[], None]) -> int | None:
    """Start ``target`` in a thread the script cannot see: a bare ``_thread`` thread is not in
    threading's registry, so ``threading.enumerate()`` and ``active_count()`` are what python
    gives (a script that joins every thread but the main one does not wait on graddoctor's),
    and the interpreter does not wait for it at exit (as for a daemon). Its code never asks
    ``threading.current_thread()`` while the script runs (that would register it)."""
    import _thread

    try:
        return _thread.start_new_thread(target, ())
    except RuntimeError:  # no thread can be started (a resource limit): the alarm still works
        return None


def _async_raise(thread_id: int, exc_type: type[BaseException] | None) -> bool:
    """Raise ``exc_type`` in another thread at its next Python instruction (CPython only);
    ``None`` cancels one that was not delivered yet."""
    try:
        set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    except AttributeError:  # pragma: no cover - not CPython
        return False
    exc = None if exc_type is None else ctypes.py_object(exc_type)
    return set_async_exc(ctypes.c_ulong(thread_id), exc) == 1


class Deadline:
    """The wall-clock limit of one run, in three tiers:

    1. at ``seconds``: SIGALRM raises ``ReplayTimeout`` in the script (main thread), again every
       second while the script swallows it with a bare ``except:``;
    2. at ``seconds + grace``, from a watchdog thread: the same exception raised asynchronously
       (covers a script that replaced our SIGALRM handler, or a run outside the main thread);
    3. at ``seconds + 2 * grace``, still running: the script is stuck inside a call that never
       returns to Python (a C loop, a dead lock). ``on_hang(location)`` is called from the
       watchdog; the CLI writes the report from there and ends the process.
    4. ``last_resort``: at ``seconds + 3 * grace`` even the watchdog could not run (a C call
       that holds the interpreter lock): ``faulthandler`` prints every thread's stack to stderr
       and ends the process with exit code 1. Only a CLI wants that.
    """

    def __init__(self, seconds: float | None, finder: LocationFinder,
                 on_hang: Callable[[dict | None], None] | None = None, last_resort: bool = False):
        self.last_resort = last_resort
        self._faulthandler = False
        self.seconds = seconds if seconds and seconds > 0 else None
        self.grace = min(max(2.0, 0.1 * (self.seconds or 0)), 30.0)
        self.finder = finder
        self.on_hang = on_hang
        self.expired = False  # the limit was reached (for the report)
        self._armed = False
        self._signal = False
        self._old_handler = None
        self._done = threading.Event()
        self._lock = threading.Lock()  # the watchdog raises only while the run is armed
        self._raised_async = False
        self._thread_id = threading.get_ident()
        self._watchdog: int | None = None  # the watchdog's thread id
        self._watch_ended = threading.Event()
        self._pid = os.getpid()

    def message(self) -> str:
        return f"time limit of {self.seconds:g} s reached"

    def _on_alarm(self, signum, frame):
        if self._armed:
            self.expired = True
            raise ReplayTimeout(self.message())

    def __enter__(self) -> "Deadline":
        if self.seconds is None:
            return self
        self._armed = True
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
            try:
                self._old_handler = signal.signal(signal.SIGALRM, self._on_alarm)
                signal.setitimer(signal.ITIMER_REAL, self.seconds, 1.0)
                self._signal = True
            except (OverflowError, ValueError, OSError):  # an absurdly long limit: no alarm
                if self._old_handler is not None:
                    signal.signal(signal.SIGALRM, self._old_handler)
                self._signal = False
        if self.last_resort:
            try:
                faulthandler.dump_traceback_later(self.seconds + 3 * self.grace, exit=True)
                self._faulthandler = True
            except (ValueError, OverflowError, OSError, RuntimeError):  # no usable stderr
                pass
        self._watchdog = _start_hidden_thread(self._watch)
        return self

    def forked(self) -> None:
        """In a forked child: the watchdog and faulthandler's timer thread do not exist there
        (cancelling that timer would wait for it forever) and interval timers are not inherited;
        the child gets the SIGALRM handler it had before."""
        self._armed = False
        self._faulthandler = False
        if self._signal:
            self._signal = False
            try:
                signal.signal(signal.SIGALRM, self._old_handler)
            except (OSError, ValueError, TypeError):
                pass

    def disarm(self) -> None:
        """Stop every tier; safe to call more than once."""
        if os.getpid() != self._pid:  # a forked child: see forked()
            self.forked()
            return
        with self._lock:
            self._armed = False
            self._done.set()
            if self._raised_async:  # not delivered yet: cancel it
                self._raised_async = False
                _async_raise(self._thread_id, None)
        if self._faulthandler:
            self._faulthandler = False
            faulthandler.cancel_dump_traceback_later()
        if self._signal:
            self._signal = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old_handler)

    def __exit__(self, *exc) -> None:
        self.disarm()
        if os.getpid() != self._pid:
            return
        if self._watchdog is not None and self._watchdog != threading.get_ident():
            self._watch_ended.wait(timeout=1.0)

    def _watch(self) -> None:
        try:
            if self._done.wait(min(self.seconds + self.grace, threading.TIMEOUT_MAX)):
                return
            with self._lock:
                if not self._armed:
                    return
                self.expired = True
                self._raised_async = _async_raise(self._thread_id, ReplayTimeout)
            if self._done.wait(self.grace):
                return
            if self.on_hang is not None:
                self.on_hang(self.where())
        except Exception:  # the watchdog must never take the process down by itself
            pass
        finally:
            self._watch_ended.set()

    def where(self) -> dict | None:
        """The user's line the running script is at now (from another thread)."""
        for frame in self.finder.user_frames(sys._current_frames().get(self._thread_id)):
            return {"path": self.finder.display_path(frame.f_code.co_filename), "line": frame.f_lineno}
        return None


# -- os._exit ---------------------------------------------------------------------------------
def _quiet_stop_in_threads(original):
    """``threading.excepthook`` while the script runs: a thread that graddoctor's stop ended
    (``StopReplay``, raised at its next backward or step) ends quietly; every other exception
    is the script's and printed as usual."""
    def excepthook(args):
        if isinstance(args.exc_value, StopReplay):
            return
        original(args)

    return excepthook


def _patched_os_exit(original, parent_pid: int):
    def _exit(code):
        if os.getpid() != parent_pid or threading.current_thread() is not threading.main_thread():
            original(code)
        raise ScriptExit(code)

    return _exit


# -- os.fork ----------------------------------------------------------------------------------
class _Forks:
    """The forks of the running check. A forked child runs the rest of the script without
    graddoctor (``on_child``: the instrumentation and the run's own patches are removed in the
    child, run/atfork.py), then exits as python would (``_end_forked_child``), never through
    graddoctor's report. The parent notes each child its script forked and, once the script is
    over, how the child ended; one still running is stopped (``settle_forks``)."""

    def __init__(self, finder: LocationFinder):
        self.finder = finder
        self.children: list[tuple[int, str]] = []  # (pid, "train.py:5") forked by the script's code
        self.in_child = False

    def mark_child(self) -> None:
        self.in_child = True


STOP_CHILD_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this long


def _patched_fork(original, forks: _Forks):
    def fork():
        pid = original()
        if pid > 0:
            try:
                caller = sys._getframe(1)
                filename = caller.f_code.co_filename
                if forks.finder.is_user_file(filename):  # not multiprocessing's or a DataLoader's
                    forks.children.append((pid, f"{forks.finder.display_path(filename)}:{caller.f_lineno}"))
            except Exception:
                pass
        return pid

    return fork


def _end_forked_child(exc: BaseException | None, exit_now: Callable[[int], None]) -> None:
    """The script ended in a forked child: exit the way python would (the exit code of
    ``sys.exit``, the traceback and 1 for an exception, atexit handlers, flushed streams)."""
    code = 0
    try:
        if isinstance(exc, SystemExit):
            if isinstance(exc.code, int) or exc.code is None:
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        elif isinstance(exc, ScriptExit):
            code = exc.code
        elif exc is not None and not isinstance(exc, StopReplay):
            sys.stderr.write("Traceback (most recent call last):\n" + _user_traceback(exc))
            code = 130 if isinstance(exc, KeyboardInterrupt) else 1
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass
    exit_now(code)


def _exit_text(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def settle_forks(forks: _Forks, notes: list[str]) -> None:
    """Once the script is over (in the parent): how each child it forked ended; a child still
    running is stopped (SIGTERM, then SIGKILL), so that no process outlives the check."""
    for pid, where in forks.children:
        what = (f"the script forked a child process at {where} (pid {pid}); it ran without "
                f"graddoctor, so its training is not checked")
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # the script waited for it itself
            notes.append(f"{what}; the script waited for it")
            continue
        except OSError:
            continue
        if done == 0:
            status = _stop_child(pid)
            notes.append(f"{what}; it was still running when the check ended, so graddoctor "
                         f"stopped it ({_exit_text(status) if status is not None else 'SIGKILL'})")
        else:
            notes.append(f"{what}; it ended with {_exit_text(status)}")
    forks.children.clear()


def _stop_child(pid: int) -> int | None:
    import time

    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_CHILD_GRACE_S
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)
        return os.waitpid(pid, 0)[1]
    except OSError:
        return None


# -- running ----------------------------------------------------------------------------------
def run_target(target: str, args: list[str], *, module: bool, timeout: float | None,
               finder: LocationFinder,
               on_hang: Callable[[dict | None], None] | None = None,
               on_start: Callable[[], None] | None = None,
               last_resort: bool = False,
               on_fork_child: Callable[[], None] | None = None) -> RunOutcome:
    """Run a script path or module name as ``__main__``; never raises for the script's errors.

    ``on_start`` runs once the target is known to be runnable; ``on_hang`` and ``last_resort``:
    see ``Deadline``; ``on_fork_child`` runs in a child the script forks (remove the
    instrumentation there: see ``_Forks``)."""
    notes: list[str] = []
    if module:
        code = None
        check_module(target)
    elif is_notebook(target) and os.path.isfile(target):  # its code cells, as one script
        code, notes = compile_notebook(target)
    else:
        code = compile_script(target)
    if on_start is not None:
        on_start()
    outcome = RunOutcome(notes=list(notes))
    state = ProcessState()
    forks = _Forks(finder)

    def hang(where) -> None:  # the process is about to end: its children with it
        settle_forks(forks, [])
        if on_hang is not None:
            on_hang(where)

    deadline = Deadline(timeout, finder, hang, last_resort=last_resort)
    original_exit = os._exit
    patches = Patcher()
    patches.patch(os, "_exit", _patched_os_exit(original_exit, os.getpid()))
    patches.patch(threading, "excepthook", _quiet_stop_in_threads(threading.excepthook))
    if hasattr(os, "fork"):
        patches.patch(os, "fork", _patched_fork(os.fork, forks))
    in_child = [forks.mark_child, deadline.forked, patches.undo] + \
        ([on_fork_child] if on_fork_child else [])
    try:
        with undone_in_forked_child(*in_child):
            try:
                with deadline:
                    try:
                        _execute(target, args, code, module, outcome)
                    finally:
                        deadline.disarm()
            except BaseException as exc:  # the script's own failure, or our stop
                if forks.in_child:
                    _end_forked_child(exc, original_exit)
                _describe_ending(exc, outcome, finder, deadline)
                hint = _arguments_hint(exc, target, args, module)
                if hint:
                    outcome.notes.append(hint)
            else:
                if forks.in_child:
                    _end_forked_child(None, original_exit)
    finally:
        patches.undo()
        try:
            outcome.notes.extend(state.restore())
        except Exception as exc:  # never lose the report over a restore
            outcome.notes.append(f"graddoctor could not restore the interpreter state: {exc!r}")
        try:
            settle_forks(forks, outcome.notes)
        except Exception as exc:
            outcome.notes.append(f"graddoctor could not check the forked processes: {exc!r}")
    return outcome


def _execute(target: str, args: list[str], code, module: bool, outcome: RunOutcome) -> None:
    sys.argv = [target, *args]
    # python -P / PYTHONSAFEPATH=1 (3.11+): nothing is put in front of sys.path
    safe_path = getattr(sys.flags, "safe_path", False)
    if module:
        if not safe_path:
            sys.path[0:1] = [os.getcwd()]  # python -m: the working directory comes first
        outcome.namespace = runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    path = os.path.abspath(code.co_filename)
    outcome.namespace = _main_module(path).__dict__
    if not safe_path:
        sys.path[0:1] = [os.path.dirname(path)]
    exec(code, outcome.namespace)


def _main_module(path: str) -> types.ModuleType:
    """``__main__`` with the globals ``python script.py`` gives it (coverage.py's runner is
    the model): ``__builtins__`` the module, a source loader, ``__cached__`` None."""
    from importlib.machinery import SourceFileLoader

    main = types.ModuleType("__main__")
    notebook = is_notebook(path)
    main.__loader__ = None if notebook else SourceFileLoader("__main__", path)
    main.__spec__ = None
    if sys.version_info < (3, 14):  # python sets an empty one before running the file
        main.__annotations__ = {}
    main.__builtins__ = builtins
    main.__file__ = path
    main.__cached__ = None
    if notebook:  # what a Jupyter kernel gives every notebook
        main.display = notebook_display
        shell = ShellStandIn(main.__dict__)
        main.get_ipython = lambda: shell
    sys.modules["__main__"] = main
    return main


def describe_ending(exc: BaseException, finder: LocationFinder,
                    deadline: Deadline | None = None) -> RunOutcome:
    """What the report says about the exception that ended a run (a script, a watched block)."""
    outcome = RunOutcome()
    _describe_ending(exc, outcome, finder, deadline)
    return outcome


def _describe_ending(exc: BaseException, outcome: RunOutcome, finder: LocationFinder,
                     deadline: Deadline | None) -> None:
    outcome.ended_by = exc
    if isinstance(exc, StopReplay) and not isinstance(exc, ReplayTimeout):
        return  # a stop condition ended the replay (instrument/stop.py)
    if isinstance(exc, ReplayTimeout):
        outcome.error = {"type": "Timeout", "message": deadline.message() if deadline and
                         deadline.seconds else _message(exc), "location": _loc(finder, exc)}
    elif isinstance(exc, (SystemExit, ScriptExit)):
        how = "os._exit" if isinstance(exc, ScriptExit) else "sys.exit"
        outcome.exit_code = exit_code(exc)
        loc = _loc(finder, exc)
        where = f" at {loc['path']}:{loc['line']}" if loc else ""
        if outcome.exit_code in (0, None):
            outcome.notes.append(f"the script called {how}({outcome.exit_code or 0}){where}")
        else:
            outcome.error = {"type": "SystemExit", "message": f"{how}({exc.code!r}): exit code "
                             f"{outcome.exit_code}", "location": loc}
    else:  # the user's own failure, KeyboardInterrupt included
        outcome.error = {"type": type(exc).__name__, "message": _message(exc),
                         "location": _loc(finder, exc), "traceback": _user_traceback(exc)}


def _arguments_hint(exc: BaseException, target: str, args: list[str], module: bool) -> str | None:
    """A script that exited through argparse's usage error (a required argument missing, an
    unknown one): the note that its arguments go after ``--``, with the command line to type
    (the arguments it was given, then those its usage marks required)."""
    if not isinstance(exc, SystemExit) or exit_code(exc) != 2:
        return None
    try:
        import argparse
        import re
        import shlex

        parser = None
        tb = exc.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if frame.f_code.co_name == "error" and isinstance(frame.f_locals.get("self"), argparse.ArgumentParser):
                parser = frame.f_locals["self"]
            tb = tb.tb_next
        if parser is None:
            return None
        usage = " ".join(parser.format_usage().split())
        usage = usage.split(" ", 2)[2] if usage.count(" ") >= 2 else ""  # past "usage: prog"
        while re.search(r"\[[^\[\]]*\]", usage):  # the optional parts, nested ones included
            usage = re.sub(r"\s*\[[^\[\]]*\]", "", usage)
        required = [word for word in usage.split() if word not in args]
        command = ["graddoctor", "check", *(["-m"] if module else []), target, "--", *args, *required]
        return (f"the script stopped at argparse's usage error (exit code 2): its arguments go after "
                f"`--`, e.g. {shlex.join(command)}")
    except Exception:
        return None


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # an exception whose __str__ fails
        text = f"<{type(exc).__name__} whose message cannot be shown>"
    text = strip_escapes(text)  # ANSI bold in torch's UnpicklingError, colours, ...
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + " …"


def _user_traceback(exc: BaseException) -> str:
    """The script's traceback as python would print it, without graddoctor's and runpy's frames."""
    try:
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if not f.filename.startswith(_PKG_DIR + os.sep) and f.filename not in (_RUNPY_FILE, "<frozen runpy>")]
        lines = traceback.format_list(frames[-20:])
        lines += traceback.format_exception_only(type(exc), exc)
        return strip_escapes("".join(lines))[-8000:]
    except Exception:
        return ""


def _loc(finder: LocationFinder, exc: BaseException) -> dict | None:
    loc: Location | None = finder.from_traceback(exc.__traceback__)
    return location_json(loc.path, loc.line) if loc else None
