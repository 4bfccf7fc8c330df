"""Token losses whose prompt mask is inverted: the labels ignore each row's response and train
on its prompt (``prompt-mask-inverted``).

Supervised fine-tuning trains a causal language model on the response only: the labels are the
input ids with the prompt's positions (and the padding) set to the loss's ``ignore_index``
(-100). A comparison the wrong way round (``labels[pos >= prompt_len] = -100``,
``masked_fill(response_mask, -100)``, ``labels = prompt + [-100] * len(response)``) keeps the
prompt and ignores the response: the model learns to predict the instructions and never the
answers, and the loss falls as usual.

What the run shows, with no name read: the counted targets of a ``cross_entropy`` / ``nll_loss``
call are the tokens of a (batch, length) batch the script embedded (read back into its rows,
shifted by at most one position: labels = input ids, or the next ones), and in most rows the
ignored positions are exactly one run at the row's end that holds real tokens (ids other than
the row's trailing filler and the embedding's ``padding_idx``), with counted positions before
it. A correct mask ignores the prompt at the row's start (and the padding at its end, whose
ids are one filler); padding alone, a last position with no next token (one position), a
seq2seq target padded with -100 (its decoder inputs are the filler there), a chat whose system
prompt is masked at the start: none has that shape.

Watched while ``open``: the first ``_CALLS`` loss calls with a gradient whose integer targets
sit on the CPU (``LossCalls`` tells ``loss_call``), and the latest ``_BATCHES`` CPU integer
(batch, length) batches given to ``F.embedding`` until then (references only; the wrapper does
nothing once closed). One ``prompt_trained`` aside event per loss line, at the loss call.

A masked LM whose [MASK] id went to the positions its labels ignore (the selection of the
replaced tokens drawn from the complement of the labelled ones) is seen from the same batch: the
ignored positions inside most rows hold one id, the counted positions never do, and no id fills
most counted positions (``mask_beside_labels``: a ``masked_visible`` aside, ``by`` mask_beside).

The same comparison shows masked-token labels set the wrong way (``masked-target-visible``):
labels that are, where counted, the very tokens of the batch embedded last at the same
position, while inside most rows the ignored positions hold one id no counted position holds
(the [MASK] id: what the input hides is what the labels leave out). A ``masked_visible`` aside at the loss call. BERT's
80/10/10 (a tenth of the counted tokens kept) is far below the 90 % match; a causal model's
shifted labels are not at the same position; a prompt or padding is a run at a row's end.
Cost: a few comparisons of each judged target with a remembered batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import events as ev
from .constlabels import ignored_index
from .graphpaths import saved
from .inlinable import watched
from .recorder import Recorder

_CALLS = 8  # loss calls with integer CPU targets judged (the first ones)
_HEARD = 64  # loss calls heard at all (any function, any target): then closed for good
_BATCHES = 4  # latest embedded token batches remembered
_MAX_CELLS = 1 << 20  # targets larger than this are not read
_MIN_COUNTED = 8  # counted targets a match with the token batch is judged on, at least
_MATCH = 0.9  # share of the counted targets equal to the batch's tokens at one offset
_ROW_SHARE = 0.75  # rows with the inverted shape: at least this share of the rows
_MIN_ROWS = 2  # and at least this many
_MIN_TAIL = 2  # real tokens in a row's ignored end run, at least
_SPREAD = 0.5  # rows (at least _MIN_ROWS) whose ignored positions are not only runs at its ends
_SPECIAL = 0.5  # ignored positions inside a row holding one id never counted, at least this share
_COUNTED = (0.05, 0.95)  # share of the positions counted: the labels are a restriction


def prompt_trained(ids, pads, target, ignore: int) -> dict | None:
    """What shows an inverted prompt mask in ``target`` (a loss's integer targets) read against
    ``ids`` (a (batch, length) token batch the script embedded, ``pads`` its known padding ids),
    or None: the targets are the batch's tokens at offset 0 or 1 where counted, and in most rows
    the ignored positions are one run at the row's end holding real tokens."""
    rows, length = int(ids.shape[0]), int(ids.shape[1])
    if rows < _MIN_ROWS or length < 4:
        return None
    count = target.numel()
    widths = [w for w in (length, length - 1) if rows * w == count
              and (target.dim() == 1 or (target.dim() == 2 and tuple(target.shape) == (rows, w)))]
    for width in widths:
        t = target.reshape(rows, width)
        ignored = t == ignore
        for offset in (1, 0):
            span = min(width, length - offset)  # label j is ids[j + offset]
            if span < 4:
                continue
            counted = ~ignored[:, :span]
            n = int(counted.sum())
            if n < _MIN_COUNTED:
                continue
            same = (t[:, :span] == ids[:, offset:offset + span]) & counted
            if int(same.sum()) < _MATCH * n:
                continue
            return _tail_rows(ids, pads, ignored, offset, span)
    return None


def labels_visible(ids, target, ignore: int) -> dict | None:
    """What shows masked-token labels set at the tokens the model is given (masked-target-visible),
    or None: the counted targets are, at 90 % of them, the embedded token at the same position;
    in most rows positions inside the row (not only runs at its ends: a prompt, padding) are
    ignored, and most of those hold one id that no counted position holds (a [MASK] id: the
    positions the input hides are the ones the labels leave out); the counted labels hold more
    than one value."""
    rows, length = int(ids.shape[0]), int(ids.shape[1])
    if rows < _MIN_ROWS or length < 4 or target.numel() != rows * length \
            or (target.dim() == 2 and tuple(target.shape) != (rows, length)):
        return None
    t = target.reshape(rows, length)
    ignored = t == ignore
    counted = ~ignored
    n = int(counted.sum())
    if n < _MIN_COUNTED or not _COUNTED[0] <= n / (rows * length) <= _COUNTED[1]:
        return None
    same = int(((t == ids) & counted).sum())
    if same < _MATCH * n or int(torch.unique(t[counted]).numel()) < 2:
        return None  # (one counted value: labels taken after masking, labels-one-value's bug)
    positions = torch.arange(length)
    # each row's leading and trailing ignored runs (a prompt, padding) are left aside
    first_counted = torch.where(counted, positions, torch.full_like(positions, length)).amin(1)
    last_counted = torch.where(counted, positions, torch.full_like(positions, -1)).amax(1)
    inside = ignored & (positions[None] > first_counted[:, None]) & (positions[None] < last_counted[:, None])
    spread = int(inside.any(1).sum())
    if spread < _MIN_ROWS or spread < _SPREAD * rows:
        return None
    held = ids[inside]
    if held.numel() == 0:
        return None
    # the hidden positions hold one id (the [MASK] id) that no counted position holds
    values, counts = torch.unique(held, return_counts=True)
    top = int(counts.argmax())
    share = int(counts[top]) / held.numel()
    if share < _SPECIAL or bool((ids[counted] == values[top]).any()):
        return None
    return {"how": "ignore_index", "counted": round(n / (rows * length), 4),
            "visible": round(same / n, 4), "hidden": round(share, 4), "by": "tokens",
            "positions": rows * length, "features": 1, "normalised": False, "ignore_index": ignore}


def mask_beside_labels(ids, target, ignore: int, classes: int | None) -> dict | None:
    """What shows a masked language model whose [MASK] id is written at the positions its labels
    ignore (``replaced = ... & ~masked`` for ``& masked``), or None: the loss counts a minority of
    the positions (``_COUNTED``, at most half), its labels are ids of the vocabulary it scores
    (``classes``) holding three values or more, and inside most rows the ignored positions hold,
    at ``_SPECIAL`` of them or more, one id that neither a counted label nor the input at a
    counted position ever holds: the hidden positions are the ones the loss leaves out, and the
    ones it counts show the model their token or a random one. A filler the loss leaves out on
    purpose (alignment gaps, separators) sits beside a mask id at most counted positions, or
    beside a loss over most positions: both silent."""
    rows, length = int(ids.shape[0]), int(ids.shape[1])
    if classes is None or classes < 8 or rows < _MIN_ROWS or length < 4 \
            or target.numel() != rows * length \
            or (target.dim() == 2 and tuple(target.shape) != (rows, length)):
        return None
    t = target.reshape(rows, length)
    counted = t != ignore
    n = int(counted.sum())
    if n < _MIN_COUNTED or not _COUNTED[0] <= n / (rows * length) <= 0.5 \
            or int(ids.max()) >= classes or int(t[counted].max()) >= classes \
            or int(t[counted].min()) < 0 or int(torch.unique(t[counted]).numel()) < 3:
        return None
    positions = torch.arange(length)
    first_counted = torch.where(counted, positions, torch.full_like(positions, length)).amin(1)
    last_counted = torch.where(counted, positions, torch.full_like(positions, -1)).amax(1)
    inside = ~counted & (positions[None] > first_counted[:, None]) & (positions[None] < last_counted[:, None])
    spread = int(inside.any(1).sum())
    if spread < _MIN_ROWS or spread < _SPREAD * rows:
        return None
    held = ids[inside]
    if held.numel() < _MIN_COUNTED:
        return None
    values, counts = torch.unique(held, return_counts=True)
    top = int(counts.argmax())
    mask_id, share = int(values[top]), int(counts[top]) / held.numel()
    if share < _SPECIAL or bool((ids[counted] == mask_id).any()) or bool((t[counted] == mask_id).any()):
        return None
    # a correct masking puts one id (its own mask id) at most counted positions: then the id
    # inside the ignored positions is a filler the loss leaves out on purpose (alignment gaps)
    shown = torch.unique(ids[counted], return_counts=True)[1]
    if int(shown.max()) >= _SPECIAL * n:
        return None
    same = int(((t == ids) & counted).sum())
    return {"how": "ignore_index", "counted": round(n / (rows * length), 4),
            "visible": round(same / n, 4), "hidden": round(share, 4), "by": "mask_beside",
            "positions": rows * length, "features": 1, "normalised": False, "ignore_index": ignore,
            "mask_id": mask_id}


def _indexed_visible(ids, logits, target) -> dict | None:
    """``labels_visible`` for targets read through a boolean index (``cross_entropy(logits[m],
    ids[m])``): the targets put back at the positions the index picked, -1 elsewhere."""
    node = getattr(logits, "grad_fn", None)
    if type(node).__name__ != "IndexBackward0" or target.dim() != 1:
        return None
    indices = saved(node, "_saved_indices")
    if not isinstance(indices, (list, tuple)) or len(indices) != 1:
        return None
    index = indices[0]
    if not isinstance(index, torch.Tensor) or index.dtype != torch.bool \
            or index.numel() != ids.numel() or index.device.type != "cpu":
        return None
    index = index.reshape(ids.shape)
    if int(index.sum()) != target.numel():
        return None
    full = torch.full_like(ids, -1)
    full[index] = target.to(ids.dtype)
    found = labels_visible(ids, full, -1)
    if found is not None:
        found.update(how="index", ignore_index=None)
    return found


def _tail_rows(ids, pads, ignored, offset: int, span: int) -> dict | None:
    rows, width = ignored.shape
    positions = torch.arange(width)
    any_ignored = ignored.any(1)
    # first ignored position of each row (width where none): the run must cover the rest
    first = torch.where(ignored, positions, torch.full_like(positions, width)).amin(1)
    run = positions[None, :] >= first[:, None]
    one_run = any_ignored & (first >= 1) & (ignored == run).all(1)
    # real tokens in the run: not the row's trailing filler, not a known padding id
    tokens = ids[:, offset:offset + span]
    filler = ids[:, -1:]
    real = tokens != filler
    for pad in pads:
        real &= tokens != pad
    in_run = run[:, :span] & real
    tail = in_run.sum(1)
    inverted = one_run & (tail >= _MIN_TAIL)
    hits = int(inverted.sum())
    if hits < _MIN_ROWS or hits < _ROW_SHARE * rows:
        return None
    kept = (~ignored).sum(1).float()
    return {"rows": rows, "inverted_rows": hits, "offset": offset,
            "kept": round(float(kept[inverted].mean()), 2),
            "ignored_real": round(float(tail[inverted].float().mean()), 2)}


def _classes(scores) -> int | None:
    """The number of classes a token loss scores: the last axis of (N, C) scores, the class axis
    (dim 1) of (B, C, T) ones."""
    if not isinstance(scores, torch.Tensor) or scores.dim() < 2:
        return None
    return int(scores.shape[-1] if scores.dim() == 2 else scores.shape[1])


class PromptMaskWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._calls = 0
        self._heard = 0
        self._batches: list = []  # (token batch, padding_idx), the latest last
        self._told: set = set()  # loss lines recorded

    @property
    def open(self) -> bool:
        # a script whose losses never qualify (no token targets) closes it too: its listener
        # and the embedding wrapper are then off a long run's every call
        return self._calls < _CALLS and self._heard < _HEARD

    def embedded(self, tokens, pad) -> None:
        if not (isinstance(tokens, torch.Tensor) and tokens.dim() == 2 and tokens.shape[0] >= _MIN_ROWS
                and tokens.shape[1] >= 4 and not tokens.is_floating_point()
                and tokens.dtype is not torch.bool and tokens.device.type == "cpu"
                and tokens.numel() <= _MAX_CELLS):
            return
        self._batches = [b for b in self._batches if b[0] is not tokens][-(_BATCHES - 1):]
        self._batches.append((tokens, pad if isinstance(pad, int) else None))

    def loss_call(self, fn: str, input, target, args, kwargs) -> None:
        self._heard += 1
        if fn not in ("cross_entropy", "nll_loss") or not self._batches:
            return
        if not (isinstance(target, torch.Tensor) and target.device.type == "cpu"
                and 8 <= target.numel() <= _MAX_CELLS and target.dim() in (1, 2)):
            return
        ignore = ignored_index(fn, target, args, kwargs)
        if ignore is None:
            return
        self._calls += 1
        with torch.no_grad():
            found = visible = None
            for tokens, pad in reversed(self._batches):
                pads = [pad] if pad is not None else []
                found = prompt_trained(tokens.detach(), pads, target.detach(), ignore)
                if found is not None:
                    break
                if tokens is self._batches[-1][0]:  # the batch embedded last: the model's own
                    visible = labels_visible(tokens.detach(), target.detach(), ignore) \
                        or _indexed_visible(tokens.detach(), input, target.detach()) \
                        or mask_beside_labels(tokens.detach(), target.detach(), ignore, _classes(input))
        if found is None:
            if visible is not None:
                loc = self.rec.here(3)
                if loc not in self._told:
                    self._told.add(loc)
                    self.rec.emit_aside(ev.masked_visible(**visible), loc)
            return
        loc = self.rec.here(3)
        if loc in self._told:
            return
        self._told.add(loc)
        self.rec.emit_aside(ev.prompt_trained(fn=fn, ignore_index=ignore, **found), loc)

    def install(self, patcher) -> None:
        watcher = self

        def before(args, kwargs) -> None:
            if not watcher.open:
                watcher._batches = []
                return
            try:
                tokens = args[0] if args else kwargs.get("input")
                pad = args[2] if len(args) > 2 else kwargs.get("padding_idx")
                watcher.embedded(tokens, pad)
            except Exception as exc:
                watcher.rec.internal_error("F.embedding prompt mask", exc)

        embedding = watched(F.embedding, before)
        original = F.embedding
        embedding.__prepare_scriptable__ = lambda: original
        patcher.patch(F, "embedding", embedding)
