from __future__ import annotations

from ..findings import Severity
from .base import Rule


class LabelMapInterpolated(Rule):
    """
    ## What it does
    Finds a Dataset that resizes a segmentation label map with an averaging interpolation
    (`F.interpolate(mask.float(), size, mode="bilinear")`, bicubic, area, or with antialias)
    and makes it integer again (`.round().long()`, `.long()`): at every boundary between two
    classes the interpolated value lies between their ids, and the cast turns it into a third
    class id that is not there. Read from the DataLoader's first batched fetches (in-process,
    CPU): the resize of a map of 3 to 64 integer values is repeated on each class's indicator
    (which output pixels the class reaches), followed through the ops that make the sample's
    field from it, and a field whose pixels hold ids that none of their source pixels held is
    reported at the resize. The same resize in the training loop (`F.interpolate` wrapped
    until the first 16 loss calls with a gradient) is reported when a `cross_entropy` /
    `nll_loss` target is its ids, rounded or cast.

    ## Why is this bad?
    A label map holds class ids, not quantities: the mean of "road" (0) and "car" (4) is not
    "building" (2). Every boundary gets a thin band of made-up classes, so each class is
    trained to appear along the edges of two unrelated ones, and the boundary pixels — the
    hardest and most informative ones — are trained on wrong labels. The loss still falls;
    the boundaries come out wrong.

    ## Example
    ```python
    mask = F.interpolate(mask[None, None].float(), size=(256, 256), mode="bilinear")
    mask = mask[0, 0].round().long()
    ```

    ## Use instead
    ```python
    mask = F.interpolate(mask[None, None].float(), size=(256, 256), mode="nearest")
    mask = mask[0, 0].long()
    ```

    ## Stays silent on
    Nearest (or nearest-exact) resizes of a label map; bilinear resizes of the image; a binary
    mask (two values: a bilinear resize and a threshold only move its boundary); a soft target
    resized bilinearly and kept as probabilities (BCE on a matte, a heatmap); an averaging
    resize whose rounding makes no id its source pixels did not hold. Not seen: resizes done
    outside torch (PIL, OpenCV, NumPy), in worker processes (`num_workers > 0`), or in the
    training loop for a loss other than `cross_entropy` / `nll_loss` (a hand-written one, a
    Dice loss on one-hot maps).
    """

    code = "GD310"
    slug = "label-map-interpolated"
    severity = Severity.WARNING
    summary = ("a label map resized with an averaging interpolation and cast back to integers: "
               "class ids that are not there appear at the boundaries")
    fix = "resize label maps with mode=\"nearest\" (and the image with bilinear)"

    def check(self, a):
        for e in a.of_kind("label_map_averaged"):
            if e.loc is None:
                continue
            levels = ", ".join(str(v) for v in e["levels"][:8]) + (", ..." if len(e["levels"]) > 8 else "")
            new = ", ".join(str(v) for v in e["new"][:8]) + (", ..." if len(e["new"]) > 8 else "")
            mode = e["mode"]
            H, W = (e.get("shape") or [0, 0])[:2]
            if e["cls"] is None:  # in the loop: the loss's target
                whose, made = "", f"the {e['field']} given to the loss made from it ({H}x{W})"
            else:
                whose = f" of {e['cls']}"
                made = f"the sample's field {e['field']} made from it ({H}x{W})"
            yield self.finding(
                f"this `{e['op']}(mode=\"{mode}\")` resizes a label map{whose} (values "
                f"{levels}) by averaging neighbouring ids, and {made} holds, at "
                f"{e['share']:.1%} of its pixels, an id that none of the map's pixels they were "
                f"averaged from holds ({new}) — the boundaries between two classes are "
                f"labelled with a class between their numbers, and the model is trained on "
                f"those made-up labels",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"dataset": e["cls"], "mode": mode, "levels": e["levels"],
                          "new": e["new"], "share": e["share"]},
                fix=(f"resize the label map with mode=\"nearest\" (no align_corners), and keep "
                     f"\"{mode}\" for the image only"))
