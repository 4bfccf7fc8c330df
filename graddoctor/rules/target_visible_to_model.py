from __future__ import annotations

import ast

import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_RECURRENT = ("RNN", "LSTM", "GRU")
# how each of torch's attention modules takes a causal mask
_MASKS = {
    "Transformer": "tgt_mask=nn.Transformer.generate_square_subsequent_mask({T})",
    "TransformerDecoder": "tgt_mask=nn.Transformer.generate_square_subsequent_mask({T}), tgt_is_causal=True",
    "TransformerDecoderLayer": "tgt_mask=nn.Transformer.generate_square_subsequent_mask({T}), tgt_is_causal=True",
    "TransformerEncoder": "mask=nn.Transformer.generate_square_subsequent_mask({T}), is_causal=True",
    "TransformerEncoderLayer": "src_mask=nn.Transformer.generate_square_subsequent_mask({T}), is_causal=True",
    "MultiheadAttention": "attn_mask=nn.Transformer.generate_square_subsequent_mask({T})",
}


class TargetVisibleToModel(Rule):
    """
    ## What it does
    Finds sequence models trained on next-token targets whose output at position `t` depends
    on the tokens after `t` — the very token it is asked to predict among them: a decoder or
    GPT without a causal mask, an inverted or transposed mask, a mask built one diagonal too high
    (`torch.tril(ones, diagonal=1)`: reported at its construction), `nn.TransformerDecoder` without
    `tgt_mask`, `scaled_dot_product_attention` without `is_causal=True`, a bidirectional RNN
    used as a language model; with causal masks on every attention module (read from the mask
    given), an op of the model's forward that normalises or reduces over the time axis
    (`F.layer_norm(x, x.shape[-2:])`, `x - x.mean(dim=1)`), reported at that op; a norm layer
    built over positions and features (`nn.LayerNorm([T, C])`) or a `Conv1d` padded at both ends
    (`padding=k // 2`, `"same"`), reported where it is built, or, when the forward crops such a
    convolution's output from its start (Mamba's depthwise conv padded by k - 1 and cut with
    `[..., -L:]`), at the crop; an FFT convolution (S4, H3, Hyena) whose transforms are not
    padded to 2L, so the product's inverse is circular (`irfft(.., n=L)` after `rfft(.., n=2 *
    L)`, or forward transforms without `n=`), reported at the transform. It also finds the opposite case: a causal model whose targets are
    not shifted (`targets == input_ids`) or are shifted the wrong way, so position `t` is trained
    to predict a token it already reads, or are shifted twice (`labels=ids[:, 1:]` given to a
    transformers causal LM, which shifts its labels itself), so position `t` learns the token
    after the next. graddoctor compares the loss's targets (or, in a hand-written
    log-likelihood, the tokens a `gather` picks out of a `log_softmax`, out of a softmax's log
    or out of logits a `logsumexp` normalises, the tokens integer indexing picks out of
    probabilities (`p[arange(B)[:, None], arange(T), y]`), the classes of a one-hot multiplied
    into the log-probs: DPO's and a policy's sequence log-probs, a next-token loss summed by
    hand; or, for a label smoothing written by hand, the class each row of the
    smoothed distribution given to `kl_div` / `cross_entropy` puts its mass on, its zeroed
    padding rows ignored) with the ids the model embedded (a
    shift of 1, 0, -1 or 2 at 90 % of the positions) and takes the gradient
    of one output position with respect to the embeddings once, at the first backward. A torch
    attention module called with a causal-mask keyword whose name the file binds only to `None`
    (`tgt_mask = None` in the loop, passed down as `tgt_mask=tgt_mask`) is reported at that
    assignment. Unshifted
    targets are reported at the loss call, or at the statement that slices them when the loop
    slices them apart (`inputs, targets = ids[:, :-1], ids[:, :-1]`). A recurrent language
    model the probe does not read (seq-first `batchify`'d data, a hand-written update) is read
    from the loss's graph at its first backwards instead: the `nll_loss`/`cross_entropy` target
    equal, position for position, to the ids an embedding below it read, a recurrent layer
    between them, no lookup of the targets one position later, and only unidirectional
    `nn.LSTM`/`nn.GRU`/`nn.RNN` layers in the script; it points at the assignment that slices the
    targets when the script has one. The same
    leak in a table: a loss target (one value per sample) that one column of the data the
    model's first layer reads holds (`X = data` with the label as its last column,
    `TensorDataset(table, table[:, -1])`), compared at the first 8 loss calls on the CPU.
    The same leak in an unrolled rollout (a neural PDE surrogate, a learned simulator): a state
    taken at `X[..., t0]` before a `for k in range(K)` loop that carries it, whose target at step
    `k` is read at `X[..., t0 + k]` (read from the source: the stepper is trained to return the
    state it was given). The same leak in a real-valued series: a regression loss's target whose values, in every
    sample, are the values a recurrent or linear layer of the model reads at the last step the
    prediction there reads (one extra gradient of that prediction): a forecaster whose target
    window starts at the input window's last step (`series[i + L - 1]`), a seq2seq decoder fed
    the unshifted targets under teacher forcing (`dec_in = tgt`), a decoder unrolled by hand fed
    `y[:, k]` at step k, a next-frame predictor trained on `x[:, :-1]` against `x[:, :-1]`.
    It is reported where the decoder's input is built when that input is not the model's first
    one (at the decoder's own call when the target's slice is written in it: `self.cell(tgt[:,
    k] if tgt is not None else prev, h)`), else where the target is built in the loop (else at
    the loss call). A `Conv1d` reading the data is judged by its window (its padding,
    dilation and stride give the steps each output position reads): a convolution whose window
    at the target's position covers the target's step and steps after it is not causal (a TCN
    that crops `x[:, :, pad:]` instead of `x[:, :, :-pad]`, a `"same"`-padded stack trained on
    the next step), reported at the crop that keeps the future side when the forward has one,
    else at the convolution's call; a causal convolution trained on the input itself (behind a
    left padding or not) copies its own step, reported where the target is built.

    ## Why is this bad?
    The loss drops to almost nothing because the answer is in the input: the model learns to
    copy the next token from where it can see it, not to predict it. Generation, where the
    future is not there, then produces garbage. With unshifted targets the model learns the
    identity. Nothing fails; the training curve looks better than ever.

    ## Example
    ```python
    def forward(self, idx):
        x = self.embed(idx)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.head(x + y)

    loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    ```

    ## Use instead
    ```python
    def forward(self, idx):
        x = self.embed(idx)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(x + y)
    ```

    ## Stays silent on
    Causal models with next-token targets (`is_causal=True`, `generate_square_subsequent_mask`,
    a `tril` mask, a unidirectional RNN); a causal mask whose softmax normalises the queries
    (`softmax-wrong-axis` names that cause: each output then depends on the later queries); a second head trained on the token after the next
    beside a next-token loss (multi-token prediction); encoder-decoders whose decoder is masked (the encoder
    sees the whole source); masked language models (BERT-style targets, -100 except the masked
    positions); text autoencoders and denoisers (targets equal to the input, the model not
    causal; a bidirectional RNN restoring the ids it reads); seq-first language models over
    `batchify`'d data with their targets shifted; an RNN autoencoder (its decoder reads the
    targets one position later); models that compute their loss
    inside `forward` on shifted labels (transformers' `labels=`); models on an accelerator,
    under DDP or compiled (not probed). In a table: a target that is a function of a feature
    but not a copy of it (`y = 3 * x[:, 0]`, a toy task), a one-column input, a target of
    several values per sample (an autoencoder), a constant target (a GAN's real labels),
    conditioning columns that are not the target (a conditional GAN's one-hot labels). In a
    series: a forecaster whose target starts after its window (`series[i + L:i + L + H]`, the
    series overlaps but not at the step read last), teacher forcing with the targets shifted by
    one, an autoencoder (the target is its input, read whole through its final state or its
    bottleneck), a per-frame autoencoder (each frame read alone), a memory task (the target is
    a step read long before), masked reconstruction (the hidden steps are not in the input, the others at their own place), a
    residual forecaster predicting the change, an unrolled rollout whose target at step `k`
    is read at `t0 + k + 1` (or from a targets array already shifted by one), a one-value target a dense layer reads (the
    table's case above), an autoencoder trained to reconstruct its input in reverse order
    (every target step is an input step, reordered), a causal convolution (padded on the left,
    or padded by (k - 1) * dilation and cropped on the right) trained on the next step, a
    non-causal convolutional denoiser whose target is the clean series at its own positions, a
    `Conv1d` subclass whose own forward pads its input (not judged), models whose first layers
    are attention (not judged); FFT convolutions padded to 2L (by `n=2 * L`, or by `F.pad` before
    transforms without `n=`) whose first L outputs are kept, and a conv padded by k - 1 on both
    ends whose first L outputs are kept (Mamba's).
    """

    code = "GD244"
    slug = "target-visible-to-model"
    severity = Severity.WARNING
    summary = ("a sequence model sees the token or value it is trained to predict: its output at "
               "position t depends on the next-token target (no causal mask), or its targets are "
               "not shifted (a forecaster's target in its own input window)")
    fix = ("make the model causal (is_causal=True, a causal mask, a unidirectional RNN) and "
           "train position t on the token at t + 1: logits[:, :-1] against ids[:, 1:]")

    def check(self, a):
        yield from self._rollout_unshifted(a)
        for e in a.of_kind("target_in_inputs"):
            yield self._column(a, e)
        probed = list(self._probed(a))
        yield from probed
        if any(f.evidence.get("shift") == 0 for f in probed):
            return  # the probe said it, at the loss call: the graph's reading adds nothing
        for e in a.of_kind("token_copy"):
            if e.loc is not None:
                found = self._token_copy(a, e)
                if found is not None:
                    yield found
                    return

    def _rollout_unshifted(self, a):
        """An unrolled rollout whose target at step k is the state it started from at k = 0
        (source: ``rollout_targets_unshifted``)."""
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, start_line, state, index, step in rollout_targets_unshifted(tree):
                yield self.finding(
                    f"the rollout starts from `{state}` at index `{index}` (line {start_line}), "
                    f"and the target of unrolled step `{step}` is read at `{text}`: at the first "
                    f"step the target is the very state the model is given, and at each later "
                    f"step the state it was given one step earlier, so the stepper learns to copy "
                    f"its input (the identity), not to advance the solution",
                    Location(path, line),
                    evidence={"shift": 0, "rollout": True, "state": state, "start_line": start_line},
                    fix=(f"read the target one step ahead of the state: index `{index} + {step} + 1` "
                         f"at unrolled step `{step}`"))

    def _probed(self, a):
        """The findings of the dependency probe's sequence events (dependency.py)."""
        seen: set = set()
        # attention weights normalised over the queries (softmax-wrong-axis) make each output
        # depend on the later queries' scores: that rule names the cause and its fix; a leak
        # read here would point at the mask, which is right
        axis_wrong = any(x.get("op") == "softmax" for x in a.by_kind.get("softmax_axis", ()))
        for e in a.by_kind.get("dependency", ()):
            seq = e.get("seq")
            if not seq or (e["model"], e.loc) in seen:
                continue
            if seq.get("copy"):
                seen.add((e["model"], e.loc))
                yield self._copied(a, e, seq["copy"])
                continue
            k = seq.get("k")
            if k == 1 and seq.get("future"):
                seen.add((e["model"], e.loc))
                if not axis_wrong:
                    yield self._leak(a, e, seq)
            elif k in (0, -1, 2) and seq.get("past") and not seq.get("future"):
                seen.add((e["model"], e.loc))
                yield self._unshifted(a, e, seq)

    def _token_copy(self, a, e):
        """A recurrent language model's targets that are its input ids (tokencopy.py), when the
        script's recurrent layers are all unidirectional (a bidirectional one reads the future:
        a tagger or an autoencoder may copy on purpose)."""
        path = e.loc.path
        stepwise = bool(e.get("stepwise"))
        layers = a.source.calls_named(path, frozenset({"LSTM", "GRU", "RNN"}))
        if not stepwise and (not layers or any("bidirectional=True" in text for _, text, _ in layers)):
            return None
        loc, fix = e.loc, ("slice the targets one position after the inputs: `data = "
                           "source[i:i + seq_len]`, `target = source[i + 1:i + 1 + seq_len]`")
        built = a.source.target_slice_line(path, columns=stepwise)
        if built is None and stepwise:  # no targets slice: the call that feeds the decoder
            tree = a.source.tree(path)
            fed = _decoder_fed_target(tree, e.loc.line) or _step_indexed_call(tree)
            if fed is not None:
                loc = Location(path, fed, e.loc.function)
        if built is not None:
            loc = Location(path, built[0], e.loc.function)
        if stepwise:
            fix = ("take the targets one step after the tokens the decoder is fed: with "
                   "`seq[:, t]` fed at step t, the target of step t is `seq[:, t + 1]` "
                   "(feed `seq[:, :-1]`, score against `seq[:, 1:]`)")
            return self.finding(
                f"the decoder's loop reads one token per step ({e['lookups']} steps), and the "
                f"loss's target at each step is the token it is fed at that step "
                f"({e['positions']} positions compared): each step is trained to output the "
                f"token it already reads, so the decoder learns to copy its input, not to "
                f"predict the next token", loc,
                evidence={"shift": 0, "positions": e["positions"], "lookups": e["lookups"],
                          "stepwise": True}, fix=fix)
        return self.finding(
            f"the loss's target at each position is the input token at that same position (the "
            f"targets are the input ids, not shifted: {e['positions']} positions compared), and "
            f"the model reads them through a unidirectional recurrent layer: each position is "
            f"trained to output the token it already reads, so the model learns to copy its input, "
            f"not to predict the next token", loc,
            evidence={"shift": 0, "positions": e["positions"], "lookups": e["lookups"]}, fix=fix)

    def _column(self, a, e):
        column, columns, fn = e["column"], e["columns"], e.get("fn", "the loss")
        if e.get("window"):
            return self.finding(
                f"the target {fn} is given is step {column} of the {columns}-step window the model "
                f"reads as its input (the window's columns follow a series): the model is asked "
                f"for a value it is given, so it learns to copy that step and its training loss "
                f"falls toward 0, while at inference the value to forecast is not in the window",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"column": column, "columns": columns, "function": fn, "window": True},
                fix=("start the target where the window ends: with a window of L steps from i, "
                     "the target is the series at i + L (`series[i + L]`), not at i + L - 1"))
        return self.finding(
            f"the target {fn} is given is a copy of column {column} of the {columns} columns the model "
            f"reads as its input: the label was left among the features, so the model learns to "
            f"copy that column, its training loss falls toward 0, and it has learned nothing it "
            f"can use where the target is not in the input",
            e.loc, step=a.next_step_number(e.seq),
            evidence={"column": column, "columns": columns, "function": fn},
            fix=(f"drop the target's column from the inputs (e.g. X = data[:, :-1] when the label "
                 f"is the last column; here column {column}), or build the features and the "
                 f"target from separate columns"))

    def _leak(self, a, e, seq):
        model, T, t = e["model"], seq["positions"], seq["t"]
        what = (f"{model} is trained on next-token targets (the target at each position is the "
                f"input token at the next one), but its output at position {t} depends on the "
                f"input tokens after position {t}, the one it has to predict among them")
        loc, why, fix = _leak_site(a, e, T)
        return self.finding(
            f"{what}: {why}. The loss falls because the answer is in the input; generation, "
            f"where the future is not there, fails", loc or e.loc,
            evidence={"model": model, "shift": 1, "positions": T, "position": t,
                      "sees_later_positions": True},
            fix=fix)

    def _unshifted(self, a, e, seq):
        model, T, t, k = e["model"], seq["positions"], seq["t"], seq["k"]
        at = seq.get("target_at")
        loc = Location(str(at[0]), int(at[1]), str(at[2])) if at else e.loc
        sliced = False
        if loc is not None and k in (0, -1):
            # the targets sliced in a statement of their own (`tgt_out = tgt[:, :-1]`): the
            # slice is what to change, not the loss call that reads it
            built = a.source.target_assignment(loc.path, loc.line)
            sliced = built is not None and bool(re.search(r"\[[^\]]*:", built[1]))
            if sliced:
                loc = Location(loc.path, built[0], loc.hook)
        gathered = seq.get("gathered") and not at and loc is not None
        if gathered:
            # a hand-written log-likelihood: the gather that picks the tokens' log-probabilities
            # is what to change, a few lines below the model's call
            line = _gather_line(a, loc)
            if line is not None:
                loc = Location(loc.path, line, loc.hook)
        if k == 2:
            return self._shifted_twice(a, e, seq, loc)
        decoder = None
        if k == 0 and not sliced and not gathered and loc is not None and e.loc is not None:
            decoder = _decoder_input_from_target(a, e.loc, loc)
        if decoder is not None:
            line, name, text = decoder
            return self.finding(
                f"the decoder input `{name}` holds, at each position, the target token of that "
                f"same position (`{text.strip()}` is not shifted right), and {model} is causal "
                f"(its output at position {t} depends on the decoder inputs up to {t}): each "
                f"position is handed the token it is trained to predict, so the model learns to "
                f"copy it, and generation, which feeds its own previous token, fails",
                Location(loc.path, line, loc.hook),
                evidence={"model": model, "shift": k, "positions": T, "position": t,
                          "sees_later_positions": False},
                fix=(f"shift the decoder input right by one: the start token first, then the "
                     f"targets without their last (`{name} = torch.cat([bos, tgt[:, :-1]], dim=1)`)"))
        if k == 0:
            how = ("the loss's target at each position is the input token at that same position "
                   "(the targets are the input ids, not shifted)")
        else:
            how = ("the loss's target at each position is the input token one position earlier "
                   "(the targets are shifted the wrong way)")
        message = (f"{how}, and {model} is causal (its output at position {t} depends on the "
                   f"tokens up to {t}, none after): each position is trained to predict a token "
                   f"it already reads, so the model learns to copy its input, not the next token")
        fix = ("predict the next token: compare the logits of positions 0..T-2 with the ids of "
               "positions 1..T-1, `F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), "
               "ids[:, 1:].reshape(-1))`")
        if sliced:
            fix = ("slice the targets one position after the inputs: `inputs, targets = "
                   "ids[:, :-1], ids[:, 1:]`")
        elif gathered:
            fix = ("gather the log-probabilities of the next tokens: for logits of `ids[:, :-1]`, "
                   "`log_probs.gather(-1, ids[:, 1:, None])`")
        return self.finding(
            message, loc,
            evidence={"model": model, "shift": k, "positions": T, "position": t,
                      "sees_later_positions": False},
            fix=fix)


    def _copied(self, a, e, copy):
        """A real-valued target the model reads at the step it outputs it (seqcopy.py)."""
        model, t, s, reader = e["model"], copy["t"], copy["s"], copy["reader"]
        P, steps, reads = copy["positions"], copy["steps"], copy["kind"]
        target_at = copy.get("target_at")
        read_at = copy.get("read_at")
        loss_loc = Location(str(target_at[0]), int(target_at[1]), str(target_at[2])) if target_at else e.loc
        given = copy.get("input")
        where = f"target position {t}" if P > 1 else "the target"
        if reads in ("dense", "bi"):
            seen = f"the {reader} that reads it sees every step of its input at once"
        elif reads == "steps":
            seen = f"the prediction there reads that step through the {reader} and no later one"
        else:
            seen = (f"the {reader} reads it at the very step its output there is taken from "
                    f"(nothing after it)")
        layer = "its input" if reader == model else f"the input of its {reader}"
        message = (f"{where} of the loss holds, in every sample, exactly the values {model} is "
                   f"given at step {s} of {layer} ({steps} steps), and {seen}: the "
                   f"model can copy its target from its input. The loss falls fast because the "
                   f"answer is in the input; at inference, where the value is not known yet, "
                   f"the forecasts are no better than repeating the last input")
        if reads == "conv" and not copy.get("whole") and copy.get("reads_after"):
            return self._conv_sees_target(a, e, copy, loss_loc)
        if copy.get("whole"):
            message = (f"the loss's target is the very sequence the {reader} of {model} reads, "
                       f"position for position ({P} steps), and {model} is causal: its "
                       f"prediction at step {t} reads the steps up to {t}, the target's own value "
                       f"among them, so the model learns to copy its input, not to predict "
                       f"the next value (teacher forcing needs the targets shifted by one)")
        loc, fix = loss_loc, None
        if read_at is not None and (given is None or given > 0):
            # the copied input is built for the model (a decoder's input, a teacher-forced
            # step), not the model's first input: that input is what to shift
            built = _argument_origin(a, str(read_at[0]), int(read_at[1]), 0)
            if built is None and _reads_slice(a, str(read_at[0]), int(read_at[1])):
                # the reader is handed a slice of the target in its own call (`self.dec(y[:, t]
                # if y is not None else prev, h)`): that call is what to change
                built = Location(str(read_at[0]), int(read_at[1]), str(read_at[2]))
            if built is None and given is not None and e.loc is not None:
                built = _argument_origin(a, e.loc.path, e.loc.line, given)
            if built is not None:
                loc = built
                fix = ("feed the decoder the previous step's value, not the current one: the "
                       "last observed value first, then the targets shifted by one "
                       "(`torch.cat([src[:, -1:], tgt[:, :-1]], dim=1)`, or `y[:, k - 1]` at "
                       "step k)")
        if fix is None:
            built = a.source.target_assignment(loss_loc.path, loss_loc.line) if loss_loc is not None else None
            if built is not None:
                loc = Location(loss_loc.path, built[0], loss_loc.hook)
            fix = ("start the target where the input ends: with a window of L steps from i, the "
                   "target is the series from i + L on (`series[i + L:i + L + H]`), not from "
                   "i + L - 1; for a sequence-to-sequence model, compare the output at step t "
                   "with the input at step t + 1 (`x[:, :-1]` in, `x[:, 1:]` as the target)")
        return self.finding(
            message, loc,
            evidence={"model": model, "position": t, "input_step": s, "positions": P,
                      "steps": steps, "reader": reader, "whole": bool(copy.get("whole")),
                      "sees_later_positions": reads in ("dense", "bi")},
            fix=fix)

    def _conv_sees_target(self, a, e, copy, loss_loc):
        """A convolution whose window at the target's position covers the target's step and
        steps after it: it is not causal."""
        model, t, s, reader = e["model"], copy["t"], copy["s"], copy["reader"]
        read_at = copy.get("read_at")
        message = (f"target position {t} of the loss holds, in every sample, exactly the values "
                   f"{model} is given at step {s} of the input of its {reader}, and the "
                   f"{reader}'s window at position {t} covers that step and steps after it: the "
                   f"convolution is not causal (its padding or cropping keeps the future side), "
                   f"so the model can read its target from its input. The loss falls fast "
                   f"because the answer is in the input; at inference, where the value is not "
                   f"known yet, the forecasts are no better than repeating the last input")
        loc, fix = loss_loc, ("make the convolution causal: pad only the left side "
                              "(`F.pad(x, ((k - 1) * dilation, 0))` with padding=0), or crop the "
                              "right end of a conv padded by (k - 1) * dilation")
        if read_at is not None:
            crop = _crop_keeping_end(a, str(read_at[0]))
            if crop is not None:
                loc = Location(str(read_at[0]), crop, None)
                fix = ("crop the padding off the right end: a Conv1d padded by (k - 1) * "
                       "dilation keeps its first L outputs (`x[:, :, :-pad]`), not its last")
            else:
                loc = Location(str(read_at[0]), int(read_at[1]), str(read_at[2]))
        return self.finding(
            message, loc,
            evidence={"model": model, "position": t, "input_step": s,
                      "positions": copy["positions"], "steps": copy["steps"], "reader": reader,
                      "whole": False, "sees_later_positions": True},
            fix=fix)

    def _shifted_twice(self, a, e, seq, loc):
        model, T, t = e["model"], seq["positions"], seq["t"]
        message = (f"the loss's target at each position is the input token two positions later, and "
                   f"{model} is causal: each position is trained to predict the token after the "
                   f"next one, skipping the one it will have to generate. The targets were "
                   f"shifted twice: once by the script, once by the loss")
        written = a.source.line_text(loc.path, loc.line) if loc is not None else ""
        fix = ("pass labels=input_ids (the same ids as input_ids, padding set to -100): the model "
               "shifts its labels itself" if "labels=" in written.replace(" ", "") else
               "shift the targets by one: compare logits[:, :-1] with ids[:, 1:]")
        return self.finding(
            message, loc,
            evidence={"model": model, "shift": 2, "positions": T, "position": t,
                      "sees_later_positions": False},
            fix=fix)


def _subscript_index(node: ast.Subscript, position: int) -> ast.AST | None:
    key = node.slice
    items = key.elts if isinstance(key, ast.Tuple) else [key]
    return items[position] if position < len(items) else None


def _reads_at(node: ast.AST, array: str, index_text: str) -> list[tuple[int, ast.Subscript]]:
    """``(position, subscript)`` of the reads of ``array`` whose index at that position is the
    text ``index_text``."""
    found = []
    for n in walk(node):
        if isinstance(n, ast.Subscript) and ast.unparse(n.value) == array:
            key = n.slice
            items = key.elts if isinstance(key, ast.Tuple) else [key]
            for i, item in enumerate(items):
                if ast.unparse(item) == index_text:
                    found.append((i, n))
    return found


def rollout_targets_unshifted(tree: ast.AST) -> list[tuple[int, str, int, str, str, str]]:
    """``(line, target read, start line, state, start index, step)``: a state assigned from
    ``X[..., t0]`` before a ``for k in range(K)`` loop (from 0) that carries it (reassigns it)
    and reads ``X[..., t0 + k]`` at the same position (the target of step k, which is the
    state of step k itself, not the next one)."""
    found = []
    for owner in walk(tree):
        body = getattr(owner, "body", None)
        if not isinstance(body, list):
            continue
        for i, loop in enumerate(body):
            if not (isinstance(loop, ast.For) and isinstance(loop.target, ast.Name)
                    and isinstance(loop.iter, ast.Call) and isinstance(loop.iter.func, ast.Name)
                    and loop.iter.func.id == "range" and loop.iter.args
                    and (len(loop.iter.args) == 1 or (isinstance(loop.iter.args[0], ast.Constant)
                                                      and loop.iter.args[0].value == 0))):
                continue
            step = loop.target.id
            carried = {n.id for stmt in loop.body for n in walk(stmt)
                       if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            for start in body[:i]:
                if not (isinstance(start, ast.Assign) and len(start.targets) == 1
                        and isinstance(start.targets[0], ast.Name)
                        and start.targets[0].id in carried):
                    continue
                state = start.targets[0].id
                for n in walk(start.value):
                    if not isinstance(n, ast.Subscript):
                        continue
                    array = ast.unparse(n.value)
                    key = n.slice
                    items = key.elts if isinstance(key, ast.Tuple) else [key]
                    for position, item in enumerate(items):
                        if not isinstance(item, (ast.Name, ast.Attribute)):
                            continue
                        index = ast.unparse(item)
                        for text in (f"{index} + {step}", f"{step} + {index}"):
                            for stmt in loop.body:
                                for pos, read in _reads_at(stmt, array, text):
                                    if pos == position:
                                        found.append((read.lineno, ast.unparse(read), start.lineno,
                                                      state, index, step))
    return sorted(set(found))


def _gather_line(a, loc: Location) -> int | None:
    """The first line from the model's call on (within 12) that gathers from log-probabilities."""
    for line in range(loc.line, loc.line + 12):
        text = a.source.line_text(loc.path, line) or ""
        if "gather(" in text:
            return line
    return None


def _crop_keeping_end(a, path: str) -> int | None:
    """The line of the one slice in a ``forward`` of the file that drops the first steps of the
    last axis and keeps the rest (``x[:, :, self.chomp_size:]``, ``x[..., pad:]``): the crop a
    causal convolution makes on the wrong side."""
    tree = a.source.tree(path)
    if tree is None:
        return None
    found = []
    for fn in walk(tree):
        if not isinstance(fn, ast.FunctionDef) or fn.name != "forward":
            continue
        for n in walk(fn):
            if not isinstance(n, ast.Subscript) or not isinstance(n.slice, ast.Tuple):
                continue
            *lead, last = n.slice.elts
            if not lead or not isinstance(last, ast.Slice) or last.lower is None \
                    or last.upper is not None or last.step is not None:
                continue
            if all((isinstance(x, ast.Slice) and x.lower is None and x.upper is None
                    and x.step is None) or (isinstance(x, ast.Constant) and x.value is Ellipsis)
                   for x in lead):
                found.append(n.lineno)
    return found[0] if len(set(found)) == 1 else None


def _reads_slice(a, path: str, line: int) -> bool:
    """Whether the first argument of the last call on ``line`` is an expression that indexes a
    tensor itself (``y[:, t]``, ``tgt[:, t] if tgt is not None else prev``), not a plain name."""
    text = a.source.line_text(path, line)
    called = re.findall(r"([A-Za-z_][A-Za-z_0-9]*)\s*\(", text)
    if not called:
        return False
    arg = a.source.call_argument(path, line, called[-1], 0, "input")
    return bool(arg) and not arg.isidentifier() and "[" in arg


def _names(text: str) -> set[str]:
    try:
        tree = ast.parse(text.strip())
    except SyntaxError:
        return set()
    return {n.id for n in walk(tree) if isinstance(n, ast.Name)}


def _decoder_input_from_target(a, call: Location, loss: Location) -> tuple[int, str, str] | None:
    """``(line, name, statement)`` of the model's second (or later) argument, a decoder input,
    when the statement that made it reads a variable the loss line reads too (the targets): a
    teacher-forced decoder fed the targets unshifted."""
    tree = a.source.tree(call.path)
    if tree is None or call.path != loss.path:
        return None
    calls = [n for n in walk(tree) if isinstance(n, ast.Call) and getattr(n, "lineno", None) == call.line
             and len(n.args) >= 2]
    if len(calls) != 1:
        return None
    read_by_loss = _names(a.source.line_text(loss.path, loss.line))
    for arg in calls[0].args[1:]:
        if not isinstance(arg, ast.Name):
            continue
        made = a.source.value_origin(call.path, call.line, arg.id)
        if made is None or made[0] >= call.line:
            continue
        shared = (_names(made[1]) & read_by_loss) - {arg.id}
        if shared:
            return made[0], arg.id, made[1]
    return None


def _argument_origin(a, path: str, line: int, position: int) -> Location | None:
    """Where the variable given as argument ``position`` of the call on ``line`` (``self.dec(dec_in,
    h)``, ``model(src, dec_in)``) got its values, or None."""
    text = a.source.line_text(path, line)
    called = re.findall(r"([A-Za-z_][A-Za-z_0-9]*)\s*\(", text)
    if not called:
        return None
    name = a.source.call_argument(path, line, called[-1], position, "input")
    if not name or not name.isidentifier():
        return None
    built = a.source.value_origin(path, line, name)
    return Location(path, built[0], "") if built is not None else None


# an op over the last two axes, or over axis 1 of a (batch, time, features) tensor
_ACROSS = re.compile(r"shape\[-2:\]|size\(\)\[-2:\]|dim\s*=\s*(1|-2|\(1|\(-2|\[1|\[-2)\b|\.(mean|sum|std|var|amax|max|softmax|normalize)\(\s*(1|-2)\s*[,)]")


def _across_positions(a, path: str) -> tuple[int, str] | None:
    """``(line, text)`` of the first call in a ``forward`` of ``path`` that normalises or reduces
    over the time axis of batch-first activations (``F.layer_norm(x, x.shape[-2:])``,
    ``x.mean(dim=1)``, ``F.normalize(h, dim=1)``), or None."""
    calls = a.source.calls_named(path, frozenset((
        "layer_norm", "group_norm", "instance_norm", "normalize", "mean", "sum", "std", "var",
        "softmax", "amax", "max")))
    for line, text, in_forward in calls:
        if in_forward and _ACROSS.search(text):
            return line, text
    return None


# a norm layer built over more than the features: LayerNorm([T, C]) / LayerNorm(x.shape[-2:]),
# InstanceNorm1d over a (batch, channels, time) input
_NORM_SHAPE = re.compile(r"LayerNorm\(\s*(\[|\()[^\]\)]*,|LayerNorm\([^)]*shape\[-2:\]|InstanceNorm1d\(")


# a 1-d convolution over time padded on both sides: `padding=k // 2`, `padding="same"`, a number
_CONV_PADDED = re.compile(r"Conv1d\(.*padding\s*=\s*(?!0\s*[,)])[^,)]+")


_FORWARD_FFT = ("rfft", "fft", "rfftn", "fftn")
_INVERSE_FFT = ("irfft", "ifft", "irfftn", "ifftn")


def _fft_length(call: ast.Call) -> str | None:
    """The text of an FFT call's length argument (``n=`` or the second positional), or None."""
    for kw in call.keywords:
        if kw.arg in ("n", "s"):
            return ast.unparse(kw.value).replace(" ", "")
    if len(call.args) > 1:
        return ast.unparse(call.args[1]).replace(" ", "")
    return None


def _fft_wraps(a, path: str) -> tuple[int, str, str] | None:
    """``(line, text, why)`` of the transform that makes an FFT convolution of ``path``
    circular: in one function that multiplies forward transforms and inverts the product, an
    inverse whose length is none of the forward transforms' (``irfft(.., n=L)`` after
    ``rfft(.., n=2 * L)``), or forward transforms that all leave the length out (the script's
    padding before them is not read: the caller asks only once the probe measured a leak)."""
    tree = a.source.tree(path)
    if tree is None:
        return None
    for fn in walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        forward, inverse = [], []
        for n in walk(fn):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                if n.func.attr in _FORWARD_FFT:
                    forward.append(n)
                elif n.func.attr in _INVERSE_FFT:
                    inverse.append(n)
        if len(forward) < 2 or not inverse:
            continue  # a convolution transforms two signals (or a kernel made in the frequency domain)
        lengths = {_fft_length(c) for c in forward}
        for inv in inverse:
            n = _fft_length(inv)
            if n is not None and None not in lengths and n not in lengths:
                return inv.lineno, ast.unparse(inv), f"inverts with length {n}, not the forward transforms' {sorted(lengths)[0]}"
        if lengths == {None}:
            # no length given: each signal is transformed at its own length, and the product's
            # inverse is a circular convolution (a leak only when the probe measured one)
            first = min(forward, key=lambda c: c.lineno)
            return first.lineno, ast.unparse(first), "transforms at the sequence's own length (no n=)"
    return None


def _conv_padded_both_sides(a, path: str) -> tuple[int, str] | None:
    """``(line, text)`` of the first ``nn.Conv1d`` built outside a ``forward`` of ``path`` with a
    padding (both ends), when no ``forward`` pads the left end itself (``F.pad(h, (k - 1, 0))``)."""
    built = [(line, text) for line, text, in_forward in a.source.calls_named(
        path, frozenset(("Conv1d",))) if not in_forward and _CONV_PADDED.search(text)]
    if not built:
        return None
    if any(in_forward for _, _, in_forward in a.source.calls_named(path, frozenset(("pad",)))):
        return None
    return built[0]


def _norm_over_positions(a, path: str) -> tuple[int, str] | None:
    """``(line, text)`` of the one norm layer built outside a ``forward`` of ``path`` whose
    normalised shape takes in the time axis."""
    built = [(line, text) for line, text, in_forward in a.source.calls_named(
        path, frozenset(("LayerNorm", "InstanceNorm1d"))) if not in_forward and _NORM_SHAPE.search(text)]
    return built[0] if len(built) == 1 else None


def _mask_set_to_none(a, path: str, line: int, keyword: str) -> tuple[Location, str] | None:
    """Where the script binds to None the name an attention module's call at ``line`` passes as
    its causal mask (``tgt_mask=tgt_mask`` with ``tgt_mask = None`` in the training loop), when
    the file binds that name to None once and to nothing else outside the call's parameters."""
    tree = a.source.tree(path)
    if tree is None:
        return None
    names = {kw.value.id for node in walk(tree) if isinstance(node, ast.Call)
             and node.lineno <= line <= (node.end_lineno or node.lineno)
             for kw in node.keywords if kw.arg == keyword and isinstance(kw.value, ast.Name)}
    if len(names) != 1:
        return None
    name, = names
    bound = [node for node in walk(tree) if isinstance(node, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)]
    if len(bound) != 1 or not (isinstance(bound[0].value, ast.Constant) and bound[0].value.value is None):
        return None
    return Location(path, bound[0].lineno), name


def _leak_site(a, e, T: int) -> tuple[Location | None, str, str]:
    """Where the later positions get in, why, and the fix: a bidirectional RNN, one of torch's
    attention modules called without (or with a wrong) mask, else the attention written in the
    script's own forward (found by name)."""
    modules = e.get("modules") or []
    for cls, path, line, function, flag in modules:
        if cls in _RECURRENT and flag == "bidirectional":
            built = [c for c in a.source.calls_named(str(path), frozenset((cls,)))
                     if "bidirectional" in c[1].replace(" ", "")]
            where = Location(str(path), built[0][0]) if built else \
                Location(str(path), int(line), str(function))
            return (where,
                    f"the {cls} is bidirectional: its backward direction reads the sequence from "
                    f"the end, so every position's state holds the tokens after it",
                    f"build the {cls} with bidirectional=False for a language model (a "
                    f"bidirectional encoder is for tagging or classification, not next-token "
                    f"prediction)")
    for cls, path, line, function, flag in modules:
        if cls in _MASKS and flag != "causal":  # a causal mask hides the later positions
            loc = Location(str(path), int(line), str(function))
            mask = _MASKS[cls].format(T="T") + f"` (T: the sequence's length, {T} here)"
            if flag == "masked":
                return (loc, f"this {cls} is given a mask, but it lets position t see the "
                             f"positions after it (inverted or transposed: `torch.triu` where "
                             f"`tril` was meant, or `masked_fill(mask == 1, ...)` flipped)",
                        f"give it a causal mask (-inf above the diagonal): `{mask}")
            unset = _mask_set_to_none(a, str(path), int(line), _MASKS[cls].split("=", 1)[0])
            if unset is not None:
                where, name = unset
                return (where, f"the `{name}` this {cls} is called with is None here, so its "
                               f"attention reads every position",
                        f"build the causal mask instead: `{name} = "
                        f"{_MASKS[cls].split('=', 1)[1].split(',')[0].format(T='T')}` "
                        f"(T: the sequence's length, {T} here)")
            return (loc, f"this {cls} is called without a causal mask, so its attention reads "
                         f"every position", f"pass a causal mask: `{mask}")
    forward = e.get("forward")
    path = forward[0] if forward else (e.loc.path if e.loc is not None else None)
    if path:
        calls = [c for c in a.source.calls_named(path, frozenset(
            ("scaled_dot_product_attention", "masked_fill", "masked_fill_", "softmax"))) if c[2]]
        sdpa = [c for c in calls if "scaled_dot_product_attention" in c[1]]
        if sdpa:
            line, text, _ = sdpa[0]
            if "is_causal=True" in text.replace(" ", "") or "attn_mask" in text:
                why = f"`{text}` is given a mask that lets position t see the positions after it"
                fix = ("give it a causal mask: `is_causal=True` without `attn_mask`, or a boolean "
                       "`attn_mask=torch.ones(T, T, dtype=torch.bool).tril()` (True: may attend)")
            else:
                why = f"`{text}` attends to every position (no `is_causal=True`, no mask)"
                fix = f"pass `is_causal=True`: `{text[:-1]}, is_causal=True)`"
            return Location(path, line, "forward"), why, fix
        filled = [c for c in calls if "masked_fill" in c[1]]
        if filled:
            # the causal mask built one diagonal too high (`torch.tril(ones, diagonal=1)`): its
            # construction is the line to change, not the masked_fill that applies it
            shifted = [c for c in a.source.calls_named(path, frozenset(("tril", "tril_")))
                       if re.search(r"diagonal\s*=\s*[1-9]|,\s*[1-9]\s*\)\s*$", c[1])]
            if len(shifted) == 1:
                line, text, _ = shifted[0]
                return (Location(path, line),
                        f"the causal mask `{text}` keeps the entries above the diagonal as well, "
                        f"so position t also attends to the positions after it",
                        "build the causal mask with the diagonal itself as its last kept entry: "
                        "`torch.tril(torch.ones(T, T))` (diagonal=0)")
            line, text, _ = filled[0]
            return (Location(path, line, "forward"),
                    f"the mask of `{text}` lets position t see the positions after it (inverted "
                    f"or transposed: `torch.triu` where `tril` was meant, or the comparison "
                    f"flipped)",
                    "mask the positions after t: `att.masked_fill(torch.ones(T, T, dtype=torch.bool)"
                    ".triu(1), float('-inf'))` (True above the diagonal: hidden)")
        soft = [c for c in calls if c[1].startswith(("torch.softmax", "F.softmax")) or ".softmax(" in c[1]]
        if soft:
            line, text, _ = soft[0]
            return (Location(path, line, "forward"),
                    f"the attention scores that `{text}` normalises are not masked: every "
                    f"position attends to the positions after it",
                    "mask the scores before the softmax: `scores.masked_fill(torch.ones(T, T, "
                    "dtype=torch.bool).triu(1), float('-inf'))`")
        wraps = _fft_wraps(a, path)
        if wraps is not None:
            line, text, why = wraps
            return (Location(path, line),
                    f"`{text}` {why}: an FFT convolution over L positions is circular unless both "
                    f"transforms are padded to at least 2L, so the last inputs wrap around onto "
                    f"the first outputs",
                    "zero-pad both transforms to twice the length and keep the first L outputs: "
                    "`torch.fft.irfft(torch.fft.rfft(u, n=2 * L) * torch.fft.rfft(k, n=2 * L), "
                    "n=2 * L)[..., :L]`")
        across = _across_positions(a, path)
        if across is not None:
            line, text = across
            return (Location(path, line, "forward"),
                    f"`{text}` mixes the positions of the sequence: it normalises or reduces "
                    f"over the time axis too, so every position's value holds statistics of "
                    f"the positions after it (the attention masks, where there are any, are "
                    f"causal)",
                    "normalise each position on its own (over the features only: "
                    "`F.layer_norm(x, (C,))`, `nn.LayerNorm(C)`), or reduce over the positions "
                    "up to t only (a cumulative mean)")
        conv = _conv_padded_both_sides(a, path)
        crop = _crop_keeping_end(a, path) if conv is not None else None
        if crop is not None:
            # a conv padded by k - 1 on both ends is causal once its last k - 1 outputs are
            # dropped (Mamba's, H3's depthwise conv): the crop keeping the end is what leaks
            return (Location(path, crop),
                    f"`{a.source.line_text(path, crop).strip()}` keeps the last positions of a "
                    f"convolution padded at both ends (`{conv[1].strip()}`): each kept output's "
                    f"window covers the positions after it",
                    "keep the first L outputs of the padded convolution (`x[..., :L]`, or "
                    "`x[..., :-pad]`), whose windows end at their own position")
        if conv is not None:
            line, text = conv
            return (Location(path, line),
                    f"`{text}` pads both ends of the sequence: each output position's window "
                    f"covers the positions after it as well as before",
                    "make the convolution causal: no padding in the layer, and pad the left end "
                    "only before it: `F.pad(h, (kernel_size - 1, 0))` (times the dilation)")
        built = _norm_over_positions(a, path)
        if built is not None:
            line, text = built
            return (Location(path, line),
                    f"`{text}` normalises over the positions as well as the features: every "
                    f"position's value is scaled by statistics of the positions after it (the "
                    f"attention masks, where there are any, are causal)",
                    "normalise each position on its own, over the features only: "
                    "`nn.LayerNorm(C)` (C: the feature size)")
    return (None, "the model reads the positions after t (no causal mask on its way)",
            "make the model causal: a causal attention mask (`is_causal=True`, "
            "`nn.Transformer.generate_square_subsequent_mask(T)`) or a unidirectional RNN")


_LOSS_NAMES = ("loss", "cross_entropy", "nll", "criterion")


def _decoder_fed_target(tree, backward_line: int) -> int | None:
    """The line of the call, in the dozen lines before the backward, that is given a slice of
    the tensor whose slice is the loss's target (``dec(tgt[:, 1:], h)`` beside
    ``cross_entropy(logits, tgt[:, 1:])``); None when there is not exactly one."""
    if tree is None:
        return None

    def callee(call):
        f = call.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""

    def sliced(call):
        return {n.value.id for arg in [*call.args, *(k.value for k in call.keywords)]
                for n in walk(arg) if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)}

    calls = [n for n in walk(tree) if isinstance(n, ast.Call)
             and backward_line - 12 <= n.lineno < backward_line]
    losses = [c for c in calls if any(w in callee(c).lower() for w in _LOSS_NAMES)]
    targets = set().union(*(sliced(c) for c in losses)) if losses else set()
    inner = {id(n) for c in losses for n in walk(c)}
    fed = {c.lineno for c in calls if id(c) not in inner and sliced(c) & targets
           and not any(w in callee(c).lower() for w in _LOSS_NAMES)}
    return fed.pop() if len(fed) == 1 else None


def _step_indexed_call(tree) -> int | None:
    """The line of the one call in a ``for t in ...`` loop of the script given ``x[t]`` (or
    ``x[:, t]``) indexed by the loop's variable, or of the one assignment ``inp = x[t]`` whose
    name a call of the loop is given: where a decoder unrolled by hand reads its step's token;
    None when there is not exactly one such line."""
    if tree is None:
        return None
    lines = set()
    for loop in walk(tree):
        if not (isinstance(loop, ast.For) and isinstance(loop.target, ast.Name)):
            continue
        var = loop.target.id
        passed = {a.id for stmt in loop.body for call in walk(stmt) if isinstance(call, ast.Call)
                  for a in call.args if isinstance(a, ast.Name)}
        for stmt in loop.body:
            # `inp = trg[t]` handed on to the decoder's call: the assignment feeds the step
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                    and isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id in passed \
                    and isinstance(stmt.value, ast.Subscript):
                index = stmt.value.slice.elts if isinstance(stmt.value.slice, ast.Tuple) else [stmt.value.slice]
                if any(isinstance(i, ast.Name) and i.id == var for i in index):
                    lines.add(stmt.lineno)
            for call in walk(stmt):
                if not isinstance(call, ast.Call):
                    continue
                for arg in call.args:
                    if isinstance(arg, ast.Subscript):
                        index = arg.slice.elts if isinstance(arg.slice, ast.Tuple) else [arg.slice]
                        if any(isinstance(i, ast.Name) and i.id == var for i in index):
                            lines.add(call.lineno)
    return lines.pop() if len(lines) == 1 else None
