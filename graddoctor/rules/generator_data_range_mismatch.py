from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule


def _interval(low, high) -> str:
    return f"[{low:.3g}, {high:.3g}]" if high is not None else f"[{low:.3g}, inf)"


class GeneratorDataRangeMismatch(Rule):
    """
    ## What it does
    Finds a discriminator (or critic) that is given a generator's samples and real data on
    different value ranges: a generator ending in `tanh` (values in (-1, 1)) next to images
    scaled with `x / 255` (in [0, 1]), a `sigmoid` generator next to data scaled to [-1, 1],
    raw 0..255 pixels under any bounded output. It is read from the run: at the first
    backwards, each module called both on another module's output and on data no module made
    (with one shape past the batch axis) has the range of the samples taken from the
    generator's output activation, and the data's values compared with it. It points at the
    line that scales the data when it can follow the data's variable there, else at the
    discriminator's call on the data.

    ## Why is this bad?
    The discriminator tells real from fake by the range alone (every negative value is fake),
    so its gradient teaches the generator little beyond "move into the data's range"; the
    generator must push its activation into saturation to reach the data, where its gradient
    fades, and never reaches values outside its range at all. Training is slower and the
    samples come out in the wrong range (washed out or clipped images).

    ## Example
    ```python
    G = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 784), nn.Tanh())
    real = batch.float() / 255.0
    ```

    ## Use instead
    ```python
    G = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 784), nn.Tanh())
    real = batch.float() / 127.5 - 1.0  # [-1, 1], the range of tanh
    ```

    ## Stays silent on
    Data in [-1, 1] under `tanh` and in [0, 1] under `sigmoid`; generators without a bounded
    output activation (standardised data under a linear output); samples rescaled before the
    discriminator (`(G(z) + 1) / 2` with [0, 1] data); data using a part of the range that is
    not one side of 0 (values in [-0.5, 0.5] under `tanh`); discriminators fed a concatenation
    of real and generated rows (the ranges are not told apart).
    """

    code = "GD183"
    slug = "generator-data-range-mismatch"
    severity = Severity.WARNING
    summary = ("a discriminator compares a generator's bounded samples with real data on "
               "another range (a tanh generator and images in [0, 1])")
    fix = "scale the real data to the generator's output range (x / 127.5 - 1 for tanh)"

    def check(self, a):
        for e in a.of_kind("sample_range"):
            loc, text = e.loc, None
            name = e.get("name")
            if loc is not None and name:
                found = a.source.value_origin(loc.path, loc.line, name)
                if found is not None:
                    loc, text = Location(loc.path, found[0]), found[1]
            activation, low, high = e.get("activation"), e.get("low"), e.get("high")
            data = _interval(e.get("data_min"), e.get("data_max"))
            samples = _interval(low, high)
            if e.get("how") == "excludes":
                why = (f"{e.get('outside'):.0%} of the data lies outside the range the generator "
                       f"can reach at all")
            else:
                why = ("the data fills one side of 0 only, so every value on the other side marks "
                       "a sample as generated and the generator must saturate its output to "
                       "match the data")
            said = f"`{name}`" if name else "the data"
            yield self.finding(
                f"a discriminator ({e.get('critic')}) compares the samples of a generator "
                f"({e.get('generator')}), bounded by its {activation} to {samples}, with {said}, "
                f"whose values span {data}: {why}",
                loc, step=a.next_step_number(e.seq),
                evidence={"activation": activation, "low": low, "high": high,
                          "data_min": e.get("data_min"), "data_max": e.get("data_max"),
                          "outside": e.get("outside"), "how": e.get("how"), "line": text},
                fix=self._fix(activation, low, high))

    def _fix(self, activation, low, high) -> str:
        if activation == "tanh":
            return ("scale the real data to [-1, 1], the range of tanh (pixels: x / 127.5 - 1; "
                    "[0, 1] data: x * 2 - 1; torchvision: Normalize((0.5,), (0.5,)))")
        if activation == "sigmoid":
            return "scale the real data to [0, 1], the range of sigmoid (pixels: x / 255)"
        return (f"scale the real data into {_interval(low, high)}, the range of the generator's "
                f"{activation}, or change the generator's output activation to match the data")
