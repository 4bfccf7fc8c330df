from __future__ import annotations

from ..findings import Severity
from .base import Rule


class CollateReordersFields(Rule):
    """
    ## What it does
    Finds a DataLoader `collate_fn` of the script's own that returns one field of the batch
    in another order of the samples than another: the sequences sorted by length for
    `pack_padded_sequence` and the labels left in the order they came, a list reversed or
    shuffled for one field only. Read from the DataLoader's first batched fetches (in-process,
    CPU): each row of each batch tensor is matched to the sample it holds (equal, a padded
    prefix, or the number; a sample's words or sentence that the collate encodes, by the
    length of the row's sequence without its padding, or the length a field of lengths
    holds), and two fields whose rows come from different samples (no one order of the
    samples fits both) are reported at the collate's line that reorders (a `sorted`, `.sort`,
    `argsort`, a permutation), else at its first line.

    ## Why is this bad?
    The rows of a batch pair up by position: row i of the inputs with row i of the labels.
    Reordered apart, most samples are trained on another sample's label — the pairing is
    random within each batch, the model can learn little beyond the label frequencies, and
    nothing fails.

    ## Example
    ```python
    def collate(batch):
        seqs = sorted([s for s, _ in batch], key=len, reverse=True)
        labels = torch.tensor([l for _, l in batch])
        return pad_sequence(seqs, batch_first=True), labels
    ```

    ## Use instead
    ```python
    def collate(batch):
        batch = sorted(batch, key=lambda item: len(item[0]), reverse=True)  # the pairs
        seqs = [s for s, _ in batch]
        labels = torch.tensor([l for _, l in batch])
        return pad_sequence(seqs, batch_first=True), labels
    ```

    ## Stays silent on
    A collate that sorts (or shuffles) whole samples, every field in one order; one that keeps
    the order; one that also returns the permutation it sorted by (`lengths, perm =
    lengths.sort(descending=True)` returned beside the labels in their own order), which the
    model uses to put its outputs back in the batch's order; fields that are not one row per sample (lengths, masks computed from the batch:
    they match no sample's value); fields whose rows cannot be told apart (a batch of equal
    sequences); sentences sorted apart from labels when the sorted lengths still fit the labels
    in some order (a batch whose rows cannot be told apart by length and label). Not seen: collates in worker processes (`num_workers > 0`), samples that are not
    tuples, lists or dicts, values that are not tensors or numbers (strings), batches over 64.
    """

    code = "GD311"
    slug = "collate-reorders-fields"
    severity = Severity.WARNING
    summary = ("a collate_fn returns one field of the batch in another order of the samples "
               "than another: inputs and labels no longer pair by row")
    fix = ("reorder whole samples (sort the list of (input, label) pairs) before splitting them "
           "into fields, or apply the same permutation to every field")

    def check(self, a):
        for e in a.of_kind("collate_reordered"):
            if e.loc is None:
                continue
            name, moved, kept = e["collate"], e["moved"], e["kept"]
            yield self.finding(
                f"`{name}` returns field {moved} of the batch in another order of the samples "
                f"than field {kept}: in the first batch looked at, {e['displaced']} of its "
                f"{e['rows']} rows hold field {moved} of one sample and field {kept} of "
                f"another, so the model is trained on the labels of other samples",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"collate": name, "moved": moved, "kept": kept, "rows": e["rows"],
                          "displaced": e["displaced"]},
                fix=(f"in `{name}`, reorder the samples themselves (sort the list of samples, "
                     f"then build every field from it), or index field {kept} with the same "
                     f"permutation as field {moved}"))
