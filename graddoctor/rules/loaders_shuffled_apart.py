from __future__ import annotations

from ..findings import Severity
from .base import Rule


class LoadersShuffledApart(Rule):
    """
    ## What it does
    Finds inputs and labels kept in two DataLoaders that each shuffle on their own and are read
    together (`for x, y in zip(x_loader, y_loader)`): both datasets have the same length, one
    loader serves bare integer labels, and each draws its own random order. It points at the
    labels' DataLoader.

    ## Why is this bad?
    Two loaders with `shuffle=True` draw two independent permutations: the i-th batch of labels
    belongs to other samples than the i-th batch of inputs. The model is trained on random
    labels; the loss stalls near chance and nothing fails.

    ## Example
    ```python
    x_loader = DataLoader(X, batch_size=32, shuffle=True)
    y_loader = DataLoader(Y, batch_size=32, shuffle=True)
    for x, y in zip(x_loader, y_loader):
        ...
    ```

    ## Use instead
    ```python
    loader = DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True)
    for x, y in loader:
        ...
    ```

    ## Stays silent on
    One loader over a dataset of (input, label) pairs; two loaders that do not shuffle, or that
    share one order (a `generator` each, or a sampler of the script's own); unpaired domains of
    the same length (CycleGAN: two image loaders, neither of labels); loaders of different
    lengths; a validation loader read beside the training one without a backward.
    """

    code = "GD242"
    slug = "loaders-shuffled-apart"
    severity = Severity.WARNING
    summary = ("inputs and labels come from two DataLoaders that each shuffle on their own: "
               "every batch pairs inputs with other samples' labels")
    fix = ("keep inputs and labels in one dataset and one loader: "
           "DataLoader(TensorDataset(X, Y), batch_size=..., shuffle=True)")

    def check(self, a):
        for e in a.of_kind("loaders_zipped"):
            yield self.finding(
                f"the labels in this DataLoader are shuffled in an order of their own, and they "
                f"are read beside another shuffling loader of the inputs ({e['length']} samples "
                f"each) for the same backward: the two random orders differ, so each batch pairs "
                f"inputs with the labels of other samples and the model trains on random labels",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"inputs_loader": e["inputs"], "labels_loader": e["labels"],
                          "length": e["length"]})
