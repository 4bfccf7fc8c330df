from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule

_LAYERS = frozenset({"Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
                     "FeatureAlphaDropout"})
_FUNCTIONS = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                        "feature_alpha_dropout"})
_HIGH = 0.8  # a rate this high is rarely meant: TensorFlow's keep_prob carried over
_KEEP = re.compile(r"keep", re.I)  # keep_prob, keep_rate, KEEP_PROB, keep


def _rate_text(call: ast.Call) -> str | None:
    """The source text of a dropout call's rate: ``nn.Dropout(p)`` / ``F.dropout(x, p)``."""
    for kw in call.keywords:
        if kw.arg == "p":
            return ast.unparse(kw.value)
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    index = 0 if name in _LAYERS else 1
    return ast.unparse(call.args[index]) if len(call.args) > index else None


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


class DropoutKeepProbability(Rule):
    """
    ## What it does
    Finds a dropout whose rate looks like TensorFlow's keep probability: an `nn.Dropout` (or
    `F.dropout`) that runs in training with a rate given by a variable named `keep_prob` (or
    `keep_rate`, `keep`) above 0.5, a warning; or with a rate of 0.8 or more, an `info`. It
    points at the dropout's construction (or call).

    ## Why is this bad?
    PyTorch's `p` is the probability of *dropping* an element; TensorFlow 1's `keep_prob` is the
    probability of keeping it. Carried over, `nn.Dropout(keep_prob)` with 0.9 drops 90% of the
    activations and scales the rest by 10: every training forward sees a tenth of the network,
    the gradients are mostly noise, and evaluation (no dropout) runs a model it was never
    trained as. Nothing fails: the loss just falls slowly.

    ## Example
    ```python
    keep_prob = 0.9
    self.drop = nn.Dropout(keep_prob)
    ```

    ## Use instead
    ```python
    keep_prob = 0.9
    self.drop = nn.Dropout(1 - keep_prob)
    ```

    ## Stays silent on
    Usual rates (0.1 to 0.5, and up to 0.7); `nn.Dropout(1 - keep_prob)`; dropout layers that
    never run in a training forward.
    """

    code = "GD133"
    slug = "dropout-keep-probability"
    severity = Severity.WARNING
    summary = ("a dropout rate given as a keep probability (nn.Dropout(keep_prob), p ≥ 0.8): "
               "it drops most activations")
    fix = "PyTorch's p is the probability to drop: pass `1 - keep_prob`"

    def check(self, a):
        timeline = a.modes
        trained: dict[int, dict] = {}
        for fw in timeline.forwards:
            if fw.training and fw.grad:
                for mid in fw.modules:
                    state = fw.states.get(mid) or {}
                    if state.get("layer") == "dropout" and isinstance(state.get("p"), (int, float)):
                        trained.setdefault(mid, {**state, "_loc": fw.event.loc})
        paths = list(dict.fromkeys(e.loc.path for e in a.events
                                   if e.loc is not None and e.kind in ("mode_forward", "optimizer_init",
                                                                       "backward")))
        constructions = [(path, call) for path in paths for call in self._calls(a, path, _LAYERS)]
        used: set[tuple] = set()
        for mid, state in trained.items():
            p = float(state["p"])
            site = self._site(constructions, p, used)
            if site is None:
                continue
            path, call = site
            text = _rate_text(call)
            yield from self._judge(p, text, Location(path, call.lineno), state.get("name"))
        if a.by_kind.get("backward"):  # the model trained: its forward's dropout calls ran in it
            for path in paths:
                for call in self._calls(a, path, _FUNCTIONS, in_forward=True):
                    text = _rate_text(call)
                    p = _number(text)
                    if p is None or (path, call.lineno) in used:
                        continue
                    yield from self._judge(p, text, Location(path, call.lineno), None)

    @staticmethod
    def _calls(a, path: str, names, in_forward: bool = False) -> list[ast.Call]:
        tree = a.source.tree(path)
        if tree is None:
            return []
        found = []
        stack = [(tree, False)]
        while stack:
            node, inside = stack.pop()
            for child in ast.iter_child_nodes(node):
                here = inside or (isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                                  and child.name == "forward")
                if isinstance(child, ast.Call):
                    func = child.func
                    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                    if name in names and (here or not in_forward):
                        found.append(child)
                stack.append((child, here))
        return sorted(found, key=lambda c: c.lineno)

    @staticmethod
    def _site(constructions, p: float, used: set):
        """The construction of a layer with rate ``p``: one whose rate is that number, else one
        whose rate is a name (not a number), else the only one."""
        def key(site):
            return site[0], site[1].lineno

        exact = [s for s in constructions if _number(_rate_text(s[1])) == p]
        named = [s for s in constructions if _rate_text(s[1]) is not None
                 and _number(_rate_text(s[1])) is None]
        for group in (exact, named, constructions if len(constructions) == 1 else []):
            if group:
                used.add(key(group[0]))
                return group[0]
        return None

    def _judge(self, p: float, text: str | None, loc: Location, name: str | None):
        shown = f" ({name})" if name else ""
        keep = text is not None and _KEEP.search(text) and not re.search(r"1\s*-", text)
        if keep and p > 0.5:
            yield self.finding(
                f"this dropout{shown} is given `{text}` as its rate: PyTorch's p is the "
                f"probability to drop, TensorFlow's keep_prob the probability to keep, so it drops "
                f"{p:.0%} of the activations and scales the rest by {1 / (1 - p):.3g}",
                loc, evidence={"p": p, "argument": text},
                fix=f"pass the drop probability: `1 - {text}`")
        elif p >= _HIGH and p < 1:
            yield self.finding(
                f"this dropout{shown} drops {p:.0%} of the activations in training (p={p:g}) and "
                f"scales the rest by {1 / (1 - p):.3g}: a rate that high is unusual; if it was "
                f"meant as the probability to keep (TensorFlow's keep_prob), pass {1 - p:.2g}",
                loc, severity=Severity.INFO, evidence={"p": p, "argument": text},
                fix=f"PyTorch's p is the probability to drop: if {p:g} is the probability to keep, "
                    f"pass {1 - p:.2g}")
