from __future__ import annotations

import ast

from ..findings import Severity
from ..location import Location
from .base import Related, Rule
from ..analysis.source import walk

_FRESH = "None, zeros, or init_hidden(batch_size)"


class RecurrentStateAcrossShuffledBatches(Rule):
    """
    ## What it does
    Finds a recurrent module (`nn.LSTM`, `nn.GRU`, `nn.RNN`, or a cell: `nn.LSTMCell`,
    `nn.GRUCell`, `nn.RNNCell`) whose initial state at a training forward is the state it
    returned for the previous batch — detached or copied, passed in as `hx` or kept on the
    module as `self.hidden` — while the batches come from a DataLoader that draws its samples
    at random (`shuffle=True`, a `RandomSampler`, also inside a `BatchSampler`). Checked at the
    first training forwards: the state given shares storage with (or, on the CPU, equals) the
    state returned before, on another batch, and its batch dimension is this batch's. It points
    at the line that feeds the state back.

    ## Why is this bad?
    Carrying the final state into the next forward is truncated backpropagation through time:
    right when row i of the next batch continues row i of this one. Batches drawn at random
    are unrelated samples, so every sequence starts from the end of another sample's sequence,
    a different one at each step. The model learns to depend on a starting state that carries
    noise, at evaluation it sees a different start (usually zeros), and nothing fails.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=32, shuffle=True, drop_last=True)
    hx = None
    for x, y in loader:
        out, hx = model(x, hx)  # starts from the previous batch's state
        hx = tuple(h.detach() for h in hx)
        loss_fn(out, y).backward()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        out, _ = model(x, None)  # a fresh state for every batch of independent samples
        loss_fn(out, y).backward()
    ```
    For truncated BPTT, serve contiguous chunks in order (`batchify`/`get_batch`, or a
    DataLoader with `shuffle=False` whose batch k + 1 continues batch k row by row) and carry
    the state across those.

    ## Stays silent on
    Truncated BPTT over contiguous batches (`batchify`/`get_batch` without a DataLoader, or a
    loader that serves in order); a state made anew for each batch (`hx=None`, zeros,
    `init_hidden()`) or zeroed in place (`h.zero_()`); a state carried across the time steps or chunks of one batch; an
    encoder's state handed to the decoder in the same batch; a recurrent policy carrying its
    state across environment steps (no DataLoader); a batch sampler of the script's own.
    """

    code = "GD169"
    slug = "recurrent-state-across-shuffled-batches"
    severity = Severity.WARNING
    summary = ("a recurrent module starts each batch from the state it returned for the previous "
               "batch, while a shuffling DataLoader makes the batches unrelated samples")
    fix = (f"start each batch from a fresh state ({_FRESH}); carry a state across batches only "
           f"when batch k + 1 continues batch k row by row (contiguous chunks served in order, "
           f"shuffle=False)")

    def check(self, a):
        seen = set()
        for e in a.of_kind("state_carried"):
            if e.loc in seen:
                continue
            seen.add(e.loc)
            yield self._finding(a, e)

    def _finding(self, a, e):
        cls, rows, sampler = e["cls"], e["rows"], e["sampler"]
        epoch, index = e["batch"]
        p_epoch, p_index = e["previous"]
        before = (f"batch {p_index}" if p_epoch == epoch else f"batch {p_index} of epoch {p_epoch}")
        how = "a view of" if e["shared"] == "storage" else "a copy of"
        message = (
            f"the {cls} starts batch {index} of epoch {epoch} from {how} the state it returned for "
            f"{before}, but the DataLoader draws its samples at random ({sampler}): row i of that "
            f"state ends another, unrelated sequence, not the one in row i of this batch (of "
            f"{rows}). Every sequence starts from a stranger's final state, a different one at "
            f"each step: the updates learn from noise in the starting state, evaluation starts "
            f"from another state, and nothing fails")
        call = e.get("call")
        call_loc = Location(str(call[0]), int(call[1]), str(call[2])) if call else None
        state = _state_argument(a, e.loc) if e.loc is not None else None
        fix = None
        if state is not None:
            fix = (f"reset `{state}` at the start of each batch ({_FRESH}) and carry it only "
                   f"within the batch; carry a state across batches only when batch k + 1 "
                   f"continues batch k row by row (contiguous chunks served in order, "
                   f"shuffle=False)")
        return self.finding(
            message, e.loc, fix=fix,
            related=(Related(call_loc, f"the {cls} call that is given that state"),)
            if call_loc is not None and call_loc != e.loc else (),
            step=a.next_step_number(e.seq),
            evidence={"module": cls, "loader": e["loader"], "sampler": sampler,
                      "batch": [epoch, index], "previous_batch": [p_epoch, p_index],
                      "rows": rows, "shared": e["shared"]})


def _state_argument(a, loc) -> str | None:
    """The source of the state a call on ``loc``'s line is given: its ``hx=`` keyword, else its
    last positional argument, of the outermost call there with one (``hidden`` in
    ``model(x, hidden)``, ``self.hidden`` in ``self.gru(x, self.hidden)``); None when none."""
    tree = a.source.tree(loc.path)
    if tree is None:
        return None
    best = None
    for node in walk(tree):
        if not isinstance(node, ast.Call) or node.lineno != loc.line:
            continue
        hx = next((kw.value for kw in node.keywords if kw.arg == "hx"), None)
        arg = hx if hx is not None else (node.args[-1] if len(node.args) >= 2 else None)
        if arg is None or isinstance(arg, ast.Starred):
            continue
        if best is None or node.col_offset < best[0]:
            best = (node.col_offset, arg)
    if best is None:
        return None
    arg = best[1]
    text = ", ".join(map(ast.unparse, arg.elts)) if isinstance(arg, ast.Tuple) else ast.unparse(arg)
    return text if len(text) <= 60 else None
