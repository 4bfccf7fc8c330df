from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from .softmax_wrong_axis import _dim_of

_NAMES = frozenset({"softmax", "log_softmax", "Softmax", "LogSoftmax"})


def _with_dim(text: str, dim: int) -> str | None:
    """The softmax call's source with its literal dim replaced by ``dim``; None when it cannot
    be rewritten."""
    try:
        call = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call):
        return None
    for keyword in call.keywords:
        if keyword.arg == "dim":
            keyword.value = ast.Constant(dim)
            return ast.unparse(call)
    for position in (1, 0):
        if len(call.args) > position and isinstance(call.args[position], (ast.Constant, ast.UnaryOp)):
            try:
                ast.literal_eval(call.args[position])
            except ValueError:
                continue
            call.args[position] = ast.Constant(dim)
            return ast.unparse(call)
    return None


class ClassAxisMismatch(Rule):
    """
    ## What it does
    Finds class scores normalised over one axis while the loss reads the target's class along
    another: a sequence tagger's `log_softmax(scores, dim=1)` on (batch, time, tags) scores
    read with `logp.gather(2, tags[..., None])`; a segmentation loss's `softmax(logits,
    dim=-1)` on (N, C, H, W) logits read with `p.gather(1, mask[:, None])` (a focal or a
    hand-written cross-entropy) or multiplied by a one-hot mask or soft targets laid out
    (N, C, H, W); a (N, C, T) frame classifier's `log_softmax(-1)` read along the classes.
    Seen in the graph of the first backwards: a gather whose input is (through log, clamp,
    arithmetic with a number) a softmax or log-softmax over another axis than the gather's,
    with an index that holds a different class at each position of the normalised axis; or
    such a result multiplied by a tensor without gradient that is a distribution (values at
    least 0, summing to 1; or to 0 at a minority of positions an ignore mask zeroed, as in
    `one_hot * valid`) along another axis than the normalised one; or such a result indexed
    per sample on its leading axes, the normalised one among them, then multiplied by a
    distribution along a remaining axis (a C51 critic's `log_softmax(out, dim=1)` on (batch,
    actions, atoms) output, the taken action's row `[arange(B), actions]` times the projected
    target over the atoms). Reported at the softmax call with that dim in the script.

    ## Why is this bad?
    The loss means to read each position's probability of its target class, which needs the
    scores normalised over the classes. Normalised over the time steps or a spatial axis, the
    entry it reads is the class's share across the positions: it depends on the other
    positions' scores and no position's classes sum to 1. The loss still falls (it pushes the
    target class up at one position against the same class at the others), the shapes agree,
    and the model learns a different ranking than its predictions, made with the class axis,
    need.

    ## Example
    ```python
    logp = torch.log_softmax(head(h), dim=1)          # h: (B, T, D) -> (B, T, C)
    loss = -logp.gather(2, tags.unsqueeze(-1)).mean()
    ```

    ## Use instead
    ```python
    logp = torch.log_softmax(head(h), dim=-1)         # over the tags, the axis gather reads
    ```

    ## Stays silent on
    A softmax over the axis the loss picks along (the classes; a pointer network over the
    positions it points at; a keypoint heatmap normalised over H*W and read there); a gather
    over another axis whose index is the same along the normalised axis (the last step of each
    sequence, a row of a distribution: whole distributions picked); a spatial soft-argmax
    multiplied by a coordinate grid; attention weights; `log_softmax(dim=2)` on CTC's
    (T, B, C) input; a per-sample pick of the normalised axis's rows after a softmax over the
    remaining axis (a per-action distribution over the atoms); a target that is a distribution
    along several axes (a permutation, an
    assignment); losses given the scores straight (`nll_loss`, `cross_entropy`: their class
    axis is `loss-input-mismatch`'s); a softmax over the batch, or a soft target
    normalised over the batch (a teacher's `softmax(t, dim=0)`), `softmax-over-batch`'s. Not seen: the scores permuted or reshaped between the
    softmax and the pick, a target built with gradient, and a pooling over the wrong axis
    (the channels for the points) — no normaliser there.
    """

    code = "GD213"
    slug = "class-axis-mismatch"
    severity = Severity.WARNING
    summary = ("class scores are normalised over one axis while the loss reads the target's "
               "class along another: the values it reads are no probabilities over the classes")
    fix = "normalise over the axis the loss picks the class along (the classes)"

    def check(self, a):
        used: set = set()
        # a softmax over dim 0 that softmax-over-batch names: the batch, not another position axis
        over_batch = {tuple(e["shape"]) for e in a.by_kind.get("softmax_batch", ())}
        # a soft target (a teacher's probabilities) normalised over the batch: softmax-over-batch
        # names the target's softmax, the scores' own axis is right
        targets = {tuple(e["shape"]) for e in a.by_kind.get("softmax_batch", ()) if e.get("target")}
        for event in a.by_kind.get("class_axis", ()):
            if event.loc is None or (event["dim"] == 0 and tuple(event["shape"]) in over_batch) \
                    or tuple(event["shape"]) in targets:
                continue
            path, shape = event.loc.path, list(event["shape"])
            ndim, dim, picked = len(shape), event["dim"], event["picked"]
            calls = [(line, text) for line, text, _forward in a.source.calls_named(path, _NAMES)
                     if (written := _dim_of(text)) is not None and written in (dim, dim - ndim)
                     and (path, line) not in used]
            if not calls:
                continue
            line, text = calls[0]
            used.add((path, line))
            size = "×".join(str(s) for s in shape)
            reads = (f"gathers the target's class along dimension {picked} (length "
                     f"{shape[picked]})" if event["how"] == "gather" else
                     f"multiplies it by targets that are a distribution along dimension "
                     f"{picked} (length {shape[picked]}: a one-hot mask or soft labels)")
            wanted = -1 if picked == ndim - 1 else picked
            fixed = _with_dim(text, wanted)
            yield self.finding(
                f"`{text}` normalises the {size} scores over dimension {dim} (length "
                f"{shape[dim]}), but the loss {reads}: each value it reads is the class's share "
                f"across the positions of dimension {dim}, not a probability over the classes, "
                f"and depends on the other positions' scores",
                Location(path, line), evidence={"fn": event["fn"], "shape": shape, "dim": dim,
                                                "picked": picked, "how": event["how"]},
                fix=(f"`{fixed}`: normalise over the classes, the axis the loss reads"
                     if fixed else f"normalise over dimension {picked} (`dim={wanted}`), the "
                                   f"classes the loss reads"))
