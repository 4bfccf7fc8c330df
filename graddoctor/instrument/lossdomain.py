"""Loss targets outside the domain the loss reads them in.

Every torch loss documents what its target is: a probability in [0, 1] for the binary
cross-entropies, a sign (1 or -1) for the margin losses, a distribution over the classes for
``cross_entropy``'s float targets, probabilities (log-probabilities with ``log_target=True``)
for ``kl_div``, a count (>= 0) for ``poisson_nll_loss``, class indices ending at the first -1 for
``multilabel_margin_loss``. A target outside that domain raises nothing: the formula is
evaluated anyway and trains something else (0/255 masks make BCE unbounded, 0/1 labels give a
margin loss's negatives a constant term without gradient, multi-hot rows make softmax classes
compete, log-probabilities read as probabilities make kl_div's gradient ignore the student).

``ctc_loss`` reads its targets as label sequences: within each sequence's ``target_lengths``, a
class index of its ``log_probs`` other than ``blank`` (torch checks neither: a blank label is
aligned as "nothing", a label past the classes reads a score outside them). With
``zero_infinity=True`` it also takes sequences too long for their ``input_lengths`` (one frame per
label and one between repeated labels) and gives them a loss and gradient of 0: a quarter or
more of a call's sequences dropped so is judged a broken length computation, not an outlier.

``DOMAINS`` is the table: for each function of ``torch.nn.functional`` (their ``nn`` modules
call them, so both are seen), where its target is and which domain it reads it in. Each is
patched; the first calls of each function that a gradient flows through (one of its score
inputs requires grad, grad mode on) are judged by their target's values: one small reduction
and one device-to-host read per call, on a GPU only before the first optimizer step (no host
sync in the updates after it). Nothing the loss computes is touched: the reductions run on a
detached float copy under ``no_grad``. A violation is recorded once per call line (a
``target_domain`` aside event).

Targets a script may mask out afterwards are not judged where the mask could hide them
(``reduction="none"``, or a per-element ``weight`` for the binary losses): a placeholder label
(-1 for a missing one, 255 for "ignore") never reaches the loss then.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import events as ev
from .inlinable import watched
from .recorder import Recorder

_SLACK = 1e-3  # rounding around a domain's bounds (a smoothed 1.0, a clamped 0)
_CHECKS = 8  # calls per function judged by their targets (the first ones: every loss line of a loop)
_MULTI_LABEL = 0.5  # a distribution holds at most one value above this in a row
# the constants scripts fill masked scores with (fp16's -1e4 and -65504, GAT's -9e15, ...)
_FILLS = (-1e4, -1e5, -1e6, -1e7, -1e8, -1e9, -1e10, -1e12, -1e15, -9e15, -1e18, -1e20, -1e30,
          -65504.0)
_OVER_SUMMED = 1.05  # rows of soft targets summing above this hold more than one distribution


@dataclass(frozen=True)
class Domain:
    """Where a loss's target sits and what it must be: ``kind`` is "unit" (each value in [0, 1]),
    "sign" (1 or -1), "distribution" (float rows over the classes, dim 1, >= 0, one value above
    0.5 at most), "kl" (probabilities, or log-probabilities with log_target=True), "count"
    (>= 0), "index-list" (class indices padded with -1), "ctc" (label sequences: class indices
    other than the blank, short enough to align with their input)."""

    kind: str
    scores: tuple[str, ...] = ("input",)  # the arguments a gradient flows through
    target: str = "target"  # the argument holding the target
    maskable_weight: bool = False  # a per-element weight (a mask) may hide placeholder targets


DOMAINS: dict[str, Domain] = {
    "binary_cross_entropy_with_logits": Domain("unit", maskable_weight=True),
    "binary_cross_entropy": Domain("unit", maskable_weight=True),
    "multilabel_soft_margin_loss": Domain("unit", maskable_weight=True),
    "soft_margin_loss": Domain("sign"),
    "hinge_embedding_loss": Domain("sign"),
    "cosine_embedding_loss": Domain("sign", scores=("input1", "input2")),
    "margin_ranking_loss": Domain("sign", scores=("input1", "input2")),
    "cross_entropy": Domain("distribution"),
    "kl_div": Domain("kl"),
    "poisson_nll_loss": Domain("count"),
    "multilabel_margin_loss": Domain("index-list"),
    "ctc_loss": Domain("ctc", scores=("log_probs",), target="targets"),
}
_UNALIGNABLE = 0.25  # share of a call's sequences dropped by zero_infinity judged a broken length


def _reduction(bound: dict) -> str:
    if bound.get("size_average") is not None or bound.get("reduce") is not None:
        from torch.nn import _reduction

        return _reduction.legacy_get_string(bound.get("size_average"), bound.get("reduce"),
                                            emit_warning=False)
    return bound.get("reduction", "mean")


def _unlabelled_rows(rows: torch.Tensor) -> tuple[float, str] | None:
    """``(share, column)`` when some rows of soft targets carry no label at all (every value the
    same: zeros, or the smoothing floor the labelled rows have off their peak) and every
    labelled row peaks at one same column: the one-hot was scattered along the batch axis
    (``t.scatter_(0, y[:, None], 1)``), which writes each label into column 0 of the row its
    class index names. Rows a script zeroes on purpose (masked samples) beside labels of
    several classes, and uniform rows at another level than the floor (outlier exposure's
    1/C targets), are not this."""
    peak, floor = rows.max(1), rows.min(1).values
    flat = (peak.values - floor) <= _SLACK * torch.clamp(peak.values.abs(), min=1.0)
    labelled = ~flat
    count, flat_count = int(labelled.sum()), int(flat.sum())
    if count < 2 or flat_count == 0:
        return None
    columns = peak.indices[labelled]
    if bool((columns != columns[0]).any()):
        return None  # labels of several classes: the rows were filled along the right axis
    level, base = float(floor[flat].median()), float(floor[labelled].median())
    if abs(level - base) > _SLACK * max(1.0, abs(base)):
        return None
    return flat_count / rows.shape[0], str(int(columns[0]))


def judge(kind: str, target: torch.Tensor, *, classes: int | None = None, log_target: bool = False,
          maskable: bool = False) -> dict | None:
    """The violation of ``kind``'s domain by ``target`` (the event's data but ``fn``), or None.
    One reduction and one read; ``maskable``: the loss's elements may be masked afterwards."""
    with torch.no_grad():
        if kind == "index-list":
            if target.is_floating_point() or target.dim() == 0 or target.shape[-1] < 3:
                return None  # with 2 classes a 0/1 row can be a valid list of both
            binary, low, high = torch.stack([((target == 0) | (target == 1)).all().float(),
                                             target.min().float(), target.max().float()]).tolist()
            # every row of values 0 and 1 without a -1 lists a class twice: no index list does
            if binary == 1:
                return {"problem": "multi-label", "low": low, "high": high}
            return None
        if not target.is_floating_point():
            return None  # integer targets of the other losses: class indices torch checks itself
        t = target.detach().float()
        if kind == "distribution":
            if classes is None or t.dim() < 2:
                return None
            rows = t.movedim(1, -1).reshape(-1, classes)
            sums = rows.sum(1)
            # several labels: two or more values above 0.5 in a row, all alike (1s, or smoothed
            # 0.9s); a mix of two one-hots gives them unlike weights (lam and 1 - lam)
            big = rows > _MULTI_LABEL + _SLACK
            alike = (rows.masked_fill(~big, -math.inf).amax(1)
                     - rows.masked_fill(~big, math.inf).amin(1)) <= _SLACK
            low, high, multi, over, total, least, most = torch.stack([
                rows.min(), rows.max(), ((big.sum(1) >= 2) & alike).float().mean(),
                (sums > _OVER_SUMMED).float().mean(), sums.median(), sums.min(), sums.max()]).tolist()
            share = None
            unlabelled = _unlabelled_rows(rows) if classes > 1 and rows.shape[0] >= 4 else None
        else:
            low, high = torch.stack([t.min(), t.max()]).tolist()
        if not (math.isfinite(low) and math.isfinite(high)):
            return None  # NaN or inf targets: nonfinite-grad's business
        found = None
        if kind == "unit":
            if not maskable and (low < -_SLACK or high > 1 + _SLACK):
                share, whole = torch.stack([((t < -_SLACK) | (t > 1 + _SLACK)).float().mean(),
                                            (t == t.round()).all().float()]).tolist()
                found = {"problem": "outside-unit", "share": share, "integral": whole == 1}
        elif kind == "sign":
            # 0/1 labels: nothing below 0 and zeros among them (-1/0/+1 from torch.sign of
            # tied scores keeps its -1s: ties are pairs without preference)
            if not maskable and low >= -_SLACK:
                share, whole = torch.stack([(t.abs() <= _SLACK).float().mean(),
                                            (t == t.round()).all().float()]).tolist()
                if share > 0:
                    found = {"problem": "zero-one", "share": share, "integral": whole == 1}
        elif kind == "distribution":
            # every row summing to one same number above 1 that is no whole number: a formula
            # that left a smoothing or mixing weight out of one term (labels of several classes
            # sum to whole numbers, word counts to numbers that vary by row; rows summing below
            # 1 may be confidence-weighted on purpose: not judged)
            over_summed = (low >= -_SLACK and over == 1 and most - least <= _SLACK * total
                           and abs(total - round(total)) > 0.02)
            if unlabelled is not None:
                found = {"problem": "unlabelled", "share": unlabelled[0], "detail": unlabelled[1]}
            elif high <= 1 + _SLACK and multi > 0:
                found = {"problem": "multi-label", "share": multi}
            elif over_summed:
                found = {"problem": "over-summed", "share": over, "detail": f"{total:.3g}"}
            elif low < -_SLACK and not maskable:
                found = {"problem": "negative"}
        elif kind == "kl":
            if not log_target and low < -_SLACK:
                found = {"problem": "log-target"}
            elif log_target and high > _SLACK:
                found = {"problem": "prob-target"}
        elif kind == "count":
            if low < -_SLACK and not maskable:
                share = float((t < -_SLACK).float().mean())
                found = {"problem": "negative", "share": share}
        if found is None:
            return None
        found.update(low=low, high=high)
        return found


def _masked(scores: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """Which ``picked`` scores are a mask's fill: -inf, the dtype's lowest value, or one of the
    constants scripts fill masked scores with (``masked_fill(mask, -1e9)``), each rounded to
    the scores' dtype: a diverging logit lands on none of them to the bit."""
    lowest = torch.finfo(scores.dtype).min
    fills = torch.tensor([v for v in _FILLS if v >= lowest] + [lowest], dtype=scores.dtype)
    return (torch.isinf(picked) & (picked < 0)) | torch.isin(picked, fills)


def judge_indices(input: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100,
                  smoothing: float = 0.0) -> dict | None:
    """The violation of ``cross_entropy``'s class-index targets that torch does not check: a
    target whose own score is masked out ("masked-target": the row's loss is infinite and its
    gradient never raises the target), or label smoothing over rows with masked classes
    ("smoothing-masked": the smoothed share is spread over classes whose score is -inf)."""
    with torch.no_grad():
        if input.dim() < 1 or target.dim() != input.dim() - 1 or not input.is_floating_point():
            return None
        scores = input.detach()
        if scores.dim() == 1:
            scores, target = scores.unsqueeze(0), target.reshape(1)
        keep = target != ignore_index
        if not bool(keep.any()):
            return None
        classes = int(scores.shape[1])
        index = torch.where(keep, target, 0).long()
        if bool(((index < 0) | (index >= classes)).any()):
            return None  # torch raises on it
        if bool(torch.isnan(scores).any() | torch.isposinf(scores).any()):
            return None  # overflow (a diverging half-precision model), not a mask
        picked = scores.gather(1, index.unsqueeze(1)).squeeze(1)[keep]
        masked = _masked(scores, picked)
        count = int(masked.sum())
        if count:
            return {"problem": "masked-target", "share": count / picked.numel(),
                    "low": float(picked.min()), "high": float(picked.max()), "classes": classes}
        if smoothing > 0:
            rows = scores.movedim(1, -1)[keep]
            infinite = int(torch.isinf(rows).any(-1).sum())
            if infinite:
                return {"problem": "smoothing-masked", "share": infinite / rows.shape[0],
                        "low": float(picked.min()), "high": float(picked.max()), "classes": classes}
        return None


def _lengths(value, count: int) -> torch.Tensor | None:
    """``input_lengths`` / ``target_lengths`` as a 1-D long tensor of ``count`` values (a tensor, a
    list or tuple, or one number for an unbatched call), or None where torch would reject it."""
    try:
        lengths = torch.as_tensor(value).detach().reshape(-1).long().cpu()
    except (TypeError, ValueError, RuntimeError):
        return None  # a form torch rejects too (or one not worth reading: then not judged)
    return lengths if lengths.numel() == count else None


def judge_ctc(targets: torch.Tensor, target_lengths, input_lengths, *, classes: int, batch: int,
              blank: int = 0, zero_infinity: bool = False) -> dict | None:
    """The violation of ``ctc_loss``'s target domain (the event's data but ``fn``), or None: labels
    equal to ``blank`` or outside [0, classes) within each sequence's length ("blank",
    "out-of-range"), or, with ``zero_infinity``, sequences too long for their input ("unalignable").
    ``targets`` is (batch, S) padded or 1-D concatenated; what lies past the lengths is not read."""
    with torch.no_grad():
        if targets.is_floating_point() or targets.dim() > 2 or batch < 1:
            return None
        t_len = _lengths(target_lengths, batch)
        if t_len is None or (t_len < 0).any():
            return None
        t = targets.detach().long().cpu()
        if t.dim() == 2:
            if t.shape[0] != batch or int(t_len.max()) > t.shape[1]:
                return None
            position = torch.arange(t.shape[1])
            read = position < t_len[:, None]
            rows = t
        else:
            if int(t_len.sum()) > t.numel():
                return None
            # each sequence as a row of the concatenation, padded past its length
            width = max(int(t_len.max()), 1)
            position = torch.arange(width)
            read = position < t_len[:, None]
            rows = torch.full((batch, width), blank, dtype=torch.long)
            rows[read] = t[:int(t_len.sum())]
        labels = rows[read]
        if not labels.numel():
            return None
        if blank < 0:
            blank += classes
        is_blank, outside = labels == blank, (labels < 0) | (labels >= classes)
        low, high, blanks, outsides = torch.stack([
            labels.min(), labels.max(), is_blank.sum(), outside.sum()]).tolist()
        found = None
        if outsides:
            found = {"problem": "out-of-range", "share": outsides / labels.numel(),
                     "detail": "negative" if low < 0 else None}
        elif blanks:
            found = {"problem": "blank", "share": blanks / labels.numel(), "detail": None}
            if t.dim() == 2 and bool((t_len == t.shape[1]).all()):
                # every length the padded width and every blank after its row's last real
                # label: the lengths count the padding
                real = torch.where(rows != blank, position, -1).amax(1)
                trailing = int(((rows == blank) & (position > real[:, None])).sum())
                if trailing == blanks:
                    found["detail"] = "padding"
        elif zero_infinity:
            i_len = _lengths(input_lengths, batch)
            if i_len is None or batch < 2:
                return None
            # a path needs a frame per label and a blank between two equal labels in a row
            repeats = (read[:, 1:] & (rows[:, 1:] == rows[:, :-1])).sum(1)
            dropped = int(((t_len + repeats) > i_len).sum())
            if dropped / batch >= _UNALIGNABLE:
                found = {"problem": "unalignable", "share": dropped / batch}
        if found is None:
            return None
        found.update(low=low, high=high, blank=blank, classes=classes)
        return found


class LossDomainWatcher:
    """Patches the losses of ``DOMAINS`` and records their first calls' targets outside the
    domain (see the module docs)."""

    def __init__(self, rec: Recorder):
        self.rec = rec
        self._left: dict[str, int] = dict.fromkeys(DOMAINS, _CHECKS)  # calls still judged
        self._done: set = set()  # call lines recorded

    def _wrap(self, original, fn: str):
        watcher, rec, domain = self, self.rec, DOMAINS[fn]
        signature = inspect.signature(original)
        left = self._left

        def before(args, kwargs) -> None:
            if left[fn] <= 0 or not torch.is_grad_enabled():
                return  # the first calls are judged: every later one returns here
            try:
                watcher._check(fn, domain, signature, args, kwargs)
            except Exception as exc:
                rec.internal_error(f"F.{fn}", exc)

        loss = watched(original, before)  # torch.compile inlines it (inlinable.py)
        loss.__prepare_scriptable__ = lambda: original  # torch.jit.script compiles torch's own
        return loss

    def _check(self, fn: str, domain: Domain, signature, args, kwargs) -> None:
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return  # torch reports the bad call
        scores = [bound.get(name) for name in domain.scores]
        if not any(isinstance(s, torch.Tensor) and s.requires_grad for s in scores):
            return  # no gradient flows: a metric, whatever its targets
        target = bound.get(domain.target)
        if not isinstance(target, torch.Tensor) or not target.numel():
            return
        if self.rec.progress.steps and target.device.type != "cpu":
            return  # no host sync once the updates run
        input = scores[0]
        classes = None
        if domain.kind == "ctc":
            if input.dim() not in (2, 3):
                return  # a shape torch rejects
            self._left[fn] -= 1
            found = judge_ctc(target, bound.get("target_lengths"), bound.get("input_lengths"),
                              classes=int(input.shape[-1]),
                              batch=int(input.shape[1]) if input.dim() == 3 else 1,
                              blank=int(bound.get("blank", 0)),
                              zero_infinity=bool(bound.get("zero_infinity", False)))
            self._emit(fn, found)
            return
        if domain.kind == "distribution":
            if not target.is_floating_point() and isinstance(input, torch.Tensor):
                if self.rec.progress.steps:
                    return  # a mask is there from the first call; later -inf may be overflow
                self._left[fn] -= 1
                found = judge_indices(input, target, ignore_index=int(bound.get("ignore_index", -100)),
                                      smoothing=float(bound.get("label_smoothing", 0.0) or 0.0))
                self._emit(fn, found)
                return
            if not (target.shape == input.shape and input.dim() >= 2):
                return  # a shape torch rejects
            classes = int(input.shape[1])
        self._left[fn] -= 1
        maskable = _reduction(bound) == "none" or (
            domain.maskable_weight and bound.get("weight") is not None)
        found = judge(domain.kind, target, classes=classes, log_target=bool(bound.get("log_target")),
                      maskable=maskable)
        if found is not None:
            found.setdefault("classes", classes)
        self._emit(fn, found)

    def _emit(self, fn: str, found: dict | None) -> None:
        if found is None:
            return
        loc = self.rec.here(4)
        if loc in self._done:
            return
        self._done.add(loc)
        self.rec.emit_aside(ev.target_domain(
            fn=fn, problem=found["problem"], low=round(found["low"], 4), high=round(found["high"], 4),
            share=round(found["share"], 4) if found.get("share") is not None else None,
            integral=found.get("integral"), classes=found.get("classes"), blank=found.get("blank"),
            detail=found.get("detail")), loc)

    def install(self, patcher) -> None:
        for name in DOMAINS:
            original = getattr(F, name, None)
            if original is not None:
                patcher.patch(F, name, self._wrap(original, name))
