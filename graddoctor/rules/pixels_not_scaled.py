from __future__ import annotations

import re

from ..findings import Severity
from ..trace import Location
from .base import Rule


class PixelsNotScaled(Rule):
    """
    ## What it does
    Finds image batches that reach the model at the wrong scale. Raw 8-bit pixel values: at one of the first
    training forwards, the input of an `nn.Conv2d`/`nn.Conv3d` (or of an `nn.Linear` at least
    64 wide, a flattened image) is a batch straight from the data (no autograd graph) whose
    values are all integers in [0, 255], reaching past 32 in at least 5% of them. One small
    reduction per input looked at, the first 16 inputs of the first 3 steps, CPU tensors (a
    GPU's only before the first step). And an image divided by 255 twice (the dataset's
    `ToTensor()` already gives 0..1 and the loop divides again): every value within ±1/255,
    spread over half of that range at least; it points at the division by 255 closest above
    the layer's call (or the script's only one), else at the layer's call.

    ## Why is this bad?
    A uint8 image made float with `.float()` keeps its 0..255 values. Initialisations, learning
    rates and every pretrained backbone assume inputs of order 1: raw pixels make the first
    layer's activations and its gradients a few hundred times larger, a pretrained network sees
    inputs unlike anything it was trained on, and the run still trains, to a worse model,
    without any error. Divided twice, the inputs are 255 times too small: the first layer's
    output is little more than its bias, its weights' gradients are 255 times too small, and
    the network learns from an input it can barely see.

    ## Example
    ```python
    img = torch.from_numpy(array).permute(2, 0, 1).float()   # 0..255
    logits = model(img)
    ```

    ## Use instead
    ```python
    img = torch.from_numpy(array).permute(2, 0, 1).float() / 255.0   # 0..1
    img = (img - mean) / std                                          # and normalise
    # or torchvision's transforms.ToTensor() / v2.ToDtype(torch.float32, scale=True)
    ```

    ## Stays silent on
    Pixels divided by 255 in the dataset, the loop or the model's own forward; normalised
    images; small integer codes (masks, class ids, board positions: nothing above 32); token
    ids (an embedding takes them); raw integer features (ages, counts) in a `Linear` narrower
    than 64; layers after the first (their input carries a graph); evaluation forwards
    (`no_grad`, eval mode); pixels scaled once to 0..1 or -1..1; small inputs that are not
    spread over ±1/255 (a constant, a sparse map).
    """

    code = "GD159"
    slug = "pixels-not-scaled"
    severity = Severity.WARNING
    summary = ("an image batch reaches the model at the wrong scale: raw 0..255 pixel values (a "
               "uint8 image made float, never divided by 255), or divided by 255 twice")
    fix = ("divide the pixels by 255 where the batch is made float (x.float() / 255), then "
           "normalise them as the model expects; torchvision's ToTensor() does both scaling steps")

    def check(self, a):
        for e in a.of_kind("pixels_scaled_twice"):
            yield self._twice(a, e)
        for e in a.of_kind("pixels_unscaled"):
            shape = "×".join(str(s) for s in e["shape"])
            loc, made = e.loc, ""
            if loc is not None:
                lines = a.source.float_conversion_lines(loc.path)
                here = [text for line, text in lines if line == loc.line]
                if not here and len(lines) == 1:
                    # the one statement that makes a tensor float unscaled: where the fix goes
                    loc = Location(loc.path, lines[0][0])
                    made = f" (made float at `{lines[0][1]}`)"
            yield self.finding(
                f"the {e['module']} the model runs gets a batch ({shape}){made} of raw pixel "
                f"values: every value an integer from {e['low']:g} to {e['high']:g}, "
                f"{e['over']:.0%} of them above 32 — an 8-bit image made float without "
                f"dividing by 255, so the layer's activations and gradients are a few hundred "
                f"times the size its initialisation and the learning rate were chosen for",
                loc, step=a.next_step_number(e.seq),
                evidence={"module": e["module"], "shape": e["shape"], "low": e["low"],
                          "high": e["high"], "over": e["over"]})

    def _twice(self, a, e):
        shape = "×".join(str(s) for s in e["shape"])
        loc, where = e.loc, ""
        if loc is not None:
            divisions = _divisions_by_255(a.source, loc.path)
            # the division closest above the layer's call (the loop's second one), else the
            # script's only one: either it or the dataset's scaling goes
            before = [d for d in divisions if loc.line - _NEAR <= d[0] <= loc.line]
            chosen = before[-1] if before else divisions[0] if len(divisions) == 1 else None
            if chosen is not None:
                line, text = chosen
                loc, where = Location(loc.path, line), f" (`{text}`)"
        return self.finding(
            f"the {e['module']} the model runs gets a batch ({shape}) whose values all lie "
            f"between {e['low']:.2g} and {e['high']:.2g}, within ±1/255: an image already "
            f"scaled to 0..1 (torchvision's ToTensor() does it) divided by 255 again{where}, so "
            f"the inputs are 255 times smaller than the model, its initialisation and the "
            f"learning rate expect and the first layer barely sees them",
            loc, step=a.next_step_number(e.seq),
            evidence={"module": e["module"], "shape": e["shape"], "low": e["low"],
                      "high": e["high"], "scaled": "twice"},
            fix="divide by 255 once: drop this division when the dataset already returns 0..1 "
                "floats (ToTensor(), v2.ToDtype(scale=True)), or keep it and return raw uint8")


def _divisions_by_255(source, path: str) -> list[tuple[int, str]]:
    """The script's lines that divide by 255 (``/ 255``, ``/ 255.0``, ``.div(255)``), comments
    left out."""
    try:
        with open(source.full(path), encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    found = []
    for number, text in enumerate(lines, 1):
        code = text.split("#")[0]
        if _DIVISION.search(code):
            found.append((number, code.strip()))
    return found


_NEAR = 12  # lines above the layer's call where the second division is looked for
_DIVISION = re.compile(r"/\s*255(\.0*)?(?![\d.])|div_?\(\s*255(\.0*)?\s*\)")
