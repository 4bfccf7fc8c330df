from __future__ import annotations

from ..findings import Severity
from .base import Rule


class ConditioningDrawnTwice(Rule):
    """
    ## What it does
    Finds a model given a random value (a diffusion timestep, a flow-matching time, a noise
    level) that is a second draw of the same call the model's other input was built from:
    `t = torch.randint(0, T, (B,))` makes `x_t`, and `t2 = torch.randint(0, T, (B,))` is passed
    with it. In the first 3 windows of draws before a backward, the random factories
    (`torch.rand`, `randn`, `randint`, their `_like` forms) are wrapped and the values made from
    each draw followed (a `TorchFunctionMode`) to the outermost module calls: an argument that is
    a bare draw of one value per sample (a timestep, a time, a noise level) none of the other
    arguments came from, while one of them came from another draw of the very same call (same function, bounds, shape, dtype) that the call is not given. It
    points at the draw given to the model.

    ## Why is this bad?
    A denoiser learns to undo the noise level its timestep names. Told a level drawn
    independently of the one that noised its input, it can only learn the average over all
    levels; the loss plateaus high and the sampler, which trusts the timestep at every step,
    produces blur or noise. Nothing fails.

    ## Example
    ```python
    t = torch.randint(0, T, (B,))
    x_t = alphas_cumprod[t].sqrt()[:, None] * x0 + (1 - alphas_cumprod[t]).sqrt()[:, None] * noise
    t2 = torch.randint(0, T, (B,))
    loss = F.mse_loss(model(x_t, t2), noise)
    ```

    ## Use instead
    ```python
    loss = F.mse_loss(model(x_t, t), noise)       # the t that made x_t
    ```

    ## Stays silent on
    The draw the input was built from passed along (the right code); two draws of one call,
    each with its own input (two noisy views, two crops); a second draw used for something
    the model's inputs do not come from (a classifier-free-guidance dropout's `rand`); a model
    given only a draw (a generator's latent); draws of more than one value per sample (random
    data, latents, negatives drawn like the inputs); two random columns side by side, one only
    scaled or shifted (a PINN's collocation coordinates `x = torch.rand(N, 1) * L` and
    `t = torch.rand(N, 1)`, a synthetic table's features): the twin must have built an input
    (mixed with other values, or more than one value per sample). Not seen: draws on an accelerator's generator
    inside compiled code, a draw reshaped before the call (`t2[:, None]`), models that are no
    `nn.Module`.
    """

    code = "GD273"
    slug = "conditioning-drawn-twice"
    severity = Severity.WARNING
    summary = ("a model is given a random draw (a timestep) that is a second draw of the same call "
               "its other input was built from: the conditioning does not match the input")
    fix = "pass the very draw that built the model's input (the t used to noise x_t), not a new one"

    def check(self, a):
        for e in a.of_kind("draw_twin"):
            fn, twin, module = e.get("fn"), e.get("twin_line"), e.get("module")
            text = a.source.line_text(e.loc.path, e.loc.line).split("#")[0].strip() \
                if e.loc is not None else ""
            name = text.split("=")[0].strip() if "=" in text else None
            shown = f"`{name}`" if name and name.isidentifier() else "this draw"
            other = f"the draw on line {twin}" if twin else "an earlier draw of the same call"
            yield self.finding(
                f"{shown} is a fresh `torch.{fn}` given to `{module}` as argument {e.get('position')}, "
                f"while the model's other input was built from {other}, made with the very same "
                f"call. The two are independent: the model is told a value (a timestep, a noise "
                f"level) that has nothing to do with how its input was made, and can only learn "
                f"the average over all of them",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"function": fn, "module": module, "twin_line": twin,
                          "shape": e.get("shape")},
                fix=(f"drop this second draw and pass the one from line {twin} that built the "
                     f"input" if twin else self.fix))
