"""Which fixtures tests/test_fixtures.py also runs a second time, under ``graddoctor.watch()``
(the in-process API), to check that it finds exactly what ``run_check`` found.

The two doors share the instrumentation, the trace, the analysis and the rules; what differs
is how the code runs (a script replayed as ``__main__`` by run/target.py, or a block of the
caller's own code) and what a block is not given (the device policy, the automatic
``--emulate-cuda`` rerun, the script's arguments, spawned workers' start-up hook, the script
thread the replay stops in). So the parity check needs every rule's in-process path, not every
fixture: the subset holds, for every rule, a bad fixture that expects it and a good fixture
that declares it ``# silent:``, and every fixture whose run goes through what differs (its
folder, what it imports, its options, or a ``# watch: always`` mark). Computed from the
fixtures' own marks on every run: a fixture added later is chosen by the same rule, and
``uncovered`` (tests/test_fixtures.py asserts it is empty) says what a subset misses.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

from fixture_marks import read_marks, read_silent

# the fixture folders whose every fixture runs through what differs between the two doors
AREAS = {
    "threads": "trains in threads: the replay's script thread is not the block's",
    "frameworks": "a training framework keeps process-wide state between in-process runs",
    "cuda": "a GPU script: run_check reruns it on an emulated GPU and applies the device "
            "policy, watch() does neither",
    "distributed": "a process group in the checking process",
}
THREADS = re.compile(r"^\s*(?:import|from)\s+(?:threading|_thread|concurrent|multiprocessing)\b",
                     re.M)
FRAMEWORKS = ("lightning", "pytorch_lightning", "accelerate", "transformers")
FRAMEWORK = re.compile(rf"^\s*(?:import|from)\s+(?:{'|'.join(FRAMEWORKS)})\b", re.M)
ALWAYS = re.compile(r"^\s*#\s*watch:\s*always\b", re.M)
# options a watch() block is run without, or with another meaning
OPTIONS_THAT_DIFFER = ("--emulate-cuda", "--device", "-m", "--module", "--")


@dataclass(frozen=True)
class FixtureMarks:
    path: str
    expects: frozenset[str]  # a bad fixture's slugs each meant at some line (no either-or)
    may_expect: frozenset[str]  # ... and the slugs of its either-or marks
    silences: frozenset[str]  # a good fixture's ``# silent:`` slugs
    always: str | None  # why it is run under watch() whatever else is chosen


def why_always(path: str, text: str, args: list[str]) -> str | None:
    """Why a fixture's run goes through what differs between the two doors, or None."""
    area = os.path.basename(os.path.dirname(path))
    if area in AREAS:
        return f"fixtures/{area}/: {AREAS[area]}"
    if ALWAYS.search(text):
        return "marked # watch: always"
    if THREADS.search(text):
        return "imports a threading or process module"
    if FRAMEWORK.search(text):
        return "imports a training framework"
    differ = [a for a in args if a in OPTIONS_THAT_DIFFER or a.startswith("--device=")]
    if differ:
        return f"runs with {' '.join(differ)}"
    return None


@functools.lru_cache(maxsize=None)
def fixture_marks(path: str) -> FixtureMarks:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    expectations, args = read_marks(path)
    good = os.path.basename(path).startswith("good_")
    expects, may_expect = set(), set()
    if not good:
        for exp in expectations:
            slugs = {slug for slug, _ in exp.alternatives}
            (expects if len(slugs) == 1 else may_expect).update(slugs)
    return FixtureMarks(path, frozenset(expects), frozenset(may_expect - expects),
                        frozenset(read_silent(path)) if good else frozenset(),
                        why_always(path, text, args))


def _needs(marks: FixtureMarks) -> set[tuple[str, str]]:
    return ({("expects", s) for s in marks.expects} | {("may expect", s) for s in marks.may_expect}
            | {("silences", s) for s in marks.silences})


def requirements(paths) -> set[tuple[str, str]]:
    """What the subset must hold: for every rule a bad fixture expects, one that expects it
    (one whose either-or mark names it, where no fixture expects it outright), and for every
    rule a good fixture declares silent, one that does."""
    needs = set().union(*(_needs(fixture_marks(p)) for p in paths))
    return {need for need in needs
            if not (need[0] == "may expect" and ("expects", need[1]) in needs)}


def watch_subset(paths) -> dict[str, str]:
    """The fixtures to run under watch() too, each with why: every one ``why_always`` names,
    then, greedily, the fixture meeting the most requirements still open (ties: the first by
    path), until none is open. Deterministic: the same fixtures give the same subset."""
    paths = sorted(paths)
    chosen = {p: fixture_marks(p).always for p in paths if fixture_marks(p).always}
    open_ = requirements(paths) - set().union(*(_needs(fixture_marks(p)) for p in chosen))
    candidates = {p: _needs(fixture_marks(p)) & open_ for p in paths if p not in chosen}
    while open_:
        best = max(candidates, key=lambda p: len(candidates[p] & open_))  # the first of the best
        met = candidates.pop(best) & open_
        chosen[best] = "covers " + ", ".join(f"{kind} {slug}" for kind, slug in sorted(met))
        open_ -= met
    return chosen


def uncovered(paths, chosen) -> list[str]:
    """What the subset ``chosen`` misses among the fixtures ``paths``: a requirement no chosen
    fixture meets, a fixture ``why_always`` names left out; [] when it is complete."""
    met = set().union(*(_needs(fixture_marks(p)) for p in chosen))
    missing = [f"no fixture run under watch() {kind} {slug}"
               for kind, slug in sorted(requirements(paths) - met)]
    missing += [f"{p} is not run under watch(): {fixture_marks(p).always}"
                for p in sorted(paths) if fixture_marks(p).always and p not in chosen]
    return missing
