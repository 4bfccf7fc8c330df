"""Gradients graddoctor does not follow: ``torch.autograd.grad``, ``torch.autograd.functional``
and the ``torch.func`` transforms.

graddoctor judges the gradients that ``backward()`` accumulates in ``.grad`` and the optimizer
steps that apply them. A gradient returned by one of these functions goes wherever the script
puts it, unseen. Unwatched, a script that trains only this way would end "no-training-loop"
(exit 2), as if it had no loop; so each entry point is wrapped (``inlinable.watched``: compiled code calls the original) and the
first call from each line of the user's code is recorded as a ``functional_grad`` aside event,
so the report can say what was not checked and why (rules/notes.py).

Cost per call: a frame lookup and a set lookup; a call site is looked at once. Calls torch makes
itself (``torch.autograd.functional`` calling ``torch.autograd.grad``) are not recorded.
"""

from __future__ import annotations

import sys

import torch

from .. import events as ev
from ..location import site_key
from .inlinable import watched
from .recorder import Recorder


def entry_points() -> list[tuple[object, str, str]]:
    """(namespace, attribute, name shown) of every function watched; those this torch lacks are
    left out."""
    import torch.autograd.functional as autograd_functional

    names = [(torch.autograd, "grad", "torch.autograd.grad")]
    names += [(autograd_functional, f, f"torch.autograd.functional.{f}")
              for f in ("vjp", "jvp", "jacobian", "hessian", "vhp", "hvp")]
    try:
        import torch.func as func
    except ImportError:  # torch < 2.0
        func = None
    if func is not None:
        names += [(func, f, f"torch.func.{f}") for f in ("grad", "grad_and_value", "vjp", "jvp",
                                                          "jacrev", "jacfwd", "hessian",
                                                          "functional_call")]
    return [(owner, attr, shown) for owner, attr, shown in names if callable(getattr(owner, attr, None))]


class FunctionalGradWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._done: set[tuple] = set()  # site_key: call sites looked at
        self._codes: dict[int, object] = {}  # the code objects whose ids are in those keys

    def _wrap(self, original, api: str):
        watcher, rec = self, self.rec

        def before(args, kwargs) -> None:
            try:
                caller = sys._getframe(2)  # the code that called the entry point
                site = site_key(caller, watcher._codes)
                if site in watcher._done:
                    return
                watcher._done.add(site)
                if rec.finder.is_user_file(caller.f_code.co_filename):
                    create_graph = None
                    if api == "torch.autograd.grad":
                        create_graph = bool(kwargs.get("create_graph", args[4] if len(args) > 4 else False))
                    rec.emit_aside(ev.functional_grad(api=api, create_graph=create_graph),
                                   rec.finder.location(caller))
            except Exception as exc:
                rec.internal_error(api, exc)

        return watched(original, before)

    def install(self, patcher) -> None:
        for owner, attr, api in entry_points():
            patcher.patch(owner, attr, self._wrap(getattr(owner, attr), api))
