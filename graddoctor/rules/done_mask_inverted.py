from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule


class DoneMaskInverted(Rule):
    """
    ## What it does
    Finds a bootstrapped return, TD target or GAE recursion that keeps the next state's value
    where the episode ended and drops it where the episode goes on: a continuation mask assigned
    the done flag itself (`nextnonterminal = dones[t + 1]`), or a done flag multiplying the
    discount in a product (`r + gamma * q_next * dones`). Read from the script's source, in the
    files whose backwards ran: the value is named as a done or terminal flag (`done`, `dones`,
    `terminated`, `b_terminals`...; a name with another word, `terminal_value`, is some other
    value), not as a mask (`done_mask`, `not_done`, `masks`), and the script assigns that name no
    complement anywhere (`dones = 1 - x`, `~x`, `x == 0`).

    ## Why is this bad?
    A return bootstraps from the next state's value only while the episode goes on: `r + gamma *
    (1 - done) * V(s')`. Multiplied by `done`, every transition inside an episode gets no future
    (the critic learns the immediate reward alone) and the last transition of each episode gets
    the value of the next episode's first state. The advantages and targets are wrong on almost
    every step, the agent learns a myopic or noisy policy, and nothing fails: the losses still
    fall.

    ## Example
    ```python
    for t in reversed(range(num_steps)):
        nextnonterminal = dones[t + 1]
        delta = rewards[t] + gamma * values[t + 1] * nextnonterminal - values[t]
    ```

    ## Use instead
    ```python
        nextnonterminal = 1.0 - dones[t + 1]
    ```

    ## Stays silent on
    `1 - dones`, `1.0 - done`, `~done`, `logical_not(done)` and `done == 0` used as the mask; a
    mask the script names as one (`done_mask = 0.0 if done else 1.0`, `masks`, `not_done`,
    `alive`); a done-named value the script assigns a complement to; done flags used for
    anything but a product with a discount (resets, episode counts, logging).
    """

    code = "GD292"
    slug = "done-mask-inverted"
    severity = Severity.WARNING
    summary = ("a bootstrapped target is multiplied by the done flag instead of 1 - done: it keeps "
               "the next value only where the episode ended")
    fix = "multiply the bootstrapped value by `1 - done` (1 while the episode goes on, 0 at its end)"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, text, name, form in a.source.done_flag_bootstraps(path):
                if form == "mask":
                    what = (f"`{text}` makes the continuation mask the done flag `{name}` itself: "
                            f"it is 1 where the episode ended and 0 where it goes on")
                    fix = f"assign the complement: `1.0 - {text.split('=', 1)[1].strip()}`"
                else:
                    what = (f"`{text}` multiplies the discounted next value by the done flag "
                            f"`{name}`: the target keeps a future only where the episode ended")
                    fix = f"multiply by `(1 - {name})` instead of `{name}`"
                yield self.finding(
                    f"{what}, so every step inside an episode bootstraps from nothing and each "
                    f"episode's last step from the next episode's start",
                    Location(path, line, None), fix=fix,
                    evidence={"flag": name, "form": form})
