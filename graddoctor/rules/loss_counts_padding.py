from __future__ import annotations

import re

from ..findings import Severity
from ..location import Location
from .base import Rule


class LossCountsPadding(Rule):
    """
    ## What it does
    Finds a `cross_entropy` / `nll_loss` (or `nn.CrossEntropyLoss`) whose integer targets are
    mostly the padding index of an `nn.Embedding` the script uses (its `padding_idx`), while
    the loss does not ignore that index: no `ignore_index`, or an `ignore_index` set to a value
    that never occurs (`-1` while the padding is `0`).

    ## Why is this bad?
    Every padded position becomes a training example "predict the pad token". When padding is a
    large part of the batch, the model spends most of its gradient learning to emit padding,
    the mean loss is divided by all positions (real tokens weigh less the more a batch is
    padded), and the reported loss and perplexity look far better than the model is.

    ## Example
    ```python
    emb = nn.Embedding(vocab, dim, padding_idx=PAD)
    loss = F.cross_entropy(logits.view(-1, vocab), targets.view(-1))
    ```

    ## Use instead
    ```python
    emb = nn.Embedding(vocab, dim, padding_idx=PAD)
    loss = F.cross_entropy(logits.view(-1, vocab), targets.view(-1), ignore_index=PAD)
    ```

    The padding index is an `nn.Embedding`'s `padding_idx`, or, for an embedding without one
    (GPT-2 with `tokenizer.pad_token = tokenizer.eos_token`), the id that fills up the shorter
    rows of its first token batches: every row ends (or starts) with it, in runs of different
    lengths. The targets themselves are read too: a token loss whose targets (in the rows of a
    token batch the script embedded) end in runs of one id of different lengths, an id absent
    from the rest, is given padded targets (a T5's labels padded with 0, its decoder start token
    too). A model that computes its loss from `labels=` (transformers) is told to set the padded
    labels to -100. A loss module called there (`criterion(logits, labels)`) is reported where
    the script builds it (`criterion = nn.CrossEntropyLoss()`), the line that takes
    `ignore_index`.

    ## Stays silent on
    `ignore_index` equal to the padding index; targets where the padding index is rare (a
    dense batch where token 0 is a word like any other); `reduction="none"` (the script may mask
    the positions itself); losses no gradient flows through; labels already set to -100 where
    the attention mask is 0; token batches of one length (every row ends with eos once).
    """

    code = "GD235"
    slug = "loss-counts-padding"
    severity = Severity.WARNING
    summary = "a classification loss trains on padding positions: the padding index is not ignored"
    fix = "pass ignore_index=<padding index> to the loss (or set the padded targets to -100)"

    def check(self, a):
        for e in a.of_kind("loss_padding"):
            pad, fraction, ignore = e.get("pad"), e.get("fraction"), e.get("ignore_index")
            name = "cross_entropy" if e.get("fn") == "cross_entropy" else "nll_loss"
            ignoring = ("it ignores nothing (ignore_index left at -100)" if ignore in (None, -100)
                        else f"its ignore_index={ignore} never matches the padding")
            source = e.get("source")
            what = {"fill": "the id that fills up the shorter rows of the token batches, e.g. "
                            "an eos token used as the pad token",
                    "targets": "the id that fills up the shorter rows of the targets themselves"
                    }.get(source, "an nn.Embedding's padding_idx")
            fix = f"pass ignore_index={pad} to the loss (or set the padded targets to -100)"
            loc = e.loc
            built = _criterion_built(a, e.loc) if e.loc is not None else None
            if built is not None:
                # a loss module called here: its construction is where ignore_index goes
                line, cls = built
                loc = Location(e.loc.path, line)
                fix = f"build the loss with the padding ignored: `{cls}(ignore_index={pad})`"
            elif e.loc is not None and re.search(r"\blabels\s*=(?!=)", a.source.line_text(e.loc.path, e.loc.line)):
                # the model computes the loss (transformers' models): only the labels can say it
                fix = ("set the labels of the padded positions to -100, which the model's loss "
                       "ignores: " + (f"labels = labels.masked_fill(labels == {pad}, -100)"
                                      if source == "targets" else
                                      "labels = input_ids.masked_fill(attention_mask == 0, -100)"))
            yield self.finding(
                f"{fraction:.0%} of the targets {name} gets here are the padding index {pad} "
                f"({what}), and {ignoring}: every padded position is trained "
                "as 'predict padding' and counts in the mean",
                loc, fix=fix,
                evidence={"pad": pad, "fraction": fraction, "ignore_index": ignore,
                          "reduction": e.get("reduction"), "source": e.get("source")},
            )


_CALLED = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\s*\(")
_LOSS_MODULE = re.compile(r"((?:\b\w+\.)*(?:CrossEntropyLoss|NLLLoss))\s*\(")


def _criterion_built(a, loc):
    """``(line, class)`` of the one ``nn.CrossEntropyLoss(...)``/``nn.NLLLoss(...)`` that a name
    called on ``loc``'s line was last assigned (``criterion = nn.CrossEntropyLoss()``), or None."""
    text = a.source.line_text(loc.path, loc.line).split("#")[0]
    found = set()
    for name in set(_CALLED.findall(text)):
        made = a.source.value_origin(loc.path, loc.line, name)
        if made is None:
            continue
        module = _LOSS_MODULE.search(made[1])
        if module is not None and made[0] != loc.line:
            found.add((made[0], module.group(1)))
    return found.pop() if len(found) == 1 else None
