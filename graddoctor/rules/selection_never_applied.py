from __future__ import annotations

from ..analysis.unused_selections import unused_selections
from ..findings import Related, Severity
from ..trace import Location
from .base import Rule


class SelectionNeverApplied(Rule):
    """
    ## What it does
    Finds a per-sample selection that the training loop computes and never applies: small-loss
    indices for co-teaching or sample selection (`idx = torch.argsort(loss_2.detach())[:k]`),
    a confidence or loss-threshold mask (`mask = conf >= tau`, `keep = loss_u < q`), computed
    from a per-sample loss (`reduction="none"`) or the model's probabilities, in the loop that
    calls `backward()`, and read nowhere in the script afterwards. Read from the script's
    source, in the files whose backwards ran. When the loop reduces a per-sample loss whole in
    exactly one statement (`loss_1 = l1.mean()`), that is the statement pointed at: it is where
    the selection was meant to apply; otherwise the selection itself.

    ## Why is this bad?
    Noisy-label methods (co-teaching, small-loss selection, JoCoR), pseudo-labelling and
    curriculum schemes work by leaving samples out of the update: the selection *is* the
    method. Computed and then dropped, the update uses every sample, noisy labels and unsure
    pseudo-labels included, and the model memorises the noise the selection was there to keep
    out. Nothing fails; the loss falls, faster than it should.

    ## Example
    ```python
    idx_1 = torch.argsort(l1.detach())[:keep]
    idx_2 = torch.argsort(l2.detach())[:keep]
    loss_1 = l1.mean()                      # net 1 on the whole noisy batch
    loss_2 = l2[idx_1].mean()
    ```

    ## Use instead
    ```python
    loss_1 = l1[idx_2].mean()               # net 1 on the samples net 2 finds clean
    loss_2 = l2[idx_1].mean()
    ```

    ## Stays silent on
    A selection the script reads anywhere after (an index, a mask multiplied in, a warm-up
    branch that uses the whole batch and a later branch that uses the selection); numbers kept
    for logging (`(loss < tau).float().mean()`, `.sum()`, `.item()`); equality comparisons
    (accuracy, agreement); selections outside the training loop (evaluation, data cleaning
    between epochs) and from values that are neither a per-sample loss nor probabilities.
    """

    code = "GD357"
    slug = "selection-never-applied"
    severity = Severity.WARNING
    summary = ("a per-sample selection (small-loss indices, a confidence mask) is computed in the "
               "training loop and never applied: the update uses every sample")
    fix = "index or weight the loss with the selection (`loss[idx].mean()`, `(loss * mask).mean()`)"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for found in unused_selections(a.source.full(path)):
                name, line = found["name"], found["line"]
                if found["use_line"] is not None:
                    loc = Location(path, found["use_line"], None)
                    related = (Related(Location(path, line, None),
                                       f"the selection `{name}` nothing reads"),)
                    message = (f"`{found['text']}` selects samples from `{found['source']}` and "
                               f"nothing reads `{name}`: `{found['use_text']}` reduces the "
                               f"per-sample loss over the whole batch, so the update trains on "
                               f"every sample, the ones the selection was there to leave out "
                               f"(noisy labels, unsure pseudo-labels) included")
                    loss = found["use_loss"]
                    fix = (f"apply the selection where the loss is reduced: `{loss}[{name}].mean()`"
                           if found["picks"] else
                           f"apply the mask where the loss is reduced: `({loss} * {name}).sum() / "
                           f"{name}.sum().clamp(min=1)`")
                else:
                    loc = Location(path, line, None)
                    related = ()
                    message = (f"`{found['text']}` selects samples from `{found['source']}` in the "
                               f"training loop and nothing reads `{name}`: the loss is computed "
                               f"over every sample, the ones the selection was there to leave out "
                               f"included")
                    fix = (f"index or weight the loss with `{name}` (`loss[{name}].mean()`, "
                           f"`(loss * {name}).mean()`), or remove the selection")
                yield self.finding(message, loc, related=related, fix=fix,
                                   evidence={"selection": name, "line": line,
                                             "use_line": found["use_line"]})
