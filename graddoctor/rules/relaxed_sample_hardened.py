from __future__ import annotations

import ast

from ..analysis.source import scope_walk
from ..findings import Severity
from ..trace import Location
from .base import Rule
from .quantised_value_detached import _callee, _no_grad_lines, _straight_through
from ..analysis.source import walk

_TEMPERATURES = frozenset({"tau", "temperature", "temp", "t_gumbel", "gumbel_tau"})
_SOFT_CALLS = ("softmax", "gumbel", "relaxed", "concrete")
_LOSS_WORDS = ("loss", "mse", "criterion", "kl", "entropy", "nll", "accuracy", "metric")
_PASSIVE = frozenset({"float", "to", "type", "view", "reshape", "flatten", "detach", "clone",
                      "size", "numel", "item", "cpu", "numpy", "tolist", "append", "print", "sum",
                      "mean", "argmax", "bincount", "unique", "eq", "all", "any"})


def _argmax_of(node: ast.AST) -> str | None:
    """The name ``y`` of ``y.argmax(-1)``, ``torch.argmax(y, dim=-1)``, ``y.max(-1)[1]``,
    ``y.max(dim=-1).indices``."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
            and node.slice.value == 1:
        node = node.value
        if _callee(node) != "max":
            return None
    elif isinstance(node, ast.Attribute) and node.attr == "indices":
        node = node.value
        if _callee(node) != "max":
            return None
    elif _callee(node) != "argmax":
        return None
    func = node.func
    if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name)
                                                and func.value.id == "torch"):
        return func.value.id if isinstance(func.value, ast.Name) else None
    first = node.args[0] if node.args else None
    return first.id if isinstance(first, ast.Name) else None


def _hardened(value: ast.AST, picks: dict[str, str]) -> str | None:
    """The soft name whose hard one-hot ``value`` is: ``F.one_hot(y.argmax(-1), K).float()``,
    ``F.one_hot(idx, K)`` for ``idx = y.argmax(-1)``, ``torch.zeros_like(y).scatter_(-1, idx,
    1.0)``."""
    for node in walk(value):
        callee = _callee(node)
        if callee == "one_hot" and node.args:
            arg = node.args[0]
            soft = _argmax_of(arg) or (picks.get(arg.id) if isinstance(arg, ast.Name) else None)
            if soft:
                return soft
        if callee in ("scatter", "scatter_") and len(node.args) >= 2:
            index = node.args[1]
            index = index.func.value if _callee(index) == "unsqueeze" and \
                isinstance(index.func, ast.Attribute) else index
            soft = _argmax_of(index) or (picks.get(index.id) if isinstance(index, ast.Name)
                                         else None)
            if soft:
                return soft
    return None


def _relaxed(scope: ast.FunctionDef, name: str, assigns: list) -> bool:
    """Whether ``name`` is a relaxed sample: assigned from a (Gumbel-)softmax call, in a function
    that takes a temperature."""
    params = {a.arg.lower() for a in scope.args.args + scope.args.kwonlyargs}
    made = [n for n in assigns if n.targets[0].id == name]
    soft = any(any(word in (_callee(sub) or "").lower() for word in _SOFT_CALLS)
               for n in made for sub in walk(n.value))
    return soft and bool(params & _TEMPERATURES)


def _given_on(scope: ast.AST, name: str, after: int, quiet: set[int]):
    """The first statement after ``after`` that returns ``name`` or gives it to a call that is no
    loss or metric (a decoder), outside ``no_grad``; with whether the same statement also hands
    on another name of the scope (the soft sample beside the hard one)."""
    parents = {}
    for node in [scope, *scope_walk(scope)]:
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    reads = sorted((n for n in scope_walk(scope) if isinstance(n, ast.Name) and n.id == name
                    and isinstance(n.ctx, ast.Load) and n.lineno > after
                    and n.lineno not in quiet), key=lambda n: n.lineno)
    for node in reads:
        child, parent = node, parents.get(id(node))
        while parent is not None and not isinstance(parent, ast.stmt):
            callee = _callee(parent)
            if callee is not None and child is not getattr(parent, "func", None):
                if any(word in callee.lower() for word in _LOSS_WORDS) or callee in _PASSIVE:
                    break
                return parents_stmt(parents, parent)
            child, parent = parent, parents.get(id(parent))
        else:
            if isinstance(parent, ast.Return):
                return parent
    return None


def parents_stmt(parents: dict, node: ast.AST) -> ast.AST:
    while node is not None and not isinstance(node, ast.stmt):
        node = parents.get(id(node))
    return node


def hardened_samples(tree: ast.AST) -> list[dict]:
    """Relaxed samples (a Gumbel-softmax of a function taking a temperature) replaced by their
    hard one-hot and given on or returned, in a function that writes no straight-through
    estimator and does not hand the soft sample on beside it."""
    found = []
    for scope in walk(tree):
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if _straight_through(scope):
            continue
        assigns = sorted((n for n in scope_walk(scope) if isinstance(n, ast.Assign)
                          and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)),
                         key=lambda n: n.lineno)
        quiet = _no_grad_lines(scope)
        picks: dict[str, str] = {}
        for node in assigns:
            name = node.targets[0].id
            soft = _argmax_of(node.value)
            if soft is not None:
                picks[name] = soft
                continue
            soft = _hardened(node.value, picks)
            if soft is None or node.lineno in quiet or not _relaxed(scope, soft, assigns):
                continue
            site = _given_on(scope, name, node.lineno, quiet)
            if site is None:
                continue
            handed = {n.id for n in walk(site) if isinstance(n, ast.Name)}
            if soft in handed:
                continue  # the soft sample goes on too: the caller combines them
            found.append({"line": site.lineno, "statement": ast.unparse(site).strip()[:120],
                          "hard": name, "soft": soft, "made": node.lineno})
    return found


class RelaxedSampleHardened(Rule):
    """
    ## What it does
    Finds a Gumbel-softmax (concrete) relaxation whose hard one-hot is handed on without a
    straight-through estimator: in a function that takes a temperature, a relaxed sample
    (assigned from a softmax or Gumbel call) turned into `F.one_hot(y.argmax(-1), K)` (or a
    `scatter_` of its argmax) and returned or given to a network, while the function writes no
    `(y_hard - y).detach() + y` and does not hand the soft sample on beside it. Read from the
    source of the files a backward ran from; reported where the hard sample is handed on.

    ## Why is this bad?
    An argmax and a one-hot have no gradient: the decoder's loss stops at the hard sample and
    never reaches the logits. The relaxation exists to carry that gradient, and the
    straight-through form `y_hard - y.detach() + y` is what makes a hard forward keep the soft
    sample's backward. Without it the encoder (or the policy) learns only from the terms that
    read its logits directly, such as the KL to the prior, which pull it toward the uniform
    prior; the reconstruction stays poor while every loss falls.

    ## Example
    ```python
    def gumbel_softmax(logits, tau, hard=True):
        y = F.softmax((logits + sample_gumbel(logits)) / tau, dim=-1)
        y_hard = F.one_hot(y.argmax(dim=-1), logits.size(-1)).float()
        return y_hard
    ```

    ## Use instead
    ```python
        return (y_hard - y).detach() + y
    ```

    ## Stays silent on
    The straight-through forms (`(y_hard - y).detach() + y`, `y_hard + y - y.detach()`); a
    function that returns the soft sample beside the hard one (`return y_hard, y`); a hard
    sample given to a loss or a metric, or made under `no_grad` (evaluation, a discrete
    action sent to an environment); a one-hot of an argmax in a function without a temperature
    or of values no softmax made (class predictions); `F.gumbel_softmax(..., hard=True)`.
    """

    code = "GD356"
    slug = "relaxed-sample-hardened"
    severity = Severity.WARNING
    summary = ("a Gumbel-softmax sample is replaced by its hard one-hot without a straight-through "
               "estimator: the loss never reaches the logits through it")
    fix = "hand on y_hard - y.detach() + y (hard in value, the relaxed sample's gradient)"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for site in hardened_samples(tree):
                hard, soft = site["hard"], site["soft"]
                yield self.finding(
                    f"`{site['statement']}` hands on `{hard}`, the one-hot of `{soft}`'s argmax "
                    f"(line {site['made']}), with no straight-through estimator in the function: "
                    f"an argmax has no gradient, so the loss never reaches the logits through "
                    f"this sample and the encoder learns only from the terms that read them "
                    f"directly",
                    Location(path, site["line"]),
                    evidence={"hard": hard, "soft": soft, "made": site["made"]},
                    fix=(f"hand on `({hard} - {soft}).detach() + {soft}`: the hard sample's value, "
                         f"the relaxed sample's gradient"))
