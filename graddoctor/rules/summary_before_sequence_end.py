from __future__ import annotations

from ..findings import Severity
from ..location import Location
from .base import Rule


class SummaryBeforeSequenceEnd(Rule):
    """
    ## What it does
    Finds a causal sequence module (a one-direction RNN, LSTM or GRU; a Transformer encoder or
    decoder, or a `MultiheadAttention`, run with a causal mask or `is_causal`) whose output the
    loss reads only at early positions, and a bidirectional RNN read at its last step only
    (`out[:, -1]`: its backward half there has seen the last position alone): at two of its first backwards, from the same call, the
    gradient on the module's output is nonzero at the same positions in every row (`out[:, 0]`,
    `out[0]` of a seq-first layer, a fixed index or slice), and later positions that hold data
    never reach the loss. The output at position t of such a module has read positions 0..t
    only. The same holds for a recurrence the script unrolls itself, its states stacked with
    `torch.stack` along dim 0 or 1 (`h = cell(x[:, t], h)`, an Elman step written with matrices,
    a spiking neuron's membrane): a stack of 3 steps or more, each built on the one before (its
    graph reaches the previous step's), read at the same early steps only. It points at the line
    that indexes the output when the script writes it with constants, else at the module's call
    (the stack).

    ## Why is this bad?
    The summary the head is trained on has seen the first token (or the first few) only: the
    module's reading of the rest of each sequence is wasted, and the model learns from the
    beginning of the sequence alone. It trains, its loss goes down a little, and nothing fails.
    In a bidirectional layer read at one end, one direction's half of the summary has read one
    step: the layer trains as a one-direction layer with half its features wasted, and what
    depends on the sequence's start must survive the whole forward pass.

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
    `out[:, -1]` and `h_n[-1]` of a one-direction layer; each row's last real step gathered with
    its length; `pack_padded_sequence`; a bidirectional RNN read at each direction's own end
    (`torch.cat([h_n[-2], h_n[-1]], 1)`, `torch.cat([out[:, -1, :H], out[:, 0, H:]], 1)`), at
    both ends, or at position 0 (its backward half has read everything there); CLS pooling `out[:, 0]` of a Transformer encoder
    without a causal mask; mean, max or attention pooling over time; language models, seq2seq
    decoders with teacher forcing, CTC and taggers, whose loss reads every position (or every
    one but the last); positions after the read one that hold padding in every row (by the input, or hidden in every row by the call's own key padding mask: a caption decoder's tail after captions of one length); a
    one-direction layer over the output of a bidirectional layer, of attention without a causal
    mask or of a convolution (its early inputs have seen the later positions); a step drawn anew
    for each batch (CPC's context predicting the steps after it); stacked states read at the
    last step or pooled over time, a recurrence run backward (stacked in time order) read at
    step 0, a stack of per-step values that do not depend on each other (projections of each
    input step) read at slot 0.
    """

    code = "GD149"
    slug = "summary-before-sequence-end"
    severity = Severity.WARNING
    summary = ("the loss reads a causal sequence module's output (one-direction RNN/LSTM/GRU, "
               "causal Transformer) only at an early position, which has seen part of the sequence")
    fix = ("read the summary where the module has seen the whole sequence: out[:, -1] or h_n[-1] "
           "(each row's last real step with padding), or pool over time, or use a bidirectional "
           "layer or a non-causal encoder")

    def _one_direction(self, a, e, loc, what):
        backward = e["direction"] == "backward"
        end = "last" if backward else "first"
        half = "second" if backward else "first"
        count = e["length"] - e["unread"]
        seen = (f"the {end} position only" if count == 1
                else f"the {end} {count} positions only")
        return self.finding(
            f"the loss reads {what} of a bidirectional {e['module']}'s output (length "
            f"{e['length']}), its {end} step only: there the {e['direction']} direction (the "
            f"{half} half of the features) has seen {seen}, so that direction never reads "
            f"the other {e['unread']} positions and its half of the summary carries almost "
            f"nothing; the layer trains as a one-direction {e['module']} with a wasted half",
            loc, step=a.next_step_number(e.seq), fix=_direction_fix(e),
            evidence={"module": e["module"], "positions": e["positions"], "length": e["length"],
                      "unread_positions": e["unread"], "rows": e["rows"],
                      "direction": e["direction"]})

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
            if e.get("direction"):
                yield self._one_direction(a, e, loc, what)
                continue
            causal = ("the states of a recurrence unrolled step by step and stacked with "
                      "`torch.stack`" if e["module"] == "torch.stack"
                      else "a causal Transformer" if e["module"].startswith("Transformer")
                      else "a causal attention layer" if e["module"] == "MultiheadAttention"
                      else f"a one-direction {e['module']}")
            seen = "the first position only" if last == 0 else f"positions 0..{last} only"
            output = causal if e["module"] == "torch.stack" else f"{causal}'s output"
            yield self.finding(
                f"the loss reads {what} of {output} (length {length}) and nothing after "
                f"it: there the output has seen {seen}, so {e['unread']} later positions of the "
                f"sequences never reach the loss and the model learns from their start alone",
                loc, step=a.next_step_number(e.seq),
                fix=_fix(e, text),
                evidence={"module": e["module"], "positions": positions, "length": length,
                          "unread_positions": e["unread"], "rows": e["rows"]})


def _direction_fix(e) -> str:
    if e["seq_first"]:
        both = "torch.cat([out[-1, :, :H], out[0, :, H:]], 1)"
    else:
        both = "torch.cat([out[:, -1, :H], out[:, 0, H:]], 1)"
    return (f"read each direction at its own end: the final states, torch.cat([h_n[-2], h_n[-1]], 1), "
            f"or {both} (H the hidden size; with padding, the forward half at each row's last "
            f"real step), or pool over time")


def _fix(e, text: str | None) -> str:
    if e["module"] == "torch.stack":
        last = "states[-1]" if e["seq_first"] else "states[:, -1]"
        axis = 0 if e["seq_first"] else 1
        return (f"read the step that has seen the whole sequence, {last} (the final state), or "
                f"pool over time (states.mean({axis}), a spiking network's membrane or spike "
                f"count summed over its steps)")
    if e["module"].startswith("Transformer") or e["module"] == "MultiheadAttention":
        return ("read the last position (h[:, -1], or each row's last real token with padding), "
                "or drop the causal mask for a classifier whose summary is read at position 0")
    last = "out[-1]" if e["seq_first"] else "out[:, -1]"
    return (f"read the step that has seen the whole sequence: {last} or h_n[-1] (with padding: "
            f"each row's last real step, out[torch.arange(B), lengths - 1], or "
            f"pack_padded_sequence and h_n), pool over time, or make the layer bidirectional")
