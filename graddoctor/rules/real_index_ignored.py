from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule


class RealIndexIgnored(Rule):
    """
    ## What it does
    Finds an `ignore_index` of `cross_entropy` / `nll_loss` (`nn.CrossEntropyLoss`,
    `nn.NLLLoss`) or a `padding_idx` of `nn.Embedding` that the data uses as a real class or
    token: one of the classes the model outputs that occurs in one-label-per-sample targets
    about as often as the other classes; a label inside the rows of sequence targets (not only
    in the run that pads each row's end); a padding id that stands alone inside the token rows
    as often as a word does; a padding id of a categorical feature embedded one id per sample
    (nothing to pad) that is as frequent as the other categories (counted over the first
    calls, 128 ids at least, three categories or more).

    ## Why is this bad?
    `ignore_index` drops every position with that label from the loss, and `padding_idx` gives
    that row of the embedding no gradient. Meant for padding, they silently remove a real class
    or word instead: the model never learns class 0 (it is pushed down on every other sample and
    never up), a tagger never sees its "O" tag, a frequent word keeps the vector it was
    initialised with (zeros). The loss still falls, on what is left.

    ## Example
    ```python
    criterion = nn.CrossEntropyLoss(ignore_index=0)     # labels 0..9, class 0 is real
    emb = nn.Embedding(vocab, dim, padding_idx=1)       # token 1 is a frequent word
    ```

    ## Use instead
    ```python
    criterion = nn.CrossEntropyLoss()                   # or ignore_index=-100 on the padding only
    emb = nn.Embedding(vocab, dim, padding_idx=PAD)     # an id that only pads
    ```

    Give padding and unlabelled positions an index no class uses (-100, the default, or a
    dedicated pad id), and keep real classes and tokens out of it.

    ## Stays silent on
    `ignore_index=-100` (the default) and HF-style labels with -100 on the padding; an
    `ignore_index` at or above the number of classes (a segmentation's void 255); an
    `ignore_index` that only pads the rows (the runs at their ends); a token loss ignoring its
    embedding's pad id (a masked LM's "no label" positions); a genuinely rare ignored label
    (an "unlabelled" marker on a few samples) or one on most of them; `padding_idx` that only
    fills the rows' ends, left or right; padding between segments (runs of it inside the rows);
    a categorical feature whose pad id marks a missing value rarer than half the median
    category (categories shifted by one, 0 for missing), or a flag of two values. Not told
    apart: a "missing" value as frequent as a category given a zero vector on purpose (reported:
    its row never trains either way). Not seen: several categorical fields offset into one
    table and embedded as a (batch, fields) tensor (its first field's pad id reads as left
    padding). Not judged: segmentation targets (3-D and more), tensors on a GPU after the first
    optimizer step.
    """

    code = "GD165"
    slug = "real-index-ignored"
    severity = Severity.WARNING
    summary = ("an ignore_index or padding_idx is a value the data uses as a real class or token: "
               "it is dropped from the loss or never trained")
    fix = ("give padding and unlabelled positions an index no class or token uses (-100 for a "
           "loss), and drop ignore_index / padding_idx where the index is a real class")

    def check(self, a):
        for e in a.of_kind("real_index"):
            argument, value, api, layout = e["argument"], e["value"], e["api"], e["layout"]
            loc, written = e.loc, f"{argument}={value}"
            if loc is not None:
                line = a.source.keyword_line(loc.path, loc.line, argument)
                if line is not None:
                    loc, written = Location(loc.path, line[0], loc.function), line[1]
            share = e["share"]
            if layout == "classes":
                seen = (f"{share:.0%} of the {e['seen']} labels it got are {value}, like a class "
                        f"(the median class has {e['median']:.0%})")
            elif layout == "padded rows":
                seen = (f"{value} pads the label rows and also stands inside them, at "
                        f"{share:.0%} of the real positions ({e['inside']} of {e['content']})")
            elif layout == "rows":
                seen = (f"{value} is {share:.0%} of the labels, inside the rows like the other "
                        f"classes (the median class has {e['median']:.0%})")
            elif layout == "categories":
                seen = (f"{value} is {share:.0%} of the {e['seen']} ids it embedded, one per "
                        f"sample like the other {e['classes'] - 1} categories (the median one has "
                        f"{e['median']:.0%}), and one id per sample has no padding")
            else:
                seen = (f"token {value} stands alone inside the rows like a word, at {share:.0%} "
                        f"of the real positions ({e['inside']} times; the median token has "
                        f"{e['median']:.0%})")
            if argument == "ignore_index":
                what = (f"{api}'s {written} is one of its {e['size']} classes and the data uses "
                        f"it as one: {seen}. Every such position is dropped from the loss, so "
                        f"class {value} is never learned")
                if layout == "padded rows":
                    fix = (f"label the padding with -100 (which the loss ignores) and leave "
                           f"ignore_index at its default, so that the real label {value} counts")
                else:
                    fix = (f"remove {written} (class {value} is real); if some positions must be "
                           "skipped, label them -100")
            elif layout == "categories":
                what = (f"{api}'s {written} is a real category: {seen}. The padding row gets no "
                        f"gradient and stays at its initial zeros, so category {value}'s vector "
                        f"never trains and the model cannot tell it from a missing value")
                fix = (f"drop {written} (nothing is padded in a categorical feature); to keep a "
                       f"row for missing values, shift the categories by one (ids + 1) and pad "
                       f"with 0, or give missing values a row of their own that trains")
            else:
                what = (f"{api}'s {written} is a real token: {seen}. The padding row gets no "
                        f"gradient, so token {value}'s vector never trains")
                fix = ("give padding an id of its own that no word uses (or drop padding_idx "
                       f"if nothing is padded), and keep token {value} out of it")
            yield self.finding(
                what, loc, fix=fix,
                evidence={"argument": argument, "value": value, "api": api, "layout": layout,
                          "size": e["size"], "share": share, "median": e.get("median"),
                          "inside": e.get("inside"), "content": e.get("content")})
