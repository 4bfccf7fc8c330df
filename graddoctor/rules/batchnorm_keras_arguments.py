from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule


class BatchnormKerasArguments(Rule):
    """
    ## What it does
    Finds a BatchNorm layer the script builds with Keras' arguments in PyTorch's meaning:

    * an `eps` of 0.1 or more, almost always Keras' momentum passed as PyTorch's second
      positional argument (`nn.BatchNorm2d(128, 0.8)`: PyTorch's signature is
      `BatchNorm2d(num_features, eps, momentum, ...)`);
    * a `momentum` from 0.9 up to (not including) 1 on a layer that tracks running statistics:
      Keras' momentum is the weight of the *old* running value, PyTorch's the weight of the
      *new* batch, so 0.99 in Keras is 0.01 in PyTorch.

    Seen when the layer is registered into a module by the script's own code (layers a
    library builds are its architecture).

    ## Why is this bad?
    With `eps=0.8` every activation is divided by `sqrt(var + 0.8)` instead of
    `sqrt(var + 1e-5)`: features whose batch variance is small are barely normalised, and
    training follows the activations' scale, which is what BatchNorm is there to remove.
    With `momentum=0.99` the running mean and variance are almost only the last batch's, so
    evaluation (`model.eval()`) normalises every input with one batch's statistics.

    ## Example
    ```python
    nn.BatchNorm2d(128, 0.8)            # eps=0.8
    nn.BatchNorm1d(256, momentum=0.99)  # Keras' momentum
    ```

    ## Use instead
    ```python
    nn.BatchNorm2d(128, momentum=0.2)   # Keras' momentum=0.8 is PyTorch's 0.2
    nn.BatchNorm1d(256, momentum=0.01)
    ```

    ## Stays silent on
    PyTorch's defaults and other small eps values (1e-3 of TF ports); `momentum=None` (a
    cumulative average); `momentum=1.0` (the last batch's statistics, chosen on purpose in
    meta-learning code) and any momentum on a layer with `track_running_stats=False`;
    BatchNorm layers a library builds.
    """

    code = "GD307"
    slug = "batchnorm-keras-arguments"
    severity = Severity.WARNING
    summary = ("a BatchNorm built with Keras' arguments: eps=0.8 from a positional momentum, or "
               "momentum=0.99, which PyTorch weighs the other way round")
    fix = "pass momentum by name, as 1 - Keras' momentum: nn.BatchNorm2d(c, momentum=0.2) for Keras' 0.8"

    def check(self, a):
        if not a.steps:
            return
        seen: set = set()
        for e in a.of_kind("norm_arguments"):
            if e.loc is None or (e.loc.path, e.loc.line) in seen:
                continue
            seen.add((e.loc.path, e.loc.line))
            cls, eps, momentum = e["cls"], e["eps"], e.get("momentum")
            loc, call = _construction(a, e.loc, cls, eps, momentum)
            said = f"`{call}`" if call else f"this {cls}"
            if eps >= 0.1:
                message = (f"{said} sets eps={eps:g}: PyTorch's {cls}(num_features, eps, momentum) "
                           f"takes eps second, where Keras takes momentum, so every activation is "
                           f"divided by sqrt(var + {eps:g}) instead of sqrt(var + 1e-5) and "
                           f"features whose batch variance is small are barely normalised")
                meant = 1 - eps if eps < 1 else None
                fix = (f"pass momentum by name, as 1 - Keras' momentum: "
                       f"{_rewritten(call, cls, meant)}" if meant is not None else
                       "drop the second argument (eps defaults to 1e-5) or pass it by name")
            else:
                message = (f"{said} has momentum={momentum:g}: PyTorch's momentum is the weight "
                           f"of the new batch in the running statistics (running = (1 - momentum) "
                           f"* running + momentum * batch), the opposite of Keras' momentum, so "
                           f"the running mean and variance are almost only the last batch's and "
                           f"evaluation (model.eval()) normalises with one batch's statistics")
                fix = (f"momentum={1 - momentum:.3g} (1 - Keras' momentum); PyTorch's default "
                       f"is 0.1")
            yield self.finding(
                message, loc, fix=fix,
                evidence={"cls": cls, "eps": eps, "momentum": momentum,
                          "params": [a.param_name(p) for p in e.get("params") or () if p in a.params]})


def _construction(a, loc, cls: str, eps: float, momentum: float | None):
    """``(location, call text)`` of the ``cls(...)`` call in the registering file whose literal
    arguments give this eps or momentum (the layer is often built in a helper, registered where
    the ``Sequential`` is made); else the registration's line and its call there, if any."""
    calls = a.source.calls_named(loc.path, frozenset({cls}))
    for line, text, _ in calls:
        given = _literal_arguments(text)
        if (eps >= 0.1 and _close(given.get("eps"), eps)) or (
                eps < 0.1 and momentum is not None and _close(given.get("momentum"), momentum)):
            return Location(loc.path, line, loc.function), text
    here = [c for c in calls if c[0] == loc.line]
    return loc, (min(here, key=lambda c: len(c[1]))[1] if here else None)


def _literal_arguments(text: str) -> dict:
    """eps and momentum as the call's literals give them (positionally or by name)."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return {}
    out: dict = {}
    if not isinstance(node, ast.Call):
        return out
    for position, name in ((1, "eps"), (2, "momentum")):
        if len(node.args) > position and isinstance(node.args[position], ast.Constant):
            out[name] = node.args[position].value
    for kw in node.keywords:
        if kw.arg in ("eps", "momentum") and isinstance(kw.value, ast.Constant):
            out[kw.arg] = kw.value.value
    return out


def _close(value, expected: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and abs(value - expected) <= 1e-6 * max(1.0, abs(expected))


def _rewritten(call: str | None, cls: str, momentum: float) -> str:
    """``nn.BatchNorm2d(128, momentum=0.2)`` from ``nn.BatchNorm2d(128, 0.8)``."""
    try:
        node = ast.parse(call, mode="eval").body if call else None
    except SyntaxError:
        node = None
    if isinstance(node, ast.Call) and node.args:
        return f"{ast.unparse(node.func)}({ast.unparse(node.args[0])}, momentum={momentum:.3g})"
    return f"nn.{cls}(num_features, momentum={momentum:.3g})"
