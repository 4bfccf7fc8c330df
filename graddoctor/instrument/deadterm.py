"""Which parameters each additive term of a loss reaches (loss-term-trains-nothing).

A loss is often a sum of terms, each meant to train some of the parameters the step after the
backward updates: a GAN generator's adversarial term and its reconstruction term, a policy's
surrogate and its entropy bonus, an auxiliary head's loss beside the main one. When the graph
of one term is cut on its way to the model (``d(fake.detach())`` in the generator's step,
``critic(s, actor(s).detach())`` in an actor's loss, a prediction taken under ``no_grad``), the
term still reaches other parameters (the discriminator's, the critic's, a frozen target
network's), so nothing fails: its gradient lands in parameters no step applies it to, and the
term trains nothing.

At a backward (the first ``_LOOKED`` of each backward line; ``describe_loss``) the loss's linear
top is walked from its root through additions, subtractions, negations, views, reductions and
products by constants; each node where the walk stops is a term, named by the additions'
operand indices on the way to it (``path``: ``(0,)`` the left operand of the top addition,
``(1, 0)`` the left operand of its right one). Below each term the leaves are walked; the
tracked tensors (parameters) each reaches are compared, and a ``loss_term_params`` aside is
made when two terms or more reach parameters and the terms fall into two groups or more that
share no parameter (one term apart from the rest, or several cut to the same other model, such
as a GAN generator's adversarial and feature-matching terms both reaching only D): the rule reads from the ledger whether any step applied those gradients.

Cost: a walk of at most ``_NODES`` nodes of the loss's top and of ``_LEAF_NODES`` below each of
at most ``_TERMS`` terms, at the first backwards of each line only; nothing after them.
"""

from __future__ import annotations

from .. import events as ev
from .graphpaths import reached, saved
from .lossterms import LossGraphReader, _sign_of

_NODES = 128  # nodes of the linear top walked
_TERMS = 12  # terms followed to their leaves, at most (a multi-resolution loss adds several)
_LEAF_NODES = 20000  # nodes walked below a term
_PASS = ("NegBackward0", "MeanBackward", "SumBackward", "View", "Reshape", "UnsafeView", "Squeeze",
         "Unsqueeze", "Clone", "ToCopy", "Expand", "Alias", "Contiguous", "AddBackward1",
         "SubBackward1", "RsubBackward1", "MulBackward1", "DivBackward1", "StackBackward", "CatBackward")


def additive_terms(root, limit: int = _NODES) -> list[tuple[tuple[int, ...], object]]:
    """``[(path, node)]``: the terms the loss's linear top adds up (see the module's docs),
    in the order of the script's operands."""
    found: list = []
    seen: set = set()
    stack = [(root, ())]
    while stack and len(seen) < limit:
        node, path = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        name = type(node).__name__
        children = [(i, c) for i, (c, _) in enumerate(node.next_functions) if c is not None]
        if name in ("AddBackward0", "SubBackward0") and len(children) == 2:
            for index, child in reversed(children):
                stack.append((child, path + (index,)))
            continue
        if name.startswith(("StackBackward", "CatBackward")) and len(children) >= 2:
            for index, child in reversed(children):
                stack.append((child, path + (index,)))
            continue
        if name in ("MulBackward0", "DivBackward0") and len(children) == 1:
            index, child = children[0]
            other = saved(node, "_saved_other" if index == 0 else "_saved_self")
            if (name == "MulBackward0" or index == 0) and _sign_of(other) is not None:
                stack.append((child, path))
                continue
        elif name.startswith(_PASS) and len(children) == 1:
            stack.append((children[0][1], path))
            continue
        found.append((path, node))
    return found


def _groups(param_sets: list[set]) -> list[set]:
    """The terms' parameters joined wherever two terms share one: more than one group means
    some terms reach parameters apart from the rest, though each may share them with another
    term (a GAN generator's adversarial and feature-matching terms both cut to D alone)."""
    groups: list[set] = []
    for pids in param_sets:
        joined = [g for g in groups if g & pids]
        merged = set(pids).union(*joined)
        groups = [g for g in groups if not (g & pids)] + [merged]
    return groups


class DeadTermWatcher(LossGraphReader):
    """Emits a ``loss_term_params`` aside at a backward whose loss adds up terms that reach
    parameters apart from each other (loss-term-trains-nothing)."""

    label = "loss_term_params"

    def _judge(self, root, loc) -> None:
        terms = additive_terms(root)
        if len(terms) < 2:
            return
        tensors = self.rec.tensors
        told = []
        for path, node in terms[:_TERMS]:
            leaves = reached(node, _LEAF_NODES, truncate=True)[1]
            pids = sorted(pid for i in leaves
                          if (pid := tensors.number.get(i)) is not None and id(tensors.refs[pid]()) == i)
            told.append((path, type(node).__name__, pids))
        with_params = [t for t in told if t[2]]
        if len(with_params) < 2:
            return
        if len(_groups([set(t[2]) for t in with_params])) < 2:
            return
        self.rec.emit_aside(ev.loss_term_params(
            terms=[{"path": list(path), "op": op, "params": pids[:256]} for path, op, pids in told],
            line=getattr(loc, "line", None)), loc)

    def install(self, patcher) -> None:
        pass
