"""Gradients taken with ``torch.autograd.grad(..., create_graph=True)`` that no later
differentiation goes through.

``create_graph=True`` builds the graph of the gradient itself so that a backward can
differentiate it: MAML's inner update (the query loss backpropagates through the adapted
weights), a gradient penalty (WGAN-GP, R1), a physics-informed residual, double
backpropagation. When the loss that is backpropagated never reads that gradient (the query loss
evaluated with the unadapted model, the adapted weights overwritten, the penalty computed but
left out of the loss or added as a float with ``.item()``), the second-order term is silently
missing from every update, and nothing fails.

The gradients a call returns carry a graph only under ``create_graph=True`` (otherwise they are
plain tensors), so the call's result tells: the ``grad_fn`` nodes of the gradients it returns
are held as *pending* until the next optimizer step. A backward whose loss reaches a pending
node (walked from its root, ``_NODES`` nodes at most) *uses* its call. A later
``torch.autograd.grad`` whose ``outputs`` reach one uses it through its own result: at once when
that result carries no graph (a Hessian-vector product for a logged curvature, a first-order
step), else when that result is used in turn (``u_x`` is used when ``u_xx``, taken from it with
a graph, is read by the loss). So the inner steps of MAML, each differentiating the previous
step's adapted weights, are all unused when the query loss reads none of them (the unadapted
model evaluated on the query set after two inner steps). At an optimizer step that a backward preceded since the calls, each call
line's pending calls are settled: used when one of them was used, else unused for that step.
A walk over its node budget counts as a use (not known: silent). A line unused at ``_UNUSED``
steps and used at none is recorded once as a ``grad_graph_unused`` aside event (loc: the
``autograd.grad`` call; ``backward``: the line of the last backward before the step).

Followed for the first ``_STEPS`` optimizer steps (each walk is bounded); the held nodes are
dropped at every step, so the graphs they belong to live no longer than the script keeps them.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import reached
from .inlinable import watched, watched_result
from .recorder import Recorder
from .topics import DESCRIBE_LOSS, STEPPED

_STEPS = 6  # optimizer steps followed
_UNUSED = 2  # steps at which a call line's gradients went unused that make it a finding
_NODES = 20000  # nodes walked per backward or per autograd.grad's outputs
_PENDING = 256  # gradient nodes held at most between two steps


class GradGraphWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._steps = 0
        self._pending: list = []  # (node, call index) of gradients returned with a graph
        self._calls: list = []  # call index -> [loc, used]
        self._feeds: dict = {}  # call index -> the earlier calls its outputs differentiated
        self._feeding: set = set()  # the calls the autograd.grad running now differentiates
        self._backward = None  # the last backward's location since the calls pending
        self._unused: dict = {}  # call loc -> steps at which its gradients went unused
        self._used: set = set()  # call locs whose gradients were used at a step
        self._told: set = set()
        self._done = False

    # --- the calls ---------------------------------------------------------------------------

    def _before(self, args, kwargs) -> None:
        self._feeding = set()
        if self._done or not self._pending:
            return
        try:
            outputs = args[0] if args else kwargs.get("outputs")
            self._feeding = self._reached(outputs)
        except Exception as exc:
            self.rec.internal_error("create_graph gradients", exc)

    def _after(self, result) -> None:
        feeding, self._feeding = self._feeding, set()
        if self._done:
            return
        try:
            items = result if isinstance(result, (list, tuple)) else (result,)
            nodes = [t.grad_fn for t in items
                     if isinstance(t, torch.Tensor) and t.grad_fn is not None]
            loc = self.rec.here() if nodes and len(self._pending) + len(nodes) <= _PENDING else None
            if loc is None:
                # no graph (create_graph=False: a logged curvature, a first-order step) or not
                # followed: what it differentiated counts as used
                for index in feeding:
                    self._mark(index)
                return
            index = len(self._calls)
            self._calls.append([loc, False])
            self._feeds[index] = feeding
            self._pending.extend((node, index) for node in nodes)
        except Exception as exc:
            self.rec.internal_error("create_graph gradients", exc)

    def _reached(self, tensors) -> set:
        """The pending calls whose gradients the graph of ``tensors`` reaches (all of them when
        the graph is too big to walk: not known, so used)."""
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        roots = [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        found: set = set()
        for root in roots:
            walked = reached(root, _NODES)
            if walked is None:
                return set(range(len(self._calls)))
            nodes = walked[0]
            found.update(index for node, index in self._pending if node in nodes)
        return found

    def _mark(self, index: int) -> None:
        """Mark a call used, and the earlier calls its outputs differentiated."""
        todo = [index]
        while todo:
            i = todo.pop()
            if self._calls[i][1]:
                continue
            self._calls[i][1] = True
            todo.extend(self._feeds.get(i, ()))

    def _use(self, tensors) -> None:
        """Mark the pending calls whose gradients the graph of ``tensors`` reaches."""
        for index in self._reached(tensors):
            self._mark(index)

    # --- backwards and steps -----------------------------------------------------------------

    def describe_loss(self, tensors) -> dict:
        if self._done or not self._pending:
            return {}
        try:
            self._backward = self.rec.here()
            self._use(list(loss_roots_tensors(tensors)))
        except Exception as exc:
            self.rec.internal_error("create_graph gradients", exc)
        return {}

    def after_step(self, opt, optimizer) -> None:
        if self._done:
            return
        try:
            self._steps += 1
            if self._pending and self._backward is not None:
                self._settle()
        except Exception as exc:
            self.rec.internal_error("create_graph gradients", exc)
        # dropped at every step: the graphs held live no longer than one update
        self._pending, self._calls, self._backward = [], [], None
        self._feeds = {}
        if self._steps >= _STEPS:
            self._done = True
            self._pending, self._calls = [], []
            self.rec.retire(STEPPED, self.after_step)
            self.rec.retire(DESCRIBE_LOSS, self.describe_loss)

    def _settle(self) -> None:
        by_line: dict = {}
        for loc, used in self._calls:
            by_line[loc] = by_line.get(loc, False) or used
        # a line whose gradients another line's (unused) gradients were taken from is told
        # through that later line: u_x feeding a u_xx the loss leaves out is one bug, at u_xx
        feeding_on = {self._calls[fed][0] for later, fed_set in self._feeds.items()
                      for fed in fed_set if self._calls[later][0] != self._calls[fed][0]}
        for loc, used in by_line.items():
            if not used and loc in feeding_on:
                continue
            if used:
                self._used.add(loc)
                continue
            self._unused[loc] = self._unused.get(loc, 0) + 1
            if self._unused[loc] >= _UNUSED and loc not in self._used and loc not in self._told:
                self._told.add(loc)
                backward = self._backward
                self.rec.emit_aside(ev.grad_graph_unused(
                    backward=[backward.path, backward.line] if backward is not None else None,
                    steps=self._unused[loc]), loc)

    def install(self, patcher) -> None:
        original = torch.autograd.grad
        patcher.patch(torch.autograd, "grad",
                      watched(watched_result(original, self._after), self._before))


def loss_roots_tensors(tensors):
    """The tensors a backward was given that carry a graph (``loss_roots`` gives their nodes)."""
    items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
    return [t for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]
