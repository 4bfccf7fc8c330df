"""graddoctor: a doctor for PyTorch training loops.

Runs a training script for a few optimizer steps under instrumentation and reports the
gradient bugs that never crash: missing or misplaced zero_grad, stale gradients, clipping
before unscale, BatchNorm drifting in train mode, and their relatives.

From Python (README "Use it from Python")::

    import graddoctor

    report = graddoctor.check_script("train.py", argv=["--epochs", "1"], steps=10)
    with graddoctor.watch() as w:
        train_one_epoch(model, loader, optimizer)
    print(w.report)

``import graddoctor`` stays light: torch is imported when a check starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .version import __version__

__all__ = ["check_script", "watch", "Watch", "Report", "Finding", "Severity", "ScriptError",
           "WatchError", "__version__"]

_LAZY = {
    "check_script": "graddoctor.api", "watch": "graddoctor.api", "Watch": "graddoctor.api",
    "Report": "graddoctor.report.model", "Finding": "graddoctor.findings",
    "Severity": "graddoctor.findings", "ScriptError": "graddoctor.errors",
    "WatchError": "graddoctor.errors",
}

if TYPE_CHECKING:  # pragma: no cover
    from .api import Watch, check_script, watch
    from .errors import ScriptError, WatchError
    from .findings import Finding, Severity
    from .report.model import Report


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'graddoctor' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ipython) -> None:
    """``%load_ext graddoctor``: registers the ``%%graddoctor`` cell magic (magic.py)."""
    from .magic import load_ipython_extension as load

    load(ipython)
