from __future__ import annotations

from ..analysis.view_pairs import views_paired_with_themselves
from ..findings import Severity
from ..trace import Location
from .base import Rule


class ViewsPairedWithThemselves(Rule):
    """
    ## What it does
    Finds a two-view self-supervised loss that matches each view's prediction with its own
    view's stop-gradient target: `D(p1, z1) + D(p2, z2)` where SimSiam and BYOL write
    `D(p1, z2) + D(p2, z1)`. Read from the script's source, in the files whose backwards ran: a
    statement that adds two calls of one comparison (a criterion, a loss function of the
    script, `F.cosine_similarity`), each given a prediction and a target whose names end in the
    same view number (`p1`, `z_1`, `online_pred_one`, `target_proj_one`), the two calls of two
    views, and every target without gradient by the script's text (`.detach()`, made under
    `torch.no_grad()`, returned detached by the model's `forward`, or detached by the loss
    function itself).

    ## Why is this bad?
    The stop-gradient target of a view is computed from that same view: a prediction of `z1`
    made from `z1` is solved by a predictor that copies its input, with no need for the
    encoder to learn anything invariant to the augmentations. Only the cross-view pairing asks
    the representation of one view to predict the other's, which is what these methods learn
    from. The loss falls quickly to its minimum and the features are no better than at
    initialisation.

    ## Example
    ```python
    p1, p2, z1, z2 = model(x1, x2)  # z1, z2 returned detached
    loss = -(criterion(p1, z1).mean() + criterion(p2, z2).mean()) * 0.5
    ```

    ## Use instead
    ```python
    loss = -(criterion(p1, z2).mean() + criterion(p2, z1).mean()) * 0.5
    ```

    ## Stays silent on
    The crossed pairing; targets that keep their gradient (a reconstruction of each view, a
    Siamese network's labels `criterion(out1, y1) + criterion(out2, y2)`); predictions made
    from another input than their targets (masked prediction, data2vec's `student(x1 * m1)`
    against `teacher(x1)`: each view's masked copy predicts the view itself); names without
    view numbers; one call alone.
    """

    code = "GD328"
    slug = "views-paired-with-themselves"
    severity = Severity.WARNING
    summary = ("a two-view loss compares each view's prediction with its own view's stop-gradient "
               "target instead of the other view's")
    fix = "pair each view's prediction with the other view's target"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, text, crossed in views_paired_with_themselves(a.source.full(path)):
                yield self.finding(
                    f"`{text}` compares each view's prediction with the stop-gradient target of "
                    f"the same view: a predictor that copies its input solves it, so the encoder "
                    f"is never asked to map two augmentations of a sample to one representation",
                    Location(path, line, None),
                    fix=f"cross the views: `{crossed}`",
                    evidence={"crossed": crossed})
