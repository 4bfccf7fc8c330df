from __future__ import annotations

import ast
from dataclasses import replace

from ..findings import Severity
from .base import Rule
from .split_pairs_crossed import SplitPairsCrossed


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
    Reported at `__getitem__`'s read of the label array. The same pairing made when the
    dataset is built: a `TensorDataset` given row slices of two tables of as many rows at
    different starts (`TensorDataset(x[:n], y[k:k + n])`, the inputs' table without order),
    reported where it is made.

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
    other; a slice of one series against a later slice of it, `TensorDataset(s[:-1], s[1:])`,
    or of a feature table that has an order; the slices of two named splits, `X_val` with
    `y_test`, which split-pairs-crossed reports); a label table indexed by an id column (its ids are no constant shift, or the table
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
        crossed = None  # lines split-pairs-crossed reports: a split's parts given apart, its bug
        for e in a.of_kind("label_offset"):
            if e.loc is None:
                continue
            if e.get("sliced"):
                if crossed is None:
                    crossed = {(f.location.path, f.location.line)
                               for f in SplitPairsCrossed().check(a) if f.location is not None}
                if (e.loc.path, e.loc.line) not in crossed:
                    yield self._sliced(a, e)
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

    def _sliced(self, a, e):
        """Two row slices at different starts given to one TensorDataset."""
        rows, start_x, start_y = e["sliced"]
        return self.finding(
            f"this {e.get('cls')} pairs rows {start_x}..{start_x + rows - 1} of one table (its "
            f"inputs) with rows {start_y}..{start_y + rows - 1} of another table of as many rows "
            f"(its labels): sample i is trained towards the label of row i {_shifted(start_y - start_x, '')[1:].strip()} "
            f"of its table, another sample's label, so the loss stalls near chance",
            e.loc, step=a.next_step_number(e.seq),
            evidence={"dataset": e.get("cls"), "inputs": e.get("inputs"),
                      "labels": e.get("labels"), "offset": e.get("offset"), "rows": rows,
                      "input_start": start_x, "label_start": start_y},
            fix=self._sliced_fix(a, e, start_x, rows))

    @staticmethod
    def _sliced_fix(a, e, start_x: int, rows: int) -> str:
        """The labels' slice taken at the inputs' rows, in the script's names where the call
        shows them (`y[:n_train]` for `TensorDataset(x[:n_train], y[k:k + n_train])`)."""
        texts = []
        for attr in (e.get("inputs"), e.get("labels")):
            position = attr[attr.index("[") + 1:-1] if "[" in str(attr) else ""
            text = a.source.call_argument(e.loc.path, e.loc.line, "TensorDataset",
                                          int(position), "") if position.isdigit() else None
            texts.append(text)
        x_text, y_text = texts
        try:
            x_node = ast.parse(x_text, mode="eval").body if x_text else None
            y_node = ast.parse(y_text, mode="eval").body if y_text else None
        except SyntaxError:
            x_node = y_node = None
        if isinstance(x_node, ast.Subscript) and isinstance(y_node, ast.Subscript):
            same = f"{ast.unparse(y_node.value)}[{ast.unparse(x_node.slice)}]"
            return (f"take the labels at the inputs' rows: `{same}` beside `{x_text}` (not "
                    f"`{y_text}`)")
        return (f"slice the inputs and the labels with the same rows (both "
                f"[{start_x}:{start_x + rows}])")
