"""DataLoader epochs: every ``iter(loader)`` starts an epoch."""

from __future__ import annotations

import functools

import torch.utils.data

from .recorder import Recorder


class DataLoaderWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._epochs: dict[int, int] = {}

    def _wrap_iter(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def __iter__(loader):
            iterator = original(loader)
            try:
                key = id(loader)
                epoch = watcher._epochs.get(key, 0)
                watcher._epochs[key] = epoch + 1
                try:
                    real_len = len(loader)
                except TypeError:  # iterable-style dataset without __len__
                    real_len = None
                rec.emit("epoch_start", rec.here(2), loader=list(watcher._epochs).index(key),
                         epoch=epoch, real_len=real_len, replay_len=real_len)
            except Exception as exc:
                rec.internal_error("DataLoader.__iter__", exc)
            return iterator

        return __iter__

    def install(self, patcher) -> None:
        DataLoader = torch.utils.data.DataLoader
        patcher.patch(DataLoader, "__iter__", self._wrap_iter(DataLoader.__iter__))
