from __future__ import annotations

from ..findings import Severity
from .base import Rule


class LabelSmoothingTwice(Rule):
    """
    ## What it does
    Finds `cross_entropy` (or `nn.CrossEntropyLoss`) built with `label_smoothing` > 0 and given
    class-probability targets that are smoothed already: in nearly every row all classes but the
    label (or the two labels of a mixup) hold one same small value above 0, the same in every
    row (`one_hot * (1 - eps) + eps / C`). Read from the first calls' targets. It points at the
    loss call.

    ## Why is this bad?
    torch applies `label_smoothing` to probability targets too: the targets are smoothed twice,
    so the model is trained towards a flatter distribution than either setting asks for (0.1
    twice is about 0.19), its predictions are under-confident and the accuracy the smoothing was
    tuned for is not reached. Nothing fails.

    ## Example
    ```python
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    soft = F.one_hot(y, C).float() * 0.9 + 0.1 / C     # smoothed by hand as well
    loss = criterion(model(x), soft)
    ```

    ## Use instead
    ```python
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    loss = criterion(model(x), y)                      # class indices: smoothed once
    # or keep the hand-smoothed targets with nn.CrossEntropyLoss() (no label_smoothing)
    ```

    ## Stays silent on
    `label_smoothing` with class indices, or with soft targets that are not smoothed (a mixup
    of one-hot rows, a teacher's softmax, whose values differ from row to row); smoothed targets
    given to a loss without `label_smoothing`; two classes (nothing tells a smoothing apart).
    """

    code = "GD255"
    slug = "label-smoothing-twice"
    severity = Severity.WARNING
    summary = ("cross_entropy with label_smoothing is given targets that are smoothed already: "
               "the labels are smoothed twice")
    fix = ("smooth once: give the loss the class indices (or unsmoothed one-hot / mixup targets), "
           "or drop label_smoothing from the loss")

    def check(self, a):
        for e in a.of_kind("label_smoothing"):
            yield self.finding(
                f"cross_entropy smooths its targets with label_smoothing={e['label_smoothing']:g}, "
                f"but the targets are smoothed already: every class but the label holds "
                f"{e['floor']:.4g} (a smoothing of about {e['target_smoothing']:.3g} over "
                f"{e['classes']} classes), so the labels are smoothed twice and the model is "
                f"trained towards a flatter distribution than either setting asks for",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"label_smoothing": e["label_smoothing"], "classes": e["classes"],
                          "floor": e["floor"], "target_smoothing": e["target_smoothing"]})
