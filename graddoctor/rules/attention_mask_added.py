from __future__ import annotations

from ..findings import Severity
from .base import Rule


class AttentionMaskAdded(Rule):
    """
    ## What it does
    Finds a float attention mask of only 0 and 1 (or 0 and -1) given to
    `nn.MultiheadAttention` (its `key_padding_mask` or `attn_mask`, also through the
    `nn.Transformer*` layers) or `F.scaled_dot_product_attention`: a boolean mask converted
    with `.float()`. Checked at the first masked calls (CPU). It points at the attention call.

    ## Why is this bad?
    A float mask is **added** to the attention scores; only a boolean mask (or one of 0 and
    -inf) leaves keys out. A 0/1 mask adds 1 to some scores: every key stays in, the padding
    (or the future, for a causal mask) is attended to as much as the real tokens, and the model
    trains on it without an error.

    ## Example
    ```python
    pad = (ids == PAD).float()
    h, _ = self.attn(x, x, x, key_padding_mask=pad)      # adds 1 to the padding's scores
    ```

    ## Use instead
    ```python
    h, _ = self.attn(x, x, x, key_padding_mask=(ids == PAD))   # a boolean mask
    # or an additive one: torch.zeros(n, t).masked_fill(ids == PAD, float("-inf"))
    ```

    ## Stays silent on
    Boolean masks; additive masks of 0 and -inf (or -1e9, the dtype's minimum); float biases
    with more than two values (ALiBi, relative position biases); masks on a GPU.
    """

    code = "GD254"
    slug = "attention-mask-added"
    severity = Severity.WARNING
    summary = ("a 0/1 float attention mask, which attention adds to its scores: it leaves no key "
               "out")
    fix = ("pass the mask as a boolean tensor (mask.bool(), in the API's convention), or as an "
           "additive mask of 0 and -inf: torch.zeros_like(m).masked_fill(m.bool(), float('-inf'))")

    def check(self, a):
        for e in a.of_kind("attention_mask"):
            if e["problem"] != "additive01":
                continue
            values = " and ".join(str(v) for v in e["values"])
            yield self.finding(
                f"{e['api']} gets a float {e['argument']} of only {values}: a float mask is "
                f"added to the attention scores, so it shifts some scores by {e['values'][1]} "
                f"and leaves every key in; the positions it was meant to hide are attended to",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"api": e["api"], "argument": e["argument"], "values": e["values"]})
