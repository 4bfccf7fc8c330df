"""The trace: plain, frozen event records — the only thing rules see.

No torch here: a trace can be written by hand (tests) or read back from the JSON
lines that ``graddoctor check --trace FILE`` writes.

Event kinds and their ``data`` (ids are small ints graddoctor assigns):

=================  ==========================================================================
kind               data
=================  ==========================================================================
run_start          script, argv, device, torch_version
param              pid, name, shape, is_parameter, requires_grad       (at first sight)
optimizer_init     opt, cls, params [pid]
backward           bid, fresh [pid], accumulated [pid], cleared_outside [pid],
                   extra_leaves (non-parameter leaves this backward writes, e.g. FGSM input; the
                   count of its call line's latest graph walk, see instrument/backward.py),
                   in_step (opt id when run inside ``optimizer.step(closure)``, else None),
                   scaled (bool: backward of ``scaler.scale(loss)``), scale (float|None),
                   loss_scale_factor (float|None: how the loss was divided, when known),
                   scaler, scaler_enabled (when scaled), batch ([loader, epoch, index] of the
                   batch a DataLoader served last, or None)
clear              via ("optimizer.zero_grad" | "module.zero_grad"), opt (id|None),
                   set_to_none, params [pid]
step_begin         opt, closure (bool), norm_pids [pid], norms [float] (L2 norm of each grad about
                   to be applied, parallel to norm_pids; empty for closure steps; both None when
                   not measured: every grad was already seen finite by a clip_grad_norm_ or
                   GradScaler.unscale_ and is unchanged since; measured anyway on each optimizer's
                   first update and from the step budget's last update on),
                   nonfinite [pid] (grads with NaN/Inf)
step               opt, closure (bool), skipped (bool: GradScaler skipped the update),
                   without_grad [pid] (owned params whose .grad was None)
epoch_start        loader, epoch, real_len, replay_len (the replay's shorter epoch, see
                   ``--epoch-batches``; None for a stream without length)
unscale            scaler, opt, enabled, implicit (called by ``scaler.step``), scale
scaler_step        scaler, opt, enabled, fused, skipped, found_inf (after ``scaler.step``; a
                   skipped one is also recorded as a ``step`` with skipped=True)
scaler_update      scaler, enabled, scale (the new scale)
clip               via (clip_grad_norm_ | clip_grad_value_ | clip_grads_with_norm_),
                   params [pid] (tracked params passed), with_grad [pid], untracked, limit
                   (max_norm or clip_value; "inf" as a string), norm_type, norm_only (max_norm
                   is inf: computes the norm, clips nothing), total_norm (CPU only),
                   edited [pid] (grads changed in place by unwatched code before the clip)
grad_edit          opt, params [pid] (grads changed in place by unwatched code before a step)
scheduler_step     sched, cls, opt (the optimizer it drives)
train / eval       the user's outermost Module.train()/eval() call: mode (bool), leaf (it named
                   one BatchNorm/dropout layer), root (class), frozen (every parameter under it
                   frozen), modules [mid] (BatchNorm/dropout layers it covers), calls (merged)
mode_module        mid, name, cls, layer ("batchnorm" | "dropout"), has_params, frozen, owned,
                   trainable, updated (changed in place outside an optimizer: EMA),
                   track_running_stats, momentum, p, freeze (seq of its freeze event | None)
mode_forward       training, grad, inference, modules [mid], grad_modules [mid] (gradient flows
                   through), calls, recalibrating — one per call line and mode while no other
                   event happens (loc: the user's call of the outermost module)
freeze             calls (parameters frozen from this line with requires_grad_(False))
bn_reset           modules [mid], calls (reset_running_stats() by the user)
update_bn          (torch.optim.swa_utils.update_bn called; its forwards are ``recalibrating``)
compile            target, fullgraph, backend (a torch.compile call; graddoctor's hooks run at its
                   graph breaks)
internal_error     where, error
run_end            status, steps
=================  ==========================================================================

Other modules (AMP, clipping, modes) add kinds of their own; rules ignore kinds they do not know.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

from .jsonsafe import json_safe


@dataclass(frozen=True)
class Location:
    path: str
    line: int
    function: str = ""

    def to_json(self) -> dict:
        return {"path": self.path, "line": self.line, "function": self.function}

    @staticmethod
    def from_json(obj: Mapping | None) -> "Location | None":
        if not obj:
            return None
        return Location(str(obj["path"]), int(obj["line"]), str(obj.get("function", "")))

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Event:
    seq: int
    kind: str
    loc: Location | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

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
            data=dict(obj.get("data") or {}),
        )


class Trace:
    """An ordered list of events plus convenient look-ups. Append-only while recording."""

    def __init__(self, events: Iterable[Event] = ()):
        self.events: list[Event] = list(events)

    def add(self, kind: str, loc: Location | None = None, **data: Any) -> Event:
        event = Event(len(self.events), kind, loc, data)
        self.events.append(event)
        return event

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def of_kind(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]

    def params(self) -> dict[int, Event]:
        """pid -> its latest ``param`` event (name, shape, flags)."""
        return {e["pid"]: e for e in self.events if e.kind == "param"}

    def param_name(self, pid: int) -> str:
        event = self.params().get(pid)
        name = event.get("name") if event else None
        return name or f"param#{pid}"

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
    checked for pointing at the right call.
    """

    def __init__(self, path: str = "train.py"):
        self.trace = Trace()
        self.path = path
        self._bid = 0

    def _loc(self, line: int | None) -> Location:
        return Location(self.path, line if line is not None else len(self.trace) + 1)

    def event(self, kind: str, line: int | None = None, **data: Any) -> Event:
        return self.trace.add(kind, self._loc(line), **data)

    def param(self, pid: int, name: str | None = None, **kw: Any) -> Event:
        data = {"pid": pid, "name": name or f"p{pid}", "shape": [1], "is_parameter": True,
                "requires_grad": True}
        data.update(kw)
        return self.trace.add("param", None, **data)

    def optimizer(self, opt: int, params: list[int], line: int | None = None, cls: str = "SGD") -> Event:
        for pid in params:
            if pid not in self.trace.params():
                self.param(pid)
        return self.event("optimizer_init", line, opt=opt, cls=cls, params=list(params))

    def backward(self, fresh=(), accumulated=(), cleared_outside=(), line: int | None = None,
                 **kw: Any) -> Event:
        data = {"bid": self._bid, "fresh": list(fresh), "accumulated": list(accumulated),
                "cleared_outside": list(cleared_outside), "extra_leaves": 0, "in_step": None,
                "scaled": False, "scale": None, "loss_scale_factor": None}
        data.update(kw)
        self._bid += 1
        for pid in [*fresh, *accumulated, *cleared_outside]:
            if pid not in self.trace.params():
                self.param(pid)
        return self.event("backward", line, **data)

    def clear(self, params, opt: int | None = 0, line: int | None = None, set_to_none: bool = True,
              via: str | None = None) -> Event:
        via = via or ("optimizer.zero_grad" if opt is not None else "module.zero_grad")
        return self.event("clear", line, via=via, opt=opt, set_to_none=set_to_none, params=list(params))

    def step(self, opt: int = 0, line: int | None = None, closure: bool = False, skipped: bool = False) -> Event:
        return self.event("step", line, opt=opt, closure=closure, skipped=skipped)
