from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

# the op a mixing autograd node stands for: the names the script calls it by (searched in its
# source when the node's line is not known), and what to do instead
_OPS = {
    "View": ("view", ("view", "reshape", "flatten", "unflatten")),
    "UnsafeView": ("view", ("view", "reshape", "flatten", "unflatten")),
    "Reshape": ("view", ("reshape", "view")),
    "ReshapeAlias": ("view", ("reshape", "view")),
    "Permute": ("permute", ("permute",)),
    "Transpose": ("permute", ("transpose", "swapaxes")),
    "T": ("permute", ("t",)),
    "Softmax": ("softmax", ("softmax", "Softmax")),
    "LogSoftmax": ("softmax", ("log_softmax", "LogSoftmax")),
    "LinalgVectorNorm": ("normalize", ("normalize", "norm", "vector_norm")),
    "Norm": ("normalize", ("normalize", "norm")),
    "Flip": ("flip", ("flip", "flipud")),
    "Roll": ("flip", ("roll",)),
    "Mean": ("reduce", ("mean",)),
    "Sum": ("reduce", ("sum",)),
    "Amax": ("reduce", ("amax", "max")),
    "Max": ("reduce", ("max",)),
    "Min": ("reduce", ("min",)),
    "Logsumexp": ("reduce", ("logsumexp",)),
    "Cumsum": ("reduce", ("cumsum",)),
    "Cumprod": ("reduce", ("cumprod",)),
    "Prod": ("reduce", ("prod",)),
}
_FIXES = {
    "view": ("swap the batch and sequence axes with `{arg}.transpose(0, 1)` (or `.permute(...)`), "
             "not `view`/`reshape`: those keep the memory order, so a (batch, seq, ...) tensor "
             "viewed as (seq, batch, ...) puts pieces of different samples in one row"),
    "permute": "check the permutation: it moves the batch axis away from dim 0",
    "softmax": "normalise over the dimension meant (the classes, the time steps), not dim 0 (the batch)",
    "normalize": "normalise each sample over its features (dim=1), not over dim 0 (the batch)",
    "flip": "flip or roll along the dimension meant (a sequence or an image axis), not dim 0 (the batch)",
    "reduce": "reduce over each sample's own dimensions (`dim=1` or `dim=-1`), not over dim 0 (the batch)",
}
_GENERIC = ("keep the samples apart in `forward`: no op there should combine the rows of dim 0 "
            "(the batch)")


def _op(name: str | None) -> str:
    return (name or "").split("Backward", 1)[0]


class SamplesMixedInBatch(Rule):
    """
    ## What it does
    Finds models whose output for one sample depends on the other samples of the batch.
    graddoctor takes the gradient of one output row with respect to the model's intermediate
    tensors once, at the first backward (one extra `torch.autograd.grad` on the CPU), and
    follows it through the graph to the op that spreads it over the other rows: a `view` or
    `reshape` where a `transpose` was meant, `softmax` / `log_softmax` / `F.normalize` over
    `dim=0`, a `flip` or `roll` of dim 0, a mean or sum over the batch by hand. It points at
    that line in `forward` (found again on the model's next forward with anomaly mode's
    tracebacks, else by name).

    ## Why is this bad?
    Each sample is meant to be predicted from its own input. A model that mixes the rows of a
    batch trains each sample on what the others hold: `h.view(T, B, F)` of a `(B, T, F)`
    tensor cuts the samples into pieces and deals them across the batch, `softmax(dim=0)`
    normalises each class over the samples. Nothing fails, the loss still goes down a little,
    and at inference (one sample at a time, or another batch) the model sees something else.

    ## Example
    ```python
    def forward(self, x):  # x: (batch, seq, features)
        h = self.proj(x)
        out, _ = self.lstm(h.view(h.size(1), h.size(0), -1))  # seq-first for the LSTM
        return self.head(out[-1])
    ```

    ## Use instead
    ```python
    def forward(self, x):
        h = self.proj(x)
        out, _ = self.lstm(h.transpose(0, 1))
        return self.head(out[-1])
    ```

    ## Stays silent on
    BatchNorm in train mode, also over the frames of all clips merged into one batch for a
    per-frame encoder (`x.reshape(N * T, C, H, W)` ... `.reshape(N, T, -1)`) whose channel count
    equals the batch size; a batch normalisation written by hand (d2l's `batch_norm`: the batch
    mean over dim 0 is also blended into a running mean that inference reads); batch statistics
    on purpose (a ProGAN/StyleGAN minibatch-stddev layer); matrix products over the batch (a graph network's `adj @ h` over full-batch nodes,
    attention); in-model mixup (`x[perm]`); a model that returns a (B, B) similarity matrix
    (CLIP); `transpose`/`permute` between batch-first and seq-first layouts; seq-first models
    over `batchify`'d (seq, batch) data; inputs with another dimension as long as the batch
    (either could be the batch); a batch size the data does not tell (a DataLoader's batch, a
    loss target, or a loss comparing the output's rows with each other, `cdist(emb, emb)` or
    `emb @ emb.T`, tells it); models on an accelerator,
    under DDP, compiled, with custom autograd Functions, checkpointing or backward hooks (not
    probed); models that run an RNN over a `PackedSequence` (the packed data interleaves the
    samples by time step, and `pad_packed_sequence` regroups its rows in views the probe cannot
    tell from a mix: not probed). An RNN or attention module built with `batch_first=False`
    and given batch-first input is `batch-first-mismatch`'s; `log_softmax(dim=0)` just before
    `nll_loss` is `loss-input-mismatch`'s.
    """

    code = "GD243"
    slug = "samples-mixed-in-batch"
    severity = Severity.WARNING
    summary = ("the model's output for one sample depends on the other samples of the batch: an "
               "op in forward (view for transpose, softmax over dim 0) mixes them")
    fix = ("keep the samples apart in forward: transpose/permute instead of view to swap the "
           "batch axis, softmax/normalize over the features (dim=1 or -1), not dim 0")

    def check(self, a):
        if any(e.get("layout") == "batch_first" for e in a.by_kind.get("batch_layout", ())):
            return  # batch-first-mismatch names the module that mixes them
        over_batch = any(e.get("problem") in ("dim", "log-dim") for e in a.by_kind.get("loss_input", ()))
        best: dict = {}
        for e in a.by_kind.get("dependency", ()):
            if not e.get("mixed") or not e.get("op"):
                continue
            key = (e["model"], e.loc)
            if key not in best or (e.get("op_at") and not best[key].get("op_at")):
                best[key] = e
        for e in best.values():
            op = _op(e["op"])
            how, names = _OPS.get(op, (None, ()))
            if how == "softmax" and over_batch:
                continue  # loss-input-mismatch reports a (log of a) softmax over the batch at the loss
            if how == "reduce" and _folded_into_running_estimate(a, e):
                continue  # a batch normalisation by hand: its batch statistics feed running ones
            yield self._finding(a, e, op, how, names)

    def _finding(self, a, e, op: str, how: str | None, names: tuple):
        loc, text = _site(a, e, names)
        model = e["model"]
        where = f"`{text}`" if text else f"`{e['op']}`"
        message = (f"the output of {model} for one sample depends on the other samples of the "
                   f"batch ({e['batch']} samples): {where} in `{model}.forward` mixes them "
                   f"(the gradient of one output row reaches every row of the batch there, "
                   f"through `{e['op']}`). Each sample is trained on what the others hold, and "
                   f"a single sample at inference gives something else")
        arg = _receiver(text) if how == "view" and text else "x"
        fix = _FIXES.get(how, _GENERIC).format(arg=arg)
        fixed = _dim_fixed(text) if text and how in ("softmax", "normalize", "flip", "reduce") else None
        if fixed:
            fix = f"`{fixed}`: {fix[0].lower()}{fix[1:]}"
        return self.finding(
            message, loc or e.loc,
            evidence={"model": model, "op": e["op"], "batch": e["batch"],
                      "batch_from": e.get("source")},
            fix=fix)


def _site(a, e, names: tuple) -> tuple[Location | None, str | None]:
    """The line that made the mixing node and the call there: from the event's traceback, else
    the first call of one of ``names`` in the model's ``forward`` (by name in its file)."""
    at = e.get("op_at")
    if at:
        loc = Location(str(at[0]), int(at[1]), str(at[2]))
        return loc, _call_on(a, loc.path, loc.line, names)
    forward = e.get("forward")
    if not forward or not names:
        return None, None
    found = [c for c in a.source.calls_named(forward[0], frozenset(names)) if c[2]
             and c[0] >= int(forward[1])]
    if not found:
        return None, None
    line, text, _ = found[0]
    return Location(forward[0], line, "forward"), text


_BLEND_METHODS = frozenset({"lerp_", "lerp", "add_", "mul_", "copy_", "addcmul_"})


def _folded_into_running_estimate(a, e) -> bool:
    """Whether the batch statistic the mixing line assigns (``mean = X.mean(dim=0)``) is also
    blended, in the same function, into an estimate that outlives the batch: an assignment whose
    target it reads (``moving_mean = (1 - m) * moving_mean + m * mean``), an augmented one, or an
    in-place ``lerp_``/``add_``/``mul_``/``copy_`` given it. That is a batch normalisation written
    by hand (d2l's ``batch_norm``): the batch is normalised by its own statistics in training on
    purpose, and inference reads the running ones."""
    at = e.get("op_at")
    if not at:
        return False
    tree = a.source.tree(str(at[0]))
    line = int(at[1])
    if tree is None:
        return False
    functions = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.lineno <= line <= (n.end_lineno or n.lineno)]
    if not functions:
        return False
    function = max(functions, key=lambda n: n.lineno)
    at_line = [n for n in walk(function) if isinstance(n, ast.Assign) and n.lineno == line]
    stats = {t.id for n in at_line for t in n.targets if isinstance(t, ast.Name)}
    if not stats:
        return False
    # the tensor the statistic is taken of: overwriting it with its own normalised value
    # (`x = (x - mean) / std`) is the normalisation, not a running estimate
    inputs = {m.id for n in at_line for m in walk(n.value) if isinstance(m, ast.Name)}

    def reads(node, names) -> bool:
        return any(isinstance(n, ast.Name) and n.id in names for n in walk(node))

    for n in walk(function):
        if getattr(n, "lineno", 0) <= line:
            continue
        if isinstance(n, ast.Assign) and reads(n.value, stats):
            targets = {ast.unparse(t) for t in n.targets} - inputs
            if any(ast.unparse(m) in targets for m in walk(n.value)
                   if isinstance(m, (ast.Name, ast.Attribute))):
                return True
        if isinstance(n, ast.AugAssign) and reads(n.value, stats) \
                and ast.unparse(n.target) not in inputs:
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                and n.func.attr in _BLEND_METHODS and not reads(n.func.value, stats) \
                and any(reads(arg, stats) for arg in n.args):
            return True
    return False


def _call_on(a, path: str, line: int, names: tuple) -> str | None:
    calls = [c for c in a.source.calls_named(path, frozenset(names)) if c[0] == line] if names else []
    if calls:
        return min(calls, key=lambda c: len(c[1]))[1]
    text = a.source.line_text(path, line).strip()
    return text or None


def _receiver(text: str) -> str:
    """``h`` of ``h.view(T, B, -1)``."""
    head = text.split("(", 1)[0]
    return head.rsplit(".", 1)[0] if "." in head else "x"


def _dim_fixed(text: str) -> str | None:
    """The call with its batch dimension argument made 1 (``dim=0`` -> ``dim=1``), or None when
    the text names none."""
    for old, new in (("dims=[0]", "dims=[1]"), ("dims=(0,)", "dims=(1,)"), ("dims=0", "dims=1"),
                     ("dim=0", "dim=1")):
        if old in text.replace(" ", ""):
            return _respace(text, old, new)
    return None


def _respace(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` (written with or without spaces around ``=``) replaced by ``new``."""
    pattern = r"\s*".join(re.escape(ch) for ch in old)
    return re.sub(pattern, new, text, count=1)
