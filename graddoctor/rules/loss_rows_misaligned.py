from __future__ import annotations

from .base import Rule
from .view_reorders_axes import reshape_calls
from ..findings import Severity


def reorder(lead_target, lead_scores) -> list[int] | None:
    """The order of the target's leading axes that gives the scores' (``permute(order)``), or
    None when the sizes do not name one (an axis length twice)."""
    if len(set(lead_target)) != len(lead_target):
        return None
    try:
        return [list(lead_target).index(size) for size in lead_scores]
    except ValueError:
        return None


def _fixed_call(a, loc, order: list[int], dims: int) -> tuple[str, str] | None:
    """``(the flattening call as written, the same call on the target reordered)``: the one
    call on the line that gives ``dims`` axes (the scores' own may share the line)."""
    found = []
    for text, receiver, args, method, given in reshape_calls(a, loc, {"view", "reshape", "flatten"}):
        if method != "flatten" and given != dims:
            continue
        moved = [i for i, o in enumerate(order) if i != o]
        reordered = (f"{receiver}.transpose({moved[0]}, {moved[1]})" if len(moved) == 2
                     else f"{receiver}.permute({', '.join(map(str, order))})")
        method = "reshape" if method == "view" else method  # a view of a transposed tensor fails
        found.append((text, f"{reordered}.{method}({args})"))
    return found[0] if len(found) == 1 else None


class LossRowsMisaligned(Rule):
    """
    ## What it does
    Finds a loss whose scores and target were both flattened into rows, from the same axes in
    another order: (B, T, C) logits flattened with `logits.reshape(-1, C)` against a (T, B)
    target flattened with `target.reshape(-1)`, or a sequence-first model's (T, B, C) output
    against batch-first (B, T) labels, under any loss that pairs rows (cross-entropy, the
    regressions, `F.l1_loss`, `kl_div`, `poisson_nll_loss`: torch builds the last ones of plain
    ops, and their calls are watched for their target). At the first backwards, the loss's target is
    matched with the script's own `view`/`reshape`/`flatten` call that made it (the calls are
    watched until then), and the shape the scores were flattened from is read from the view node
    below the loss (through its own log_softmax). Reported at the target's flattening.

    ## Why is this bad?
    Flattening merges the leading axes in memory order: row `k` of the scores is position
    `divmod(k, T)` = (b, t), while row `k` of a (T, B) target is `divmod(k, B)` = (t, b). Every
    row is scored against another position's label (all but a handful: those where the two
    orders meet). The shapes agree, nothing fails, and the loss still moves a little, because
    the labels' overall distribution is right; the model never learns which position has
    which label.

    ## Example
    ```python
    logits = model(tokens)                       # (B, T, C)
    tags = tags.t().contiguous()                 # (T, B), the layout of an old loader
    loss = F.cross_entropy(logits.reshape(-1, C), tags.reshape(-1))
    ```

    ## Use instead
    ```python
    loss = F.cross_entropy(logits.reshape(-1, C), tags.transpose(0, 1).reshape(-1))
    ```

    ## Stays silent on
    Scores and target flattened from the same axis order (both (B, T) or both (T, B)); axes of
    one length (B equal to T: the orders cannot be told apart); a target made flat some other
    way than a flattening call in the script (concatenated per step, drawn flat), or converted
    after it (`.float()` makes a new tensor); scores given to the loss unflattened. A language
    model's next-token targets flattened in the other order are loss-input-mismatch's (it
    reads them against the input tokens).
    """

    code = "GD315"
    slug = "loss-rows-misaligned"
    severity = Severity.WARNING
    summary = ("a loss's scores and target were flattened from the same axes in another order "
               "((B, T, C) scores against a (T, B) target): each row meets another position's target")
    fix = "put the target's axes in the scores' order before flattening it (or the scores' in the target's)"

    def check(self, a):
        # next-token targets flattened in the other order: loss-input-mismatch's, with the tokens
        order_lines = {(str(d.loc.path), d.loc.line) for d in a.of_kind("loss_input")
                       if d.get("problem") == "order" and d.loc is not None}
        for e in a.of_kind("rows_misaligned"):
            if e.loc is None or (str(e.loc.path), e.loc.line) in order_lines:
                continue
            scores_from, target_from = tuple(e["scores_from"]), tuple(e["target_from"])
            lead_scores = scores_from[:len(scores_from) - (len(e["scores"]) - 1)]
            lead_target = target_from[:len(target_from) - (len(e["target"]) - 1)]
            order = reorder(lead_target, lead_scores)
            call = _fixed_call(a, e.loc, order, len(e["target"])) if order else None
            rows = e["target"][0]
            written = f"`{call[0]}`" if call else "the target's flattening"
            yield self.finding(
                f"{e['fn']} gets scores flattened from {_shape(scores_from)} to "
                f"{_shape(e['scores'])} and a target flattened by {written} from "
                f"{_shape(target_from)} to {_shape(e['target'])}: the same axes in another "
                f"order. The scores' rows run over {_shape(lead_scores)} in memory order, the "
                f"target's over {_shape(lead_target)}, so almost every one of the {rows} rows "
                f"is scored against another position's target; nothing fails because the row "
                f"counts agree",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"fn": e["fn"], "scores_from": list(scores_from),
                          "target_from": list(target_from), "order": order},
                fix=(f"`{call[1]}` in place of `{call[0]}`: the target in the scores' axis "
                     f"order ({_shape(lead_scores)}) before it is flattened" if call else None))


def _shape(sizes) -> str:
    return "(" + ", ".join(str(s) for s in sizes) + ")"

