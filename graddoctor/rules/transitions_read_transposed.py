from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from .partition_ignores_mask import _recurrence, logsumexp_calls
from .partition_reduces_broadcast_axis import _reduced_operand, broadcast_axis
from .softmax_wrong_axis import _dim_of
from ..analysis.source import walk

_TRANSPOSES = ("t", "T", "mT", "transpose", "permute")


def _rows_are_previous(state_axis: tuple[int, bool], dim: int) -> bool | None:
    """Whether a recurrence that broadcasts its scores along ``state_axis`` and reduces over
    ``dim`` (the previous tag's axis) reads an untransposed matrix's rows as the previous tag:
    the previous tag runs along the second-to-last axis of the batched ``[B, K, K]`` (or the
    unbatched ``[K, K]``) sum. None when the source leaves it open."""
    k, _ = state_axis
    if k == dim:
        return None  # the recurrence reduces the wrong axis: partition-reduces-broadcast-axis
    if dim in (0, -2) or (dim == 1 and k in (2, -1)):
        return True
    if dim in (2, -1) or (dim == 1 and k in (0, -2)):
        return False
    return None


def _matrix_terms(operand: ast.AST) -> list[tuple[str, bool]]:
    """``(attribute name, transposed)`` for each ``self.<name>`` the reduced sum adds, as it
    is (``self.trans``, ``self.trans[None]``, ``self.trans.unsqueeze(0)``) or transposed
    (``self.trans.t()``, ``self.trans.T[None]``, ``self.trans.transpose(0, 1)``)."""
    terms = []
    seen = set()
    for n in walk(operand):
        if not (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                and n.value.id == "self") or id(n) in seen:
            continue
        seen.add(id(n))
        terms.append((n.attr, False))
    out = []
    for name, _ in terms:
        transposed = any(
            isinstance(n, ast.Attribute) and n.attr in _TRANSPOSES
            and isinstance(n.value, ast.Attribute) and n.value.attr == name
            and isinstance(n.value.value, ast.Name) and n.value.value.id == "self"
            for n in walk(operand))
        out.append((name, transposed))
    return out


def _time_order(index: ast.AST) -> int | None:
    """-1 when an index reads the earlier step (``tags[:, t - 1]``, ``tags[:, :-1]``), +1 the
    later one (``tags[:, t + 1]``, ``tags[:, 1:]``), 0 the step itself (``tags[:, t]``), None
    when it is no tag sequence read at a step."""
    if not isinstance(index, ast.Subscript):
        return None
    order = 0
    for n in walk(index.slice):
        if isinstance(n, ast.BinOp) and isinstance(n.right, ast.Constant) and n.right.value == 1:
            order = -1 if isinstance(n.op, ast.Sub) else (1 if isinstance(n.op, ast.Add) else order)
        elif isinstance(n, ast.Slice):
            if n.upper is not None and _const(n.upper) == -1 and n.lower is None:
                order = -1
            elif n.lower is not None and _const(n.lower) == 1 and n.upper is None:
                order = 1
    return order


def _const(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return None


def _gold_reads(func: ast.AST, name: str) -> list[tuple[ast.Subscript, bool]]:
    """``(subscript, rows are the previous tag)`` for each ``self.<name>[a, b]`` whose two
    indices read a tag sequence at two different steps."""
    out = []
    for n in walk(func):
        if not (isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute)
                and n.value.attr == name and isinstance(n.value.value, ast.Name)
                and n.value.value.id == "self" and isinstance(n.slice, ast.Tuple)
                and len(n.slice.elts) == 2):
            continue
        first, second = (_time_order(e) for e in n.slice.elts)
        if first is None or second is None or first == second:
            continue
        out.append((n, first < second))
    return out


def transposed_readings(tree: ast.AST) -> list[tuple[int, str, str, str, int, bool]]:
    """``(line, gold text, matrix, gold function, partition line, partition rows are the
    previous tag)`` for each class whose forward algorithm reads its transition matrix in one
    orientation while the gold path's score indexes it in the other."""
    found = []
    for scope in walk(tree):
        if not isinstance(scope, ast.ClassDef):
            continue
        funcs = [n for n in scope.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        partitions = {}
        for f in funcs:
            recurrence = _recurrence(f)
            if recurrence is None:
                continue
            loop, carry = recurrence
            for call in logsumexp_calls(loop):
                dim = _dim_of(ast.unparse(call))
                operand = _reduced_operand(loop, call)
                axis = broadcast_axis(operand, carry.targets[0].id) if operand is not None else None
                if dim is None or axis is None:
                    continue
                rows_previous = _rows_are_previous(axis, dim)
                if rows_previous is None:
                    continue
                for name, transposed in _matrix_terms(operand):
                    partitions.setdefault(name, (call.lineno, rows_previous != transposed, f.name))
        for name, (line, rows_previous, partition) in partitions.items():
            for f in funcs:
                if f.name == partition:
                    continue
                reads = _gold_reads(f, name)
                if reads and all(r != rows_previous for _, r in reads):
                    node = reads[0][0]
                    found.append((node.lineno, ast.unparse(node), name, f.name, line, rows_previous))
    return found


class TransitionsReadTransposed(Rule):
    """
    ## What it does
    Finds a CRF whose gold path's score reads the transition matrix in the other orientation
    than its partition function: the forward algorithm treats `self.trans[i, j]` as the score
    of going from tag `i` to tag `j`, the gold score adds `self.trans[tags[t], tags[t - 1]]`
    (to, from) — or the other way round. Read from the script's source, in the files whose
    backwards ran: in one class, a `logsumexp` recurrence over
    `alpha.unsqueeze(k) + self.<matrix> + ...` (its orientation given by the axis it reduces
    and by a `.t()`/`.T`/`.transpose` on the matrix), and in another method every read of
    `self.<matrix>[a, b]` whose indices take the tags at two steps (`t - 1` and `t`, `:-1`
    and `1:`) in the opposite order.

    ## Why is this bad?
    The negative log-likelihood `log Z - score(gold)` is only a likelihood when the gold path
    is scored as one of the paths `Z` sums over. With the matrix read transposed on one side,
    the loss raises the score of the reversed transitions in the gold term and lowers the
    real ones through `Z`: the transitions learn nonsense (or nothing), decoding follows them,
    and the loss still falls thanks to the emissions, so nothing looks wrong.

    ## Example
    ```python
    def partition(self, emissions):
        alpha = self.start + emissions[:, 0]
        for t in range(1, emissions.size(1)):
            alpha = torch.logsumexp(alpha[:, :, None] + self.trans + emissions[:, t, None], dim=1)
        ...
    def gold(self, emissions, tags):
        ...
            score = score + self.trans[tags[:, t], tags[:, t - 1]]
    ```

    ## Use instead
    ```python
            score = score + self.trans[tags[:, t - 1], tags[:, t]]  # [from, to], as in partition
    ```

    ## Stays silent on
    A CRF that keeps its matrix as `[to, from]` on both sides (`self.trans.t()` in the
    recurrence, or `alpha.unsqueeze(1)` reduced over `dim=2`, with
    `self.trans[tags[:, t], tags[:, t - 1]]`); a gold score that reads the matrix another way
    (`gather`, a flat index); reads whose indices are not two steps of a tag sequence.
    """

    code = "GD415"
    slug = "transitions-read-transposed"
    severity = Severity.WARNING
    summary = ("a CRF's gold path indexes the transition matrix as [to, from] while its "
               "partition function reads it as [from, to] (or the other way round): the gold "
               "path is no path the partition sums over")
    fix = "index the transition matrix in the gold score the way the forward algorithm reads it"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, name, function, partition, rows_previous in transposed_readings(tree):
                side = "[from, to]" if rows_previous else "[to, from]"
                gold_side = "[to, from]" if rows_previous else "[from, to]"
                yield self.finding(
                    f"`{function}` reads the transitions as {gold_side} (`{text}`), while the "
                    f"forward algorithm at line {partition} reads `self.{name}` as {side}: the "
                    f"gold path is scored with the reversed transitions, so it is no path the "
                    f"partition function sums over and the negative log-likelihood trains "
                    f"`self.{name}` toward the wrong transitions",
                    Location(path, line, None),
                    evidence={"matrix": name, "partition_line": partition,
                              "partition_orientation": side},
                    fix=(f"index `self.{name}` as {side} in `{function}` (previous tag first"
                         if rows_previous else
                         f"index `self.{name}` as {side} in `{function}` (current tag first")
                    + "), as the forward algorithm does, or transpose it in both places")
