from __future__ import annotations

from ..findings import Severity
from .base import Rule


class NoiseTargetRedrawn(Rule):
    """
    ## What it does
    Finds a regression loss (`mse_loss`, `l1_loss`, `smooth_l1_loss`, `huber_loss`, their `nn`
    modules too) whose target is a fresh standard-normal draw taken after the model's forward:
    `F.mse_loss(model(x_t, t), torch.randn_like(x0))` in a diffusion model's training step, where
    the target should be the `noise` mixed into `x_t`. On the losses of the first backwards, a
    target with no gradient on the CPU, of the shape of a tensor the model was given, is
    compared with the numbers the CPU generator draws first after the model's forward ended:
    equal to the last bit, it is that draw. It points at the loss call.

    ## Why is this bad?
    A noise-prediction (epsilon) objective teaches the model to recover the noise that was added
    to its input. Noise drawn a second time is independent of everything the model sees, so no
    model can predict it: the best it can do is output 0, the loss stays at about the noise's
    variance (1.0 for `mse_loss`) and the sampler built on the model turns noise into noise.
    Nothing fails; the loss just never goes down.

    ## Example
    ```python
    noise = torch.randn_like(x0)
    x_t = alpha_bar[t].sqrt() * x0 + (1 - alpha_bar[t]).sqrt() * noise
    loss = F.mse_loss(model(x_t, t), torch.randn_like(x0))
    ```

    ## Use instead
    ```python
    noise = torch.randn_like(x0)
    x_t = alpha_bar[t].sqrt() * x0 + (1 - alpha_bar[t]).sqrt() * noise
    loss = F.mse_loss(model(x_t, t), noise)
    ```

    ## Stays silent on
    The noise drawn before the forward and used as the target (the right code, however many
    draws the forward itself makes); a target made from a draw (`y + 0.1 * torch.randn_like(y)`,
    noisy labels); a draw used as an input; a random target of another shape than the model's
    inputs (a synthetic regression benchmark's `torch.randn(32, 1)`), or of the shape of the
    model's only input with nothing else given to it (`mse(model(x), torch.randn(16, 8))`: a
    noise predictor is told the noise level, as a timestep argument or concatenated channels); noise drawn on a GPU (not looked at); losses other
    than the four regression losses.
    """

    code = "GD262"
    slug = "noise-target-redrawn"
    severity = Severity.WARNING
    summary = ("a regression loss's target is a fresh random draw taken after the model's forward "
               "(a diffusion loss's noise drawn again): the model never saw it and cannot predict it")
    fix = "use the very noise tensor that was mixed into the model's input as the target"

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("noise_redrawn"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids:
                continue  # no optimizer steps what makes the prediction
            fn = e.get("fn")
            yield self.finding(
                f"the target given to {fn} here is a fresh standard-normal draw: it equals, to the "
                f"last bit, the first random numbers drawn after the model's forward ended, so "
                f"the model never saw them and nothing in its input predicts them. The model "
                f"({a.names(pids)}) can only learn to output 0 and the loss stays near the noise's "
                f"variance. A noise-prediction (diffusion, denoising score-matching) loss must "
                f"compare the output with the noise that was mixed into the model's input",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"function": fn, "params": pids[:16], "numel": e.get("numel")},
                fix=("draw the noise once, before building the noisy input, and pass that tensor "
                     "as the target: noise = torch.randn_like(x0); x_t = a * x0 + s * noise; "
                     "loss = F.mse_loss(model(x_t, t), noise)"))
