from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk


class FlowDimensionUntransformed(Rule):
    """
    ## What it does
    Finds a normalising flow that hands some coordinates of the data to its prior unchanged:
    the latent the loss squares (the prior's `-0.5 * z ** 2`) equals, in some feature columns,
    the data batch the flow's first products read (`x * exp(s)`), in every row, while its
    other columns differ. Read from the loss's graph at the first backwards of each line (a
    flow whose layers all start as the identity equals the data everywhere: no verdict until
    they move); it points at the script's one comprehension that builds the layers' masks
    without reading its loop variable (`[torch.tensor([1.0, 0.0]) for i in range(n)]`), else at
    the loss's assignment.

    ## Why is this bad?
    A coupling layer transforms one part of its input conditioned on the other; the layers must
    take turns (masks `m` and `1 - m`, a flip or a permutation between layers) so that every
    coordinate is transformed by some layer. With the same mask in every layer, or the
    permutation between layers forgotten, a coordinate goes from the data to the latent as it
    is: its density stays the prior's standard normal whatever the data, nothing conditions on
    it, and the NLL plateaus well above what the flow could reach.

    ## Example
    ```python
    masks = [torch.tensor([1.0, 0.0]) for i in range(n_layers)]     # coordinate 0 never moves
    ```

    ## Use instead
    ```python
    masks = [torch.tensor([1.0, 0.0]) if i % 2 == 0 else torch.tensor([0.0, 1.0])
             for i in range(n_layers)]
    ```

    ## Stays silent on
    One mask for every layer with a flip or a permutation between layers; alternating masks or
    halves; a flow whose layers are still the identity (zero-initialised scale and shift
    networks, before the first update: no verdict while every `exp` of the graph is one); latents of another shape than the data (a squeeze, a
    multi-scale flow that factors out coordinates: not judged).
    """

    code = "GD347"
    slug = "flow-dimension-untransformed"
    severity = Severity.WARNING
    summary = ("a normalising flow passes some data coordinates to its prior unchanged: no layer "
               "transforms them, so their density is never learned")
    fix = ("make the coupling layers take turns: alternate the masks (m, then 1 - m) or flip / "
           "permute the features between layers, so every coordinate is transformed by some layer")

    def check(self, a):
        for e in a.of_kind("flow_identity_dims"):
            dims, d = e["dims"], e["features"]
            loc = e.loc
            if loc is not None:
                same = _same_mask_every_layer(a.source.tree(loc.path))
                assigned = a.source.loss_assignment(loc.path, loc.line)
                if same is not None:  # the layers' masks, built alike whatever the layer
                    loc = Location(loc.path, same)
                elif assigned is not None:  # the NLL the untouched coordinates sit in
                    loc = Location(loc.path, assigned[0])
            shown = ", ".join(str(j) for j in dims[:6]) + (" …" if len(dims) > 6 else "")
            yield self.finding(
                f"the latent this loss puts under the prior equals the data batch in feature "
                f"column{'s' if len(dims) > 1 else ''} {shown} (of {d}), in every row, while the "
                f"other columns are transformed: no layer of the flow changes "
                f"{'those coordinates' if len(dims) > 1 else 'that coordinate'}, so its density stays "
                f"the prior's standard normal and the other coordinates never condition on it "
                f"(the same coupling mask in every layer, or the flip / permutation between "
                f"layers missing)",
                loc, step=a.next_step_number(e.seq),
                evidence={"dims": dims, "features": d})
            return


def _same_mask_every_layer(tree) -> int | None:
    """The line of the file's one list comprehension whose element mentions a mask (a name or
    attribute with "mask" in it, or is assigned to one) and never reads the comprehension's
    loop variables: every layer gets the same mask."""
    if tree is None:
        return None
    found = []
    named = {id(n.value) for n in walk(tree) if isinstance(n, ast.Assign)
             and any("mask" in ast.unparse(t).lower() for t in n.targets)}
    for node in walk(tree):
        if not isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            continue
        loop_vars = {n.id for g in node.generators for n in walk(g.target) if isinstance(n, ast.Name)}
        used = {n.id for n in walk(node.elt) if isinstance(n, ast.Name)}
        if loop_vars & used:
            continue
        words = [n.id for n in walk(node.elt) if isinstance(n, ast.Name)] + \
            [n.attr for n in walk(node.elt) if isinstance(n, ast.Attribute)]
        if id(node) in named or any("mask" in w.lower() for w in words):
            found.append(node.lineno)
    return found[0] if len(found) == 1 else None
