from __future__ import annotations

from ..findings import Severity
from .base import Rule


class LastStepIsPadding(Rule):
    """
    ## What it does
    Finds a batch-first recurrent layer (RNN, LSTM, GRU) run over a right-padded batch whose
    output at the last position (`out[:, -1]`) is what the loss reads: for most rows that
    position is padding. Checked on the first turns (CPU): the layer's input ends in a run of
    padding in at least half the rows (zero steps, as `pad_sequence` makes them or an
    embedding's `padding_idx` row gives, or the filler id of an embedding without one), and the
    loss's graph selects position T - 1 of the layer's output. It points at the layer's call.

    ## Why is this bad?
    A short sequence's summary is read after many padding steps: the state has run on over
    padding and forgotten much of the sequence, and every row is summarised at a different
    distance from its end. The model trains, worse than it should, and nothing fails.

    ## Example
    ```python
    x = pad_sequence(seqs, batch_first=True)      # right padding
    out, _ = self.rnn(self.emb(x))
    logits = self.head(out[:, -1])                # padding for most rows
    ```

    ## Use instead
    ```python
    out, _ = self.rnn(self.emb(x))
    logits = self.head(out[torch.arange(len(x)), lengths - 1])   # each row's last real step
    # or: pack_padded_sequence(..., lengths, batch_first=True, enforce_sorted=False) and h_n
    ```

    ## Stays silent on
    Left padding; `pack_padded_sequence` with the final hidden state; the output gathered at
    `lengths - 1`; sequences of one length; the first position (`out[:, 0]`); sparse inputs whose
    empty steps fall anywhere, not only at the end; a batch where fewer than half the rows are
    padded; attention models (a pad position's output there attends to the real tokens).
    """

    code = "GD252"
    slug = "last-step-is-padding"
    severity = Severity.WARNING
    summary = ("the last time step of a recurrent layer's output is used as the sequence summary, "
               "but the batch is right-padded: for most rows that step is padding")
    fix = ("read each row's last real step (out[torch.arange(len(x)), lengths - 1]), or pack the "
           "batch with pack_padded_sequence and use the final hidden state")

    def check(self, a):
        for e in a.of_kind("last_step_padded"):
            yield self.finding(
                f"the loss reads the last position of this {e['module']}'s output (out[:, -1]), "
                f"but its batch is right-padded: {e['padded']} of {e['rows']} rows end in "
                f"padding (length {e['length']}), so their summary is the state after padding "
                f"steps, not after their last token",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"module": e["module"], "rows": e["rows"], "length": e["length"],
                          "padded_rows": e["padded"]})
