"""Attention weights normalised over another axis than the one the next matmul sums over.

``weights = torch.softmax(scores, dim=1)`` on scores of shape (batch, queries, keys), then
``weights @ values``: the matmul sums each row of ``weights`` over the keys (its last dimension),
but the softmax made the columns sum to 1 (over the queries). Each output is a mix of the values
with weights that do not sum to 1 and that depend on the other queries' scores; the model still
trains and the loss still falls, to a worse model. The same with a 2-D (N, K) softmax over dim 0
(normalised across the batch) multiplied by a (K, D) matrix.

How it is seen: at the first ``_WINDOWS`` backwards, the loss's graph is walked once. At each
matrix product (``BmmBackward0``, ``MmBackward0``) each operand's path is followed down through
the operations that keep its values in place (views and reshapes, expand, transposes and
permutes, (un)squeeze, dropout's mask product, masked_fill, clone) to a ``SoftmaxBackward0``
whose saved result has the shape reached, and the dimension the product sums over (the left
operand's last, the right one's second to last) is mapped exactly through each of them to a
dimension of the softmax's result. This is the graph ``torch.einsum`` lowers to as much as the
one of ``@``, ``torch.matmul`` and ``torch.bmm``: einsum permutes and reshapes its operands to a
batched product, and the mapping follows the labels through those permutes without reading the
equation. A reshape that splits or merges the summed dimension, or an expand that broadcasts it,
ends the walk.

The walk also stops at a division by a norm of the tensor divided, taken over one of its
dimensions (``F.normalize(z, dim)``, ``z / z.norm(dim=d, keepdim=True)``, ``z /
(z.pow(2).sum(d, keepdim=True).sqrt() + eps)``), and follows a product with a learned
temperature (one number with a gradient): embeddings normalised over the batch before a
similarity product over their features are the same bug (event ``op`` "normalize").
Parameters normalised are not followed (no batch), nor standardisations — except in a cosine
product (``cosine_misnormalised``): when both operands of a product (``F.linear``'s addmm
included) are divided by their own L2 norm, each must be normalised over the dimension the
product sums, whichever that is; a weight normalised over another (ArcFace's ``F.normalize(W,
dim=0)`` of a (classes, features) weight) is reported too (event ``cosine``, ``param``).

What is reported: the softmax normalised another dimension than its last, and the product sums
over its last: weights laid out (queries, keys), normalised over the queries, summed over the
keys. The reverse, a softmax over the last dimension summed over another one, is an assignment
turned on purpose and stays silent: DiffPool's ``s.transpose(1, 2) @ x`` sums the nodes with
each node's assignment normalised over the clusters, a mixture-of-experts dispatch
``einsum('ne,nd->ed', gates, x)`` sums the tokens. Nor a softmax whose scores were normalised
over the summed dimension a few operations before (a Sinkhorn iteration: the plan's rows sum to
about 1 as well). Anything else on the way (a division that renormalises, as slot attention
does; a gate of another shape; a sum) ends the walk without a word. No per-call cost: only the
graph of the first backwards is read, then the watcher closes.

The same walk judges how the attention scores are scaled (``attention_scale``): from each
softmax over the last axis, its input is followed down (through masked fills, casts, views,
transposes and the additions of biases: an ALiBi or relative-position table, an additive mask)
to the matrix products that made the scores, and each product's operands a few operations
further (to the projections that made Q and K), multiplying the constant scalar factors met on
the way (``MulBackward``/``DivBackward`` by a number or a 0-dim tensor that needs no gradient).
With ``d`` the size the product contracts (from the operands' metadata), the product of the
factors should be ``1/sqrt(d)``; it is reported when it is ``sqrt(d)`` (multiplied instead of
divided) or ``1/sqrt(n)`` for another dimension ``n`` of the scores (the batch, the heads, the
sequence length) that is not ``d``. Silent on ``1/sqrt(d)`` however it is split (``q * s``,
``k * s``), no factor (T5), ``1/d`` (muP), a factor that needs a gradient (a learned
temperature) or is a tensor of another shape, a product with an operand that is a leaf or has no
graph (``h @ W``: not Q@K^T) or that is normalised (``F.normalize``: cosine attention, where the
factor is a temperature), and ``scaled_dot_product_attention`` (its graph has no softmax node of
its own on the fused paths, ``SafeSoftmaxBackward`` on the math one).

The same scalar walk reads a contrastive loss's temperature (``temperature_multiplied``): from
each ``LogSoftmaxBackward`` (a cross_entropy's, a log_softmax's: a loss's logits, where a softmax
feeding a product is attention) down to the products that made its logits; when both operands
are divided by their own norm over the dimension the product sums (the normalisation
``_softmax_below`` stops at, its dimension mapped through the same views and transposes) the
logits are cosine similarities, and a constant factor of at most ``_SMALL_FACTOR`` on them is a
temperature multiplied instead of divided. Silent on a learned scale, a factor above it, one
operand not normalised (dot-product logits of any size) or normalised over another dimension.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import packed, post_order, reached, saved
from .graphpaths import signed as _signed
from .losswindow import LossWindow
from .recorder import Recorder

_WINDOWS = 3  # backwards whose loss graphs are walked
_NODES = 20000  # nodes walked per backward (a larger graph is not looked at)
_DOWN = 16  # operations followed from a product down to a softmax
_LEAVES = 20000  # nodes walked below a softmax to name the parameters of its scores

# operations whose output keeps the input's shape and values in place, element for element
_SAME = ("CloneBackward", "NativeDropoutBackward", "MulBackward", "ToCopyBackward",
         "AliasBackward", "MaskedFillBackward")
_VIEW = ("ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward")
# operations followed below a softmax to the normalisation of a Sinkhorn iteration before it
_ELEMENTWISE = ("LogBackward", "ExpBackward", "SubBackward", "AddBackward", "DivBackward",
                "MulBackward", "NegBackward", "CloneBackward", "ToCopyBackward")
_SINKHORN = 4  # operations between two normalisations of a Sinkhorn iteration
# operations between a softmax's input and the products that made its scores, and between a
# product and the projections of its operands, that pass values on unscaled
_CARRY = ("CloneBackward", "ToCopyBackward", "AliasBackward", "MaskedFillBackward",
          "ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward", "SqueezeBackward",
          "UnsqueezeBackward", "ExpandBackward", "TransposeBackward", "TBackward",
          "PermuteBackward", "SplitBackward", "SplitWithSizesBackward", "UnbindBackward",
          "SelectBackward", "SliceBackward", "ContiguousBackward")
_BIAS = ("AddBackward", "SubBackward")  # a position bias or an additive mask on the scores
_SCALE_DOWN = 24  # operations followed from a softmax to its products, and from each to Q, K
_MIN_HEAD = 8  # contracted sizes below this are not judged (sqrt(4) = 2 reads as a choice)
_TOLERANCE = 1e-3  # relative: float32 constants and factors split over Q and K
# a constant factor on cosine similarities at most this leaves logits within [-0.5, 0.5]: a
# temperature multiplied instead of divided (1 / 0.5 = 2 is the smallest factor a divided one gives)
_SMALL_FACTOR = 0.5


def _saved(node, name: str, default=None):
    """What ``node`` saved as ``name``, or None: released, not saved, or saved under
    saved-tensor hooks (non-reentrant checkpointing, offloading), whose unpacking would run the
    checkpointed forward again (BatchNorm's running statistics updated twice)."""
    if packed(node, name):
        return default
    try:
        return getattr(node, name)
    except Exception:  # released, or not saved for this configuration
        return default


def _prod(sizes) -> int:
    out = 1
    for s in sizes:
        out *= s
    return out


def _through_reshape(shape: tuple, dim: int, sizes: tuple) -> int | None:
    """The dimension of a tensor of ``sizes`` that a reshape to ``shape`` turned into dimension
    ``dim``, or None when ``dim`` is not one whole dimension of it (split or merged). In row-major
    order a dimension survives a reshape exactly when one of the input's has its length and the
    same number of elements after it."""
    inner = _prod(shape[dim + 1:])
    for at, size in enumerate(sizes):
        if size == shape[dim] and _prod(sizes[at + 1:]) == inner:
            return at
    return None


def _output_shape(node, output: int) -> tuple | None:
    """The shape of output ``output`` of ``node`` (what it passes on to the operation after it)
    from its metadata: no saved tensor read, and known when the product saved none (``torch.bmm``
    saves its left operand only when the right one needs a gradient)."""
    if node is None:
        return None
    try:
        return tuple(int(s) for s in node._input_metadata[output].shape)
    except Exception:  # an older torch, or a node without metadata
        return None


def _sizes(node, name: str = "_saved_self_sym_sizes") -> tuple | None:
    sizes = _saved(node, name)
    return None if sizes is None else tuple(int(s) for s in sizes)


# operations between a division and the norm it divides by: F.normalize's clamp_min and
# expand_as, an added epsilon, a reshape or unsqueeze of a norm taken without keepdim
_DENOMINATOR = ("ExpandBackward", "ClampMinBackward", "ClampBackward", "AddBackward",
                "UnsqueezeBackward", "ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward")
_NORMS = ("LinalgVectorNormBackward", "NormBackward")


def _only_child(node):
    """``(child, output)`` of a node with one input that carries a gradient, else None."""
    children = [(child, at) for child, at in node.next_functions if child is not None]
    return children[0] if len(children) == 1 else None


def _norm_divided(node, shape: tuple, cosine: bool = False) -> int | None:
    """The dimension of ``shape`` a division normalises when it is ``x / ||x||`` with the norm
    taken over one dimension of the same ``x`` (``F.normalize(x, dim)``, ``x / x.norm(dim=d,
    keepdim=True)``, ``x / (x.pow(2).sum(d, keepdim=True).sqrt() + eps)``), else None. A
    parameter normalised (a cosine classifier's weight rows, weight normalisation) has no batch
    to be normalised over: None as well, unless ``cosine`` (the other operand of the product is
    normalised too, so the product is meant as cosine similarities), which asks for an L2 norm
    instead. A standardisation (``(x - mean) / std``) divides something else than the tensor its
    statistic was taken of: None."""
    if len(node.next_functions) != 2:
        return None
    numerator, denominator = node.next_functions
    if numerator[0] is None or denominator[0] is None \
            or (type(numerator[0]).__name__ == "AccumulateGrad" and not cosine) \
            or _output_shape(numerator[0], numerator[1]) != shape:
        return None
    below = denominator[0]
    for _ in range(_DOWN):
        name = type(below).__name__
        if name.startswith(_NORMS) or name.startswith("SqrtBackward"):
            break
        if not name.startswith(_DENOMINATOR):
            return None
        child = _only_child(below)
        if child is None:
            return None
        below = child[0]
    else:
        return None
    if type(below).__name__.startswith("SqrtBackward"):  # the square root of a sum of squares
        reduced = _only_child(below)
        if reduced is None or not type(reduced[0]).__name__.startswith("SumBackward"):
            return None
        squared = _only_child(reduced[0])
        if squared is None or not type(squared[0]).__name__.startswith("PowBackward") \
                or _saved(squared[0], "_saved_exponent") != 2:
            return None
        below, source = reduced[0], _only_child(squared[0])
    else:
        source = _only_child(below)
    if source is None or source != (numerator[0], numerator[1]):
        return None  # the norm of another tensor than the one divided
    dims = _saved(below, "_saved_dim")
    if dims is None or len(dims) != 1:
        return None
    if cosine and type(below).__name__.startswith(_NORMS):
        order = _saved(below, "_saved_ord", _saved(below, "_saved_p"))
        try:
            if order is not None and float(order) != 2.0:
                return None  # an L1 or max normalisation: rows that sum to one, no unit vectors
        except (TypeError, ValueError):
            return None
    return _signed(dims[0]) % len(shape)


def _scaled_operand(node, shape: tuple):
    """The input node of a product ``scale * x`` (either order) with a gradient in both, when
    ``scale`` is one number (a learned temperature) and ``x`` has ``shape``; else None."""
    inputs = [(child, at) for child, at in node.next_functions]
    if len(inputs) != 2 or any(child is None for child, _ in inputs):
        return None
    operands = (_saved(node, "_saved_self"), _saved(node, "_saved_other"))
    if not all(isinstance(t, torch.Tensor) for t in operands):
        return None
    for (child, _), mine, theirs in zip(inputs, operands, operands[::-1]):
        if tuple(mine.shape) == shape and theirs.numel() == 1:
            return child
    return None


def _softmax_below(node, shape: tuple, dim: int, cosine: bool = False):
    """Follow ``node`` (the producer of a product's operand of ``shape``, summed over ``dim``)
    down to a softmax: ``(softmax node, its normalised dim, the dim summed over, its shape)``,
    the summed dimension mapped exactly through every reshape, transpose, permute, expand and
    (un)squeeze on the way (what ``torch.einsum`` and ``torch.matmul`` lower to as much as what
    the script wrote); None when the path leaves the value-keeping operations first or the summed
    dimension is split, merged or broadcast on the way."""
    for _ in range(_DOWN):
        if node is None:
            return None
        name = type(node).__name__
        n = len(shape)
        if name.startswith("SoftmaxBackward"):
            result = _saved(node, "_saved_result")
            saved_dim = _saved(node, "_saved_dim")
            if result is None or saved_dim is None or tuple(result.shape) != shape:
                return None
            return node, _signed(saved_dim) % n, dim, shape
        if name.startswith("DivBackward"):
            normalised = _norm_divided(node, shape, cosine)
            return None if normalised is None else (node, normalised, dim, shape)
        if name.startswith(_SAME):
            if name.startswith("MulBackward"):
                # dropout's mask, or a scale: of the same shape, or a number (a gate broadcast
                # along a dimension weighs the rows or columns anew)
                other = _saved(node, "_saved_other")
                if isinstance(other, torch.Tensor) and other.dim() and tuple(other.shape) != shape:
                    return None
                scaled = _scaled_operand(node, shape)
                if scaled is not None:  # a learned temperature (CLIP's logit_scale * z1 @ z2.T)
                    node = scaled
                    continue
        elif name.startswith(_VIEW) or name.startswith("SqueezeBackward"):
            sizes = _sizes(node)
            if sizes is None or _prod(sizes) != _prod(shape):
                return None
            dim = _through_reshape(shape, dim, sizes)
            if dim is None:
                return None
            shape = sizes
        elif name.startswith("UnsqueezeBackward"):
            at = _saved(node, "_saved_dim")
            if at is None:
                return None
            at = _signed(at) % n
            if dim == at:
                return None
            dim -= dim > at
            shape = shape[:at] + shape[at + 1:]
        elif name.startswith("ExpandBackward"):
            sizes = _sizes(node)
            if sizes is None:
                return None
            dim -= n - len(sizes)
            if dim < 0 or sizes[dim] != shape[dim + n - len(sizes)]:
                return None  # the summed dimension was broadcast: nothing normalised along it
            shape = sizes
        elif name.startswith(("TransposeBackward", "TBackward")):
            if name.startswith("TBackward"):
                d0, d1 = (0, 1) if n == 2 else (0, 0)
            else:
                d0, d1 = (_saved(node, "_saved_dim0"), _saved(node, "_saved_dim1"))
                if d0 is None or d1 is None:
                    return None
                d0, d1 = _signed(d0) % n, _signed(d1) % n
            dim = d1 if dim == d0 else d0 if dim == d1 else dim
            swapped = list(shape)
            swapped[d0], swapped[d1] = swapped[d1], swapped[d0]
            shape = tuple(swapped)
        elif name.startswith("PermuteBackward"):
            dims = _saved(node, "_saved_dims")
            if dims is None or len(dims) != n:
                return None
            dims = [_signed(d) % n for d in dims]  # output dimension i is input dimension dims[i]
            unpermuted = [0] * n
            for i, d in enumerate(dims):
                unpermuted[d] = shape[i]
            dim, shape = dims[dim], tuple(unpermuted)
        else:
            return None
        children = [child for child, _ in node.next_functions if child is not None]
        if len(children) != 1:
            return None
        node = children[0]
    return None


def _renormalised_before(softmax, summed: int, shape: tuple) -> bool:
    """Whether the scores ``softmax`` normalised were themselves normalised over ``summed`` a few
    operations before: a Sinkhorn iteration (``softmax(softmax(s, 1).log(), 0)``, or in log space
    ``s - logsumexp(s, 1, keepdim=True)``), whose plan is left nearly doubly stochastic: its rows
    sum to about 1 as well, whichever axis the last step normalised."""
    stack = [(child, 0) for child, _ in softmax.next_functions if child is not None]
    seen: set = set()
    while stack:
        node, depth = stack.pop()
        if node in seen or depth > _SINKHORN:
            continue
        seen.add(node)
        name = type(node).__name__
        if name.startswith(("SoftmaxBackward", "LogSoftmaxBackward")):
            result = _saved(node, "_saved_result")
            dim = _saved(node, "_saved_dim")
            if result is not None and dim is not None and tuple(result.shape) == shape \
                    and _signed(dim) % len(shape) == summed:
                return True
        elif name.startswith("LogsumexpBackward"):
            dims = _saved(node, "_saved_dim")
            scores = _saved(node, "_saved_self")
            if dims is not None and isinstance(scores, torch.Tensor) and \
                    tuple(scores.shape) == shape and \
                    summed in {_signed(d) % len(shape) for d in dims}:
                return True
        if not name.startswith(_ELEMENTWISE):
            continue
        stack.extend((child, depth + 1) for child, _ in node.next_functions if child is not None)
    return False


def _misnormalised(found) -> bool:
    """Whether ``found`` (``_softmax_below``'s answer) is a softmax over another dimension than
    its last, summed over its last: weights laid out row by row (queries, keys) and normalised
    over the rows. A softmax over its last dimension summed over another is an assignment used on
    purpose (DiffPool's ``s.transpose(1, 2) @ x``, a mixture-of-experts dispatch
    ``einsum('ne,nd->ed', gates, x)``, weights laid out (keys, queries)): silent."""
    softmax, normalised, summed, shape = found
    return (normalised != summed and summed == len(shape) - 1 and shape[normalised] >= 2
            and (_op(softmax) == "normalize" or not _renormalised_before(softmax, summed, shape)))


def _op(node) -> str:
    """What ``_softmax_below`` found: a "softmax", or a division by a norm ("normalize")."""
    return "normalize" if type(node).__name__.startswith("DivBackward") else "softmax"


def _scalar_factor(node):
    """``(factor, input followed)`` of a ``MulBackward``/``DivBackward`` that scales by a
    constant number (a Python number or a 0-dim CPU tensor that needs no gradient); ``"learned"``
    when the scalar needs a gradient (a temperature that trains); None for anything else (a
    tensor of another shape, a division of a number by the scores)."""
    name = type(node).__name__
    children = [child for child, _ in node.next_functions]
    sides = [("_saved_other", 0)] if name.startswith("DivBackward") else \
        [("_saved_other", 0), ("_saved_self", 1)]
    for attr, followed in sides:
        value = saved(node, attr)
        if isinstance(value, torch.Tensor):
            if value.numel() != 1 or value.dim() > 0 and tuple(value.shape) != (1,):
                continue
            if value.requires_grad:
                return "learned"
            if value.device.type != "cpu" or value.is_complex():
                return None  # reading it would wait for the device
            number = float(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        else:
            continue
        child = children[followed] if followed < len(children) else None
        scalar_side = children[1 - followed] if len(children) > 1 else None
        if child is None or scalar_side is not None or number == 0.0:
            return None  # both sides carry a graph, or the scaled side has none
        return (1.0 / number if name.startswith("DivBackward") else number), child
    return None


def _scores_products(softmax) -> list | None:
    """``[(product node, factor)]``: the matrix products that made the scores ``softmax``
    normalises, each with the constant factor met between it and the softmax; None when a
    learned scale is on the way."""
    found: dict = {}
    stack = [(child, 1.0) for child, _ in softmax.next_functions if child is not None]
    walked = 0
    while stack and walked < _SCALE_DOWN:
        node, factor = stack.pop()
        walked += 1
        name = type(node).__name__
        if name.startswith(("BmmBackward", "MmBackward")):
            found.setdefault(node, factor)
            continue
        if name.startswith(("MulBackward", "DivBackward")):
            scaled = _scalar_factor(node)
            if scaled == "learned":
                return None
            if scaled is not None:
                stack.append((scaled[1], factor * scaled[0]))
            continue
        if name.startswith(_CARRY) or name.startswith(_BIAS):
            stack.extend((child, factor) for child, _ in node.next_functions if child is not None)
    return list(found.items())


def _operand_factor(node):
    """The constant factor on one operand of a product, followed up to the operation that made
    it (a projection): ``(factor, that operation)``; None when the operand is a leaf (a
    parameter: ``h @ W`` is no Q@K^T), has no graph, or carries a learned scale."""
    factor = 1.0
    for _ in range(_SCALE_DOWN):
        if node is None:
            return None
        name = type(node).__name__
        if name.startswith(("MulBackward", "DivBackward")):
            scaled = _scalar_factor(node)
            if scaled == "learned":
                return None
            if scaled is None:
                return factor, node  # a product by a tensor: a normalisation, a gate
            factor, node = factor * scaled[0], scaled[1]
            continue
        if not name.startswith(_CARRY):
            return (None if name == "AccumulateGrad" else (factor, node))
        children = [child for child, _ in node.next_functions if child is not None]
        if len(children) != 1:
            return None
        node = children[0]
    return None


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= _TOLERANCE * abs(b)


def scale_verdict(factor: float, d: int, dims) -> tuple[str, int] | None:
    """``(how, n)`` when ``factor`` scales scores contracted over ``d`` the wrong way:
    ``("multiplied", d)`` for ``sqrt(d)``, ``("other_dim", n)`` for ``1/sqrt(n)`` with ``n`` one
    of ``dims`` (the scores' other sizes) that is not ``d``; None for ``1/sqrt(d)``, no factor,
    ``1/d`` (muP) and any other value."""
    if d < _MIN_HEAD or _close(factor, d ** -0.5) or _close(factor, 1.0) or _close(factor, 1.0 / d):
        return None
    if _close(factor, d ** 0.5):
        return "multiplied", d
    for n in sorted(set(dims)):
        if n != d and n >= 4 and _close(factor, n ** -0.5):
            return "other_dim", n
    return None


def misscaled_scores(softmax):
    """``(how, n, d, factor, scores shape)`` when the scores ``softmax`` normalises over its last
    axis are a Q@K^T product scaled the wrong way (``scale_verdict``), else None."""
    dim = _saved(softmax, "_saved_dim")
    shape = _output_shape(softmax, 0)
    if dim is None or not shape or _signed(dim) % len(shape) != len(shape) - 1 or shape[-1] < 2:
        return None
    products = _scores_products(softmax)
    for product, factor in products or ():
        operands = list(product.next_functions)
        if len(operands) != 2:
            continue
        left, right = (_output_shape(child, output) for child, output in operands)
        if not left or not right or len(left) < 2 or len(right) < 2 or left[-1] != right[-2]:
            continue
        sides = [_operand_factor(child) for child, _ in operands]
        if any(side is None or type(side[1]).__name__.startswith("DivBackward") for side in sides):
            continue  # not Q@K^T, a learned scale, or normalised operands (cosine attention)
        total = factor * sides[0][0] * sides[1][0]
        d = left[-1]
        verdict = scale_verdict(total, d, tuple(shape) + tuple(left[:-1]))
        if verdict is not None:
            return verdict[0], verdict[1], d, total, shape
    return None


_FILL_DOWN = 6  # operations followed from a softmax's input down to a masked_fill
_FILL_CELLS = 1 << 22  # softmax results larger than this are not read
_FILL_ROWS = 2  # rows with masked and unmasked positions both, needed to judge
FILL_KEPT = 0.01  # the masked positions' mean share of the weight above which the fill masks nothing


def masked_fill_weight(softmax):
    """``(share, masked, rows, shape, by)`` when the scores a softmax over its last axis normalises
    come (through casts, clones and constant positive factors) straight out of a
    ``masked_fill``, or out of a product with a 0/1 tensor without gradient (``scores * mask``:
    the masked scores become 0, a neutral score, not a mask), and the positions it masked keep
    weight (``by``: "masked_fill" or "mul"): ``share`` is their mean weight per
    row, over the ``rows`` rows that hold masked and unmasked positions both, ``masked`` the
    mean share of those rows' positions that are masked (the weight uniform attention would
    give them). None when nothing is kept (a fill of -inf or -1e9 leaves exactly 0), when the
    result is not on the CPU or too large, or when no masked_fill is below."""
    dim = _saved(softmax, "_saved_dim")
    result = _saved(softmax, "_saved_result")
    if dim is None or not isinstance(result, torch.Tensor) or result.dim() < 1 \
            or result.device.type != "cpu" or result.numel() > _FILL_CELLS \
            or _signed(dim) % result.dim() != result.dim() - 1 or result.shape[-1] < 2:
        return None
    node = softmax.next_functions[0][0] if softmax.next_functions else None
    mask, by = None, "masked_fill"
    for _ in range(_FILL_DOWN):
        if node is None:
            return None
        name = type(node).__name__
        if name.startswith("MaskedFillBackward"):
            mask = _saved(node, "_saved_mask")
            break
        if name.startswith(("MulBackward", "DivBackward")):
            scaled = _scalar_factor(node)
            if scaled is None and name.startswith("MulBackward"):
                mask = _zero_one_factor(node)
                if mask is not None:  # scores * mask: the masked scores become 0, not -inf
                    by = "mul"
                    break
            if scaled is None or scaled == "learned" or not scaled[0] > 0:
                return None
            node = scaled[1]
            continue
        if not name.startswith(("CloneBackward", "ToCopyBackward", "AliasBackward")):
            return None
        child = _only_child(node)
        node = child[0] if child is not None else None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.device.type != "cpu":
        return None
    found = _kept_weight(result, mask)
    return None if found is None else (*found, by)


def _zero_one_factor(product):
    """Where the tensor without gradient that ``product`` (a ``MulBackward``) multiplied its
    scores by is 0, as a bool mask, when that tensor holds only 0s and 1s, both (a padding
    mask multiplied into attention scores); else None (a scale, a learned gate)."""
    inputs = product.next_functions
    if len(inputs) != 2:
        return None
    if inputs[0][0] is not None and inputs[1][0] is None:
        factor = _saved(product, "_saved_other")
    elif inputs[1][0] is not None and inputs[0][0] is None:
        factor = _saved(product, "_saved_self")
    else:
        return None
    if not isinstance(factor, torch.Tensor) or factor.device.type != "cpu" or factor.dim() < 1 \
            or factor.numel() > _FILL_CELLS:
        return None
    with torch.no_grad():
        zero = factor == 0
        if not bool(((factor == 1) | zero).all()) or not bool(zero.any()) or bool(zero.all()):
            return None
    return zero


def _kept_weight(result, mask):
    """``masked_fill_weight``'s answer for a softmax's ``result`` and the ``mask`` of the
    positions meant to be left out."""
    with torch.no_grad():
        try:
            full = torch.broadcast_to(mask, result.shape)
        except RuntimeError:
            return None
        width = result.shape[-1]
        rows = result.detach().reshape(-1, width).float()
        held = full.reshape(-1, width)
        some = held.any(1) & ~held.all(1)
        count = int(some.sum())
        if count < _FILL_ROWS:
            return None
        kept = (rows[some] * held[some]).sum(1)
        share = float(kept.mean())
        if not share > FILL_KEPT:  # NaN rows (every score -inf) stay silent too
            return None
        masked = float(held[some].float().mean(1).mean())
    return share, masked, count, tuple(int(s) for s in result.shape)


_AFTER_UP = 4  # operations followed from a masked_fill down to the softmax whose result it fills


def _suffix_or_prefix(held) -> bool:
    """Whether every row of a (rows, width) boolean mask holds its True positions together at
    one end (padding on the right or on the left), and the rows do not all mask as many: the
    lengths of padded lists or sequences, not one chosen class per row."""
    width = held.shape[-1]
    count = held.sum(1)
    at = torch.arange(width)
    right = held == (at[None, :] >= (width - count)[:, None])
    left = held == (at[None, :] < count[:, None])
    return bool((right.all(1) | left.all(1)).all()) and int(count.unique().numel()) >= 2


def masked_after_softmax(fill, renormalised: set) -> tuple | None:
    """``(share, masked, rows, shape, softmax node)`` when a ``masked_fill`` takes positions out
    of the result of a softmax (or log_softmax) over the last axis, through clones and casts,
    that normalised over them: the positions the mask takes out held ``share`` of the weight
    (mean over the rows with masked and unmasked positions both). The mask must hold each row's
    masked positions together at one end, with rows of different lengths (padding); a fill whose
    result is divided again (``ids`` of the nodes in ``renormalised``: ``p / p.sum(-1)``) is a
    renormalisation and is left out. None otherwise: the softmax's input was masked already
    (the weight there is 0), the mask is no padding, the result is not on the CPU or too large."""
    if id(fill) in renormalised:
        return None
    mask = _saved(fill, "_saved_mask")
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.device.type != "cpu":
        return None
    node = fill.next_functions[0][0] if fill.next_functions else None
    for _ in range(_AFTER_UP):
        if node is None:
            return None
        name = type(node).__name__
        if name.startswith(("SoftmaxBackward", "LogSoftmaxBackward")):
            break
        if not name.startswith(("CloneBackward", "ToCopyBackward", "AliasBackward")):
            return None
        child = _only_child(node)
        node = child[0] if child is not None else None
    else:
        return None
    log = type(node).__name__.startswith("LogSoftmaxBackward")
    dim = _saved(node, "_saved_dim")
    result = _saved(node, "_saved_result")
    if dim is None or not isinstance(result, torch.Tensor) or result.dim() < 1 \
            or result.device.type != "cpu" or result.numel() > _FILL_CELLS \
            or _signed(dim) % result.dim() != result.dim() - 1 or result.shape[-1] < 2:
        return None
    with torch.no_grad():
        try:
            full = torch.broadcast_to(mask, result.shape)
        except RuntimeError:
            return None
        width = result.shape[-1]
        weights = result.detach().reshape(-1, width).float()
        if log:
            weights = weights.exp()
        held = full.reshape(-1, width)
        some = held.any(1) & ~held.all(1)
        count = int(some.sum())
        if count < _FILL_ROWS or not _suffix_or_prefix(held[some]):
            return None
        share = float((weights[some] * held[some]).sum(1).mean())
        if not share > FILL_KEPT:
            return None
        masked = float(held[some].float().mean(1).mean())
    return share, masked, count, tuple(int(s) for s in result.shape), node


def _cosine_operand(child, output: int, contracted: int) -> bool:
    """Whether a product's operand (``child``'s output ``output``, contracted over its dimension
    ``contracted`` counted from the end) is a tensor divided by its own norm over that dimension
    (``F.normalize(z, dim=-1)``, ``z / z.norm(dim=-1, keepdim=True)``), followed through the
    views, transposes and scalar products ``_softmax_below`` maps the dimension through."""
    shape = _output_shape(child, output)
    if shape is None or len(shape) < 2 or shape[contracted] < 2:
        return False
    found = _softmax_below(child, shape, len(shape) + contracted)
    return found is not None and _op(found[0]) == "normalize" and found[1] == found[2]


def multiplied_temperature(log_softmax):
    """``(factor, logits shape)`` when the logits a ``LogSoftmaxBackward`` (a cross_entropy's, a
    log_softmax's) normalises are cosine similarities (a product of two operands each divided by
    its norm over the contracted dimension) times a constant factor at most ``_SMALL_FACTOR``:
    the logits' range is at most that factor, the softmax over the candidates nearly uniform.
    None for anything else: a learned scale on the way, an operand not normalised, a factor
    above it (``/ tau``)."""
    shape = _output_shape(log_softmax, 0)
    if not shape or len(shape) < 2:
        return None
    dim = _saved(log_softmax, "_saved_dim")
    if dim is None or shape[_signed(dim) % len(shape)] < 2:
        return None
    for product, factor in _scores_products(log_softmax) or ():
        operands = list(product.next_functions)
        if len(operands) != 2 or any(child is None for child, _ in operands):
            continue
        if not all(_cosine_operand(child, output, summed)
                   for (child, output), summed in zip(operands, (-1, -2))):
            continue
        sides = [_operand_factor(child) for child, _ in operands]
        if any(side is None for side in sides):
            continue  # a learned scale on an operand (CLIP's logit_scale.exp() * img)
        total = factor * sides[0][0] * sides[1][0]
        if 0.0 < total <= _SMALL_FACTOR:
            return total, shape
    return None


def cosine_misnormalised(product) -> list:
    """For a matrix product (``MmBackward``, ``BmmBackward``, ``AddmmBackward``: ``F.linear``
    with a bias) both of whose operands are divided by their own L2 norm, weights included (a
    cosine classifier's ``F.linear(F.normalize(x), F.normalize(W))``): ``[(division node,
    normalised dim, summed dim, shape)]`` of the operands normalised over another dimension than
    the one the product sums. Empty when either operand is not normalised (a dot product, a
    stochastic matrix normalised with an L1 norm, a weight normalised and applied to raw
    features), or both are normalised over the summed dimension (cosine similarities, Barlow
    Twins' columns normalised over the batch that ``z1.T @ z2`` sums)."""
    operands = [(child, at) for child, at in product.next_functions]
    if type(product).__name__.startswith("AddmmBackward"):
        operands = operands[1:]
    if len(operands) != 2 or any(child is None for child, _ in operands):
        return []
    found = []
    for (child, output), summed in zip(operands, (-1, -2)):
        shape = _output_shape(child, output)
        if shape is None or len(shape) < 2 or shape[summed] < 2:
            return []
        below = _softmax_below(child, shape, len(shape) + summed, cosine=True)
        if below is None or _op(below[0]) != "normalize":
            return []
        found.append(below)
    return [f for f in found if f[1] != f[2] and f[3][f[1]] >= 2]


class SoftmaxAxisWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.loss_window = LossWindow(rec, _WINDOWS)
        self._told: set = set()  # (softmax dim, summed dim, shape) already reported

    def install(self, patcher) -> None:  # subscribes to DESCRIBE_LOSS only (instrument/__init__.py)
        pass

    def describe_loss(self, tensors) -> dict:
        if not self.loss_window.take():
            return {}
        try:
            self._look(tensors)
        except Exception as exc:
            self.rec.internal_error("softmax axis", exc)
        return {}

    def _look(self, tensors) -> None:
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        for root in [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]:
            nodes = post_order(root, _NODES)
            if nodes is None:
                continue
            renormalised = {id(node.next_functions[0][0]) for node in nodes
                            if type(node).__name__.startswith("DivBackward") and node.next_functions
                            and node.next_functions[0][0] is not None}
            for node in nodes:
                name = type(node).__name__
                if name.startswith("MaskedFillBackward"):
                    self._judge_fill_after(node, renormalised)
                    continue
                if name.startswith("SoftmaxBackward"):
                    self._judge_scale(node)
                    self._judge_fill(node)
                    continue
                if name.startswith("LogSoftmaxBackward"):
                    self._judge_temperature(node)
                    continue
                if name.startswith("AddmmBackward"):
                    self._judge_cosine(node)
                    continue
                if not name.startswith(("BmmBackward", "MmBackward")):
                    continue
                for found in self._operands(node):
                    if found is None or not _misnormalised(found):
                        continue
                    softmax, normalised, summed, sm_shape = found
                    key = (_op(softmax), normalised, summed, sm_shape)
                    if key in self._told:
                        continue
                    self._told.add(key)
                    self._report(softmax, normalised, summed, sm_shape)
                self._judge_cosine(node)

    def _judge_cosine(self, product) -> None:
        """Cosine similarities whose operand (a parameter included) is normalised over another
        axis than the product sums, when ``_operands``' walk (activations only, the summed axis
        last) did not report it already."""
        for division, normalised, summed, shape in cosine_misnormalised(product):
            key = ("normalize", normalised, summed, shape)
            if key in self._told:
                continue
            self._told.add(key)
            numerator = division.next_functions[0][0]
            weight = getattr(numerator, "variable", None) \
                if type(numerator).__name__ == "AccumulateGrad" else None
            param = self.rec.tensors.number.get(id(weight)) if weight is not None else None
            self.rec.emit_aside(ev.softmax_axis(dim=normalised, summed=summed, shape=list(shape),
                                                params=self._params(division), op="normalize",
                                                cosine=True, param=param),
                                self.rec.here())

    @staticmethod
    def _operands(node):
        """What ``_softmax_below`` finds below each operand of a matrix product: the left one
        summed over its last dimension, the right one over its second to last."""
        for (child, output), summed in zip(node.next_functions, (-1, -2)):
            shape = _output_shape(child, output)
            if shape is None or len(shape) < 2 or shape[summed] < 2:
                continue
            yield _softmax_below(child, shape, len(shape) + summed)

    def _judge_scale(self, softmax) -> None:
        found = misscaled_scores(softmax)
        if found is None:
            return
        how, n, d, factor, shape = found
        key = ("scale", how, n, d, shape)
        if key in self._told:
            return
        self._told.add(key)
        self.rec.emit_aside(ev.attention_scale(how=how, n=n, d=d, factor=factor,
                                               shape=list(shape), params=self._params(softmax)),
                            self.rec.here())

    def _judge_fill(self, softmax) -> None:
        found = masked_fill_weight(softmax)
        if found is None:
            return
        share, masked, rows, shape, by = found
        key = ("fill", shape)
        if key in self._told:
            return
        self._told.add(key)
        self.rec.emit_aside(ev.masked_fill_weight(share=share, masked=masked, rows=rows,
                                                  shape=list(shape),
                                                  params=self._params(softmax),
                                                  multiplied=by == "mul"),
                            self.rec.here())

    def _judge_fill_after(self, fill, renormalised: set) -> None:
        found = masked_after_softmax(fill, renormalised)
        if found is None:
            return
        share, masked, rows, shape, softmax = found
        key = ("fill after", shape)
        if key in self._told:
            return
        self._told.add(key)
        self.rec.emit_aside(ev.masked_fill_weight(share=share, masked=masked, rows=rows,
                                                  shape=list(shape),
                                                  params=self._params(softmax), after=True),
                            self.rec.here())

    def _judge_temperature(self, log_softmax) -> None:
        found = multiplied_temperature(log_softmax)
        if found is None:
            return
        factor, shape = found
        key = ("temperature", round(factor, 6), shape)
        if key in self._told:
            return
        self._told.add(key)
        self.rec.emit_aside(ev.temperature_multiplied(factor=factor, shape=list(shape),
                                                      params=self._params(log_softmax)),
                            self.rec.here())

    def _params(self, softmax) -> list:
        tensors = self.rec.tensors
        walked = reached(softmax, _LEAVES, truncate=True)
        pids = sorted(pid for i in walked[1]
                      if (pid := tensors.number.get(i)) is not None and id(tensors.refs[pid]()) == i)
        return pids[:64]

    def _report(self, softmax, normalised: int, summed: int, shape: tuple) -> None:
        rec = self.rec
        rec.emit_aside(ev.softmax_axis(dim=normalised, summed=summed, shape=list(shape),
                                       params=self._params(softmax), op=_op(softmax)),
                       rec.here())
