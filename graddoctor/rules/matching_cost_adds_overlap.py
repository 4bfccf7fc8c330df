from __future__ import annotations

from ..analysis.matching_cost import overlap_added_to_cost
from ..findings import Severity
from ..trace import Location
from .base import Related, Rule


class MatchingCostAddsOverlap(Rule):
    """
    ## What it does
    Finds a box-matching cost that adds an overlap where a cost needs it subtracted:
    `C = cost_bbox + cost_class + cost_giou` with `cost_giou = generalized_box_iou(...)` (not
    `-generalized_box_iou(...)`), given to `linear_sum_assignment` (which minimises), or a
    hand-written greedy matcher that takes the smallest `center + iou`. Read from the script's
    source once a backward ran: in each function, the matrix `linear_sum_assignment` gets
    without `maximize=True`, or that `argsort` (ascending), `argmin` or `min` is taken of, is
    followed through the names it is assigned from, and its terms are read with their signs; an
    overlap (a call of `box_iou`, `generalized_box_iou`, a `giou`, `bbox_overlaps`, `jaccard`,
    or a name assigned one, weighted or not) that enters with a plus sign is reported at the
    statement that adds it.

    ## Why is this bad?
    IoU and GIoU grow as two boxes agree. Added to a cost that the matcher minimises, they
    make the matcher prefer the predictions that overlap their targets *least*: each target is
    assigned the worst box, and the box and class losses train every query towards a target it
    does not cover. Nothing fails; the detector's boxes and mAP stay poor (DETR's matcher uses
    `-giou`).

    ## Example
    ```python
    cost_giou = generalized_box_iou(out_boxes, tgt_boxes)
    C = 5 * cost_bbox + cost_class + 2 * cost_giou
    rows, cols = linear_sum_assignment(C.cpu().numpy())
    ```

    ## Use instead
    ```python
    cost_giou = -generalized_box_iou(out_boxes, tgt_boxes)
    C = 5 * cost_bbox + cost_class + 2 * cost_giou
    rows, cols = linear_sum_assignment(C.cpu().numpy())
    ```

    ## Stays silent on
    An overlap negated (`-giou`, `-w * iou`) or turned into a cost (`1 - iou`); a matrix of
    overlaps given to `linear_sum_assignment(..., maximize=True)` or sorted with
    `descending=True`; an overlap used as a loss (`1 - giou`), not as a matching cost.
    """

    code = "GD355"
    slug = "matching-cost-adds-overlap"
    severity = Severity.WARNING
    summary = ("a matching cost that is minimised adds an IoU/GIoU (a similarity): the matcher "
               "pairs each target with the box that overlaps it least")
    fix = "subtract the overlap in the cost (-giou, or 1 - iou), or maximise a similarity"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, term, minimiser, called in overlap_added_to_cost(tree):
                picks = ("pairs rows and columns at the lowest total cost"
                         if minimiser == "linear_sum_assignment" else
                         f"`{minimiser}` picks the lowest cost")
                related = () if called == line else (
                    Related(Location(path, called), f"the cost is minimised here ({minimiser})"),)
                yield self.finding(
                    f"this cost adds `{term}`, an overlap (higher when a box matches its target "
                    f"better), and the matcher {picks}: each target is assigned the box that "
                    f"overlaps it least, and the losses then train the queries towards targets "
                    f"they do not cover",
                    Location(path, line), related=related,
                    evidence={"overlap": term, "minimiser": minimiser, "minimised_at": called},
                    fix=(f"subtract the overlap: use `- {term}` (or `1 - {term}`) in the cost"
                         + (", or pass maximize=True to linear_sum_assignment with every other "
                            "term negated" if minimiser == "linear_sum_assignment" else "")))
