"""The processes a script forks (``os.fork``): noted by the parent, run without graddoctor in
the child, which exits as python would, and stopped if still running once the check ends."""

from __future__ import annotations

import os
import signal
import sys
from typing import Callable

from ..location import LocationFinder
from ..status import ScriptExit, StopReplay
from .ending import user_traceback

class Forks:
    """The forks of the running check. A forked child runs the rest of the script without
    graddoctor (``on_child``: the instrumentation and the run's own patches are removed in the
    child, run/atfork.py), then exits as python would (``end_forked_child``), never through
    graddoctor's report. The parent notes each child its script forked and, once the script is
    over, how the child ended; one still running is stopped (``settle_forks``)."""

    def __init__(self, finder: LocationFinder):
        self.finder = finder
        self.children: list[tuple[int, str]] = []  # (pid, "train.py:5") forked by the script's code
        self.in_child = False

    def mark_child(self) -> None:
        self.in_child = True


STOP_CHILD_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this long


def patched_fork(original, forks: Forks):
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


def end_forked_child(exc: BaseException | None, exit_now: Callable[[int], None]) -> None:
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
            sys.stderr.write("Traceback (most recent call last):\n" + user_traceback(exc))
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


def settle_forks(forks: Forks, notes: list[str]) -> None:
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

