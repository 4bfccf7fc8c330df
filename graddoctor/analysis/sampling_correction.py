"""Sampled-softmax logits whose log sampling probability is added instead of subtracted, read
from the script's source (sampling-correction-added).

A sampled softmax (in-batch negatives, popularity-sampled or log-uniform candidates) scores each
candidate ``s`` with ``logits - log Q(s)``: the candidates drawn often are the ones the softmax
sees most, and the correction takes their sampling rate back out. Written ``logits + log_q``,
the popular candidates get their frequency added once more, the model learns to push them down
twice over, and retrieval ranks the long tail above what users click.

Read in every function and at the module's top level: a sum (``a + b``, ``a.add(b)``,
``a += b``) one side of which is a log sampling probability and the other (or the assigned
name) a score:

- a log sampling probability is a name or attribute (through subscripts, ``unsqueeze``/
  ``view``/casts) whose words say log and the proposal ``q`` (``log_q``, ``logq``,
  ``log_q_items``), or say log and sampling (``log_sampling_prob``, ``sampled_log_prob``), or
  expected count (``log_expected_count``), or ``torch.log``/``np.log``/``.log()`` of a name whose
  words say ``q``, sampling or expected count (``torch.log(q[items])``, ``sampling_probs.log()``);
- a score is a name or attribute whose words say logit(s), score(s), sim(ilarity), dot, rating.

A name with a negating word (``neg_log_q``, ``minus_log_q``) holds the correction's sign
already, and a prior (``log_prior``, class frequencies: the logit-adjusted loss adds them on
purpose) is no sampling probability: neither reads as one.
"""

from __future__ import annotations

import ast
import re

from .source import _parse, walk

_PASS = frozenset({"unsqueeze", "view", "reshape", "float", "to", "type", "detach", "squeeze",
                   "expand", "expand_as", "double", "cuda", "cpu", "flatten", "t"})
_LOGS = frozenset({"log", "log2", "log10"})
_MODULES = frozenset({"torch", "np", "numpy", "math"})
_WORD = re.compile(r"_+|(?<=[a-z])(?=[A-Z])")
_NEGATING = frozenset({"neg", "minus", "negative", "negated"})
_SCORE = frozenset({"logit", "logits", "score", "scores", "sim", "sims", "similarity",
                    "similarities", "dot", "dots", "rating", "ratings"})
_SAMPLING = frozenset({"sampling", "sampled", "sample", "proposal"})


def _words(name: str) -> list[str]:
    return [w.lower() for w in _WORD.split(name) if w]


def _bare(expr: ast.AST) -> ast.AST:
    while True:
        if isinstance(expr, ast.Subscript):
            expr = expr.value
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _PASS:
            expr = expr.func.value
        else:
            return expr


def _name(expr: ast.AST) -> str | None:
    expr = _bare(expr)
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None


def _proposal(words: list[str]) -> bool:
    """Words that name a sampling probability (without the log)."""
    if _NEGATING & set(words) or "prior" in words:
        return False
    joined = "_".join(words)
    return "q" in words or bool(_SAMPLING & set(words)) and any(w.startswith("prob") for w in words) \
        or "expected_count" in joined


def _log_proposal(expr: ast.AST) -> bool:
    expr = _bare(expr)
    if isinstance(expr, ast.Call):
        func = expr.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called not in _LOGS:
            return False
        if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name)
                                                    and func.value.id in _MODULES):
            inner = func.value  # q.log()
        else:
            inner = expr.args[0] if expr.args else None  # torch.log(q), log(q)
        name = _name(inner) if inner is not None else None
        return name is not None and _proposal(_words(name))
    name = _name(expr)
    if name is None:
        return False
    words = _words(name)
    if _NEGATING & set(words) or "prior" in words:
        return False
    joined = "".join(words)
    if "logq" in words or ("log" in words and "q" in words) or joined.startswith("logq"):
        return True
    return "log" in words and _proposal(words)


def _score(expr: ast.AST | None) -> bool:
    name = _name(expr) if expr is not None else None
    return name is not None and bool(_SCORE & set(_words(name)))


def corrections_added(path: str) -> list[tuple[int, str, str]]:
    """``(line, statement text, the correction's text)`` of each sum adding a log sampling
    probability to scores."""
    tree = _parse(path)
    if tree is None:
        return []
    found, told = [], set()
    for node in walk(tree):
        pairs: list[tuple[ast.AST, ast.AST, ast.AST | None]] = []  # (score side, correction, target)
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            for sub in walk(node.value):
                if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Add):
                    pairs += [(sub.left, sub.right, target), (sub.right, sub.left, target)]
                elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) \
                        and sub.func.attr == "add" and len(sub.args) == 1 and not sub.keywords:
                    pairs.append((sub.func.value, sub.args[0], target))
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
            pairs.append((node.target, node.value, node.target))
        for score, correction, target in pairs:
            if not _log_proposal(correction):
                continue
            if not (_score(score) or _score(target)):
                continue
            if node.lineno in told:
                continue
            told.add(node.lineno)
            found.append((node.lineno, ast.unparse(node), ast.unparse(correction)))
    return sorted(found)
