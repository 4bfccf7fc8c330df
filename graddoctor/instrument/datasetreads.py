"""What a map-style dataset's ``__getitem__`` does to the arrays it holds, seen at the
DataLoader's fetches (in-process loaders only: a worker's fetch reads its own copy).

The arrays a dataset holds are the tensors and NumPy arrays among its attributes (one level
into a tuple or list, as ``TensorDataset.tensors``) with at least as many rows as the dataset
has samples; a ``Subset``'s fetch is followed to the dataset under it, its indices mapped.

Two facts, each on the first fetches only:

- **Drift** (``dataset_drift``): around each of the first ``DRIFT_FETCHES`` fetches of a
  dataset, the rows of each held array at the fetched indices are copied before and compared
  after. A row that changed during the fetch of an index the dataset had already served
  changes at every read: an augmentation applied in place to a view of the stored data
  (``x = self.data[i]; x.add_(noise)``), so the data drifts further every epoch. A cache
  filled once (a row written at its first read only) changes nothing at a second read; 1-D
  integer arrays (a read counter, a flag) are bookkeeping, not looked at.
- **Label offset** (``label_offset``): on the first ``LABEL_FETCHES`` batched fetches, each
  field of the collated batch is compared with each held array's rows at the fetched indices
  shifted by ``-2..2``. A field equal to one array at every index + k (k != 0, and not at the
  index itself) while another field equals another array of as many rows at the index itself
  pairs every input with another row's label. Not recorded when the label table has another
  number of rows (it is indexed by something else: 1-based ids), when another field reads it
  at the index itself (the shifted read is a negative pair's other sample, on purpose), nor
  when the inputs' table has an order (row i + 1 nearer row i than a row half the table away:
  a time series whose next value is the target on purpose). A ``TensorDataset`` whose tensors
  are row slices of two tables of as many rows taken at different starts (``TensorDataset(x[:n],
  y[k:k + n])``, the inputs' table without order) is recorded at its first batched fetch, at the
  line that made it (``TensorDataset.__init__`` wrapped: one location lookup per dataset).

Costs: one copy of the fetched rows of each held array per looked-at fetch, a few gathers
per batched fetch for the offsets; nothing after ``DRIFT_FETCHES`` fetches of a dataset.
Nothing draws random numbers or changes what the fetch returns.
"""

from __future__ import annotations

import sys
import weakref

import torch
from torch.utils.data import Subset, TensorDataset
from torch.utils.data._utils import fetch as _fetch

from .. import events as ev
from ..trace import Location
from .recorder import Recorder

DRIFT_FETCHES = 64  # fetches of one dataset whose rows are compared before and after
LABEL_FETCHES = 8  # batched fetches of one dataset whose fields are compared with its arrays
ROW_ELEMENTS = 1 << 20  # most elements of one array's fetched rows copied at one fetch
OFFSETS = (-2, -1, 1, 2)
MIN_SAMPLES = 16  # samples a label offset must hold over
MIN_DISTINCT = 4  # of them, rows whose label at the offset differs from their own
ORDER_ROWS = 256  # rows of the inputs' table read to tell whether it has an order
MADE_KEPT = 64  # TensorDatasets whose line of construction is kept
ORDERED = 0.8  # consecutive rows nearer than this share of distant rows' distance: ordered


class _Seen:
    """What is known of one dataset."""

    __slots__ = ("fetches", "served", "drifted", "labels_done", "label_fetches", "matches", "ref")

    def __init__(self, dataset) -> None:
        self.fetches = 0
        self.served: set[int] = set()
        self.drifted: set[str] = set()  # arrays already reported
        self.labels_done = False
        self.label_fetches = 0
        # (field, attr, k) -> [every sample matched so far, samples, rows whose k-shifted row differs]
        self.matches: dict[tuple, list] = {}
        try:
            self.ref = weakref.ref(dataset)
        except TypeError:
            self.ref = None


class DatasetReadWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._seen: dict[int, _Seen] = {}  # id(dataset) -> what is known of it
        # id of a dataset a fetcher reads (a Subset included) -> a weak reference to it, once
        # nothing more is looked at for it: its later fetches cost one dict lookup
        self._over: dict[int, object] = {}
        # id of a TensorDataset -> (a weak reference to it, the script's line that made it)
        self._made: dict[int, tuple] = {}

    def install(self, patcher) -> None:
        Fetcher = _fetch._MapDatasetFetcher
        patcher.patch(Fetcher, "fetch", self._wrap_fetch(Fetcher.fetch))
        patcher.patch(TensorDataset, "__init__", self._wrap_tensor_dataset(TensorDataset.__init__))

    def _wrap_tensor_dataset(self, original):
        """Where the script makes each TensorDataset: a pair of row slices at different starts
        (``TensorDataset(x[:n], y[k:k + n])``) is reported there."""
        watcher = self

        def __init__(dataset, *tensors):
            original(dataset, *tensors)
            try:
                if len(watcher._made) < MADE_KEPT:
                    loc = watcher.rec.here()
                    if loc is not None:
                        watcher._made[id(dataset)] = (weakref.ref(dataset), loc)
            except Exception as exc:
                watcher.rec.internal_error("TensorDataset.__init__", exc)

        __init__.__wrapped__ = original
        return __init__

    def _wrap_fetch(self, original):
        watcher = self

        def fetch(fetcher, possibly_batched_index):
            looked = None
            try:
                looked = watcher._before(fetcher, possibly_batched_index)
            except Exception as exc:
                watcher.rec.internal_error("dataset fetch (before)", exc)
            data = original(fetcher, possibly_batched_index)
            if looked is not None:
                try:
                    watcher._after(looked, data)
                except Exception as exc:
                    watcher.rec.internal_error("dataset fetch (after)", exc)
            return data

        fetch.__wrapped__ = original
        return fetch

    # -- before the fetch: the rows it may read ------------------------------------------
    def _before(self, fetcher, index):
        dataset = outer = fetcher.dataset
        over = self._over.get(id(outer))
        if over is not None and over() is outer:
            return None
        batched = bool(fetcher.auto_collation)
        indices = list(index) if batched else [index]
        if not indices or not all(type(i) is int for i in indices):
            return None
        while isinstance(dataset, Subset):  # a random_split's part: the rows under it
            indices = [int(dataset.indices[i]) for i in indices]
            dataset = dataset.dataset
        seen = self._seen.get(id(dataset))
        if seen is not None and (seen.ref is None or seen.ref() is not dataset):
            seen = None
        if seen is None:
            seen = self._seen[id(dataset)] = _Seen(dataset)
        labels = batched and not seen.labels_done and seen.label_fetches < LABEL_FETCHES \
            and len(indices) >= 2
        if seen.fetches >= DRIFT_FETCHES and not labels:
            if seen.labels_done or seen.label_fetches >= LABEL_FETCHES or not batched:
                try:
                    self._over[id(outer)] = weakref.ref(outer)
                except TypeError:
                    pass
            return None
        try:
            n = len(dataset)
        except Exception:
            return None
        arrays = _held_arrays(dataset, n)
        if not arrays:
            return None
        before = []
        if seen.fetches < DRIFT_FETCHES:
            seen.fetches += 1
            revisits = [i in seen.served for i in indices]
            seen.served.update(indices)
            if any(revisits):
                for attr, array in arrays:
                    if attr in seen.drifted or not _data_like(array):
                        continue
                    rows = _rows(array, indices)
                    if rows is not None:
                        before.append((attr, array, rows))
        else:
            revisits = []
        return dataset, seen, indices, revisits, before, arrays if labels else None

    # -- after it: rows changed, fields against the arrays -------------------------------
    def _after(self, looked, data) -> None:
        dataset, seen, indices, revisits, before, arrays = looked
        for attr, array, rows in before:
            now = _rows(array, indices)
            if now is None:
                continue
            changed = _changed(rows, now)
            count = sum(1 for c, again in zip(changed, revisits) if c and again)
            if count:
                seen.drifted.add(attr)
                self.rec.emit_aside(ev.dataset_drift(
                    cls=type(dataset).__name__, attr=attr,
                    numpy=not isinstance(array, torch.Tensor),
                    rows=count, fetches=seen.fetches), self._getitem_loc(dataset))
        if arrays is not None:
            seen.label_fetches += 1
            self._offsets(dataset, seen, indices, arrays, data)

    def _offsets(self, dataset, seen, indices, arrays, data) -> None:
        fields = _fields(data, len(indices))
        if len(fields) < 2:
            seen.labels_done = True
            return
        if seen.label_fetches == 1 and self._sliced_apart(dataset, seen, arrays, len(indices)):
            return
        with torch.no_grad():
            shifted = {}  # (attr, k) -> the array's rows at index + k, one row per sample
            for attr, array in arrays:
                n = int(array.shape[0])
                for k in (0, *OFFSETS):
                    rows = _rows(array, [(i + k) % n for i in indices])
                    if rows is not None:
                        shifted[attr, k] = _as_matrix(rows, len(indices))
            for key, field in fields:
                if field.numel() > ROW_ELEMENTS:
                    continue  # no array's rows of that size were gathered either
                flat = field.reshape(len(indices), -1)
                if flat.is_complex():
                    continue
                flat = flat.to(torch.float64)
                for (attr, k), rows in shifted.items():
                    if rows is None or rows.shape[1] != flat.shape[1]:
                        continue
                    entry = seen.matches.setdefault((key, attr, k), [True, 0, 0])
                    if not entry[0]:
                        continue
                    equal = bool((flat == rows).all())
                    entry[0] = equal
                    entry[1] += len(indices)
                    if k and equal and shifted.get((attr, 0)) is not None:
                        entry[2] += int((rows != shifted[attr, 0]).any(1).sum())
        found = self._offset_found(seen, dict(arrays))
        if found is not None:
            seen.labels_done = True
            key, inputs, labels, k, samples = found
            self.rec.emit_aside(ev.label_offset(cls=type(dataset).__name__, inputs=inputs,
                                                labels=labels, offset=k, samples=samples,
                                                field=key), self._getitem_loc(dataset))

    def _sliced_apart(self, dataset, seen, arrays, samples: int) -> bool:
        """A TensorDataset made of row slices of two tables of as many rows, the inputs' table
        without order, taken at different starts (``TensorDataset(x[:n], y[k:k + n])``): row i
        of the inputs is paired with the label of row i + k. Reported where it was made."""
        made = self._made.get(id(dataset))
        if made is None or made[0]() is not dataset:
            return False
        starts = [(attr, array, *found) for attr, array in arrays
                  if (found := _row_slice(array)) is not None]
        for i, (inputs, x, x_base, x_start) in enumerate(starts):
            for labels, y, y_base, y_start in starts[i + 1:]:
                if x_start == y_start or x.shape[0] != y.shape[0] \
                        or x_base.shape[0] != y_base.shape[0] or _share_memory(x_base, y_base):
                    continue  # the same rows, another pairing, or one table (a series' next value)
                if _ordered(x_base):
                    continue  # a series: a later row's value may be the target on purpose
                seen.labels_done = True
                self.rec.emit_aside(ev.label_offset(
                    cls=type(dataset).__name__, inputs=inputs, labels=labels,
                    offset=y_start - x_start, samples=samples, field=None,
                    sliced=[int(x.shape[0]), x_start, y_start]), made[1])
                return True
        return False

    def _offset_found(self, seen, arrays: dict):
        matches = seen.matches
        for (key, attr, k), (ok, samples, distinct) in matches.items():
            if not (k and ok and samples >= MIN_SAMPLES and distinct >= MIN_DISTINCT):
                continue
            if any(ok0 and attr0 == attr and not k0 and samples0 >= MIN_SAMPLES
                   for (_, attr0, k0), (ok0, samples0, _) in matches.items()):
                continue  # the table is also read at the index itself: the shift is on purpose
                # (a negative pair's other sample)
            for (other, inputs, k0), (ok0, samples0, _) in matches.items():
                if k0 or other == key or inputs == attr or not ok0 or samples0 < MIN_SAMPLES:
                    continue
                if _share_memory(arrays.get(inputs), arrays.get(attr)) \
                        or arrays[inputs].shape[0] != arrays[attr].shape[0]:
                    continue  # one table, or a label table indexed by something else (an id)
                if _ordered(arrays.get(inputs)):
                    continue  # a series: the next row's value may be the target on purpose
                return key, inputs, attr, k, samples
        return None

    def _getitem_loc(self, dataset) -> Location | None:
        """The dataset's ``__getitem__`` in the user's code (None when it is a library's)."""
        method = getattr(type(dataset), "__getitem__", None)
        code = getattr(method, "__code__", None)
        finder = self.rec.finder
        if code is None or not finder.is_user_file(code.co_filename):
            return None
        return Location(finder.display_path(code.co_filename), code.co_firstlineno, "__getitem__")


def _numpy():
    return sys.modules.get("numpy")


def _row_slice(array):
    """``(its table, the row it starts at)`` when the array is a slice of the rows of a larger
    table (``x[k:k + n]``: the table's other axes and row stride), else None."""
    if isinstance(array, torch.Tensor):
        base = array._base
        if not isinstance(base, torch.Tensor) or base.dim() != array.dim() \
                or tuple(base.shape[1:]) != tuple(array.shape[1:]) \
                or base.stride() != array.stride() or base.shape[0] <= array.shape[0]:
            return None
        step = array.stride(0) if array.dim() else 0
        moved = array.storage_offset() - base.storage_offset()
    else:
        base = getattr(array, "base", None)
        np = _numpy()
        if np is None or not isinstance(base, np.ndarray) or base.ndim != array.ndim \
                or base.shape[1:] != array.shape[1:] or base.strides != array.strides \
                or base.shape[0] <= array.shape[0]:
            return None
        step = array.strides[0]
        moved = array.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    if step <= 0 or moved % step:
        return None
    return base, moved // step


def _is_array(value) -> bool:
    if isinstance(value, torch.Tensor):
        return (value.device.type == "cpu" and value.layout is torch.strided and value.dim() >= 1
                and not value.is_quantized)
    np = _numpy()
    return (np is not None and isinstance(value, np.ndarray) and value.ndim >= 1
            and value.dtype.kind in "biuf")


def _data_like(array) -> bool:
    """Samples' values rather than bookkeeping: floating point, or rows of more than one
    value (an image of bytes); a 1-D integer array (a read counter, a flag) is not looked at."""
    if isinstance(array, torch.Tensor):
        return array.is_floating_point() or array.dim() >= 2
    return array.dtype.kind == "f" or array.ndim >= 2


def _held_arrays(dataset, n: int) -> list:
    """``[(attr, array)]``: the dataset's tensors and NumPy arrays with at least ``n`` rows."""
    try:
        attributes = vars(dataset)
    except TypeError:
        return []
    found = []
    for name, value in list(attributes.items()):
        if _is_array(value):
            if value.shape[0] >= n > 0:
                found.append((name, value))
        elif isinstance(value, (tuple, list)) and 0 < len(value) <= 8:
            for j, item in enumerate(value):
                if _is_array(item) and item.shape[0] >= n > 0:
                    found.append((f"{name}[{j}]", item))
    return found


def _rows(array, indices: list):
    """A copy of the array's rows at ``indices`` (in range), or None when too large."""
    n = int(array.shape[0])
    if not all(-n <= i < n for i in indices):
        return None
    per_row = 1
    for size in array.shape[1:]:
        per_row *= int(size)
    if per_row * len(indices) > ROW_ELEMENTS:
        return None
    if isinstance(array, torch.Tensor):
        with torch.no_grad():
            return array.detach()[torch.tensor(indices, dtype=torch.long)].clone()
    return array[indices].copy()


def _changed(before, now) -> list[bool]:
    """Per row: whether its values differ (NaN equal to NaN)."""
    if isinstance(before, torch.Tensor):
        with torch.no_grad():
            differ = before != now
            if before.is_floating_point() or before.is_complex():
                differ &= ~(before.isnan() & now.isnan())
            return differ.reshape(len(before), -1).any(1).tolist()
    np = _numpy()
    differ = before != now
    if before.dtype.kind in "fc":
        differ &= ~(np.isnan(before) & np.isnan(now))
    return differ.reshape(len(before), -1).any(1).tolist()


def _as_matrix(rows, count: int):
    """Rows as a float64 ``(count, -1)`` tensor."""
    if not isinstance(rows, torch.Tensor):
        rows = torch.from_numpy(rows)
    if rows.is_complex():
        return None
    return rows.reshape(count, -1).to(torch.float64)


def _fields(data, count: int) -> list:
    """``[(key, tensor)]``: the collated batch's CPU tensors with one row per sample."""
    if isinstance(data, torch.Tensor):
        items = [(None, data)]
    elif isinstance(data, (tuple, list)):
        items = list(enumerate(data))
    elif isinstance(data, dict):
        items = [(k, v) for k, v in data.items() if isinstance(k, (str, int))]
    else:
        return []
    return [(key, value) for key, value in items
            if isinstance(value, torch.Tensor) and value.device.type == "cpu"
            and value.layout is torch.strided and value.dim() >= 1 and value.shape[0] == count]


def _share_memory(a, b) -> bool:
    if a is None or b is None:
        return True
    if a is b:
        return True
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    np = _numpy()
    if np is not None and isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.shares_memory(a, b))
    return False


def _ordered(array) -> bool:
    """Whether consecutive rows of the table lie nearer each other than rows half the table
    apart (a time series, rows sorted by a value): its order means something."""
    if array is None:
        return True
    m = min(int(array.shape[0]), ORDER_ROWS)
    if m < 4:
        return True
    head = array[:m]
    if not isinstance(head, torch.Tensor):
        head = torch.from_numpy(head.copy())
    with torch.no_grad():
        rows = head.detach().reshape(m, -1).to(torch.float64)
        near = (rows[1:] - rows[:-1]).norm(dim=1).mean()
        far = (rows - rows.roll(m // 2, 0)).norm(dim=1).mean()
    return bool(far == 0 or near < ORDERED * far)
