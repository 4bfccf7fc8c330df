"""``ProcessState``: a snapshot of what a script can change in this interpreter (``sys.argv``,
``sys.path``, ``__main__``, cwd, streams, signal handlers, environment, warnings filters,
builtins, torch's global modes) and ``restore()``, so that an in-process caller gets its
interpreter back as it was, also after a crash or a time limit."""

from __future__ import annotations

import builtins
import os
import signal
import sys
import threading
import warnings

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

