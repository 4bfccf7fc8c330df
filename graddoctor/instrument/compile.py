"""torch.compile: keep graddoctor's own code out of compiled graphs, and note where compile ran.

Left alone, Dynamo traces into our wrappers (zero_grad, the optimizer step hooks, ...): their
recording then either breaks the trace or runs once while tracing and never again. Putting
graddoctor's folder on Dynamo's skip list makes every call into graddoctor a graph break that
runs eagerly, every time — the same place where ``zero_grad``, ``backward`` and the optimizer's
``step`` already break the graph. The skip entry is added at the first ``torch.compile`` call,
or at once when Dynamo is already loaded (graddoctor never imports it: ~1 s).
"""

from __future__ import annotations

import functools
import os
import sys

import torch

from .. import events as ev
from .recorder import Recorder

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CompileWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._patcher = None
        self._skipping = False

    def keep_out_of_graphs(self) -> None:
        """Add graddoctor's folder to Dynamo's skip list — as two module attributes patched
        through the Patcher (the list and its regex), so that leaving restores both."""
        if self._skipping or self._patcher is None:
            return
        self._skipping = True
        from torch._dynamo import trace_rules

        folder = trace_rules._as_posix_path(_PKG_DIR + os.sep)
        if folder in trace_rules.SKIP_DIRS:
            return
        old_re = trace_rules.SKIP_DIRS_RE
        self._patcher.patch(trace_rules, "SKIP_DIRS", [*trace_rules.SKIP_DIRS, folder])
        trace_rules._recompile_re()  # builds the regex from the patched list
        new_re, trace_rules.SKIP_DIRS_RE = trace_rules.SKIP_DIRS_RE, old_re
        self._patcher.patch(trace_rules, "SKIP_DIRS_RE", new_re)

    def _wrap_compile(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def compile(*args, **kwargs):
            try:
                watcher.keep_out_of_graphs()
                target = args[0] if args else kwargs.get("model")
                if target is not None:  # @torch.compile(...) comes back here with the function
                    rec.emit(ev.torch_compile(
                        target=getattr(target, "__qualname__", None) or type(target).__name__,
                        fullgraph=bool(kwargs.get("fullgraph")),
                        backend=str(kwargs.get("backend", "inductor"))), rec.here(2))
            except Exception as exc:
                rec.internal_error("torch.compile", exc)
            return original(*args, **kwargs)

        return compile

    def install(self, patcher) -> None:
        self._patcher = patcher
        if "torch._dynamo" in sys.modules:
            try:
                self.keep_out_of_graphs()
            except Exception as exc:
                self.rec.internal_error("torch.compile", exc)
        if hasattr(torch, "compile"):
            patcher.patch(torch, "compile", self._wrap_compile(torch.compile))
