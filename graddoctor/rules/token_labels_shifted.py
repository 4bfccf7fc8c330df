from __future__ import annotations

from ..findings import Severity
from .base import Rule

_WHERE = {"first": "the first position of every row (a [CLS] / BOS token)",
          "last": "the last real position of every row (a [SEP] / EOS token)"}


class TokenLabelsShifted(Rule):
    """
    ## What it does
    Finds a token-classification loss (a tagger: fewer classes than its embedding has rows)
    whose labels are laid out one position off the tokens they label. The labels are aligned
    with a right-padded batch of ids (the loss ignores every padded position), yet at a position
    that holds the same id in every row — the first one ([CLS]) or each row's last real one
    ([SEP]) — the loss counts a label in nearly every row, and the labels there differ from row
    to row. Checked on the loss's graph at the first backwards of each backward line (CPU): the
    `cross_entropy` / `nll_loss` target against the ids of the embedding lookups below it. It
    points at the backward.

    ## Why is this bad?
    A token that never changes cannot carry a label that does: the label on [CLS] is the first
    word's, so every label sits one token before (or after) its word. The usual cause is an
    alignment built without the special tokens' slots: a `word_ids` list without the leading
    None of [CLS], labels written from position 0 instead of 1, or one -100 too many. A
    bidirectional model learns to predict each word's tag at its neighbour and the training
    loss falls as usual, but read at the words' own tokens its predictions are the neighbours'
    tags.

    ## Example
    ```python
    input_ids, word_ids = [CLS], []           # word_ids misses [CLS]'s None
    for i, w in enumerate(words):
        input_ids += pieces[w]
        word_ids += [i] * len(pieces[w])
    labels = [-100 if w is None else tags[w] for w in word_ids]
    ```

    ## Use instead
    ```python
    input_ids, word_ids = [CLS], [None]       # one slot per token, [CLS] included
    ```
    or the tokenizer's own `encoding.word_ids()`, which has a None at every special token.

    ## Stays silent on
    Labels set to -100 (or one constant tag) at [CLS] and [SEP]; labels on every subword
    (`label_all_tokens`); a language model (its classes are its vocabulary) and a decoder fed its
    shifted targets; a batch without padding, or whose padding the loss counts (the labels are
    not laid out on these ids: `loss-counts-padding` judges that); a first token that differs
    between rows. Not seen: scores laid out (N, C, T), ids on an accelerator.
    """

    code = "GD322"
    slug = "token-labels-shifted"
    severity = Severity.WARNING
    summary = ("a tagger's labels are one position off its tokens: a token that is the same in every "
               "row ([CLS], [SEP]) carries a label that changes from row to row")
    fix = ("give the label list one slot per token, special tokens included (a None in word_ids "
           "for [CLS] and [SEP], -100 there), so that each label sits on its word's first subword")

    def check(self, a):
        for e in a.of_kind("token_labels_shifted"):
            if e.loc is None:
                continue
            yield self.finding(
                f"the loss's labels count a label at {_WHERE.get(e['end'], 'one position')}, where "
                f"every row holds the same id, and those labels differ from row to row "
                f"({e['values']} values over {e['rows']} rows): the labels are laid out one "
                f"position off the tokens they label ({e['classes']} classes over a {e['vocab']}-row "
                f"embedding), so each word's tag is trained on its neighbour's token",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"end": e["end"], "rows": e["rows"], "values": e["values"],
                          "classes": e["classes"], "vocab": e["vocab"]})
