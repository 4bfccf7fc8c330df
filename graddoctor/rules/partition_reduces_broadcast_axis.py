from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from .partition_ignores_mask import _loop_assignments, _recurrence, logsumexp_calls
from .softmax_wrong_axis import _dim_of
from ..analysis.source import walk


def _const_int(node: ast.AST) -> int | None:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def broadcast_axis(expr: ast.AST, state: str) -> tuple[int, bool] | None:
    """``(axis, counted_from_end)`` of the new axis along which ``expr`` broadcasts ``state``:
    ``state.unsqueeze(2)`` -> (2, False), ``state.unsqueeze(-1)`` -> (-1, True),
    ``state[:, :, None]`` -> (2, False), ``state[..., None, :]`` -> (-2, True); None when
    ``expr`` holds no such term (or more than one)."""
    found = []
    for n in walk(expr):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                and n.func.attr == "unsqueeze" and isinstance(n.func.value, ast.Name) \
                and n.func.value.id == state and len(n.args) == 1:
            k = _const_int(n.args[0])
            if k is not None:
                found.append((k, k < 0))
        elif isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == state:
            items = n.slice.elts if isinstance(n.slice, ast.Tuple) else [n.slice]
            nones = [i for i, e in enumerate(items) if isinstance(e, ast.Constant) and e.value is None]
            ellipsis = [i for i, e in enumerate(items)
                        if isinstance(e, ast.Constant) and e.value is Ellipsis]
            plain = all(isinstance(e, ast.Slice) or (isinstance(e, ast.Constant)
                                                     and e.value in (None, Ellipsis)) for e in items)
            if len(nones) != 1 or len(ellipsis) > 1 or not plain:
                continue
            if ellipsis and ellipsis[0] < nones[0]:
                found.append((nones[0] - len(items), True))
            elif not ellipsis:
                found.append((nones[0], False))
    return found[0] if len(found) == 1 else None


def _reduced_operand(loop: ast.For, call: ast.Call) -> ast.AST | None:
    """What a ``logsumexp`` call reduces: its tensor argument, followed back once through the
    loop's latest assignment of that name before the call's line."""
    func = call.func
    method = isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name)
                                                        and func.value.id == "torch")
    operand = func.value if method else (call.args[0] if call.args else None)
    if isinstance(operand, ast.Name):
        before = [s for s in _loop_assignments(loop)
                  if s.targets[0].id == operand.id and s.lineno < call.lineno]
        if before:
            return before[-1].value
    return operand


def broadcast_reductions(tree: ast.AST) -> list[tuple[int, str, str, str, int, int | None]]:
    """``(line, call text, function, carried name, reduced dim, the dim to reduce or None when
    the source does not tell it)`` for each
    forward-algorithm recurrence whose ``logsumexp`` reduces over the very axis along which the
    previous step's scores are broadcast."""
    found = []
    for func in walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        recurrence = _recurrence(func)
        if recurrence is None:
            continue
        loop, carry = recurrence
        state = carry.targets[0].id
        for call in logsumexp_calls(loop):
            dim = _dim_of(ast.unparse(call))
            operand = _reduced_operand(loop, call)
            axis = broadcast_axis(operand, state) if operand is not None else None
            if dim is None or axis is None:
                continue
            k, from_end = axis
            if (dim < 0) != from_end or dim != k:
                continue  # another axis, or one counted from the other end: rank unknown
            # the axis the carried scores run along, where the rank does not matter
            other = {-1: -2, -2: -1, 2: 1}.get(k)
            found.append((call.lineno, ast.unparse(call), func.name, state, dim, other))
    return found


class PartitionReducesBroadcastAxis(Rule):
    """
    ## What it does
    Finds a forward algorithm (a CRF's log-partition, an HMM's or a semi-Markov model's
    recurrence) whose `logsumexp` reduces over the axis along which the previous step's scores
    were broadcast: `alpha.unsqueeze(2) + trans + emit` reduced over `dim=2` instead of
    `dim=1`. Read from the script's source, in the files whose backwards ran: a `for` loop
    that rebinds the name its `logsumexp` reads (the forward variables), where the reduced
    tensor adds those variables with a new axis (`alpha.unsqueeze(k)`, `alpha[:, :, None]`)
    and the call's literal `dim` is that new axis.

    ## Why is this bad?
    Along the broadcast axis the previous scores are the same in every term, so
    `logsumexp_j(alpha_i + s_ij) = alpha_i + logsumexp_j(s_ij)`: each step keeps every
    previous tag's score apart and never sums over the previous tag. The result is not the
    sum over paths, so `log Z - score(gold)` is no negative log-likelihood: the transitions get
    the wrong gradient, and nothing fails — the loss is finite and still decreases.

    ## Example
    ```python
    for t in range(1, T):
        nxt = alpha[:, :, None] + self.trans[None] + emissions[:, t, None, :]
        alpha = torch.logsumexp(nxt, dim=2)
    ```

    ## Use instead
    ```python
    for t in range(1, T):
        nxt = alpha[:, :, None] + self.trans[None] + emissions[:, t, None, :]
        alpha = torch.logsumexp(nxt, dim=1)  # sum over the previous tag
    ```

    ## Stays silent on
    A recurrence that reduces over the other axis (`alpha[:, :, None]` with `dim=1`,
    `alpha.unsqueeze(1)` with `dim=2`, a backward algorithm's `beta[:, None, :]` with
    `dim=2`); a reduction whose axis and the broadcast are counted from different ends
    (`unsqueeze(2)` with `dim=-1`: the rank is not in the source); a `max` (Viterbi decoding).
    """

    code = "GD414"
    slug = "partition-reduces-broadcast-axis"
    severity = Severity.WARNING
    summary = ("a forward algorithm's logsumexp reduces over the axis the previous step's "
               "scores are broadcast along: it never sums over the previous tag, so the "
               "partition function is not the sum over paths")
    fix = "reduce over the previous tag's axis, the one the forward variables run along"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, function, state, dim, other in broadcast_reductions(tree):
                yield self.finding(
                    f"`{function}`'s recurrence reduces over dim={dim} (`{text}`), the axis "
                    f"along which the previous step's scores `{state}` are broadcast: "
                    f"`{state}` is the same in every term there, so the step returns "
                    f"`{state}` plus a `logsumexp` of the rest and never sums over the previous "
                    f"tag. The partition function is then no sum over paths and the "
                    f"negative log-likelihood trains the transitions wrongly",
                    Location(path, line, None),
                    evidence={"function": function, "carried": state, "dim": dim},
                    fix=(f"reduce over dim={other}, the axis `{state}` runs along (the previous "
                         f"tag), not dim={dim}" if other is not None else
                         f"reduce over the axis `{state}` runs along (the previous tag), not "
                         f"dim={dim}, the axis it is broadcast along"))
