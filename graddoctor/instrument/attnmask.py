"""Attention masks that do not mask what they mean to: a padding mask with its convention
inverted, and a 0/1 float mask that attention adds to its scores.

Two conventions meet in torch: ``nn.MultiheadAttention`` (and the ``nn.Transformer*`` layers
built on it) read a boolean ``key_padding_mask`` / ``attn_mask`` as *True = leave out*, while
``F.scaled_dot_product_attention`` reads a boolean ``attn_mask`` as *True = attend* (and
Hugging Face models take ``attention_mask`` with 1 = attend). A mask written for the other
convention (``key_padding_mask=(ids != pad)``) hides every real token and lets each query attend
only to the padding. A float mask is *added* to the scores in both: a 0/1 mask (``mask.float()``)
adds at most 1 to some scores and leaves everything in.

What is watched, in the first ``STEPS`` optimizer steps, for the first ``SITE_CHECKS`` masked
calls of each ``nn.MultiheadAttention`` module from each line calling it and of each line
calling SDPA, with grad mode on and the mask on the CPU, the first ``MASK_CHECKS`` such calls in
all (nothing after them):

* ``nn.MultiheadAttention.forward`` (its ``key_padding_mask`` and ``attn_mask``, as given or as
  the ``nn.Transformer*`` layers canonicalised them) and ``F.scaled_dot_product_attention``
  (called by the script or a library; not the call ``multi_head_attention_forward`` makes,
  which carries the masks already seen).
* The token batches embedded just before (``F.embedding``: the latest ``TOKENS`` CPU
  (batch, length) integer batches, the first ``TOKEN_READS`` calls) and the id that fills their
  shorter rows: the embedding's ``padding_idx``, or the filler ``loss_inputs.infer_fill`` finds.

A mask whose keys are per sample (its first dimension the batch's) is reduced to the keys each
sample leaves out for every query. When a token batch of the same (batch, length) has padding
in at least two rows, and the keys left out are exactly the positions that do *not* hold the
fill id (98% of them or more), an ``attention_mask`` aside event with ``problem="inverted"`` is
recorded at the call. A square ``attn_mask`` (the same for every sample and head) that leaves
out exactly the keys before each query, a causal mask transposed (``tril`` where ``triu`` was
meant, or the other convention's triangle), is recorded with ``problem="reversed"``: each
position attends to itself and the future, which a next-item target then reads. A right-to-left
model needs exactly that mask (each position predicts the item before it), so the record waits
for the next backward: a token batch embedded after the attention call, or a loss's integer
targets (losscalls.py), that holds at each position the id the attention's input held one
position earlier (the previous items, looked up in the item table as positives or given to a
cross-entropy) drops it; so does a causal mask judged before the backward (a forward and a
backward model side by side). The rule also reads the targets' shift that
instrument/dependency.py finds for a model (``k = -1``: the previous items). A float mask (of any shape) whose values are only 0 and 1 (or 0 and -1),
both present, is recorded with ``problem="additive01"``. A call with no mask at all (and not
causal) whose keys have the shape of a remembered token batch in which the fill id forms runs at
one end of two rows or more and occurs almost nowhere else is recorded with
``problem="missing"``: every query attends to the padding. Each call line is recorded once.

Cost: two comparisons per call after the first ``STEPS`` optimizer steps (or the first checks);
until then one small comparison per masked call and per embedded token batch (CPU tensors only,
so no host sync on a GPU).
"""

from __future__ import annotations

import inspect
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

from .. import events as ev
from .inlinable import watched
from .loss_inputs import infer_fill
from .recorder import Recorder
from .topics import DESCRIBE_LOSS

MASK_CHECKS = 64  # masked calls judged in all (nothing after them)
STEPS = 4  # optimizer steps after which nothing is looked at any more
SITE_CHECKS = 2  # masked calls judged per attention module, or per call line of SDPA
TOKEN_READS = 16  # embedding calls whose token batch is looked at
TOKENS = 4  # the latest padded token batches remembered
PREVIOUS_SHARE = 0.9  # positions of a later batch that hold the input's id one position earlier
MAX_CELLS = 1 << 20  # masks and token batches larger than this are not read
INVERTED_SHARE = 0.98  # positions where the mask leaves out exactly the non-fill tokens
_NEGATIVE = -1e3  # an additive mask value at or below this leaves its key out
_TORCH_FUNCTIONAL = os.path.normcase(os.path.abspath(F.__file__))


class AttentionMaskWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._checks = 0  # masked calls judged
        self._steps = rec.progress  # its ``steps``: optimizer steps so far
        self._sites: dict = {}  # attention module's id, or SDPA's caller (code, line) -> calls judged
        self._token_reads = 0
        self._tokens: list[tuple[torch.Tensor, int]] = []  # (token batch copy, fill), latest first
        self._done: set = set()  # (call line, problem) recorded
        self._causal_seen = False  # a causal mask (each query sees its past) was judged
        self._last_ids: torch.Tensor | None = None  # the latest (batch, length) id batch embedded
        # reversed masks waiting for the next backward: [loc, api, keys, the ids embedded before]
        self._reversed: list = []

    # -- token batches ------------------------------------------------------------------------
    def _embedded(self, args, kwargs) -> None:
        tokens = args[0] if args else kwargs.get("input")
        if not (isinstance(tokens, torch.Tensor) and tokens.dim() == 2 and tokens.shape[0] >= 2
                and tokens.shape[1] >= 2 and not tokens.is_floating_point()
                and tokens.dtype != torch.bool and tokens.device.type == "cpu"
                and tokens.numel() <= MAX_CELLS):
            return
        self._token_reads += 1
        with torch.no_grad():
            self._drop_right_to_left(tokens)
            self._last_ids = tokens.detach().clone()
        pad = args[2] if len(args) > 2 else kwargs.get("padding_idx")
        weight = args[1] if len(args) > 1 else kwargs.get("weight")
        if isinstance(pad, int) and isinstance(weight, torch.Tensor) and weight.dim() == 2:
            fill = pad + int(weight.shape[0]) if pad < 0 else pad
        elif tokens.shape[1] >= 4:
            fill = infer_fill(tokens)
        else:
            fill = None
        if fill is None:
            return
        with torch.no_grad():
            if int((tokens == fill).any(1).sum()) < 2:
                return  # padding in fewer than two rows: nothing to tell the conventions apart
            copy = tokens.detach().clone()
        for i, (known, _) in enumerate(self._tokens):
            if known.shape == copy.shape:
                del self._tokens[i]
                break
        self._tokens.insert(0, (copy, fill))
        del self._tokens[TOKENS:]

    def _drop_right_to_left(self, tokens: torch.Tensor) -> None:
        """A batch embedded after a reversed mask's call (or a loss's targets) that holds at
        each position the id its input held one position earlier (``tokens[:, t] == ids[:, t - 1]``): the previous items,
        looked up as what each position predicts (a right-to-left model scoring its targets
        through the item table). The reversed mask is that model's causal mask."""
        kept = []
        for pending in self._reversed:
            ids = pending[3]
            if ids is not None and ids.shape == tokens.shape:
                same = (tokens[:, 1:] == ids[:, :-1]).float().mean()
                if float(same) >= PREVIOUS_SHARE:
                    continue
            kept.append(pending)
        self._reversed = kept

    @property
    def open(self) -> bool:
        """Whether loss calls are still worth telling (instrument/losscalls.py)."""
        return self._steps.steps < STEPS and self._checks < MASK_CHECKS

    def loss_call(self, fn: str, input, target, args, kwargs) -> None:
        """A loss's integer targets that are the previous items of a reversed mask's input
        (``targets[:, t] == ids[:, t - 1]``, flattened or not): a right-to-left model."""
        if not self._reversed or not isinstance(target, torch.Tensor) \
                or target.is_floating_point() or target.device.type != "cpu":
            return
        try:
            with torch.no_grad():
                for pending in self._reversed:
                    ids = pending[3]
                    if ids is not None and target.numel() == ids.numel():
                        self._drop_right_to_left(target.reshape(ids.shape))
                        return
        except Exception as exc:
            self.rec.internal_error("reversed attention mask against the loss's targets", exc)

    def describe_loss(self, tensors) -> dict:
        """At a backward: the reversed masks no later batch showed to be a right-to-left model's
        are recorded."""
        pending, self._reversed = self._reversed, []
        for loc, api, keys, _ids in pending:
            if not self._causal_seen:
                self._record(api, "attn_mask", "reversed", loc=loc, convention="causal transposed",
                             keys=int(keys))
        if self._steps.steps >= STEPS or self._checks >= MASK_CHECKS:
            self.rec.retire(DESCRIBE_LOSS, self.describe_loss)
        return {}

    def _wrap_embedding(self, original):
        watcher = self

        def before(args, kwargs) -> None:
            if watcher._token_reads >= TOKEN_READS or watcher._steps.steps >= STEPS \
                    or not torch.is_grad_enabled():
                return
            try:
                watcher._embedded(args, kwargs)
            except Exception as exc:
                watcher.rec.internal_error("F.embedding", exc)

        embedding = watched(original, before)
        embedding.__prepare_scriptable__ = lambda: original
        return embedding

    def padded_token_batches(self) -> list[tuple[torch.Tensor, int]]:
        """The latest padded token batches embedded (copies) with their fill id, latest first
        (read by instrument/padmask.py)."""
        return list(self._tokens)

    # -- masks ----------------------------------------------------------------------------------
    def _judge(self, api: str, argument: str, mask, batch: int | None, keys: int,
               keep_true: bool) -> None:
        """Look at one mask: ``batch`` is the batch size when the mask's first dimension is the
        batch's (per-sample keys), ``keys`` the number of keys, ``keep_true`` the boolean
        convention of the argument (True = attend)."""
        if not isinstance(mask, torch.Tensor) or mask.device.type != "cpu" or mask.numel() > MAX_CELLS \
                or mask.dim() == 0 or mask.shape[-1] != keys:
            return
        with torch.no_grad():
            m = mask.detach()
            if m.dtype == torch.bool:
                removed = ~m if keep_true else m
            elif m.is_floating_point():
                zero, one, minus = (m == 0), (m == 1), (m == -1)
                if bool((zero | one).all()) and bool(one.any()) and bool(zero.any()) \
                        or bool((zero | minus).all()) and bool(minus.any()) and bool(zero.any()):
                    self._record(api, argument, "additive01", convention="added",
                                 values=[0, 1 if bool(one.any()) else -1])
                    return
                removed = m <= _NEGATIVE
            else:
                return
            if argument == "attn_mask":
                self._judge_direction(api, removed, keys)
            if batch is None or batch < 2 or m.dim() < 2 or m.shape[0] != batch:
                return  # no key mask per sample
            removed = removed.reshape(batch, -1, keys).all(1)  # left out for every query
            for tokens, fill in self._tokens:
                if tuple(tokens.shape) != (batch, keys):
                    continue
                content = tokens != fill
                share = float((removed == content).float().mean())
                if share >= INVERTED_SHARE and bool(removed.any()):
                    self._record(api, argument, "inverted",
                                 convention="True attends" if keep_true else "True leaves out",
                                 fill=int(fill), rows=int(batch),
                                 removed=round(float(removed.float().mean()), 4),
                                 dtype=str(m.dtype).replace("torch.", ""))
                return

    def _judge_direction(self, api: str, removed: torch.Tensor, keys: int) -> None:
        """A square self-attention mask (every query/key slice alike) that leaves out exactly
        the keys before each query: the transpose of a causal mask, so each position attends to
        itself and the positions after it. A causal mask seen earlier in the run (a forward and a
        backward language model side by side) keeps the reversed one unreported."""
        if removed.dim() < 2 or removed.shape[-2] != keys or keys < 3:
            return
        slices = removed.reshape(-1, keys, keys)
        earlier = torch.ones(keys, keys, dtype=torch.bool).tril(-1)
        if bool((slices == earlier.T).all()):
            self._causal_seen = True
        elif bool((slices == earlier).all()) and not self._causal_seen:
            ids = self._last_ids
            if ids is not None and ids.shape[1] != keys:
                ids = None  # the latest batch embedded is not this attention's input
            loc = self.rec.here()
            if all(loc != pending[0] for pending in self._reversed):
                self._reversed.append([loc, api, keys, ids])

    def _unmasked(self, api: str, argument: str, batch: int | None, keys: int) -> None:
        """An attention call with no mask at all (and not causal) over keys of the shape of a
        token batch embedded just before whose shorter rows are padded (in two rows or more):
        every query attends to the padding too."""
        if batch is None or batch < 2 or (self.rec.running_backwards and self.rec.in_backward()):
            return  # (a checkpointed forward recomputed in the backward was judged, or not, before)
        for tokens, fill in self._tokens:
            if tuple(tokens.shape) != (batch, keys):
                continue
            with torch.no_grad():
                same = tokens == fill
                # the fill id as padding: runs at one end of the rows, (nearly) nowhere else, not
                # a token id that also occurs among the words (random ids hit 0 as often as any)
                runs = torch.maximum(same.flip(1).int().cumprod(1).sum(1), same.int().cumprod(1).sum(1))
                padded, stray = int(runs.sum()), int(same.sum()) - int(runs.sum())
                rows, longest = int((runs > 0).sum()), int(runs.max())
            if rows >= 2 and longest >= 2 and stray <= 0.02 * (tokens.numel() - padded):
                self._record(api, argument, "missing", convention="none", fill=int(fill),
                             rows=int(batch), padded_rows=rows,
                             padded=round(padded / tokens.numel(), 4))
            return

    def _record(self, api: str, argument: str, problem: str, loc=None, **data) -> None:
        rec = self.rec
        loc = rec.here() if loc is None else loc
        if (loc, problem) in self._done:
            return
        self._done.add((loc, problem))
        rec.emit_aside(ev.attention_mask(api=api, argument=argument, problem=problem, **data), loc)

    def _counted(self, site) -> bool:
        n = self._sites.get(site, 0)
        if n >= SITE_CHECKS:
            return False
        self._sites[site] = n + 1
        self._checks += 1
        return True

    @staticmethod
    def _caller():
        """The frame that called the attention entry point (past other watchers' wrappers)."""
        frame = sys._getframe(3)  # _caller, before, the wrapper: its caller
        while frame is not None and frame.f_code.co_filename.startswith("<graddoctor"):
            frame = frame.f_back  # another watcher's wrapper around this one
        return frame

    def _wrap_mha(self, original):
        watcher = self
        signature = inspect.signature(original)

        def before(args, kwargs) -> None:
            if watcher._checks >= MASK_CHECKS or watcher._steps.steps >= STEPS \
                    or not torch.is_grad_enabled():
                return
            if len(args) <= 4 and kwargs.get("key_padding_mask") is None \
                    and kwargs.get("attn_mask") is None and not watcher._tokens:
                return  # no mask (self, query, key, value given as they usually are), no padding
            try:
                bound = signature.bind(*args, **kwargs).arguments
                kpm, attn = bound.get("key_padding_mask"), bound.get("attn_mask")
                if kpm is None and attn is None and (not watcher._tokens or bound.get("is_causal")):
                    return
                module, key = bound["self"], bound["key"]
                frame = watcher._caller()
                if not watcher._counted(("mha", id(module), id(frame.f_code) if frame else None,
                                         frame.f_lineno if frame else None)):
                    return
                if key.dim() == 3:
                    batch = key.shape[0] if getattr(module, "batch_first", False) else key.shape[1]
                    keys = key.shape[1] if getattr(module, "batch_first", False) else key.shape[0]
                else:
                    batch, keys = None, key.shape[0]
                if kpm is None and attn is None:
                    watcher._unmasked("nn.MultiheadAttention", "key_padding_mask", batch, keys)
                    return
                if kpm is not None:
                    watcher._judge("nn.MultiheadAttention", "key_padding_mask", kpm, batch, keys,
                                   keep_true=False)
                if attn is not None:
                    if attn.dim() == 3 and batch is not None and attn.shape[0] == batch * module.num_heads:
                        attn = attn.reshape(batch, module.num_heads, *attn.shape[1:])
                        watcher._judge("nn.MultiheadAttention", "attn_mask", attn, batch, keys,
                                       keep_true=False)
                    else:
                        watcher._judge("nn.MultiheadAttention", "attn_mask", attn, None, keys,
                                       keep_true=False)
            except Exception as exc:
                watcher.rec.internal_error("nn.MultiheadAttention.forward", exc)

        return watched(original, before)

    def _wrap_sdpa(self, original):
        watcher = self

        def before(args, kwargs) -> None:
            if watcher._checks >= MASK_CHECKS or watcher._steps.steps >= STEPS \
                    or not torch.is_grad_enabled():
                return
            try:
                mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
                if mask is None and (not watcher._tokens or
                                     (args[5] if len(args) > 5 else kwargs.get("is_causal"))):
                    return  # no mask and no padded batch, or a causal one
                frame = watcher._caller()
                caller = frame.f_code.co_filename if frame is not None else ""
                if os.path.normcase(os.path.abspath(caller)) == _TORCH_FUNCTIONAL:
                    return  # multi_head_attention_forward's call: its masks were judged already
                if not watcher._counted(("sdpa", id(frame.f_code) if frame is not None else None,
                                         frame.f_lineno if frame is not None else None)):
                    return
                query = args[0] if args else kwargs.get("query")
                key = args[1] if len(args) > 1 else kwargs.get("key")
                batch = int(query.shape[0]) if query.dim() >= 3 else None
                if mask is None:
                    watcher._unmasked("F.scaled_dot_product_attention", "attn_mask", batch,
                                      int(key.shape[-2]))
                    return
                if isinstance(mask, torch.Tensor) and mask.dim() < 3:
                    batch = None  # (L, S): one mask for every sample
                watcher._judge("F.scaled_dot_product_attention", "attn_mask", mask, batch,
                               int(key.shape[-2]), keep_true=True)
            except Exception as exc:
                watcher.rec.internal_error("F.scaled_dot_product_attention", exc)

        sdpa = watched(original, before)
        return sdpa

    def install(self, patcher) -> None:
        patcher.patch(F, "embedding", self._wrap_embedding(F.embedding))
        patcher.patch(nn.MultiheadAttention, "forward", self._wrap_mha(nn.MultiheadAttention.forward))
        if callable(getattr(F, "scaled_dot_product_attention", None)):
            patcher.patch(F, "scaled_dot_product_attention",
                          self._wrap_sdpa(F.scaled_dot_product_attention))
