"""The process's one ``os.register_at_fork`` handler.

A child the script forks (``os.fork``, a fork-started ``multiprocessing.Process``) runs on
without graddoctor: the parts of the run in progress that must not live on in the copy (the
instrumentation, the run's patches, the time limit, the recorder's stops) say how to undo
themselves here, and only while the run is in progress. A handler cannot be unregistered,
hence one, registered once, that does nothing between runs.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator

_undo_in_child: list[Callable[[], None]] = []


@contextlib.contextmanager
def undone_in_forked_child(*callbacks: Callable[[], None]) -> Iterator[None]:
    """While the body runs, a child forked from this process calls ``callbacks`` first."""
    _undo_in_child.extend(callbacks)
    try:
        yield
    finally:
        for callback in callbacks:
            _undo_in_child.remove(callback)


def _after_fork_in_child() -> None:
    for callback in list(_undo_in_child):
        try:
            callback()
        except Exception:  # the child goes on uninstrumented as far as it could be undone
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
