from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..location import Location
from .base import Rule
from ..analysis.source import walk


_MASK_GIVEN = re.compile(r"\b\w*mask\s*=\s*([A-Za-z_]\w*)\s*[,)]")


def _mask_origin(a, loc, convention=None):
    """Where the mask given on ``loc``'s line as ``...mask=name`` is built (``pad_mask = ids !=
    PAD``): the comparison to flip; the call itself when it is written inline or not found."""
    if loc is None:
        return loc
    given = _MASK_GIVEN.findall(a.source.line_text(loc.path, loc.line))
    if len(given) != 1:
        return _passed_mask_origin(a, loc, convention) or loc
    made = a.source.value_origin(loc.path, loc.line, given[0])
    return Location(loc.path, made[0]) if made else loc


# a padding mask's comparison, by the side it marks True
_MARKS_TOKENS = re.compile(r"!=|\.ne\(|\bne\(")
_MARKS_PADDING = re.compile(r"==|\.eq\(|\beq\(")


def _passed_mask_origin(a, loc, convention):
    """Where the one mask of the call spanning ``loc`` that compares ids the inverted way is
    built, for a call given several masks on its line (``src_key_padding_mask=src_pad,
    tgt_key_padding_mask=tgt_pad``), each followed to its assignment, or, for a mask the call
    gets as its function's parameter, to the one assignment of that name in the file
    (``tgt_pad = tgt_in != PAD`` in the training loop); None when not exactly one."""
    tree = a.source.tree(loc.path)
    if tree is None:
        return None
    names = {kw.value.id for node in walk(tree) if isinstance(node, ast.Call)
             and node.lineno <= loc.line <= (node.end_lineno or node.lineno)
             for kw in node.keywords if kw.arg and "mask" in kw.arg and isinstance(kw.value, ast.Name)}
    wrong = _MARKS_TOKENS if convention != "True attends" else _MARKS_PADDING
    found = set()
    for name in names:
        made = a.source.value_origin(loc.path, loc.line, name)
        if made is None:
            bound = [n for n in walk(tree) if isinstance(n, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
            if len(bound) != 1:
                continue
            made = (bound[0].lineno, ast.unparse(bound[0]))
        if wrong.search(made[1]):
            found.add(made[0])
    return Location(loc.path, found.pop()) if len(found) == 1 else None


class AttentionMaskInverted(Rule):
    """
    ## What it does
    Finds an attention padding mask written for the other convention: the keys it leaves out
    are exactly the real tokens of the batch, and the ones it lets through are the padding.
    Checked at the first masked calls of `nn.MultiheadAttention` (and the `nn.Transformer*`
    layers built on it) and `F.scaled_dot_product_attention` (CPU): the mask's keys per sample
    against the token batch embedded just before, whose shorter rows are filled with the
    embedding's `padding_idx` or with one filler id. It points at the statement that builds
    the mask given by name (`pad_mask = ids != PAD`: the comparison to flip; for a call given
    several masks on its line, followed to their assignments, or to the training loop's for
    masks the call gets as its function's parameters: the one whose comparison marks the wrong
    side), else at the attention call.

    ## Why is this bad?
    The two APIs read a boolean mask the opposite way: `key_padding_mask` (and
    `nn.MultiheadAttention`'s `attn_mask`) leave out the positions that are **True**, while
    `F.scaled_dot_product_attention`'s boolean `attn_mask` (and a Hugging Face `attention_mask`)
    keeps them. With the mask inverted each query attends only to padding: the attention output
    carries no information about the sequence (a row without padding gets NaN), and the model
    learns from its residual path alone. Nothing fails while it trains.

    ## Example
    ```python
    mask = ids != PAD                                   # True on the real tokens
    h, _ = self.attn(x, x, x, key_padding_mask=mask)    # True = leave out
    ```

    ## Use instead
    ```python
    h, _ = self.attn(x, x, x, key_padding_mask=(ids == PAD))          # True = padding
    h = F.scaled_dot_product_attention(q, k, v, attn_mask=(ids != PAD)[:, None, None, :])  # True = attend
    ```

    ## Stays silent on
    Correct masks in either convention, as booleans or as additive float masks (-inf / -1e9);
    causal masks and masks that are the same for every sample; batches whose padding shows in
    fewer than two rows; token batches without a padding id (neither `padding_idx` nor one id
    filling the shorter rows); masks on a GPU.
    """

    code = "GD253"
    slug = "attention-mask-inverted"
    severity = Severity.WARNING
    summary = ("an attention padding mask in the other convention: it leaves out the real tokens "
               "and lets each query attend only to the padding")
    fix = ("invert the mask for this API: key_padding_mask and nn.MultiheadAttention's attn_mask "
           "want True on the padding (ids == pad); F.scaled_dot_product_attention's boolean "
           "attn_mask wants True on the tokens to attend (ids != pad)")

    def check(self, a):
        for e in a.of_kind("attention_mask"):
            if e["problem"] != "inverted":
                continue
            api, argument = e["api"], e["argument"]
            if e["convention"] == "True attends":
                reading = (f"{api}'s boolean {argument} keeps the positions that are True, but "
                           f"the mask is True on the padding (id {e['fill']})")
            else:
                reading = (f"{api}'s {argument} leaves out the positions that are True (or "
                           f"-inf), but the mask marks the real tokens, not the padding "
                           f"(id {e['fill']})")
            yield self.finding(
                f"{reading}: {e['removed']:.0%} of the keys are left out, exactly the ones that "
                f"are not padding, in a batch of {e['rows']} rows, so each query attends only "
                f"to padding and the attention output carries nothing of the sequence",
                _mask_origin(a, e.loc, e["convention"]), step=a.next_step_number(e.seq),
                evidence={"api": api, "argument": argument, "convention": e["convention"],
                          "fill": e["fill"], "rows": e["rows"], "removed": e["removed"]})
