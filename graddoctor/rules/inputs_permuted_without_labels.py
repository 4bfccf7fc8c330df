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
    A loop that slices its own batches from two tensors (`X[perm[i:i + bs]]` beside
    `y[i:i + bs]`, `X[perm]` beside `y[torch.randperm(n)]`) is followed by the rows its indexing
    selects: at two of the first turns the model's input and the loss's target name different
    rows of two equally long tensors (not the same rows, nor rows at one fixed offset). It then
    points at the target's selection that departs from the input's.

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
    One permutation applied to inputs and labels (also by hand: `X[idx]`, `y[idx]`); targets at
    a fixed offset from the inputs (a forecast's horizon), or taken from the inputs' own tensor
    (a language model's next token); mixup (the inputs mixed with a permuted copy,
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
        for e in a.of_kind("row_pairing"):
            where = ", ".join(f"line {line}" for line in e["input_lines"]) or "another line"
            how = ("the same rows in another order" if e["same_rows"] else "other rows")
            yield self.finding(
                f"the loss's target here takes {how} of its tensor than the model's input takes "
                f"of its own ({where}), both {e['length']} rows long: row i of the output is "
                f"scored against another sample's label, so the model trains on random labels",
                e.loc, step=a.next_step_number(e.seq),
                fix="select the targets with the very index that selects the inputs "
                    "(xb, yb = X[idx], y[idx] with idx = perm[i:i + bs]), or let a DataLoader over "
                    "a TensorDataset(X, y) with shuffle=True pair them",
                evidence={"rows": e["rows"], "length": e["length"], "same_rows": e["same_rows"],
                          "input_lines": e["input_lines"]})
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
