"""A hand-written negative log-likelihood without its minus: the loss rises with the log-probability
of the served labels, so minimising it trains the model away from them.

``logp = F.log_softmax(logits, 1).gather(1, y[:, None])`` and then ``loss = (w * logp).mean()``
(a focal loss's ``(1 - p_t) ** gamma * logp_t``, class weights ``alpha[y] * logp_t``, a plain
``logp.mean()``): every factor is non-negative, the log-probabilities are at most 0, so the loss
is at most 0 and falls as the right class's probability falls. Nothing fails; the printed loss
goes down (it runs to minus infinity) while accuracy drops to chance. torch's own losses are
``loss-maximised``'s other half (``-F.cross_entropy``); this is the same mistake written by hand.

How it is seen: at the first ``_WINDOWS`` backwards (``DESCRIBE_LOSS``), the loss's linear top is
walked with its sign (means, sums, views, negations, sums and differences of terms, products and
quotients whose other operand is all of one sign) down to a pick of log-probabilities: a
``gather``/advanced index of a ``log_softmax`` (or the ``log`` of such a pick of a ``softmax``).
A pick reached with a positive sign only, whose index holds the labels of the batch a DataLoader
served last (equal integer values, one per pick), is kept: the labels make it a supervised
likelihood, where a policy gradient picks sampled actions and may minimise a cost's
log-probability on purpose. A pick reached with both signs anywhere in the loss leaves the loss
out (a contrast of a positive and a negative pick). One ``loglik_minimised`` aside event per
backward line, at the backward; each kept pick's index is compared once (a small equality test).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .. import events as ev
from .graphpaths import saved
from .losswindow import LossWindow
from .recorder import Recorder
from .topics import BATCH_SERVED

_WINDOWS = 3  # backwards whose losses are looked at
_NODES = 64  # nodes of the linear top walked per backward
_REDUCTIONS = {"MeanBackward0", "MeanBackward1", "SumBackward0", "SumBackward1"}
_VIEWS = {"SqueezeBackward0", "SqueezeBackward1", "SqueezeBackward2", "SqueezeBackward3",
          "SqueezeBackward4", "UnsqueezeBackward0", "ViewBackward0", "ReshapeAliasBackward0",
          "UnsafeViewBackward0", "CloneBackward0", "ToCopyBackward0"}
_PICKS = {"GatherBackward0", "IndexBackward0"}


def _children(node) -> list:
    return [(i, child) for i, (child, _n) in enumerate(node.next_functions) if child is not None]


def _sign_of(value) -> int:
    """+1 for a tensor (or number) all >= 0 and not all 0, -1 for all <= 0 and not all 0, 0 else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return 1 if value > 0 else -1 if value < 0 else 0
    if not isinstance(value, torch.Tensor) or value.numel() == 0 or value.is_complex():
        return 0
    with torch.no_grad():
        low, high = float(value.min()), float(value.max())
    if low >= 0 and high > 0:
        return 1
    if high <= 0 and low < 0:
        return -1
    return 0


def _below_views(node):
    for _ in range(6):
        if node is None or type(node).__name__ not in _VIEWS:
            return node
        children = _children(node)
        if len(children) != 1:
            return None
        node = children[0][1]
    return node


def _pick_of_log_probs(node):
    """``node``'s index tensor when it picks entries of log-probabilities: a gather or an
    advanced index of a ``log_softmax`` output, or the ``log`` of such a pick of a ``softmax``."""
    name = type(node).__name__
    want = "LogSoftmaxBackward0"
    if name == "LogBackward0":
        children = _children(node)
        if len(children) != 1:
            return None
        node = _below_views(children[0][1])
        name = type(node).__name__ if node is not None else ""
        want = "SoftmaxBackward0"
    if name not in _PICKS:
        return None
    children = _children(node)
    if len(children) != 1 or type(_below_views(children[0][1])).__name__ != want:
        return None
    if name == "GatherBackward0":
        index = saved(node, "_saved_index")
    else:
        indices = saved(node, "_saved_indices")
        if not isinstance(indices, (tuple, list)):
            return None
        ints = [i for i in indices if isinstance(i, torch.Tensor) and not i.is_floating_point()
                and i.dtype != torch.bool]
        index = ints[-1] if ints else None
    return index if isinstance(index, torch.Tensor) else None


def signed_picks(root, limit: int = _NODES) -> list[tuple[int, torch.Tensor]]:
    """The picks of log-probabilities on the loss's linear top, each with the sign the loss
    grows with it (+1: the loss rises with the log-probability); [] when the walk meets a term
    it cannot sign before any pick."""
    found: list[tuple[int, torch.Tensor]] = []
    stack = [(root, 1)]
    seen = 0
    while stack and seen < limit:
        node, sign = stack.pop()
        seen += 1
        if node is None:
            continue
        name = type(node).__name__
        if name in _REDUCTIONS or name in _VIEWS:
            stack.extend((child, sign) for _i, child in _children(node))
        elif name == "NegBackward0":
            stack.extend((child, -sign) for _i, child in _children(node))
        elif name in ("AddBackward0", "SubBackward0"):
            alpha = saved(node, "_saved_alpha", 1)
            if type(alpha) not in (int, float):
                continue
            for index, child in _children(node):
                coefficient = 1 if index == 0 else (-alpha if name == "SubBackward0" else alpha)
                if coefficient:
                    stack.append((child, sign if coefficient > 0 else -sign))
        elif name == "MulBackward0":
            for index, child in _children(node):
                factor = _sign_of(saved(node, "_saved_other" if index == 0 else "_saved_self"))
                if factor:
                    stack.append((child, sign * factor))
        elif name == "DivBackward0":
            children = _children(node)
            if children and children[0][0] == 0:
                factor = _sign_of(saved(node, "_saved_other"))
                if factor:
                    stack.append((children[0][1], sign * factor))
        else:
            index = _pick_of_log_probs(node)
            if index is not None:
                found.append((sign, index))
    return found


def _integer_tensors(batch, depth: int = 0):
    if isinstance(batch, torch.Tensor):
        if not batch.is_floating_point() and batch.dtype != torch.bool and not batch.is_complex():
            yield batch
    elif depth < 2 and isinstance(batch, (tuple, list)):
        for item in batch:
            yield from _integer_tensors(item, depth + 1)
    elif depth < 2 and isinstance(batch, Mapping):
        for item in batch.values():
            yield from _integer_tensors(item, depth + 1)


def holds_labels(index: torch.Tensor, batch) -> bool:
    """Whether ``index`` holds the values of an integer tensor of ``batch`` (one pick per label)."""
    if index.device.type != "cpu":
        return False
    for labels in _integer_tensors(batch):
        if labels.device.type == "cpu" and labels.numel() == index.numel() and labels.numel() >= 2:
            with torch.no_grad():
                if torch.equal(labels.reshape(-1).to(index.dtype), index.reshape(-1)):
                    return True
    return False


class LogLikelihoodSignWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        # retired from DESCRIBE_LOSS and BATCH_SERVED once the window closes: nothing per step
        self.loss_window = LossWindow(rec, _WINDOWS, describer=self.describe_loss, on_reopen=self._reopen)
        self._batches: dict[int, object] = {}  # loader -> its latest batch (references, while open)
        self._told: set = set()

    def install(self, patcher) -> None:  # subscribed at construction
        pass

    def _reopen(self) -> None:
        self.rec.resume(BATCH_SERVED, self.served)

    def served(self, loader: int, epoch: int, index: int, batch) -> None:
        """``BATCH_SERVED``: the latest batch of each loader, kept while the window is open."""
        self._batches.pop(loader, None)
        self._batches[loader] = batch
        if len(self._batches) > 4:
            del self._batches[next(iter(self._batches))]

    def describe_loss(self, tensors) -> dict:
        if not self.loss_window.take():
            return {}
        try:
            self._look(tensors)
        except Exception as exc:
            self.rec.internal_error("log-likelihood sign", exc)
        if self.loss_window.closed:
            self._batches.clear()  # no batch held past the window
            self.rec.retire(BATCH_SERVED, self.served)
        return {}

    def _look(self, tensors) -> None:
        if not self._batches:
            return
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            picks = signed_picks(root)
            if not picks or any(sign < 0 for sign, _index in picks):
                continue
            batches = list(self._batches.values())
            if not any(holds_labels(index, batch) for _sign, index in picks for batch in batches):
                continue
            loc = self.rec.here()
            key = (loc.path, loc.line) if loc is not None else None
            if key in self._told:
                continue
            self._told.add(key)
            self.rec.emit_aside(ev.loglik_minimised(picks=len(picks)), loc)
