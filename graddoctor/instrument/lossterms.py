"""Loss terms that make a loss unbounded below: ``-c * exp(v)`` or ``-c * v**2`` (c > 0) of a
quantity ``v`` the optimizer can move without bound.

A VAE's KL term with its sign flipped (``kld = 0.5 * sum(1 + logvar - mu**2 - logvar.exp())``
added to the loss, or the right ``kld`` subtracted: ``loss = recon - kld``) holds ``-exp(logvar)``
and ``-mu**2``: minimising it sends ``logvar`` and ``mu`` to infinity. The loss goes down
"nicely" (towards minus infinity) until it overflows. A Gaussian log-likelihood written with
the wrong sign (``loss = ((x - mu)**2).mean()`` negated) is the same thing.

At a backward (the first ``_LOOKED`` of each backward line; ``describe_loss``) the loss's graph is
walked from its root through the nodes that keep a term's sign known: sums and means, views,
negations, additions and subtractions, products and quotients by a constant (a Python number,
or a 0-d CPU tensor). A product of two computed tensors, a log, a clamp or any other node ends
the walk there: nothing is said below it. An ``ExpBackward0`` reached with a negative sign, or a
``PowBackward0`` of an even integer exponent (or ``x * x``), is such a term when its argument
needs a gradient, reaches a tracked tensor (a parameter), and is no bounded op's output (a
clamp, tanh, sigmoid, softmax, log-softmax: then the term is bounded), and, for an exp, no
entropy written out (``-sum(p * log(p + eps))``, bounded above on the log's domain whatever
the sign of ``p``: a codebook's perplexity, masked or not). So is a ``MaximumBackward0`` reached with a positive sign (a
``MinimumBackward0`` with a negative one) whose two inputs are products of one computed tensor
by factors without a gradient, all of one sign: a line both ways (a pinball loss written
``max(q * e, (1 - q) * e)``). So is a log-softmax written out with a positive sign: a
``LogsumexpBackward0`` reached with a negative sign whose input a gather or index node reached
with a positive sign picks from (``x.gather(1, a) - logsumexp(x, 1)`` minimised: a CQL term or
a cross-entropy with its sign flipped), and a gather of a ``log_softmax`` reached with a
positive sign that the loss reads nowhere else (a log-likelihood minimised; the k3 KL
estimator's ``+logp`` is balanced by its ``exp(ref - logp)``). A ``loss_unbounded`` aside
event names it, once per backward line.

The same walk, started below the loss's increasing functions (``sqrt``, ``log``), finds a variance
written out with a plus (term ``variance_added``; variance-sign-flipped): the mean of ``x``'s
squares and the square of ``x``'s mean (``x ** 2``, ``x.pow(2)``, ``x * x``; a mean or a sum) of
one node ``x`` reached with the same positive sign — the scale-invariant log loss
``(d ** 2).mean() + lam * d.mean() ** 2``, which is no longer scale-invariant: it is only told
when the loss holds no unbounded term.

The same reader, at the same backwards, searches the loss's graph (``_PRODUCT_NODES`` nodes,
breadth first) for a ``BmmBackward0`` or ``MmBackward0`` whose two saved operands are one tensor
seen the same way (the same storage, offset, shape and strides: a transposed view has other
strides) of square matrices, read by a node that compares it with a constant: a subtraction or
addition with one computed input (``A @ A - eye``) or a regression loss (``mse_loss(A @ A,
eye)``): an orthogonality penalty ``||A A^T - I||`` written without the transpose
(orthogonality-without-transpose). One ``self_product_offset`` aside event per backward line
(loc: the backward; the rule finds the product's line in the source).

Cost: a walk of at most ``_NODES`` nodes of the loss's top (the terms' linear part), and below
each term found a walk to its leaves; at the first backwards of a line only.
"""

from __future__ import annotations

import sys

import torch

from .. import events as ev
from .graphpaths import nodes_below, reached, saved, saved_dims
from .lossfactor import python_number
from .recorder import Recorder

_LOOKED = 3  # backwards of each line looked at
_LINES = 16  # backward lines looked at, at most
_NODES = 256  # nodes of the linear top walked
_LEAF_NODES = 20000  # nodes walked below a term to its leaves
_KEEP = ("View", "Reshape", "UnsafeView", "Squeeze", "Unsqueeze", "Permute", "Transpose",
         "TBackward", "Clone", "ToCopy", "Expand", "Alias", "Contiguous", "SumBackward",
         "MeanBackward", "Select", "Slice", "Index", "Cat", "Stack", "Split", "Unbind", "Narrow")
# ops whose output is bounded above (exp or square of it stays bounded below once negated)
_BOUNDED = ("Clamp", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "LogSigmoid", "Hardtanh", "Sin",
            "Cos", "Erf", "Cumprod")


def _sign_of(constant) -> float | None:
    """The sign of a saved constant (a 0-d CPU tensor, or a number), else None."""
    if isinstance(constant, (int, float)):
        value = float(constant)
    elif isinstance(constant, torch.Tensor) and constant.dim() == 0 and constant.device.type == "cpu":
        value = float(constant.item())
    else:
        return None
    return 1.0 if value > 0 else -1.0 if value < 0 else None


def _children(node) -> list[tuple[int, object]]:
    return [(i, child) for i, (child, _) in enumerate(node.next_functions) if child is not None]


# ops whose output is never negative
_NONNEG = ("Abs", "Norm", "LinalgVectorNorm", "Cdist", "Exp", "Sqrt", "Relu", "Softplus", "Sigmoid",
           "Softmax")

# torch's losses that are never negative (with targets in their domain); nll_loss only of a
# log_softmax
_NONNEG_LOSSES = ("BinaryCrossEntropy", "MseLoss", "L1Loss", "SmoothL1Loss", "HuberLoss",
                  "SoftMarginLoss")


def _signed(node, depth: int = 0) -> float | None:
    """+1 when the node's output is never negative, -1 when never positive, None when the graph
    does not say: even powers, squares, norms and distances, negated or scaled by constants
    (``-cdist(a, b).pow(2) / 2``: an RBF kernel's exponent, at most 0)."""
    if node is None or depth > 12:
        return None
    name = type(node).__name__
    children = _children(node)
    if name.startswith(_NONNEG) or name.startswith(_NONNEG_LOSSES):
        return 1.0
    if name.startswith("NllLoss") and children and type(children[0][1]).__name__.startswith("LogSoftmax"):
        return 1.0  # cross_entropy: the negative log of a probability
    if name == "PowBackward0" and len(children) == 1:
        exponent = saved(node, "_saved_exponent")
        if isinstance(exponent, (int, float)) and float(exponent).is_integer() and int(exponent) % 2 == 0:
            return 1.0
        return _signed(children[0][1], depth + 1) if _signed(children[0][1], depth + 1) == 1.0 else None
    if name == "MulBackward0" and len(children) == 2 and children[0][1] is children[1][1]:
        return 1.0  # x * x
    if name == "NegBackward0" and len(children) == 1:
        inner = _signed(children[0][1], depth + 1)
        return -inner if inner is not None else None
    if name in ("MulBackward0", "DivBackward0") and len(children) == 1:
        position = children[0][0]
        constant = saved(node, "_saved_other" if position == 0 else "_saved_self")
        if name == "DivBackward0" and position != 0:
            return None  # a constant divided by the tensor: its sign is not followed
        sign = _sign_of(constant)
        inner = _signed(children[0][1], depth + 1)
        return sign * inner if sign is not None and inner is not None else None
    if name.startswith(_KEEP) and len(children) == 1:
        return _signed(children[0][1], depth + 1)  # views, sums and means keep the sign
    return None


def _bounded(node) -> bool:
    for _ in range(8):  # past views
        if node is None:
            return False
        name = type(node).__name__
        if name.startswith(_BOUNDED):
            return True
        if not name.startswith(_KEEP[:13]):
            return False
        children = _children(node)
        if len(children) != 1:
            return False
        node = children[0][1]
    return False


_ENTROPY_PASS = ("SumBackward", "MeanBackward", "View", "Reshape", "UnsafeView", "Squeeze", "Unsqueeze",
         "Select", "Slice", "Index", "Clone", "Expand")


def _entropy_form(node) -> bool:
    """Is ``node`` ``-sum(x * log(x))`` (or ``log(x + eps)``, ``torch.xlogy(x, x)``,
    ``torch.special.entr(x)``), scaled by positive constants: an entropy written out (wav2vec 2.0's codebook perplexity
    ``exp(-sum(p * log(p + 1e-7)))``)? Each term ``-x log x`` is at most 1/e, so the value is
    bounded above and its exp stays bounded however it is signed."""
    sign = 1.0
    for _ in range(16):
        if node is None:
            return False
        name = type(node).__name__
        children = _children(node)
        if name == "NegBackward0" and len(children) == 1:
            sign, node = -sign, children[0][1]
        elif name in ("MulBackward0", "DivBackward0") and len(children) == 1:
            index, child = children[0]
            if name == "DivBackward0" and index != 0:
                return False
            factor = _sign_of(saved(node, "_saved_other" if index == 0 else "_saved_self"))
            if factor is None:
                return False
            sign, node = sign * factor, child
        elif name == "MulBackward0" and len(children) == 2:
            return sign < 0 and _x_log_x(children[0][1], children[1][1])
        elif name.startswith("Xlogy") and len(children) == 2:
            return sign < 0 and _same_or_shifted(children[0][1], children[1][1])  # xlogy(p, p)
        elif name.startswith("SpecialEntr") and len(children) == 1:
            return sign > 0  # torch.special.entr(p) is -p * log(p) already
        elif name.startswith(_ENTROPY_PASS) and len(children) == 1:
            node = children[0][1]
        else:
            return False
    return False


def _x_log_x(a, b) -> bool:
    """``x * log(x)`` or ``x * log(x + c)`` (a constant added: an eps), in either order. The
    log's own domain bounds ``-x * log(x + c)`` above (x > -c; for x < 0 the term is negative
    when c < 1), so the sign of ``x`` need not be known: a probability masked by
    ``torch.where(mask, p, 0)`` before its marginal is taken (wav2vec 2.0's perplexity over the
    masked steps) is an entropy as much as ``p`` itself."""
    for x, log in ((a, b), (b, a)):
        if type(log).__name__ != "LogBackward0":
            continue
        inner = _children(log)
        if len(inner) == 1 and _same_or_shifted(x, inner[0][1]):
            return True
    return False


def _same_or_shifted(x, arg) -> bool:
    """``arg`` is ``x``, or ``x + c`` with a constant ``c`` (an eps)."""
    if type(arg).__name__ == "AddBackward0" and len(_children(arg)) == 1:
        arg = _children(arg)[0][1]
    return arg is x


def signed_walk(root, limit: int, visit) -> None:
    """Walk the loss's linear top from ``root``, each node with its sign (+1: minimised, -1:
    maximised): negations, views, sums and differences (and their ``alpha``), and products or
    quotients by a constant pass the sign on; anything else ends the walk there. ``visit(node,
    sign, name, children)`` sees each node first; True: it took the node (nothing below it is
    walked). Shared by the unbounded-loss terms here and entropysign.py's signed entropies."""
    stack = [(root, 1.0)]
    seen: set = set()
    while stack:
        node, sign = stack.pop()
        if node is None or (node, sign) in seen:
            continue
        seen.add((node, sign))
        if len(seen) > limit:
            break
        name = type(node).__name__
        children = _children(node)
        if visit(node, sign, name, children):
            continue
        if name == "NegBackward0":
            stack.extend((child, -sign) for _, child in children)
        elif name.startswith(_KEEP):
            stack.extend((child, sign) for _, child in children)
        elif name in ("AddBackward0", "SubBackward0"):
            alpha = _sign_of(getattr(node, "_saved_alpha", 1))
            if alpha is None:
                continue
            for index, child in children:
                flip = -alpha if (index == 1 and name == "SubBackward0") else (alpha if index == 1 else 1.0)
                stack.append((child, sign * flip))
        elif name in ("AddBackward1", "SubBackward1"):  # a tensor plus or minus a number
            stack.extend((child, sign) for _, child in children)
        elif name == "RsubBackward1":  # a number minus a tensor
            stack.extend((child, -sign) for _, child in children)
        elif name in ("MulBackward0", "DivBackward0"):
            if len(children) != 1:
                continue  # a product of two computed tensors: its sign is not known
            index, child = children[0]
            if name == "DivBackward0" and index != 0:
                continue
            factor = _sign_of(saved(node, "_saved_other" if index == 0 else "_saved_self"))
            if factor is not None:
                stack.append((child, sign * factor))
        elif name in ("MulBackward1", "DivBackward1"):  # by a Python number (some builds)
            factor = _sign_of(saved(node, "_saved_other"))
            if factor is not None:
                stack.extend((child, sign * factor) for _, child in children)


def _factor_sign(value) -> float | None:
    """The one sign of every element of a saved factor (a number or a small CPU tensor)."""
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and 0 < value.numel() <= 4096 \
            and not value.is_complex():
        if bool((value > 0).all()):
            return 1.0
        if bool((value < 0).all()):
            return -1.0
        return None
    return _sign_of(value)


def _same_signed_multiples(children):
    """For a binary max's (or min's) two inputs: the node both are a multiple of (``q * e`` and
    ``(1 - q) * e``: products of one computed tensor by factors without a gradient) when every
    factor has one and the same sign, else None. A pinball loss takes the max of ``q * e`` and
    ``(q - 1) * e``: factors of opposite signs, a V bounded below; with one sign the max is a
    line in each direction of ``e``, so the loss falls without end as ``e`` grows the other way."""
    if len(children) != 2:
        return None
    shared, signs = None, set()
    for _, child in children:
        if type(child).__name__ != "MulBackward0":
            return None
        inner = _children(child)
        if len(inner) != 1:
            return None
        index, e = inner[0]
        if shared is not None and e is not shared:
            return None
        shared = e
        factor = _factor_sign(saved(child, "_saved_other" if index == 0 else "_saved_self"))
        if factor is None:
            return None
        signs.add(factor)
    return shared if len(signs) == 1 else None


_WEIGHT_ELEMENTS = 1 << 22  # a weight tensor larger than this is not read


def _some_negative(weights, sign: float) -> bool:
    """Whether a weight tensor (not a 0-d constant: those pass the walk on) has an entry whose
    sign, times the walk's ``sign``, is negative."""
    if not isinstance(weights, torch.Tensor) or weights.dim() == 0 or weights.device.type != "cpu" \
            or weights.is_complex() or not weights.is_floating_point() or weights.numel() > _WEIGHT_ELEMENTS:
        return False
    return bool((weights * sign < 0).any())


def _past_reductions(node):
    """Past sums, means and views (``(err ** 2).sum(-1) * w``), a few nodes down."""
    for _ in range(6):
        children = _children(node)
        if not type(node).__name__.startswith(_KEEP) or len(children) != 1:
            return node
        node = children[0][1]
    return node


def negative_terms(root, limit: int = _NODES) -> list[tuple[str, object, object]]:
    """``[(term, node, argument node)]``: the exp and even-power terms the loss holds with a
    negative sign (see the module's docs)."""
    found = []
    squared: set = set()  # the tensors whose squares the loss holds with a positive sign
    picked: dict = {}  # a tensor indexed at one entry a row with a positive sign -> that node
    gathered: list = []  # (gather node, log_softmax node) reached with a positive sign
    spread: list = []  # (logsumexp node, its input) reached with a negative sign

    def visit(node, sign, name, children) -> bool:
        if name == "MulBackward0" and len(children) == 1 and sign != 0:
            # a square scaled by a weight tensor with an entry of the other sign (a latitude
            # weight cos(lat) of degrees, a sign mask): those entries' errors are maximised
            index, child = children[0]
            weights = saved(node, "_saved_other" if index == 0 else "_saved_self")
            argument = _square_of(_past_reductions(child))
            if argument is not None and not _bounded(argument) and _some_negative(weights, sign):
                found.append(("weighted_square", node, argument))
            return False
        if sign > 0 and name in ("GatherBackward0", "IndexBackward0") and children:
            source = _past_views(children[0][1])
            if name == "GatherBackward0" and source is not None \
                    and type(source).__name__.startswith("LogSoftmaxBackward"):
                gathered.append((node, source))  # log_softmax(x).gather(1, y) minimised
                return True
            picked.setdefault(source, node)
            return False
        if sign < 0 and name == "LogsumexpBackward0" and len(children) == 1:
            spread.append((node, _past_views(children[0][1])))
            return True
        if (name == "MaximumBackward0" and sign > 0) or (name == "MinimumBackward0" and sign < 0):
            shared = _same_signed_multiples(children)
            if shared is not None and not _bounded(shared):
                found.append(("linear", node, shared))  # max(q * e, (1 - q) * e)
            return False
        if sign > 0:
            whole = _square_of(node)
            if whole is not None:
                squared.add(whole)
            return False
        if sign == 0:
            return False
        if name == "MulBackward0" and len(children) == 2 and children[0][1] is children[1][1]:
            if not _bounded(children[0][1]):
                found.append(("square", node, children[0][1]))  # x * x
        elif name == "ExpBackward0" and len(children) == 1:
            # an exponent never positive (an RBF kernel's -d**2 / 2): the exp stays in (0, 1]
            # or an entropy written out (-sum p log p is at most n/e): its exp is bounded too
            if (not _bounded(children[0][1]) and _signed(children[0][1]) != -1.0
                    and not _entropy_form(children[0][1])):
                found.append(("exp", node, children[0][1]))
        elif name == "PowBackward0" and len(children) == 1:
            exponent = saved(node, "_saved_exponent")
            if (isinstance(exponent, (int, float)) and exponent > 0 and float(exponent).is_integer()
                    and int(exponent) % 2 == 0 and not _bounded(children[0][1])):
                found.append(("square", node, children[0][1]))
        return False  # none of these is walked below: signed_walk stops at them itself

    signed_walk(root, limit, visit)
    # the squares of a part of a tensor (its diagonal, some rows) subtracted from the squares of
    # the whole it is taken from: what is left is the squares of the rest, never negative (the
    # off-diagonal covariance of VICReg and Barlow Twins, written total minus diagonal)
    found = [f for f in found if not (f[0] == "square" and _part_of(f[2]) in squared)]
    # x[a] - logsumexp(x): a log-softmax written out, minimised (a cross-entropy with its sign
    # flipped, a CQL regulariser subtracted the wrong way round): unbounded below
    found.extend(("logsumexp", node, source) for node, source in spread
                 if source is not None and source in picked)
    if gathered:
        # a log-probability the loss also uses elsewhere may be balanced there (the k3 KL
        # estimator exp(ref - logp) - (ref - logp) - 1 adds +logp): only one used once counts
        shared = _used_twice(root, [node for node, _ in gathered])
        found.extend(("log_softmax", node, source) for node, source in gathered if node not in shared)
    return found


_PARTS = ("DiagonalBackward", "SliceBackward", "SelectBackward", "IndexBackward", "NarrowBackward")


def _part_of(node):
    """The tensor (past views) that ``node`` takes a part of (its diagonal, a slice, some rows),
    else None."""
    node = _past_views(node)
    if node is None or not type(node).__name__.startswith(_PARTS):
        return None
    children = _children(node)
    return _past_views(children[0][1]) if len(children) == 1 else None


_MONOTONE = ("SqrtBackward", "LogBackward", "Log1pBackward")  # increasing: keep a term's sign


def _square_of(node):
    """``x`` for ``x ** 2``, ``x.pow(2)``, ``x * x`` (past views), else None."""
    name = type(node).__name__
    children = _children(node)
    if name == "PowBackward0" and len(children) == 1 and saved(node, "_saved_exponent") == 2:
        return _past_views(children[0][1])
    if name == "MulBackward0" and len(children) == 2 and children[0][1] is children[1][1]:
        return _past_views(children[0][1])
    return None


def _mean_of(node):
    """``x`` for a mean or sum of ``x`` (past views), else None."""
    children = _children(node)
    if type(node).__name__.startswith(("MeanBackward", "SumBackward")) and len(children) == 1:
        return _past_views(children[0][1])
    return None


def _past_scale(node):
    """Past products and quotients by a constant (``x.sum() / n``)."""
    for _ in range(4):
        name = type(node).__name__
        children = _children(node)
        if name not in ("MulBackward0", "DivBackward0", "MulBackward1", "DivBackward1") or len(children) != 1 \
                or (name.startswith("Div") and children[0][0] != 0):
            return node
        node = children[0][1]
    return node


def _reduced_count(node):
    """How many values a mean or sum ``node`` returns (one for a full reduction, the batch's
    size for a per-sample one), or None when its saved sizes are not readable."""
    sizes = saved(node, "_saved_self_sym_sizes")
    if sizes is None:
        return None
    sizes = [int(n) for n in sizes]
    dims = saved_dims(node)
    if dims is None or dims == ():
        return 1
    rank = len(sizes)
    kept = list(sizes)
    for d in dims if isinstance(dims, tuple) else (dims,):
        if -rank <= d < rank:
            kept[d] = 1
    count = 1
    for n in kept:
        count *= n
    return count


def variance_added(root, limit: int = _NODES):
    """``(node, x)``: the mean of ``x``'s squares and the square of ``x``'s mean in the loss's
    linear top with one sign — a variance E[x²] - λ·E[x]² written with a plus (the
    scale-invariant log loss of depth estimation with its sign flipped), or None. The walk starts
    below increasing functions at the root (the loss's ``sqrt``, ``log``)."""
    for _ in range(8):
        name = type(root).__name__
        children = _children(root)
        if root is None or len(children) != 1:
            break
        if name.startswith(_MONOTONE) or name.startswith(_KEEP[:12]):
            root = children[0][1]
            continue
        if name in ("MulBackward0", "DivBackward0") and (name == "MulBackward0" or children[0][0] == 0) \
                and _sign_of(saved(root, "_saved_other" if children[0][0] == 0 else "_saved_self")) == 1.0:
            root = children[0][1]
            continue
        break
    # the two moments count as one variance only when they average over the same values: as
    # many results each (both over the whole tensor, or both per sample); the mean of the
    # squares over everything plus each feature's mean squared is a penalty on two moments
    squares: dict = {}  # (x, results of the mean) -> (signs of mean(x ** 2), the node)
    means: dict = {}  # (x, results of the mean) -> (signs of mean(x) ** 2, the node)

    def visit(node, sign, name, children) -> bool:
        inner = _mean_of(node)
        if inner is not None:
            x = _square_of(inner)
            if x is not None:
                squares.setdefault((x, _reduced_count(node)), (set(), node))[0].add(sign)
        inner = _square_of(node)
        if inner is not None:
            reduction = _past_scale(inner)
            x = _mean_of(reduction)
            if x is not None:
                means.setdefault((x, _reduced_count(reduction)), (set(), node))[0].add(sign)
        return False

    signed_walk(root, limit, visit)
    for key, (signs, node) in means.items():
        if key in squares and signs == squares[key][0] == {1.0}:
            return node, key[0]
    return None


def _used_twice(root, nodes, limit: int = 4096) -> set:
    """The ``nodes`` that the graph under ``root`` (``limit`` nodes walked) reads more than once,
    counting the uses of the views made of them as theirs."""
    parents: dict = {}
    stack, seen = [root], set()
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for child, _ in node.next_functions:
            if child is not None:
                parents.setdefault(child, []).append(node)
                stack.append(child)
    views = ("View", "Reshape", "UnsafeView", "Squeeze", "Unsqueeze", "Clone", "Expand", "Alias")
    out = set()
    for node in nodes:
        current = node
        for _ in range(8):
            users = parents.get(current, [])
            if len(users) == 1 and type(users[0]).__name__.startswith(views):
                current = users[0]
                continue
            break
        if len(parents.get(current, [])) > 1:
            out.add(node)
    return out


def _past_views(node):
    for _ in range(8):
        if node is None or not type(node).__name__.startswith(
                ("View", "Reshape", "UnsafeView", "Squeeze", "Unsqueeze", "Clone", "Expand", "Alias")):
            return node
        children = _children(node)
        if len(children) != 1:
            return node
        node = children[0][1]
    return node



# -- a matrix times itself held to a constant (orthogonality-without-transpose) ---------------
_PRODUCT_NODES = 2048  # graph nodes searched for a self product, at most
_COMPARE = ("SubBackward0", "AddBackward0", "RsubBackward1", "SubBackward1", "AddBackward1",
            "MseLossBackward", "L1LossBackward", "SmoothL1LossBackward", "HuberLossBackward")


def _same_view(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.data_ptr() == b.data_ptr() and a.shape == b.shape
            and a.stride() == b.stride() and a.dim() >= 2 and a.shape[-1] == a.shape[-2])


def _symmetric(a) -> bool:
    """Whether every matrix of ``a`` equals its transpose: then ``A @ A`` is ``A @ A.T``."""
    with torch.no_grad():
        return bool(torch.allclose(a, a.transpose(-1, -2), rtol=1e-5, atol=1e-6))


def self_product(node) -> bool:
    """Whether ``node`` is a matrix product of one tensor with itself, the same view twice, of
    matrices that are not symmetric (a symmetric matrix times itself is its Gram matrix)."""
    name = type(node).__name__
    if name not in ("BmmBackward0", "MmBackward0"):
        return False
    a = saved(node, "_saved_self")
    return _same_view(a, saved(node, "_saved_mat2")) and not _symmetric(a)


def offset_self_products(root, limit: int = _PRODUCT_NODES) -> list:
    """The self products (``A @ A``) below ``root`` that a node compares with a constant."""
    found = []
    nodes, _ = nodes_below([root], limit)
    for node in nodes:
        name = type(node).__name__
        if not name.startswith(_COMPARE):
            continue
        children = _children(node)
        if len(children) != 1:
            continue  # two computed inputs: not a comparison with a constant
        product = _past_views(children[0][1])
        if product is not None and self_product(product) and product not in found:
            found.append(product)
    return found


class PerLine:
    """The backwards a watcher that reads the loss's graph looks at: the first ``per_line`` of
    each backward line (a phase that starts later has a line of its own), ``lines`` lines at
    most."""

    __slots__ = ("per_line", "lines", "seen", "_filled", "exhausted")

    def __init__(self, per_line: int, lines: int):
        self.per_line, self.lines = per_line, lines
        self.seen: dict = {}  # backward location -> backwards looked at
        self._filled = 0  # lines of ``seen`` looked at ``per_line`` times
        # No backward will be admitted again (read before any other work, at every backward of
        # a run: an attribute, set where it changes, not a property's frame per reader)
        self.exhausted = lines <= 0

    def admit(self, loc) -> bool:
        """Whether the backward at ``loc`` is looked at (counted when it is). A ``loc`` turned
        away once is turned away for good (counts only grow, lines are never forgotten)."""
        seen = self.seen.get(loc, 0)
        if seen >= self.per_line or (seen == 0 and len(self.seen) >= self.lines):
            return False
        self.seen[loc] = seen + 1
        if seen + 1 == self.per_line:
            self._filled += 1
        self.exhausted = len(self.seen) >= self.lines and self._filled == len(self.seen)
        return True


def loss_roots(tensors) -> list:
    """The autograd nodes of the tensors a backward was given (one or several; those without a
    graph left out)."""
    items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
    return [t.grad_fn for t in items if isinstance(t, torch.Tensor) and t.grad_fn is not None]


def loss_root(tensors):
    """The autograd node of the one loss a backward was given (``loss.backward()``,
    ``torch.autograd.backward([loss])``), or None for several tensors or one without a graph."""
    if isinstance(tensors, (list, tuple)):
        if len(tensors) != 1:
            return None
        tensors = tensors[0]
    return getattr(tensors, "grad_fn", None) if isinstance(tensors, torch.Tensor) else None

class LossGraphReader:
    """A DESCRIBE_LOSS subscriber that reads the loss's graph at the first backwards of each
    backward line (``PerLine``) until it has told that line: ``_judge(root, loc)`` does the
    reading and adds ``loc`` to ``_done`` once it emits. Its own failures are internal errors
    named ``label``."""

    label = "loss graph"
    per_line, lines = _LOOKED, _LINES

    def __init__(self, rec: Recorder):
        self.rec = rec
        self._lines = PerLine(self.per_line, self.lines)
        self._done: set = set()
        # id of a backward's Location -> that Location, for the lines this reader will never
        # look at again (told, or turned away by ``_lines``): a run's later backwards are
        # turned away by one C lookup, without hashing the Location (a dataclass's Python
        # ``__hash__``). The finder hands out one Location object per line, kept alive here.
        self._shut: dict = {}

    def describe_loss(self, tensors) -> dict:
        loc = self.rec.here()  # looked up once per backward for all the describers
        if self._shut.get(id(loc)) is loc:
            return {}
        lines = self._lines
        if lines.exhausted:
            return {}
        root = loss_root(tensors)
        if root is None:
            return {}
        try:
            if loc in self._done or not lines.admit(loc):
                self._shut[id(loc)] = loc
                return {}
            self._judge(root, loc)
        except Exception as exc:
            self.rec.internal_error(self.label, exc)
        return {}

    def _judge(self, root, loc) -> None:
        raise NotImplementedError


class LossTermWatcher(LossGraphReader):
    label = "loss_unbounded"

    def __init__(self, rec: Recorder):
        super().__init__(rec)
        self._products_told: set = set()

    def _judge(self, root, loc) -> None:
        self._self_products(root, loc)
        terms = negative_terms(root)
        if not terms:
            added = variance_added(root)
            terms = [("variance_added", added[0], added[1])] if added is not None else []
        if not terms:
            return
        tensors = self.rec.tensors
        for term, node, argument in terms:
            common = reached(argument, _LEAF_NODES, truncate=True)[1]
            pids = sorted(pid for i in common
                          if (pid := tensors.number.get(i)) is not None and id(tensors.refs[pid]()) == i)
            if not pids:
                continue  # data, or tensors graddoctor does not track
            self._done.add(loc)
            self.rec.emit_aside(ev.loss_unbounded(term=term, op=type(node).__name__, params=pids[:64],
                                                  line=getattr(loc, "line", None)), loc)
            return

    def _self_products(self, root, loc) -> None:
        """A matrix times itself held to a constant (``self_product_offset``), once per line."""
        if loc in self._products_told:
            return
        tensors = self.rec.tensors
        for product in offset_self_products(root):
            common = reached(product, _LEAF_NODES, truncate=True)[1]
            pids = sorted(pid for i in common
                          if (pid := tensors.number.get(i)) is not None and id(tensors.refs[pid]()) == i)
            if not pids:
                continue
            matrix = saved(product, "_saved_self")
            self._products_told.add(loc)
            self.rec.emit_aside(ev.self_product_offset(
                op=type(product).__name__, shape=[int(s) for s in matrix.shape[-2:]],
                params=pids[:64], line=getattr(loc, "line", None)), loc)
            return

    def install(self, patcher) -> None:
        pass


# -- loss terms weighted by 0 ----------------------------------------------------------------
_ZERO_NODES = 64  # nodes of the loss's linear top walked for terms weighted by 0
_ZERO_LINES = 16  # backward lines followed, at most
_ZERO_NAMES = 32  # names bound to 0 kept per backward line
_NAMES_READ = 2000  # a frame's variables read, at most (a module's globals can be many)
_FRAMES_READ = 3  # the user's frames read, innermost first
_SUMS = frozenset({"AddBackward0", "SubBackward0"})
_SCALES = frozenset({"MulBackward0", "DivBackward0", "NegBackward0"})


def zero_weighted_terms(root, limit: int = _ZERO_NODES) -> int:
    """How many terms of a sum in the loss are multiplied by a Python number that is exactly 0
    (``recon + 0 * kl``): walked from the root through additions, subtractions, negations and
    products or quotients by a number. A loss multiplied by 0 as a whole is not counted (no
    gradient at all: grads-always-zero tells that)."""
    found = 0
    stack = [(root, False)]
    budget = limit
    while stack and budget > 0:
        node, in_sum = stack.pop()
        budget -= 1
        name = type(node).__name__
        children = [child for child, _ in node.next_functions if child is not None]
        if name == "MulBackward0" and len(children) == 1:
            index = next(i for i, (child, _) in enumerate(node.next_functions) if child is not None)
            value = python_number(saved(node, "_saved_other" if index == 0 else "_saved_self"))
            if value == 0.0:
                found += in_sum
                continue
            if value is None:
                continue  # a weight the script computed as a tensor: its own term
            stack.append((children[0], in_sum))
        elif name in _SUMS:
            stack.extend((child, True) for child in children)
        elif name in _SCALES and len(children) == 1:
            stack.append((children[0], in_sum))
    return found


def _zero_names(frames) -> set[str]:
    """The variables bound to a number that is exactly 0 in the user's innermost frames."""
    names: set[str] = set()
    for frame in frames:
        scope = frame.f_locals
        for i, (name, value) in enumerate(scope.items()):
            if i >= _NAMES_READ or len(names) >= _ZERO_NAMES:
                break
            if type(value) in (int, float) and value == 0:
                names.add(name)
    return names


class ZeroWeightWatcher:
    """A DESCRIBE_LOSS subscriber that follows, at every backward of a line whose loss holds a
    term multiplied by 0 (``zero_weighted_terms``), the variables bound to 0 in the user's
    frames there. A ``zero_weight`` aside tells a line's first such backward (the terms, the
    names), and again each time that changes: fewer names still 0, or no term weighted by 0
    any more (terms 0, and the line is no longer followed). A line whose first backward has
    no such term is not followed."""

    def __init__(self, rec: Recorder):
        self.rec = rec
        self._names: dict = {}  # backward line -> names bound to 0 at each of its backwards
        self._off: set = set()  # lines not followed (any more)

    def describe_loss(self, tensors) -> dict:
        root = loss_root(tensors)
        if root is None:
            return {}
        try:
            loc = self.rec.here()
            if loc in self._off:
                return {}
            known = self._names.get(loc)
            if known is None and len(self._names) + len(self._off) >= _ZERO_LINES:
                return {}
            terms = zero_weighted_terms(root)
            if not terms:
                self._off.add(loc)
                if known is not None:
                    self.rec.emit_aside(ev.zero_weight(terms=0, names=[]), loc)
                return {}
            frames = []
            for frame in self.rec.finder.user_frames(sys._getframe(1)):
                frames.append(frame)
                if len(frames) >= _FRAMES_READ:
                    break
            names = _zero_names(frames)
            del frames
            if known is None or not known <= names:
                kept = names if known is None else known & names
                self._names[loc] = kept
                self.rec.emit_aside(ev.zero_weight(terms=terms, names=sorted(kept)), loc)
        except Exception as exc:
            self.rec.internal_error("zero_weight", exc)
        return {}


# -- a log-scale whose linear term and exp pull the same way ----------------------------------
_SCALE_NODES = 4000  # nodes of the loss's graph walked for the exps of a scale
_ARG_STEPS = 8  # single-input nodes followed from an exp to the log-scale it is taken of
_PASS = ("Neg", "View", "Reshape", "UnsafeView", "Squeeze", "Unsqueeze", "Expand", "Clone",
         "Alias", "Contiguous", "Permute", "Transpose", "TBackward", "ToCopy")


def _scale_argument(node):
    """(the node an exp's argument is, up to negations, views and positive constant factors;
    the sign the exp takes it with), or None."""
    sign = 1.0
    for _ in range(_ARG_STEPS):
        name = type(node).__name__
        children = _children(node)
        if len(children) != 1:
            return node, sign
        if name == "NegBackward0":
            sign = -sign
        elif name in ("MulBackward0", "DivBackward0"):
            index, child = children[0]
            if name == "DivBackward0" and index != 0:
                return node, sign
            factor = _sign_of(saved(node, "_saved_other" if index == 0 else "_saved_self"))
            if factor is None:
                return node, sign
            sign *= factor
        elif not name.startswith(_PASS):
            return node, sign
        node = children[0][1]
    return node, sign


def scale_terms(root, limit: int = _NODES) -> list[tuple[object, float, object, float]]:
    """``[(log-scale node, its sign in the loss, exp node, the sign the exp takes it with)]``:
    the values ``s`` a loss holds both linearly (``+ s.sum()``: a flow's log-det, a Gaussian's
    ``0.5 * logvar``) and through an ``exp(±s)`` below a product or a square (the scale of
    ``z = x * exp(s)``, the precision ``exp(-logvar)``), the two pulling ``s`` the same way:
    the sign in the loss times the exp's is positive. Exps the loss's linear top holds with a
    negative sign are loss-unbounded-below's and left out. Also a scale ``S`` whose ``log(S)``
    the linear top holds while ``S`` multiplies (or divides) another computed tensor, or while
    the linear top holds a positive power of ``S`` with the log's sign (a Gaussian KL's
    ``-log(sigma) + sigma ** 2 / 2`` written ``+log(sigma)``: the node returned for the exp is
    that power's)."""
    linear: dict = {}  # node -> the sign the linear top holds it with (None: both)

    def visit(node, sign, name, children) -> bool:
        known = linear.get(node, sign)
        linear[node] = sign if known == sign else None
        return False

    signed_walk(root, limit, visit)
    exps = []
    factors: dict = {}  # node -> the signs it scales a product with (+1 a factor, -1 a divisor)
    divided: set = set()  # exp nodes a division takes as its divisor
    seen = {root}
    stack = [root]
    while stack and len(seen) < _SCALE_NODES:
        node = stack.pop()
        name = type(node).__name__
        if name == "ExpBackward0":
            children = _children(node)
            if len(children) == 1:
                exps.append((node,) + _scale_argument(children[0][1]))
        elif name in ("MulBackward0", "DivBackward0"):
            children = _children(node)
            if len(children) == 2:
                for index, child in children:
                    factors.setdefault(child, set()).add(-1.0 if name == "DivBackward0" and index == 1 else 1.0)
                    if name == "DivBackward0" and index == 1:
                        # dividing by exp(s) (or by 2 * exp(s)) scales by exp(-s): a Gaussian
                        # NLL's (y - mu) ** 2 / logvar.exp() is a precision, not a scale
                        below, positive = _scale_argument(child)
                        if type(below).__name__ == "ExpBackward0" and positive > 0:
                            divided.add(below)
        for _, child in _children(node):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    # a value whose exp the linear top holds with a negative sign (a VAE's KL with its sign
    # flipped) is loss-unbounded-below's: its other exps are not told again
    theirs = {argument for node, argument, _ in exps if (linear.get(node) or 1.0) < 0}
    found = []
    for node, argument, sign in exps:
        if argument in theirs:
            continue
        if node in divided:
            if factors.get(node, set()) - {-1.0}:
                continue  # a factor somewhere and a divisor elsewhere: not told
            sign = -sign
        held = linear.get(argument)
        if held is not None and held * sign > 0:
            found.append((argument, held, node, sign))
    # a scale whose log and a positive power the linear top both hold with one sign (a Gaussian
    # KL's ``log(sigma) + sigma ** 2`` with the log's sign flipped): both fall as the scale
    # shrinks, and the log without end
    powered: dict = {}  # scale -> (the sign the linear top holds its power with, the power's node)
    for node, held in linear.items():
        if held is None or type(node).__name__ != "PowBackward0":
            continue
        children = _children(node)
        exponent = saved(node, "_saved_exponent")
        if len(children) == 1 and isinstance(exponent, (int, float)) and exponent > 0:
            scale = children[0][1]
            known = powered.get(scale)
            powered[scale] = (held, node) if known is None or known[0] == held else (None, node)
    # a scale whose log the linear top holds (Glow's ``log(sigmoid(h))`` log-det of
    # ``z = x * sigmoid(h)``, ``log(sigma)`` of ``(y - mu) / sigma``): the same pull when the
    # log's sign and the scale's (a factor: +1, a divisor: -1) agree
    for node, held in linear.items():
        if held is None or type(node).__name__ != "LogBackward0":
            continue
        children = _children(node)
        if len(children) != 1:
            continue
        scale = children[0][1]
        signs = factors.get(scale)
        if signs is not None and len(signs) == 1 and held * next(iter(signs)) > 0:
            found.append((scale, held, node, next(iter(signs))))
        elif scale in powered and powered[scale][0] is not None and held * powered[scale][0] > 0:
            found.append((scale, held, powered[scale][1], powered[scale][0]))
    return found


class LogScaleWatcher(LossGraphReader):
    """A loss that holds a log-scale ``s`` linearly and through ``exp(±s)`` with signs that
    pull ``s`` the same way (log-det-sign-reversed): a normalising flow's log-det subtracted
    from the log-likelihood it should be added to, a Gaussian NLL's ``0.5 * logvar`` negated.
    A ``log_scale_reversed`` aside names it, once per backward line."""

    label = "log_scale_reversed"

    def _judge(self, root, loc) -> None:
        terms = scale_terms(root)
        if not terms:
            return
        tensors = self.rec.tensors
        for argument, held, exp, sign in terms:
            common = reached(argument, _LEAF_NODES, truncate=True)[1]
            pids = sorted(pid for i in common
                          if (pid := tensors.number.get(i)) is not None and id(tensors.refs[pid]()) == i)
            if not pids:
                continue
            self._done.add(loc)
            self.rec.emit_aside(ev.log_scale_reversed(
                linear=held, exp=sign, op=type(argument).__name__, params=pids[:64],
                bounded=_bounded(argument), line=getattr(loc, "line", None),
                power=type(exp).__name__ == "PowBackward0"), loc)
            return

    def install(self, patcher) -> None:
        pass
