from __future__ import annotations

from ..findings import Severity
from ..location import Location
from .base import Rule


# calls that pad a packed output back: the name they assign holds the layer's output too
_PADDERS = frozenset({"pad_packed_sequence"})


class LastStepIsPadding(Rule):
    """
    ## What it does
    Finds a batch-first recurrent layer (RNN, LSTM, GRU) run over a right-padded batch whose
    output at the last position (`out[:, -1]`) is what the loss reads: for most rows that
    position is padding. Checked on the first turns (CPU): the layer's input ends in a run of
    padding in at least half the rows (zero steps, as `pad_sequence` makes them or an
    embedding's `padding_idx` row gives, or the filler id of an embedding without one), and the
    loss's graph selects position T - 1 of the layer's output. It points at the layer's call.

    The same for a recurrent layer run on a `PackedSequence` whose output is padded back with
    `pad_packed_sequence` and read at its last position (`out[:, -1]`, or `out[-1]` seq-first;
    `out.select(1, T - 1)` with a `total_length`): there every row shorter than the longest
    holds the padding value, zeros. Read from the packed input's `batch_sizes` (how many rows
    run at each step) and the loss's graph (the select of the last position, through the copies
    `pad_packed_sequence` makes); at least half the rows shorter. It points at the line that
    reads that position.

    ## Why is this bad?
    A short sequence's summary is read after many padding steps: the state has run on over
    padding and forgotten much of the sequence, and every row is summarised at a different
    distance from its end. The model trains, worse than it should, and nothing fails. After
    `pad_packed_sequence` it is worse: the short rows' summary is a row of zeros, so the layer
    above sees the same input for all of them and the recurrent layer gets no gradient from
    them at all.

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
    ```python
    packed = pack_padded_sequence(emb, lengths, batch_first=True, enforce_sorted=False)
    out, (h_n, c_n) = self.lstm(packed)
    out, _ = pad_packed_sequence(out, batch_first=True)
    logits = self.head(out[:, -1])                # zeros for every row but the longest
    ```
    Use `h_n[-1]` (each row's state after its last real step) instead.

    ## Stays silent on
    Left padding; `pack_padded_sequence` with the final hidden state; the output gathered at
    `lengths - 1`; sequences of one length; the first position (`out[:, 0]`); sparse inputs whose
    empty steps fall anywhere, not only at the end; a batch where fewer than half the rows are
    padded; attention models (a pad position's output there attends to the real tokens). After
    `pad_packed_sequence`: `h_n`, a gather at `lengths - 1`, a pooling masked by the lengths,
    sequences of one length, position 0, a select along the feature axis.
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
            if e.get("packed"):
                yield self._packed(a, e)
                continue
            yield self.finding(
                f"the loss reads the last position of this {e['module']}'s output (out[:, -1]), "
                f"but its batch is right-padded: {e['padded']} of {e['rows']} rows end in "
                f"padding (length {e['length']}), so their summary is the state after padding "
                f"steps, not after their last token",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"module": e["module"], "rows": e["rows"], "length": e["length"],
                          "padded_rows": e["padded"]})

    def _packed(self, a, e):
        rows, length, padded = e["rows"], e["length"], e["padded"]
        time_dim = e.get("time_dim", 1)
        loc, text = e.loc, None
        if loc is not None:
            found = a.source.output_read_line(loc.path, loc.line, time_dim, length - 1, length,
                                              through=_PADDERS)
            if found is not None:
                loc, text = Location(loc.path, found[0], loc.function), found[1]
        read = f"`{text}`" if text else ("out[:, -1]" if time_dim == 1 else "out[-1]")
        state = ("h_n[-1] (h_n of the LSTM's (h_n, c_n))" if e["module"] == "LSTM"
                 else f"h_n[-1] (the {e['module']}'s second output)")
        return self.finding(
            f"the loss reads {read}, the last position of pad_packed_sequence's output of this "
            f"{e['module']} (length {length}), but {padded} of {rows} rows are shorter: there "
            f"their row is the padding value (zeros), not the state after their last token, so "
            f"the layer above sees the same zeros for all of them and the {e['module']} learns "
            f"nothing from them",
            loc, step=a.next_step_number(e.seq),
            fix=(f"use the final hidden state {state}, which pack_padded_sequence leaves at each "
                 f"row's last real step (for a bidirectional layer, cat h_n[-2] and h_n[-1]), or "
                 f"gather out[torch.arange(len(lengths)), lengths - 1]"),
            evidence={"module": e["module"], "rows": rows, "length": length, "padded_rows": padded,
                      "packed": True})
