from __future__ import annotations

import ast

from ..findings import Severity
from ..location import Location
from .base import Related, Rule
from ..analysis.source import walk

_RECURRENT = ("RNN", "LSTM", "GRU")
# the name of the input that carries the layout, per class of torch's
_INPUT = {"RNN": "input", "LSTM": "input", "GRU": "input", "MultiheadAttention": "query",
          "TransformerEncoderLayer": "src", "TransformerDecoderLayer": "tgt", "Transformer": "src"}
_SOURCES = {"loader": "the size of the DataLoader batch it came from",
            "loss_target": "the batch size of the loss target"}


class BatchFirstMismatch(Rule):
    """
    ## What it does
    Finds recurrent and attention modules built with `batch_first=False` — torch's default for
    `nn.LSTM`, `nn.GRU`, `nn.RNN`, `nn.MultiheadAttention`, `nn.TransformerEncoderLayer` /
    `DecoderLayer` (and so `nn.TransformerEncoder` / `Decoder`) and `nn.Transformer` — that are
    given batch-first input `(batch, seq, feature)`. The batch size is taken from the data: the
    DataLoader batch being served, or the leading dimension of the loss target. A 3-D input whose
    first dimension is that batch size and whose second is not is batch-first. It points at the
    line that builds the module, where `batch_first=True` goes.

    ## Why is this bad?
    Such a module reads its input as `(seq, batch, feature)`. Given `(batch, seq, feature)`, an
    LSTM steps through the samples of the batch as if they were time steps, carrying its hidden
    state from one sample into the next, and treats the time steps as separate sequences;
    attention mixes different samples of the batch together and never looks along a sequence.
    Nothing fails (the shapes still fit), the loss still goes down a little, and the model
    learns from the wrong data: every update is computed from the wrong inputs.

    ## Example
    ```python
    self.rnn = nn.LSTM(6, 16)  # batch_first=False

    def forward(self, x):  # x: (batch, seq, 6) from the DataLoader
        out, _ = self.rnn(x)
        return self.head(out[:, -1])
    ```

    ## Use instead
    ```python
    self.rnn = nn.LSTM(6, 16, batch_first=True)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])
    ```

    ## Stays silent on
    `batch_first=True` with `(batch, seq, feature)` input; `batch_first=False` given
    `x.transpose(0, 1)` or `x.permute(1, 0, 2)`; seq-first batches from a `collate_fn` that
    uses `pad_sequence` (`(seq, batch)`); `nn.MultiheadAttention` called with `(L, N, E)`; a
    seq-first language model over `batchify`'d `(seq, batch)` data; a sequence length equal to
    the batch size (either layout fits); unbatched 2-D input and packed sequences; one sequence
    at a time, `(seq, 1, feature)`, against a per-step target without a DataLoader; modules
    built inside a library's own model. A module seen both ways is left alone.
    """

    code = "GD240"
    slug = "batch-first-mismatch"
    severity = Severity.WARNING
    summary = ("a module built with batch_first=False (LSTM, GRU, attention, Transformer) is given "
               "(batch, seq, feature) input: it mixes the samples of a batch")
    fix = ("build the module with batch_first=True, or give it the input as (seq, batch, feature) "
           "with x.transpose(0, 1)")

    def check(self, a):
        groups: dict[tuple, dict] = {}
        for e in a.by_kind.get("batch_layout", ()):
            groups.setdefault((e.loc, e["cls"]), {}).setdefault(e["layout"], e)
        for (loc, cls), seen in groups.items():
            event = seen.get("batch_first")
            if event is None or "seq_first" in seen:
                continue  # never batch-first, or seen both ways: not for this rule to judge
            yield self._finding(a, loc, cls, event)

    def _finding(self, a, loc, cls, e):
        d0, d1 = e["shape"]
        batch, source = e["batch"], e["source"]
        call = e.get("call")
        call_loc = Location(str(call[0]), int(call[1]), str(call[2])) if call else None
        target, built = _construction(a, loc, cls) if loc is not None else (None, None)
        name = f"`{target}`" if target else f"this {cls}"
        if cls in _RECURRENT:
            effect = (f"the {cls} steps through the {batch} samples of each batch as if they were "
                      f"time steps, carrying its hidden state from one sample into the next, and "
                      f"treats the {d1} time steps as separate sequences")
        else:
            effect = (f"attention mixes the {batch} samples of each batch with one another and "
                      f"never looks along the {d1} positions of a sequence")
        message = (f"{name} is built with batch_first=False, so it reads its input as (seq, batch, "
                   f"...), but it is given ({d0}, {d1}, ...): dim 0 is {batch}, "
                   f"{_SOURCES.get(source, 'the batch size')}, and dim 1 is not. {effect[0].upper()}"
                   f"{effect[1:]}: the model trains on scrambled data, and nothing fails")
        argument = _argument(a, call_loc, target, cls) if call_loc is not None else None
        build = f"`{target} = {built}`" if target and built else (
            f"`{built}`" if built else f"the {cls} with batch_first=True")
        note = (" (a TransformerEncoder/Decoder takes it from its layer)"
                if cls in ("TransformerEncoderLayer", "TransformerDecoderLayer") else "")
        transpose = (f"pass `{argument}.transpose(0, 1)`" if argument
                     else "give it the input as (seq, batch, ...) with `.transpose(0, 1)`")
        fix = (f"build {build}{note}, or {transpose} (its output is then (seq, batch, ...) too)")
        return self.finding(
            message, loc,
            related=(Related(call_loc, f"the call that gives it ({d0}, {d1}, ...) input"),)
            if call_loc is not None and call_loc != loc else (),
            evidence={"module": cls, "name": target, "shape": [d0, d1], "batch": batch,
                      "source": source},
            fix=fix)


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _construction(a, loc, cls: str) -> tuple[str | None, str | None]:
    """(the assignment target of the construction at ``loc``: ``self.rnn``, or None; the
    constructor's call as it should read: ``nn.LSTM(..., batch_first=True)``, or None), from
    the script's source."""
    tree = a.source.tree(loc.path)
    if tree is None:
        return None, None
    calls = [n for n in walk(tree) if isinstance(n, ast.Call)
             and n.lineno <= loc.line <= (n.end_lineno or n.lineno)
             and _call_name(n) in (cls, "__init__")]
    if not calls:
        return None, None
    call = min(calls, key=lambda n: (n.end_lineno or n.lineno) - n.lineno)  # the innermost
    others = [kw for kw in call.keywords if kw.arg != "batch_first"]
    args = "..., " if call.args or others else ""
    built = f"{ast.unparse(call.func)}({args}batch_first=True)"
    target = None
    for node in walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is call:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1:
                target = ast.unparse(targets[0])
    return target, built


def _argument(a, call_loc, target: str | None, cls: str) -> str | None:
    """The source text of the input given to the module at ``call_loc`` (``x`` in
    ``self.rnn(x)``), when the call names the module as its assignment target does."""
    if not target:
        return None
    function = target.rsplit(".", 1)[-1]
    return a.source.call_argument(call_loc.path, call_loc.line, function, 0,
                                  _INPUT.get(cls, "input"))
