"""Loss targets that are one value at every call: labels that carry no information.

``y.long()`` of click-through rates in [0, 1) (all 0), ``(score > 5).float()`` of scores in
[0, 1], ``mask // 255`` of 0/1 masks, a label column that holds one value: the loss is trained
on one answer, the model learns a constant, and the loss still falls.

At the first ``_CALLS`` calls per line (at most ``_LINES`` lines) of the wrapped loss functions
with a gradient (``losses.py``, ``loss_inputs.py`` tell ``loss_call``), a CPU target that needs
no gradient (at most ``_MAX_VALUES`` values) is compared with its first value; a line whose
targets differ is dropped. A line's targets are also looked up among the tensors of the latest
batch of each DataLoader (``BATCH_SERVED``, the first ``SERVED_BATCHES`` batches): a target
that is one of them as served (a label as the loader gives it) is judged on the loader's whole
label tensor where the dataset holds one (a TensorDataset's tensor, torchvision's ``targets``):
a dataset with several labels whose first batches are one class is imbalanced, not broken.

A line is told (``constant_targets`` aside event at the loss call) when its targets have been
one value over ``_MIN_CALLS`` calls and ``_MIN_VALUES`` values (stage "few"), again over
``_MANY_CALLS`` calls and ``_MANY_SAMPLES`` samples (first dimension; stage "many"), and once
more, "varied", if they then differ. The rule weighs the stages: "few" is enough where the
targets are not the loader's labels as served (a conversion made them: ``y.long()``) or the
dataset's whole label tensor is one value; else (a Dataset of the script's own, a slice of a
fixed tensor) a rare class must have had "many" samples to show. Whether the targets are a
constant the script makes (``torch.ones`` for a GAN's real labels, ``torch.zeros(N,
dtype=long)`` for InfoNCE's positives) is read from the source by the rule.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .recorder import Recorder

_CALLS = 16  # calls per loss line looked at
_LINES = 16  # loss lines looked at
_MAX_VALUES = 1 << 20  # values of a target read, at most
_MIN_CALLS, _MIN_VALUES = 4, 64  # "few": enough where the labels were converted
_MANY_CALLS, _MANY_SAMPLES = 8, 512  # "many": enough for a rare class to have shown
_LOADERS = 4  # loaders whose latest batch is kept
_DATASET_VALUES = 1 << 22  # values of a dataset's label tensor read, at most


def one_value(t) -> float | int | bool | None:
    """The single value a CPU tensor holds, or None where it holds several (or none)."""
    flat = t.detach().reshape(-1)
    if flat.numel() == 0:
        return None
    first = flat[0]
    if not bool((flat == first).all()):
        return None
    return first.item()


def _tensors(batch, depth: int = 0) -> list:
    """The tensors of a batch: itself, the items of a tuple or list, the values of a mapping."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if depth > 1:
        return []
    if isinstance(batch, (tuple, list)):
        return [t for item in batch for t in _tensors(item, depth + 1)]
    if isinstance(batch, dict):
        return [t for item in batch.values() for t in _tensors(item, depth + 1)]
    return []


def _same_values(a, b) -> bool:
    if a.numel() != b.numel() or a.device.type != "cpu" or a.is_complex():
        return False
    return bool(torch.equal(a.detach().reshape(-1).to(torch.float64), b.detach().reshape(-1).to(torch.float64)))


def dataset_labels(dataset, served) -> "torch.Tensor | None":
    """The whole label tensor of a dataset whose batches hold ``served`` as they are served: a
    TensorDataset's tensor of that shape and dtype, torchvision's ``targets``; None otherwise."""
    candidates = []
    if isinstance(dataset, torch.utils.data.TensorDataset):
        candidates = list(dataset.tensors)
    else:
        targets = getattr(dataset, "targets", None)
        if isinstance(targets, torch.Tensor):
            candidates = [targets]
        elif isinstance(targets, list) and targets and all(isinstance(v, int) for v in targets[:64]):
            candidates = [torch.as_tensor(targets)]
    for t in candidates:
        if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dtype == served.dtype \
                and tuple(t.shape[1:]) == tuple(served.shape[1:]) and t.numel() <= _DATASET_VALUES:
            return t
    return None


class _Line:
    __slots__ = ("calls", "values", "samples", "value", "basis", "told", "done")

    def __init__(self, value):
        self.calls, self.values, self.samples, self.value = 0, 0, 0, value
        self.basis = "converted"  # until a call's target is a served label that says otherwise
        self.told = 0  # 1: told at "few", 2: at "many"
        self.done = False


class ConstantTargetsWatcher:
    def __init__(self, rec: Recorder, dataloader=None):
        self.rec = rec
        self.dataloader = dataloader  # DataLoaderWatcher: the dataset of a served batch's loader
        self._lines: dict = {}  # call line -> _Line
        self._served: dict = {}  # loader -> the latest batch it served (while open; a few loaders)
        self._calls = 0

    @property
    def open(self) -> bool:
        return self._calls < _CALLS * _LINES

    def served(self, loader: int, epoch: int, index: int, batch) -> None:
        """``BATCH_SERVED``: the batch, kept until its loader's next one (references only;
        loaders read in lockstep each keep theirs)."""
        if not self.open:
            self._served = {}
            return
        self._served.pop(loader, None)
        self._served[loader] = batch
        if len(self._served) > _LOADERS:
            del self._served[next(iter(self._served))]

    def loss_call(self, fn: str, input, target) -> None:
        """A wrapped loss function called with a gradient: its prediction and target."""
        self._calls += 1
        try:
            if not (isinstance(target, torch.Tensor) and target.device.type == "cpu"
                    and not target.requires_grad and 0 < target.numel() <= _MAX_VALUES
                    and not target.is_complex()):
                return
            loc = self.rec.here()
            if loc is None:
                return
            line = self._lines.get(loc)
            if line is not None and line.done:
                return
            with torch.no_grad():
                value = one_value(target)
            if line is None:
                if len(self._lines) >= _LINES:
                    return
                line = self._lines[loc] = _Line(value)
            line.calls += 1
            if value is None or value != line.value:
                line.done = True
                if line.told:
                    self._tell(fn, line, loc, "varied")
                return
            line.values += int(target.numel())
            line.samples += int(target.shape[0]) if target.dim() else 1
            if line.basis != "dataset-varied":
                line.basis = self._basis(target, line.basis)
            if line.basis == "dataset-varied":
                line.done = True  # the dataset holds other labels: imbalanced, not one class
                if line.told:
                    self._tell(fn, line, loc, "varied")
                return
            if line.calls >= _CALLS:
                line.done = True
            if line.told < 1 and line.calls >= _MIN_CALLS and line.values >= _MIN_VALUES:
                line.told = 1
                self._tell(fn, line, loc, "few")
            if line.told < 2 and line.calls >= _MANY_CALLS and line.samples >= _MANY_SAMPLES:
                line.told = 2
                self._tell(fn, line, loc, "many")
        except Exception as exc:
            self._calls = _CALLS * _LINES  # closed
            self.rec.internal_error(f"F.{fn} one-value targets", exc)

    def _tell(self, fn: str, line: "_Line", loc, stage: str) -> None:
        self.rec.emit_aside(ev.constant_targets(fn=fn, value=None if stage == "varied" else line.value,
                                                calls=line.calls, values=line.values,
                                                samples=line.samples, basis=line.basis, stage=stage), loc)

    def _basis(self, target, basis: str) -> str:
        """What this call's target says of where it came from: "converted" (none of the last
        served batch's tensors), "dataset-one"/"dataset-varied" (one of them, and its dataset's
        whole label tensor holds one value / several), "served" (one of them, no dataset label
        tensor to read), "unknown" (no batch served)."""
        if not self._served:
            return "unknown" if basis == "converted" else basis
        loader, match = next(((number, t) for number, batch in reversed(self._served.items())
                              for t in _tensors(batch) if _same_values(t, target)), (None, None))
        if match is None:
            return basis
        dataset = self.dataloader.dataset_of(loader) if self.dataloader is not None else None
        labels = dataset_labels(dataset, match) if dataset is not None else None
        if labels is None:
            return "served"
        with torch.no_grad():
            return "dataset-one" if one_value(labels) is not None else "dataset-varied"
