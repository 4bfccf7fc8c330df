from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule


def _with_dim_1(text: str) -> str | None:
    """The gather call's source with its literal dim 0 made 1, or None when it cannot be
    rewritten."""
    try:
        call = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call):
        return None
    for keyword in call.keywords:
        if keyword.arg == "dim" and isinstance(keyword.value, ast.Constant):
            keyword.value = ast.Constant(1)
            return ast.unparse(call)
    for position, arg in enumerate(call.args):
        if isinstance(arg, ast.Constant) and arg.value == 0 and not isinstance(arg.value, bool):
            call.args[position] = ast.Constant(1)
            return ast.unparse(call)
    return None


class GatherOverBatch(Rule):
    """
    ## What it does
    Finds a `gather` (or `take_along_dim`) on the loss's path that picks each sample's value
    along dim 0, the batch, with an index of class or action numbers: DQN's
    `policy_net(states).gather(0, actions)` on (batch, actions) Q-values, a hand-written
    negative log-likelihood `log_probs.gather(0, labels.unsqueeze(1))`, a policy gradient's
    `log_pi.gather(0, actions)`. Seen in the graph of the first backwards: the gather's input is
    laid out like a batch of samples (dim 0 as long as the data the graph read and the
    DataLoader's batch, dim 1 longer than 1, not a square (B, B) matrix), its index has one row
    per sample and fewer columns than the input, and every number in it is below the length of
    dim 1, which is below the batch size: the numbers of the other axis. Reported at the call
    with dim 0 in the script. The same per-sample pick written as an advanced index over the
    columns, `probs[:, labels]` on (batch, classes) scores with one class number per sample (a
    hand-written GCE, MAE or NLL): the index is as long as the batch, its numbers are below the
    number of classes (and repeat, or the classes are fewer than the samples), so the result is a
    (batch, batch) matrix of every row's score for every sample's class. Reported at that
    subscript.

    ## Why is this bad?
    `q.gather(0, a)` reads `q[a[i], j]`: for sample `i` the value in the row numbered by its
    action, not the value of the action it took in its own row. The index is in range (an
    action or class number is always below the batch size), so nothing fails and every shape
    agrees; the loss trains the first column of the first few rows toward the targets of every
    sample, and the other outputs never learn. A DQN's greedy policy stays random; a classifier
    trained this way predicts nothing. `probs[:, labels]` broadcasts the other way: each row's
    loss averages its scores for the labels of the whole batch, so every sample is pulled toward
    the batch's class mix rather than its own class.

    ## Example
    ```python
    q = policy_net(states).gather(0, actions.unsqueeze(1)).squeeze(1)   # (B, A) -> (B,)
    loss = F.smooth_l1_loss(q, rewards + gamma * next_q * (1 - dones))
    ```

    ## Use instead
    ```python
    q = policy_net(states).gather(1, actions.unsqueeze(1)).squeeze(1)   # each sample's action
    ```

    ## Stays silent on
    A gather over each sample's own axis (`dim=1`, `dim=-1`); rows reordered or looked up whole
    along dim 0 (`x.gather(0, perm[:, None].expand(-1, D))`, an index as wide as the input); an
    index whose numbers reach past dim 1's length (row numbers: a lookup of other samples on
    purpose, a memory bank); a time-major (T, B) output gathered at each sequence's last step
    (`out.gather(0, (lengths - 1)[None])`, one row of picks, not one per sample); a square
    (B, B) similarity matrix; a 1-D gather; a batch no longer than the number of classes (the
    numbers could be either). Paired advanced indices `probs[torch.arange(B), labels]`; columns
    picked by a set of distinct numbers at least as many classes as the batch (a sampled
    softmax's shared negatives `scores[:, sampled]`). Not told apart: a gather along dim 0 whose dim is a variable in
    the script (no call with a literal 0 to point at: nothing is reported).
    """

    code = "GD323"
    slug = "gather-over-batch"
    severity = Severity.WARNING
    summary = ("a gather on the loss's path picks along dim 0, the batch, with class or action "
               "numbers as its index: each sample reads another sample's row")
    fix = "gather along each sample's own axis (`dim=1` for (N, C) scores), not along dim 0"

    def check(self, a):
        used: set = set()
        for event in a.by_kind.get("gather_batch", ()):
            if event.loc is None:
                continue
            path = event.loc.path
            if event.get("crossed"):
                picks = [c for c in a.source.column_picks_by_name(path) if (path, c[0]) not in used]
                if picks:
                    used.add((path, picks[0][0]))
                    yield self._crossed(event, path, *picks[0])
                continue
            calls = [c for c in a.source.gather_first_axis_calls(path) if (path, c[0]) not in used]
            if not calls:
                continue
            line, text = calls[0]
            used.add((path, line))
            shape = "×".join(str(s) for s in event["shape"])
            fixed = _with_dim_1(text)
            yield self.finding(
                f"`{text}` picks along dim 0, the {event['batch']} samples of a {shape} tensor, "
                f"with an index whose numbers (at most {event['largest']}) are below its "
                f"{event['shape'][1]} columns: sample i reads the row numbered by its class or "
                f"action, not its own row, so the loss trains a few rows' values toward every "
                f"sample's target and the others never learn",
                Location(path, line),
                evidence={"shape": event["shape"], "index": event["index"],
                          "largest": event["largest"], "batch": event["batch"]},
                fix=(f"`{fixed}`: pick along each sample's own axis" if fixed else None))

    def _crossed(self, event, path: str, line: int, text: str, value: str, index: str):
        batch, width = event["shape"]
        return self.finding(
            f"`{text}` picks the columns numbered by `{index}` in every row of a {batch}×{width} "
            f"tensor: with one class number per sample (all below {width}), it is a {batch}×{batch} "
            f"matrix where row i holds its scores for every sample's class, not one value per "
            f"sample, and the loss averages it: each sample is pushed toward the classes of the "
            f"whole batch instead of its own",
            Location(path, line),
            evidence={"shape": event["shape"], "index": event["index"],
                      "largest": event["largest"], "batch": event["batch"], "crossed": True},
            fix=(f"pick one value per row: `{value}[torch.arange({value}.size(0)), {index}]` (or "
                 f"`{value}.gather(1, {index}[:, None]).squeeze(1)`)"))
