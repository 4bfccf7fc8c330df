"""A policy-gradient term minimised along the advantage: ``log_prob(a) * (R - V)`` added to the
loss with a positive sign.

An actor-critic's actor loss is ``-(log_prob(a) * advantage)``: the advantage is the return
minus the critic's value, so minimising the loss raises the probability of the actions that did
better than the critic expected. Without the minus (``(log_probs * advantage.detach()).mean()``)
the optimizer lowers exactly those: the policy learns to do worse, the loss still falls. The
sign alone says nothing (a weight oriented as a cost, REINFORCE on a tour length, ``(cost - b) *
log_prob``, is minimised with a positive sign); what says it is the critic in the same loss: its
regression (``mse_loss(value, R)``, ``smooth_l1_loss``, ``huber_loss``, ``l1_loss``,
``gaussian_nll_loss``, ``(R - value) ** 2``) says which side is the return and which the value, so ``R - V`` is known, and the
log-probability's weight is compared with it.

``log_prob`` of ``torch.distributions``' classes is wrapped: each call notes its result's
autograd node (one set insertion; the set is emptied at every backward). At the first
``_LOOKED`` backwards of each backward line that follow log-probabilities (``describe_loss``),
the loss's linear top is walked with each term's sign (lossterms.py's ``signed_walk``):

- a product of a graph and a weight without one (a tensor or a number) whose graph side reaches
  a noted log-probability through the linear top (with that part's own sign) is a policy term:
  its sign and its weight;
- a regression loss node between a tensor with gradient (the value) and one without (the
  return), or the square of a difference of such two, is a critic: its ``R - V``, from the
  tensors the node saved; for the regressions torch builds of plain ops (``l1_loss``,
  ``gaussian_nll_loss``), from the input and target ``lossnodes.loss_of`` tagged their top
  node with.

A weight that is ``R - V`` (equal, or correlated 0.98 or more element by element; for weights
that are single numbers, one per term, the same multiset of values) is oriented as a reward; its
negation as a cost. A reward-oriented weight minimised (or a cost-oriented one maximised) makes a
``policy_sign`` aside at the backward, once per backward line. Without a critic in the same
loss, a REINFORCE's returns orient themselves when they are never negative and not one value
(``critic="none"``, ``weight="return"``): minimised, their product with the log-probabilities
lowers the probability of every action taken, the best-rewarded most. Log-probabilities are
also those picked from a ``log_softmax`` along its last axis (``gather``), found in the graph
itself. Nothing is said for a weight that is neither (normalised returns of a REINFORCE without
critic, a baseline subtracted), or for weights symmetric around zero (both orientations fit).

Cost: at the first backwards of each line only: a walk of the loss's
linear top (``_NODES`` nodes), a walk below each product found, and a few small CPU reductions
per pair of a weight and a critic; CPU tensors only (no host sync on a GPU).
"""

from __future__ import annotations

import inspect

import torch
import torch.distributions as D

from .. import events as ev
from .graphpaths import saved
from .inlinable import watched_result
from .lossnodes import loss_of
from .lossterms import PerLine, loss_roots, signed_walk
from .recorder import Recorder

_LOOKED = 3  # backwards of each line looked at
_LINES = 16  # backward lines looked at, at most
_NODES = 512  # nodes of the linear top walked
_BELOW = 64  # nodes walked below a product, to its log-probability
_NOTED = 4096  # log-probability nodes noted at most between two backwards
_AGREE = 0.98  # a weight's correlation with R - V (or with its negation) that orients it
_MAX_VALUES = 1 << 16  # values of a weight or a critic's difference compared at most
_REGRESSIONS = ("MseLossBackward", "SmoothL1LossBackward", "HuberLossBackward", "L1LossBackward")
# the regressions torch builds of plain ops, found by ``loss_of`` on their top node
_COMPOSITE_CRITICS = frozenset({"l1_loss", "gaussian_nll_loss"})


def _distributions() -> list[type]:
    return [value for value in vars(D).values()
            if inspect.isclass(value) and issubclass(value, D.Distribution)
            and "log_prob" in vars(value) and value is not D.Distribution]


def _plain(value) -> torch.Tensor | None:
    """A float CPU copy of a weight or saved tensor without gradient, flattened; None else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor([float(value)], dtype=torch.float64)
    if not isinstance(value, torch.Tensor) or value.requires_grad or value.device.type != "cpu" \
            or not value.is_floating_point() or value.numel() == 0 or value.numel() > _MAX_VALUES:
        return None
    return value.detach().reshape(-1).to(torch.float64)


def _orientation(weights: list, diffs: list) -> float:
    """+1: the weights are the critic's ``R - V``; -1: its negation; 0: neither or both."""
    found = 0.0
    for w in weights:
        for d in diffs:
            o = _paired(w, d)
            if o:
                if found and o != found:
                    return 0.0
                found = o
    if found:
        return found
    # one number per term (``-log_prob * (R - value.item())`` per step, stacked): as multisets
    singles = [w for w in weights if w.numel() == 1]
    targets = [d for d in diffs if d.numel() == 1]
    if len(singles) >= 2 and len(singles) == len(targets):
        return _paired(torch.sort(torch.cat(singles)).values, torch.sort(torch.cat(targets)).values,
                       negated=torch.sort(-torch.cat(targets)).values)
    return 0.0


def _paired(w: torch.Tensor, d: torch.Tensor, negated: torch.Tensor | None = None) -> float:
    if w.numel() != d.numel() or w.numel() < 2:
        return 0.0
    scale = float(d.abs().max())
    if scale == 0.0 or float(w.abs().max()) == 0.0:
        return 0.0
    tol = 1e-5 * scale + 1e-8
    same = bool((w - d).abs().max() <= tol)
    flipped = bool((w - (-d if negated is None else negated)).abs().max() <= tol)
    if same != flipped:
        return 1.0 if same else -1.0
    if same or negated is not None:
        return 0.0  # symmetric around 0: both orientations fit
    ws, ds = w - w.mean(), d - d.mean()
    denom = float(ws.norm() * ds.norm())
    if denom == 0.0:
        return 0.0
    corr = float((ws * ds).sum()) / denom
    return 1.0 if corr >= _AGREE else -1.0 if corr <= -_AGREE else 0.0


def _composite_critic(node) -> tuple[str, torch.Tensor] | None:
    """``(what, R - V)`` for a regression that torch builds of plain ops (``l1_loss``,
    ``gaussian_nll_loss``: ``lossnodes.loss_of``) of a value with gradient on a return without
    one."""
    call = loss_of(node)
    if call is None or call.fn not in _COMPOSITE_CRITICS or call.input_node is None \
            or not isinstance(call.target, torch.Tensor) or call.target.requires_grad:
        return None
    x, y = _plain_any(call.input), _plain_any(call.target)
    if x is None or y is None or x.numel() != y.numel():
        return None
    return call.fn, y - x


def _critic_diff(node, name: str) -> tuple[str, torch.Tensor] | None:
    """``(what, R - V)`` for a regression of a value with gradient on a return without one."""
    if name.startswith(_REGRESSIONS):
        nexts = node.next_functions
        if len(nexts) < 2:
            return None
        self_grad, target_grad = nexts[0][0] is not None, nexts[1][0] is not None
        if self_grad == target_grad:
            return None
        x, y = _plain_any(saved(node, "_saved_self")), _plain_any(saved(node, "_saved_target"))
        if x is None or y is None or x.numel() != y.numel():
            return None
        loss = name.split("Backward")[0]
        what = {"MseLoss": "mse_loss", "SmoothL1Loss": "smooth_l1_loss", "HuberLoss": "huber_loss",
                "L1Loss": "l1_loss"}.get(loss, loss)
        return what, (y - x) if self_grad else (x - y)
    if name == "PowBackward0":
        exponent = saved(node, "_saved_exponent")
        if not isinstance(exponent, (int, float)) or float(exponent) != 2.0:
            return None
        child = node.next_functions[0][0] if node.next_functions else None
        if child is None or type(child).__name__ != "SubBackward0":
            return None
        alpha = saved(child, "_saved_alpha")
        if alpha not in (None, 1, 1.0):
            return None
        a_grad = child.next_functions[0][0] is not None
        b_grad = child.next_functions[1][0] is not None
        if a_grad == b_grad:
            return None
        diff = _plain_any(saved(node, "_saved_self"))
        if diff is None:
            return None
        return "square", (diff if b_grad else -diff)
    return _composite_critic(node)


def picked_log_softmax(node, name: str) -> bool:
    """Whether ``node`` picks entries of a log-softmax's result along its last axis
    (``F.log_softmax(logits, -1).gather(1, actions)``): the log-probabilities of chosen actions."""
    if name != "GatherBackward0" or not node.next_functions:
        return False
    child = node.next_functions[0][0]
    if child is None or type(child).__name__ != "LogSoftmaxBackward0":
        return False
    dim, soft = saved(node, "_saved_dim"), saved(child, "_saved_dim")
    ndim = saved(child, "_saved_result")
    ndim = ndim.dim() if isinstance(ndim, torch.Tensor) else None
    if not isinstance(dim, int) or not isinstance(soft, int) or not ndim:
        return False
    return dim % ndim == soft % ndim == ndim - 1


def _plain_any(value) -> torch.Tensor | None:
    """A saved tensor (with or without gradient: the value, the difference) as a float CPU copy."""
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu" \
            or not value.is_floating_point() or value.numel() == 0 or value.numel() > _MAX_VALUES:
        return None
    return value.detach().reshape(-1).to(torch.float64)


class PolicySignWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._noted: dict = {}  # autograd node of a log_prob result -> its distribution's class
        self._lines = PerLine(_LOOKED, _LINES)
        self._done: set = set()  # backward lines recorded

    def _note(self, dist_cls: str, result) -> None:
        if len(self._noted) < _NOTED and not self._lines.exhausted:
            node = getattr(result, "grad_fn", None)
            if node is not None:
                self._noted[node] = dist_cls

    # -- DESCRIBE_LOSS -----------------------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        # log-probabilities picked from a log_softmax (``gather``) are found in the graph itself,
        # so the first backwards of each line are looked at whatever ``log_prob`` noted
        if self._lines.exhausted:
            self._noted = {}
            return {}
        try:
            loc = self.rec.here()
            if loc not in self._done and self._lines.admit(loc):
                self._judge(tensors, loc)
        except Exception as exc:
            self.rec.internal_error("policy_sign", exc)
        finally:
            self._noted = {}
        return {}

    def _terms_below(self, node) -> dict:
        """``{log_prob node: sign}`` reached from ``node`` through the linear top."""
        found: dict = {}
        noted = self._noted

        def visit(n, sign, name, children) -> bool:
            if n in noted or picked_log_softmax(n, name):
                found[n] = sign if found.get(n, sign) == sign else 0.0
                return True
            return False

        signed_walk(node, _BELOW, visit)
        return {n: s for n, s in found.items() if s}

    def _judge(self, tensors, loc) -> None:
        for root in loss_roots(tensors):
            terms: list = []  # (sign, weight, distribution class)
            diffs: list = []  # (what, R - V)

            def visit(node, sign, name, children) -> bool:
                if name in ("MulBackward0", "MulBackward1") and len(children) == 1:
                    index, child = children[0]
                    weight = saved(node, "_saved_other" if index == 0 else "_saved_self")
                    w = _plain(weight)
                    below = self._terms_below(child) if w is not None else {}
                    if below:
                        signs = set(below.values())
                        if len(signs) == 1:
                            dist = self._noted.get(next(iter(below)), "log_softmax")
                            terms.append((sign * signs.pop(), w, dist))
                        return True
                    return False
                found = _critic_diff(node, name)
                if found is not None:
                    diffs.append(found)
                    return True
                return False

            signed_walk(root, _NODES, visit)
            if terms and not diffs:
                if self._returns_minimised(terms):
                    self._done.add(loc)
                    self.rec.emit_aside(ev.policy_sign(dist=terms[0][2], critic="none",
                                                       weight="return", sign="minimised"), loc)
                    return
                continue
            if not terms:
                continue
            signs = {s for s, _, _ in terms}
            if len(signs) != 1:
                continue
            sign = signs.pop()
            orientation = _orientation([w for _, w, _ in terms], [d for _, d in diffs])
            if orientation == 0.0 or sign * orientation < 0:
                continue  # -log_prob * (R - V), or log_prob * (V - R): the policy improves
            self._done.add(loc)
            self.rec.emit_aside(ev.policy_sign(dist=terms[0][2], critic=diffs[0][0],
                                               weight="advantage" if orientation > 0 else "cost",
                                               sign="minimised" if sign > 0 else "maximised"), loc)
            return

    @staticmethod
    def _returns_minimised(terms: list) -> bool:
        """A REINFORCE without a critic minimised along its returns: every term held with a
        positive sign, its weights never negative, not one value (a scaled log-likelihood), at
        least two of them (a return per action) and some above zero. Returns of both signs
        (a baseline subtracted, standardised returns) orient nothing."""
        if any(sign <= 0 for sign, _, _ in terms):
            return False
        weights = torch.cat([w for _, w, _ in terms])
        if weights.numel() < 2 or bool((weights < 0).any()) or float(weights.max()) <= 0.0:
            return False
        return float(weights.max() - weights.min()) > 1e-6 * float(weights.max())

    # -- install -----------------------------------------------------------------------------
    def install(self, patcher) -> None:
        watcher = self

        for cls in _distributions():
            name = cls.__name__

            def note(result, _name=name) -> None:  # a plain function (inlinable.py)
                watcher._note(_name, result)

            patcher.patch(cls, "log_prob", watched_result(vars(cls)["log_prob"], note))
