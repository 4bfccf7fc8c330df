"""Scores of rows the script draws at random, and which way the loss pushes them
(sampled-negatives-pushed-up).

Negative sampling (word2vec's skip-gram, BPR for a recommender, TransE-style corruption of a
knowledge graph's triples, a two-tower model's sampled items) scores embeddings looked up at
indices the script draws at random at every step, and the loss exists to push those scores
down, below the scores of the pairs the data gives. One flipped sign (``logsigmoid(neg)`` for
``logsigmoid(-neg)``), two arguments swapped (``-logsigmoid(neg - pos)``, a margin ranking's
distances), labels built the other way round, and the model learns to rank random items above
the data while the loss still falls.

What is observed, at the first ``_WINDOWS`` backwards only:

* **Draws.** ``torch.randint``, ``randint_like``, ``randperm``, ``multinomial`` (function and
  method) and numpy's ``random.randint`` / ``random.choice`` are wrapped (the call runs
  unchanged: nothing is drawn here); each integer result of the script's own call (CPU, at most
  ``_DRAW_ELEMENTS`` values) is kept, with the backward window it was drawn in and its line.
* **Lookups.** At a backward, the loss's graph is walked (``_NODES`` nodes at most) for the
  embedding lookups (``EmbeddingBackward0``, a parameter indexed by one integer tensor): a
  lookup is *drawn* when its indices are one of the draws made since the previous backward
  (fresh at each step: data drawn once before the loop is not), or agree with one at
  ``_AGREE`` of their positions at least (a corruption that replaces part of a batch,
  ``torch.where(coin, drawn, h)``), or, for a draw of a quarter of the lookup's size or more,
  at its first or last positions (``corrupt[:64] = torch.randint(...)``), or is one row or
  column of a draw two or three times its size (one end of a drawn edge list:
  ``z[neg[0]]`` of ``neg = torch.randint(0, N, (2, E))``, a graph network's output rows looked
  up as well as an embedding's), or is a draw read through an integer table of the calling
  frames (``table[np.random.randint(0, len(table), k)]``: word2vec's unigram^0.75 noise table;
  ``pairs[idx, 0]``: the data's rows drawn by index); a 2-D lookup whose
  last (or first) columns are a draw (``cat([positive[:, None], drawn], 1)``) has drawn
  *columns*.
* **Scores.** The score nodes are the first, from the loss's root, of: a dot product
  (``(a * b).sum(-1)``, ``bmm``, ``mm``, an einsum) whose two sides each reach a lookup; a
  distance (a vector norm, ``cdist``, a sum of squared or absolute differences) of lookups.
  Each gets a node hook (torch's own; it reads and changes nothing) that reads the gradient on
  it: ``up``, the share of its mass that gradient descent uses to raise the score's
  similarity (a similarity's negative gradient, a distance's positive one).
* A score that reads drawn columns, and no whole drawn lookup, is read as two: its gradient
  at the drawn positions (a negative score) and at the others (a positive one), when the
  gradient has the lookup's shape.
* The scores' draws (the drawn lookups each reaches), anchors (a key per indices tensor its
  lookups read: a user's rows looked up once, or twice from one tensor, are one anchor; and a
  key per computed tensor whose rows it gathers: a graph network's node embeddings scored for
  the data's edges and for drawn ones are one anchor),
  orientation, ``up`` and mass, and the names the calling frames bind to them, go to a ``sampled_scores`` aside per backward that
  had at least two scores and a drawn lookup. Which scores are the negatives (the ones
  reaching a draw the others do not) is decided by the rule.
* **Ranges.** The upper bound a draw was asked for (``randint``'s ``high``, ``randperm``'s
  ``n``) is kept with it. A drawn ``nn.Embedding`` lookup of a table with more rows than that
  bound is told in the aside's ``ranges``: the bound, the table's rows, the row counts of the
  other embedding tables the loss looks up, and the share of the data's indices into the table
  (the lookup's positions the draw did not replace, and the table's undrawn lookups) at the
  bound or above: rows the data uses and the negatives can never be
  (negatives-drawn-out-of-range).

CPU tensors only (a gradient on an accelerator is not read: no host sync). The wrappers are
taken away after the windows.
"""

from __future__ import annotations

import sys

import torch

from .. import events as ev
from .dependency import close_before_compile
from .inlinable import watched_call
from .lossterms import loss_root
from .recorder import Recorder
from .topics import DESCRIBE_LOSS, STEPPED
from .patcher import check_hook, put_back

_WINDOWS = 5  # backwards looked at (the first one only opens the fresh draws' window)
_DRAW_ELEMENTS = 1 << 16  # values of a draw kept at most
_DRAWS = 32  # draws kept per window
_NODES = 6000  # nodes of a loss's graph walked for lookups
_REACH = 400  # nodes walked below a score for the lookups it reads
_SCORES = 16  # score nodes hooked per backward
_AGREE = 0.4  # share of a lookup's indices equal to a draw's, at least
_MIN_DRAWN = 4  # values of a draw compared, at least
_ENDS = 3  # rows (or columns) of a drawn edge list a lookup may read one of, at most
_FRAMES = 3  # user frames whose variables name the scores
_NAMES_READ = 400  # variables of a frame read, at most
_LABEL = "sampled scores"
_TABLES = 8  # integer tables of the calling frames a draw may index (a unigram table, pairs)
_TABLE_ELEMENTS = 1 << 24  # a table's values, at most
_TABLE_COLUMNS = 8  # columns of a 2-D table (the data's pairs or triples), at most

_DISTANCE_NODES = ("LinalgVectorNormBackward0", "NormBackward1", "NormBackward0", "CdistBackward0")
_VIEWS = ("View", "Reshape", "UnsafeView", "Squeeze", "Unsqueeze", "Permute", "Transpose",
          "TBackward", "Clone", "ToCopy", "Expand", "Alias", "Contiguous", "Neg", "Select",
          "Slice")


def _entry_points():
    names = [(torch, "randint"), (torch, "randint_like"), (torch, "randperm"),
             (torch, "multinomial"), (torch.Tensor, "multinomial")]
    numpy = sys.modules.get("numpy")
    rnd = getattr(numpy, "random", None) if numpy is not None else None
    if rnd is not None:
        names += [(rnd, "randint"), (rnd, "choice")]
    return [(owner, name) for owner, name in names if callable(getattr(owner, name, None))]


def _as_ints(value):
    """A flat int64 CPU copy of an integer draw (a tensor or a numpy array), else None."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu" or value.dtype.is_floating_point or value.dtype == torch.bool:
            return None
        if value.is_complex() or not 0 < value.numel() <= _DRAW_ELEMENTS:
            return None
        return value.detach().reshape(-1).to(torch.int64).clone()
    dtype_kind = getattr(getattr(value, "dtype", None), "kind", None)
    if dtype_kind not in ("i", "u") or not 0 < getattr(value, "size", 0) <= _DRAW_ELEMENTS:
        return None
    try:
        return torch.as_tensor(value.reshape(-1).astype("int64"))
    except Exception:
        return None


def _draw_high(fn: str, args, kwargs):
    """The exclusive upper bound a draw was asked for (``randint(high, size)``,
    ``randint(low, high, size)``, numpy's ``randint(low, high=None)``, ``randperm(n)``), else None."""
    if fn not in ("randint", "randperm"):
        return None
    bounds = []
    for arg in args:
        if isinstance(arg, bool) or not isinstance(arg, int) and type(arg).__module__ != "numpy":
            break
        try:
            bounds.append(int(arg))
        except Exception:
            break
    if fn == "randperm":
        return bounds[0] if bounds else None
    high = kwargs.get("high")
    if high is not None:
        try:
            return int(high)
        except Exception:
            return None
    if len(bounds) == 1 and "low" not in kwargs:
        return bounds[0]
    if len(bounds) >= 2:
        return bounds[1]
    return None


def _table(node):
    """(key, rows) of the ``nn.Embedding`` weight an ``EmbeddingBackward0`` reads, else None."""
    if type(node).__name__ != "EmbeddingBackward0":
        return None
    below = node.next_functions[0][0] if node.next_functions else None
    weight = getattr(below, "variable", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return None
    return id(weight), int(weight.shape[0])


def _children(node):
    return [child for child, _ in node.next_functions if child is not None]


def _indices(node):
    """The integer indices an embedding lookup read (CPU), else None."""
    name = type(node).__name__
    if name == "EmbeddingBackward0":
        idx = getattr(node, "_saved_indices", None)
    elif name == "IndexBackward0":
        saved = getattr(node, "_saved_indices", None)
        if not isinstance(saved, (tuple, list)) or len(saved) != 1:
            return None
        idx = saved[0]
    else:
        return None
    if (not isinstance(idx, torch.Tensor) or idx.device.type != "cpu" or idx.dtype.is_floating_point
            or idx.dtype == torch.bool or idx.numel() < _MIN_DRAWN):
        return None
    return idx


def _computed_rows(node):
    """The node that computed the tensor a row gather (``z[idx]``) reads, when that tensor is no
    parameter (a graph network's output); None for embeddings and parameters indexed."""
    if type(node).__name__ != "IndexBackward0":
        return None
    below = _children(node)
    if len(below) != 1 or type(below[0]).__name__ == "AccumulateGrad":
        return None
    return below[0]


def _kind(node) -> str | None:
    """'sim' for a dot product, 'dist' for a distance, else None (the node's type only)."""
    name = type(node).__name__
    if name in ("BmmBackward0", "MmBackward0"):
        return "sim"
    if name in _DISTANCE_NODES:
        return "dist"
    if name == "SumBackward1":
        children = _children(node)
        if len(children) != 1:
            return None
        inner = type(children[0]).__name__
        below = _children(children[0])
        if inner == "MulBackward0" and len(below) == 2:
            return "sim"
        if inner in ("PowBackward0", "AbsBackward0") and len(below) == 1 and \
                type(below[0]).__name__ in ("SubBackward0", "AddBackward0"):
            return "dist"
    return None


class NegativeSampleWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._open = True
        self._window = 0  # backwards seen
        self._draws: list = []  # [draw id, window, values, line, fn, high]
        self._next_id = 0
        self._busy = False
        self._pending: list = []  # (made, loc, records, handles) of a backward, emitted after it
        self._restore: list = []

    # -- wrappers ----------------------------------------------------------------------------
    def install(self, patcher) -> None:
        for owner, name in _entry_points():
            original = getattr(owner, name)
            wrapper = watched_call(original, self._drawn(name))
            patcher.patch(owner, name, wrapper)
            self._restore.append((owner, name, original, wrapper))
        close_before_compile(patcher, self._close)

    def _drawn(self, fn: str):
        def after(args, kwargs, result) -> None:
            if not self._open or self._busy:
                return
            self._busy = True
            try:
                caller = sys._getframe(2)
                while caller is not None and caller.f_code.co_filename.startswith("<graddoctor"):
                    caller = caller.f_back
                if caller is None or not self.rec.finder.is_user_file(caller.f_code.co_filename):
                    return
                values = _as_ints(result)
                if values is None:
                    return
                mine = [d for d in self._draws if d[1] == self._window]
                if len(mine) >= _DRAWS:
                    return
                self._draws = [d for d in self._draws if d[1] >= self._window]
                loc = self.rec.finder.location(caller)
                self._draws.append([self._next_id, self._window, values,
                                    [loc.path, loc.line] if loc is not None else None, fn,
                                    _draw_high(fn, args, kwargs)])
                self._next_id += 1
            except Exception as exc:
                self.rec.internal_error(_LABEL, exc)
            finally:
                self._busy = False
        return after

    # -- backwards ---------------------------------------------------------------------------
    def describe_loss(self, tensors) -> dict:
        try:
            self._flush()
            if not self._open:
                self._unwrap_or_retire()
                return {}
            self._window += 1
            if self._window > _WINDOWS:
                self._close()
                return {}
            if self._window >= 2:
                fresh = [d for d in self._draws if d[1] == self._window - 1]
                if fresh:
                    root = loss_root(tensors)
                    if root is not None:
                        self._look(root, fresh)
        except Exception as exc:
            self._close()
            self.rec.internal_error(_LABEL, exc)
        return {}

    def after_step(self, opt, optimizer) -> None:
        try:
            self._flush()
            if not self._open:
                self._unwrap_or_retire()
        except Exception as exc:
            self.rec.internal_error(_LABEL, exc)

    def _look(self, root, fresh) -> None:
        # the lookups of the graph, and the draws each one's indices are
        lookups: dict = {}  # node -> [draw ids]
        direct: set = set()  # the lookups whose indices are a draw itself (not read through a table)
        tables: list = []  # the calling frames' integer tables, read at the first unmatched lookup
        columns: dict = {}  # node -> (draw id, the index positions it is): drawn columns of a lookup
        anchors: dict = {}  # node -> the key of the indices it read (the same tensor: one key)
        keys: dict = {}
        seen = {root}
        stack = [root]
        while stack and len(seen) < _NODES:
            node = stack.pop()
            idx = _indices(node)
            if idx is not None:
                lookups[node] = self._matching(idx, fresh)
                if lookups[node]:
                    direct.add(node)
                else:
                    if not tables:
                        tables.append(self._tables())
                    lookups[node] = self._through_tables(idx, fresh, tables[0])
                if not lookups[node]:
                    hit = self._columns(idx, fresh)
                    if hit is not None:
                        columns[node] = hit
                key = (idx.data_ptr(), idx.numel(), tuple(idx.stride()), idx.storage_offset())
                anchors[node] = {keys.setdefault(key, len(keys))}
                rows = _computed_rows(node)
                if rows is not None:
                    # rows of one computed table (a graph network's node embeddings): the
                    # positive and the drawn pairs are scored in one space
                    anchors[node].add(keys.setdefault(("rows", rows), len(keys)))
            for child in _children(node):
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
        if not any(lookups.values()) and not columns:
            return
        # the score nodes: the first dot products or distances from the root that read lookups
        scores = []
        seen = {root}
        stack = [root]
        while stack and len(seen) < _NODES and len(scores) < _SCORES:
            node = stack.pop()
            orient = _kind(node)
            if orient is not None:
                reached = self._reach(node, lookups, columns, anchors, orient)
                if reached is not None:
                    scores.append((node, orient) + reached)
                    continue
            for child in _children(node):
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
        split = sum(1 for score in scores if not score[2] and len(score[4]) == 1)
        if len(scores) + split < 2 or not any(draws or hits for _, _, draws, _, hits in scores):
            return
        names = self._names([score[0] for score in scores])
        records = []
        handles = []
        used = set()
        for node, orient, draws, read, hits in scores:
            record = {"orient": orient, "op": type(node).__name__, "draws": sorted(draws),
                      "anchors": sorted(read), "up": None, "mass": 0.0, "names": names.get(node, [])}
            records.append(record)
            used.update(draws)
            if not draws and len(hits) == 1:
                # drawn and data columns in one score (``cat([pos, drawn])`` looked up at once):
                # the drawn positions are a negative score, the others a positive one
                draw_id, mask = hits[0]
                record["draws"] = [draw_id]
                rest = dict(record, draws=[])
                records.append(rest)
                used.add(draw_id)
                handles.append(check_hook(node.register_hook(self._reader(record, mask, rest))))
            else:
                handles.append(check_hook(node.register_hook(self._reader(record))))
        draws = {str(d[0]): {"loc": d[3], "fn": d[4]} for d in fresh if d[0] in used}
        ranges = self._ranges({node: lookups[node] for node in direct}, lookups, fresh)
        self._pending.append((records, draws, self.rec.here(), handles, ranges))

    @staticmethod
    def _ranges(drawn, lookups, fresh) -> list:
        """The drawn embedding lookups (``drawn``: those whose indices are a draw itself) whose
        draw's bound is below their table's rows: the bound, the rows, the other tables' rows
        and the share of the data's indices into the table at the bound or above (``ranges`` of
        the aside)."""
        tables = {node: _table(node) for node in lookups}
        tables = {node: table for node, table in tables.items() if table is not None}
        found = []
        by_id = {d[0]: d for d in fresh}
        for node, table in tables.items():
            for draw_id in drawn.get(node, ()):
                draw = by_id.get(draw_id)
                high = draw[5] if draw is not None and len(draw) > 5 else None
                if high is None or not 0 < high < table[1]:
                    continue
                values = draw[2]
                idx = _indices(node).detach().reshape(-1).to(torch.int64)
                data = [idx[idx != values]] if idx.numel() == values.numel() else []
                data += [_indices(other).detach().reshape(-1).to(torch.int64)
                         for other, theirs in tables.items()
                         if theirs[0] == table[0] and not lookups[other]]
                data = torch.cat(data) if data else torch.zeros(0, dtype=torch.int64)
                others = sorted({theirs[1] for theirs in tables.values() if theirs[0] != table[0]})
                found.append({"draw": draw_id, "loc": draw[3], "fn": draw[4], "high": high,
                              "rows": table[1], "others": others, "data": int(data.numel()),
                              "beyond": round(float((data >= high).float().mean()), 4)
                              if data.numel() else 0.0})
        return found

    def _matching(self, idx, fresh) -> list:
        found = []
        flat = None
        n = idx.numel()
        for draw_id, _, values, *_ in fresh:
            m = values.numel()
            if m > n and m % n == 0 and m // n <= _ENDS and n >= _MIN_DRAWN:
                # one end of a drawn edge list: the lookup reads a row (``neg[0]`` of a (2, E)
                # draw) or a column (``neg[:, 1]`` of an (E, 2) one) of the draw
                if flat is None:
                    flat = idx.detach().reshape(-1).to(torch.int64)
                k = m // n
                ends = list(values.view(k, n)) + list(values.view(n, k).t())
                if any((end == flat).float().mean().item() >= _AGREE for end in ends):
                    found.append(draw_id)
                continue
            if m > n or m * 4 < n or m < _MIN_DRAWN:
                continue
            if flat is None:
                flat = idx.detach().reshape(-1).to(torch.int64)
            # the whole lookup, or (a draw written into part of a batch) its first or last rows
            parts = (flat,) if m == n else (flat[:m], flat[n - m:])
            if any((part == values).float().mean().item() >= _AGREE for part in parts):
                found.append(draw_id)
        return found

    def _tables(self) -> list:
        """The integer tables (numpy arrays or CPU tensors, 1-D or 2-D with a few columns) the
        calling frames' variables and their module's globals hold: what a draw may be an index
        into (a unigram noise table, the data's pairs)."""
        numpy = sys.modules.get("numpy")
        found: list = []
        ids: set = set()
        frames = 0
        for frame in self.rec.finder.user_frames(sys._getframe(1)):
            for space in (frame.f_locals, frame.f_globals):
                for i, value in enumerate(list(space.values())):
                    if i >= _NAMES_READ or len(found) >= _TABLES:
                        break
                    if id(value) in ids:
                        continue
                    table = None
                    if isinstance(value, torch.Tensor):
                        if value.device.type == "cpu" and not value.requires_grad and \
                                value.dtype in (torch.int64, torch.int32, torch.int16, torch.uint8):
                            table = value.detach()
                    elif numpy is not None and isinstance(value, numpy.ndarray) and \
                            value.dtype.kind in ("i", "u") and value.dtype.itemsize <= 8:
                        table = value
                    if table is None or table.ndim not in (1, 2) or table.shape[0] < 2:
                        continue
                    width = table.shape[1] if table.ndim == 2 else 1
                    if not 1 <= width <= _TABLE_COLUMNS or table.shape[0] * width > _TABLE_ELEMENTS:
                        continue
                    try:
                        as_tensor = torch.as_tensor(table).to(torch.int64)
                    except Exception:
                        continue
                    ids.add(id(value))
                    found.append(as_tensor)
            frames += 1
            if frames >= _FRAMES:
                break
        return found

    @staticmethod
    def _through_tables(idx, fresh, tables) -> list:
        """The draws whose values, read through one of the tables (``table[draw]``, or one
        column of a 2-D table: ``pairs[draw, 0]``), are the lookup's indices."""
        n = idx.numel()
        found = []
        flat = None
        for draw_id, _, values, *_ in fresh:
            if values.numel() != n or n < _MIN_DRAWN or int(values.min()) < 0:
                continue
            top = int(values.max())
            for table in tables:
                if top >= table.shape[0]:
                    continue
                if flat is None:
                    flat = idx.detach().reshape(-1).to(torch.int64)
                read = table[values]
                picks = [read] if read.dim() == 1 else list(read.t())
                if any((pick == flat).float().mean().item() >= _AGREE for pick in picks):
                    found.append(draw_id)
                    break
        return found

    @staticmethod
    def _columns(idx, fresh):
        """(draw id, mask of idx's positions) when a 2-D lookup's first or last columns are a
        draw (``cat([positive[:, None], drawn], 1)``), else None."""
        if idx.dim() != 2:
            return None
        rows, cols = idx.shape
        for draw_id, _, values, *_ in fresh:
            m = values.numel()
            if m % rows or not 0 < m // rows < cols:
                continue
            k = m // rows
            drawn = values.view(rows, k)
            for start in (cols - k, 0):
                part = idx[:, start:start + k].to(torch.int64)
                if (part == drawn).float().mean().item() >= _AGREE:
                    mask = torch.zeros(rows, cols, dtype=torch.bool)
                    mask[:, start:start + k] = True
                    return draw_id, mask
        return None

    def _reach(self, node, lookups, columns, anchors, orient):
        """(the draws of the lookups below a score node, the keys of their indices, the drawn
        columns of the lookups it reads), or None when it reads no lookup (a dot product: on
        each side)."""
        sides = _children(node)
        if orient == "sim" and type(node).__name__ == "SumBackward1":
            sides = _children(sides[0])
        if orient == "sim" and len(sides) != 2:
            return None
        groups = [[side] for side in sides] if orient == "sim" else [sides]
        draws: set = set()
        read: set = set()
        hits: list = []
        for group in groups:
            found = False
            seen = set(group)
            stack = list(group)
            while stack and len(seen) < _REACH:
                item = stack.pop()
                if item in lookups:
                    found = True
                    draws.update(lookups[item])
                    read.update(anchors[item])
                    if item in columns:
                        hits.append(columns[item])
                    continue
                for child in _children(item):
                    if child not in seen:
                        seen.add(child)
                        stack.append(child)
            if not found:
                return None
        return draws, read, hits

    @staticmethod
    def _reader(record, mask=None, rest=None):
        def read(into, grad) -> None:
            down = float(grad.clamp(min=0).sum())  # descent lowers the value
            rise = float((-grad).clamp(min=0).sum())  # descent raises it
            total = down + rise
            if total > 0 and total == total:
                up = rise if into["orient"] == "sim" else down
                mass = into["mass"] + total
                prior = (into["up"] or 0.0) * into["mass"]
                into["up"], into["mass"] = (prior + up) / mass, mass

        def hook(grad_inputs, grad_outputs) -> None:
            try:
                grad = grad_outputs[0] if grad_outputs else None
                if grad is None or grad.device.type != "cpu" or not grad.dtype.is_floating_point:
                    return
                grad = grad.detach()
                if mask is None:
                    read(record, grad)
                elif grad.numel() == mask.numel():
                    grad = grad.reshape(mask.shape)
                    read(record, grad[mask])
                    read(rest, grad[~mask])
            except Exception:
                pass
        return hook

    def _names(self, nodes) -> dict:
        """The calling frames' variables bound to a score (or to a view, negation of one)."""
        wanted = set(nodes)
        names: dict = {}
        frames = 0
        for frame in self.rec.finder.user_frames(sys._getframe(2)):
            for i, (name, value) in enumerate(list(frame.f_locals.items())):
                if i >= _NAMES_READ:
                    break
                node = getattr(value, "grad_fn", None) if isinstance(value, torch.Tensor) else None
                for _ in range(4):
                    if node is None:
                        break
                    if node in wanted:
                        names.setdefault(node, [])
                        if name not in names[node] and len(names[node]) < 4:
                            names[node].append(name)
                        break
                    children = _children(node)
                    if len(children) != 1 or not type(node).__name__.startswith(_VIEWS):
                        break
                    node = children[0]
            frames += 1
            if frames >= _FRAMES:
                break
        return names

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for records, draws, loc, handles, ranges in pending:
            for handle in handles:
                try:
                    handle.remove()
                except Exception:
                    pass
            if sum(1 for r in records if r["up"] is not None) >= 2:
                self.rec.emit_aside(ev.sampled_scores(scores=records, draws=draws,
                                                      line=getattr(loc, "line", None),
                                                      ranges=ranges), loc)

    def _close(self) -> None:
        self._open = False
        self._draws = []
        self._unwrap()

    def _unwrap_or_retire(self) -> None:
        if self._restore:
            self._unwrap()
        if not self._restore and not self._pending:
            self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
            self.rec.retire(STEPPED, self.after_step)

    def _unwrap(self) -> None:
        restore, self._restore = self._restore, []
        for owner, name, original, wrapper in restore:
            try:  # under another watcher's wrapper, left to it (retired: it skips this one)
                put_back(owner, name, original, wrapper)
            except Exception as exc:
                self.rec.internal_error(_LABEL, exc)
