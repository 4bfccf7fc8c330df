from __future__ import annotations

from ..findings import Severity
from .attention_mask_inverted import _mask_origin
from .base import Rule


class CausalMaskReversed(Rule):
    """
    ## What it does
    Finds a causal self-attention mask built as its own transpose: the keys it leaves out are
    exactly the positions before each query, so every position attends to itself and to the
    positions after it. Checked at the first masked calls of `nn.MultiheadAttention` (and the
    `nn.Transformer*` layers built on it) and `F.scaled_dot_product_attention` (CPU): a square
    `attn_mask`, the same for every sample and head, read in the API's convention (True = leave
    out for `nn.MultiheadAttention`, True = attend for SDPA, -inf left out in a float mask). It
    points at the statement that builds the mask given by name, else at the attention call.
    This is the case `target-visible-to-model` cannot read against the loss's targets: next
    items scored through the item table (SASRec's positive and sampled negative logits under a
    binary cross-entropy, an in-batch softmax), where no loss is given the next ids; when that
    rule finds the leak itself, this one says nothing more.

    ## Why is this bad?
    A next-item (or next-token) model reads, at position t, the output that must predict the
    input at t + 1. With the triangle flipped (`torch.tril` where `torch.triu(..., diagonal=1)`
    was meant for `nn.MultiheadAttention`, or the other API's triangle), that output has seen
    the input at t + 1: the target is in the model's input. The training loss falls fast and
    looks excellent, and the model is useless at inference, where the future is not there.

    ## Example
    ```python
    causal = torch.tril(torch.ones(L, L, dtype=torch.bool), diagonal=-1)   # True = leave out
    h, _ = self.attn(q, x, x, attn_mask=causal)
    ```

    ## Use instead
    ```python
    causal = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)    # leaves out the future
    h, _ = self.attn(q, x, x, attn_mask=causal)
    ```

    ## Stays silent on
    Causal masks in either convention (booleans, additive -inf masks, `is_causal=True`,
    `nn.Transformer.generate_square_subsequent_mask`); bidirectional attention without a
    mask; padding masks; a reversed mask in a run that also runs a causal one before its
    backward (a forward and a backward language model side by side); a right-to-left model,
    for which the reversed mask is the causal one: its loss's targets are the previous items
    (`targets[:, t] == ids[:, t - 1]`), or the ids it looks up after the attention call (the
    positives scored through the item table) are; masks that differ between samples; masks on
    a GPU.
    """

    code = "GD340"
    slug = "causal-mask-reversed"
    severity = Severity.WARNING
    summary = ("a causal attention mask is transposed: each position attends to itself and the "
               "positions after it, so a next-item target is in the model's input")
    fix = ("leave out the keys after each query: torch.triu(torch.ones(L, L, dtype=torch.bool), "
           "diagonal=1) for nn.MultiheadAttention (True = leave out), "
           "torch.ones(L, L, dtype=torch.bool).tril() for F.scaled_dot_product_attention "
           "(True = attend), or is_causal=True")

    def check(self, a):
        shifts = [(e.get("seq") or {}) for e in a.by_kind.get("dependency", ())]
        if any(seq.get("k") == 1 and seq.get("future") for seq in shifts):
            return  # target-visible-to-model read the leak against the loss's own targets
        if any(seq.get("k") == -1 for seq in shifts):
            return  # the loss's targets are the previous items: a right-to-left model, whose
            # causal mask is this one
        for e in a.of_kind("attention_mask"):
            if e["problem"] != "reversed":
                continue
            api = e["api"]
            if api == "F.scaled_dot_product_attention":
                fix = ("keep each query's past and itself: `torch.ones(L, L, dtype=torch.bool)"
                       ".tril()` (True = attend), or pass `is_causal=True` without a mask")
            else:
                fix = ("leave out each query's future: `torch.triu(torch.ones(L, L, dtype="
                       "torch.bool), diagonal=1)` (True = leave out), or a float mask with -inf "
                       "above the diagonal")
            yield self.finding(
                f"{api}'s attn_mask over {e['keys']} positions leaves out exactly the positions "
                f"before each query: every position attends to itself and the ones after it, so "
                f"the output at t has read the input at t + 1 that a next-item target asks for, "
                f"and the model learns to copy it (a low training loss, a useless model)",
                _mask_origin(a, e.loc, "causal"), fix=fix, step=a.next_step_number(e.seq),
                evidence={"api": api, "keys": e["keys"]})
