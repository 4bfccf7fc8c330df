"""``Deadline``: the wall-clock limit of one run (``--timeout``), its SIGALRM and the watchdog
thread that ends a script stuck past it."""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import threading
from typing import Callable

from ..location import LocationFinder
from ..status import ReplayTimeout

def _async_raise(thread_id: int, exc_type: type[BaseException] | None) -> bool:
    """Raise ``exc_type`` in another thread at its next Python instruction (CPython only);
    ``None`` cancels one that was not delivered yet."""
    try:
        set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    except AttributeError:  # pragma: no cover - not CPython
        return False
    exc = None if exc_type is None else ctypes.py_object(exc_type)
    return set_async_exc(ctypes.c_ulong(thread_id), exc) == 1


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

