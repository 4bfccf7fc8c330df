"""The trace: plain, frozen event records — the only thing rules see.

No torch here: a trace can be written by hand (tests) or read back from the JSON
lines that ``graddoctor check --trace FILE`` writes.

The event kinds, their data and their constructors are in ``graddoctor/events.py``. An event is
final when it is made: ``Event.data`` is a read-only mapping (a ``types.MappingProxyType``), and
the instrumentation hands over lists it never changes again. Whatever must grow (an aggregate)
is kept by its watcher and emitted when finished.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Iterable, Iterator, Mapping

from . import events as ev
from .jsonsafe import json_safe, restore_non_finite


@dataclass(frozen=True)
class Location:
    path: str
    line: int
    function: str = ""
    # the training framework whose frames lay between the user's line and the call
    # ("lightning" | "accelerate" | "transformers"; "" for a call the user's code made itself)
    via: str = ""
    # the user's hook the framework's call is attributed to ("training_step",
    # "configure_optimizers", ...): the line is in that hook, not where the framework was called
    hook: str = ""

    def to_json(self) -> dict:
        out = {"path": self.path, "line": self.line, "function": self.function}
        if self.via:
            out["via"] = self.via
        if self.hook:
            out["hook"] = self.hook
        return out

    @staticmethod
    def from_json(obj: Mapping | None) -> "Location | None":
        if not obj:
            return None
        return Location(str(obj["path"]), int(obj["line"]), str(obj.get("function", "")),
                        str(obj.get("via", "")), str(obj.get("hook", "")))

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True, init=False, slots=True)
class Event:
    """One recorded event; immutable, ``data`` included (a read-only mapping)."""

    seq: int
    kind: str
    loc: Location | None
    data: Mapping[str, Any]

    def __init__(self, seq: int, kind: str, loc: Location | None = None,
                 data: Mapping[str, Any] | None = None):
        if type(data) is not MappingProxyType:  # Trace.put hands over its own proxy, uncopied
            data = MappingProxyType(dict(data) if data else {})
        setattr_ = object.__setattr__
        setattr_(self, "seq", seq)
        setattr_(self, "kind", kind)
        setattr_(self, "loc", loc)
        setattr_(self, "data", data)

    def __reduce__(self):  # copy, deepcopy and pickle (a mappingproxy cannot be pickled)
        return Event, (self.seq, self.kind, self.loc, dict(self.data))

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def to_json(self) -> dict:
        out: dict = {"seq": self.seq, "kind": self.kind}
        if self.loc is not None:
            out["loc"] = self.loc.to_json()
        out["data"] = dict(self.data)
        return out

    @staticmethod
    def from_json(obj: Mapping) -> "Event":
        return Event(
            seq=int(obj["seq"]),
            kind=str(obj["kind"]),
            loc=Location.from_json(obj.get("loc")),
            data=restore_non_finite(dict(obj.get("data") or {})),
        )


# the slots of an Event, set directly by Trace.put (the frozen dataclass's __init__ does the same)
_new = object.__new__
_set_seq, _set_kind, _set_loc, _set_data = (Event.__dict__[name].__set__
                                            for name in ("seq", "kind", "loc", "data"))


def made_event(trace: "Trace", made: tuple[str, dict], loc: Location | None = None) -> Event:
    """The event ``Trace.put`` would append, with the trace's next seq, not appended (the
    recorder's steady path keeps it aside: instrument/fold.py, ``Folder.steady_put``)."""
    kind, data = made
    event = _new(Event)
    _set_seq(event, trace.next_seq)
    _set_kind(event, kind)
    _set_loc(event, loc)
    _set_data(event, MappingProxyType(data))
    trace.next_seq += 1
    return event


class Trace:
    """An ordered list of events plus convenient look-ups. Append-only while recording."""

    def __init__(self, events: Iterable[Event] = ()):
        self.events: list[Event] = list(events)
        # the seq the next event gets: one past the last one's. Seqs are the events' indices
        # unless the recorder folded repeated turns out of the list (instrument/fold.py)
        self.next_seq = self.events[-1].seq + 1 if self.events else 0

    def put(self, made: tuple[str, dict], loc: Location | None = None) -> Event:
        """Append the event a constructor of ``graddoctor.events`` made: ``(kind, data)``. The
        data dict becomes the event's, read-only; the caller keeps no reference to change it."""
        kind, data = made
        # Event(seq, kind, loc, proxy) without its __init__ (hot path: every event of a run)
        event = _new(Event)
        _set_seq(event, self.next_seq)
        _set_kind(event, kind)
        _set_loc(event, loc)
        _set_data(event, MappingProxyType(data))
        self.next_seq += 1
        self.events.append(event)
        return event

    def add(self, kind: str, loc: Location | None = None, **data: Any) -> Event:
        """Append an event of any kind with exactly ``data`` (hand-written traces, unknown kinds);
        the instrumentation uses ``put`` with the constructors of ``graddoctor.events``."""
        return self.put((kind, data), loc)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def of_kind(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]

    def params(self) -> dict[int, Event]:
        """pid -> its latest ``param`` event (name, shape, flags)."""
        return {e["pid"]: e for e in self.events if e.kind == "param"}

    # -- JSON lines -------------------------------------------------------------------
    def dumps(self) -> str:
        return "".join(json.dumps(json_safe(e.to_json()), default=str, allow_nan=False) + "\n"
                       for e in self.events)

    @staticmethod
    def loads(text: str) -> "Trace":
        return Trace(Event.from_json(json.loads(line)) for line in text.splitlines() if line.strip())


class TraceBuilder:
    """Writes traces by hand in tests: ``t = TraceBuilder(); t.backward(fresh=[0]); t.step(0)``.

    Every event gets a location ``train.py:<n>`` unless ``line=`` is given, so rules can be
    checked for pointing at the right call. The typed helpers make their events with the
    constructors of ``graddoctor.events`` (the instrumentation's own, defaults included) and pass
    their other keyword arguments on to them; ``event`` writes any kind with exactly the data
    given, ``put`` any constructor's result.
    """

    def __init__(self, path: str = "train.py"):
        self.trace = Trace()
        self.path = path
        # set to write the events of a framework-driven loop: Location.via / Location.hook
        self.via = ""
        self.hook = ""

    def _loc(self, line: int | None) -> Location:
        return Location(self.path, line if line is not None else len(self.trace) + 1,
                        via=self.via, hook=self.hook)

    def event(self, kind: str, line: int | None = None, **data: Any) -> Event:
        return self.trace.add(kind, self._loc(line), **data)

    def put(self, made: tuple[str, dict], line: int | None = None) -> Event:
        return self.trace.put(made, self._loc(line))

    def param(self, pid: int, name: str | None = None, *, shape: list[int] | None = None,
              is_parameter: bool = True, requires_grad: bool | None = True) -> Event:
        return self.trace.put(ev.param(pid=pid, name=name or f"p{pid}",
                                       shape=[1] if shape is None else shape,
                                       is_parameter=is_parameter, requires_grad=requires_grad))

    def _params(self, pids) -> None:
        known = self.trace.params()
        for pid in pids:
            if pid not in known:
                known[pid] = self.param(pid)

    def optimizer(self, opt: int, params: list[int], line: int | None = None, cls: str = "SGD") -> Event:
        self._params(params)
        return self.put(ev.optimizer_init(opt=opt, cls=cls, params=list(params)), line)

    def backward(self, fresh=(), accumulated=(), cleared_outside=(), line: int | None = None,
                 **kw: Any) -> Event:
        self._params([*fresh, *accumulated, *cleared_outside])
        return self.put(ev.backward(fresh=list(fresh), accumulated=list(accumulated),
                                    cleared_outside=list(cleared_outside), **kw), line)

    def clear(self, params, opt: int | None = 0, line: int | None = None, via: str | None = None,
              **kw: Any) -> Event:
        via = via or ("optimizer.zero_grad" if opt is not None else "module.zero_grad")
        return self.put(ev.clear(via=via, opt=opt, params=list(params), **kw), line)

    def step(self, opt: int = 0, line: int | None = None, **kw: Any) -> Event:
        return self.put(ev.step(opt=opt, **kw), line)
