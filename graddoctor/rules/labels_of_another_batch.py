from __future__ import annotations

from ..findings import Severity
from .backward_after_batch_loop import BackwardAfterBatchLoop
from .base import Rule


class LabelsOfAnotherBatch(Rule):
    """
    ## What it does
    Finds a loss whose target is the labels of another DataLoader batch than the one the model's
    inputs came from: the first batch's labels kept from before the loop, a label variable read
    one turn late, labels taken from a list one position off. Checked by value on the first
    turns (CPU tensors): the model's inputs are found among the rows of the batches the loaders
    served, the loss's target among their tensors. It points at the call of the loss module
    (`criterion(preds, y0)`) given that target, the line that names it, or else at the model's
    call.

    ## Why is this bad?
    A DataLoader yields inputs and labels that belong together. Paired with another batch's
    labels, every sample is trained towards a label that is not its own: the loss stalls near
    chance (or fits the mean of a regression target) and nothing fails.

    ## Example
    ```python
    x0, y0 = next(iter(loader))          # a look at the data, kept
    for x, _ in loader:
        loss = criterion(model(x), y0)   # the first batch's labels, every step
    ```

    ## Use instead
    ```python
    for x, y in loader:
        loss = criterion(model(x), y)
    ```

    ## Stays silent on
    Targets of this batch (any of its tensors, reshaped or cast); a batch fetched ahead before
    this one's loss (a prefetcher); one batch trained on repeatedly (overfitting a batch); an old
    batch replayed with its own labels; two loaders read in lockstep; targets made from the batch
    (a GAN's real/fake labels, an autoencoder's input, a teacher's outputs, shifted tokens); a
    fixed target without a DataLoader (denoising one image).
    """

    code = "GD250"
    slug = "labels-of-another-batch"
    severity = Severity.WARNING
    summary = ("the loss's target is another batch's labels: the model's inputs come from one "
               "DataLoader batch, the labels from another")
    fix = ("take the labels from the same batch as the inputs (for x, y in loader: "
           "loss = criterion(model(x), y))")

    def check(self, a):
        dropped = None  # a backward after the batch loop: the forwards it skips are no mix-up
        for e in a.of_kind("batch_pairing"):
            if e["problem"] != "other-batch":
                continue
            epoch, index = e["input_batch"]
            t_epoch, t_index = e["target_batch"]
            same = e["target_loader"] == e["loader"]
            if same and t_epoch == epoch and t_index > index:
                if dropped is None:
                    dropped = any(True for _ in BackwardAfterBatchLoop().check(a))
                if dropped:
                    continue  # backward-after-batch-loop says why the forward's batch is not the loss's
            where = (f"batch {t_index} of epoch {t_epoch}" if same else
                     f"batch {t_index} of epoch {t_epoch} of another DataLoader, served in an "
                     f"earlier step")
            model_line = e.get("model_line")
            subject = (f"the model (line {model_line}) is given the inputs of batch {index} of "
                       f"epoch {epoch}, but the {e['fn']} loss here is given" if model_line else
                       f"the model here is given the inputs of batch {index} of epoch {epoch}, "
                       f"but the {e['fn']} loss is given")
            yield self.finding(
                f"{subject} the tensor {e['field']} of {where} as its target: each sample is "
                f"trained towards another sample's label, so the loss stalls near chance",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"loss": e["fn"], "inputs_batch": [e["loader"], epoch, index],
                          "target_batch": [e["target_loader"], t_epoch, t_index],
                          "target_field": e["field"], "rows": e["rows"]})
