from __future__ import annotations

from ..analysis.lora_scaling import inverted_lora_scalings
from ..findings import Severity
from ..trace import Location
from .base import Rule


class LoraScalingInverted(Rule):
    """
    ## What it does
    Finds a LoRA adapter's scaling written upside down: a quotient whose numerator names the
    adapter's rank and whose denominator names its alpha (`self.scaling = r / alpha`,
    `h * self.r / self.lora_alpha`, `math.sqrt(r) / alpha`). Read from the script's source, in
    the files whose backwards ran, where the file names LoRA (or the quotient is assigned to a
    scaling). The rank's and alpha's values are read where the file binds their names to one
    number (a default argument, a literal assignment).

    ## Why is this bad?
    LoRA adds `(alpha / r) * B @ A` to the frozen weight: the factor keeps the adapter's update
    on one scale whatever the rank, so one learning rate fits every `r`. Inverted, the factor is
    `(r / alpha)`, off by `(alpha / r)²` — 16 times too small at `r = 4, alpha = 16`, the
    common `alpha = 2r` makes it 4 times — and the adapter's output and its gradients shrink by
    it: training is slower, the tuned learning rate no longer transfers, and a merged checkpoint
    made with the right formula elsewhere does not match the model that was trained. Nothing
    fails; the fine-tune just ends worse.

    ## Example
    ```python
    self.lora_A = nn.Parameter(torch.randn(r, d_in) * 0.01)
    self.lora_B = nn.Parameter(torch.zeros(d_out, r))
    self.scaling = r / alpha
    ```

    ## Use instead
    ```python
    self.scaling = alpha / r  # rsLoRA: alpha / math.sqrt(r)
    ```

    ## Stays silent on
    `alpha / r` and rsLoRA's `alpha / math.sqrt(r)`; an update divided by the quotient
    (`h / (self.r / self.lora_alpha)`: scaled by `alpha / r`); a rank and alpha the file binds to equal
    numbers (a factor of 1 either way); quotients of names that are not a rank and an alpha, or
    in a file that names no LoRA and assigns the quotient to no scaling.
    """

    code = "GD353"
    slug = "lora-scaling-inverted"
    severity = Severity.WARNING
    summary = ("a LoRA scaling divides the rank by alpha: the adapter's update is off by "
               "(alpha / r)²")
    fix = "scale the low-rank update by alpha / r (rsLoRA: alpha / sqrt(r)), not r / alpha"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, text, rank_text, alpha_text, rank, alpha in inverted_lora_scalings(a.source.full(path)):
                if rank is not None and alpha is not None:
                    off = (alpha / rank) ** 2
                    size = (f" (r = {rank:g}, alpha = {alpha:g}: {off:g} times too "
                            f"{'small' if off > 1 else 'large'})")
                else:
                    size = ""
                yield self.finding(
                    f"the LoRA scaling `{text}` divides the rank by alpha: LoRA scales the adapter's "
                    f"update by alpha / r, so this one is off by (alpha / r)²{size}, and the "
                    f"adapter's output and gradients with it",
                    Location(path, line, None),
                    fix=f"write `{alpha_text} / {rank_text}` (rsLoRA: `{alpha_text} / math.sqrt({rank_text})`)",
                    evidence={"expression": text, "rank": rank, "alpha": alpha})
