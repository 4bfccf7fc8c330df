"""The script's stdout while a machine-readable report goes to stdout (``--format json``):
sent to stderr while the script runs (``stdout_to_stderr``), at the file descriptor too, and the
real stdout for a report written while the script still runs (``real_stdout``). The real
stdout's saved descriptor (``_redirected``) is kept here and nowhere else."""

from __future__ import annotations

import contextlib
import os
import sys

@contextlib.contextmanager
def stdout_to_stderr(enabled: bool):
    """While the script runs, everything it writes to stdout goes to stderr — at the file
    descriptor too, so that C code, subprocesses and spawned workers cannot corrupt a machine
    report on stdout."""
    if not enabled:
        yield
        return
    saved_fd = None
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        saved_fd = os.dup(1)
        os.dup2(2, 1)
    except (OSError, ValueError, AttributeError):  # no real file descriptors (embedded, tests)
        if saved_fd is not None:
            os.close(saved_fd)
        saved_fd = None
    _redirected.append(saved_fd)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _redirected.pop()
        if saved_fd is not None:
            with contextlib.suppress(Exception):
                sys.__stdout__.flush()  # what the script wrote to sys.__stdout__ goes to stderr
            os.dup2(saved_fd, 1)
            os.close(saved_fd)


_redirected: list[int | None] = []  # while the script's stdout goes to stderr: the real one's fd


@contextlib.contextmanager
def real_stdout():
    """The real stdout for the block, while the script's goes to stderr: for a report written
    while the script still runs (a rank's, at ``destroy_process_group()``)."""
    if not _redirected:
        yield
        return
    saved_fd = _redirected[-1]
    script_fd = None
    try:
        sys.stdout.flush()
        sys.__stdout__.flush()
        if saved_fd is not None:
            script_fd = os.dup(1)
            os.dup2(saved_fd, 1)
    except (OSError, ValueError, AttributeError):
        pass
    try:
        with contextlib.redirect_stdout(sys.__stdout__):
            yield
    finally:
        with contextlib.suppress(Exception):
            sys.__stdout__.flush()
        if script_fd is not None:
            os.dup2(script_fd, 1)
            os.close(script_fd)
