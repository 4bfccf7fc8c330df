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


_GRAPH_WALK_LIMIT = 20000  # nodes looked at per call site; past it the answer is "unknown"


def _of_data(outputs, inputs) -> bool:
    """Whether the graph of ``outputs`` reaches no leaf that requires grad but ``inputs``, none of
    them a parameter: the gradient is then one of a function of data alone (force labels from a
    reference potential), which no parameter's training could ever reach. False when unsure.
    Walked once per call site."""
    as_list = lambda v: list(v) if isinstance(v, (list, tuple)) else [v]
    outs = [t for t in as_list(outputs) if isinstance(t, torch.Tensor)]
    given = [t for t in as_list(inputs) if isinstance(t, torch.Tensor)]
    if not outs or not given or any(isinstance(t, torch.nn.Parameter) for t in given):
        return False  # a gradient taken for parameters is one of the model, never data
    ins = {id(t) for t in given}
    todo = [t.grad_fn for t in outs if t.grad_fn is not None]
    if not todo:
        return False
    seen: set[int] = set()
    while todo:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if len(seen) > _GRAPH_WALK_LIMIT:
            return False
        leaf = getattr(fn, "variable", None)
        if leaf is not None and id(leaf) not in ins:
            return False
        todo.extend(nxt for nxt, _ in fn.next_functions)
    return True


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
                    of_data = False
                    if api == "torch.autograd.grad":
                        create_graph = bool(kwargs.get("create_graph", args[4] if len(args) > 4 else False))
                        of_data = _of_data(kwargs.get("outputs", args[0] if args else None),
                                           kwargs.get("inputs", args[1] if len(args) > 1 else None))
                    rec.emit_aside(ev.functional_grad(api=api, create_graph=create_graph, of_data=of_data),
                                   rec.finder.location(caller))
            except Exception as exc:
                rec.internal_error(api, exc)

        return watched(original, before)

    def install(self, patcher) -> None:
        for owner, attr, api in entry_points():
            patcher.patch(owner, attr, self._wrap(getattr(owner, attr), api))
