"""When the script's objects are let go of. Normally at the end of the check; on a rank, only
once its report is handed over (``defer_teardown``, ``release_deferred``): their destructors (a
DDP model, a process group) can deadlock and must not hold the report back. What is held
(``_deferred``) is kept here and nowhere else."""

from __future__ import annotations

_deferred: list | None = None  # a rank's script objects, held until its report is handed over


def defer_teardown() -> None:
    """From a rank's front door: what the script left (its globals, the exception whose
    frames hold its locals: a DDP model, a process group) is let go of only at
    ``release_deferred()``, once the rank's report is handed over, so that their destructors
    (which can deadlock: a gloo thread waiting for the GIL) cannot hold the report back."""
    global _deferred
    _deferred = []


def release_deferred(now: bool = False) -> None:
    """Let go of what ``defer_teardown`` held, and free what graddoctor kept of the graphs."""
    global _deferred
    held, _deferred = _deferred, None
    if held is None and not now:
        return
    if held:
        held.clear()
    from ..instrument.graphkeep import release_after_check

    release_after_check()


def let_go(held: list) -> None:
    """At the end of a script check: what ``held`` holds (the script's globals, the exception
    that ended it) is dropped now, or kept until ``release_deferred()`` on a rank that deferred
    its teardown. ``held`` is emptied: the caller keeps no reference."""
    if _deferred is not None:
        _deferred.append(tuple(held))
        held.clear()
    else:
        held.clear()
        release_deferred(True)
