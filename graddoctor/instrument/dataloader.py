"""DataLoader epochs: every ``iter(loader)`` starts an epoch, and a replay's epochs are short.

Bugs live at epoch boundaries (an accumulation window that leaks into the next epoch,
validation that leaves eval mode on), so the replay makes each epoch of a sized DataLoader at
most ``epoch_batches`` batches long — in ``__iter__`` *and* ``__len__``, so that a script that
sizes its schedule or flushes its accumulation tail with ``len(loader)`` stays consistent (the
first such shortened ``len()`` of each loader is recorded, ``short_len``, so that a script that
fails on it, ``assert len(loader) % k == 0``, is told why) —
and keeps the replay going past the step budget until a training loader has begun its third
epoch (two boundaries crossed), bounded by ``2 * epoch_batches + 1`` steps.

The default length, 17, is the smallest one that no common accumulation factor
(2, 3, 4, 5, 6, 8, 10, 16) divides *and* that is larger than all of them: a per-epoch
``(i + 1) % k == 0`` loop then leaves a partial window at every epoch end (so a leaking tail
shows), and still steps at least once per epoch even with k = 16 (with 7, k = 8, 10, 16 would
never step at all). A plain loop reaches its third epoch after 35 steps.

Each backward is tagged with the batch it came from: ``batch = [loader, epoch, index]`` of the
batch most recently served by any DataLoader.

A loader that never shuffles (a ``SequentialSampler``) has the labels of its first epoch's first
``LABEL_BATCHES`` batches read (``batch_labels``: how many distinct labels each holds; CPU label
tensors only, one small ``unique`` per batch): data sorted by class, served in order, gives
batches of a single class (unshuffled-sorted-data). Nothing is read for a shuffling loader.

Two shuffling loaders read in lockstep for one backward (``zip(x_loader, y_loader)``) are
compared once: over datasets of one length, each drawing its own random order, and one of them
serving bare integer labels, the inputs and their labels no longer match
(``loaders_zipped``; loaders-shuffled-apart). Each set of loaders read together is compared
once (a few sets at most); until then each batch costs a dict write.

The first ``SERVED_BATCHES`` batches the loaders serve are handed, as yielded, to
``BATCH_SERVED``'s subscribers (instrument/batchpairs.py: inputs and labels of one batch); then
that costs one integer test per batch. An optimizer given parameters after they ran out (a later
training phase, ``PARAMS_ADDED``) hands its first ``SERVED_BATCHES`` too, at most
``losswindow.REOPENS`` times a run, as the loss windows reopen.

Which rows of which dataset each loader serves is noted once, at its first ``iter()``: its
dataset followed through ``Subset``s (a ``random_split``'s parts) and a ``SubsetRandomSampler``
to the dataset under them, and the indices of that base it can serve. A loader that serves
part of its base, or shares rows with an earlier loader over the same base that serves part
of it, gets a ``loader_rows`` event with the rows it shares with each such loader (two loaders
over the whole of one dataset share nothing here: no split was made) (a train and a validation
set that overlap: trains-on-evaluation-data); at most ``ROWS_KEPT`` indices are kept per loader.
Loaders over different datasets are compared by value: the rows of each one's input tensor (a
``TensorDataset``'s, or a tensor attribute of the script's own dataset, one row per sample, of
many distinct values; up to ``PRINT_ROWS`` rows) are hashed once, at its first ``iter()``, and
rows found in an earlier loader's dataset are ``copied`` rows (a split whose index sets overlap).

In a process group (a rank of a distributed run), the first ``PRINT_BATCHES`` batches that
feed a backward get a fingerprint (``batch_fingerprint``): a position-weighted sum of evenly
spaced elements of the batch's first tensor, taken when the loader yields it (before the script
changes anything in place), as a ``Deferred`` device scalar (no host sync). Rank 0 compares
the ranks' fingerprints when it merges their reports (ranks-same-batches: every rank trains on
the same samples). Nothing is computed once those batches are done, nor without a process group.
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Mapping

import torch.utils.data
from torch.utils.data.dataloader import _BaseDataLoaderIter

from .. import events as ev
from .identities import Identities
from .planned import framework_plan, planned
from .recorder import Deferred, Recorder
from .losswindow import REOPENS
from .topics import BATCH_SERVED, BUDGET_HOLD, EPOCH_BEGUN, PARAMS_ADDED

# the default length (see above); --epoch-batches' default in the option table (options.py) is
# the same number, checked by tests/test_config.py
DEFAULT_EPOCH_BATCHES = 17

_STATE = "_graddoctor_epoch"  # attribute on the iterator: (loader, epoch, limit | None)

# batch fingerprints (see above): how many batches that feed a backward, the most batches of
# any loader fingerprinted in all (those of loaders that feed no backward included), and the
# most elements of a batch's tensor read
PRINT_BATCHES = 3
PRINT_CAP = 32
PRINT_ELEMENTS = 1 << 16

SERVED_BATCHES = 32  # batches handed to BATCH_SERVED's subscribers, in all (instrument/batchpairs.py)
_ZIP_CHECKS = 8  # sets of loaders read together that are compared, at most
LABEL_BATCHES = 8  # batches of an unshuffled loader's first epoch whose labels are read
_LABEL_KEYS = ("label", "labels", "target", "targets", "y")
ROWS_KEPT = 1 << 20  # indices of its base kept per loader (loader_rows), at most
PRINT_ROWS = 1 << 16  # input rows of a dataset hashed to find copies in another, at most
PRINT_ELEMENTS = 1 << 24  # ... and their elements, at most
_COPIED_ROWS, _COPIED_SHARE = 3, 0.05  # copied rows that count: at least 3 and 5% of the smaller


class DataLoaderWatcher:
    def __init__(self, rec: Recorder, epoch_batches: int = DEFAULT_EPOCH_BATCHES):
        self.rec = rec
        self.epoch_batches = max(0, int(epoch_batches or 0))  # 0: real epochs
        self._loader_id = Identities()  # loader -> its number
        self._epochs: dict[int, int] = {}  # loader number -> epochs started
        self._training: set[int] = set()  # loaders whose batches reached a backward
        self._shortened = False
        self._short_len_read: set[int] = set()  # loaders whose shortened len() the script read
        self.current_batch: list | None = None
        self._original_len = None  # DataLoader.__len__ before patching: the real length
        self._described: set[int] = set()  # loaders whose sampler a loader_sampler event told
        self._datasets: dict[int, weakref.ref] = {}  # loader number -> its dataset (dataset_of)
        # loader number -> the class of the sampler that draws its batches' samples at random
        # (None: in order, or not known), noted at its first iter()
        self._drawing: dict[int, str | None] = {}
        self._sampler_locs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # sampler -> loc
        # loader number -> (batch_size, samples per epoch or None) at its latest iter(): what
        # ``batch_size`` reads, also once a loader made in the ``for`` statement is gone
        self._batching: dict[int, tuple[int, int | None]] = {}
        # batch fingerprints: open until PRINT_BATCHES batches fed a backward or PRINT_CAP
        # fingerprints were computed
        self.printing = True
        self._batches_fed = 0  # batches that fed a backward so far (counted while printing)
        self._last_fed: list | None = None  # the latest of them
        self._computed = 0  # fingerprints computed
        self._loader_locs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loader -> loc
        self._print_about: dict[int, tuple] = {}  # loader number -> (loc, sampler, replicas)
        self._pending: tuple | None = None  # ([loader, epoch, index], fingerprint) of the last batch
        # unshuffled loaders whose first batches' labels are read: number -> (loc, classes)
        self._in_order: dict[int, tuple] = {}
        # zipped loaders: each loader's own random order, number -> (dataset length, loc);
        # the batches served since the last backward, number -> (index, bare labels?)
        self._own_order: dict[int, tuple] = {}
        self._served: dict[int, tuple] = {}
        self._zip_checked: set[frozenset] = set()  # sets of loaders read together, compared
        self._zip_done = False  # found, or _ZIP_CHECKS sets compared
        rec.subscribe(BUDGET_HOLD, self._hold)
        self._on_served = rec.subscribers(BATCH_SERVED)
        self._on_epoch = rec.subscribers(EPOCH_BEGUN)
        self._announce = SERVED_BATCHES  # batches still handed to them
        self._announced_again = 0  # later phases given SERVED_BATCHES more
        rec.subscribe(PARAMS_ADDED, self._params_added)
        # the rows each loader serves: loader number -> (its base's number, frozenset of the
        # base's indices, or None for all of them), for loader_rows
        self._dataset_id = Identities()
        self._rows: dict[int, tuple] = {}
        # the input rows' values each loader serves, hashed: number -> (base, frozenset)
        self._prints: dict[int, tuple] = {}
        # Subset or SubsetRandomSampler -> the line that made it
        self._subset_locs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    # -- lengths ---------------------------------------------------------------------------
    def _replay_len(self, real_len):
        if real_len is None or not self.epoch_batches:
            return real_len
        return min(real_len, self.epoch_batches)

    def _wrap_len(self, original):
        watcher = self

        @functools.wraps(original)
        def __len__(loader):
            real_len = original(loader)
            try:
                replay_len = watcher._replay_len(real_len)
                if replay_len < real_len:
                    number = watcher._loader_id(loader)
                    if number not in watcher._short_len_read:  # once per loader: len() may run per batch
                        watcher._short_len_read.add(number)
                        watcher.rec.emit_aside(ev.short_len(loader=number, real_len=real_len,
                                                            replay_len=replay_len), watcher.rec.here(2))
                return replay_len
            except Exception as exc:  # pragma: no cover - defensive
                watcher.rec.internal_error("DataLoader.__len__", exc)
                return real_len

        return __len__

    def _wrap_iter(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def __iter__(loader):
            iterator = original(loader)
            try:
                number = watcher._loader_id(loader)
                epoch = watcher._epochs.get(number, 0)
                watcher._epochs[number] = epoch + 1
                try:
                    real_len = watcher._original_len(loader)
                except TypeError:  # iterable-style dataset without __len__: a stream, no epochs
                    real_len = None
                replay_len = watcher._replay_len(real_len)
                if replay_len is not None and replay_len < real_len:
                    watcher._shortened = True
                watcher._note_batching(loader, number)
                if isinstance(iterator, _BaseDataLoaderIter):
                    limit = replay_len if replay_len != real_len else None
                    setattr(iterator, _STATE, (number, epoch, limit))
                here = rec.here(2)
                if number not in watcher._described:
                    watcher._described.add(number)
                    watcher._describe(loader, number, here)
                if watcher.printing and number not in watcher._print_about:
                    watcher._print_about[number] = (watcher._loader_locs.get(loader) or here,
                                                    *_sampler_of(loader))
                plan = watcher._planned(sys._getframe(1)) if epoch == 0 else None
                rec.emit(ev.epoch_start(loader=number, epoch=epoch, real_len=real_len,
                                        replay_len=replay_len, planned=plan), here)
                if epoch:
                    for begun in watcher._on_epoch.now:
                        begun(number, epoch)
            except Exception as exc:
                rec.internal_error("DataLoader.__iter__", exc)
            return iterator

        return __iter__

    def _planned(self, frame):
        """The count of the loop around the script's loop over a loader (instrument/planned.py),
        at its first epoch; None when unknown."""
        try:
            user = next(self.rec.finder.user_frames(frame), None)
            plan = planned(user, self.rec.finder.is_user_file, self._plain_len)
            if plan is None and user is not None and user is not frame:
                plan = framework_plan(frame)  # the loop is Lightning's or the Trainer's
            return plan
        except Exception as exc:
            self.rec.internal_error("DataLoader.__iter__ (planned run)", exc)
            return None

    def _plain_len(self, value):
        """A DataLoader's real length, a plain container's len, else None."""
        if isinstance(value, torch.utils.data.DataLoader):
            try:
                return self._original_len(value)
            except TypeError:
                return None
        if type(value) in (list, tuple, dict, range, str):
            return len(value)
        return None

    def _wrap_next(self, original):
        watcher = self

        @functools.wraps(original)
        def __next__(iterator):
            state = iterator.__dict__.get(_STATE)
            if state is not None and state[2] is not None and iterator._num_yielded >= state[2]:
                raise StopIteration  # the replay's epoch is over
            batch = original(iterator)
            if state is not None:
                index = iterator._num_yielded - 1
                watcher.current_batch = [state[0], state[1], index]
                if watcher.printing and index < PRINT_BATCHES:
                    watcher._fingerprint(batch, watcher.current_batch)
                if state[1] == 0 and index < LABEL_BATCHES and state[0] in watcher._in_order:
                    watcher._labels(batch, state[0], index)
                if not watcher._zip_done:
                    watcher._served[state[0]] = (index, batch)
                if watcher._announce:
                    watcher._announce -= 1
                    for subscriber in watcher._on_served.now:
                        subscriber(state[0], state[1], index, batch)
            return batch

        return __next__

    def _wrap_iter_len(self, original):
        @functools.wraps(original)
        def __len__(iterator):
            real_len = original(iterator)
            state = iterator.__dict__.get(_STATE)
            return min(real_len, state[2]) if state is not None and state[2] is not None else real_len

        return __len__

    # -- what a loader's sampler can draw --------------------------------------------------
    def _describe(self, loader, number: int, here) -> None:
        """One ``loader_sampler`` event per loader, at its first ``iter()``."""
        try:
            self._note_rows(loader, number, here)
        except Exception as exc:
            self.rec.internal_error("DataLoader rows", exc)
        self._drawing[number] = _random_sampler(loader)
        try:
            self._datasets[number] = weakref.ref(loader.dataset)
        except TypeError:  # a dataset that takes no weak reference: not kept
            pass
        sampler = getattr(loader, "sampler", None)
        if sampler is None:
            return
        data = torch.utils.data
        shuffle = None
        if isinstance(sampler, data.SequentialSampler):
            shuffle = False
        elif isinstance(sampler, (data.RandomSampler, data.WeightedRandomSampler, data.SubsetRandomSampler)):
            shuffle = True
        elif hasattr(sampler, "shuffle") and isinstance(sampler.shuffle, bool):
            shuffle = sampler.shuffle  # DistributedSampler
        try:
            dataset_len = len(loader.dataset)
        except Exception:
            dataset_len = None
        reach = weights = levels = None
        if isinstance(sampler, data.WeightedRandomSampler):
            w = sampler.weights
            weights = int(w.numel())
            reach = int((w > 0).sum()) if w.device.type == "cpu" else weights
            levels = _weight_levels(w)
            if not sampler.replacement:
                reach = min(reach, int(sampler.num_samples))
        elif isinstance(sampler, (data.RandomSampler, data.SequentialSampler)):
            try:
                reach = len(sampler.data_source)
            except Exception:
                reach = None
        if type(sampler) is data.RandomSampler and not sampler.replacement \
                and getattr(loader, "generator", None) is None and sampler.generator is None:
            try:  # a random order of its own (no generator the script could share)
                self._own_order[number] = (len(loader.dataset), self._loader_locs.get(loader) or here)
            except Exception:
                pass
        if type(sampler) is data.SequentialSampler and not isinstance(loader.dataset, data.IterableDataset):
            self._in_order[number] = (self._loader_locs.get(loader) or here, _classes(loader.dataset))
        loc = self._sampler_locs.get(sampler) or here
        self.rec.emit_aside(ev.loader_sampler(loader=number, sampler=type(sampler).__name__,
                                              shuffle=shuffle, dataset_len=dataset_len,
                                              reach=reach, weights=weights, levels=levels), loc)

    def _note_rows(self, loader, number: int, here) -> None:
        """Which rows of which dataset the loader serves, and those it shares with earlier
        loaders over the same dataset (a ``loader_rows`` event when it serves part of it or
        shares any)."""
        data = torch.utils.data
        dataset = getattr(loader, "dataset", None)
        if dataset is None or isinstance(dataset, data.IterableDataset):
            return
        indices = None
        site = None
        batches = getattr(loader, "batch_sampler", None)
        sampler = batches.sampler if type(batches) is data.BatchSampler else (
            getattr(loader, "sampler", None) if batches is None else None)
        if type(sampler) is data.SubsetRandomSampler:
            indices = [int(i) for i in sampler.indices]
            site = self._subset_locs.get(sampler)
        while isinstance(dataset, data.Subset):
            rows = dataset.indices
            indices = [int(i) for i in rows] if indices is None else [int(rows[i]) for i in indices]
            site = site or self._subset_locs.get(dataset)
            dataset = dataset.dataset
            if len(indices) > ROWS_KEPT:
                return
        base = self._dataset_id(dataset)
        mine = frozenset(indices) if indices is not None else None
        try:
            length = len(dataset)
        except Exception:
            return
        shared = []
        for other, (other_base, theirs) in self._rows.items():
            if other_base != base:
                continue
            if mine is None and theirs is None:
                continue  # no split made: a script that evaluates on its training set knows it
            if mine is None or theirs is None:
                count = sum(1 for i in (theirs if mine is None else mine) if 0 <= i < length)
            else:
                count = len(mine & theirs)
            if count:
                shared.append([other, count])
        self._rows[number] = (base, mine)
        copied = []
        prints = _row_prints(dataset, indices)
        if prints is not None:
            for other, (other_base, theirs) in self._prints.items():
                count = len(prints & theirs) if other_base != base else 0
                if count >= max(_COPIED_ROWS, _COPIED_SHARE * min(len(prints), len(theirs))):
                    copied.append([other, count])
            self._prints[number] = (base, prints)
        if mine is None and not shared and not copied:
            return
        made = self._loader_locs.get(loader)
        self.rec.emit_aside(ev.loader_rows(loader=number, base=base,
                                           rows=length if mine is None else len(mine),
                                           shared=shared,
                                           made=[made.path, made.line] if made is not None else None,
                                           copied=copied),
                            site or made or here)

    def _wrap_init_site(self, original, sites: weakref.WeakKeyDictionary, where: str):
        """``__init__`` as it is, then the user's line that made the object noted in ``sites``
        (a loader's or a weighted sampler's construction: where findings point)."""
        watcher = self

        @functools.wraps(original)
        def __init__(obj, *args, **kwargs):
            original(obj, *args, **kwargs)
            try:
                loc = watcher.rec.here(2)
                if loc is not None:
                    sites[obj] = loc
            except Exception as exc:  # pragma: no cover - defensive
                watcher.rec.internal_error(where, exc)

        return __init__

    def _labels(self, batch, number: int, index: int) -> None:
        """How many distinct labels a batch of an unshuffled loader holds (CPU labels only)."""
        try:
            labels = _labels_of(batch)
            if labels is None:
                spreads = _scalar_spreads(batch)
                if not spreads:
                    self._in_order.pop(number, None)  # no class labels, no scalars: nothing to judge
                    return
                loc = self._in_order[number][0]
                for slot, size, mean, var, low, high in spreads:
                    self.rec.emit_aside(ev.batch_spread(loader=number, index=index, size=size, slot=slot,
                                                        mean=mean, var=var, low=low, high=high), loc)
                return
            loc, classes = self._in_order[number]
            with torch.no_grad():
                values = torch.unique(labels)
            distinct = int(values.numel())
            value = int(values[0]) if distinct == 1 else None
            self.rec.emit_aside(ev.batch_labels(loader=number, index=index, size=int(labels.numel()),
                                                distinct=distinct, value=value, classes=classes), loc)
        except Exception as exc:
            self._in_order.pop(number, None)
            self.rec.internal_error("DataLoader batch labels", exc)

    # -- batch fingerprints (ranks-same-batches) ---------------------------------------------
    def _fingerprint(self, batch, key: list) -> None:
        """The fingerprint of a batch a loader just yielded, held until a backward uses it (the
        previous one is dropped: its batch fed none). Only in a process group."""
        self._pending = None
        try:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return
            if self._computed >= PRINT_CAP:  # loaders that feed no backward: enough
                self._close_prints()
                return
            tensor = _first_tensor(batch)
            value = _weighted_sum(tensor) if tensor is not None else None
            if value is None:
                return
            self._computed += 1
            self._pending = (key, value)
        except Exception as exc:
            self._close_prints()
            self.rec.internal_error("DataLoader batch fingerprint", exc)

    def _fed(self, batch: list) -> None:
        """A backward uses ``batch`` (the first time): its fingerprint, if one was taken, is
        recorded; after ``PRINT_BATCHES`` such batches, with a process group or without, the
        fingerprints are over."""
        self._last_fed = batch
        self._batches_fed += 1
        pending, self._pending = self._pending, None
        try:
            if pending is not None and pending[0] is batch:
                loc, sampler, replicas = self._print_about.get(batch[0], (None, None, None))
                self.rec.emit(ev.batch_fingerprint(loader=batch[0], epoch=batch[1], index=batch[2],
                                                   value=Deferred(pending[1]), sampler=sampler,
                                                   replicas=replicas), loc)
        except Exception as exc:
            self.rec.internal_error("DataLoader batch fingerprint", exc)
        if self._batches_fed >= PRINT_BATCHES:
            self._close_prints()

    def _close_prints(self) -> None:
        self.printing = False
        self._pending = None
        self._print_about = {}

    # -- which batch a backward used; how long the replay goes on ----------------------------
    def describe_loss(self, tensors) -> dict:
        if not self._zip_done and self._served:
            self._zipped()
        batch = self.current_batch
        if batch is not None:
            self._training.add(batch[0])
            if self.printing and batch is not self._last_fed:
                self._fed(batch)
        return {"batch": batch}

    def _zipped(self) -> None:
        """Once: two loaders served the same index for this backward, each in its own random
        order over datasets of one length, one of them bare integer labels."""
        served, self._served = self._served, {}
        if len(served) < 2:
            return
        pair = frozenset(served)
        if pair in self._zip_checked:
            return
        self._zip_checked.add(pair)
        self._zip_done = len(self._zip_checked) >= _ZIP_CHECKS
        try:
            own = [(n, served[n]) for n in served if n in self._own_order]
            for labels_at, (index, batch) in own:
                if isinstance(batch, (tuple, list)) and len(batch) == 1:
                    batch = batch[0]  # a TensorDataset of one tensor
                if isinstance(batch, (tuple, list, Mapping)) or _labels_of((None, batch)) is None:
                    continue  # not a loader of bare labels
                length, loc = self._own_order[labels_at]
                others = [n for n, (i, b) in own if n != labels_at and i == index
                          and self._own_order[n][0] == length]
                if others:
                    self._zip_done = True
                    self.rec.emit_aside(ev.loaders_zipped(inputs=others[0], labels=labels_at,
                                                          length=length), loc)
                    return
        except Exception as exc:
            self.rec.internal_error("DataLoader zipped loaders", exc)

    def draws_at_random(self, number: int) -> str | None:
        """The class of the sampler that draws loader ``number``'s samples at random, so that
        its consecutive batches hold unrelated samples (a ``RandomSampler``, also inside a
        ``BatchSampler`` given as ``batch_sampler``; a shuffling ``DistributedSampler``); None
        for one that serves them in order, and where that is not known (a batch sampler of the
        script's own, a stream)."""
        return self._drawing.get(number)

    def dataset_of(self, number: int):
        """The dataset of loader ``number`` (noted at its first ``iter()``), or None."""
        ref = self._datasets.get(number)
        return ref() if ref is not None else None

    def batch_size(self) -> int | None:
        """How many samples the batch a DataLoader served last holds, as its loader says: its
        ``batch_size``, less for an epoch's partial last batch (from the sampler's length); None
        before any batch, and for a loader without a ``batch_size`` (``batch_size=None``, a
        ``batch_sampler`` of the script's own). Noted at each ``iter()``, read on demand
        (instrument/batchfirst.py), never per batch."""
        batch = self.current_batch
        batching = self._batching.get(batch[0]) if batch is not None else None
        if batching is None:
            return None
        size, samples = batching
        if samples is not None and 0 < samples - batch[2] * size < size:
            return samples - batch[2] * size
        return size

    def _note_batching(self, loader, number: int) -> None:
        """What ``batch_size`` needs of this loader (never raises: the epoch is recorded anyway)."""
        size = getattr(loader, "batch_size", None)
        if not isinstance(size, int) or size <= 0:
            self._batching.pop(number, None)
            return
        samples = None
        if not getattr(loader, "drop_last", False):
            try:
                samples = len(loader.sampler)
            except Exception:  # a stream (no length), a sampler of the script's own
                pass
        self._batching[number] = (size, samples if isinstance(samples, int) else None)

    def trains(self) -> bool:
        """Whether a DataLoader's batches reached a backward (its epochs hold the budget)."""
        return bool(self._training)

    def _params_added(self, opt: int, pids: list) -> None:
        """PARAMS_ADDED: a later phase's first batches are handed to BATCH_SERVED too (its
        subscribers' windows reopen with the loss windows)."""
        if self._announce == 0 and self._announced_again < REOPENS:
            self._announced_again += 1
            self._announce = SERVED_BATCHES

    def _hold(self) -> bool:
        """Go on past the step budget until a training loader has begun its third epoch, for at
        most ``2 * epoch_batches + 1`` steps (a plain loop's first step of epoch 3)."""
        if not self.epoch_batches or not self._training:
            return False
        if any(self._epochs.get(n, 0) >= 3 for n in self._training):
            return False
        return self.rec.progress.steps < 2 * self.epoch_batches + 1

    def install(self, patcher) -> None:
        DataLoader = torch.utils.data.DataLoader
        self._original_len = DataLoader.__len__
        patcher.patch(DataLoader, "__iter__", self._wrap_iter(DataLoader.__iter__))
        if self.epoch_batches:
            patcher.patch(DataLoader, "__len__", self._wrap_len(DataLoader.__len__))
            patcher.patch(_BaseDataLoaderIter, "__len__", self._wrap_iter_len(_BaseDataLoaderIter.__len__))
        patcher.patch(_BaseDataLoaderIter, "__next__", self._wrap_next(_BaseDataLoaderIter.__next__))
        patcher.patch(DataLoader, "__init__", self._wrap_init_site(DataLoader.__init__, self._loader_locs,
                                                                   "DataLoader.__init__"))
        Weighted = torch.utils.data.WeightedRandomSampler
        patcher.patch(Weighted, "__init__", self._wrap_init_site(Weighted.__init__, self._sampler_locs,
                                                                 "WeightedRandomSampler.__init__"))
        SubsetSampler = torch.utils.data.SubsetRandomSampler
        patcher.patch(SubsetSampler, "__init__", self._wrap_init_site(
            SubsetSampler.__init__, self._subset_locs, "SubsetRandomSampler.__init__"))
        Subset = torch.utils.data.Subset
        patcher.patch(Subset, "__init__", self._wrap_init_site(Subset.__init__, self._subset_locs,
                                                               "Subset.__init__"))


def _weight_levels(weights) -> list[tuple[float, int]] | None:
    """``(weight, samples)`` of each distinct value of a weighted sampler's per-sample weights,
    when they take 2 to 64 values each held by at least two samples (weights given per class
    and spread over the samples, ``class_weight[labels]``); None otherwise, or off the CPU (the
    read would wait for the device)."""
    if weights.device.type != "cpu" or weights.dim() != 1 or weights.numel() < 4:
        return None
    values, counts = torch.unique(weights.detach(), return_counts=True)
    if not 2 <= values.numel() <= 64 or int(counts.min()) < 2:
        return None
    return [(float(v), int(c)) for v, c in zip(values.tolist(), counts.tolist())]


def _first_tensor(batch, depth: int = 0):
    """The first tensor of a batch (a tensor, or the first one in a tuple, list or mapping,
    nested at most three deep), or None."""
    if isinstance(batch, torch.Tensor):
        return batch
    if depth >= 3:
        return None
    if isinstance(batch, (tuple, list)):
        items = batch
    elif isinstance(batch, Mapping):
        items = batch.values()
    else:
        return None
    for item in items:
        found = _first_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def _weighted_sum(tensor):
    """A position-weighted sum of at most ``PRINT_ELEMENTS`` evenly spaced elements of a tensor,
    as a device scalar (no host sync): equal on two ranks that hold the same batch, different
    for other samples. None for a tensor it cannot read that way (sparse, complex, quantized)."""
    if tensor.layout is not torch.strided or tensor.is_complex() or tensor.is_quantized:
        return None
    with torch.no_grad():
        flat = tensor.detach().reshape(-1)
        n = flat.numel()
        if n > PRINT_ELEMENTS:
            flat = flat[:: n // PRINT_ELEMENTS][:PRINT_ELEMENTS]
        dtype = torch.float32 if flat.device.type == "mps" else torch.float64
        weights = torch.arange(1, flat.numel() + 1, dtype=dtype, device=flat.device)
        return torch.dot(flat.to(dtype), weights)


def _sampler_of(loader) -> tuple:
    """``(sampler, replicas)`` of a loader, for the fingerprints: the class of its batch sampler
    when it has one of its own, else of its sampler (None for an IterableDataset), and the
    ``[num_replicas, rank]`` of a sampler that has both (a DistributedSampler)."""
    if isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset):
        return None, None
    sampler = getattr(loader, "batch_sampler", None)
    if sampler is None or type(sampler) is torch.utils.data.BatchSampler:
        sampler = getattr(loader, "sampler", None)
    if sampler is None:
        return None, None
    replicas = [getattr(sampler, "num_replicas", None), getattr(sampler, "rank", None)]
    if not all(type(r) is int for r in replicas):
        replicas = None
    return type(sampler).__name__, replicas


def _random_sampler(loader) -> str | None:
    """``DataLoaderWatcher.draws_at_random`` of a loader, read from its samplers."""
    data = torch.utils.data
    if isinstance(getattr(loader, "dataset", None), data.IterableDataset):
        return None
    batches = getattr(loader, "batch_sampler", None)
    if batches is None:  # batch_size=None: one sample is one batch
        sampler = getattr(loader, "sampler", None)
    elif type(batches) is data.BatchSampler:
        sampler = batches.sampler
    else:
        return None  # the script's own batch sampler: its order is its own
    if isinstance(sampler, (data.RandomSampler, data.SubsetRandomSampler, data.WeightedRandomSampler)):
        return type(sampler).__name__
    if isinstance(sampler, data.DistributedSampler) and getattr(sampler, "shuffle", None) is True:
        return type(sampler).__name__
    return None


def _labels_of(batch):
    """A batch's class labels: a 1-D integer CPU tensor as the last item of a tuple or list
    batch, or under a label key of a mapping; None otherwise (no labels, token ids, floats)."""
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        labels = batch[-1]
    elif isinstance(batch, Mapping):
        labels = next((batch[k] for k in _LABEL_KEYS if k in batch), None)
    else:
        return None
    if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or labels.device.type != "cpu" \
            or labels.is_floating_point() or labels.is_complex() or labels.dtype is torch.bool:
        return None
    return labels


def _scalar_spreads(batch) -> list[tuple[str, int, float, float, float, float]]:
    """``(slot, size, mean, var, low, high)`` of the first ("input") and last ("target") items of a tuple
    or list batch that hold one finite float per sample on the CPU (``(N,)`` or ``(N, 1)``)."""
    if not isinstance(batch, (tuple, list)) or len(batch) < 2:
        return []
    found = []
    for slot, item in (("input", batch[0]), ("target", batch[-1])):
        if not isinstance(item, torch.Tensor) or item.device.type != "cpu" or not item.is_floating_point() \
                or item.dim() not in (1, 2) or item.numel() != item.shape[0] or item.numel() < 2:
            continue
        with torch.no_grad():
            values = item.detach().reshape(-1).double()
            var, mean = torch.var_mean(values, correction=0)
            if not bool(torch.isfinite(var)):
                continue
            low, high = torch.aminmax(values)
        found.append((slot, int(values.numel()), float(mean), float(var), float(low), float(high)))
    return found


def _classes(dataset) -> int | None:
    """How many classes a dataset's labels hold, where the dataset says it without loading a
    sample: torchvision's ``targets``, a TensorDataset's last tensor; None otherwise."""
    try:
        targets = getattr(dataset, "targets", None)
        if targets is None and isinstance(dataset, torch.utils.data.TensorDataset):
            targets = dataset.tensors[-1]
        if targets is None:
            return None
        if not isinstance(targets, torch.Tensor):
            targets = torch.as_tensor(list(targets))
        if targets.dim() != 1 or targets.is_floating_point() or targets.device.type != "cpu":
            return None
        return int(torch.unique(targets).numel())
    except Exception:
        return None


def _row_prints(dataset, indices) -> frozenset | None:
    """Hashes of the input rows the loader serves (its dataset's first floating tensor of one
    row per sample: a ``TensorDataset``'s, or a tensor attribute of the script's own
    dataset), rows repeated within it left out; None when there is no such tensor, it is too
    large, or its values are too few to tell samples apart (a table of categories)."""
    data = torch.utils.data
    try:
        length = len(dataset)
    except Exception:
        return None
    if isinstance(dataset, data.TensorDataset):
        candidates = list(dataset.tensors)
    else:
        candidates = [v for v in list(getattr(dataset, "__dict__", {}).values())[:16]
                      if isinstance(v, torch.Tensor)]
    table = next((t for t in candidates if t.is_floating_point() and t.dim() >= 2
                  and int(t.shape[0]) == length and t.device.type == "cpu"), None)
    if table is None or not 3 <= length <= PRINT_ROWS or table.numel() > PRINT_ELEMENTS \
            or table.numel() // length < 2:
        return None
    rows = table.detach()
    if indices is not None:
        rows = rows[[i for i in indices if 0 <= i < length]]
    rows = rows.reshape(int(rows.shape[0]), -1).contiguous()
    if int(torch.unique(rows[:64]).numel()) < min(rows.numel() // 2, 256, int(rows[:64].numel()) // 2):
        return None  # few distinct values: equal rows need not be the same sample
    counts: dict[int, int] = {}
    array = rows.numpy()
    for row in array:
        key = hash(row.tobytes())
        counts[key] = counts.get(key, 0) + 1
    return frozenset(k for k, c in counts.items() if c == 1)
