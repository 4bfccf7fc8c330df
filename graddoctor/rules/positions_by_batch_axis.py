from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule


class PositionsByBatchAxis(Rule):
    """
    ## What it does
    Finds a positional table (a sinusoidal or learned positional encoding held by a module)
    sliced by the batch axis of batch-first input: `x + self.pe[:x.size(0)]`, the PyTorch
    tutorial's encoding for sequence-first input, kept after the model was switched to
    `batch_first=True`. Read from the script's source once a backward ran: a `forward` that adds
    to its input a `self.<table>[:x.size(0)]` (or `x.shape[0]`, `len(x)`), in a script that
    builds batch-first layers and never swaps the first two axes.

    ## Why is this bad?
    With (batch, sequence, features) input, `x.size(0)` is the batch size: row `i` of the
    table is added to every token of sample `i`. No token learns its position (attention is
    blind to order, so the model sees a bag of tokens), and each sample gets a different
    constant offset that depends on where it sits in the batch. Shapes broadcast without an
    error; the loss falls a little and stops.

    ## Example
    ```python
    self.register_buffer("pe", pe.unsqueeze(1))     # (max_len, 1, d): sequence first
    def forward(self, x):                            # x: (batch, seq, d)
        return x + self.pe[:x.size(0)]
    ```

    ## Use instead
    ```python
    self.register_buffer("pe", pe.unsqueeze(0))     # (1, max_len, d): batch first
    def forward(self, x):
        return x + self.pe[:, :x.size(1)]
    ```

    ## Stays silent on
    Sequence-first models (no `batch_first=True`), scripts that transpose or permute the
    first two axes, tables sliced by the sequence axis (`x.size(1)`), learned position
    embeddings looked up with `torch.arange(x.size(1))`. Not seen: a batch-first convention
    of the script's own attention (no `batch_first=True` anywhere), a table added in another
    file.
    """

    code = "GD144"
    slug = "positions-by-batch-axis"
    severity = Severity.WARNING
    summary = ("a positional table is sliced by the batch axis of batch-first input: each "
               "sample gets one row for all its tokens, and no token gets its position")
    fix = ("slice the table by the sequence axis: hold it as (1, max_len, d) and add "
           "`self.pe[:, :x.size(1)]` (or `self.pe[:x.size(1)].transpose(0, 1)` for a "
           "(max_len, 1, d) table)")

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            for line, text, cls in a.source.table_sliced_by_batch(path):
                yield self.finding(
                    f"`{text}` in `{cls}.forward` slices the table by `x`'s first axis, which is "
                    f"the batch for the batch-first layers this script builds: row i of the "
                    f"table is added to every token of sample i, so no token gets its position "
                    f"and each sample gets its own constant offset",
                    Location(path, line), evidence={"class": cls, "text": text})
