from __future__ import annotations

import ast
import itertools

from ..findings import Severity
from ..trace import Location
from .base import Rule


def _running(sizes) -> list[int]:
    out, product = [], 1
    for size in sizes:
        product *= size
        out.append(product)
    return out


def _groups(sizes, target) -> list[list[int]] | None:
    """The runs of consecutive indices of ``sizes`` whose products are ``target``'s sizes in
    order, or None when ``target`` is not ``sizes`` merged."""
    groups, run, product, at = [], [], 1, 0
    for i, size in enumerate(sizes):
        run.append(i)
        product *= size
        if at < len(target) and product == target[at]:
            groups.append(run)
            run, product, at = [], 1, at + 1
        elif at >= len(target) or product > target[at]:
            return None
    return groups if at == len(target) and not run else None


def axis_order(shape_in, shape_out) -> list[int] | None:
    """The order of the input's axes that a permute before the reshape needs (``x.permute(order)
    .reshape(shape_out)`` keeps each axis whole), for an input without axes of length 1; None
    when it is not found."""
    a = [int(s) for s in shape_in]
    b = [int(s) for s in shape_out if int(s) != 1]
    if 1 in a:
        return None
    for order in itertools.permutations(range(len(a))):  # merges: output axes of runs of input axes
        if list(order) != list(range(len(a))) and _groups([a[i] for i in order], b) is not None:
            return list(order)
    for order in itertools.permutations(range(len(b))):  # splits: input axes of runs of output axes
        groups = _groups([b[i] for i in order], a)
        if list(order) != list(range(len(b))) and groups is not None:
            first = [min(order[j] for j in group) for group in groups]
            return sorted(range(len(a)), key=lambda axis: first[axis])
    return None


def reshape_calls(a, loc: Location, names=frozenset({"view", "reshape"})) -> list[tuple[str, str, str, str, int]]:
    """``(call text, receiver, arguments, method, arguments given)`` of each call named in
    ``names`` on ``loc``'s line, ``torch.reshape(x, ...)``/``torch.flatten(x, ...)`` read as a
    call on ``x``."""
    out = []
    for line, text, _forward in a.source.calls_named(loc.path, frozenset(names)):
        if line != loc.line:
            continue
        try:
            call = ast.parse(text, mode="eval").body
        except SyntaxError:
            continue
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
            continue
        given = list(call.args)
        if isinstance(call.func.value, ast.Name) and call.func.value.id == "torch" and given:
            receiver, given = ast.unparse(given[0]), given[1:]
        else:
            receiver = ast.unparse(call.func.value)
        args = ", ".join(ast.unparse(arg) for arg in given)
        out.append((text, receiver, args, call.func.attr, len(given)))
    return out


def _call(a, loc: Location) -> tuple[str, str, str] | None:
    """``(call text, receiver, arguments)`` of the view/reshape call on ``loc``'s line."""
    calls = reshape_calls(a, loc)
    return calls[0][:3] if calls else None


class ViewReordersAxes(Rule):
    """
    ## What it does
    Finds a `view` or `reshape` whose output is its input's axes in another order, where a
    `transpose`/`permute` was meant: `x.view(B, C, T)` of a (B, T, C) tensor (for a `Conv1d`, or
    to give `cross_entropy` its classes on dim 1), `f.view(B, H * W, C)` of a (B, C, H, W) map
    (for `f.flatten(2).transpose(1, 2)`), `x.reshape(B, D, h, w)` of (B, N, D) tokens,
    `out.reshape(B, T, heads * d)` of a (B, heads, T, d) attention output. At the first
    backwards, the view and reshape nodes of the loss's graph are read (their input sizes are
    saved, their output shape is in the node's metadata); the ones whose sizes other than 1 are
    no split or merge of whole axes in order, but are one once the axes are put in another
    order, are matched with the call the script made (`Tensor.view`, `Tensor.reshape` and
    `torch.reshape` are watched until then). It points at that call. A batch without gradient
    laid out for the model in the training loop (`clips.reshape(N, C, T, H, W)` of (N, T, C, H,
    W) clips for a `Conv3d`) has no view node in the graph: it counts when a node of the loss's
    graph (a convolution, a Linear's product, an elementwise product) saved that very tensor
    as its input. A regrouping in memory order stays silent, unless its sizes are one later
    axis, shorter than the axes it passes, folded into the first: `x.reshape(B * C, L)` of a
    (B, L, C) window (a channel-independent forecaster that forgot its `permute(0, 2, 1)`),
    `q.reshape(B * H, T, d)` of (B, T, H, d); read as a regrouping, those would cut the longer
    axes into pieces exactly the short axis long.

    It also finds channel-first scores flattened into rows of classes without moving the classes
    last: `logits.reshape(-1, C)` of a segmentation network's (N, C, H, W) output (or a frame
    tagger's (N, C, T)) given to `cross_entropy`. When W is a multiple of C the sizes alone read
    as a regrouping in memory order, so the graph must show two more things: the reshaped
    tensor's axis 1 of size C was made by a channel-first op (a convolution, or the
    normalisation, pooling or upsampling after one) and a softmax or log_softmax (the loss's
    own) normalises each row of C as a distribution over classes.

    And an integer one-hot encoding (`F.one_hot`'s output: 0/1, one 1 along its last axis)
    viewed with the class axis moved: `F.one_hot(mask, C).view(N, C, H, W)` where
    `permute(0, 3, 1, 2)` was meant, for a dice loss or a hand-written cross-entropy. It is
    read where the script reshapes it (under grad mode, before a backward: the loss's target)
    and reported with the parameters that backward trains.

    ## Why is this bad?
    `view` and `reshape` never move an element: they cut the same memory order into rows of the
    new shape. Viewing (B, T, C) as (B, C, T) does not swap time and channels; each new
    "channel" is a run of T consecutive numbers of the old layout, a few time steps of every
    channel. The shapes agree, nothing fails, the loss still goes down a little, and the model
    learns from inputs scrambled within every sample (a convolution over time sees channels, a
    tagger's class scores are read from other positions).

    ## Example
    ```python
    def forward(self, x):  # x: (batch, time, channels)
        b, t, c = x.shape
        h = self.conv(x.view(b, c, t))
    ```

    ## Use instead
    ```python
    def forward(self, x):  # x: (batch, time, channels)
        h = self.conv(x.transpose(1, 2))
    ```

    ## Stays silent on
    Splits and merges of whole axes in memory order (heads split `view(B, T, H, D)` and merged
    after `transpose(1, 2)`, `flatten`, `view(B, -1)`); a reshape after the right `permute`
    (`permute(0, 2, 3, 1).contiguous().view(B, -1, 4)`); frame stacking `reshape(B, T // k, k * C)`
    (a split and a merge in order); channels folded into the batch after their move
    (`x.permute(0, 2, 1).reshape(B * C, L)`); axes of length 1 moved (they hold no order); reshapes of data
    that needs no gradient outside a forward that no layer of the loss's graph reads as it is
    (a copy for a plot, a value normalised before the model); reshapes in libraries' own code,
    or not reaching the loss; Transformer-XL's
    relative shift (scores padded with one column, viewed with their last two sizes swapped and
    sliced: the Music Transformer's skewing); scores flattened after `permute(0, 2, 3, 1)` or
    `movedim(1, -1)`, or given to the loss as (N, C, H, W); channels-last scores whose last axis
    holds the classes (a Linear head over (N, H, W, F) features, even when H equals C); K heads
    packed in one Linear's (B, T, K * C) output split into rows of C; channel-first features
    flattened to rows that no softmax reads. Not told apart: two
    axes of the same length swapped (the shape looks unchanged); a regrouping that happens to
    have the sizes of a reordering (stacking k frames where T / k equals C) reads as the bug;
    class rows of (N, C, H, W) scores whose width equals C (the sizes cannot tell the class axis).
    When samples-mixed-in-batch reports the same line (the batch axis moved), or
    loss-input-mismatch does (a loss's (N, C, T) scores flattened to rows with `reshape(-1, C)`),
    it is left to them.
    """

    code = "GD154"
    slug = "view-reorders-axes"
    severity = Severity.WARNING
    summary = ("a view/reshape gives its input's axes in another order (x.view(B, C, T) of a "
               "(B, T, C) tensor): it scrambles each sample where a transpose was meant")
    fix = "use transpose/permute to reorder axes (then reshape); view only splits or merges them"

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        mixed_lines = {(str(at[0]), int(at[1])) for d in a.of_kind("dependency")
                       if d.get("mixed") and (at := d.get("op_at"))}
        # a classification loss's (N, C, ...) scores flattened to rows: loss-input-mismatch's
        rows = [d for d in a.of_kind("loss_input") if d.get("problem") == "rows"]
        rows_lines = {(str(d.loc.path), d.loc.line) for d in rows if d.loc is not None}
        rows_sources = {tuple(d.get("source") or ()) for d in rows}
        for e in a.of_kind("view_axes"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids or e.loc is None:
                continue  # nothing trained makes the reshaped value
            shape_in, shape_out = tuple(e.get("shape_in") or ()), tuple(e.get("shape_out") or ())
            if (str(e.loc.path), e.loc.line) in mixed_lines | rows_lines or shape_in in rows_sources:
                continue  # the batch axis moved, or a loss's rows cut across its classes
            order = axis_order(shape_in, shape_out)
            call = _call(a, e.loc)
            written = f"`{call[0]}`" if call else "a view/reshape"
            permuted = tuple(shape_in[i] for i in order) if order else None
            if call and order:
                receiver, args = call[1], call[2]
                swapped = [i for i, o in enumerate(order) if i != o]
                reorder = (f"{receiver}.transpose({swapped[0]}, {swapped[1]})" if len(swapped) == 2
                           else f"{receiver}.permute({', '.join(map(str, order))})")
                fixed = reorder if permuted == shape_out else f"{reorder}.reshape({args})"
                fix = (f"reorder the axes, do not view them: `{fixed}` in place of `{call[0]}`")
            else:
                fix = ("reorder the axes with transpose/permute (then reshape if axes are merged "
                       "or split); view/reshape alone keeps the memory order")
            classes = e.get("classes")
            if classes:
                yield self.finding(
                    f"{written} flattens channel-first scores of shape {shape_in} into rows of "
                    f"{classes} ({shape_out}) that are normalised as class distributions, but "
                    f"view/reshape moves no element: each row is {classes} consecutive values of "
                    f"the last axis, the scores of one class at {classes} neighbouring "
                    f"positions, not the {classes} class scores of one position. The labels are "
                    f"matched with the wrong numbers, so {a.names(pids)} are trained towards "
                    f"noise. Nothing fails because the shapes agree",
                    e.loc, step=a.next_step_number(e.seq),
                    evidence={"shape_in": list(shape_in), "shape_out": list(shape_out),
                              "order": order, "classes": classes, "params": pids[:16]},
                    fix=fix if call and order else
                    f"move the class axis last before flattening: scores.movedim(1, -1)"
                    f".reshape(-1, {classes}) (or give the loss the (N, C, ...) scores unflattened)")
                continue
            if e.get("one_hot"):
                yield self.finding(
                    f"{written} turns a one-hot encoding of shape {shape_in} (classes on the last "
                    f"axis) into {shape_out}, but view/reshape moves no element: along the new "
                    f"class axis each position no longer holds one 1 at its class, the 0s and 1s "
                    f"of neighbouring positions are cut into it. The loss compares the scores "
                    f"with that scrambled target, so {a.names(pids)} learn the wrong classes. "
                    f"Nothing fails because the shapes agree",
                    e.loc, step=a.next_step_number(e.seq),
                    evidence={"shape_in": list(shape_in), "shape_out": list(shape_out),
                              "order": order, "one_hot": True, "params": pids[:16]},
                    fix=fix)
                continue
            same = sorted(x for x in shape_in if x != 1) == sorted(x for x in shape_out if x != 1)
            how = "the same sizes in another order" if same else "its axes merged in another order"
            yield self.finding(
                f"{written} turns a tensor of shape {shape_in} into {shape_out}: {how}, but view/reshape moves no element, it cuts the memory order "
                f"into new rows. Each sample's values are scrambled across its axes (what lands "
                f"on one axis is a run of consecutive elements of the old layout), so "
                f"{a.names(pids)} train on mixed-up positions and features. Nothing fails "
                f"because the shapes agree",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"shape_in": list(shape_in), "shape_out": list(shape_out),
                          "order": order, "params": pids[:16]},
                fix=fix)
