from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_TRANSPOSED = re.compile(r"\.t\(\)|\.T\b|\.mT\b|transpose\(|permute\(|swapaxes\(|movedim\(")


def _of_a_tensor(text: str) -> bool:
    """Whether a ``view``/``reshape`` call's receiver is a name, an attribute or a slice of one
    (``data.view(-1, bsz)``, ``data[:n].view(bsz, -1)``), not a call's result (a model's
    output reshaped for the loss: ``head(out).reshape(-1, V)``)."""
    try:
        call = ast.parse(text, mode="eval").body
    except SyntaxError:
        return False
    receiver = call.func.value if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) else None
    return receiver is not None and not any(isinstance(n, ast.Call) for n in walk(receiver))


def batchify_line(a, path: str) -> tuple[int, str] | None:
    """``(line, text)`` of the script's two-argument ``view``/``reshape`` with a ``-1`` outside a
    ``forward`` (``data.view(-1, bsz)``): where the stream is laid out; the only one, or the only
    one that transposes nothing among several; None when there is none or that leaves several.
    A call's result reshaped (``head(out).reshape(-1, V)``) is no stream."""
    found = []
    for line, text, in_forward in a.source.calls_named(path, {"view", "reshape"}):
        if in_forward or text.count(",") != 1 or "-1" not in text or not _of_a_tensor(text):
            continue
        found.append((line, a.source.line_text(path, line).split("  #")[0].strip()))
    if len(found) > 1:  # the one that transposes nothing, among several
        found = [f for f in found if not _TRANSPOSED.search(f[1])]
    return found[0] if len(found) == 1 else None


class TokenStreamInterleaved(Rule):
    """
    ## What it does
    Finds a language model whose token batches are cut from one token stream along the wrong
    axis, so that each of its sequences holds every `k`-th token of the corpus instead of `k`
    consecutive ones: `batchify` written `data.view(-1, bsz)` where
    `data.view(bsz, -1).t()` was meant (each column should be a contiguous stretch of the
    corpus), or `data.view(bsz, -1)` sliced along its first axis. At the first backwards the
    loss's graph is read: an embedding's ids that are a view of a 1-D token tensor (no copy),
    the loss's integer targets, and the axis along which the targets are the ids one step later
    (the time axis). Reported when, along that axis, the ids step through the stream `k > 1`
    tokens at a time while the other axis is contiguous in it, and the targets are the stream's
    tokens `k` places ahead, not the next ones.

    ## Why is this bad?
    The model is trained to predict the token `bsz` places further in the text from the tokens
    `bsz` places apart before it: a task the text barely determines. The loss falls a little
    (to about the unigram entropy) and stays there; perplexity is far worse than the data
    allows, and generation, which reads consecutive tokens, is nonsense. Nothing fails: the
    shapes are those the loop expects.

    ## Example
    ```python
    def batchify(data, bsz):
        nbatch = data.size(0) // bsz
        data = data.narrow(0, 0, nbatch * bsz)
        return data.view(-1, bsz).contiguous()      # (nbatch, bsz), columns interleaved
    ```

    ## Use instead
    ```python
    def batchify(data, bsz):
        nbatch = data.size(0) // bsz
        data = data.narrow(0, 0, nbatch * bsz)
        return data.view(bsz, -1).t().contiguous()  # column j: tokens j*nbatch .. (j+1)*nbatch-1
    ```

    ## Stays silent on
    `data.view(bsz, -1).t().contiguous()` (a copy: nothing to read) and without `.contiguous()`
    (a view whose time axis steps by 1); windows stacked or unfolded from the stream
    (`torch.stack([data[i:i + T] ...])`, `data.unfold(0, T, T)`); batch-first and sequence-first
    models alike, judged by the axis the targets are shifted along; targets that are the
    stream's next token whatever the layout; token batches on a GPU or copied out of the
    stream before the embedding (`.to(device)` to another device, `.clone()`): not read.
    """

    code = "GD314"
    slug = "token-stream-interleaved"
    severity = Severity.WARNING
    summary = ("a language model's sequences interleave its token stream (batchify's view "
               "without the transpose): each step skips bsz tokens of the corpus")
    fix = "lay the stream out as data.view(bsz, -1).t().contiguous(): one contiguous stretch per column"

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("stream_interleaved"):
            # the embedding trained by an optimizer, or by hand where the script has none
            params = [pid for pid in e.get("params") or () if pid in stepped or not stepped]
            shape, axis, stride = list(e.get("shape") or ()), e.get("axis"), e.get("stride")
            if not params or len(shape) != 2 or axis not in (0, 1) or not stride:
                continue
            loc = e.loc
            line = batchify_line(a, loc.path) if loc is not None else None
            if line is not None:
                loc = Location(loc.path, line[0])
            where = f"`{line[1]}`" if line is not None else "the token batches"
            time = "rows" if axis == 0 else "columns"
            yield self.finding(
                f"{where} lays the token stream out so that the language model's sequences (the "
                f"{time} of its {tuple(shape)} batches, the axis its targets are shifted along) "
                f"step through the corpus {stride} tokens at a time: each target is the token "
                f"{stride} places ahead in the text, not the next one, so the model learns a "
                f"task the text barely determines",
                loc, step=a.next_step_number(e.seq),
                evidence={"shape": shape, "axis": axis, "stride": stride,
                          "stream": e.get("stream"), "params": params},
                fix=("cut the stream into contiguous stretches, one per sequence: "
                     "`data.view(bsz, -1).t().contiguous()` for (seq_len, bsz) batches "
                     "(`data.view(bsz, -1)` sliced along its second axis for batch-first ones)"))
