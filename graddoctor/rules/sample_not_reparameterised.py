from __future__ import annotations

from ..findings import Severity
from .base import Rule


class SampleNotReparameterised(Rule):
    """
    ## What it does
    Finds a `sample()` where `rsample()` is meant: a value drawn with `sample()` (which carries no
    gradient) from a distribution whose parameters the model computes, used by a loss that
    trains that distribution (a VAE's decoder loss on `q.sample()`, SAC's actor loss
    `q(s, pi.sample())`, a relaxed Gumbel policy's `sample()` fed to a differentiable critic or
    world model) that holds no score-function term of it (`log_prob(sample)` weighted by a
    per-sample return, as REINFORCE, A2C and PPO do). The same for a hand-written
    reparameterisation with a detached mean or scale (`mu + eps * std.detach()`,
    `mu.detach() + eps * std`, for `eps = torch.randn_like(...)`). `sample` and `log_prob` of
    `torch.distributions` are wrapped; for the first few such samples the values derived from the
    sample are followed (a `TorchFunctionMode`, until the next backward) to the ops where they
    enter the loss's graph as constants. It points at the `sample()` call.

    ## Why is this bad?
    `sample()` cuts the path from the loss to the distribution's parameters: the decoder or the
    critic learns from the sample, but the encoder or the actor gets no gradient from it. They
    learn only from the other terms (a VAE's KL pulls the posterior to the prior; SAC's entropy
    term makes the policy as random as it can), and nothing fails: the loss goes down, the
    latent codes or the actions just never become useful.

    ## Example
    ```python
    posterior = Normal(mu, torch.exp(0.5 * logvar))
    z = posterior.sample()
    loss = F.mse_loss(decoder(z), x) + kl
    ```

    ## Use instead
    ```python
    z = posterior.rsample()  # mu + std * eps: the gradient reaches mu and logvar
    ```

    ## Stays silent on
    REINFORCE, A2C and PPO (`sample()` with a score-function `log_prob` term); samples taken
    under `no_grad` (a SAC critic's target action, a generation) or only logged; a critic trained
    on the policy's samples in a loss that does not train the policy; `rsample()`, Gumbel-softmax
    with `hard=True`, straight-through estimators; distributions without `rsample`
    (`Categorical`: a score function or a relaxation is the fix there); noise added to a detached
    value with no learnt scale (an augmentation: `z.detach() + 0.1 * torch.randn_like(z)`);
    a sample used after `torch.compile` was called (not followed).
    """

    code = "GD146"
    slug = "sample-not-reparameterised"
    severity = Severity.WARNING
    summary = ("a loss uses dist.sample() where dist.rsample() is meant: the sample carries no "
               "gradient, so the distribution's parameters never learn from that loss term")
    fix = "draw the sample with rsample() (the reparameterised sample carries the gradient)"

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("reparam_cut"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids:
                continue
            via = e.get("via") or "sample"
            if via in ("scale", "location"):
                text = _code(a.source.line_text(e.loc.path, e.loc.line)) if e.loc is not None else ""
                said = f"`{text}`" if text else "this line"
                part = "scale (std)" if via == "scale" else "mean (mu)"
                yield self.finding(
                    f"the reparameterisation {said} uses a detached copy of its {part}: the loss "
                    f"backpropagated at line {e.get('backward')} uses the sample, but no gradient "
                    f"reaches the {part} through it, so {a.names(pids)} learn it only from the "
                    f"loss's other terms (the KL pulls it to the prior)",
                    e.loc, step=a.next_step_number(e.seq),
                    evidence={"via": via, "op": e.get("op"),
                              "params": [a.param_name(p) for p in pids[:16]]},
                    fix="drop the .detach() from the reparameterisation: z = mu + eps * std")
                return
            dist = e.get("dist") or "distribution"
            yield self.finding(
                f"this {dist}'s sample() carries no gradient, but the loss backpropagated at line "
                f"{e.get('backward')} uses it (as a constant input of {e.get('op')}) and also trains "
                f"the distribution's parameters, with no score-function log_prob term for it: "
                f"{a.names(pids)} get no gradient through the sample, only from the loss's other "
                f"terms",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"dist": e.get("dist"), "op": e.get("op"),
                          "params": [a.param_name(p) for p in pids[:16]]},
                fix=(f"use rsample() instead of sample() here (the reparameterised sample of the "
                     f"{dist} passes the gradient to its parameters)"))
            return


def _code(line: str) -> str:
    """A source line without its comment and indentation."""
    return line.split("  #", 1)[0].strip()
