from __future__ import annotations

import ast

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

# the token axis a pooled tensor's mean is taken over, as the script writes it
_TOKEN_AXES = {"batch-first": (1, -2), "length-first": (0,)}


def _constant_dim(call: ast.Call) -> int | None:
    """The dim of ``x.mean(1)``, ``x.mean(dim=1)``, ``torch.mean(x, 1)``, ``x.mean(axis=1)``;
    None when it is not one integer constant."""
    is_method = isinstance(call.func, ast.Attribute) and not (
        isinstance(call.func.value, ast.Name) and call.func.value.id == "torch")
    positional = call.args[0:1] if is_method else call.args[1:2]
    for node in positional + [k.value for k in call.keywords if k.arg in ("dim", "axis")]:
        value = node
        sign = 1
        if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub):
            value, sign = value.operand, -1
        if isinstance(value, ast.Constant) and isinstance(value.value, int) \
                and not isinstance(value.value, bool):
            return sign * value.value
        return None
    return None


def token_means(tree: ast.AST, axis: str) -> list[tuple[int, str]]:
    """``(line, pooled expression's text)`` of each mean over the token axis in the source:
    ``h.mean(1)``, ``h.mean(dim=1)``, ``torch.mean(h, 1)`` (dim 0 for a length-first layout)."""
    axes = _TOKEN_AXES[axis]
    out = []
    for node in walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "mean"):
            continue
        if isinstance(node.func.value, ast.Name) and node.func.value.id == "torch":
            if not node.args:
                continue
            pooled = node.args[0]
        else:
            pooled = node.func.value
        if _constant_dim(node) in axes:
            out.append((node.lineno, ast.unparse(pooled)))
    return sorted(out)


class MeanPoolsPadding(Rule):
    """
    ## What it does
    Finds a mean over the token axis that averages a padded batch's padding in with its
    tokens: `h.mean(1)` of an encoder's, a recurrent layer's or a Hugging Face model's output
    (`last_hidden_state.mean(dim=1)`) over a token batch whose shorter rows are padded, with no
    mask of the padding applied. Seen in the autograd graph of the first 3 backwards: a mean
    over one axis as long as a token batch embedded just before (padding in two rows or more),
    its rows on another axis, a layer reading the pooled vector on the way to the loss, and
    that batch's own embedding lookup below the mean with no 0/1 mask of the batch's shape
    multiplied, filled or selected in between. Reported at the mean when the script's source
    shows one over that axis, else at the backward.

    ## Why is this bad?
    The padded positions hold vectors too: after attention, a recurrent layer or a positional
    embedding they are not zero, and even a padding mask given to the attention only keeps the
    real tokens from *reading* them. Averaged in, a sentence's vector depends on how much
    padding its batch gave it: a short sentence in a batch of long ones is mostly padding, and
    the same sentence pools differently alone or at inference. The model trains on that noise
    without any error.

    ## Example
    ```python
    h = self.encoder(self.embed(ids), src_key_padding_mask=(ids == PAD))
    pooled = h.mean(1)
    ```

    ## Use instead
    ```python
    keep = (ids != PAD).unsqueeze(-1).to(h.dtype)
    pooled = (h * keep).sum(1) / keep.sum(1).clamp(min=1)
    ```
    Or pool one position that is always a token (a `[CLS]` token, the last real step of each
    row), or `nn.EmbeddingBag(mode="mean")` with offsets for a bag of embeddings.

    ## Stays silent on
    Means over sequences without padding (or padded in fewer than two rows); masked means
    (`(h * keep).sum(1) / keep.sum(1)`, `masked_fill` of the padding then a sum, `h[mask]`);
    a mean of embedding lookups whose `padding_idx` row is the pad id, through nothing but
    views, dropout and products (the padding adds zeros: a scale by the length, left alone);
    a mean that no layer reads (a loss's reduction, which `loss-counts-padding` covers); means
    over the feature axis; a channels-first layout (`(batch, channels, length)`, a text CNN's),
    not read; token batches on a GPU.
    """

    code = "GD408"
    slug = "mean-pools-padding"
    severity = Severity.WARNING
    summary = ("a mean over the token axis averages a padded batch's padding positions in "
               "with its tokens")
    fix = ("average the real tokens only: keep = (ids != PAD).unsqueeze(-1).to(h.dtype); "
           "pooled = (h * keep).sum(1) / keep.sum(1).clamp(min=1)")

    def check(self, a):
        told = set()
        for e in a.of_kind("padding_pooled"):
            loc, related, pooled = e.loc, (), None
            if e.loc is not None:
                tree = a.source.tree(e.loc.path)
                means = token_means(tree, e["axis"]) if tree is not None else []
                if len(means) == 1:
                    line, pooled = means[0]
                    loc = Location(e.loc.path, line)
                    related = (Related(e.loc, "the backward whose graph holds the mean"),)
            if (loc, e["axis"]) in told:
                continue  # batches of another length through the same mean
            told.add((loc, e["axis"]))
            rows, length = e["shape"]
            what = f"`{pooled}`" if pooled else "a tensor"
            axis = 1 if e["axis"] == "batch-first" else 0
            fix = self.fix
            if pooled:
                h = pooled if pooled.isidentifier() else "h"
                prefix = "" if h == pooled else f"h = {pooled}; "
                fix = (f"average the real tokens only: {prefix}keep = (ids != {e['fill']})"
                       f".unsqueeze(-1).to({h}.dtype); pooled = ({h} * keep).sum({axis}) / "
                       f"keep.sum({axis}).clamp(min=1) (ids: the token batch; or the batch's "
                       "attention_mask as keep)")
                if e["axis"] == "length-first":
                    fix = fix.replace("(ids != ", "(ids.t() != ")
            yield self.finding(
                f"The mean over the token axis of {what} averages in the padding of the "
                f"{rows}×{length} token batch (pad id {e['fill']}, {e['padded']:.0%} of its "
                "positions): no mask of the padding is applied below it, so each sequence's "
                "pooled vector mixes in its padding's features and changes with how much "
                "padding its batch gave it",
                loc, related=related, step=a.next_step_number(e.seq), fix=fix,
                evidence={"fill": e["fill"], "shape": list(e["shape"]),
                          "padded": e["padded"], "axis": e["axis"]})
