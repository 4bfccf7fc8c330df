from __future__ import annotations

import ast

from ..analysis.source import scope_walk
from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_NOISE_WORDS = ("noise", "eps", "epsilon")
# a coefficient that scales the noise: the square root of one minus the cumulative alpha, a sigma
_NOISE_SCALE = ("one_minus", "1 -", "1.0 -", "1. -", "sigma", "std")
_SIGNAL_SCALE = ("alpha", "abar", "a_bar", "ab[", "ab)", "ab_", "sqrt_ab", "gamma")


def _is_noise(node: ast.AST) -> bool:
    """The noise of a forward diffusion step: a variable named so, or a fresh Gaussian draw."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in ("randn_like", "randn")
    text = ast.unparse(node).lower()
    last = text.rsplit(".", 1)[-1].split("[", 1)[0]
    return any(last == w or last.startswith(w + "_") or last.endswith("_" + w) for w in _NOISE_WORDS)


def _scale(node: ast.AST) -> str | None:
    text = ast.unparse(node).lower().replace("(", " (").replace("  ", " ")
    squeezed = ast.unparse(node).lower().replace(" ", "")
    if any(w in text for w in _NOISE_SCALE) or "1-" in squeezed or "1.0-" in squeezed:
        return "noise"
    if any(w in squeezed for w in _SIGNAL_SCALE):
        return "signal"
    return None


def _negated(node: ast.AST) -> bool:
    """A factor with a minus of its own (``-sigma_t``, ``-1.0 * sigma_t``)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _negated(node.left) or _negated(node.right)
    return (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)) or (
        isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and node.value < 0)


def _terms(node: ast.AST) -> list[tuple[ast.AST, ast.AST]] | None:
    """``[(coefficient, operand), (coefficient, operand)]`` of ``a * x + b * y``, or None. A
    product with a negated factor makes no forward step, whose coefficients are both positive
    (``-sigma_t * x0 + alpha_t * noise`` is v-prediction's target written as a sum)."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)):
        return None
    pairs = []
    for side in (node.left, node.right):
        if not (isinstance(side, ast.BinOp) and isinstance(side.op, ast.Mult)) \
                or _negated(side.left) or _negated(side.right):
            return None
        pairs.append((side.left, side.right))
    return pairs


def swapped_forward_steps(tree: ast.AST) -> list[tuple[int, str, str, str]]:
    """``(line, text, noise, clean)`` of each ``c1 * x0 + c2 * noise`` whose noise is scaled by
    the signal's coefficient (a cumulative alpha) and whose clean sample by the noise's (one
    minus it, a sigma): the forward diffusion step with its two coefficients swapped."""
    found = []
    for node in walk(tree):
        terms = _terms(node)
        if terms is None:
            continue
        roles = []
        for a, b in terms:
            if _is_noise(b) and not _is_noise(a):
                roles.append(("noise", a, b))
            elif _is_noise(a) and not _is_noise(b):
                roles.append(("noise", b, a))
            else:
                roles.append(("clean", a, b) if _scale(a) else ("clean", b, a))
        kinds = sorted(r[0] for r in roles)
        if kinds != ["clean", "noise"]:
            continue
        noise = next(r for r in roles if r[0] == "noise")
        clean = next(r for r in roles if r[0] == "clean")
        if _scale(noise[1]) == "signal" and _scale(clean[1]) == "noise":
            found.append((node.lineno, ast.unparse(node), ast.unparse(noise[2]), ast.unparse(clean[2])))
    return found


def _products(node: ast.AST, op: type) -> tuple[tuple[str, str], tuple[str, str]] | None:
    """``((a, x), (b, y))`` as texts of ``a * x <op> b * y``, or None."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, op)):
        return None
    out = []
    for side in (node.left, node.right):
        if not (isinstance(side, ast.BinOp) and isinstance(side.op, ast.Mult)):
            return None
        if op is ast.Add and (_negated(side.left) or _negated(side.right)):
            return None  # a sum with a negated term is a difference, not a forward step
        out.append((ast.unparse(side.left), ast.unparse(side.right)))
    return out[0], out[1]


def _scopes(tree: ast.AST):
    yield tree
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def swapped_velocity_targets(tree: ast.AST) -> list[tuple[int, str, str, str]]:
    """``(line, text, forward, velocity)`` of each difference ``c_signal * x0 - c_noise * noise``
    in a scope whose forward step is ``c_signal * x0 + c_noise * noise`` with the same four
    operands (in any order within a product): the v-prediction target with its operands
    swapped. The velocity of that step is ``c_signal * noise - c_noise * x0``."""
    found = []
    for scope in _scopes(tree):
        steps, diffs = [], []
        for node in scope_walk(scope):
            add = _products(node, ast.Add)
            if add is not None:
                for (c1, o1), (c2, o2) in (add, add[::-1]):
                    for a, x in ((c1, o1), (o1, c1)):
                        for b, n in ((c2, o2), (o2, c2)):
                            if _is_noise(ast.parse(n, mode="eval").body) and not _is_noise(
                                    ast.parse(x, mode="eval").body) and a != b and x != n:
                                steps.append((a, x, b, n, ast.unparse(node)))
            sub = _products(node, ast.Sub)
            if sub is not None:
                diffs.append((node, sub))
        for node, ((p1, q1), (p2, q2)) in diffs:
            left, right = {p1, q1}, {p2, q2}
            for a, x, b, n, fwd in steps:
                if left == {a, x} and right == {b, n}:
                    found.append((node.lineno, ast.unparse(node), fwd,
                                  f"{a} * {n} - {b} * {x}"))
                    break
    return found


class NoiseScheduleSwapped(Rule):
    """
    ## What it does
    Finds the forward step of a diffusion model written with its two coefficients swapped:
    `x_t = sqrt(1 - alpha_bar[t]) * x0 + sqrt(alpha_bar[t]) * noise`, the clean sample scaled
    by the noise's coefficient and the noise by the signal's. It reads the source of the files a
    backward ran from: a sum of two products, one of a noise (a variable named `noise`, `eps`,
    `epsilon`, or `torch.randn_like(...)`), whose coefficient names the cumulative alpha
    (`alphas_cumprod`, `sqrt_alpha_bar`) while the other's names one minus it or a sigma.

    ## Why is this bad?
    At small t, where alpha_bar is close to 1, the "noisy" sample is almost pure noise, and at
    large t it is almost the clean image: the model is trained on a schedule that runs
    backwards, so sampling, which starts from noise at t = T, begins where the model saw nearly
    clean images. The loss still falls; the samples are noise.

    It also finds a v-prediction target built with the clean sample and the noise swapped:
    in a scope whose forward step is `c_signal * x0 + c_noise * noise`, a difference
    `c_signal * x0 - c_noise * noise` of the same four operands. The velocity of that step is
    `c_signal * noise - c_noise * x0`.

    ## Example
    ```python
    x_t = sqrt_one_minus_ab[t] * x0 + sqrt_ab[t] * noise
    ```

    ## Use instead
    ```python
    x_t = sqrt_ab[t] * x0 + sqrt_one_minus_ab[t] * noise
    ```

    ## Stays silent on
    The forward step as written in DDPM; a v-prediction target (`sqrt_ab * noise -
    sqrt_one_minus_ab * x0`, a difference, or a sum with a negated term: `-sigma_t * x0 +
    alpha_t * noise`); the clean sample recovered from a predicted
    velocity (`sqrt_ab * x_t - sqrt_one_minus_ab * v_pred`: other operands than the step's); the DDIM update (`sqrt(ab_prev) * x0_pred +
    sqrt(1 - ab_prev) * eps`); flow matching's `(1 - t) * x0 + t * noise` (no alpha named);
    coefficients whose names say neither.
    """

    code = "GD338"
    slug = "noise-schedule-swapped"
    severity = Severity.WARNING
    summary = ("a diffusion forward step scales the clean sample by the noise's coefficient and "
               "the noise by the signal's (the schedule runs backwards), or a v-prediction target "
               "swaps the clean sample and the noise")
    fix = "scale the clean sample by sqrt(alpha_bar[t]) and the noise by sqrt(1 - alpha_bar[t])"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, noise, clean in swapped_forward_steps(tree):
                yield self.finding(
                    f"`{text}` scales the noise `{noise}` by the signal's coefficient (the "
                    f"cumulative alpha) and the clean sample `{clean}` by the noise's (one minus "
                    f"it): at small t, where alpha_bar is near 1, the model is shown almost pure "
                    f"noise and at large t almost the clean sample, so it learns a schedule that "
                    f"runs backwards and sampling from noise fails",
                    Location(path, line), evidence={"noise": noise, "clean": clean},
                    fix=f"swap the two coefficients: the one with the cumulative alpha goes on "
                        f"`{clean}`, the one with one minus it on `{noise}`")
            for line, text, forward, velocity in swapped_velocity_targets(tree):
                yield self.finding(
                    f"`{text}` is the forward step `{forward}` with a minus, not its velocity: "
                    f"a v-prediction target scales the noise by the signal's coefficient and "
                    f"subtracts the clean sample scaled by the noise's; trained on this target "
                    f"the model's v is converted back to a wrong clean sample and noise at every "
                    f"step of sampling",
                    Location(path, line), evidence={"forward": forward, "velocity": velocity},
                    fix=f"build the velocity as `{velocity}`")
