from __future__ import annotations

import ast

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_METHODS = {"max": "max", "amax": "amax", "mean": "mean", "sum": "sum", "logsumexp": "logsumexp"}


def _literal(node):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) \
            and isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, int):
        return -node.operand.value
    return None


def _dim_of(call: ast.Call, method: bool):
    """The literal dim a reduction call is given (``x.max(1)``, ``torch.max(x, dim=-2)``)."""
    for keyword in call.keywords:
        if keyword.arg == "dim":
            return _literal(keyword.value)
    position = 0 if method else 1
    if len(call.args) > position:
        return _literal(call.args[position])
    return None


def pooling_calls(tree: ast.AST, op: str, ndim: int) -> list[tuple[int, str, bool]]:
    """``(line, text, in forward)`` of the calls of ``op`` (``torch.op(x, d)`` or ``x.op(d)``)
    whose literal dim is 1 (or ``1 - ndim``)."""
    forwards = [(f.lineno, f.end_lineno or f.lineno) for f in walk(tree)
                if isinstance(f, ast.FunctionDef) and f.name == "forward"]
    out = []
    for node in walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == op):
            continue
        root = node.func.value
        method = not (isinstance(root, ast.Name) and root.id in ("torch", "th"))
        dim = _dim_of(node, method)
        if isinstance(dim, int) and not isinstance(dim, bool) and dim in (1, 1 - ndim):
            inside = any(a <= node.lineno <= b for a, b in forwards)
            out.append((node.lineno, ast.unparse(node), inside))
    return sorted(out)


class PooledOverChannels(Rule):
    """
    ## What it does
    Finds a global pooling of a convolution's output taken over its channel axis and then read
    by a linear layer: PointNet's symmetric max written `torch.max(x, 1)[0]` on (B, C, N)
    features, a text CNN's max-over-time written `x.max(dim=1)`, a global average pool written
    `x.mean(1)` on (N, C, H, W). Seen in the graph of the first 3 backwards: a `max`, `amax`,
    `mean`, `sum` or `logsumexp` over exactly dim 1 of an input of three axes or more, made by a
    `Conv1d`/`Conv2d`/`Conv3d` through elementwise ops only (BatchNorm, activations, dropout),
    whose result reaches an `nn.Linear` through views and activations. Reported at the pooling
    call in the script when the source shows one with that dim, else at the backward.

    ## Why is this bad?
    A convolution's output is channels-first: dim 1 holds the features the layers learned, the
    axes after it hold the points, time steps or pixels. Pooling over dim 1 keeps one number
    per point (or step, or pixel) and throws away every learned channel but its maximum or
    mean; the classifier then reads positions as features. PointNet loses its invariance to the
    order of the points (the Linear weighs point 17 differently from point 18), a text CNN
    depends on where each word sits. When the two sizes agree (1024 points, 1024 channels) or
    the Linear was sized for what came out, nothing fails and the loss still falls.

    ## Example
    ```python
    x = self.bn3(self.conv3(x))        # (B, 1024, N)
    x = torch.max(x, 1)[0]             # (B, N): pooled over the channels
    return self.fc(x)
    ```

    ## Use instead
    ```python
    x = torch.max(x, 2)[0]             # (B, 1024): pooled over the points
    # a 2-D map: x.mean((2, 3)) or nn.AdaptiveAvgPool2d(1) then flatten
    ```

    ## Stays silent on
    A pooling over the points, time steps or pixels (dim 2, dims (2, 3), dim -1); a pooling over
    dim 1 of a tensor no convolution made straight (a Transformer's (N, T, D) tokens averaged
    over T; a convolution's output transposed first); a channel pooling whose result goes to a
    convolution, not a Linear (CBAM's spatial attention: `x.mean(1, keepdim=True)` and
    `x.amax(1, keepdim=True)` stacked for a 7×7 conv).
    """

    code = "GD289"
    slug = "pooled-over-channels"
    severity = Severity.WARNING
    summary = ("a convolution's output is pooled over its channel axis (dim 1) and fed to a "
               "Linear: the learned channels are reduced away and positions read as features")
    fix = ("pool over the positions, not the channels: torch.max(x, 2)[0] for (B, C, N), "
           "x.mean((2, 3)) or nn.AdaptiveAvgPool2d(1) for (B, C, H, W)")

    def check(self, a):
        for e in a.of_kind("channel_pool"):
            shape = list(e["shape"])
            op, ndim = e["op"], len(shape)
            loc, related, text = e.loc, (), None
            if e.loc is not None:
                tree = a.source.tree(e.loc.path)
                calls = pooling_calls(tree, op, ndim) if tree is not None else []
                inside = [c for c in calls if c[2]] or calls
                if len(inside) == 1:
                    loc = Location(e.loc.path, inside[0][0])
                    text = inside[0][1]
                    related = (Related(e.loc, "the backward whose graph holds it"),)
            dims = "×".join(str(s) for s in shape)
            spatial = ", ".join(str(d) for d in range(2, ndim))
            written = f"`{text}`" if text else f"a {op} over dim 1"
            keep = f"dim 2" if ndim == 3 else f"dims ({spatial})"
            yield self.finding(
                f"{written} pools a convolution's output ({dims}, channels-first) over its "
                f"{shape[1]} channels, and a Linear layer reads what is left: one number per "
                f"position ({'×'.join(str(s) for s in shape[2:])} of them), the learned channels "
                f"reduced away — the model reads positions as features (a point cloud's order, "
                f"a word's place) instead of pooling them",
                loc, related=related, step=a.next_step_number(e.seq),
                fix=(f"pool over the positions instead: {op} over {keep} (torch.max(x, 2)[0] for "
                     f"(B, C, N) features); the Linear then takes the {shape[1]} channels"),
                evidence={"op": op, "shape": shape, "dims": e["dims"]})
