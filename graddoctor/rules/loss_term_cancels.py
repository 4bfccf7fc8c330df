from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk


def _signed_terms(node: ast.AST, sign: int, out: list) -> None:
    """The operands of one written chain of ``+`` and ``-`` with their signs. The chain is
    left-associative: a right operand that is itself a sum was put in parentheses, a group of
    its own (``z + (z_q - z)``, ``pred + mean - (y + mean)``), and stays one operand."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        _signed_terms(node.left, sign, out)
        out.append((sign if isinstance(node.op, ast.Add) else -sign, node.right))
    else:
        out.append((sign, node))


def _named(node: ast.AST) -> bool:
    return any(isinstance(n, (ast.Name, ast.Attribute)) for n in walk(node))


def cancelled_terms(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, expression, term)`` of each sum that adds and subtracts one and the same term
    (``1 + logvar - mu ** 2 - logvar``): the term cancels and its gradient with it. Outermost
    chains only; terms that hold a name (no constants)."""
    found, inner = [], set()
    for node in walk(tree):
        if id(node) in inner or not (isinstance(node, ast.BinOp)
                                     and isinstance(node.op, (ast.Add, ast.Sub))):
            continue
        terms: list = []
        _signed_terms(node, 1, terms)
        inner.update(id(n) for n in walk(node))
        if len(terms) < 3:
            continue  # `a - a` alone is a zero anyone would see; a cancellation hides in a sum
        seen: dict[str, int] = {}
        for sign, term in terms:
            if not _named(term):
                continue
            text = ast.unparse(term)
            if seen.get(text, 0) == -sign:
                found.append((node.lineno, ast.unparse(node), text))
                break
            seen.setdefault(text, sign)
    return found


class LossTermCancels(Rule):
    """
    ## What it does
    Finds a sum, in a file a backward ran from, that adds a term and subtracts the very same
    term: `kl = -0.5 * torch.sum(1 + logvar - mu ** 2 - logvar)` where `logvar.exp()` was meant
    last. It reads the source: the same expression, letter for letter, with both signs in one
    chain of `+` and `-`.

    ## Why is this bad?
    The two copies cancel, and so do their gradients: whatever the term was to train gets
    nothing from this sum. In the KL of a VAE the variance then has no pull toward 1 from
    the prior (only `1 - mu ** 2` is left), so the encoder is free to shrink it to nothing.

    ## Example
    ```python
    kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar)
    ```

    ## Use instead
    ```python
    kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    ```

    ## Stays silent on
    Terms that differ in any way (`x - x.detach()`, `logvar - logvar.exp()`); constants; a
    lone `a - a`; a group in parentheses (`z + (z_q - z)`, `pred + mean - (y + mean)`: the
    straight-through trick, a difference of two denormalised values).
    """

    code = "GD334"
    slug = "loss-term-cancels"
    severity = Severity.WARNING
    summary = "a sum adds and subtracts the same term: it cancels, and its gradient with it"
    fix = "check which of the two copies was meant to be something else (`logvar.exp()`)"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, term in cancelled_terms(tree):
                yield self.finding(
                    f"`{text}` adds `{term}` and subtracts it again: the two cancel, so the sum "
                    f"does not depend on `{term}` at all and passes it no gradient",
                    Location(path, line), evidence={"term": term},
                    fix=f"one of the two `{term}` was meant to be something else"
                        + (f" (in a Gaussian KL: `1 + {term} - mu ** 2 - {term}.exp()`)"
                           if "var" in term.lower() else ""))
