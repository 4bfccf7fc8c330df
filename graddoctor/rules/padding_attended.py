from __future__ import annotations

from ..findings import Severity
from .base import Rule


class PaddingAttended(Rule):
    """
    ## What it does
    Finds attention run with no mask at all over a padded token batch: an
    `nn.MultiheadAttention` (and the `nn.Transformer*` layers built on it) with neither
    `key_padding_mask` nor `attn_mask`, or an `F.scaled_dot_product_attention` (a Hugging Face
    model's included) with no `attn_mask` and `is_causal=False`, whose keys have the shape of a
    token batch embedded just before with its shorter rows filled by the embedding's
    `padding_idx` or by one filler id, in two rows or more. Checked at the first calls (CPU).

    ## Why is this bad?
    Every query attends to the padding positions too: each token's representation mixes in the
    padding's, a short sequence in a long batch is mostly padding to its attention, and the
    same sentence gets another representation when the batch around it is padded differently.
    The model trains on that noise without any error; what it learns does not hold for a batch
    padded otherwise (or for one sentence alone at inference).

    ## Example
    ```python
    ids = pad_sequence(batch, batch_first=True, padding_value=PAD)
    h = self.encoder(self.embed(ids))                   # nn.TransformerEncoder, no mask
    out = bert(input_ids=ids, labels=y)                 # transformers: no attention_mask
    ```

    ## Use instead
    ```python
    h = self.encoder(self.embed(ids), src_key_padding_mask=(ids == PAD))   # True = padding
    out = bert(input_ids=ids, attention_mask=(ids != PAD).long(), labels=y)
    ```

    ## Stays silent on
    Causal attention (`is_causal=True`, or any `attn_mask` such as a causal one): right padding
    comes after the tokens and changes nothing they see. Any padding mask given (its convention
    is `attention-mask-inverted`'s business); batches padded in fewer than two rows; token
    batches without a padding id (neither `padding_idx` nor one id filling the shorter rows);
    token batches of another shape than the attention's keys; masks and batches on a GPU.
    Attention written by hand (`softmax(q @ k.T)`) is not watched.
    """

    code = "GD265"
    slug = "padding-attended"
    severity = Severity.WARNING
    summary = ("attention runs with no mask over a padded token batch: every query attends to "
               "the padding too")
    fix = ("pass a padding mask: key_padding_mask=(ids == pad) to nn.MultiheadAttention "
           "(src_key_padding_mask= to nn.TransformerEncoder), attn_mask=(ids != pad) to "
           "F.scaled_dot_product_attention, attention_mask= to a transformers model")

    def check(self, a):
        for e in a.of_kind("attention_mask"):
            if e["problem"] != "missing":
                continue
            api, fill = e["api"], e["fill"]
            line = a.source.line_text(e.loc.path, e.loc.line) if e.loc is not None else ""
            hf = "input_ids" in line  # a transformers model called by the script
            who = f"the model's attention ({api})" if hf else api
            if hf:
                fix = (f"pass the batch's attention_mask to the model (1 on the tokens, 0 on the "
                       f"padding): attention_mask=(input_ids != {fill}).long()")
            elif api == "nn.MultiheadAttention":
                fix = (f"pass key_padding_mask=(ids == {fill}) (True on the padding); through "
                       "nn.TransformerEncoder it is src_key_padding_mask=, through "
                       "nn.Transformer also memory_key_padding_mask= for the cross-attention")
            else:
                fix = (f"pass attn_mask=(ids != {fill})[:, None, None, :] (True = attend) to "
                       "F.scaled_dot_product_attention")
            yield self.finding(
                f"{who} runs with no mask (and not causal) over keys from a token batch whose "
                f"shorter rows are padded with id {fill} ({e['padded']:.0%} of the positions, "
                f"in {e['padded_rows']} of {e['rows']} rows): every query attends to the "
                "padding too, so each token's representation mixes in padding, differently from "
                "one batch to the next",
                e.loc, fix=fix, step=a.next_step_number(e.seq),
                evidence={"api": api, "argument": e["argument"], "fill": fill,
                          "rows": e["rows"], "padded_rows": e["padded_rows"],
                          "padded": e["padded"]})
