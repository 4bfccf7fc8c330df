from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule


class OrthogonalityWithoutTranspose(Rule):
    """
    ## What it does
    Finds an orthogonality penalty that multiplies the matrix by itself instead of by its
    transpose: PointNet's feature-transform regulariser written
    `torch.norm(torch.bmm(trans, trans) - I)` where it is `bmm(trans, trans.transpose(2, 1))`, a
    weight's `||W @ W - I||`, `mse_loss(A @ A, eye)`. Seen in the loss's graph at the first
    backwards of each line: a `bmm` or `mm` whose two operands are one tensor seen the same way
    (the same memory, shape and strides: a transposed view has other strides) of square
    matrices, compared with a constant (a subtraction of one, or a regression loss's input).
    Reported at the line of the product when the script writes one such product, else at the
    backward.

    ## Why is this bad?
    `A Aᵀ = I` says the rows of `A` are orthonormal: a rotation or a reflection, which keeps the
    points' (or features') geometry. `A A = I` says `A` is its own inverse, an involution: any
    reflection qualifies, but so do skewed matrices whose eigenvalues are ±1, and a rotation
    other than by 0 or 180 degrees does not. The penalty pulls the learned transform toward the
    wrong set: it neither keeps the transform well-conditioned nor stops it from shearing the
    features. The loss still goes down. Nothing fails.

    ## Example
    ```python
    def feature_transform_regularizer(trans):
        eye = torch.eye(trans.shape[1])[None]
        return torch.mean(torch.norm(torch.bmm(trans, trans) - eye, dim=(1, 2)))
    ```

    ## Use instead
    ```python
    def feature_transform_regularizer(trans):
        eye = torch.eye(trans.shape[1])[None]
        return torch.mean(torch.norm(torch.bmm(trans, trans.transpose(2, 1)) - eye, dim=(1, 2)))
    ```

    ## Stays silent on
    The product with the transpose either way round (`A @ A.T`, `A.transpose(1, 2) @ A`); a
    matrix power used as a value (`K @ K` applied to a state in a Koopman model, an adjacency
    squared), not compared with a constant; the product of two different matrices.
    """

    code = "GD418"
    slug = "orthogonality-without-transpose"
    severity = Severity.WARNING
    summary = ("an orthogonality penalty multiplies the matrix by itself (A @ A - I) instead of "
               "by its transpose: it pulls A toward an involution, not a rotation")
    fix = "multiply by the transpose: A @ A.transpose(-2, -1) - I"

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("self_product_offset"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids:
                continue
            loc, text, x = e.loc, None, None
            if loc is not None:
                lines = a.source.self_product_lines(loc.path)
                if len(lines) == 1:
                    line, text, x = lines[0]
                    loc = Location(loc.path, line)
            k = "x".join(str(s) for s in e.get("shape") or ())
            said = f"`{text}`" if text else "a matrix product"
            name = x or "A"
            yield self.finding(
                f"{said} multiplies the {k} matrix by itself, not by its transpose, and the loss "
                f"compares the product with a constant (the identity of an orthogonality "
                f"penalty); the matrix is computed from {a.names(pids)}. {name} @ {name} = I asks "
                f"for an involution (its own inverse), not for orthonormal rows: the penalty "
                f"does not keep the transform a rotation, and the loss still goes down",
                loc, step=a.next_step_number(e.seq),
                evidence={"op": e.get("op"), "shape": e.get("shape"), "params": pids[:16], "text": text},
                fix=(f"multiply by the transpose: {name} @ {name}.transpose(-2, -1) (torch.bmm({name}, "
                     f"{name}.transpose(2, 1)) for a batch) minus the identity"))
