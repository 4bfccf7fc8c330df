from __future__ import annotations

from ..analysis.group_broadcast import group_indices_used_flat
from ..findings import Severity
from ..trace import Location
from .base import Rule


class GroupIndexNotOffset(Rule):
    """
    ## What it does
    Finds a position picked within each group of a flat batch used as a row of the flat batch
    itself: best-of-n `best = scores.view(B, N).argmax(dim=1)` (a number in `[0, N)`), then
    `seq[best]` on the `B * N` sampled sequences, with no `+ torch.arange(B) * N` offset. Read
    from the script's source, in the files whose backwards ran: an `argmax`/`argmin` over axis 1
    (or `max(dim=1).indices`, `topk(k, dim=1).indices`) of a two-dimensional `view`/`reshape`
    of a flat tensor, assigned to a name that then indexes the rows of a batch of groups (a
    tensor made, directly or through the names it was computed from, with `repeat_interleave`
    or `repeat`), in the same function. It points at the pick.

    ## Why is this bad?
    The index counts within a group; the flat batch counts across groups. Without the group's
    start added, every prompt's "best" completion is taken from the first prompt's group: the
    rejection-sampling fine-tuning (or best-vs-worst preference pair) trains each prompt on a
    completion sampled for another one, chosen by another group's scores. The shapes fit and
    the loss falls; the selected data is simply wrong.

    ## Example
    ```python
    scores = reward_model(seq).view(B, N)
    best = scores.argmax(dim=1)
    loss = sft_loss(policy, seq[best])
    ```

    ## Use instead
    ```python
    best = scores.argmax(dim=1) + torch.arange(B) * N   # or seq.view(B, N, -1)[torch.arange(B), best]
    loss = sft_loss(policy, seq[best])
    ```

    ## Stays silent on
    The offset added (in the assignment or in the subscript); the grouped view indexed by row
    and pick (`seq.view(B, N, -1)[torch.arange(B), best]`, `gather` along the group axis); picks
    indexing a table of the group's own size (a shared candidate list, made without a
    repetition); `keepdim` picks. Not seen: picks made in another function, a batch of groups
    made by a loop or a function's return (no `repeat` in the script's text).
    """

    code = "GD336"
    slug = "group-index-not-offset"
    severity = Severity.WARNING
    summary = ("a position picked within each group (argmax over a group view's axis) indexes the "
               "flat batch without the group's offset: every pick lands in the first group")
    fix = "add each group's start to the pick (idx + torch.arange(B) * N) or index the grouped view"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, name, indexed, used_at in group_indices_used_flat(a.source.full(path)):
                what = (f"`{name}` is a position within each group (0 to the group size), but line "
                        f"{used_at} uses it as a row of the flat `{indexed}`: without each group's "
                        f"start added, every group's pick is taken from the first group's rows")
                yield self.finding(
                    what, Location(path, line, None),
                    fix=(f"add the group offsets (`{name} + torch.arange(len({name})) * group_size`) "
                         f"or index the grouped view of `{indexed}` by row and `{name}`"),
                    evidence={"index": name, "indexed": indexed, "used_at": used_at})
