"""torch.compile: keep graddoctor's own code out of compiled graphs, and note where compile ran.

Left alone, Dynamo traces into our wrappers (zero_grad, the optimizer step hooks, ...): their
recording then either breaks the trace or runs once while tracing and never again. Putting
graddoctor's folder on Dynamo's skip list makes every call into graddoctor a graph break that
runs eagerly, every time — the same place where ``zero_grad``, ``backward`` and the optimizer's
``step`` already break the graph. The skip entry is added at the first ``torch.compile`` call,
or at once when Dynamo is already loaded (graddoctor never imports it: ~1 s).

Dynamo also keeps a map from torch's functions to how it traces them, built once by name, the
first time it is needed. Built while graddoctor's wrappers stand in for torch's functions
(``F.dropout``, the losses), it names the wrappers, not the originals: after graddoctor leaves,
``torch.compile(fullgraph=True)`` would inline the original ``F.dropout`` and fail. A map built
during the instrumentation is therefore dropped on leaving (Dynamo builds it again when next
needed).
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
        patcher.handle(_RuleMapBuiltInside())
        if "torch._dynamo" in sys.modules:
            try:
                self.keep_out_of_graphs()
            except Exception as exc:
                self.rec.internal_error("torch.compile", exc)
        if hasattr(torch, "compile"):
            patcher.patch(torch, "compile", self._wrap_compile(torch.compile))


def _rule_map():
    """Dynamo's cached map of torch functions, or None while Dynamo is not loaded."""
    trace_rules = sys.modules.get("torch._dynamo.trace_rules")
    return getattr(trace_rules, "get_torch_obj_rule_map", None)


class _RuleMapBuiltInside:
    """An undo handle: on leaving, drops Dynamo's function map if it was built inside."""

    # no hook of its own: nothing to take out while benchmarks/overhead.py suspends the patches
    follows_a_patch = True

    def __init__(self):
        rule_map = _rule_map()
        self._built_before = rule_map is not None and rule_map.cache_info().currsize > 0

    def remove(self) -> None:
        rule_map = _rule_map()
        if not self._built_before and rule_map is not None and rule_map.cache_info().currsize:
            rule_map.cache_clear()


_TENSOR_VARIABLES = "torch._dynamo.variables.tensor"


def tensor_attrs_loaded() -> bool:
    return _TENSOR_VARIABLES in sys.modules


def tensor_attrs_read_inside(loaded_before: bool) -> None:
    """Dynamo reads the tensor classes' attributes once, as it loads (``all_tensor_attrs``):
    loaded during the check (an optimizer's first ``add_param_group`` loads Dynamo), the copy
    holds graddoctor's attribute watchers, which would outlive the check (and the recorder they
    reach with them) and stand for torch's own attributes when the script compiles later in the
    process. Read again from the classes as they are after leaving. Called once everything is
    put back."""
    module = sys.modules.get(_TENSOR_VARIABLES)
    if loaded_before or module is None or not isinstance(getattr(module, "all_tensor_attrs", None), dict):
        return
    module.all_tensor_attrs = torch._C.TensorBase.__dict__ | torch.Tensor.__dict__
