"""Whether the model's inputs and the loss's targets come from the same DataLoader batch, in
the same order (labels of another batch, inputs permuted without their labels), and whether a
recurrent summary is read at a padding step.

A DataLoader yields ``(x_i, y_i)``: the rows of ``x_i`` and the labels of ``y_i`` belong
together. Two families of silent bugs break that pairing after the loader:

* **Labels of another batch.** The loss's target is the labels of a batch served earlier
  (``x0, y0 = next(iter(loader))`` kept from before the loop with ``for x, _ in loader``; a label
  variable read one turn late), while the model gets this turn's inputs.
* **Inputs permuted without their labels.** The model gets the rows of the batch in another
  order (``x = x[torch.randperm(len(x))]``) while the loss's target keeps the loader's order.

Both are read from values, on the first turns only (``WINDOW`` backwards), and on the first turns
of a later training phase (``LossWindow``: an optimizer given parameters after the window closed;
the module hooks are registered again then, never after torch.compile or an internal error),
CPU tensors only:

* ``BATCH_SERVED``: for the first ``SERVED`` batches the loaders serve, each tensor of the batch
  whose first dimension is the batch's gets a fingerprint per row (a weighted sum and a sum of
  at most ``_COLUMNS`` evenly spaced values of the row, in float64, so that ``x.float()``,
  ``x.view(B, -1)`` read the same) and one of the whole tensor (its values in order).
* Global module forward hooks (removed with the window) note the tensors the outermost module
  call of each turn is given that need no gradient (the data): their rows are looked up among
  the batches' rows. All of them in one batch's tensor, in the loader's order or permuted, say
  where the model's inputs came from; inputs made of other values (normalised, augmented, mixed)
  say nothing, and nothing is judged.
* At each backward of the window (``DESCRIBE_LOSS``), the loss's graph is walked from its root
  (a few hundred nodes at most, stopping at the model's output) for the loss nodes that save
  their target (``nll_loss`` and ``cross_entropy`` with class indices, ``mse_loss``,
  ``smooth_l1_loss``, ``huber_loss``, ``binary_cross_entropy[_with_logits]``); each target that
  needs no gradient and is not one value repeated (a GAN's real/fake labels) is looked up among
  the batches' whole-tensor fingerprints.

The verdicts (``batch_pairing`` aside event at the model's call, once per kind):

* "other-batch": the target equals no tensor of the batches the model's inputs came from in this
  turn, but a tensor of another batch of the same loader (or of another loader's batch served
  in an earlier turn: two loaders read in lockstep serve theirs in one turn). Inputs and targets
  fetched ahead (a prefetcher: the next batch served before this one's loss) pair the batch the
  inputs came from and say nothing.
* "permuted": the model's inputs are all the rows of one batch in another order, the target is
  one of that batch's tensors in the loader's order, and nothing between the model's output and
  the loss reorders rows (an index or gather: a batch sorted by length and put back).
* "labels-permuted": the reverse. The model's inputs are the rows of one batch in the loader's
  order (every input found is), and the target is one of that batch's tensors with its rows in
  another order: the same rows, compared as a multiset of row prints, of at least three distinct
  values (a 0/1 label vector in another order cannot be told from ``1 - y`` or a balanced
  relabelling), and nothing between the model's output and the loss reorders rows.

A model input that is no batch's rows is also tried as a *mixup* of a batch's rows: the row
prints are linear in the row's values, so ``lam * x + (1 - lam) * x[perm]`` shows as each
input print ``q_i`` lying on the segment from ``p_i`` to another ``p_j`` at one shared fraction
(float batch tensors of at least two values a row and at most ``_MIX_ROWS`` rows; an O(rows²)
comparison of two numbers a pair, first turns only). At the backward, a loss whose only saved
target is that batch's labels in the loader's order means the partner rows' labels never reach
it: "mixup_unmixed" at the model's call (mixup-labels-unmixed). Two targets (``y`` and
``y[perm]``), mixed soft targets (nothing saved) and a 0.5 average (SamplePairing keeps the
first label on purpose) say nothing.

The same hooks note, for the third check, each batch-first recurrent layer (RNN, LSTM, GRU)
whose input is right-padded in at least half its rows: trailing runs of padding steps of
different lengths, (nearly) none inside the rows (``padded_rows``), a step being padding when it
is all zeros (``pad_sequence`` of features, an embedding's ``padding_idx`` row) or, for an
embedding without ``padding_idx`` that fed it, the id most rows end with (``filled_rows``). At
the backward, a ``SelectBackward`` node of position T - 1 of dim 1 right above that layer's
output in the loss's graph (``out[:, -1]``) is recorded: "last_step_padded" at the layer's call
(last-step-is-padding). Left padding, ``pack_padded_sequence`` with the final hidden state, a
gather at ``lengths - 1`` and sequences of one length say nothing.

A recurrent layer run on a ``PackedSequence`` is noted too (its packed output's ``grad_fn`` and
the input's ``batch_sizes``: how many rows are still running at each step). The padded tensor
``pad_packed_sequence`` makes of it holds the padding value (zeros) past each row's length, so a
``SelectBackward`` of the last position of that tensor's time axis (``out[:, -1]`` batch-first,
``out[-1]`` seq-first) reads padding for every row shorter than the longest (all rows, with a
``total_length`` past the longest). The select's input is followed down through the nodes
``pad_packed_sequence`` leaves on CPU (its ``index_select`` back to the unsorted order, the
transpose of ``batch_first``, the ``CopySlices`` of each step's rows out of the packed data)
and through a transpose or clone the script adds, to the noted packed output; the time axis
is told by the number of (0, 1) transposes on the way. Reported as "last_step_padded" with
``packed`` when at least half the rows (and two) are shorter.

Skipped, silently: tensors not on the CPU, threads other than the script's, batches of fewer
than ``_MIN_ROWS`` rows, torch.compile (the window closes before it runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from threading import get_ident

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from .. import events as ev
from .dependency import close_before_compile, register_module_hooks
from .graphpaths import saved
from .graphpaths import signed as _signed
from .losswindow import LossWindow
from .recorder import Recorder

WINDOW = 8  # backwards judged, from the first one
SERVED = 32  # loader batches fingerprinted at most
_COLUMNS = 64  # values of a row read, evenly spaced
_FIELDS = 6  # tensors of one batch fingerprinted at most
_INPUTS = 4  # tensors of one model call looked up at most
_MIN_ROWS = 4
_MAX_ROWS = 4096
_FOUND = 0.9  # share of an input's rows that must be found in one batch tensor
_NODES = 400  # graph nodes walked from a loss's root at most
_DIGITS = 10  # significant digits a fingerprint is compared at
_RECURRENT = 8  # recurrent outputs noted per turn at most
_LAYOUT = 64  # nodes between a select and a packed output walked at most (pad_packed_sequence's)
_CALLS = 8  # model calls whose inputs were found, kept per turn at most (their outputs' graphs)
_SEEN = 64  # data tensors looked up per turn at most
_MIX_ROWS = 512  # batches of at most this many rows are looked at for a mixup of their rows
_KINDS = 5  # verdicts told at most once each: permuted, labels-permuted, other-batch, mixup, last-step

# loss nodes that save their target (``_saved_target``), and the function named for each
_TARGET_NODES = (("NllLoss", "cross_entropy"), ("MseLoss", "mse_loss"),
                 ("SmoothL1Loss", "smooth_l1_loss"), ("HuberLoss", "huber_loss"),
                 ("BinaryCrossEntropyWithLogits", "binary_cross_entropy_with_logits"),
                 ("BinaryCrossEntropy", "binary_cross_entropy"))
# torch's loss modules (`nn.MSELoss()`): called outermost with the batch's targets, they would
# read as a model given that batch, and their output (the loss) would end the walk for targets
_LOSS_MODULES = (nn.modules.loss._Loss,)
# nodes that reorder or select rows between the model's output and the loss
_REORDER = ("Index", "Gather", "Take", "Scatter", "Sort", "MaskedSelect")


def _fp(values) -> tuple:
    """A float64 tensor's values, rounded, as a hashable key."""
    return tuple(float(f"{v:.{_DIGITS}g}") for v in values.tolist())


def _row_prints(t: torch.Tensor) -> list | None:
    """One key per row of ``t`` (first dimension): (weighted sum, sum) of at most ``_COLUMNS``
    evenly spaced values, in float64; None for a tensor that cannot be read so."""
    if t.layout is not torch.strided or t.is_complex() or t.is_quantized or t.dtype is torch.bool:
        return None
    rows = int(t.shape[0])
    flat = t.detach().reshape(rows, -1)
    cols = int(flat.shape[1])
    if cols == 0:
        return None
    if cols > _COLUMNS:
        flat = flat[:, :: cols // _COLUMNS][:, :_COLUMNS]
    f = flat.to(torch.float64)
    w = torch.arange(1, f.shape[1] + 1, dtype=torch.float64)
    both = torch.stack([(f * w).sum(1), f.sum(1)], 1)
    keys = [tuple(float(f"{v:.{_DIGITS}g}") for v in pair) for pair in both.tolist()]
    return keys


def _whole_print(t: torch.Tensor) -> tuple | None:
    """(numel, weighted sum, sum) of a tensor's values in order, in float64; None for one value
    repeated (a GAN's labels), an empty tensor or one that cannot be read so."""
    if t.layout is not torch.strided or t.is_complex() or t.is_quantized or t.numel() < _MIN_ROWS:
        return None
    f = t.detach().reshape(-1).to(torch.float64)
    if bool((f == f[0]).all()):
        return None
    w = torch.arange(1, f.numel() + 1, dtype=torch.float64)
    return (int(f.numel()),) + _fp(torch.stack([(f * w).sum(), f.sum()]))


def _multiset_print(t: torch.Tensor) -> tuple | None:
    """(rows, hash of the sorted row prints): the same for a tensor and its rows in any order;
    None for a tensor of fewer than three distinct rows (its order is not told from a relabelling)."""
    keys = _row_prints(t)
    if keys is None or len(set(keys)) < 3:
        return None
    return (len(keys), hash(tuple(sorted(keys))))


def _tensors(batch, prefix: str = "", depth: int = 0) -> list:
    """``[(name, tensor)]`` of a batch: a tensor, or those in a tuple, list or mapping (nested
    at most twice)."""
    if isinstance(batch, torch.Tensor):
        return [(prefix or "batch", batch)]
    if depth >= 2:
        return []
    if isinstance(batch, (tuple, list)):
        items = [(f"{prefix}[{i}]", v) for i, v in enumerate(batch)]
    elif isinstance(batch, Mapping):
        items = [(f"{prefix}[{k!r}]", v) for k, v in list(batch.items())[:16]]
    else:
        return []
    out = []
    for name, value in items:
        out += _tensors(value, name, depth + 1)
        if len(out) >= _FIELDS:
            break
    return out[:_FIELDS]


class _Batch:
    __slots__ = ("key", "turn", "rows", "fields", "wholes", "prints")

    def __init__(self, key: tuple, turn: int, rows: int):
        self.key, self.turn, self.rows = key, turn, rows
        self.fields: list[str] = []
        self.wholes: set = set()  # whole-tensor prints of its tensors
        self.prints: dict[str, torch.Tensor] = {}  # float field -> its row prints, (rows, 2)


class BatchPairWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.active = False
        self._handles: list = []
        self._patcher = None
        self._served = 0
        self._backwards = 0  # backwards judged in all: the turn a served batch belongs to
        self._ended = False  # torch.compile ran or the watcher failed: never reopened
        self.loss_window = LossWindow(rec, WINDOW, on_reopen=self._reopen)
        self._batches: list[_Batch] = []
        self._rows: dict[tuple, list] = {}  # row print -> [(batch, field, row)]
        self._wholes: dict[tuple, list] = {}  # whole print -> [(batch, field)]
        self._multisets: dict[tuple, list] = {}  # multiset print -> [(batch, field)]
        self._seen_ids: dict[int, object] = {}  # tensors looked up this turn (id -> tensor)
        # this turn's model calls whose inputs were found: (batch, order: "same" | "permuted",
        # output tensor, Location)
        self._inputs: list[tuple] = []
        # this turn's calls of torch's loss modules: (their tensor arguments' storages, Location),
        # where a target of another batch is named (the line to change)
        self._loss_calls: list[tuple] = []
        self._told: set[str] = set()
        # this turn's batch-first recurrent outputs over right-padded input:
        # (grad_fn, module class, rows, length, padded rows, Location)
        self._recurrent: list[tuple] = []
        # this turn's recurrent layers run on a PackedSequence:
        # (packed output's grad_fn, module class, rows, batch_sizes, Location)
        self._packed: list[tuple] = []
        self._filled: dict[tuple, int] = {}  # (rows, length) of filled-up id batches -> padded rows

    # -- the window -------------------------------------------------------------------------
    def _stop(self) -> None:
        self.active = False
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._batches, self._rows, self._wholes, self._multisets = [], {}, {}, {}
        self._seen_ids, self._inputs, self._loss_calls = {}, [], []
        self._recurrent, self._packed, self._filled = [], [], {}

    # -- BATCH_SERVED ------------------------------------------------------------------------
    def served(self, loader: int, epoch: int, index: int, batch) -> None:
        if not self.active or self._served >= SERVED or get_ident() != self.rec.script_thread:
            return
        try:
            self._served += 1
            tensors = [(n, t) for n, t in _tensors(batch) if t.dim() >= 1 and t.device.type == "cpu"
                       and not t.requires_grad]
            if not tensors:
                return
            rows = int(tensors[0][1].shape[0])
            if not _MIN_ROWS <= rows <= _MAX_ROWS:
                return
            entry = _Batch((loader, epoch, index), self._backwards, rows)
            with torch.no_grad():
                for name, t in tensors:
                    if int(t.shape[0]) != rows:
                        continue
                    entry.fields.append(name)
                    whole = _whole_print(t)
                    if whole is not None:
                        entry.wholes.add(whole)
                        self._wholes.setdefault(whole, []).append((entry, name))
                        if t.dim() == 1 or t.dim() == 2 and int(t.shape[1]) <= _COLUMNS:
                            rows_any_order = _multiset_print(t)
                            if rows_any_order is not None:
                                self._multisets.setdefault(rows_any_order, []).append((entry, name))
                    if t.dim() >= 2 or t.is_floating_point():
                        keys = _row_prints(t)
                        if keys is not None and len(set(keys)) == rows:  # rows told apart
                            for r, k in enumerate(keys):
                                self._rows.setdefault(k, []).append((entry, name, r))
                            if t.is_floating_point() and rows <= _MIX_ROWS and t[0].numel() >= 2:
                                entry.prints[name] = torch.tensor(keys, dtype=torch.float64)
            self._batches.append(entry)
        except Exception as exc:
            self._fail()
            self.rec.internal_error("batch pairing (batch)", exc)

    # -- module hooks: the model's inputs ----------------------------------------------------
    def _post_layer(self, module, args, *rest):
        """A recurrent layer's or an embedding's call, at any depth."""
        if not self.active or get_ident() != self.rec.script_thread:
            return None
        try:
            kwargs, output = rest if len(rest) == 2 else ({}, None)
            if not (torch.is_grad_enabled() and getattr(module, "training", False)):
                return None
            if len(self._recurrent) < _RECURRENT:
                self._sequence(module, args, kwargs, output)
            if isinstance(module, nn.RNNBase) and args and isinstance(args[0], PackedSequence) \
                    and len(self._packed) < _RECURRENT:
                self._packed_sequence(module, args[0], output)
        except Exception as exc:
            self._fail()
            self.rec.internal_error("batch pairing (forward)", exc)
        return None

    def _post(self, module, args, *rest):
        """An outermost module call (the model's): its inputs looked up in the served batches."""
        if not self.active or get_ident() != self.rec.script_thread:
            return None
        try:
            kwargs, output = rest if len(rest) == 2 else ({}, None)
            if not (torch.is_grad_enabled() and getattr(module, "training", False)):
                return None
            if not self._rows or len(self._inputs) >= _CALLS:
                return None
            if isinstance(module, _LOSS_MODULES):  # `criterion(preds, targets)`: no model
                if len(self._loss_calls) < _CALLS:
                    self._loss_calls.append(({_storage(t) for t in args if isinstance(t, torch.Tensor)},
                                             self.rec.here()))
                return None
            values = list(args) + list(kwargs.values() if isinstance(kwargs, Mapping) else ())
            looked = 0
            for t in values:
                if not isinstance(t, torch.Tensor) or t.requires_grad or t.dim() < 1 \
                        or t.device.type != "cpu" or not _MIN_ROWS <= int(t.shape[0]) <= _MAX_ROWS:
                    continue
                if self._seen_ids.get(id(t)) is t or len(self._seen_ids) >= _SEEN:
                    continue
                self._seen_ids[id(t)] = t
                looked += 1
                found = self._find(t)
                if found is None and t.is_floating_point() and "mixup" not in self._told:
                    found = self._mixed(t)
                if found is not None:
                    out = output[0] if isinstance(output, (tuple, list)) and output else output
                    out = getattr(out, "logits", out)
                    self._inputs.append((*found, out if isinstance(out, torch.Tensor) else None,
                                         self.rec.here()))
                    break
                if looked >= _INPUTS:
                    break
        except Exception as exc:
            self._fail()
            self.rec.internal_error("batch pairing (forward)", exc)
        return None

    def _sequence(self, module, args, kwargs, output) -> None:
        """A batch-first recurrent layer's output noted when most rows of its input end in
        padding (zeros: ``pad_sequence`` of features, or an embedding's ``padding_idx`` row; or
        the ids of an embedding without one, filled up with one id); an embedding's filled-up
        ids noted for the layer that follows."""
        data = args[0] if args else (kwargs.get("input") if isinstance(kwargs, Mapping) else None)
        if not isinstance(data, torch.Tensor) or data.device.type != "cpu" or data.dim() < 2:
            return
        if isinstance(module, nn.Embedding):
            if module.padding_idx is None and data.dim() == 2 and not data.is_floating_point():
                with torch.no_grad():
                    padded = filled_rows(data)
                if padded:
                    self._filled[tuple(data.shape)] = padded
            return
        out = output[0] if isinstance(output, (tuple, list)) and output else output
        if not (module.batch_first and data.dim() == 3 and isinstance(out, torch.Tensor)
                and out.dim() == 3 and out.grad_fn is not None):
            return
        rows, length = int(data.shape[0]), int(data.shape[1])
        if rows < _MIN_ROWS or length < 2:
            return
        with torch.no_grad():
            padded = padded_rows((data == 0).all(2))
        padded = padded or self._filled.get((rows, length), 0)
        if padded >= max(2, rows / 2):
            self._recurrent.append((out.grad_fn, type(module).__name__, rows, length, padded,
                                    self.rec.here()))

    def _packed_sequence(self, module, packed: PackedSequence, output) -> None:
        """A recurrent layer run on a PackedSequence noted with its packed output's grad_fn and
        how many rows run at each step (``batch_sizes``, a CPU tensor of the input)."""
        out = output[0] if isinstance(output, (tuple, list)) and output else None
        if not isinstance(out, PackedSequence) or out.data.grad_fn is None:
            return
        sizes = packed.batch_sizes
        if not isinstance(sizes, torch.Tensor) or sizes.device.type != "cpu" or sizes.numel() < 1:
            return
        steps = [int(v) for v in sizes.tolist()]
        if steps[0] < _MIN_ROWS:
            return
        self._packed.append((out.data.grad_fn, type(module).__name__, steps, self.rec.here()))

    def _find(self, t: torch.Tensor):
        """``(batch, "same" | "permuted")`` when the rows of ``t`` are all the rows of one batch
        tensor, else None."""
        with torch.no_grad():
            keys = _row_prints(t)
        if keys is None:
            return None
        rows = len(keys)
        votes: dict = {}
        for r, k in enumerate(keys):
            for entry, name, at in self._rows.get(k, ()):
                votes.setdefault((id(entry), name), [entry, name, {}])[2][r] = at
        best = max(votes.values(), key=lambda v: len(v[2]), default=None)
        if best is None or len(best[2]) < _FOUND * rows:
            return None
        entry, _, at = best
        if rows != entry.rows or len(at) != rows or len(set(at.values())) != rows:
            return None  # a part of the batch, or rows repeated: the order says nothing
        same = all(at[r] == r for r in range(rows))
        return entry, "same" if same else "permuted"

    def _mixed(self, t: torch.Tensor):
        """``(batch, "mixed", lam)`` when each row of ``t`` is ``lam * x[i] + (1 - lam) * x[j]``
        of one batch tensor ``x`` (row i in the loader's order, j another row, one ``lam`` for
        all rows: mixup's ``lam * x + (1 - lam) * x[perm]``), else None. The row prints are
        linear in the row's values, so the mix shows in them: ``q_i - p_i`` is ``(1 - lam)``
        times ``p_j - p_i``."""
        rows = int(t.shape[0])
        candidates = [(e, n, p) for e in self._batches for n, p in e.prints.items() if e.rows == rows]
        if not candidates or rows > _MIX_ROWS:
            return None
        with torch.no_grad():
            keys = _row_prints(t)
            if keys is None:
                return None
            q = torch.tensor(keys, dtype=torch.float64)
            for entry, _, p in reversed(candidates[-4:]):
                d = q - p  # (rows, 2): q_i - p_i
                e = p[None, :, :] - p[:, None, :]  # [i, j]: p_j - p_i
                norm = (e * e).sum(2)
                c = (d[:, None, :] * e).sum(2) / norm.clamp_min(1e-300)
                residual = (d[:, None, :] - c[..., None] * e).norm(dim=2)
                scale = p.abs().amax(1).clamp_min(1e-12)[:, None] + q.abs().amax(1)[:, None]
                fits = (residual <= 1e-6 * scale) & (norm > 0) & (c > 0.02) & (c < 0.98)
                same = d.norm(dim=1) <= 1e-9 * scale[:, 0]  # a row mixed with itself
                have = fits.any(1)
                if int(have.sum()) < max(_MIN_ROWS, _FOUND * rows - int(same.sum())):
                    continue
                picked = torch.where(fits, c, torch.full_like(c, float("nan")))[have]
                lams = [1 - float(v[~v.isnan()][0]) for v in picked]
                lam = sorted(lams)[len(lams) // 2]
                if sum(abs(x - lam) <= 1e-4 for x in lams) >= _FOUND * len(lams) \
                        and abs(lam - 0.5) > 1e-3:  # 0.5: SamplePairing keeps the first label
                    return entry, "mixed", round(lam, 4)
        return None

    # -- DESCRIBE_LOSS: the targets ----------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        if not self.active:
            return {}
        try:
            self._backwards += 1
            self.loss_window.take()
            inputs, self._inputs = self._inputs, []
            loss_calls, self._loss_calls = self._loss_calls, []
            recurrent, self._recurrent = self._recurrent, []
            packed, self._packed = self._packed, []
            self._seen_ids, self._filled = {}, {}
            if recurrent and "last-step" not in self._told:
                for root in _roots(tensors):
                    self._last_step(root, recurrent)
            if packed and "last-step" not in self._told:
                for root in _roots(tensors):
                    self._packed_last_step(root, packed)
            if inputs and self._wholes:
                for root in _roots(tensors):
                    self._judge(root, inputs, loss_calls)
            if self.loss_window.closed or len(self._told) >= _KINDS:
                self._stop()
        except Exception as exc:
            self._fail()
            self.rec.internal_error("batch pairing", exc)
        return {}

    def _judge(self, root, inputs, loss_calls=()) -> None:
        outs = {id(o.grad_fn): o for *_, o, _ in inputs if o is not None and o.grad_fn is not None}
        targets, reordered = _targets(root, outs)
        mixed = [i for i in inputs if i[1] == "mixed"]
        inputs = [i for i in inputs if i[1] != "mixed"]
        if mixed and "mixup" not in self._told:
            self._unmixed(mixed[0], targets)
        if not inputs:
            return
        prints, target_of = [], {}
        for fn, target in targets:
            if target.device.type != "cpu" or target.requires_grad:
                continue
            with torch.no_grad():
                whole = _whole_print(target)
            if whole is not None:
                prints.append((fn, whole, _storage(target)))
                target_of[_storage(target)] = target
        for fn, whole, storage in prints:
            ours = [(entry, order, loc) for entry, order, *_, loc in inputs]
            if any(whole in entry.wholes for entry, _, _ in ours):
                permuted = next(((e, loc) for e, order, loc in ours
                                 if order == "permuted" and whole in e.wholes), None)
                # the same labels in another order are a target too (a mixup whose lam drew
                # ~0, so its inputs are the permuted rows to float precision): followed
                relabelled = any(other[0] == whole[0] and other[2] == whole[2] and other[1] != whole[1]
                                 for _, other, _ in prints)
                if (permuted is not None and not reordered and not relabelled
                        and "permuted" not in self._told):
                    entry, loc = permuted
                    field = next(n for b, n in self._wholes[whole] if b is entry)
                    self._tell("permuted", fn, entry, entry, field, loc)
                continue
            if (not reordered and "labels-permuted" not in self._told and ours
                    and all(order == "same" for _, order, _ in ours)):
                if self._labels_permuted(fn, target_of[storage], ours, prints, loss_calls, storage):
                    continue
            earlier = [(b, n) for b, n in self._wholes.get(whole, ())
                       if all(_apart(b, e) for e, _, _ in ours)]
            if earlier and "other-batch" not in self._told:
                entry, order, loc = ours[-1]
                # the loss module's call given that target, where one was: the line that names it
                at = next((at for storages, at in loss_calls if storage in storages), None)
                self._tell("other-batch", fn, entry, earlier[-1][0], earlier[-1][1], at or loc,
                           model_line=loc.line if at is not None and loc is not None else None)

    def _labels_permuted(self, fn, target, ours, prints, loss_calls, storage) -> bool:
        """Tell "labels-permuted" when ``target`` holds the rows of a field of the batch the
        model's inputs came from (in the loader's order) in another order, and no other target
        of the loss is that field as served (mixup's ``y`` beside ``y[perm]``)."""
        if target.dim() not in (1, 2) or target.dim() == 2 and int(target.shape[1]) > _COLUMNS:
            return False
        with torch.no_grad():
            rows_any_order = _multiset_print(target)
        inputs = {id(entry): (entry, loc) for entry, _, loc in ours}
        found = next(((b, n) for b, n in self._multisets.get(rows_any_order, ())
                      if id(b) in inputs), None) if rows_any_order is not None else None
        if found is None:
            return False
        entry, field = found
        if any(w in entry.wholes for _, w, _ in prints):
            return False  # the labels as served reach the loss too
        loc = inputs[id(entry)][1]
        at = next((at for storages, at in loss_calls if storage in storages), None)
        self._tell("labels-permuted", fn, entry, entry, field, at or loc,
                   model_line=loc.line if at is not None and loc is not None else None)
        return True

    def _unmixed(self, mixed, targets) -> None:
        """A ``mixup_unmixed`` aside when the model's inputs are a mixup of a batch's rows and
        the loss's one target is that batch's labels in the loader's order: the partner rows'
        labels (``y[perm]``) never reach the loss."""
        entry, _, lam, _, loc = mixed
        wholes = []
        for fn, target in targets:
            if target.device.type != "cpu" or target.requires_grad:
                return
            with torch.no_grad():
                wholes.append((fn, _whole_print(target)))
        if len(wholes) != 1 or wholes[0][1] is None or wholes[0][1] not in entry.wholes:
            return  # two targets (y and y[perm]), soft targets (none saved), or other labels
        fn, whole = wholes[0]
        field = next(n for b, n in self._wholes[whole] if b is entry)
        self._told.add("mixup")
        self.rec.emit_aside(ev.mixup_unmixed(fn=fn, loader=entry.key[0], batch=list(entry.key[1:]),
                                             field=field, rows=entry.rows, lam=lam), loc)

    def _last_step(self, root, recurrent) -> None:
        """A ``last_step_padded`` aside when the loss's graph reads position T - 1 of a noted
        recurrent output (``out[:, -1]``): for most rows a padding step."""
        by_node = {node: entry for node, *entry in recurrent}
        seen, level = set(), [root]
        while level and len(seen) < _NODES:
            following = []
            for node in level:
                if node is None or node in seen:
                    continue
                seen.add(node)
                if type(node).__name__.startswith("SelectBackward"):
                    child = node.next_functions[0][0]
                    entry = by_node.get(child)
                    if entry is not None and _last_index(node, entry[2]):
                        name, rows, length, padded, loc = entry
                        self._told.add("last-step")
                        self.rec.emit_aside(ev.last_step_padded(module=name, rows=rows, length=length,
                                                                padded=padded), loc)
                        return
                following.extend(c for c, _ in node.next_functions if c is not None)
            level = following

    def _packed_last_step(self, root, packed) -> None:
        """A ``last_step_padded`` aside (``packed``) when the loss's graph selects the last
        position of the time axis of ``pad_packed_sequence``'s output of a noted packed layer and
        most rows are shorter than that: their row there is the padding value."""
        by_node = {node: entry for node, *entry in packed}
        seen, level = set(), [root]
        while level and len(seen) < _NODES:
            following = []
            for node in level:
                if node is None or node in seen:
                    continue
                seen.add(node)
                if type(node).__name__.startswith("SelectBackward"):
                    found = _select_of_padded(node, by_node)
                    if found is not None:
                        (name, steps, loc), length, time = found
                        rows = steps[0]
                        running = steps[length - 1] if length <= len(steps) else 0
                        padded = rows - running
                        if padded >= max(2, rows / 2):
                            self._told.add("last-step")
                            self.rec.emit_aside(ev.last_step_padded(
                                module=name, rows=rows, length=length, padded=padded, packed=True,
                                time_dim=time), loc)
                            return
                following.extend(c for c, _ in node.next_functions if c is not None)
            level = following

    def _tell(self, problem: str, fn: str, inputs: _Batch, labels: _Batch, field: str, loc,
              model_line: int | None = None) -> None:
        self._told.add(problem)
        self.rec.emit_aside(ev.batch_pairing(
            problem=problem, fn=fn, loader=inputs.key[0], input_batch=list(inputs.key[1:]),
            target_loader=labels.key[0], target_batch=list(labels.key[1:]), field=field,
            rows=inputs.rows, model_line=model_line), loc)

    # -- install -----------------------------------------------------------------------------
    def _fail(self) -> None:
        self._ended = True
        self._stop()

    def _before_compile(self) -> None:
        self._ended = True
        if self.active:
            self._stop()

    def install(self, patcher) -> None:
        close_before_compile(patcher, self._before_compile)
        self._patcher = patcher
        self._open()

    def _open(self) -> None:
        # the layers' hooks first: an outermost RNN's call is read as a layer, then as the model
        self._handles = register_module_hooks(self._patcher, None, self._post_layer,
                                              classes=(nn.RNNBase, nn.Embedding)) + \
            register_module_hooks(self._patcher, None, self._post, outermost=True)
        self.active = True

    def _reopen(self) -> None:
        """A later phase (an optimizer given parameters after the window closed): its first
        batches are fingerprinted and its first turns judged too, unless torch.compile ran (it
        warns about global module hooks) or every kind was told."""
        if self.active or self._ended or self._patcher is None or len(self._told) >= _KINDS:
            return
        try:
            self._served = 0
            self._open()
        except Exception as exc:
            self._fail()
            self.rec.internal_error("batch pairing (reopen)", exc)


def _last_index(node, length: int) -> bool:
    """Whether a SelectBackward node took position ``length - 1`` of dimension 1."""
    dim, index = int(node._saved_dim), int(node._saved_index)
    dim, index = (dim - 2 ** 64 if dim >= 2 ** 63 else dim), (index - 2 ** 64 if index >= 2 ** 63 else index)
    return dim == 1 and index in (-1, length - 1)


# nodes a tensor's values go through unchanged in place between pad_packed_sequence's padded
# output and a select of it: index_select back to the unsorted order, transposes, clones
_KEEP = ("IndexSelectBackward", "TransposeBackward", "CloneBackward")
# nodes pad_packed_sequence's padded output is made of on CPU: each step's rows copied in
_PADDING_COPY = ("CopySlices", "ViewBackward", "SliceBackward")


def _select_of_padded(select, by_node: dict):
    """``(entry, length, time axis)`` when ``select`` (a SelectBackward node) takes the last position of
    the time axis of a padded tensor ``pad_packed_sequence`` made of a noted packed output
    (``entry`` its note: module class, batch_sizes, Location; ``length`` that axis's size), else
    None. The time axis is 0 for the padded tensor as made, 1 after an odd number of (0, 1)
    transposes (``batch_first`` makes one)."""
    dim, index = _signed(int(select._saved_dim)), _signed(int(select._saved_index))
    sizes = tuple(select._saved_self_sym_sizes)
    if len(sizes) != 3:
        return None
    dim %= 3
    node = select.next_functions[0][0]
    flips = 0
    for _ in range(8):
        name = type(node).__name__ if node is not None else ""
        if not name.startswith(_KEEP):
            break
        if name.startswith("TransposeBackward"):
            pair = {_signed(int(node._saved_dim0)) % 3, _signed(int(node._saved_dim1)) % 3}
            if pair != {0, 1}:
                return None
            flips += 1
        elif name.startswith("IndexSelectBackward") and _signed(int(node._saved_dim)) % 3 == 2:
            return None  # features picked, not rows
        node = node.next_functions[0][0]
    if node is None or not type(node).__name__.startswith("CopySlices"):
        return None
    time = flips % 2
    if dim != time or index not in (-1, sizes[time] - 1):
        return None
    seen, stack = set(), [node]
    while stack and len(seen) < _LAYOUT:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        entry = by_node.get(node)
        if entry is not None:
            name, steps, loc = entry
            if steps[0] != sizes[1 - time] or sizes[time] < len(steps):
                return None
            return entry, sizes[time], time
        if type(node).__name__.startswith(_PADDING_COPY):
            stack.extend(c for c, _ in node.next_functions if c is not None)
    return None


def filled_rows(ids: torch.Tensor) -> int:
    """How many rows of a (batch, length) id batch end in a filler: the id most rows end with
    (see ``padded_rows``); 0 when there is none."""
    if ids.shape[0] < _MIN_ROWS:
        return 0
    return padded_rows(ids == int(ids[:, -1].mode().values))


def padded_rows(pad: torch.Tensor) -> int:
    """How many rows of a (batch, length) mask of padding steps end in padding, when the batch is
    right-padded: at least half the rows end in a run of it, the runs of different lengths, no
    row all padding, and padding (nearly) absent before the runs; else 0."""
    rows, length = pad.shape
    if rows < _MIN_ROWS or length < 4:
        return 0
    runs = pad.flip(1).int().cumprod(1).sum(1)
    ending = runs > 0
    if int(ending.sum()) < max(2, rows / 2) or int(runs.max()) >= length:
        return 0
    if int(runs[ending].min()) == int(runs[ending].max()):
        return 0  # one run length for all: a fixed end token or step, not a filler
    content = rows * length - int(runs.sum())
    if int(pad.sum()) - int(runs.sum()) > 0.02 * content:
        return 0  # padding steps inside the rows too: sparse data, not a filler
    return int(ending.sum())


def _storage(tensor) -> tuple:
    """A tensor's memory and layout: the loss node's saved target is another tensor object
    over the memory the loss module was given."""
    return tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride())


def _apart(labels: _Batch, inputs: _Batch) -> bool:
    """Whether a target from batch ``labels`` cannot pair the inputs of batch ``inputs``:
    another batch of the same loader, or a batch of another loader served in an earlier turn
    (two loaders read in lockstep serve their batches in one turn)."""
    if labels.key[0] == inputs.key[0]:
        return labels.key != inputs.key
    return labels.turn < inputs.turn


def _roots(tensors) -> list:
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    try:
        return [t.grad_fn for t in tensors if isinstance(t, torch.Tensor) and t.grad_fn is not None][:4]
    except TypeError:
        return []


def _targets(root, outs: dict) -> tuple[list, bool]:
    """``([(fn, target)], reordered)``: the saved targets of the loss nodes within ``_NODES``
    nodes of ``root`` (not below the model outputs ``outs``: ids of their grad_fns), and whether
    a node that reorders rows lies on the way."""
    found, reordered = [], False
    seen, stack = set(), [root]
    while stack and len(seen) < _NODES:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if id(node) in outs:
            continue
        name = type(node).__name__
        for prefix, fn in _TARGET_NODES:
            if name.startswith(prefix) and name[len(prefix):].startswith("Backward"):
                try:
                    target = saved(node, "_saved_target")
                except RuntimeError:  # freed by an earlier backward: torch reports that itself
                    target = None
                if isinstance(target, torch.Tensor):
                    found.append((fn, target))
                break
        else:
            if name.startswith(_REORDER):
                reordered = True
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return found, reordered
