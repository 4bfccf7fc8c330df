from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule


class VarianceSignFlipped(Rule):
    """
    ## What it does
    Finds a variance written out with a plus: the loss adds the square of a value's mean to the
    mean of its squares, `(d ** 2).mean() + lam * d.mean() ** 2`, where the formula subtracts it
    (`E[d²] - λ·E[d]²`). The classic is the scale-invariant log loss of monocular depth
    estimation (Eigen et al.'s SILog, `d = log(pred) - log(gt)`). Seen in the loss's graph at the
    first backwards: below its increasing functions (a `sqrt`, a `log`), through sums, means,
    views and products by constants, one computed tensor `d` is both squared-then-averaged and
    averaged-then-squared, both with a positive sign. Reported at the line that writes the sum
    (when the script has one), else at the backward.

    ## Why is this bad?
    `E[d²] - λ·E[d]²` is the variance of the log error (for λ = 1): it does not change when the
    whole prediction is scaled, which is what makes the loss scale-invariant: the network is
    trained on the scene's relative depths and the global scale costs it only `(1 - λ)` of the
    squared mean. With a plus the mean error is penalised `1 + λ` times instead: the loss asks for
    the absolute scale even harder than a plain squared log error does, the opposite of what the
    term was put there for. Nothing fails; the loss trains, toward something else.

    ## Example
    ```python
    d = torch.log(pred[mask]) - torch.log(gt[mask])
    loss = torch.sqrt((d ** 2).mean() + 0.85 * d.mean() ** 2)
    ```

    ## Use instead
    ```python
    d = torch.log(pred[mask]) - torch.log(gt[mask])
    loss = torch.sqrt((d ** 2).mean() - 0.85 * d.mean() ** 2)
    ```

    ## Stays silent on
    The variance with its minus (SILog, `d.pow(2).sum() / n - lam * d.sum() ** 2 / n ** 2`); a
    mean of squares plus the square of the mean of another tensor (a squared error plus a
    penalty on a different quantity's mean); a squared error alone; the mean of squares and
    the squared mean kept apart in different losses.
    """

    code = "GD417"
    slug = "variance-sign-flipped"
    severity = Severity.WARNING
    summary = ("a variance is written with a plus, mean(d ** 2) + lam * mean(d) ** 2 (the "
               "scale-invariant log loss with its sign flipped): the mean error is penalised "
               "more instead of being taken out")
    fix = "subtract the squared mean: (d ** 2).mean() - lam * d.mean() ** 2"

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("loss_unbounded"):
            if e.get("term") != "variance_added":
                continue
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids:
                continue
            loc, text, x = e.loc, None, None
            if loc is not None:
                lines = a.source.variance_added_lines(loc.path)
                if len(lines) == 1:
                    line, text, x = lines[0]
                    loc = Location(loc.path, line)
            said = f"`{text}`" if text else "the loss backpropagated here"
            name = x or "d"
            yield self.finding(
                f"{said} adds the square of `{name}`'s mean to the mean of its squares, for a "
                f"value the model computes from {a.names(pids)}: a variance subtracts it "
                f"(E[{name}²] - λ·E[{name}]²). With a plus the loss is not scale-invariant: the "
                f"mean (log) error, the global scale, is penalised more, not taken out, and the "
                f"model is trained toward the absolute scale instead of the relative structure",
                loc, step=a.next_step_number(e.seq),
                evidence={"op": e.get("op"), "params": pids[:16], "text": text},
                fix=(f"subtract the squared mean: ({name} ** 2).mean() - lam * {name}.mean() ** 2 "
                     f"(the scale-invariant log loss, under its sqrt if it has one)"))
