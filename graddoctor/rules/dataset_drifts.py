from __future__ import annotations

import re
from dataclasses import replace

from ..findings import Related, Severity
from .base import Rule


def _fix(write, numpy: bool) -> str:
    """The fix shown for the write ``stored_array_use`` found (or the read, without one)."""
    copy = ".copy()" if numpy else ".clone()"
    if write is not None:
        _, text, how, method = write
        if how == "method":
            return (f"make the change out of place (`{text}` with `{method[:-1]}` instead of "
                    f"`{method}`, assigned to a new name), or copy the sample when you read it "
                    f"(`{copy}`): the stored data must stay what the script made")
        if how == "augmented":
            parts = re.match(r"^(\w+) (\S+)= (.+)$", text)
            out_of_place = (f"`{parts[1]} = {parts[1]} {parts[2]} {parts[3]}`" if parts else
                            "`x = x + ...` instead of `x += ...`")
            return (f"write `{text}` out of place ({out_of_place}), or copy the sample when you "
                    f"read it (`{copy}`): the stored data must stay what the script made")
        return (f"copy the sample when you read it (`{copy}`) before `{text}`: the stored data "
                f"must stay what the script made")
    return (f"copy the sample when you read it (`{copy}`), or make the augmentation out of place: "
            f"the stored data must stay what the script made")


class DatasetDrifts(Rule):
    """
    ## What it does
    Finds a Dataset whose `__getitem__` writes into the data it holds: an augmentation applied
    in place to a tensor or NumPy array that is a view of a stored row (`x = self.data[i];
    x.add_(noise)`, `img *= scale`). Read from the DataLoader's fetches: the rows of each
    tensor or array the dataset holds are compared before and after the fetch, and a row that
    changes again when its index is read a second time is reported, at the in-place line of
    `__getitem__` (at its read of the array when the write is elsewhere).

    ## Why is this bad?
    A view shares the stored memory, so the augmentation is written into the dataset itself.
    Each epoch reads the data the previous epochs left: noise piles up, a scale compounds, and
    the model trains on data that drifts further from the dataset the script made. Nothing
    fails; training slowly degrades, and the evaluation on that dataset reads drifted data too.

    ## Example
    ```python
    def __getitem__(self, i):
        x = self.data[i]            # a view of the stored row
        x.add_(0.1 * torch.randn_like(x))
        return x, self.labels[i]
    ```

    ## Use instead
    ```python
    def __getitem__(self, i):
        x = self.data[i] + 0.1 * torch.randn_like(self.data[i])   # a new tensor
        return x, self.labels[i]
    ```

    ## Stays silent on
    Augmentations on a copy (`.clone()`, `.copy()`, `np.array(...)`, an out-of-place op or a
    torchvision transform that returns a new tensor); data normalised once in `__init__`; a
    cache whose rows are written at their first read only; test-time augmentation of a batch
    (a collated copy); loaders with worker processes (each reads its own copy).
    """

    code = "GD174"
    slug = "dataset-drifts"
    severity = Severity.WARNING
    summary = ("a Dataset's __getitem__ changes the data it holds in place (an augmentation on a "
               "view of a stored row): the data drifts further every epoch")
    fix = ("copy the sample before augmenting it (`.clone()`, NumPy `.copy()`), or make the "
           "augmentation out of place")

    def check(self, a):
        for e in a.of_kind("dataset_drift"):
            if e.loc is None:
                continue
            attr, numpy = e.get("attr"), bool(e.get("numpy"))
            use = a.source.stored_array_use(e.loc.path, e.loc.line, attr) or {}
            write, read = use.get("write"), use.get("read")
            related = ()
            if write is not None:
                loc = replace(e.loc, line=write[0])
                if read is not None and read[0] != write[0]:
                    related = (Related(replace(e.loc, line=read[0]), "the read of the stored row"),)
                how = f"`{write[1]}` writes into it"
            elif read is not None:
                loc = replace(e.loc, line=read[0])
                how = "what reads it here is changed in place afterwards"
            else:
                loc = e.loc
                how = "it is changed in place while a sample is read"
            what = "array" if numpy else "tensor"
            yield self.finding(
                f"{e.get('cls')}.__getitem__ reads a view of the stored {what} `self.{attr}` and "
                f"{how}: {e.get('rows')} stored row(s) changed again when their sample was read "
                f"a second time, so every epoch trains on data the earlier epochs changed, "
                f"drifting further from the dataset the script made",
                loc, related=related, step=a.next_step_number(e.seq),
                evidence={"dataset": e.get("cls"), "array": attr, "rows": e.get("rows")},
                fix=_fix(write, numpy))
