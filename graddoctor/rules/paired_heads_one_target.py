from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

# the two ends of a span, of a relation or of a pair, as names spell them
_PAIRS = (("start", "end"), ("begin", "end"), ("head", "tail"), ("subj", "obj"),
          ("left", "right"))
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def _words(name: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(name)]


def _swapped(a: str, b: str) -> tuple[str, str] | None:
    """The pair ``(word of a, word of b)`` when the two expressions' texts differ only by one
    pair's words swapped (``start_logits`` / ``end_logits``, ``out.head_scores`` /
    ``out.tail_scores``)."""
    if a == b:
        return None
    ta, tb = re.split(r"(\W+)", a), re.split(r"(\W+)", b)
    if len(ta) != len(tb):
        return None
    found = None
    for x, y in zip(ta, tb):
        if x == y:
            continue
        wx, wy = _words(x), _words(y)
        if len(wx) != len(wy):
            return None
        for u, v in zip(wx, wy):
            if u == v:
                continue
            pair = next(((p, q) for p, q in _PAIRS if {u, v} == {p, q}), None)
            if pair is None or (found is not None and found != (u, v)):
                return None
            found = (u, v)
    return found


def _target_side(target: str, pair: tuple[str, str]) -> str | None:
    """Which end a target's name says it holds: one of the pair's words in it, or its first
    letter alone (``sp`` for start positions, ``ep`` for end ones)."""
    words = [w for part in re.split(r"\W+", target) for w in _words(part)]
    for w in pair:
        if w in words:
            return w
    initials = {w[0] for w in pair}
    if len(initials) == 2:
        hits = [w for w in pair for word in words if len(word) <= 3 and word[0] == w[0]
                and not any(word == other for other in pair)]
        if len(set(hits)) == 1:
            return hits[0]
    return None


def _calls(func: ast.AST) -> list[ast.Call]:
    return sorted((n for n in walk(func) if isinstance(n, ast.Call) and len(n.args) >= 2),
                  key=lambda c: (c.lineno, c.col_offset))


def paired_heads_one_target(tree: ast.AST) -> list[tuple[int, str, str, str, str]]:
    """``(line, call text, the other call's text, its end, the shared target)`` for each pair
    of calls of one function in one scope whose predictions are the two ends of a pair
    (``start_logits`` / ``end_logits``) and whose targets (and every other argument) are the
    same text, a target whose name holds one end (``start_positions``, ``h_idx``); the line is
    the call whose prediction the target's name does not match."""
    found = []
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                             ast.Module))]
    seen = set()
    for scope in scopes:
        calls = _calls(scope)
        for i, first in enumerate(calls):
            for second in calls[i + 1:]:
                if (first.lineno, first.col_offset, second.lineno, second.col_offset) in seen:
                    continue
                if ast.unparse(first.func) != ast.unparse(second.func):
                    continue
                if [ast.unparse(x) for x in first.args[1:]] != [ast.unparse(x) for x in second.args[1:]] \
                        or [ast.unparse(k) for k in first.keywords] != [ast.unparse(k) for k in second.keywords]:
                    continue
                target = first.args[1]
                if isinstance(target, ast.Constant):
                    continue
                pair = _swapped(ast.unparse(first.args[0]), ast.unparse(second.args[0]))
                if pair is None:
                    continue
                seen.add((first.lineno, first.col_offset, second.lineno, second.col_offset))
                side = _target_side(ast.unparse(target), pair)
                if side is None:
                    # a target that names neither end is one label both ends may share (two
                    # views of one sample, head- and tail-corrupted triples scored as valid or not)
                    continue
                wrong, right = (first, second) if side == pair[1] else (second, first)
                found.append((wrong.lineno, ast.unparse(wrong), ast.unparse(right),
                              pair[0] if wrong is first else pair[1], ast.unparse(target)))
    return found


class PairedHeadsOneTarget(Rule):
    """
    ## What it does
    Finds the two ends of a pair trained against one target: a span's start and end logits,
    a relation's head and tail scores, the subject and object of a triple, given to the same
    loss with the same target (`F.cross_entropy(start_logits, start_positions)` and
    `F.cross_entropy(end_logits, start_positions)`). Read from the script's source, in the
    files whose backwards ran: in one function, two calls of one loss whose first arguments
    differ only by a pair's words swapped (`start`/`end`, `begin`/`end`, `head`/`tail`,
    `subj`/`obj`, `left`/`right`) and whose other arguments are the same text, a target whose
    name holds one end (`start_positions`, `h_idx`). It points at the call whose prediction the
    target's name does not match.

    ## Why is this bad?
    The end head learns to point where answers start: both heads are trained toward the
    same position, so every predicted span is one token long (or starts where it should
    end), and the loss still falls. The end positions the data loader serves are never read.

    ## Example
    ```python
    start_loss = F.cross_entropy(start_logits, start_positions)
    end_loss = F.cross_entropy(end_logits, start_positions)
    ```

    ## Use instead
    ```python
    start_loss = F.cross_entropy(start_logits, start_positions)
    end_loss = F.cross_entropy(end_logits, end_positions)
    ```

    ## Stays silent on
    Deep supervision and auxiliary heads trained on one label (`aux_logits` and `logits`:
    no pair's words), each end with its own target, and calls with a constant target; a
    target whose name holds neither end (`labels`): one label both ends are meant to share, as
    two views of one sample (`left_logits`, `right_logits` against the scene's class) or
    head- and tail-corrupted triples scored against one validity label.
    """

    code = "GD416"
    slug = "paired-heads-one-target"
    severity = Severity.WARNING
    summary = ("the two ends of a pair (a span's start and end logits, a relation's head and "
               "tail) are trained against the same target: one head learns the other's")
    fix = "give each end its own target (the end positions to the end logits)"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, other, end, target in paired_heads_one_target(tree):
                yield self.finding(
                    f"`{text}` trains the {end} prediction against `{target}`, the same target "
                    f"as `{other}`: both ends of the pair learn one position, so the {end} head "
                    f"never learns its own (a span collapses to its start, a relation to its "
                    f"head), while the loss still falls",
                    Location(path, line, None),
                    evidence={"target": target, "end": end, "other": other},
                    fix=f"give the {end} prediction its own target in `{text}`, not `{target}`")
