"""What adding an event kind takes, enforced (the steps a new engineer could forget): its
constructor in ``graddoctor.events.CONSTRUCTORS`` and a row in that module's table, a watcher
that makes it, a place in the loop's timeline (a labelled call, or skipped as set-up and
bookkeeping), which is also how the recorder's folder cuts turns; and every kind the rules and
the analysis read is one that exists. Each test names the kinds that miss a step."""

from __future__ import annotations

import glob
import os
import re

from conftest import ROOT
from graddoctor import events

KINDS = sorted(events.CONSTRUCTORS)


def _sources(*folders: str) -> dict[str, str]:
    found = {}
    for folder in folders:
        for path in glob.glob(os.path.join(ROOT, "graddoctor", folder, "**", "*.py"), recursive=True):
            with open(path, encoding="utf-8") as f:
                found[os.path.relpath(path, ROOT)] = f.read()
    return found


def test_every_kind_has_a_row_in_the_events_table():
    table = events.__doc__ or ""
    missing = [k for k in KINDS if not re.search(rf"^{re.escape(k)}\b|/ {re.escape(k)}\b", table, re.M)]
    assert not missing, f"graddoctor/events.py's table has no row for: {', '.join(missing)}"


def test_every_kind_is_placed_in_the_timeline_and_so_in_folding():
    unplaced = [k for k in KINDS
                if k not in events.CALL_LABELS and k not in events.NOT_CALLS and not events.is_per_forward(k)]
    assert not unplaced, ("neither a timeline label (events.CALL_LABELS) nor skipped (events.NOT_CALLS), so the timeline and "
                          f"the folder's turns would guess: {', '.join(unplaced)}")


def test_every_kind_is_made_by_graddoctor():
    code = "\n".join(text for path, text in _sources("").items() if not path.endswith("events.py"))
    # every `ev.NAME(` / `events.NAME(` call in one pass (a search per kind took seconds)
    called = set(re.findall(r"\b(?:ev|events)\.(\w+)\(", code))
    unmade = [k for k in KINDS if events.CONSTRUCTORS[k].__name__ not in called]
    assert not unmade, f"no watcher (nor the run) makes: {', '.join(unmade)}"


def test_the_kinds_rules_and_analysis_read_exist():
    read = set()
    for path, text in _sources("rules", "analysis", "report").items():
        read.update((path, k) for k in re.findall(r"""(?:of_kind\(|kind ==\s*|kind in \()["'](\w+)["']""", text))
    unknown = sorted(f"{k} ({path})" for path, k in read if k not in events.CONSTRUCTORS)
    assert not unknown, f"read but never made: {', '.join(unknown)}"
