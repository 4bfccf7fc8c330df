from __future__ import annotations

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule


class GridNotNormalised(Rule):
    """
    ## What it does
    Finds a sampling grid given to `F.grid_sample` that is not in the normalised coordinates
    it reads: a grid in pixel units (most of its values beyond ±1, the largest past 2: a flow
    warp written `xs + flow[:, 0]` with `xs = arange(W)`, a translation in pixels), or a grid
    normalised to [0, 1] instead of [-1, 1] (every coordinate spanning exactly [0, 1]). Read at
    the first 8 calls of `grid_sample` under grad mode (one small reduction per call, CPU
    tensors; a GPU's before the first step only), and reported at the line that builds the
    grid when the source names it, else at the call.

    ## Why is this bad?
    `grid_sample` maps -1 to the left (top) edge of its input and +1 to the right (bottom)
    edge, whatever the image's size. Pixel coordinates land past the edge for all but the
    first pixel or two: each such point reads the padding (zeros, or the border pixel
    repeated), the warped image is nearly blank, the photometric loss compares the target with
    padding, and the gradient that reaches the flow (or the transformer's parameters) is zero
    almost everywhere. A [0, 1] grid samples only the bottom-right quarter of the image,
    stretched over the output. Nothing raises, and the loss still moves.

    ## Example
    ```python
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    grid = torch.stack([xs + flow[:, 0], ys + flow[:, 1]], dim=-1)   # pixels
    warped = F.grid_sample(img, grid, align_corners=True)
    ```

    ## Use instead
    ```python
    gx = 2.0 * (xs + flow[:, 0]) / (w - 1) - 1.0
    gy = 2.0 * (ys + flow[:, 1]) / (h - 1) - 1.0
    warped = F.grid_sample(img, torch.stack([gx, gy], dim=-1), align_corners=True)
    ```

    ## Stays silent on
    Grids in [-1, 1] (`F.affine_grid`'s, a `linspace(-1, 1)` base grid plus a normalised flow);
    a flow that moves some points past the edges (under half of the values outside); a zoom
    into part of the image (a coordinate that does not span all of [0, 1]); grids of fewer than
    64 points; calls under `no_grad` (evaluation).
    """

    code = "GD287"
    slug = "grid-not-normalised"
    severity = Severity.WARNING
    summary = ("a grid given to F.grid_sample is in pixel units or in [0, 1], not in the [-1, 1] "
               "coordinates it reads: most points sample the padding, or one quarter of the image")
    fix = ("normalise the grid to [-1, 1] before grid_sample: 2 * x / (W - 1) - 1 for x and "
           "2 * y / (H - 1) - 1 for y with align_corners=True (2 * (x + 0.5) / W - 1 with "
           "align_corners=False)")

    def check(self, a):
        for e in a.of_kind("grid_scale"):
            call = e.loc
            loc, related, name, affine = call, (), None, False
            if call is not None:
                text = a.source.call_argument(call.path, call.line, "grid_sample", 1, "grid")
                if text is not None and text.isidentifier():
                    name = text
                    made = a.source.value_origin(call.path, call.line, text)
                    if made is not None and made[0] != call.line:
                        affine = "affine_grid" in made[1]
                        loc = Location(call.path, made[0])
                        related = (Related(call, "the grid_sample call that reads it"),)
            size = "×".join(str(s) for s in e["size"])
            grid = f"`{name}`" if name else "the grid"
            if e["how"] == "pixels":
                message = (
                    f"{grid} given to F.grid_sample is in pixel units: its values run from "
                    f"{e['low']:g} to {e['high']:g} and {e['outside']:.0%} of them lie outside "
                    f"[-1, 1], the range grid_sample maps onto the {size} input's edges — those "
                    f"points read the padding ({e['padding']}), so the sampled image is mostly "
                    f"padding and " + ("the gradient that reaches the grid is zero there"
                                       if e["grad"] else "the model trains on it"))
                if affine:
                    message += (" (F.affine_grid's grid is normalised by itself: the matrix's "
                                "translation column, theta[:, :, 2], is read in half-widths of "
                                "the image, not in pixels)")
                fix = ("give affine_grid a translation in normalised units: tx = 2 * tx_px / W, "
                       "ty = 2 * ty_px / H (a scale above 1 zooms out past the edges the same "
                       "way)") if affine else (
                       "normalise the grid before grid_sample: x ↦ 2 * x / (W - 1) - 1 and "
                       "y ↦ 2 * y / (H - 1) - 1 (align_corners=True), or 2 * (x + 0.5) / W - 1 "
                       "with align_corners=False; a flow added to a normalised base grid is "
                       "scaled by 2 / (W - 1) and 2 / (H - 1) the same way")
            else:
                message = (
                    f"{grid} given to F.grid_sample spans [0, 1] in every coordinate "
                    f"(from {e['low']:g} to {e['high']:g}), but grid_sample reads [-1, 1]: "
                    f"-1 is the {size} input's first pixel and 0 its centre, so this grid "
                    f"samples only the bottom-right quarter of the image, stretched over the "
                    f"whole output")
                fix = ("map the [0, 1] grid onto [-1, 1] before grid_sample: grid * 2 - 1")
            yield self.finding(
                message, loc, related=related, step=a.next_step_number(e.seq), fix=fix,
                evidence={"how": e["how"], "low": e["low"], "high": e["high"],
                          "outside": e["outside"], "size": e["size"], "padding": e["padding"]})
