from __future__ import annotations

from ..findings import Severity
from .base import Rule


class MixupLabelsUnmixed(Rule):
    """
    ## What it does
    Finds mixup applied to the inputs only: the model is given `lam * x + (1 - lam) * x[perm]`
    of a DataLoader batch while the loss's only target is the batch's labels `y`, in the
    loader's order, so the partner samples' labels `y[perm]` never reach the loss. Read on the
    first turns (CPU) from the batch's row fingerprints, which a mix of rows keeps, and the
    targets the loss's graph saves. It points at the model's call.

    ## Why is this bad?
    Each mixed input holds `1 - lam` of another sample, yet it is trained to predict its own
    label with full confidence: the model is taught that the partner's features mean this
    label, which is label noise at the rate of the mix. Accuracy drops instead of improving, and
    nothing fails.

    ## Example
    ```python
    lam = np.random.beta(0.4, 0.4)
    perm = torch.randperm(x.size(0))
    out = model(lam * x + (1 - lam) * x[perm])
    loss = criterion(out, y)                           # the labels are not mixed
    ```

    ## Use instead
    ```python
    out = model(lam * x + (1 - lam) * x[perm])
    loss = lam * criterion(out, y) + (1 - lam) * criterion(out, y[perm])
    ```

    ## Stays silent on
    The two-term mixup loss; mixed soft targets (`lam * one_hot(y) + (1 - lam) *
    one_hot(y[perm])`); inputs that are no mix of the batch's rows (augmented, normalised,
    CutMix's pasted patches: not judged); GPU batches and loops without a DataLoader (not
    checked).
    """

    code = "GD260"
    slug = "mixup-labels-unmixed"
    severity = Severity.WARNING
    summary = ("mixup mixes the inputs of a batch but the loss gets only the original labels: "
               "the partner samples' labels are never used")
    fix = ("mix the loss as the inputs: lam * criterion(out, y) + (1 - lam) * criterion(out, y[perm]) "
           "(or mixed one-hot targets)")

    def check(self, a):
        for e in a.of_kind("mixup_unmixed"):
            yield self.finding(
                f"the model gets a mixup of the batch's rows (each row is {e['lam']:.2f} of its own "
                f"sample and {1 - e['lam']:.2f} of another's), but {e['fn']}'s only target is the "
                f"batch's '{e['field']}' in the loader's order: the partner samples' labels never "
                f"reach the loss, so each mixed input is trained towards one label only",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"fn": e["fn"], "field": e["field"], "rows": e["rows"], "lam": e["lam"]})
