from __future__ import annotations

from ..findings import Severity
from ..location import Location
from .base import Rule


class SummaryBeforeSequenceEnd(Rule):
    """
    ## What it does
    Finds a causal sequence module (a one-direction RNN, LSTM or GRU; a Transformer encoder or
    decoder, or a `MultiheadAttention`, run with a causal mask or `is_causal`) whose output the
    loss reads only at early positions: at two of its first backwards, from the same call, the
    gradient on the module's output is nonzero at the same positions in every row (`out[:, 0]`,
    `out[0]` of a seq-first layer, a fixed index or slice), and later positions that hold data
    never reach the loss. The output at position t of such a module has read positions 0..t
    only. It points at the line that indexes the output when the script writes it with
    constants, else at the module's call.

    ## Why is this bad?
    The summary the head is trained on has seen the first token (or the first few) only: the
    module's reading of the rest of each sequence is wasted, and the model learns from the
    beginning of the sequence alone. It trains, its loss goes down a little, and nothing fails.

    ## Example
    ```python
    out, _ = self.gru(self.emb(tokens))      # one direction, batch_first
    logits = self.fc(out[:, 0])              # the first step has seen one token
    ```

    ## Use instead
    ```python
    out, h_n = self.gru(self.emb(tokens))
    logits = self.fc(h_n[-1])                # or out[:, -1]; with padding: each row's
    # out[torch.arange(len(tokens)), lengths - 1], or pack_padded_sequence
    ```

    ## Stays silent on
    `out[:, -1]` and `h_n[-1]`; each row's last real step gathered with its length;
    `pack_padded_sequence`; a bidirectional RNN read at position 0 (its backward direction has
    read the whole sequence) or at both ends; CLS pooling `out[:, 0]` of a Transformer encoder
    without a causal mask; mean, max or attention pooling over time; language models, seq2seq
    decoders with teacher forcing, CTC and taggers, whose loss reads every position (or every
    one but the last); positions after the read one that hold padding in every row; a
    one-direction layer over the output of a bidirectional layer, of attention without a causal
    mask or of a convolution (its early inputs have seen the later positions); a step drawn anew
    for each batch (CPC's context predicting the steps after it).
    """

    code = "GD149"
    slug = "summary-before-sequence-end"
    severity = Severity.WARNING
    summary = ("the loss reads a causal sequence module's output (one-direction RNN/LSTM/GRU, "
               "causal Transformer) only at an early position, which has seen part of the sequence")
    fix = ("read the summary where the module has seen the whole sequence: out[:, -1] or h_n[-1] "
           "(each row's last real step with padding), or pool over time, or use a bidirectional "
           "layer or a non-causal encoder")

    def check(self, a):
        for e in a.of_kind("causal_read_early"):
            positions, length = e["positions"], e["length"]
            last = max(positions)
            loc, text = e.loc, None
            if loc is not None:
                found = a.source.output_read_line(loc.path, loc.line, 0 if e["seq_first"] else 1,
                                                  last, length)
                if found is not None:
                    loc, text = Location(loc.path, found[0], loc.function), found[1]
            what = f"`{text}`" if text else (
                f"position {positions[0]}" if e["read"] == 1 else f"positions {positions[0]}..{last}")
            causal = ("a causal Transformer" if e["module"].startswith("Transformer")
                      else "a causal attention layer" if e["module"] == "MultiheadAttention"
                      else f"a one-direction {e['module']}")
            seen = "the first position only" if last == 0 else f"positions 0..{last} only"
            yield self.finding(
                f"the loss reads {what} of {causal}'s output (length {length}) and nothing after "
                f"it: there the output has seen {seen}, so {e['unread']} later positions of the "
                f"sequences never reach the loss and the model learns from their start alone",
                loc, step=a.next_step_number(e.seq),
                fix=_fix(e, text),
                evidence={"module": e["module"], "positions": positions, "length": length,
                          "unread_positions": e["unread"], "rows": e["rows"]})


def _fix(e, text: str | None) -> str:
    if e["module"].startswith("Transformer") or e["module"] == "MultiheadAttention":
        return ("read the last position (h[:, -1], or each row's last real token with padding), "
                "or drop the causal mask for a classifier whose summary is read at position 0")
    last = "out[-1]" if e["seq_first"] else "out[:, -1]"
    return (f"read the step that has seen the whole sequence: {last} or h_n[-1] (with padding: "
            f"each row's last real step, out[torch.arange(B), lengths - 1], or "
            f"pack_padded_sequence and h_n), pool over time, or make the layer bidirectional")
