from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk


class LogDetSignReversed(Rule):
    """
    ## What it does
    Finds a loss that holds a log-scale `s` the model computes twice, linearly (a normalising
    flow's log-det `s.sum(1)`, a Gaussian NLL's `0.5 * logvar`) and through `exp(±s)` below a
    product or a square (the affine coupling's `x * exp(s)`, the precision `exp(-logvar)`),
    with signs that pull `s` the same way: a flow's NLL written `-(log_prob(z) - logdet)`, a
    log-det of `exp(-s)` taken as `+s.sum()`, a Gaussian NLL with its log-variance term
    negated. The loss's linear top (sums, means, views, negations, constant factors) is walked
    at the first backwards for the sign of each value it holds; each `exp` of the graph is
    followed to its argument (through negations, views and constant factors), and each
    `log(S)` held linearly to the products and quotients `S` scales, and to a positive power
    of `S` the linear top also holds: a Gaussian KL `log(sigma) + (sigma**2 + mu**2) / 2`
    whose log term should have a minus (Bayes-by-backprop, a hand-written variational
    posterior), pointed at the one statement that takes both the log and the square. Else it
    points at the loss's assignment, or at the one line above it that computes the loss's exp
    term, or,
    when the loss adds its log-det the right way (`-(log_prob(z) + log_det)`, on its own line or
    in a function it calls: `return log_pz + log_det`), at the script's one statement that sums
    the log-det with a minus (`log_det = log_det - ld`).

    ## Why is this bad?
    `a * s + b * exp(c * s)` with `b > 0` (the data's squared distance scaled by the model)
    is bounded below only when `a` and `c` have opposite signs: the log-det pays for every
    contraction the scale makes. With the signs alike, shrinking the scale lowers both terms:
    the optimizer drives `s` to minus infinity (or to its bound after a tanh), the flow
    collapses every sample onto the prior's mode, the variance head predicts zero noise, and
    the printed NLL goes down without end.

    ## Example
    ```python
    z, logdet = flow(x)                   # z = x * exp(s) + t, logdet = s.sum(1)
    loss = -(prior.log_prob(z).sum(1) - logdet).mean()
    ```

    ## Use instead
    ```python
    loss = -(prior.log_prob(z).sum(1) + logdet).mean()   # log p(x) = log p(z) + log|det J|
    ```

    ## Stays silent on
    The flow's NLL with the log-det added (either direction of the flow: `x * exp(s)` with
    `+s.sum()`, `x * exp(-s)` with `-s.sum()`), a Gaussian NLL `0.5 * logvar + 0.5 * (y - mu)**2
    * exp(-logvar)` (or `/ logvar.exp()`, `/ (2 * logvar.exp())`: a division by `exp(s)` is
    a factor `exp(-s)`), a Laplace NLL `log_b + |y - mu| * exp(-log_b)`, uncertainty-weighted
    multi-task losses `exp(-s) * L + s`, the VAE's KL term (`exp(logvar) - logvar`), a KL term
    with the exp negated (loss-unbounded-below's), the Gaussian KL of a `sigma` with
    `-log(sigma)`, a Gaussian NLL `log(sigma) + (y - mu)**2 / (2 * sigma**2)` (the square
    divides, it is not held linearly). Also judged: a scale `S` (Glow's
    `sigmoid(h)`, a `softplus` sigma) whose `log(S)` the linear top holds while `S` multiplies
    or divides another computed tensor. Not judged: log-scales whose exp sits behind a product
    of two computed tensors along the linear path, or that are computed twice (two nodes).
    """

    code = "GD271"
    slug = "log-det-sign-reversed"
    severity = Severity.WARNING
    summary = ("the loss rewards shrinking a learned scale twice: its log-scale (a flow's log-det, "
               "a Gaussian's log-variance) enters with the sign of its exp, so the loss has no lower "
               "bound")
    fix = ("give the log-scale term the opposite sign of its exp: a flow's NLL is "
           "-(log_prob(z) + logdet), a Gaussian NLL is 0.5 * logvar + 0.5 * (y - mu)**2 * exp(-logvar)")

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("log_scale_reversed"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids:
                continue
            if e.get("power"):
                yield self._log_beside_power(a, e, pids)
                continue
            loc, text = e.loc, None
            if loc is not None:
                assigned = a.source.loss_assignment(loc.path, loc.line)
                if assigned is not None:
                    loc, text = Location(loc.path, assigned[0]), assigned[1]
                    line = a.source.term_line(loc.path, loc.line, "exp")
                    if line is not None:  # the one line above that computes the loss's exp term
                        loc, text = Location(loc.path, line[0]), line[1]
                    else:
                        found = _log_det_subtracted(a, loc, text)
                        if found is not None:  # `log_px = log_pz - log_det`, then `loss = -log_px.mean()`
                            loc, text = Location(loc.path, found[0]), found[1]
                        else:
                            found = _log_det_accumulated_negatively(a, loc, text)
                            if found is not None:  # the loss adds the log-det the flow sums with -
                                loc, text = Location(loc.path, found[0]), found[1]
            said = f"`{text}`" if text else "the loss"
            linear = "+s" if e["linear"] > 0 else "-s"
            exp = "exp(s)" if e["exp"] > 0 else "exp(-s)"
            bound = (" (s comes out of a bounded op here, so it saturates at its bound instead of "
                     "diverging: the flow learns nothing)" if e.get("bounded") else "")
            yield self.finding(
                f"the loss backpropagated through {said} holds a log-scale s that "
                f"{a.names(pids)} compute both as a term {linear} (a log-det, a log-variance) "
                f"and through {exp} scaling the data: the two pull s the same way, so shrinking "
                f"the scale lowers the loss without end{bound}. The log-det of z = x * {exp} is "
                f"{'+' if e['exp'] > 0 else '-'}sum(s), and it is added to the log-likelihood "
                f"that the loss negates",
                loc, step=a.next_step_number(e.seq),
                evidence={"linear": e["linear"], "exp": e["exp"], "op": e.get("op"),
                          "bounded": e.get("bounded"), "params": pids[:16]})


    def _log_beside_power(self, a, e, pids):
        """The finding for a scale S whose log and positive power the loss holds with one sign
        (a Gaussian KL's log term flipped): at the one statement of the script that takes both
        the log and a power of one name, else at the loss's assignment."""
        loc, said = e.loc, "the loss"
        if loc is not None:
            assigned = a.source.loss_assignment(loc.path, loc.line)
            if assigned is not None:
                loc, said = Location(loc.path, assigned[0]), f"`{assigned[1]}`"
            found = _log_and_power_statement(a, e.loc.path)
            if found is not None:
                loc = Location(e.loc.path, found[0])
        scale = found[1] if e.loc is not None and found is not None else "S"
        sign = "+" if e["linear"] > 0 else "-"
        return self.finding(
            f"the loss backpropagated through {said} holds {sign}log({scale}) of a scale made from "
            f"{a.names(pids)}, and {scale} ** 2 with the same sign: both terms fall as "
            f"{scale} shrinks, log({scale}) without end, so the optimizer drives {scale} to 0. A "
            f"Gaussian KL(N(mu, {scale}) || N(0, s0)) is log(s0 / {scale}) + ({scale}**2 + mu**2) / "
            f"(2 * s0**2) - 1/2: its log({scale}) enters with a minus",
            loc, step=a.next_step_number(e.seq),
            fix=(f"give log({scale}) the opposite sign of {scale} ** 2: "
                 f"log(s0) - log({scale}) + ({scale}**2 + mu**2) / (2 * s0**2) - 0.5"),
            evidence={"linear": e["linear"], "power": e["exp"], "op": e.get("op"), "params": pids[:16]})


def _log_and_power_statement(a, path):
    """``(line of the log, name)`` of the one statement of the script that takes both the log
    (``x.log()``, ``torch.log(x)``) and a power (``x ** 2``, ``x.pow(2)``) of one name, else None."""
    tree = a.source.tree(path)
    if tree is None:
        return None
    found = []
    for stmt in walk(tree):
        if not isinstance(stmt, (ast.Assign, ast.AugAssign, ast.Return, ast.AnnAssign)) or stmt.value is None:
            continue
        logs, powers = {}, set()
        for n in walk(stmt.value):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "log":
                arg = n.func.value if not n.args else n.args[0]  # x.log() / torch.log(x)
                if isinstance(arg, ast.Name):
                    logs.setdefault(arg.id, n.lineno)
            elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) and isinstance(n.left, ast.Name):
                powers.add(n.left.id)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "pow" \
                    and isinstance(n.func.value, ast.Name):
                powers.add(n.func.value.id)  # x.pow(2)
        found.extend((line, name) for name, line in logs.items() if name in powers)
    return found[0] if len(found) == 1 else None


_LOG_DET = re.compile(r"-\s*\(?\s*(?:\w+\.)*\w*(?:log_?det|log_?abs_?det|ldj|log_?jac)\w*", re.IGNORECASE)


def _log_det_subtracted(a, loc, text):
    """``(line, text)`` of the assignment of a variable the loss's line reads (``log_px`` in
    ``loss = -log_px.mean()``) that subtracts a log-det (``log_pz - log_det``), when the loss's
    line subtracts none itself; else None."""
    if not text or _LOG_DET.search(text):
        return None
    for name in dict.fromkeys(re.findall(r"\b([A-Za-z_]\w*)\b", text.split("=", 1)[-1])):
        origin = a.source.value_origin(loc.path, loc.line, name)
        if origin is not None and origin[0] != loc.line and _LOG_DET.search(origin[1]):
            return origin
    return None


_ADDED = re.compile(r"\+\s*(?:\w+\.)*(\w*(?:log_?det|log_?abs_?det|ldj|log_?jac)\w*)", re.IGNORECASE)


def _log_det_accumulated_negatively(a, loc, text):
    """``(line, text)`` of the one statement of the script that sums a log-det into itself with
    a minus (``log_det = log_det - ld``, ``log_det -= s.sum(1)``), when the loss's line adds a
    log-det the right way (``-(log_prob(z) + log_det)``): the sign error is in the flow's sum;
    else None."""
    if not text or _LOG_DET.search(text):
        return None
    tree = a.source.tree(loc.path)
    if tree is None:
        return None
    if not _ADDED.search(text) and not _adds_log_det(tree):
        return None
    found = []
    for node in walk(tree):
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Sub) \
                and isinstance(node.target, ast.Name) and _ADDED.search("+" + node.target.id):
            found.append(node)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Sub) \
                and isinstance(node.value.left, ast.Name) and node.value.left.id == node.targets[0].id \
                and _ADDED.search("+" + node.targets[0].id):
            found.append(node)
    if len(found) != 1:
        return None
    line = found[0].lineno
    return line, a.source.line_text(loc.path, line).split("  #")[0].strip()


def _log_det_word(node) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name is not None and bool(_ADDED.search("+" + name))


def _adds_log_det(tree) -> bool:
    """Whether the script adds a log-det to something else (``return log_pz + log_det`` in the
    flow's ``log_prob``, which the loss's line calls) outside a sum of the log-det into itself."""
    for node in walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
                node.target if isinstance(node, ast.AugAssign) else None
            value = node.value
            if isinstance(target, ast.Name) and isinstance(value, ast.BinOp) \
                    and isinstance(value.left, ast.Name) and value.left.id == target.id:
                continue  # `log_det = log_det + ld`: the accumulation itself
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) \
                and (_log_det_word(node.left) or _log_det_word(node.right)):
            return True
    return False
