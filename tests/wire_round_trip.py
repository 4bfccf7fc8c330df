"""The report's wire format (graddoctor/report/json_format.py) checked on any report: written,
read back and written again it is the same JSON, and every field the wire carries comes back
equal (a framework's ``via``/``hook``, ranks, processes...). Used on every fixture's report
(tests/test_fixtures.py, tests/test_distributed.py) and by tests/test_wire_format.py."""

from __future__ import annotations

import dataclasses
import json

from graddoctor.findings import Finding, Related
from graddoctor.jsonsafe import json_safe
from graddoctor.report.json_format import from_dict, render
from graddoctor.report.model import Report, RunInfo
from graddoctor.trace import Location

# what the wire leaves out on purpose (the module's docstring says why); a field added to one of
# these classes must be written and read, or be named here
NOT_ON_THE_WIRE = {
    Location: {"function"},
    Related: set(),
    Finding: {"fixes"},
    RunInfo: set(),
    Report: {"analysis", "fail_on", "allow_incomplete", "base_dir"},
}
RELATED_LOCATION_NOT_ON_THE_WIRE = {"function", "via", "hook"}


def read_back(report: Report) -> Report:
    """The report as another process reads it: its JSON text, parsed and rebuilt."""
    return from_dict(json.loads(render(report)))


def assert_round_trip(report: Report) -> Report:
    text = render(report)
    back = from_dict(json.loads(text))
    assert render(back) == text, "written, read back and written again, the JSON differs"
    problems = differences(report, back)
    assert not problems, "lost on the wire:\n" + "\n".join(problems)
    return back


def differences(sent: Report, got: Report) -> list[str]:
    out = _compare(sent, got, "report")
    out += _compare(sent.run, got.run, "run")
    assert len(sent.findings) == len(got.findings)
    for n, (f, g) in enumerate(zip(sent.findings, got.findings)):
        where = f"findings[{n}] ({f.rule})"
        out += _compare(f, g, where)
        out += _location(f.location, g.location, f"{where}.location", NOT_ON_THE_WIRE[Location])
        assert len(f.related) == len(g.related)
        for m, (r, s) in enumerate(zip(f.related, g.related)):
            out += _compare(r, s, f"{where}.related[{m}]")
            out += _location(r.location, s.location, f"{where}.related[{m}].location",
                             RELATED_LOCATION_NOT_ON_THE_WIRE)
    return out


# fields compared on their own (a location's) or by their JSON (a dict read back has lists
# where tuples were, "nan" where a float was)
_NESTED = {"location", "related", "run", "findings"}


def _compare(sent, got, where: str) -> list[str]:
    out = []
    for field in dataclasses.fields(sent):
        name = field.name
        if name in NOT_ON_THE_WIRE[type(sent)] or name in _NESTED:
            continue
        a, b = getattr(sent, name), getattr(got, name)
        if name == "ranks" and isinstance(sent, Finding) and a is None and sent.processes:
            a = ()  # merged: seen by no rank, only by processes
        if _plain(a) != _plain(b):
            out.append(f"{where}.{name}: {a!r} became {b!r}")
    return out


def _location(sent: Location | None, got: Location | None, where: str, left_out) -> list[str]:
    if sent is None or got is None:
        return [] if sent is got else [f"{where}: {sent!r} became {got!r}"]
    return [f"{where}.{f.name}: {getattr(sent, f.name)!r} became {getattr(got, f.name)!r}"
            for f in dataclasses.fields(Location)
            if f.name not in left_out and getattr(sent, f.name) != getattr(got, f.name)]


def _plain(value):
    if isinstance(value, tuple):
        value = list(value)
    return json.dumps(json_safe(value), sort_keys=True, default=repr)
