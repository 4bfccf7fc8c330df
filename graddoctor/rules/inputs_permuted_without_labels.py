from __future__ import annotations

from ..findings import Severity
from .base import Rule


class InputsPermutedWithoutLabels(Rule):
    """
    ## What it does
    Finds a model given the rows of a DataLoader batch in another order while the loss's target
    keeps the loader's order (`x = x[torch.randperm(len(x))]`, the labels left as they are).
    Checked by value on the first turns (CPU tensors): the model's inputs are all the rows of one
    batch, permuted, and the target is one of that batch's tensors unpermuted, with nothing
    between the model's output and the loss that reorders rows. It points at the model's call.

    ## Why is this bad?
    Row `i` of the output is scored against label `i`, which now belongs to another sample: the
    model trains on random labels. The loss stalls near chance and nothing fails.

    ## Example
    ```python
    for x, y in loader:
        x = x[torch.randperm(len(x))]    # "shuffle" the batch
        loss = criterion(model(x), y)
    ```

    ## Use instead
    ```python
    for x, y in loader:                  # shuffle=True in the DataLoader, or one permutation
        perm = torch.randperm(len(x))    # for both
        loss = criterion(model(x[perm]), y[perm])
    ```

    ## Stays silent on
    One permutation applied to inputs and labels; mixup (the inputs mixed with a permuted copy,
    the loss over both label sets); a batch sorted by length for `pack_padded_sequence` and the
    outputs put back in the loader's order; a permutation-invariant target (one value repeated);
    inputs that are not the batch's rows (normalised, augmented).
    """

    code = "GD251"
    slug = "inputs-permuted-without-labels"
    severity = Severity.WARNING
    summary = ("the model gets the batch's rows in another order than the labels the loss "
               "compares them with")
    fix = ("apply the same permutation to the labels (x, y = x[perm], y[perm]), or let the "
           "DataLoader shuffle (shuffle=True)")

    def check(self, a):
        for e in a.of_kind("batch_pairing"):
            if e["problem"] != "permuted":
                continue
            epoch, index = e["input_batch"]
            yield self.finding(
                f"the model here is given the {e['rows']} rows of batch {index} of epoch {epoch} "
                f"in another order, while the {e['fn']} loss's target, the batch's {e['field']}, "
                f"keeps the loader's order: each output is scored against another sample's "
                f"label, so the model trains on random labels",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"loss": e["fn"], "batch": [e["loader"], epoch, index],
                          "target_field": e["field"], "rows": e["rows"]})
