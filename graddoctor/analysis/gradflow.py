"""Per-layer gradient norms of each optimizer's last update, from the ``step_begin`` events'
summary (``--grad-flow`` draws them: report/gradflow.py).

Each optimizer's latest step that carried norms (closure steps carry none). A layer is a
parameter name without its last part (``model.fc1.weight`` -> ``model.fc1``); its norm is the
L2 norm over its parameters (sqrt of the sum of squares). No torch, no rich.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from . import Analysis


@dataclass
class LayerNorm:
    layer: str
    norm: float | None  # nan when a gradient is not finite; None when no parameter had a .grad
    params: int  # parameters with a gradient
    without_grad: int = 0  # parameters the optimizer owns whose .grad was None


@dataclass
class UpdateNorms:
    opt: int
    step: int  # 1-based optimizer step
    layers: list[LayerNorm]


def layer_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else name


def last_update_norms(a: "Analysis") -> list[UpdateNorms]:
    """For every optimizer, its last step's per-layer gradient norms (in parameter order)."""
    latest: dict[int, tuple[int, object, list]] = {}  # opt -> (step number, step_begin, without)
    pending: dict[int, object] = {}
    for event in a.events:
        if event.kind == "step_begin" and event.get("norm_pids") is not None and not event.get("closure"):
            pending[event["opt"]] = event
        elif event.kind == "step":
            begin = pending.pop(event.get("opt"), None)
            if begin is not None:
                latest[event["opt"]] = (a.step_number[event.seq], begin, list(event.get("without_grad") or ()))
    out = []
    for opt, (step, begin, without) in sorted(latest.items(), key=lambda kv: kv[1][0]):
        sums: dict[str, float] = {}
        layers: dict[str, LayerNorm] = {}
        first_pid: dict[str, int] = {}  # layers in parameter order (pids follow construction)
        for pid in [*begin["norm_pids"], *without]:
            layer = layer_of(a.param_name(pid))
            first_pid[layer] = min(pid, first_pid.get(layer, pid))
        for layer in sorted(first_pid, key=first_pid.get):
            layers[layer] = LayerNorm(layer, None, 0)
        for pid, norm in zip(begin["norm_pids"], begin["norms"]):
            layer = layer_of(a.param_name(pid))
            layers[layer].params += 1
            norm = float(norm)
            sums[layer] = sums.get(layer, 0.0) + (norm * norm if math.isfinite(norm) else math.nan)
        for pid in without:
            layers[layer_of(a.param_name(pid))].without_grad += 1
        for layer, total in sums.items():
            layers[layer].norm = math.sqrt(total) if math.isfinite(total) else math.nan
        if layers:
            out.append(UpdateNorms(opt, step, list(layers.values())))
    return out
