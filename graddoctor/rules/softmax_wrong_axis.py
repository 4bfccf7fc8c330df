from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule


_MODULES = ("F", "torch", "nn", "functional", "special")


def _module(expr) -> bool:
    """Whether ``expr`` names a module of softmax functions (``F``, ``torch.nn.functional``)
    rather than a tensor whose ``.softmax`` method is called (``scores``, ``(q @ k.mT)``)."""
    if isinstance(expr, ast.Name):
        return expr.id in _MODULES
    return isinstance(expr, ast.Attribute) and expr.attr in _MODULES and _module(expr.value)


def _dim_of(text: str) -> int | None:
    """The literal ``dim`` of one softmax call's source (``F.softmax(s, dim=1)``,
    ``torch.softmax(s, 1)``, ``s.softmax(-2)``, ``nn.Softmax(dim=1)``), else None."""
    try:
        call = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call):
        return None
    value = next((k.value for k in call.keywords if k.arg == "dim"), None)
    if value is None:
        func = call.func
        method = isinstance(func, ast.Attribute) and not _module(func.value)
        module = isinstance(func, (ast.Attribute, ast.Name)) and \
            (func.attr if isinstance(func, ast.Attribute) else func.id) == "Softmax"
        position = 0 if (method or module) else 1
        value = call.args[position] if len(call.args) > position else None
    try:
        return int(ast.literal_eval(value)) if value is not None else None
    except (ValueError, TypeError, SyntaxError):
        return None


_NORM_CALLS = frozenset({"normalize", "norm", "vector_norm"})


def _norm_dim_of(text: str) -> int | None:
    """The literal ``dim`` of one normalisation call's source (``F.normalize(z, dim=0)``,
    ``F.normalize(z, 2, 0)``, ``z.norm(dim=0, keepdim=True)``, ``torch.linalg.norm(z, 2, 0)``),
    else None (``F.normalize(z)``: its default dim=1 is not written)."""
    try:
        call = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call):
        return None
    value = next((k.value for k in call.keywords if k.arg == "dim"), None)
    if value is None:
        func = call.func
        receiver = func.value if isinstance(func, ast.Attribute) else None
        linalg = isinstance(receiver, (ast.Name, ast.Attribute)) and \
            (receiver.id if isinstance(receiver, ast.Name) else receiver.attr) == "linalg"
        method = receiver is not None and func.attr == "norm" and not (_module(receiver) or linalg)
        position = 1 if method else 2  # after p (and the input, for a function)
        value = call.args[position] if len(call.args) > position else None
    try:
        return int(ast.literal_eval(value)) if value is not None else None
    except (ValueError, TypeError, SyntaxError):
        return None


def _with_dim(text: str, dim: int) -> str | None:
    """One normalize / norm call's source with its literal ``dim`` replaced by ``dim``
    (``F.normalize(w, dim=0)`` -> ``F.normalize(w, dim=1)``), None when it is not written as a
    keyword."""
    try:
        call = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call):
        return None
    for keyword in call.keywords:
        if keyword.arg == "dim":
            keyword.value = ast.Constant(dim)
            return ast.unparse(call)
    return None


def normalize_line(a, path: str, dim: int, ndim: int,
                   named: str | None = None) -> tuple[int, str] | None:
    """``(line, text)`` of the first normalize / norm call of the file whose literal ``dim``
    names dimension ``dim`` of an ``ndim``-dimensional tensor — the first that also names
    ``named`` (the attribute of the parameter normalised) when one does; None when there is
    none."""
    found = [(line, text) for line, text, _forward in a.source.calls_named(path, _NORM_CALLS)
             if (written := _norm_dim_of(text)) is not None and written in (dim, dim - ndim)]
    if named:
        word = re.compile(rf"\b{re.escape(named)}\b")
        for line, text in found:
            if word.search(text):
                return line, text
    return found[0] if found else None


def softmax_line(a, path: str, dim: int, ndim: int) -> tuple[int, str] | None:
    """``(line, text)`` of the first softmax call of the file whose literal ``dim`` names
    dimension ``dim`` of an ``ndim``-dimensional tensor; None when there is none."""
    for line, text, _forward in a.source.calls_named(path, frozenset({"softmax", "Softmax"})):
        written = _dim_of(text)
        if written is not None and written in (dim, dim - ndim):
            return line, text
    return None


class SoftmaxWrongAxis(Rule):
    """
    ## What it does
    Finds attention weights normalised over another axis than the one the matrix product after
    them sums over: `weights = softmax(scores, dim=1)` on scores of shape (batch, queries, keys)
    followed by `weights @ values`, which sums each row over the keys (the last dimension); or a
    (N, K) softmax over dim 0 multiplied by a (K, D) matrix. Written with `@`, `torch.matmul`
    (heads kept as a 4-D tensor), `torch.bmm` (heads folded into the batch) or `torch.einsum`
    (`einsum('bhqk,bhkd->bhqd', attn, v)`, the weights first or second). At the first backwards
    the loss's graph is read: from each matrix product both operands are followed down through
    the operations that keep their values in place (dropout, masked_fill, reshapes, transposes
    and permutes, unsqueeze, expand: what einsum lowers to) to a softmax, the dimension the
    product sums over is mapped exactly through each of them, and compared with the one the
    softmax normalised. It points at the softmax call when the script's source has one with
    that `dim`, else at the backward. The same invariant for vectors normalised before a
    similarity product: `F.normalize(z, dim=0)` (or `z / z.norm(dim=0, keepdim=True)`, or the
    square root of a sum of squares) on (batch, features) embeddings followed by `z1 @ z2.T`,
    which sums over the features, as in a contrastive (InfoNCE, SimCLR, CLIP) loss: each
    feature was scaled over the batch instead of each embedding over its features (also behind
    a learned temperature, `logit_scale.exp() * z1 @ z2.T`). It points at the first
    normalize / norm call with that `dim`. And for cosine similarities, where both operands of
    the product (`@`, `matmul`, `bmm`, `F.linear` with or without a bias) are divided by their
    own L2 norm, a weight included: an operand normalised over another axis than the product
    sums, whichever axis that is (ArcFace's `F.linear(F.normalize(x), F.normalize(W, dim=0))`
    with W laid out (classes, features); prototypes stored (features, classes) and normalised
    over the classes before `z @ P`). It then points at the normalisation of that weight (the
    call that names it, when one does).

    ## Why is this bad?
    Attention averages the values with weights that sum to 1 over the keys. Normalised over the
    queries instead, each query's weights sum to anything, and each one depends on the scores
    of every other query: the output's scale drifts with the sequence length, a query cannot
    attend to one key alone, and padding or the order of the queries leaks into every output.
    The model trains, the loss falls, and it ends up worse than one with the right axis. No
    error: the shapes agree either way when the two axes have the same length. Embeddings
    normalised over the batch are no unit vectors: their products are no cosine similarities,
    each sample's embedding depends on the others in its batch, and the temperature no longer
    means what it was tuned for.

    ## Example
    ```python
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    weights = F.softmax(scores, dim=1)
    out = weights @ v
    ```

    ## Use instead
    ```python
    weights = F.softmax(scores, dim=-1)  # over the keys, the axis `@ v` sums
    out = weights @ v
    ```

    ## Stays silent on
    A softmax over the axis the product sums, however the product is written (attention over
    the keys with `@`, 4-D `matmul`, folded-head `bmm` or einsum; attention pooling
    `softmax(s, dim=1).transpose(1, 2) @ h` or `einsum('bt,btd->bd', softmax(s, dim=1), h)`; a
    mixture-of-experts gate `einsum('be,bed->bd', softmax(g, -1), experts)`; scores laid out
    (keys, queries) and normalised over the keys); a softmax over the last axis summed over
    another one, an assignment used on purpose (DiffPool's `s.transpose(1, 2) @ x`, a
    mixture-of-experts dispatch `einsum('ne,nd->ed', gates, x)`); weights renormalised after the
    softmax (slot attention's softmax over the slots, then a division by the sum over the
    inputs); a Sinkhorn step whose scores were normalised over the summed axis just before; a
    softmax whose output is multiplied elementwise and summed rather than fed to a matrix
    product; the axis summed of length 1; `scaled_dot_product_attention` and
    `nn.MultiheadAttention` (they normalise the right axis themselves). Normalisations over the
    axis the product sums: `F.normalize(z, dim=1)` or `dim=-1` before `z1 @ z2.T`, a cosine
    classifier (`F.normalize` of the features and of the weight rows, dim=1), Barlow Twins and
    VICReg (each feature standardised over the batch, then `z1.T @ z2` sums the batch), columns
    L2-normalised over the batch then `z.T @ z`; standardisations (`(z - mean) / std`,
    BatchNorm) whatever the axis; a parameter normalised over another axis when the other
    operand is no unit vector (weight normalisation applied to raw features) or with another
    norm than L2 (`F.normalize(M, p=1, dim=1)`: a stochastic mixing matrix); a (features,
    classes) weight normalised over dim 0 for `z @ W`;
    `F.cosine_similarity`. A softmax or normalisation over dim 0 that `samples-mixed-in-batch`
    reports (the batch mixed in the model's forward) is left to it. Not told apart: the same
    bug in a (keys, queries) layout (a softmax over the last axis, the queries, summed over the
    keys) reads as an assignment and stays silent; a single column softmax used as a transport
    plan with no row normalisation before it reads as the bug.

    """

    code = "GD248"
    slug = "softmax-wrong-axis"
    severity = Severity.WARNING
    summary = ("attention weights are normalised over another axis than the one the matmul "
               "after them sums over: each query's weights do not sum to 1")
    fix = "normalise over the axis the product sums: softmax(scores, dim=-1) before `@ values`"

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        # a softmax or normalisation over the batch is samples-mixed-in-batch's, when its
        # probe saw it in the model's forward
        mixed = [str(d.get("op") or "") for d in a.of_kind("dependency") if d.get("mixed")]
        batch_softmax = any(op.startswith("Softmax") for op in mixed)
        batch_norm = any(op.startswith(("LinalgVectorNorm", "Norm", "Div")) for op in mixed)
        for e in a.of_kind("softmax_axis"):
            if e.get("op") == "normalize":
                yield from self._normalized(a, e, stepped, batch_norm)
                continue
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids:
                continue  # nothing trained makes the scores
            shape = list(e.get("shape") or ())
            dim, summed = e.get("dim"), e.get("summed")
            if not shape or dim is None or summed is None:
                continue
            ndim = len(shape)
            if dim == 0 and batch_softmax:
                continue
            loc = e.loc
            line = softmax_line(a, loc.path, dim, ndim) if loc is not None else None
            if line is not None:
                loc = Location(loc.path, line[0])
            written = f"`{line[1]}`" if line is not None else "a softmax"
            last = summed == ndim - 1
            yield self.finding(
                f"{written} normalises the attention weights of shape {tuple(shape)} over "
                f"dimension {dim} (length {shape[dim]}), but the matrix product after it sums "
                f"them over dimension {summed}{' (the last: the keys)' if last else ''} "
                f"(length {shape[summed]}): each row of weights does not sum to 1, and each "
                f"weight depends on the scores of the other rows. The model trains, to a worse "
                f"fit than with the right axis",
                loc, step=a.next_step_number(e.seq),
                evidence={"shape": shape, "dim": dim, "summed": summed, "params": pids[:16]},
                fix=(f"normalise over dimension {summed}: softmax(..., dim={-1 if last else summed})"
                     f" (the axis the product sums over)"))

    def _normalized(self, a, e, stepped, batch_norm):
        """A vector normalisation (``F.normalize``, a division by a norm) over another axis than
        the one the similarity product after it sums: each row is not a unit vector."""
        pids = [pid for pid in e.get("params") or () if pid in stepped]
        shape = list(e.get("shape") or ())
        dim, summed = e.get("dim"), e.get("summed")
        if not pids or not shape or dim is None or summed is None:
            return
        ndim = len(shape)
        if dim == 0 and batch_norm:
            return
        param = e.get("param")
        named = a.param_name(param).rsplit(".", 1)[-1].split(" ")[0] if param is not None else None
        loc = e.loc
        line = normalize_line(a, loc.path, dim, ndim, named) if loc is not None else None
        if line is not None:
            loc = Location(loc.path, line[0])
        written = f"`{line[1]}`" if line is not None else "a division by a norm"
        last = summed == ndim - 1
        if e.get("cosine"):
            what = f"the weight {a.param_name(param)}" if param is not None else "a tensor"
            yield self.finding(
                f"{written} normalises {what} of shape {tuple(shape)} over dimension {dim} "
                f"(length {shape[dim]}), but the cosine-similarity product it feeds (both "
                f"operands divided by their norm) sums over dimension {summed} (length "
                f"{shape[summed]}): the vectors compared along dimension {summed} are not unit "
                f"vectors, so the products are no cosines. Vectors that happen to be longer "
                f"score higher whatever their angle, and a scale or margin tuned for cosines in "
                f"[-1, 1] (ArcFace, CosFace, a contrastive temperature) means something else. "
                f"The loss still trains, to a worse model",
                loc, step=a.next_step_number(e.seq),
                evidence={"shape": shape, "dim": dim, "summed": summed, "op": "normalize",
                          "cosine": True, "param": param, "params": pids[:16]},
                fix=(f"normalise over dimension {summed}, the axis the product sums over: "
                     + (f"`{fixed}`" if line is not None and (fixed := _with_dim(
                         line[1], -1 if last else summed)) else
                        f"dim={-1 if last else summed}")))
            return
        over = " (the batch: each feature is scaled across the samples)" if dim == 0 else ""
        yield self.finding(
            f"{written} normalises a tensor of shape {tuple(shape)} over dimension {dim} "
            f"(length {shape[dim]}){over}, but the matrix product after it sums over dimension "
            f"{summed}{' (the last: the features)' if last else ''} (length {shape[summed]}): "
            f"the vectors it compares are not unit vectors, so the products are no cosine "
            f"similarities, and each sample's embedding depends on the other samples of the "
            f"batch. The loss trains, to worse embeddings",
            loc, step=a.next_step_number(e.seq),
            evidence={"shape": shape, "dim": dim, "summed": summed, "op": "normalize",
                      "params": pids[:16]},
            fix=(f"normalise over dimension {summed}, the axis the product sums over: "
                 f"F.normalize(z, dim={-1 if last else summed})"))
