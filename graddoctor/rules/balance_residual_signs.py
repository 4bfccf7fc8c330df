from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

# What a GFlowNet balance residual's terms are, told by their names (lower case, words split on
# "_"): the forward policy's log-probabilities and the log partition function on one side, the
# backward policy's and the log reward on the other.
_PREFIX = r"^((traj|sum|total|tot|cum)_?)?"
_FORWARD = re.compile(_PREFIX + r"(log_?)?(p_?f|pf_?log_?probs?|fwd(_log_?probs?)?|forward_log_?probs?)"
                      r"(s|_sum|_traj|_tot|_total)?$|^log_?(p_?f|fwd)(s|_sum|_traj|_tot|_total)?$")
_BACKWARD = re.compile(_PREFIX + r"(log_?)?(p_?b|pb_?log_?probs?|bwd(_log_?probs?)?|backward_log_?probs?)"
                       r"(s|_sum|_traj|_tot|_total)?$|^log_?(p_?b|bwd)(s|_sum|_traj|_tot|_total)?$")
_PARTITION = re.compile(r"^log_?z$|^logz$|^log_?partition$")
_REWARD = re.compile(r"^log_?r(eward)?s?$|^log_?rew(ard)?s?$")

_SIDES = {"forward": +1, "partition": +1, "backward": -1, "reward": -1}
_SHOWN = {"forward": "the forward policy's log-probability", "partition": "log Z",
          "backward": "the backward policy's log-probability", "reward": "the log reward"}
_SQUARING = {"pow", "square", "abs"}
_REGRESSIONS = {"mse_loss", "smooth_l1_loss", "huber_loss", "l1_loss"}


def _kind(term: ast.AST) -> str | None:
    """What a term of a residual is, by the names it reads: the one class its names fall in
    (``log_pf.sum(1)``, ``torch.sum(log_pb, -1)``, ``self.log_z``), else None."""
    kinds = set()
    for node in walk(term):
        name = node.id if isinstance(node, ast.Name) else \
            node.attr if isinstance(node, ast.Attribute) else None
        if name is None:
            continue
        low = name.lower()
        for kind, pattern in (("forward", _FORWARD), ("backward", _BACKWARD),
                              ("partition", _PARTITION), ("reward", _REWARD)):
            if pattern.match(low):
                kinds.add(kind)
    return kinds.pop() if len(kinds) == 1 else None


def _terms(node: ast.AST, sign: int, out: list) -> None:
    """The additive terms of ``node`` with their signs."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        _terms(node.left, sign, out)
        _terms(node.right, sign if isinstance(node.op, ast.Add) else -sign, out)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        _terms(node.operand, -sign, out)
    else:
        out.append((node, sign))


def _residuals(scope: ast.AST) -> list[ast.AST]:
    """Expressions a loss squares or regresses: ``(r) ** 2``, ``r.pow(2)``, ``torch.square(r)``,
    ``F.mse_loss(a, b)`` (as ``a - b``), and the value of a name assigned once in the scope that
    is then squared (``delta = ...; loss = delta.pow(2)``)."""
    found = []
    for node in walk(scope):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            found.append(node.left)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _SQUARING and not node.args[1:]:
            target = node.args[0] if node.args and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == "torch" else node.func.value
            found.append(target)
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else \
                func.id if isinstance(func, ast.Name) else None
            if name in _REGRESSIONS:
                found.append(ast.BinOp(left=node.args[0], op=ast.Sub(), right=node.args[1],
                                       lineno=node.lineno, col_offset=node.col_offset))
    assigned: dict[str, list] = {}
    for node in walk(scope):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            assigned.setdefault(node.targets[0].id, []).append(node.value)
    out = []
    for expr in found:
        if isinstance(expr, ast.Name) and len(assigned.get(expr.id, ())) == 1:
            expr = assigned[expr.id][0]
        out.append(expr)
    return out


def misaligned_balances(tree: ast.AST) -> list[tuple[int, str, str, str]]:
    """``(line, text, kind, against)`` for each squared residual of a balance (two of its terms
    told apart as forward policy, backward policy, log Z or log reward) in which a term's sign
    breaks the balance: the backward policy's log-probability (or the log reward) on the side
    of the forward policy's (or of log Z). ``kind`` is the term on the wrong side, ``against``
    the term it was compared with."""
    found = []
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes + [tree]:
        for expr in _residuals(scope):
            terms: list = []
            _terms(expr, +1, terms)
            signs: dict[str, set] = {}
            for term, sign in terms:
                kind = _kind(term)
                if kind is not None:
                    signs.setdefault(kind, set()).add(sign)
            if len(signs) < 2 or any(len(s) != 1 for s in signs.values()):
                continue
            side = {kind: s.pop() * _SIDES[kind] for kind, s in signs.items()}
            if len(set(side.values())) == 1:
                continue
            if len(side) == 2:  # one pair: the forward policy (else log Z) sets the side
                anchor = "forward" if "forward" in side else "partition"
                if anchor not in side:
                    continue
                wrong = [k for k in side if k != anchor]
            else:  # three or four terms: the one term against all the others
                plus = [k for k in side if side[k] > 0]
                minus = [k for k in side if side[k] < 0]
                wrong = plus if len(plus) == 1 else minus if len(minus) == 1 else []
                if len(wrong) != 1:
                    continue
                rest = [k for k in ("forward", "partition", "backward", "reward")
                        if k in side and k != wrong[0]]
                anchor = rest[0]
            found.append((expr.lineno, ast.unparse(expr), wrong[0], anchor))
    return sorted(set(found))


class BalanceResidualSigns(Rule):
    """
    ## What it does
    Finds a GFlowNet balance loss (trajectory balance, detailed or sub-trajectory balance)
    whose squared residual puts a term on the wrong side: the backward policy's
    log-probabilities added with the sign of the forward policy's
    (`(log_z + log_pf - log_r + log_pb) ** 2`), the log reward with the sign of log Z, or log Z
    against the forward policy. The terms are told by their names (`log_pf`/`logPF`/`fwd_logprobs`,
    `log_pb`, `log_z`/`logZ`, `log_r`/`log_reward`) in expressions that are squared
    (`** 2`, `.pow(2)`, `torch.square`) or regressed (`mse_loss(a, b)`), directly or through
    one assignment. Read from the source of the files a backward ran from.

    ## Why is this bad?
    Trajectory balance asks `Z * prod P_F = R(x) * prod P_B` along each trajectory: in log
    space, `log Z + sum log P_F - log R(x) - sum log P_B = 0`. With a term's sign flipped the
    loss still goes down, but to a different fixed point: log Z runs off (it absorbs the
    trajectory lengths' log-probabilities), and the sampler no longer draws objects in
    proportion to their reward. Nothing fails and the loss looks converged.

    ## Example
    ```python
    loss = (log_z + log_pf.sum(1) - log_reward + log_pb.sum(1)).pow(2).mean()
    ```

    ## Use instead
    ```python
    loss = (log_z + log_pf.sum(1) - log_reward - log_pb.sum(1)).pow(2).mean()
    ```

    ## Stays silent on
    Balances with consistent signs in either orientation (`(log_r + log_pb - log_z - log_pf)`),
    `mse_loss(log_z + log_pf, log_r + log_pb)`, a tree-shaped space without a backward policy,
    flows of states (`log_F(s)`, which appear on both sides), terms whose names say nothing, a
    term that appears with both signs, and files no backward ran from.
    """

    code = "GD360"
    slug = "balance-residual-signs"
    severity = Severity.WARNING
    summary = ("a GFlowNet balance loss puts a term on the wrong side: the backward policy's "
               "log-probability (or the log reward) with the sign of the forward policy's")
    fix = ("write the residual as log Z + sum log P_F - log R - sum log P_B (forward policy "
           "and log Z on one side, log reward and backward policy on the other)")

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, kind, against in misaligned_balances(tree):
                yield self.finding(
                    f"`{text}` adds {_SHOWN[kind]} with the sign of {_SHOWN[against]}: a balance "
                    f"holds log Z + sum log P_F on one side and log R + sum log P_B on the "
                    f"other, so this loss settles at another fixed point: log Z drifts and "
                    f"the sampler stops drawing objects in proportion to their reward",
                    Location(path, line),
                    evidence={"term": kind, "against": against},
                    fix=(f"flip the sign of {_SHOWN[kind]} in this residual: log Z + sum log P_F "
                         f"- log R - sum log P_B"))
