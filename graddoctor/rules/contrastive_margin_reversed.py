from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk


def _last_name(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _complement(node: ast.AST) -> ast.AST | None:
    """``X`` of ``1 - X`` (``1.0 - X``), else None."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) \
            and isinstance(node.left, ast.Constant) and node.left.value in (1, 1.0):
        return node.right
    return None


def _factors(node: ast.AST) -> list[ast.AST]:
    """The operands of a product chain ``a * b * c``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left) + _factors(node.right)
    return [node]


def _hinge(node: ast.AST) -> ast.BinOp | None:
    """The ``a - b`` inside ``relu(a - b)``, ``clamp(a - b, min=0)``, ``clamp_min(a - b, 0)``
    (through ``.pow(2)`` and ``** 2``), else None."""
    while True:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            node = node.left
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("pow", "square"):
            node = node.func.value
        else:
            break
    if isinstance(node, ast.Call) and _last_name(node) in ("relu", "clamp", "clamp_min", "hinge") \
            and node.args and isinstance(node.args[0], ast.BinOp) and isinstance(node.args[0].op, ast.Sub):
        if _last_name(node) == "clamp" and not any(k.arg == "min" for k in node.keywords) \
                and len(node.args) < 2:
            return None
        return node.args[0]
    return None


def _terms(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _terms(node.left) + _terms(node.right)
    return [node]


def _statements(body: list) -> list[ast.stmt]:
    """A scope's statements in source order, the bodies of its loops, branches and ``with``
    blocks included (not those of nested functions or classes: scopes of their own)."""
    out = []
    for stmt in body:
        out.append(stmt)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            out.extend(_statements(getattr(stmt, field, None) or []))
        for handler in getattr(stmt, "handlers", None) or []:
            out.extend(_statements(handler.body))
    return out


def _scopes(tree: ast.AST) -> list[list]:
    """The module's body and each function's, as lists of statements."""
    scopes = [tree.body] if isinstance(tree, ast.Module) else []
    scopes.extend(node.body for node in walk(tree)
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return scopes


def _reversed_sum(node: ast.BinOp, bound: dict) -> tuple[int, str, str] | None:
    """``(line, the hinged term, the distance)`` when the sum ``node`` is a contrastive loss
    with its dissimilar pairs hinged on ``d - margin`` (see ``reversed_margins``); a term that is
    a name bound in the scope (``pos + neg``) is read as the value bound to it, its line the
    binding's."""
    parts = []
    for term in _terms(node):
        line = node.lineno
        if isinstance(term, ast.Name) and term.id in bound:
            line, term = bound[term.id]
        factors = _factors(term)
        hinge = next((h for f in factors if (h := _hinge(f)) is not None), None)
        rest = [f for f in factors if _hinge(f) is None]
        parts.append((term, hinge, rest, line))
    if len(parts) != 2:
        return None
    plain = [p for p in parts if p[1] is None]
    hinged = [p for p in parts if p[1] is not None]
    if len(plain) != 1 or len(hinged) != 1:
        return None
    (_, _, plain_rest, _), (term, hinge, hinged_rest, line) = plain[0], hinged[0]
    texts = {ast.unparse(f) for f in plain_rest}
    complementary = any(
        (c := _complement(f)) is not None and ast.unparse(c) in texts for f in hinged_rest) or any(
        (c := _complement(f)) is not None and ast.unparse(c) in {ast.unparse(g) for g in hinged_rest}
        for f in plain_rest)
    if not complementary:
        return None
    distance = ast.unparse(hinge.left)
    # the plain term pulls the same distance (d, d ** 2, d.pow(2)): the similar pairs
    if not any(ast.unparse(n) == distance for f in plain_rest for n in walk(f)):
        return None
    return line, ast.unparse(term), distance


def reversed_margins(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, the hinged term, the distance)`` of each contrastive sum ``X * d ** 2 + (1 - X)
    * relu(d - margin) ** 2`` (either indicator first), written in one expression or as two
    names bound before the sum in its scope (``pos = ...; neg = ...; (pos + neg).mean()``): the
    pairs whose distance is pulled without a margin are the similar ones, so the other pairs,
    the dissimilar ones, are the ones hinged, and a hinge on ``d - margin`` pulls them together
    once they are farther apart than the margin."""
    found: dict = {}
    for body in _scopes(tree):
        bound: dict = {}  # name -> (line, value) of its last binding so far
        for stmt in _statements(body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for field in ("value", "test", "iter"):
                expr = getattr(stmt, field, None)
                if not isinstance(expr, ast.AST):
                    continue
                for node in walk(expr):
                    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
                        hit = _reversed_sum(node, bound)
                        if hit is not None:
                            found.setdefault(hit[0], hit)
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                    and isinstance(stmt.targets[0], ast.Name):
                bound[stmt.targets[0].id] = (stmt.lineno, stmt.value)
            elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) and isinstance(stmt.target, ast.Name):
                bound.pop(stmt.target.id, None)
    return [found[line] for line in sorted(found)]


class ContrastiveMarginReversed(Rule):
    """
    ## What it does
    Finds a pairwise loss whose two sides are turned around. A contrastive (Siamese) loss
    `same * d ** 2 + (1 - same) * relu(d - margin) ** 2`: the similar pairs are the ones whose
    distance the loss pulls in without a margin; the other indicator marks the dissimilar pairs,
    and their hinge on `d - margin` pulls them together once they are farther apart than the
    margin, where `relu(margin - d)` pushes them out to it. A preference loss (Bradley-Terry,
    DPO, IPO, a margin ranking hinge) minimised with the rejected side where the chosen one
    belongs: `-logsigmoid(r_rejected - r_chosen)`, DPO's log-ratios written `rejected -
    chosen`, `relu(margin - r_loser + r_winner)`. And an RLHF reward that adds its KL penalty
    (`reward + beta * kl`, `-beta * (ref_logp - logp)`) where it is meant to subtract it. It
    reads the source of the files a backward ran from: the sides by their names (chosen /
    rejected, winner / loser, good / bad) through the names bound before the loss in its scope,
    the reference model's terms left out; the loss as a name with `loss` in it, a loss-named
    function's return, or a backpropagated expression. A preference loss the file defines as a
    function (its parameters naming the two sides, `dpo_loss(pi_chosen, pi_rejected, ...)`, its
    body a `logsigmoid`/`softplus`/hinge) called with arguments that name the other side at two
    parameters or more and the same side at none (`dpo_loss(logp(policy, rejected),
    logp(policy, chosen), ...)`, positionally or by keyword) is reported at the call.

    ## Why is this bad?
    Both kinds of contrastive pairs are pulled together: nothing ever pushes two classes apart,
    and the embedding collapses toward a point (the loss falls all the same). At initialisation
    most dissimilar pairs are closer than the margin, so the hinge is 0 and the gradient shows
    nothing wrong in the first steps. A reversed preference loss falls just as a right one does
    while the model learns to prefer the rejected answers (a reward model's pairwise accuracy
    goes to 0); a KL penalty added to the reward pays the policy for leaving the reference model.

    ## Example
    ```python
    d = F.pairwise_distance(z1, z2)
    loss = (same * d.pow(2) + (1 - same) * F.relu(d - margin).pow(2)).mean()
    loss = -F.logsigmoid(r_rejected - r_chosen).mean()
    rewards = score + kl_coef * (logp - ref_logp)
    ```

    ## Use instead
    ```python
    loss = (same * d.pow(2) + (1 - same) * F.relu(margin - d).pow(2)).mean()
    loss = -F.logsigmoid(r_chosen - r_rejected).mean()
    rewards = score - kl_coef * (logp - ref_logp)
    ```

    The two terms may be written in one expression or bound to names first (`pos = ...`,
    `neg = ...`, `(pos + neg).mean()`); the finding then points at the hinged term's binding
    (for a preference loss, at the first expression that writes the two sides against each
    other: DPO's `pi_logratios = ...`).

    ## Stays silent on
    `relu(margin - d)` on the dissimilar pairs; a double-margin loss whose similar pairs are
    hinged on `d - m_pos` and dissimilar ones on `m_neg - d` (both terms hinged); a sum whose two
    indicators are not one and one minus the other. `-logsigmoid(chosen - rejected)`,
    `softplus(rejected - chosen)`, `logsigmoid(rejected - chosen)` minimised, DPO's and IPO's
    right orientation with the reference log-ratio subtracted; pos / neg names (a triplet loss
    lowers its positive's distance: the same names mean the other direction); a KL penalty
    subtracted from a reward, or added to a loss; DPO's implicit rewards
    (`beta * (chosen_logps - ref_chosen_logps)`); a preference loss called in its parameters'
    order or by keyword, a helper whose parameters name no side (`margin_loss(a, b)`), a call
    swapped at some parameters and not at others. Not seen: a reference model's terms named
    without `ref` (`rp`), whose log-ratios then hold each side with both signs.
    """

    code = "GD335"
    slug = "contrastive-margin-reversed"
    severity = Severity.WARNING
    summary = ("a pairwise loss turned around: a contrastive loss hinging the dissimilar pairs on "
               "d - margin, a preference loss raising the rejected side, a KL penalty added to a "
               "reward; the loss falls while the pairs are learned backwards")
    fix = "hinge the dissimilar pairs on margin - d: `(1 - same) * F.relu(margin - d) ** 2`"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, term, side in reversed_preferences(tree):
                if side == "kl":
                    yield self.finding(
                        f"`{term}` adds the KL penalty to the reward: the policy is rewarded for "
                        f"moving away from the reference model, so the KL grows instead of being "
                        f"held down, and the policy drifts into text the reward model was never "
                        f"trained on (reward hacking)",
                        Location(path, line), evidence={"term": term, "pair": "kl"},
                        fix="subtract the penalty from the reward: `reward - kl_coef * (logp - "
                            "ref_logp)`")
                    continue
                other = {"chosen": "rejected", "winner": "loser", "good": "bad"}[side]
                yield self.finding(
                    f"`{term}` is minimised with the {other} side in the place of the {side}: "
                    f"gradient descent raises the {other} responses' score (or log-ratio) "
                    f"above the {side} ones', the preference learned backwards. The loss "
                    f"falls as it should, and the pairwise accuracy heads to 0",
                    Location(path, line), evidence={"term": term, "pair": f"{side}/{other}"},
                    fix=f"put the {side} side first: `-F.logsigmoid({side} - {other})` "
                        f"(or `F.softplus({other} - {side})`)")
            for line, call, function, side in swapped_preference_calls(tree):
                other = {"chosen": "rejected", "winner": "loser", "good": "bad"}[side]
                yield self.finding(
                    f"`{call}` passes the {other} side where `{function}`'s parameters take the "
                    f"{side} one and the {side} side where they take the {other}: the loss "
                    f"`{function}` computes raises the {other} responses' score (or log-ratio) "
                    f"above the {side} ones', the preference learned backwards while the loss "
                    f"falls as it should",
                    Location(path, line), evidence={"term": call, "pair": f"{side}/{other}",
                                                    "function": function},
                    fix=f"pass the arguments in the order `{function}` names its parameters "
                        f"(the {side} side where it takes the {side} one), or by keyword")
            for line, term, distance in reversed_margins(tree):
                yield self.finding(
                    f"`{term}` hinges the dissimilar pairs on `{distance}` minus the margin: the "
                    f"other term pulls the similar pairs' `{distance}` in with no margin, and "
                    f"this one pulls the dissimilar pairs together as soon as they are farther "
                    f"apart than the margin. Nothing pushes them apart, so the embedding "
                    f"collapses",
                    Location(path, line), evidence={"term": term, "distance": distance},
                    fix=f"turn the hinge around: the margin minus `{distance}` "
                        f"(`F.relu(margin - {distance})`)")


# -- preference pairs: the preferred side raised, the other lowered ---------------------------
# each pair of words: (the side a pairwise loss must raise, the side it must lower); not pos/neg,
# which name distances as often as scores (a triplet loss lowers its positive's distance)
_PAIRS = (({"chosen", "preferred", "accepted", "pref"}, {"rejected", "dispreferred", "rej"}),
          ({"winner", "winning", "win", "w", "yw"}, {"loser", "losing", "lose", "lost", "l", "yl"}),
          ({"good", "better"}, {"bad", "worse"}))
_SHOWN = ("chosen", "winner", "good")  # each pair's raised side, as messages name it
_REFERENCE = {"ref", "reference"}
_COEFFICIENT = {"coef", "coeff", "ctl", "beta", "weight", "scale", "alpha", "lambda", "lam", "target"}
_LOGP = {"logp", "logps", "logprob", "logprobs", "log_prob", "log_probs", "lp", "logpi"}
_INCREASING = ("logsigmoid", "softplus", "relu", "clamp", "clamp_min")
_KEEPS = ("mean", "sum", "nanmean", "nansum", "squeeze", "unsqueeze", "view", "reshape", "flatten",
          "float", "double", "to", "clone", "contiguous", "masked_fill", "exp", "log1p")


def _words(node: ast.AST) -> list[str]:
    """The lower-cased words of the names, attributes and string keys under ``node``
    (``batch["chosen_ids"]``, ``r_chosen``, ``policyChosenLogps``)."""
    import re
    words = []
    for n in walk(node):
        text = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else \
            n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) else None
        if text:
            text = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text).lower()
            whole = [w for w in re.split(r"[^a-z0-9]+", text) if w]
            # a single letter counts only inside a longer name (`r_w`, `logp_l`), never alone
            words.extend(w for w in whole if len(w) > 1 or len(whole) > 1)
    return words


def _side(node: ast.AST) -> tuple[int, int] | None:
    """``(pair, 0 raised / 1 lowered)`` of the one preference side a leaf names, else None."""
    words = set(_words(node))
    found = {(i, s) for i, pair in enumerate(_PAIRS) for s in (0, 1) if pair[s] & words}
    return found.pop() if len(found) == 1 else None


def _signed_leaves(node: ast.AST, bound: dict, depth: int = 0, sign: int = 1) -> list | None:
    """``[(sign, leaf, line)]`` of a linear expression (sums, differences, negations, positive
    or negative constant factors, factors naming no preference side), names bound in the scope
    read through their binding (4 deep); None for what is not linear in its leaves."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _signed_leaves(node.operand, bound, depth, -sign)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        left = _signed_leaves(node.left, bound, depth, sign)
        right = _signed_leaves(node.right, bound, depth, -sign if isinstance(node.op, ast.Sub) else sign)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
        sides = [node.left, node.right] if isinstance(node.op, ast.Mult) else [node.left]
        carrying = [s for s in sides if _any_side(s, bound, depth)]
        if len(carrying) != 1:
            return None if carrying else [(sign, node, getattr(node, "lineno", 0))]
        other = node.right if carrying[0] is node.left else node.left
        if isinstance(other, ast.UnaryOp) and isinstance(other.op, ast.USub):
            sign = -sign
        elif isinstance(other, ast.Constant) and isinstance(other.value, (int, float)) and other.value < 0:
            sign = -sign
        return _signed_leaves(carrying[0], bound, depth, sign)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("squeeze", "unsqueeze", "float", "sum", "mean", "view", "reshape") \
            and _any_side(node.func.value, bound, depth):
        return _signed_leaves(node.func.value, bound, depth, sign)
    if isinstance(node, ast.Name) and node.id in bound and depth < 4:
        line, value = bound[node.id]
        inner = _signed_leaves(value, bound, depth + 1, sign)
        if inner and any(_side(leaf) is not None for _, leaf, _ in inner):
            return inner
    return [(sign, node, getattr(node, "lineno", 0))]


def _any_side(node: ast.AST, bound: dict, depth: int) -> bool:
    """Whether ``node`` names a preference side, itself or through the names bound to it."""
    words = set(_words(node))
    if any(pair[0] & words or pair[1] & words for pair in _PAIRS):
        return True
    names = [n.id for n in walk(node) if isinstance(n, ast.Name)]
    return depth < 4 and any(name in bound and _any_side(bound[name][1], bound, depth + 1)
                             for name in names)


def _orientation(leaves: list) -> tuple[int, int] | None:
    """``(+1 raised side minus lowered side / -1 the other way, pair)`` of leaves that name one
    pair's two sides, each with one sign and opposite signs (the reference model's leaves left
    out: a DPO log-ratio subtracts them), else None."""
    signs: dict = {}
    for sign, leaf, _ in leaves:
        if _REFERENCE & set(_words(leaf)):
            continue
        side = _side(leaf)
        if side is not None:
            signs.setdefault(side, set()).add(sign)
    pairs = {pair for pair, _ in signs}
    if len(pairs) != 1:
        return None
    pair = pairs.pop()
    up, down = signs.get((pair, 0)), signs.get((pair, 1))
    if up is None or down is None or len(up) != 1 or len(down) != 1 or up == down:
        return None
    return (1 if up == {1} else -1), pair


def _outer_sign(root: ast.AST, target: ast.AST) -> int | None:
    """The sign ``target`` enters ``root`` with: +1, -1, or None when an op between them is not
    a sum, difference, negation, constant factor, mean or sum."""
    parents = {}
    for n in walk(root):
        for child in ast.iter_child_nodes(n):
            parents[child] = n
    sign, node = 1, target
    while node is not root:
        parent = parents.get(node)
        if parent is None:
            return None
        if isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.USub):
            sign = -sign
        elif isinstance(parent, ast.BinOp) and isinstance(parent.op, (ast.Add, ast.Sub)):
            if isinstance(parent.op, ast.Sub) and node is parent.right:
                sign = -sign
        elif isinstance(parent, ast.BinOp) and isinstance(parent.op, (ast.Mult, ast.Div)):
            other = parent.right if node is parent.left else parent.left
            if isinstance(parent.op, ast.Div) and node is parent.right:
                return None
            if isinstance(other, ast.UnaryOp) and isinstance(other.op, ast.USub):
                sign = -sign
            elif isinstance(other, ast.Constant) and isinstance(other.value, (int, float)) and other.value < 0:
                sign = -sign
        elif isinstance(parent, ast.Attribute) and parent.attr in _KEEPS:
            node = parents.get(parent)
            if not isinstance(node, ast.Call) or node.func is not parent:
                return None
            continue
        elif isinstance(parent, ast.Call) and _last_name(parent) in _KEEPS and node in parent.args[:1]:
            pass
        elif isinstance(parent, ast.Subscript) and node is parent.value:
            pass
        else:
            return None
        node = parent
    return sign


def _judged(call: ast.AST) -> ast.AST | None:
    """The argument of an increasing pairwise loss: ``logsigmoid(x)``, ``softplus(x)``,
    ``log(sigmoid(x))``, ``sigmoid(x).log()``, a hinge ``relu(x)``, ``clamp(x, min=0)``."""
    if not isinstance(call, ast.Call):
        return None
    name = _last_name(call)
    if name == "log":
        inner = call.args[0] if call.args else call.func.value if isinstance(call.func, ast.Attribute) else None
        if isinstance(inner, ast.Call) and _last_name(inner) == "sigmoid":
            return _judged_arg(inner)
        return None
    if name not in _INCREASING:
        return None
    if name == "clamp" and not any(k.arg == "min" for k in call.keywords) and len(call.args) < 2:
        return None
    return _judged_arg(call)


def _judged_arg(call: ast.Call) -> ast.AST | None:
    if call.args:
        return call.args[0]
    if isinstance(call.func, ast.Attribute) and not isinstance(call.func.value, ast.Name) \
            or isinstance(call.func, ast.Attribute) and call.func.value.id not in ("F", "torch", "nn", "functional"):
        return call.func.value
    return None


def _is_loss(stmt: ast.stmt, function: str) -> bool:
    """A statement whose value is minimised: assigned to a loss-named name, returned by a
    loss-named function, or backpropagated."""
    if isinstance(stmt, ast.Return):
        return "loss" in function.lower()
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] \
        if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) else []
    if any("loss" in " ".join(_words(t)) for t in targets):
        return True
    return isinstance(stmt, ast.Expr) and any(
        isinstance(n, ast.Attribute) and n.attr == "backward" for n in walk(stmt.value))


def _where(node: ast.AST, bound: dict, line: int, depth: int = 0) -> int:
    """The line that writes the two sides against each other: the first expression (from the
    loss's statement down, through the names bound before it) whose own leaves name both
    sides of the pair, the reference model's left out; the loss's line when none does."""
    leaves = _signed_leaves(node, {})
    if leaves and _orientation(leaves) is not None:
        return line
    if depth < 4:
        for name in dict.fromkeys(n.id for n in walk(node) if isinstance(n, ast.Name)):
            if name in bound and not (_REFERENCE & set(_words(ast.Name(id=name)))) \
                    and _any_side(bound[name][1], bound, depth + 1):
                found = _where(bound[name][1], bound, bound[name][0], depth + 1)
                if found is not None:
                    return found
    return line if depth == 0 else None


def reversed_preferences(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, what, how)`` of each pairwise preference loss that raises the dispreferred side:
    a minimised ``-logsigmoid(x)`` (``-log(sigmoid(x))``), ``softplus(-x)``, a hinge
    ``relu(m - x)``, or an IPO square ``(x - c) ** 2`` whose ``x`` is the preferred side minus
    the other (by the names: chosen/rejected, winner/loser, good/bad; through the
    names bound before it in its scope, the reference model's terms left out) written the other
    way round; and a reward (a name with `reward` in it) that adds a KL penalty (a `kl` name,
    or the policy's log-probs minus the reference's) instead of subtracting it."""
    found: dict = {}
    scopes = [("", tree.body)] if isinstance(tree, ast.Module) else []
    scopes += [(node.name, node.body) for node in walk(tree)
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for function, body in scopes:
        bound: dict = {}
        for stmt in _statements(body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            value = getattr(stmt, "value", None)
            if isinstance(value, ast.AST) and _is_loss(stmt, function):
                for node in walk(value):
                    arg = _judged(node)
                    pushed = None  # the sign of arg that minimising the loss raises
                    if arg is not None:
                        outer = _outer_sign(value, node)
                        pushed = -outer if outer is not None else None
                    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) \
                            and isinstance(node.right, ast.Constant) and node.right.value == 2 \
                            and isinstance(node.left, ast.BinOp) and isinstance(node.left.op, ast.Sub) \
                            and not _any_side(node.left.right, bound, 0):
                        arg = node.left.left  # IPO: (x - 1 / (2 * beta)) ** 2 pulls x up to c
                        pushed = 1 if _outer_sign(value, node) == 1 else None
                    if arg is None or pushed is None:
                        continue
                    leaves = _signed_leaves(arg, bound)
                    oriented = _orientation(leaves) if leaves else None
                    if oriented is None or oriented[0] == pushed:
                        continue
                    line = _where(arg, bound, stmt.lineno)
                    found.setdefault(line, (line, ast.unparse(node), _SHOWN[oriented[1]]))
            kl = _reward_kl(stmt, bound)
            if kl is not None:
                found.setdefault(stmt.lineno, (stmt.lineno, kl, "kl"))
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                    and isinstance(stmt.targets[0], ast.Name):
                bound[stmt.targets[0].id] = (stmt.lineno, stmt.value)
            elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) and isinstance(stmt.target, ast.Name):
                bound.pop(stmt.target.id, None)
    return [found[line] for line in sorted(found)]


def _reward_kl(stmt: ast.stmt, bound: dict) -> str | None:
    """The text of a KL penalty a reward adds: ``rewards = score + beta * kl``,
    ``rewards = -beta * (ref_logps - logps)``, ``reward += kl_coef * (logp - ref_logp)``."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target, value = stmt.targets[0], stmt.value
    elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, (ast.Add, ast.Sub)):
        target = stmt.target
        value = stmt.value if isinstance(stmt.op, ast.Add) else ast.UnaryOp(op=ast.USub(), operand=stmt.value)
    else:
        return None
    words = set(_words(target))
    if not any(w.startswith("reward") for w in words) or any(_side(n) for n in (target, value)) \
            or "loss" in " ".join(words):
        return None
    leaves = _kl_leaves(value, bound, 0, 1)
    if leaves is None:
        return None
    policy = {s for s, role in leaves if role == "policy"}
    reference = {s for s, role in leaves if role == "ref"}
    named = {s for s, role in leaves if role == "kl"}
    if named == {1} or (policy == {1} and reference == {-1}):
        return ast.unparse(stmt.value)
    return None


def _kl_leaves(node: ast.AST, bound: dict, depth: int, sign: int) -> list | None:
    """``[(sign, "kl" / "policy" / "ref" / None)]`` of a linear expression's leaves: a name of
    a KL, the policy's and the reference's log-probs; names without a KL's or log-probs' words
    read through their binding."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _kl_leaves(node.operand, bound, depth, -sign)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        left = _kl_leaves(node.left, bound, depth, sign)
        right = _kl_leaves(node.right, bound, depth, -sign if isinstance(node.op, ast.Sub) else sign)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        for carrying, other in ((node.left, node.right), (node.right, node.left)):
            if isinstance(other, ast.Constant) and isinstance(other.value, (int, float)):
                return _kl_leaves(carrying, bound, depth, sign if other.value >= 0 else -sign)
        roles = [_kl_leaves(s, bound, depth, 1) for s in (node.left, node.right)]
        if any(k is None for k in roles):
            return None
        carrying = [i for i, k in enumerate(roles) if any(role for _, role in k)]
        if len(carrying) != 1:
            return None if carrying else [(sign, None)]
        other = (node.left, node.right)[1 - carrying[0]]
        if isinstance(other, ast.UnaryOp) and isinstance(other.op, ast.USub):
            sign = -sign
        return [(sign * s, role) for s, role in roles[carrying[0]]]
    words = set(_words(node))
    if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)):
        if words & _COEFFICIENT:
            return [(sign, None)]  # the penalty's weight (`kl_coef`, `kl_ctl.value`)
        if "kl" in words:
            return [(sign, "kl")]
        if words & _LOGP or any(w in ("logprobs", "logits") for w in words):
            return [(sign, "ref" if words & _REFERENCE else "policy")]
        if isinstance(node, ast.Name) and node.id in bound and depth < 3:
            inner = _kl_leaves(bound[node.id][1], bound, depth + 1, sign)
            if inner is not None:
                return inner
    return [(sign, None)]


def _is_preference_loss(function: ast.AST) -> bool:
    """Whether a function's body holds an increasing pairwise loss (``logsigmoid``, ``softplus``,
    ``log(sigmoid(x))``, a hinge)."""
    return any(isinstance(node, ast.Call) and _judged(node) is not None
               for node in walk(function))


def swapped_preference_calls(tree: ast.AST) -> list[tuple[int, str, str, str]]:
    """``(line, call, function, the raised side)`` of each call of a preference loss the file
    defines (a function whose parameters name the two sides of one pair, ``pi_chosen``,
    ``pi_rejected``, and whose body holds a pairwise loss) given, at two parameters or more, an
    argument naming the other side of that pair (``dpo_loss(logp(policy, rejected),
    logp(policy, chosen), ...)``) and at none the same side."""
    functions: dict = {}
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = [a.arg for a in node.args.args]
            sides = {i: _side(ast.Name(id=name)) for i, name in enumerate(params)}
            sides = {i: side for i, side in sides.items() if side is not None}
            kinds = {side for side in sides.values()}
            if len({pair for pair, _ in kinds}) == 1 and len({s for _, s in kinds}) == 2 \
                    and _is_preference_loss(node):
                functions.setdefault(node.name, []).append((params, sides))
    found = []
    for node in walk(tree):
        if not isinstance(node, ast.Call) or _last_name(node.func) not in functions \
                or any(isinstance(a, ast.Starred) for a in node.args):
            continue
        for params, sides in functions[_last_name(node.func)]:
            offset = 1 if params and params[0] in ("self", "cls") \
                and isinstance(node.func, ast.Attribute) else 0
            given = {i + offset: arg for i, arg in enumerate(node.args)}
            given.update({params.index(k.arg): k.value for k in node.keywords
                          if k.arg in params})
            swapped = same = 0
            for i, side in sides.items():
                arg = given.get(i)
                have = _side(arg) if arg is not None else None
                if have is None or have[0] != side[0]:
                    continue
                if have[1] == side[1]:
                    same += 1
                else:
                    swapped += 1
            if swapped >= 2 and not same:
                pair = next(iter(sides.values()))[0]
                text = ast.unparse(node)
                found.append((node.lineno, text if len(text) <= 120 else text[:117] + "...",
                              _last_name(node.func), _SHOWN[pair]))
                break
    return found
