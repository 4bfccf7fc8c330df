"""How a run ended, in the report's words: ``RunOutcome`` (what ended it, its error, notes,
the script's globals), built from the exception that ended a script or a watched block
(``describe_ending``), and the script's own traceback without graddoctor's frames
(``user_traceback``, which a forked child prints as python would)."""

from __future__ import annotations

import os
import runpy
import traceback
from dataclasses import dataclass, field

from ..location import LocationFinder
from ..notebook import location_json
from ..status import ReplayTimeout, ScriptExit, StopReplay, exit_code
from ..textsafe import strip_escapes
from ..trace import Location
from .deadline import Deadline

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



def describe_ending(exc: BaseException, finder: LocationFinder,
                    deadline: Deadline | None = None) -> RunOutcome:
    """What the report says about the exception that ended a run (a script, a watched block)."""
    outcome = RunOutcome()
    describe_into(exc, outcome, finder, deadline)
    return outcome


def describe_into(exc: BaseException, outcome: RunOutcome, finder: LocationFinder,
                  deadline: Deadline | None) -> None:
    """Fill ``outcome`` from ``exc``: what ended the run, its error, its notes."""
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
                         "location": _loc(finder, exc), "traceback": user_traceback(exc)}


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # an exception whose __str__ fails
        text = f"<{type(exc).__name__} whose message cannot be shown>"
    text = strip_escapes(text)  # ANSI bold in torch's UnpicklingError, colours, ...
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + " …"


def user_traceback(exc: BaseException) -> str:
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

