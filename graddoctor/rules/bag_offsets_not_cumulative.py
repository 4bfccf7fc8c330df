from __future__ import annotations

import linecache
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule

_OFFSETS_ASSIGNED = re.compile(r"^\s*(\w*offsets?\w*)\s*=(?!=)")
_ASSIGNED = re.compile(r"^\s*([A-Za-z_]\w*)\s*=(?!=)")
_LENGTHS = re.compile(r"len|size|count|cumsum|start", re.I)


class BagOffsetsNotCumulative(Rule):
    """
    ## What it does
    Finds `nn.EmbeddingBag` (or `F.embedding_bag`) offsets that are no running start positions:
    at the first 8 calls under grad mode with a flat 1-D input, offsets that go down somewhere
    (`cat([0], lengths[:-1])`: the lengths given where their cumulative sum was meant), or, with
    4 bags or more, half the bags empty while the last one holds half the input or more. It
    points at the script's only assignment to a name with `offset` in it, else at the latest
    assignment above the call to a name the call passes whose value reads lengths, else at the
    call.

    ## Why is this bad?
    `offsets[i]` is where bag `i` starts in the flat input: the exclusive running sum of the bag
    lengths, 0 first, never decreasing. Given the lengths instead (or a sum shifted wrong), the
    bags no longer match the rows: where a start goes back, torch reads an empty bag without a
    word, the last bag swallows the rest of the input, and every user's (document's) pooled
    embedding is made of other rows' items. The loss still falls; the model learns from
    scrambled histories.

    ## Example
    ```python
    lengths = torch.tensor([len(h) for h in histories])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths[:-1]])
    pooled = bag(torch.cat(histories), offsets)
    ```

    ## Use instead
    ```python
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    ```

    ## Stays silent on
    Offsets from an exclusive cumulative sum (`F.pad(lengths.cumsum(0)[:-1], (1, 0))`,
    `lengths.cumsum(0) - lengths`); bags of one length (`arange(B) * L`); a few empty bags (users
    without history), or any number of them at the start of the batch, before the first bag
    that holds items (`[0, 0, 0, 0, 0, 1, 3]`); 2-D inputs (no offsets). Not seen: calls on an accelerator, calls after the
    first 8 or the first 3 backwards.
    """

    code = "GD343"
    slug = "bag-offsets-not-cumulative"
    severity = Severity.WARNING
    summary = ("EmbeddingBag offsets are no running start positions: the bags read other rows' "
               "items")
    fix = ("give the start of each bag: the exclusive cumulative sum of the lengths, "
           "`torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])`")

    def check(self, a):
        for event in a.of_kind("bag_offsets"):
            loc = event.loc
            if loc is None:
                continue
            assigned = self._offsets_line(a, loc.path, loc.line)
            shown = ""
            if assigned is not None:
                shown = f"`{assigned[1]}` makes "
                loc = Location(loc.path, assigned[0], None)
            if event["how"] == "decreasing":
                what = (f"{event['drops']} of the {event['bags']} starts go below the one before, so "
                        f"torch reads those bags as empty")
            else:
                what = (f"{event['empty']} of the {event['bags']} bags are empty")
            yield self.finding(
                f"{shown}EmbeddingBag offsets that are no running start positions: {what} and the "
                f"last bag holds {event['last']} of the {event['items']} items. Each row's pooled "
                f"embedding is made of other rows' items (the lengths given where their "
                f"cumulative sum was meant)",
                loc, fix=self.fix,
                evidence={k: event[k] for k in ("how", "bags", "items", "drops", "empty", "last")})

    @staticmethod
    def _offsets_line(a, path, line):
        """``(line, text)`` of the file's only assignment to a name with ``offset`` in it, else of
        the latest assignment above the call to a name the call's line passes whose value reads
        lengths (``len``, ``size``, ``count``, ``cumsum``, ``start``)."""
        try:
            lines = linecache.getlines(a.source.full(path))
        except Exception:
            return None
        found = [(number, text.split("  #")[0].strip()) for number, text in enumerate(lines, 1)
                 if _OFFSETS_ASSIGNED.match(text.split("#")[0])]
        if len(found) == 1:
            return found[0]
        if not 0 < line <= len(lines):
            return None
        passed = set(re.findall(r"\b[A-Za-z_]\w*\b", lines[line - 1].split("#")[0]))
        for number in range(line - 1, max(0, line - 40), -1):
            code = lines[number - 1].split("#")[0]
            match = _ASSIGNED.match(code)
            if match and match.group(1) in passed and _LENGTHS.search(code.split("=", 1)[1]):
                return number, lines[number - 1].split("  #")[0].strip()
        return None
