"""A standard deviation or variance meant per feature across the batch, taken per sample across
the features, and pulled to a target (variance-across-features).

VICReg's variance term, ``relu(1 - sqrt(z.var(dim=0) + eps))``, keeps each embedding dimension
spread out over the batch: a dimension whose std falls under 1 is pushed apart, which is what
stops the embeddings collapsing to one point. Written with ``z.var(dim=1)`` (or
``z.std(dim=-1)``) it measures how spread each *sample's* features are: a collapsed embedding,
the same vector for every sample, satisfies it as long as that one vector has varied entries, so
the term guards nothing and the invariance term collapses the representation. The same hinge
appears in W-MSE, VCReg, and hand-written "variance regularisers"; the shapes agree whichever
axis is reduced.

The invariant, over the loss's graph at the first ``_WINDOWS`` backwards (``DESCRIBE_LOSS``;
the watcher then unsubscribes): a ``VarBackward0`` / ``StdBackward0`` (``var``, ``std``,
``torch.var``, ``torch.std``) that reduced only axis 1 of a 2-D (samples, features) tensor with
a graph, whose axis 0 holds the samples (at least ``_ROWS``, as long as the leading axis of a
tensor without gradient the graph below it read, and the DataLoader's batch when there is one:
softmaxbatch.py's test; a square one too: 64 samples of 64 features), whose result (through an added epsilon and a ``sqrt``) is
shifted by a constant and given to a penalty (``relu``, a clamp, a square, ``abs``) or to a
regression loss against a target (normbatch.py's ``pulled_to_target``).

Silent: the std or variance over the batch (dim 0: VICReg as written); a per-sample std that is
not pulled to a target (a layer norm written by hand, a standardisation, a logged statistic);
a per-sample std of something that is no batch of samples (a weight, a table without data
below it).

Only node names, saved dims and shapes are read: no tensor's values. One ``feature_variance``
aside event per backward line, at that backward; the rule finds the call in the source.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import post_order, saved
from .normbatch import _constant_side, _dims, _name, _out_shape, pulled_to_target
from .losswindow import LossWindow
from .recorder import Recorder
from .softmaxbatch import _BELOW, _data_leading

_WINDOWS = 3  # backwards whose losses are looked at; then the watcher unsubscribes
_NODES = 20000  # graph nodes walked per backward
_ROWS = 4  # samples a batch needs
_LABEL = "variance across the features"
_STATS = {"VarBackward0": "var", "StdBackward0": "std"}


def _std_of(node, parents: dict):
    """The node whose value is the standard deviation made from the variance ``node``
    (``sqrt(var + eps)``), or ``node`` itself when no root follows."""
    current = node
    for _ in range(2):
        ups = parents.get(current, ())
        if len(ups) != 1:
            return current
        up = ups[0]
        name = _name(up)
        if name == "SqrtBackward0":
            return up
        if name.startswith("AddBackward") and _constant_side(up, current):
            current = up
            continue
        return current
    return current


class FeatureVarianceWatcher:
    def __init__(self, rec: Recorder, loader=None):
        self.rec = rec
        self.loader = loader  # the DataLoaderWatcher: ``batch_size()`` of the batch it served last
        self.loss_window = LossWindow(rec, _WINDOWS, self.describe_loss)
        self._told: set = set()

    def install(self, patcher) -> None:  # subscribed at construction
        pass

    def describe_loss(self, tensors) -> dict:
        if not self.loss_window.take():
            return {}
        try:
            self._look(tensors)
        except Exception as exc:
            self.rec.internal_error(_LABEL, exc)
        return {}

    def _loader_batch(self) -> int | None:
        if self.loader is None:
            return None
        try:
            return self.loader.batch_size()
        except Exception:
            return None

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        loader_batch = self._loader_batch()
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            nodes = post_order(root, _NODES)
            stats = [n for n in nodes or () if _name(n) in _STATS]
            if not stats:
                continue
            parents: dict = {}
            for node in nodes:
                for child, _ in node.next_functions:
                    if child is not None:
                        parents.setdefault(child, []).append(node)
            for node in stats:
                child = node.next_functions[0] if node.next_functions else (None, 0)
                shape = _out_shape(*child) if child[0] is not None else None
                if shape is None or len(shape) != 2:
                    continue
                dims = _dims(saved(node, "_saved_dim"), 2)
                if dims != (1,):
                    continue
                batch, features = shape
                if batch < _ROWS or features < 2:
                    continue
                if loader_batch is not None and loader_batch != batch:
                    continue
                penalty = pulled_to_target(_std_of(node, parents), parents)
                if penalty is None or batch not in _data_leading(node, _BELOW):
                    continue
                loc = self.rec.here()
                key = (loc.path, loc.line) if loc is not None else None
                if key in self._told:
                    continue
                self._told.add(key)
                self.rec.emit_aside(ev.feature_variance(fn=_STATS[_name(node)], shape=list(shape),
                                                        penalty=penalty), loc)
