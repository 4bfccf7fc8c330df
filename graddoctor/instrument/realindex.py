"""A value that a loss or an embedding sets apart as "nothing here" which the data uses as a real
class or token: ``nn.CrossEntropyLoss(ignore_index=0)`` over labels where 0 is one of the
classes (every sample of it drops out of the loss), ``nn.Embedding(V, d, padding_idx=1)`` over
text where token 1 is a frequent word (its vector gets no gradient and stays as it was made).

The two arguments are meant for padding and for positions without a label, and the data says
which it is. Padding fills the shorter rows of a token batch at one end, in runs of different
lengths (``loss_inputs.fill_runs``, the structure ``infer_fill`` and loss-counts-padding read);
a "no label" marker (-100, a segmentation's void 255) lies outside the classes. A real class or
token is one the model outputs and that occurs where content is: in a batch of one label per
sample (``(N,)`` targets), about as often as the other classes; in rows, inside them (not in
the run at either end), one id among the others.

What is read, for the first ``READS`` calls of each loss line or module (on a GPU only before
the first optimizer step: no host sync in the updates after it), in the first ``STEPS``
optimizer steps and the first ``CALLS`` calls (nothing after them):

* ``cross_entropy`` / ``nll_loss`` with a gradient and an integer ``ignore_index`` in
  ``[0, C)`` (``loss_inputs.py``'s wrapper hands them over with the pad ids it knows). Targets
  laid out as rows: ``(B, T)`` against a ``(B, C, T)`` input, or flat ones that are a view of a
  ``(B, T)`` tensor or whose scores were reshaped from ``(B, T, C)``. When the ignored value
  pads the rows (runs at one end, ``fill_runs``) and also occurs inside them at
  ``INSIDE_SHARE`` of the content positions or more, one label stands for both padding and a
  class (a tagger's "O" tag that is also its padding label). When it does not pad them, it is
  judged as one class among the others over all positions (``_like_a_class``, at most
  ``TOKEN_MAJORITY`` of them: a marker on most positions is a masked LM's "no label"). A token
  loss (as many classes as an embedding has rows) whose ignored value is that embedding's pad
  id is left alone (a masked LM's labels 0 where it does not predict). Targets of one label per
  sample are counted over the calls (``COUNT_FROM`` of them at least, ``MIN_COUNT`` of the
  ignored value): a class is like the others when its share is at least ``LOW`` of the median
  other class's and at most ``HIGH`` times the largest other's (a rare "unlabelled" marker, or
  one on most samples, is left alone).
* ``F.embedding`` with a ``padding_idx`` over a 2-D CPU token batch (either orientation): the
  padding id inside the rows at ``INSIDE_SHARE`` of the content or more, mostly alone (a real
  token is seldom repeated; padding between segments comes in runs), as frequent as a token
  there (``_like_a_class``).
* ``F.embedding`` with a ``padding_idx`` over a 1-D CPU batch of ids (a categorical feature, one
  id per sample: nothing to pad): the pad id, counted over the first calls (``COUNT_FROM`` ids),
  as frequent as the median other category and at most ``HIGH`` times the largest
  (``layout="categories"``). A "missing" marker rarer than that is left alone; one as frequent
  as a category is told as one (its row never trains either way).

Where it points: the module's construction (``nn.CrossEntropyLoss``, ``nn.NLLLoss`` and
``nn.Embedding`` record theirs when given the argument), else the call's line. One
``real_index`` aside event per site.
"""

from __future__ import annotations

import sys
import weakref

import torch
from torch import nn

from .. import events as ev
from .loss_inputs import _class_dim, _reshaped_from, fill_runs
from .recorder import Recorder

READS = 8  # calls judged per loss line, loss module or embedding
STEPS = 16  # optimizer steps after which nothing is looked at any more
CALLS = 512  # calls looked at in all, losses and embeddings each (a site is found per call)
COUNT_FROM = 128  # one-label-per-sample targets counted before a class share is judged
MIN_COUNT = 8  # ... with at least this many of the ignored value
LOW = 0.5  # a class's share at least this fraction of the median other class's
HIGH = 2.0  # ... and at most this multiple of the largest other class's
TOKEN_MAJORITY = 0.5  # a value on more positions than this is a marker, not a token
INSIDE_SHARE = 0.02  # occurrences inside the rows, as a share of the content positions
MIN_INSIDE = 4  # ... and at least this many
SINGLE_SHARE = 0.5  # occurrences inside the rows standing alone, at least this share
MAX_CELLS = 1 << 20  # tensors larger than this are not read
MAX_SITES = 256
_FRAMES = 6  # frames walked up from a loss call for the nn module that made it


def _weak_site(sites: dict, obj, loc) -> None:
    if len(sites) >= MAX_SITES:
        return
    key = id(obj)

    def forget(ref, key=key):
        if sites.get(key, (None,))[0] is ref:
            del sites[key]

    sites[key] = (weakref.ref(obj, forget), loc)


def _site(sites: dict, obj):
    entry = sites.get(id(obj))
    return entry[1] if entry is not None and entry[0]() is obj else None


def _edges(same):
    """The positions of a (rows, length) mask in the run of True at the start or the end of
    their row."""
    length = same.shape[1]
    lead = same.int().cumprod(1).sum(1)
    trail = same.flip(1).int().cumprod(1).sum(1)
    pos = torch.arange(length)
    return (pos[None] < lead[:, None]) | (pos[None] >= (length - trail)[:, None])


def _like_a_class(counts, value: int, upper: float | None, majority: float | None) -> dict | None:
    """Whether ``value`` is as frequent as one class among the others in ``counts`` (occurrences
    per class): its share at least ``LOW`` times the median share of the other classes present
    (one at least: a binary task's negatives are a class too), at most ``upper`` times the largest other's, at most ``majority`` of all.
    The shares, or None."""
    total = float(counts.sum())
    mine = float(counts[value])
    others = torch.cat([counts[:value], counts[value + 1:]])
    others = others[others > 0]
    if total <= 0 or mine <= 0 or others.numel() < 1:
        return None
    share, median, largest = mine / total, float(others.median()) / total, float(others.max()) / total
    if share < LOW * median:
        return None  # rare: an "unlabelled" marker, an unknown word
    if upper is not None and share > upper * largest:
        return None
    if majority is not None and share > majority:
        return None
    return {"share": round(share, 4), "median": round(median, 4), "classes": int(others.numel()) + 1}


def _pads_rows(same) -> bool:
    """Whether the positions of a (rows, length) mask pad the rows: runs at one end of them
    (``fill_runs``)."""
    return fill_runs(same, -1) is not None or fill_runs(same, 0) is not None


def padding_inside(rows, value: int) -> dict | None:
    """For ``value`` that pads the (B, T) ``rows`` (``_pads_rows``): its occurrences inside
    them, when they make up ``INSIDE_SHARE`` of the content positions or more (one label for
    padding and for a class), else None."""
    same = rows == value
    edge = _edges(same)
    inside = int((same & ~edge).sum())
    content = same.numel() - int(edge.sum())
    if content <= 0 or inside < max(MIN_INSIDE, INSIDE_SHARE * content):
        return None
    return {"layout": "padded rows", "share": round(inside / content, 4), "inside": inside,
            "content": content}


def token_inside(tokens, value: int, vocab: int) -> dict | None:
    """The padding id ``value`` of a (B, T) or (T, B) token batch used as a token: inside the
    rows (out of the runs at their ends; the rows are those it pads, if it pads the batch's
    columns and not its rows, the columns) at ``INSIDE_SHARE`` of the content or more, mostly
    standing alone, as frequent there as a token (``_like_a_class``). None otherwise."""
    ids = tokens
    same = ids == value
    if not _pads_rows(same) and _pads_rows(same.t()):
        ids, same = ids.t(), same.t()  # sequence-first
    edge = _edges(same)
    inside = same & ~edge
    count = int(inside.sum())
    content = ids.numel() - int(edge.sum())
    if content <= 0 or count < max(MIN_INSIDE, INSIDE_SHARE * content):
        return None
    before = torch.nn.functional.pad(same[:, :-1], (1, 0))
    after = torch.nn.functional.pad(same[:, 1:], (0, 1))
    single = int((inside & ~before & ~after).sum())
    if single < SINGLE_SHARE * count:
        return None  # runs of it: padding between segments, not a word
    kept = ids[~edge]
    kept = kept[(kept >= 0) & (kept < vocab)]
    found = _like_a_class(torch.bincount(kept, minlength=vocab)[:vocab].double(), value,
                          None, TOKEN_MAJORITY)
    if found is None:
        return None
    return {"layout": "tokens", "share": found["share"], "median": found["median"],
            "inside": count, "content": content}


class RealIndexWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._loss_sites: dict = {}  # id(loss module) -> (weak ref, its construction's location)
        self._embedding_sites: dict = {}  # id(embedding weight) -> (weak ref, construction)
        self._reads: dict = {}  # site key -> calls judged
        self._counts: dict = {}  # site key -> counts per class of one-label-per-sample targets
        self._stepwise: dict = {}  # site key -> backward count at its last 1-D lookup (-1: a loop)
        self._told: set = set()
        self._forwards: tuple = ()  # the code of the nn loss modules' forward
        self._loss_calls = 0  # calls looked at (``CALLS``)
        self._embedding_calls = 0

    # -- constructions -----------------------------------------------------------------------
    def _wrap_init(self, original, sites: dict, argument: str, key):
        watcher = self

        def __init__(module, *args, **kwargs):
            original(module, *args, **kwargs)
            try:
                value = getattr(module, argument, None)
                if isinstance(value, int) and not (argument == "ignore_index" and value < 0):
                    loc = watcher.rec.here(2)
                    if loc is not None:
                        _weak_site(sites, key(module), loc)
            except Exception as exc:
                watcher.rec.internal_error(f"{type(module).__name__}.__init__", exc)

        __init__.__wrapped__ = original
        __init__.__name__ = original.__name__
        __init__.__doc__ = original.__doc__
        return __init__

    def _loss_module_site(self):
        """The construction of the nn loss module whose forward made the current call, or None
        (a functional call)."""
        frame, forwards = sys._getframe(3), self._forwards
        for _ in range(_FRAMES):
            if frame is None:
                return None
            if frame.f_code in forwards:
                module = frame.f_locals.get("self")
                return _site(self._loss_sites, module) if module is not None else None
            frame = frame.f_back
        return None

    def _read(self, key, tensor) -> bool:
        done = self._reads.get(key, 0)
        if done >= READS or key in self._told or (self.rec.progress.steps and tensor.device.type != "cpu"):
            return False
        self._reads[key] = done + 1
        return True

    # -- losses --------------------------------------------------------------------------------
    def loss_call(self, fn: str, input, target, args, kwargs, pads) -> None:
        """A ``cross_entropy`` / ``nll_loss`` call with a gradient; ``pads``: the (pad id,
        vocabulary size) pairs of the embeddings the script ran (loss_inputs.py's)."""
        ignore = args[4] if len(args) > 4 else kwargs.get("ignore_index", -100)
        if not (isinstance(ignore, int) and ignore >= 0 and isinstance(target, torch.Tensor)
                and isinstance(input, torch.Tensor) and input.dim() >= 2
                and target.dtype not in (torch.bool,) and not target.is_floating_point()
                and target.dim() == input.dim() - 1 and target.dim() in (1, 2)
                and 0 < target.numel() <= MAX_CELLS):
            return
        self._loss_calls += 1
        if self._loss_calls > CALLS or self.rec.progress.steps >= STEPS:
            return
        classes = int(input.shape[_class_dim(input, fn)])
        if ignore >= classes:
            return  # outside the classes: a void label (255)
        if (ignore, classes) in pads:
            return  # a token loss ignoring its embedding's pad id (a masked LM's "no label")
        module = self._loss_module_site()
        loc = module if module is not None else self.rec.here(3)
        key = ("loss", loc, fn)
        if loc is None or not self._read(key, target):
            return
        api = ("nn.CrossEntropyLoss" if fn == "cross_entropy" else "nn.NLLLoss") if module is not None \
            else f"F.{fn}"
        with torch.no_grad():
            rows = self._rows(input, target)
            if rows is not None:
                # the value pads the rows, or the columns of sequence-first (T, B) targets
                # (nn.Transformer's default), where each column is a sequence. A batch can look
                # padded both ways: the value is padding when, read one of the ways it pads,
                # it stays at the ends
                padded = [r for r in (rows, rows.T) if _pads_rows(r == ignore)]
                if padded:
                    inside = [padding_inside(r, ignore) for r in padded]
                    found = None if None in inside else inside[0]
                else:
                    kept = rows[(rows >= 0) & (rows < classes)]
                    found = _like_a_class(torch.bincount(kept.reshape(-1), minlength=classes)[:classes]
                                          .double(), ignore, None, TOKEN_MAJORITY)
                    if found is not None:
                        found = {"layout": "rows", **found}
            else:
                flat = target.detach().reshape(-1).cpu()
                flat = flat[(flat >= 0) & (flat < classes)]
                counts = torch.bincount(flat, minlength=classes)[:classes].double()
                seen = self._counts.get(key)
                counts = counts if seen is None or seen.numel() != classes else seen + counts
                self._counts[key] = counts
                found = None
                if float(counts.sum()) >= COUNT_FROM and float(counts[ignore]) >= MIN_COUNT:
                    found = _like_a_class(counts, ignore, HIGH, None)
                    if found is not None:
                        found = {"layout": "classes", "seen": int(counts.sum()), **found}
        if found is None:
            return
        self._told.add(key)
        self.rec.emit_aside(ev.real_index(argument="ignore_index", value=ignore, api=api,
                                          size=classes, **found), loc)

    @staticmethod
    def _rows(input, target):
        """The targets as (B, T) rows on the CPU, or None: (B, T) targets of a (B, C, T)
        input, or flat ones viewed from a (B, T) tensor or scored by a (B, T, C) output
        reshaped."""
        if target.dim() == 2:
            rows = target
        else:
            base = target._base
            if (base is not None and base.dim() == 2 and base.numel() == target.numel()
                    and base.is_contiguous() and target.stride() == (1,)
                    and target.storage_offset() == base.storage_offset()):
                rows = base
            else:
                source = _reshaped_from(input)
                if source is None or len(source) != 3 or source[0] * source[1] != target.numel():
                    return None
                rows = target.reshape(source[0], source[1])
        if rows.shape[0] < 2 or rows.shape[1] < 4:
            return None
        return rows.detach().cpu()

    # -- embeddings ------------------------------------------------------------------------
    def embedded(self, tokens, weight, pad) -> None:
        """An ``F.embedding`` call with a ``padding_idx``."""
        self._embedding_calls += 1
        if self._embedding_calls > CALLS or self.rec.progress.steps >= STEPS:
            return
        if not (isinstance(tokens, torch.Tensor) and isinstance(weight, torch.Tensor)
                and isinstance(pad, int) and weight.dim() == 2 and tokens.dim() in (1, 2)
                and not tokens.is_floating_point() and tokens.dtype != torch.bool
                and tokens.device.type == "cpu" and tokens.shape[0] >= 2
                and (tokens.dim() == 1 or tokens.shape[1] >= 2)
                and tokens.numel() <= MAX_CELLS):
            return
        vocab = int(weight.shape[0])
        pad = pad + vocab if pad < 0 else pad
        site = _site(self._embedding_sites, weight)
        loc = site if site is not None else self.rec.here(3)
        key = ("embedding", loc)
        if loc is None or not self._read(key, tokens):
            return
        with torch.no_grad():
            if tokens.dim() == 1:
                found = self._category(key, tokens.detach(), pad, vocab)
            else:
                found = token_inside(tokens.detach(), pad, vocab)
        if found is None:
            return
        self._told.add(key)
        self.rec.emit_aside(ev.real_index(argument="padding_idx", value=pad,
                                          api="nn.Embedding" if site is not None else "F.embedding",
                                          size=vocab, **found), loc)

    def _category(self, key, ids, value: int, vocab: int) -> dict | None:
        """One id per sample (a categorical feature): no row to pad, so ``padding_idx`` marks a
        category. Counted over the calls read (``COUNT_FROM`` ids at least, ``MIN_COUNT`` of the
        pad id), the pad id is judged like a class (``_like_a_class``): as frequent as the
        median other category (a rare "missing" marker is left alone), at most ``HIGH`` times
        the largest, three categories seen at least."""
        # a table looked up twice between two backwards with one id per row is a decoder's
        # loop reading a padded sequence one step at a time (its columns): not a category
        backwards = self.rec.progress.backward_calls
        if self._stepwise.get(key) == backwards or self._stepwise.get(key) == -1:
            self._stepwise[key] = -1
            return None
        self._stepwise[key] = backwards
        kept = ids[(ids >= 0) & (ids < vocab)]
        counts = torch.bincount(kept, minlength=vocab)[:vocab].double()
        before = self._counts.get(key)
        counts = counts if before is None or before.numel() != counts.numel() else before + counts
        self._counts[key] = counts
        total = float(counts.sum())
        if total < COUNT_FROM or float(counts[value]) < MIN_COUNT or int((counts > 0).sum()) < 3:
            return None
        found = _like_a_class(counts, value, HIGH, TOKEN_MAJORITY)
        if found is None:
            return None
        return {"layout": "categories", "share": found["share"], "median": found["median"],
                "classes": found["classes"], "seen": int(total)}

    def install(self, patcher) -> None:
        self._forwards = (nn.CrossEntropyLoss.forward.__code__, nn.NLLLoss.forward.__code__)
        for cls in (nn.CrossEntropyLoss, nn.NLLLoss):
            patcher.patch(cls, "__init__", self._wrap_init(cls.__init__, self._loss_sites,
                                                           "ignore_index", lambda m: m))
        patcher.patch(nn.Embedding, "__init__",
                      self._wrap_init(nn.Embedding.__init__, self._embedding_sites, "padding_idx",
                                      lambda m: m.weight))
