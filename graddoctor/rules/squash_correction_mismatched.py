from __future__ import annotations

from ..analysis.squash_correction import squash_corrections_mismatched
from ..findings import Severity
from ..trace import Location
from .base import Rule


class SquashCorrectionMismatched(Rule):
    """
    ## What it does
    Finds a tanh-squashed Gaussian's log-density whose two halves are taken at the same point:
    `dist.log_prob(v)` and the change of variables' correction `log(1 - v ** 2 + eps)` (or
    `log1p(-v ** 2)`) of one name `v` (or a plain alias of it, `u = a`, `u = a.clamp(...)`) in
    one function. Read from the script's source, in the files whose backwards ran. It points
    at the `log_prob` call (or at the alias that should have been `atanh`) when `v` is a
    squashed value or logged data, and at the correction when `v` is the Gaussian's own draw
    (`x_t = normal.rsample()`, never squashed).

    ## Why is this bad?
    The density of `a = tanh(u)` is `N(u; mu, sigma) / (1 - a ** 2)`: the Gaussian is
    evaluated at the pre-squash `u`, the correction at the squashed `a`. With one name on both
    sides one half is at the wrong point. Behaviour cloning that evaluates the Gaussian at the
    squashed actions fits its mean to `a`, then squashes it again when acting (`tanh(mu)`):
    every action is pulled toward 0. SAC's entropy term with the correction of the unsquashed
    draw gets the wrong log-probability, so the temperature and the actor are tuned to an
    entropy the policy does not have. Nothing fails; the policy is just worse.

    ## Example
    ```python
    u = actions  # the logged actions, already squashed into (-1, 1)
    log_prob = dist.log_prob(u).sum(-1) - torch.log(1 - actions.pow(2) + 1e-6).sum(-1)
    ```

    ## Use instead
    ```python
    u = torch.atanh(actions.clamp(-0.999, 0.999))
    log_prob = dist.log_prob(u).sum(-1) - torch.log(1 - actions.pow(2) + 1e-6).sum(-1)
    # or: TransformedDistribution(Normal(mu, std), [TanhTransform(cache_size=1)]).log_prob(actions)
    ```

    ## Stays silent on
    SAC's `normal.log_prob(x_t) - log(1 - y_t ** 2)` with `y_t = tanh(x_t)`; behaviour cloning
    through `atanh`; a `TransformedDistribution` with a `TanhTransform` (its own correction);
    the softplus form of the correction (`2 * (log 2 - u - softplus(-2 * u))`, at the pre-squash
    `u` by construction); a `log_prob` and a correction in different functions.
    """

    code = "GD387"
    slug = "squash-correction-mismatched"
    severity = Severity.WARNING
    summary = ("a tanh-squashed Gaussian's log-density evaluates the Gaussian and the tanh "
               "correction log(1 - v**2) at the same value: one of the two is at the wrong point")
    fix = ("evaluate the Gaussian at the pre-squash value (atanh of the action, or the draw "
           "before tanh) and the correction at the squashed one")

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, text, name, half in squash_corrections_mismatched(a.source.full(path)):
                if half == "correction":
                    message = (f"`{text}` applies tanh's change-of-variables correction "
                               f"log(1 - {name}**2) to `{name}`, the Gaussian's own draw, which is "
                               f"also where the Gaussian is evaluated: the correction belongs to the "
                               f"squashed value tanh({name}), so the log-probability (and the "
                               f"entropy it feeds) is wrong")
                    fix = f"apply the correction to the squashed value: log(1 - torch.tanh({name}).pow(2) + eps)"
                else:
                    message = (f"`{text}`: the Gaussian of this tanh-squashed policy is evaluated at "
                               f"`{name}`, the value the correction log(1 - {name}**2) treats as "
                               f"already squashed: the Gaussian should see the pre-squash value "
                               f"atanh({name}), so its mean is fitted to squashed values and then "
                               f"squashed again when the policy acts (every action shrinks toward 0)")
                    fix = (f"evaluate the Gaussian at atanh({name}) (clamped inside (-1, 1)), or use "
                           f"TransformedDistribution(Normal(mu, std), [TanhTransform(cache_size=1)])"
                           f".log_prob({name})")
                yield self.finding(message, Location(path, line, None), fix=fix,
                                   evidence={"name": name, "half": half})
