from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

# a log-variance, log-std or log-scale by its name (`logvar`, `log_var`, `log_sigma`, `logstd`)
_LOG_SCALE = re.compile(r"^(log_?var(iance)?|log_?sigma2?|log_?std|log_?scale|log_?sd)(_\w+)?$",
                        re.IGNORECASE)
_NOISE = re.compile(r"^(eps|epsilon|noise|e|z0|std_normal)$")
_DRAWS = ("randn", "randn_like", "normal", "normal_", "standard_normal")
_SCALED = ("Normal", "LogNormal", "Laplace", "Cauchy", "Gumbel", "HalfNormal")


def _last_name(node: ast.AST) -> str | None:
    """``logvar`` of ``logvar``, ``self.logvar``, ``out.log_var``, ``stats["logvar"]``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
            and isinstance(node.slice.value, str):
        return node.slice.value
    return None


def _log_scale(node: ast.AST) -> bool:
    name = _last_name(node)
    return name is not None and _LOG_SCALE.match(name) is not None


def _noise(node: ast.AST) -> bool:
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in _DRAWS
    name = _last_name(node)
    return name is not None and _NOISE.match(name) is not None


def log_scales_used_as_scales(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, text, name)`` of each reparameterised draw that scales the noise by a log-scale
    itself (``mu + logvar * eps``, ``mean + torch.randn_like(mean) * log_std``) and each
    distribution built with one as its scale (``Normal(mu, log_std)``)."""
    found = []
    for node in walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            for product in (node.left, node.right):
                if isinstance(product, ast.BinOp) and isinstance(product.op, ast.Mult):
                    for scale, noise in ((product.left, product.right), (product.right, product.left)):
                        if _log_scale(scale) and _noise(noise):
                            found.append((node.lineno, ast.unparse(node), ast.unparse(scale)))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            scale = node.args[1] if len(node.args) >= 2 else next(
                (k.value for k in node.keywords if k.arg == "scale"), None)
            if name in _SCALED and scale is not None and _log_scale(scale):
                found.append((node.lineno, ast.unparse(node), ast.unparse(scale)))
    return sorted(set(found))


class LogScaleUsedAsScale(Rule):
    """
    ## What it does
    Finds a Gaussian draw whose noise is scaled by a log-variance or log-std itself:
    `z = mu + logvar * eps`, `mean + log_std * torch.randn_like(mean)`, `Normal(mu, log_sigma)`.
    It reads the source of the files a backward ran from, by the names the script gives its
    log-scales (`logvar`, `log_var`, `log_sigma`, `log_std`, `logstd`).

    ## Why is this bad?
    The network predicts the log of the variance (or of the std) so that its output can be any
    number; the draw needs the std itself, `exp(0.5 * logvar)` (or `exp(log_std)`). Multiplied
    in directly, a log-variance of -4 (std 0.14) draws with a std of -4: the noise is 30 times
    too large and flips sign, the KL term (which reads `logvar` as a log) and the sampling
    disagree, and the encoder learns to push `logvar` to 0 to switch the noise off.

    ## Example
    ```python
    mu, logvar = self.mu(h), self.logvar(h)
    z = mu + logvar * torch.randn_like(mu)
    ```

    ## Use instead
    ```python
    z = mu + torch.exp(0.5 * logvar) * torch.randn_like(mu)
    ```

    ## Stays silent on
    `std = torch.exp(0.5 * logvar)` then `mu + std * eps`; `log_std.exp() * noise`;
    `Normal(mu, log_std.exp())`; names that say nothing of a log (`sigma`, `scale`).
    """

    code = "GD331"
    slug = "log-scale-used-as-scale"
    severity = Severity.WARNING
    summary = ("a reparameterised draw scales the noise by a log-variance or log-std itself "
               "(mu + logvar * eps): the std is its exponential")
    fix = "scale the noise by the std: `mu + torch.exp(0.5 * logvar) * eps`"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, scale in log_scales_used_as_scales(tree):
                variance = "var" in scale.lower().replace("varian", "var")
                std = f"torch.exp(0.5 * {scale})" if variance else f"torch.exp({scale})"
                yield self.finding(
                    f"`{text}` uses `{scale}`, a log-{'variance' if variance else 'scale'} by "
                    f"its name, as the scale of the noise: the std is `{std}`. A "
                    f"{'log-variance' if variance else 'log-std'} below 0 (a std under 1) "
                    f"becomes a negative scale, and the noise's size follows the log instead of "
                    f"the std, so the draw and the KL term that reads `{scale}` as a log "
                    f"disagree",
                    Location(path, line), evidence={"scale": scale, "std": std},
                    fix=f"scale the noise by the std: replace `{scale}` with `{std}` in the draw")
