from __future__ import annotations

from ..analysis.ramps import falling_ramps
from ..findings import Severity
from ..trace import Location
from .base import Rule


class RampUpFalls(Rule):
    """
    ## What it does
    Finds a ramp-up function of the script (`sigmoid_rampup`, `linear_rampup`, a `warmup`
    factor) that the training calls and whose value falls as its counter rises: evaluated from
    the counter's start to the ramp's length (its body read by a small interpreter of numbers;
    nothing of the script runs), it starts at its largest value and ends far below it. The
    Gaussian ramp of Laine & Aila and Mean Teacher is `exp(-5 * (1 - t / T) ** 2)`; written
    `exp(-5 * (t / T) ** 2)` it is a ramp-down. It points at the statement that makes the
    ramp's phase from the counter (`phase = current / rampup_length`), else the function.

    ## Why is this bad?
    A consistency or unsupervised weight ramped up is meant to stay near 0 while the
    predictions it compares are still noise, and to reach its full value once they mean
    something. Inverted, the noisy early targets get the full weight (confirmation bias, a
    collapse onto one class), and the term fades to almost nothing just when it could help:
    the semi-supervised part of the method is switched off. Nothing fails.

    ## Example
    ```python
    def sigmoid_rampup(current, rampup_length):
        current = np.clip(current, 0.0, rampup_length)
        phase = current / rampup_length
        return float(np.exp(-5.0 * phase * phase))
    ```

    ## Use instead
    ```python
    def sigmoid_rampup(current, rampup_length):
        current = np.clip(current, 0.0, rampup_length)
        phase = 1.0 - current / rampup_length
        return float(np.exp(-5.0 * phase * phase))
    ```

    ## Stays silent on
    Ramp-ups that rise (`min(1, step / warmup)`, the Gaussian and cosine ramp-ups), functions
    named for a ramp-down, a decay or an annealing, a warm-up followed by a decay (its value at
    the ramp's end is not below its start), and functions the script does not call. Not judged:
    a body that reads a global, an attribute or a call other than `min`/`max`/`abs`/`float` and
    `exp`/`clip`/`cos`/`sqrt`/`log` of math, numpy or torch, and parameters with no default
    besides the counter and the length.
    """

    code = "GD424"
    slug = "ramp-up-falls"
    severity = Severity.WARNING
    summary = ("a ramp-up function falls as its counter rises: the weight it schedules starts "
               "at its full value and fades instead of growing")
    fix = "invert the ramp's phase so the value rises from its start to its full value at the ramp's end"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, name, values, def_line, counter, length in falling_ramps(a.source.full(path)):
                text = a.source.line_text(path, line).split("#")[0].strip()
                fix = (f"make `{name}` rise with `{counter}`: in `{text}`, write "
                       f"`1.0 - {counter} / {length}` for `{counter} / {length}`"
                       if line != def_line and f"{counter} / {length}" in text else self.fix)
                yield self.finding(
                    f"`{name}` is named for a ramp-up, but along its counter `{counter}` it falls: "
                    f"{values[0]:g} at 0, {values[2]:g} at half of `{length}`, {values[-1]:g} at "
                    f"its end. The weight it schedules gets its full value while the predictions "
                    f"are still noise and fades to almost nothing as training goes on",
                    Location(path, line, None), fix=fix,
                    evidence={"function": name, "values": values, "counter": counter,
                              "length": length})
