from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule


class LossTermConstant(Rule):
    """
    ## What it does
    Finds a term of the loss whose value stays the same from one step to the next while the
    loss itself moves: a number the model cannot change, computed from its activations and added
    to the loss. It is read at the first 4 backwards of each backward line from the scalar
    variables of the backward's frame that make up the loss's sum (`reg`, `aux`,
    `norm_penalty`). A term counts as constant when its values agree to a millionth of their
    size (or all lie within 1e-9 of zero against the loss) while the loss's values spread by a
    thousandth or more. It points at the statement that assigns the term or, when one of the
    frame's tensors computed only for it stayed the same too (`usage` in `balance = (usage *
    torch.log(usage * K)).sum()`), at the one farthest below it: where the constant is made.

    ## Why is this bad?
    A term whose value cannot change has a zero gradient: it trains nothing. It is almost always
    a reduction over the wrong axis of something normalised along that axis: a softmax summed
    over its own axis (always 1), the norm of a vector `F.normalize` already made unit-length, a
    load-balancing loss whose mean router probability is taken over the experts (1/E for every
    token) instead of over the tokens, attention weights summed over the positions they were
    normalised over in a doubly stochastic penalty. Nothing fails and the loss goes down; the
    regulariser the script was written for is simply absent (the experts collapse, the
    attention never spreads).

    ## Example
    ```python
    alphas = torch.stack(alphas, 1)  # (B, T, P): a softmax over the P pixels at each step
    reg = ((1.0 - alphas.sum(dim=2)) ** 2).mean()  # 1 - 1 at every step: always 0
    loss = ce + reg
    ```

    ## Use instead
    ```python
    alphas = torch.stack(alphas, 1)  # (B, T, P)
    reg = ((1.0 - alphas.sum(dim=1)) ** 2).mean()  # each pixel's attention over the T steps
    loss = ce + reg
    ```

    ## Stays silent on
    Terms that move with the model; a hinge or clamp that is not active yet (`relu(|logits| -
    50)`: zero for now, not by construction); penalties on the parameters alone (an L2 term at
    a tiny learning rate, an orthogonality penalty right after an orthogonal initialisation)
    that share no activation with the rest of the loss; a term multiplied by a constant zero on
    purpose (`0 * out.sum()`, to keep parameters in the graph); a zero term that compares a value
    with itself (`mmd(h, h)`: loss-compares-with-itself's); a product with a mask or a detached
    tensor (`(ce * mask).mean()` while the mask keeps no sample, `l / l.detach()`, which is 1
    with a gradient); values logged but not added to
    the loss; runs whose loss itself did not move; tensors on an accelerator (not read).
    """

    code = "GD373"
    slug = "loss-term-constant"
    severity = Severity.WARNING
    summary = ("a term of the loss keeps one value while the loss moves: it is constant in "
               "the parameters, passes them no gradient and trains nothing")
    fix = ("reduce over the axis the term was meant for (the batch or the time steps, not the "
           "axis its values were normalised over)")

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        # a value compared with itself is zero by construction too: loss-compares-with-itself
        # names the cause (`mmd(h, h)`)
        compared = {(e.loc.path, e.loc.line) for e in a.of_kind("same_compared") if e.loc is not None}
        for e in a.of_kind("constant_term"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids:
                continue  # it reaches nothing an optimizer steps: loss-term-trains-nothing's
            if e.loc is not None and (e.loc.path, e.loc.line) in compared and not e.get("value"):
                continue
            name, value, origin = e.get("name"), e.get("value"), e.get("origin")
            loc, text = e.loc, None
            for held in (origin, name):  # where the constant is made, else the term
                found = a.source.term_assignment(loc.path, loc.line, held) if loc and held else None
                if found is not None:
                    loc, text = Location(loc.path, found[0]), found[1]
                    break
            made = (f" It is made constant by `{origin}`, whose values stayed the same too."
                    if origin and text and origin != name else "")
            low, high = e.get("loss_low"), e.get("loss_high")
            shown = f"{value:.6g}" if isinstance(value, float) else str(value)
            yield self.finding(
                f"`{name}`, a term of the loss backpropagated at line "
                f"{e.loc.line if e.loc else '?'}, was {shown} at each of its first 4 backwards "
                f"while the loss moved from {low:.4g} to {high:.4g}: a value the model cannot "
                f"change has a zero gradient, so `{name}` trains nothing and the regulariser it "
                f"stands for is absent. A sum of a softmax over its own axis (always 1), the norm "
                f"of an already normalised vector, a mean over the axis the values were "
                f"normalised over make such constants.{made}",
                loc, step=a.next_step_number(e.seq),
                evidence={"name": name, "value": value, "loss_low": low, "loss_high": high,
                          "params": pids[:16], "line": text},
                fix=(f"compute `{name}` over the axis it was meant for: reduce the batch or the "
                     f"time steps, not the axis its values were normalised over (a softmax's "
                     f"`dim`, `F.normalize`'s `dim`)"))
