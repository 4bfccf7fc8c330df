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
    points at the dropout's construction (or call). The same confusion of a probability with
    its complement in `cross_entropy`'s `label_smoothing` (the share taken off the right class,
    not the confidence left on it): a `label_smoothing` of 0.5 or more in a loss that trains is
    a warning, pointing at the `nn.CrossEntropyLoss` construction that sets it (or the call).

    ## Why is this bad?
    PyTorch's `p` is the probability of *dropping* an element; TensorFlow 1's `keep_prob` is the
    probability of keeping it. Carried over, `nn.Dropout(keep_prob)` with 0.9 drops 90% of the
    activations and scales the rest by 10: every training forward sees a tenth of the network,
    the gradients are mostly noise, and evaluation (no dropout) runs a model it was never
    trained as. Nothing fails: the loss just falls slowly. Likewise `label_smoothing=0.9`
    (a confidence of 0.9 meant) gives the right class a target of 0.1 + 0.9/C and every other
    class 0.9/C: the targets are nearly uniform (from 1 - 1/C on, the right class gets no more
    than the others), and the model learns to predict almost nothing.

    ## Example
    ```python
    keep_prob = 0.9
    self.drop = nn.Dropout(keep_prob)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.9)
    ```

    ## Use instead
    ```python
    keep_prob = 0.9
    self.drop = nn.Dropout(1 - keep_prob)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    ```

    ## Stays silent on
    Usual rates (0.1 to 0.5, and up to 0.7); `nn.Dropout(1 - keep_prob)`; dropout layers that
    never run in a training forward; `label_smoothing` of 0 to 0.3 (the usual 0.1), and up to
    0.5.
    """

    code = "GD133"
    slug = "dropout-keep-probability"
    severity = Severity.WARNING
    summary = ("a dropout rate given as a keep probability (nn.Dropout(keep_prob), p ≥ 0.8), or "
               "a label_smoothing given as a confidence (≥ 0.5): it drops most activations, or "
               "flattens the targets")
    fix = "PyTorch's p is the probability to drop: pass `1 - keep_prob`"

    def check(self, a):
        yield from self._smoothing(a)
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

    def _smoothing(self, a):
        for e in a.of_kind("smoothing_high"):
            if e.loc is None:
                continue
            smoothing, classes = float(e["label_smoothing"]), int(e["classes"])
            loc, text = self._smoothing_site(a, e.loc, smoothing)
            right, other = 1 - smoothing + smoothing / classes, smoothing / classes
            named = text is not None and _number(text) is None
            shown = f"`{text}`" if named else f"{smoothing:g}"
            verdict = ("no more than the others" if right <= other + 1e-9
                       else f"{right / other:.3g}x what each other class gets")
            meant = f"1 - {text}" if named else f"{1 - smoothing:.2g}"
            yield self.finding(
                f"cross_entropy smooths its targets with label_smoothing={shown}"
                f"{f' ({smoothing:g})' if named else ''}: with {classes} "
                f"classes the target gives the right class {right:.3g} and every other class "
                f"{other:.3g} ({verdict}), nearly uniform targets. label_smoothing is the share "
                f"taken off the right class, not the confidence left on it",
                loc, step=a.next_step_number(e.seq),
                evidence={"label_smoothing": smoothing, "classes": classes, "argument": text},
                fix=f"label_smoothing is the amount to smooth (usually 0.1): if {shown} is the "
                    f"confidence meant for the right class, pass label_smoothing={meant}")

    def _smoothing_site(self, a, call_loc: Location, smoothing: float) -> tuple[Location, str | None]:
        """The line that sets the smoothing, and its argument's text: the loss call when it
        passes ``label_smoothing``, else the one ``nn.CrossEntropyLoss(label_smoothing=...)``
        construction of its file (the one whose number it is, when several)."""
        tree = a.source.tree(call_loc.path)
        if tree is None:
            return call_loc, None

        def argument(call):
            for kw in call.keywords:
                if kw.arg == "label_smoothing":
                    return ast.unparse(kw.value)
            return None

        here = [c for c in self._calls(a, call_loc.path, {"cross_entropy"})
                if c.lineno <= call_loc.line <= (c.end_lineno or c.lineno) and argument(c)]
        if here:
            return call_loc, argument(here[0])
        built = [c for c in self._calls(a, call_loc.path, {"CrossEntropyLoss"}) if argument(c)]
        exact = [c for c in built if _number(argument(c)) == smoothing]
        for group in (exact, built if len(built) == 1 else []):
            if len(group) == 1:
                return Location(call_loc.path, group[0].lineno), argument(group[0])
        return call_loc, None

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
