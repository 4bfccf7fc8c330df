from __future__ import annotations

import re
from dataclasses import replace

from ..findings import Related, Severity
from .base import Rule


def _shown(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return f"{value:.1f}"
    return repr(value)


def _conversion_fix(text: str, shown: str) -> str:
    """The fix for the conversion ``text`` that makes every label ``shown``, by its kind."""
    if "//" in text:
        return (f"drop the integer division in `{text}`: the values it divides are already in a "
                f"small range, so every label becomes {shown} (use `/` where a scale was meant)")
    if re.search(r"[<>]|==|!=", text):
        return (f"compare with a threshold inside the data's range in `{text}`: no sample is on "
                f"the other side of this one, so every label is {shown}")
    if re.search(r"\.(long|int|round|floor|trunc)\(", text):
        return (f"don't cast fractional values to classes in `{text}`: the cast truncates every "
                f"value to {shown}; keep them as float targets of a loss that takes them "
                f"(binary_cross_entropy_with_logits, mse_loss) or bin them into classes first")
    return (f"check `{text}`: it maps every label to {shown}; make the targets from the data's "
            f"real range")


class LabelsOneValue(Rule):
    """
    ## What it does
    Finds a classification or regression loss whose targets, read from the data, hold one
    single value at every call of its first training steps: click-through rates in [0, 1)
    cast with `.long()` (all 0), `(score > 5).float()` on scores in [0, 1] (all 0), `mask //
    255` of 0/1 masks (all 0), a label column that holds one value, a label transform that maps
    every sample to one class. Read from values (the first 16 calls of each loss line with a
    gradient, CPU targets) and the source: the targets must be one value over at least 4 calls
    and 64 values where a conversion made them (they differ from the labels the DataLoader
    served; with no DataLoader, the loop computes them: a cast, a comparison, arithmetic) or
    where the dataset's whole label tensor (a `TensorDataset`'s, torchvision's `targets`) is
    one value, and over at least 8 calls and 512 samples otherwise.

    For `cross_entropy` and `nll_loss`, only the targets that are not the `ignore_index` (-100
    unless given) are judged, each a sample: the positions the loss trains on. A masked language
    model whose labels are read from the inputs after they were masked (all the mask id), labels
    kept only at padding or at one end token, a tag lookup that maps every tag to one class. It
    then points at the line of the loop that last assigns the target's name, where the labels
    are built; when the one value is the padding id that the same loss call is seen counting
    and the script writes the ignore_index in one statement, a padding mask (a collate's
    `labels[attention_mask == 1] = -100`, the batch read in the loop or a `compute_loss`), it
    points at that mask: the wrong way round.

    ## Why is this bad?
    A target that is always the same carries no information: the model only has to output
    that constant, the loss falls quickly and looks like training, and the model has learned
    nothing about the inputs. Nothing fails; the bug shows at evaluation, as a model that
    predicts one class (or one number) for everything.

    ## Example
    ```python
    for x, ctr in loader:                  # click-through rates in [0, 1)
        target = ctr.long()                # every rate becomes class 0
        loss = F.cross_entropy(model(x), target)
    ```

    ```python
    inputs = batch.clone()
    inputs[masked] = MASK_ID
    labels = inputs.masked_fill(~masked, -100)   # every label trained on is MASK_ID
    ```

    ## Use instead
    ```python
    for x, ctr in loader:
        loss = F.binary_cross_entropy_with_logits(model(x).squeeze(1), ctr)  # soft targets
    ```
    ```python
    labels = batch.masked_fill(~masked, -100)    # the tokens that were masked
    ```

    ## Stays silent on
    Targets the script makes from values of its own (`torch.ones`/`zeros`/`full`/`arange`, also
    through a name assigned one, or wrapped in the Variable-era `Variable(Tensor(n, 1).fill_(1.0))`:
    a GAN's real and fake labels, InfoNCE's
    `torch.zeros(N, dtype=torch.long)` positives at index 0, also returned by a function or a
    module's `forward` of the script that makes them: MoCo's `output, target = model(q, k)`);
    an imbalanced dataset whose first
    batches happen to be one class (a `TensorDataset` or torchvision dataset whose whole label
    tensor holds several values, or fewer than 8 calls and 512 samples of one class); targets
    that vary (an autoencoder's inputs, `torch.arange(N)`); losses with no loss function given
    a target (Deep SVDD's distance to a center); targets on an accelerator (not read); a line
    whose targets differ at a later call. With an ignore_index: labels written into a canvas of
    it (`torch.full(shape, -100)`) that hold several values; a made target with ignored rows
    (`torch.zeros(N)` positives, padded queries -100); a call whose targets are all ignored;
    another `ignore_index` given (-100 is then a class).
    """

    code = "GD170"
    slug = "labels-one-value"
    severity = Severity.WARNING
    summary = ("every target the loss is trained on, read from the data, is one value: the labels "
               "carry no information and the model learns a constant")
    fix = ("make the targets from the data's real range: check the conversion that makes them "
           "(a cast to integers, a threshold, an integer division) and the label column read")

    def check(self, a):
        latest: dict = {}  # loss line -> its latest constant_targets event
        for e in a.of_kind("constant_targets"):
            if e.loc is not None:
                latest[e.loc] = e
        for loc, e in latest.items():
            if e.get("stage") == "varied":
                continue
            origin = a.source.target_origin(loc.path, loc.line)
            ignore = e.get("ignore_index")
            if origin is None or (origin["made"] and not (
                    ignore is not None and a.source.ignore_canvas(loc.path, loc.line, ignore))):
                continue  # a constant the script makes (a GAN's labels), or no source to tell
            # a few batches of one label are enough where a conversion made the targets (seen
            # against the loader's batch, or, with no loader, in the loop's source) or where the
            # dataset's whole label tensor is one value; labels as served need many samples
            converted = e.get("basis") in ("converted", "dataset-one") or (
                e.get("basis") == "unknown" and origin["line"] != loc.line)
            if e.get("stage") == "many" or converted:
                yield self._finding(a, e, origin)

    @staticmethod
    def _padding_kept(a, e, value, ignore):
        """``(line, text)`` of the padding mask that writes the ignore_index, when every target
        left is the padding id the same loss call counts (``loss_padding``): the mask inverted,
        the positions kept are the padding. None otherwise."""
        if ignore is None or not isinstance(value, int):
            return None
        if not any(p.loc == e.loc and p.get("pad") == value for p in a.of_kind("loss_padding")):
            return None
        return a.source.padding_mask_line(e.loc.path, ignore)

    def _finding(self, a, e, origin):
        fn, value, calls, values = e.get("fn", "the loss"), e.get("value"), e.get("calls"), e.get("values")
        if e.get("ignore_index") is not None and origin["line"] == e.loc.line:
            # with an ignore_index the script builds its labels: where it does so in the loop
            # is the line to look at
            built = a.source.target_assignment(e.loc.path, e.loc.line)
            if built is not None:
                origin = {**origin, "line": built[0], "text": built[1]}
        shown = _shown(value)
        at_conversion = origin["line"] != e.loc.line
        loc = replace(e.loc, line=origin["line"]) if at_conversion else e.loc
        basis = e.get("basis")
        if at_conversion:
            where = f"`{origin['text']}` makes every label {shown}"
            fix = _conversion_fix(origin["text"], shown)
        elif basis == "dataset-one":
            where = "the dataset's whole label tensor holds that one value"
            fix = (f"read the label from the column that holds it: every label of the dataset "
                   f"`{origin['target']}` comes from is {shown}")
        elif ".argmax(" in origin["target"] or origin["target"].startswith("torch.argmax("):
            # labels a model predicts (a teacher's hard labels, pseudo-labels): that model
            # answers one class for every sample
            where = f"`{origin['target']}` holds no other value"
            fix = (f"check the model whose predictions `{origin['target']}` reads: it predicts "
                   f"{shown} for every sample (a teacher or labelling model that collapsed to one "
                   f"class: a learning rate too high, too few steps), so the labels it makes "
                   f"teach nothing")
        else:
            where = f"`{origin['target']}` holds no other value"
            fix = (f"check how `{origin['target']}` is made (the Dataset's __getitem__ or the "
                   f"label column read): a cast to integers, a threshold outside the data's range "
                   f"or an integer division maps every label to {shown}")
        related = (Related(e.loc, "the loss call"),) if at_conversion else ()
        ignore = e.get("ignore_index")
        inverted = self._padding_kept(a, e, value, ignore)
        if inverted is not None:
            line, text = inverted
            loc, related = replace(e.loc, line=line), (Related(e.loc, "the loss call"),)
            where = (f"`{text}` sets the ignore_index on the real tokens and keeps the padding, "
                     f"the mask the wrong way round: every position left to the loss is the "
                     f"padding id {shown}")
            fix = (f"invert the mask in `{text}`: ignore the padding positions (where the "
                   f"attention mask is 0) and keep the tokens")
        elif ignore is not None:
            if at_conversion:
                where = f"`{origin['text']}` leaves {shown} at every position not ignored"
            fix = (f"check how `{origin['target']}` is made where it is not {ignore} (the "
                   f"ignore_index): labels taken from the inputs after they were masked in place "
                   f"(copy them with .clone() first), a mask that keeps the wrong positions "
                   f"(padding, one end token), or a tag lookup that maps every tag to {shown}")
        got = (f"every target {fn} trains on (the {values} not equal to its ignore_index {ignore}) "
               f"over its first {calls} calls is {shown}" if ignore is not None else
               f"every target {fn} got over its first {calls} calls ({values} values) is {shown}")
        return self.finding(
            f"{got}: "
            f"{where}, so the labels carry no information, the model only has to output a "
            f"constant, and the falling loss says nothing about what it learned",
            loc, related=related, step=a.next_step_number(e.seq),
            evidence={"function": fn, "value": value, "calls": calls, "values": values,
                      "basis": basis, "target": origin["target"], "ignore_index": ignore},
            fix=fix)
