from __future__ import annotations

from dataclasses import replace

from ..findings import Severity
from .base import Rule


def _shifted(offset: int, index: str = "i") -> str:
    return f"{index} + {offset}" if offset > 0 else f"{index} - {-offset}"


class LabelOfAnotherSample(Rule):
    """
    ## What it does
    Finds a Dataset whose `__getitem__` reads the label at another index than the input
    (`return self.x[i], self.y[i + 1]`): every sample is paired with a neighbour's label. Read
    from the DataLoader's first batched fetches (CPU): one field of the batch equals the rows of
    one array the dataset holds at the fetched indices, another field equals another array of
    as many rows at every index shifted by the same offset (not at the index itself), and the
    inputs' rows have no order (row i + 1 lies no nearer row i than a row half the table away).
    Reported at `__getitem__`'s read of the label array.

    ## Why is this bad?
    The inputs and labels of a table belong together row by row. Shifted by one, every input
    is trained towards another sample's label: the loss stalls near chance (or fits the mean
    of a regression target) and nothing fails.

    ## Example
    ```python
    def __getitem__(self, i):
        return self.x[i], self.y[i + 1]
    ```

    ## Use instead
    ```python
    def __getitem__(self, i):
        return self.x[i], self.y[i]
    ```

    ## Stays silent on
    A language model's shifted targets read from one array (`d[i:i+T]`, `d[i+1:i+T+1]`); a
    forecast of a series' next value (its rows are ordered: consecutive rows lie near each
    other); a label table indexed by an id column (its ids are no constant shift, or the table
    has another number of rows, as with 1-based ids); inputs transformed in `__getitem__`
    (not matched, so not judged).
    """

    code = "GD175"
    slug = "label-of-another-sample"
    severity = Severity.WARNING
    summary = ("a Dataset's __getitem__ reads the label at another index than the input "
               "(self.y[i + 1]): every sample is trained towards another sample's label")
    fix = "read the label at the input's index (self.y[i])"

    def check(self, a):
        for e in a.of_kind("label_offset"):
            if e.loc is None:
                continue
            labels, inputs, offset = e.get("labels"), e.get("inputs"), e.get("offset")
            use = a.source.stored_array_use(e.loc.path, e.loc.line, labels) or {}
            read = use.get("read")
            loc = replace(e.loc, line=read[0]) if read is not None else e.loc
            index = use.get("index") or "i"
            written = use.get("read_expr") or f"self.{labels}[{_shifted(offset, index)}]"
            yield self.finding(
                f"{e.get('cls')}.__getitem__ pairs row i of `self.{inputs}` with row "
                f"{_shifted(offset)} of `self.{labels}` (every one of the {e.get('samples')} "
                f"samples compared): each input is trained towards another sample's label, so "
                f"the loss stalls near chance",
                loc, step=a.next_step_number(e.seq),
                evidence={"dataset": e.get("cls"), "inputs": inputs, "labels": labels,
                          "offset": offset, "samples": e.get("samples")},
                fix=f"read the label at the input's index: `self.{labels}[{index}]`, not "
                    f"`{written}`")
