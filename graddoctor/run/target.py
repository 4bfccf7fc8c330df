"""Run the user's script (or ``-m module``) the way ``python`` would, and say how it ended
(``RunOutcome``, run/ending.py: what ended it, the error; the session decides the status from it).

Like ``coverage run``: ``sys.argv``, ``__main__``, ``sys.path[0]``, cwd unchanged. The replay is
ended by ``StopReplay`` (a BaseException) from the instrumentation, or by the time limit
(``Deadline``, run/deadline.py). Whatever the script changes in the process is put back
afterwards (``ProcessState``, run/process_state.py); the processes it forks are followed by
run/forks.py.
"""

from __future__ import annotations

import builtins
import os
import runpy
import sys
import threading
import types
from typing import Callable

from .. import scriptfile
from ..errors import ScriptError
from ..instrument.patcher import Patcher
from ..location import LocationFinder
from ..notebook import ShellStandIn, compile_notebook, is_notebook, notebook_display
from ..status import ScriptExit, StopReplay, exit_code
from .atfork import undone_in_forked_child
from .deadline import Deadline
from .ending import RunOutcome, describe_into
from .forks import Forks, end_forked_child, patched_fork, settle_forks
from .process_state import ProcessState

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



# -- the script's patches ----------------------------------------------------------------------
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
    instrumentation there: see ``Forks``)."""
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
    forks = Forks(finder)

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
        patches.patch(os, "fork", patched_fork(os.fork, forks))
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
                    end_forked_child(exc, original_exit)
                describe_into(exc, outcome, finder, deadline)
                hint = _arguments_hint(exc, target, args, module)
                if hint:
                    outcome.notes.append(hint)
            else:
                if forks.in_child:
                    end_forked_child(None, original_exit)
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
