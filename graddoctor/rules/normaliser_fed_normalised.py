from __future__ import annotations

from ..analysis.normaliser_feedback import normaliser_fed_own_output
from ..findings import Severity
from ..trace import Location
from .base import Rule


class NormaliserFedNormalised(Rule):
    """
    ## What it does
    Finds a running normaliser updated with values it has already normalised:
    `obs_rms.update(norm_obs)` where `norm_obs = (obs - obs_rms.mean) / obs_rms.var.sqrt()`, or
    `rms.update(rms.normalize(x))`. Read from the script's source, in the files whose backwards
    ran: a call of `.update(...)` (`push`, `update_stats`) on an object whose argument, inline or
    through the name's latest assignment before the call in the same function, reads the same
    object's statistics (`.mean`, `.var`, `.std`) or calls it (`rms(x)`, `rms.normalize(x)`).

    ## Why is this bad?
    A running mean and variance (RND's observation normaliser, PPO's observation and reward
    scaling) are meant to track the raw data. Fed its own output, the normaliser tracks values
    that are already centred near 0 with a spread near 1: its mean drifts toward 0 and its
    variance toward 1, so after a few updates it no longer normalises anything, and the raw
    scale, offset and drift of the data reach the networks. The curiosity bonus and the policy's
    inputs are off from then on, and nothing fails.

    ## Example
    ```python
    norm_obs = ((obs - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8)).clip(-5, 5)
    obs_rms.update(norm_obs)
    ```

    ## Use instead
    ```python
    obs_rms.update(obs)
    ```

    ## Stays silent on
    An update with the raw values before or after normalising them (`rms.update(x)` then
    `x = rms(x)`, in either order); another normaliser's statistics; a name normalised only
    after the update.
    """

    code = "GD299"
    slug = "normaliser-fed-normalised"
    severity = Severity.WARNING
    summary = ("a running normaliser is updated with values it already normalised: its statistics "
               "drift toward mean 0 and variance 1 and stop tracking the data")
    fix = "update the normaliser with the raw values it is meant to normalise"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, text, owner, made in normaliser_fed_own_output(a.source.full(path)):
                where = f" (normalised at line {made})" if made is not None else ""
                yield self.finding(
                    f"`{text}` feeds `{owner}` values it has already normalised{where}: its running "
                    f"mean drifts toward 0 and its variance toward 1, so it stops tracking the raw "
                    f"data and stops normalising it",
                    Location(path, line, None),
                    fix=f"update `{owner}` with the raw values, before they are normalised",
                    evidence={"call": text, "normaliser": owner, "normalised_at": made})
