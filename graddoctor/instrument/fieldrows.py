"""Categorical fields looked up in one shared embedding table without their offsets: DeepFM,
a factorization machine, wide & deep, a tabular model's single table for every categorical
column, a (user, item) pair in one id table. Each field is label-encoded from 0, the table has
as many rows as the fields have values together, and the lookup should shift field j by the
values of the fields before it (``x + offsets``, offsets = (0, cumsum(field_dims)[:-1])). Without
the shift every field indexes the table's first rows: value 3 of the first field and value 3 of
the second get one vector, and the rows meant for the later fields are never looked up.

What the run shows: a (batch, fields) integer batch (``2 <= fields <= MAX_FIELDS``, more rows
than fields) embedded in a table that trains, read per call site over its first ``READS`` calls
(CPU indices; on a GPU only before the first optimizer step, no host sync after it), every
column's smallest and largest id kept. At the end of the run a site is told when

* the columns' ranges all overlap (every column's smallest id is at most every column's
  largest: the fields start at the same place, not one after the other), and
* their sizes, each counted from 0 (``largest + 1``), add up to between ``COVER`` of the
  table's rows and all of them: the table was sized for the fields side by side, while no id
  above the largest field's is looked up.

A token or item sequence ``(batch, length)`` has every column over the whole vocabulary (their
sizes add up to many tables); fields with offsets lie one after the other (no overlap); fields
hashed into one table of buckets each span the table. One ``field_rows`` event per site, at the
end of the run (loc: the lookup's line).

The same wrapper reads, once per optimizer step from the first step to the ``STEPS``-th, each
trained CPU table of more rows than columns it looks up (``UNIT_VALUES`` values at most): the
norms of its columns and of its rows. A table whose every column has unit norm, and not every
row, at ``UNIT_STEPS`` steps or more and at ``UNIT_SHARE`` of the steps it was read (an
evaluation between a step and the renormalisation reads it unnormalised), is renormalised by the script after
each update across its rows (``F.normalize(weight, dim=0)``: every feature scaled over all the
entities) where a per-row constraint (TransE's unit entities) was meant; columns that are also
orthogonal to each other (a Stiefel retraction's orthonormal frame) are meant. One
``table_columns_unit`` event per table, at the end of the run (loc: its first lookup read).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from .. import events as ev
from .inlinable import watched
from .recorder import Recorder

READS = 16  # calls read per call site
STEPS = 16  # optimizer steps after which nothing is read any more
CALLS = 512  # embedding calls looked at in all
MIN_BATCH = 8  # rows of a batch at least
MIN_SEEN = 32  # rows read per site, over its calls, before it is judged
MAX_FIELDS = 128
MAX_CELLS = 1 << 20
MAX_SITES = 64
COVER = 0.8  # the columns' sizes add up to at least this share of the table's rows
UNIT_VALUES = 1 << 22  # values of a table whose norms are read, at most
UNIT_TABLES = 16  # tables followed for their norms, at most
UNIT_TOL = 1e-4  # |norm - 1| of a unit column, at most
ORTHONORMAL_TOL = 1e-4  # largest |cos| between two columns of a table kept orthonormal
UNIT_STEPS = 3  # steps with unit columns, at least
UNIT_SHARE = 0.75  # share of the steps read with unit columns, at least (a lookup between
# the step and the script's renormalisation, an evaluation's, reads the table unnormalised)


class FieldRowsWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        # (call line, table rows, fields, api) -> [calls read, rows read, smallest ids, largest ids]
        self._sites: dict = {}
        self._calls = 0
        self._forward = nn.Embedding.forward.__code__
        # id of a table -> [first lookup's loc, rows, cols, api, steps read, steps all unit, weight]
        self._tables: dict = {}

    def _before(self, args, kwargs) -> None:
        self._calls += 1
        rec = self.rec
        if self._calls > CALLS or rec.progress.steps >= STEPS:
            return
        ids = args[0] if args else kwargs.get("input")
        weight = args[1] if len(args) > 1 else kwargs.get("weight")
        if rec.progress.steps >= 1 and isinstance(weight, torch.Tensor):
            self._read_norms(weight)
        if not (isinstance(ids, torch.Tensor) and isinstance(weight, torch.Tensor)
                and ids.dim() == 2 and weight.dim() == 2 and weight.requires_grad
                and not ids.is_floating_point() and not ids.is_complex() and ids.dtype != torch.bool
                and 2 <= ids.shape[1] <= MAX_FIELDS and ids.shape[0] >= MIN_BATCH
                and ids.shape[0] > ids.shape[1] and ids.numel() <= MAX_CELLS):
            return
        if ids.device.type != "cpu" and rec.progress.steps:
            return
        caller = sys._getframe(3)  # past ``before`` and the wrapper: the code that called F.embedding
        api = "nn.Embedding" if caller.f_code is self._forward else "F.embedding"
        loc = rec.here(3)
        if loc is None:
            return
        key = (loc, int(weight.shape[0]), int(ids.shape[1]), api)
        site = self._sites.get(key)
        if site is None:
            if len(self._sites) >= MAX_SITES:
                return
            site = self._sites[key] = [0, 0, None, None]
        if site[0] >= READS:
            return
        with torch.no_grad():
            low, high = ids.detach().amin(0).cpu(), ids.detach().amax(0).cpu()
        site[0] += 1
        site[1] += int(ids.shape[0])
        site[2] = low if site[2] is None else torch.minimum(site[2], low)
        site[3] = high if site[3] is None else torch.maximum(site[3], high)

    def _read_norms(self, weight) -> None:
        """A trained table's column and row norms, once per optimizer step (see the module's
        docstring)."""
        if (weight.dim() != 2 or not weight.requires_grad or not weight.is_leaf
                or weight.device.type != "cpu"
                or not weight.is_floating_point() or not 2 <= weight.shape[1] < weight.shape[0]
                or weight.numel() > UNIT_VALUES):
            return
        steps = self.rec.progress.steps
        table = self._tables.get(id(weight))
        if table is None:
            if len(self._tables) >= UNIT_TABLES:
                return
            caller = sys._getframe(4)
            api = "nn.Embedding" if caller.f_code is self._forward else "F.embedding"
            loc = self.rec.here(4)
            if loc is None:
                return
            table = self._tables[id(weight)] = [loc, int(weight.shape[0]), int(weight.shape[1]),
                                                api, set(), set(), weight]
        if table[6] is not weight or steps in table[4]:
            return
        table[4].add(steps)
        with torch.no_grad():
            values = weight.detach()
            columns = values.norm(dim=0)
            rows = values.norm(dim=1)
            if bool(((columns - 1).abs() <= UNIT_TOL).all()) and \
                    not bool(((rows - 1).abs() <= 1e-3).all()):
                gram = values.t() @ values
                gram.fill_diagonal_(0)
                if float(gram.abs().max()) > ORTHONORMAL_TOL:  # a frame kept orthonormal
                    table[5].add(steps)  # (a QR retraction's) is meant to have unit columns

    def close(self) -> None:
        """The sites whose columns share the table's first rows, told once each."""
        try:
            for loc, rows, cols, api, read, unit, _ in self._tables.values():
                if len(unit) >= UNIT_STEPS and len(unit) >= UNIT_SHARE * len(read):
                    self.rec.emit(ev.table_columns_unit(api=api, rows=rows, cols=cols,
                                                        steps=len(unit), read=len(read)), loc)
        except Exception as exc:
            self.rec.internal_error("embedding norms", exc)
        finally:
            self._tables = {}
        try:
            for (loc, rows, fields, api), (calls, seen, low, high) in self._sites.items():
                found = shared_fields(low, high, rows) if seen >= MIN_SEEN else None
                if found is not None:
                    self.rec.emit(ev.field_rows(api=api, rows=rows, fields=fields, calls=calls,
                                                **found), loc)
        except Exception as exc:
            self.rec.internal_error("embedding fields", exc)
        finally:
            self._sites = {}

    def install(self, patcher) -> None:
        watcher = self

        def before(args, kwargs) -> None:
            try:
                watcher._before(args, kwargs)
            except Exception as exc:
                watcher.rec.internal_error("F.embedding fields", exc)

        patcher.patch(F, "embedding", watched(F.embedding, before))


def shared_fields(low, high, rows: int) -> dict | None:
    """For the smallest and largest id of each column of the batches a table of ``rows`` rows
    looked up: the columns' sizes (largest + 1) when their ranges all overlap and the sizes add
    up to between ``COVER`` of the rows and all of them; else None."""
    if low is None or high is None or int(low.min()) < 0:
        return None
    if int(low.max()) > int(high.min()):
        return None  # one column lies past another: fields with their offsets
    sizes = [int(h) + 1 for h in high.tolist()]
    total = sum(sizes)
    if not (COVER * rows <= total <= rows):
        return None
    return {"sizes": sizes, "covered": total, "top": max(sizes)}
