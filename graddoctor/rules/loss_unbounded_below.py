from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_TERM = {"exp": "-exp(v)", "square": "-v**2",
         "logsumexp": "x[a] - logsumexp(x): a log-softmax written out",
         "log_softmax": "log_softmax(x).gather(1, a)",
         "linear": "max(a * v, b * v) with a and b of one sign: a line in each direction of v"}


class LossUnboundedBelow(Rule):
    """
    ## What it does
    Finds a loss that holds a term `-c * exp(v)` or `-c * v**2` (c > 0) of a quantity `v` the
    model computes: the classic is a VAE's KL term with its sign flipped
    (`kld = 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())` added to the loss, or the
    right KL subtracted: `loss = recon - kld`). The loss's graph is walked from its root at the
    first backwards, through sums, means, views, negations and products by constants, so the
    sign of each exp or square term is known. It points at the loss's assignment (at the term's
    line when the script has one line that computes such a term). Also a term
    `max(a * v, b * v)` whose factors `a`, `b` (no gradient) have one sign: a pinball (quantile)
    loss written `torch.max(q * e, (1 - q) * e)` instead of `torch.max(q * e, (q - 1) * e)`.
    Also a squared error multiplied by a weight tensor with an entry of the other sign (a
    latitude weight `torch.cos(lat)` of degrees instead of radians, a label-sign mask `2 * y - 1`
    on a squared distance), pointed at the weight's first assignment.
    Also a log-softmax minimised: `x.gather(1, a) - torch.logsumexp(x, 1)` (or `x[i, a]`) with a
    positive sign, the two of one computed `x` (CQL's conservative term or a cross-entropy
    written out, subtracted the wrong way round), or `log_softmax(x).gather(1, a)` with a
    positive sign that the loss reads nowhere else (a log-likelihood missing its minus).

    ## Why is this bad?
    `-exp(v)` and `-v**2` go to minus infinity as `v` grows: the loss has no lower bound, and
    the optimizer lowers it by sending `v` (a log-variance, a mean) to infinity instead of
    fitting the data. The printed loss goes down nicely, then turns into `inf`/`nan`. For a VAE
    the KL divergence is `0.5 * sum(mu**2 + exp(logvar) - 1 - logvar)`, which is never negative.
    A max of two multiples of one sign is a line both ways, not a V: every quantile head runs
    off toward one side.

    ## Example
    ```python
    kld = 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    loss = recon + kld
    ```

    ## Use instead
    ```python
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    loss = recon + kld
    ```

    ## Stays silent on
    The KL term with its minus sign; exp and squares with a positive sign (an exponential
    rate, a squared error, a penalty), also weighted by a tensor with no negative entry (a
    latitude weight in radians, a 0/1 mask); terms of data or of detached tensors; exp or squares of
    bounded values (after a clamp, tanh, sigmoid, softmax or log-softmax); exp of a value never
    positive (an RBF kernel's `exp(-cdist(a, b)**2 / 2)` in an MMD); exp of an entropy written
    out, `-sum(p * log(p + eps))` (bounded above on the log's domain, whatever `p`: wav2vec 2.0's
    codebook perplexity in its diversity loss `(G*V - perplexity) / (G*V)`, also when the
    probabilities of unmasked steps are zeroed by `torch.where` first); terms inside a product
    of two computed tensors (a Gaussian likelihood's `(x - mu)**2 * exp(-logvar)`: their sign is
    not followed) or under a log (`logsumexp`, an InfoNCE bound); a variance written out, the
    square of a mean subtracted from the mean of the squares (the scale-invariant log loss of
    depth estimation, `(g ** 2).mean() - lam * g.mean() ** 2`, with no literal factor above 1);
    a pinball loss with factors of opposite signs (`torch.max(q * e, (q - 1) * e)`, or written
    with `torch.where`), a max with zero or with the value itself (a hinge, a leaky ReLU);
    `logsumexp(x) - x[a]` (CQL's term, a cross-entropy: never negative); the squares of a part of
    a tensor (its diagonal, a slice, some rows) subtracted from the squares of the whole it is
    taken from (VICReg's and Barlow Twins' off-diagonal term, `c.pow(2).sum() -
    c.diagonal().pow(2).sum()`: the rest's squares; the factors are not compared); a `logsumexp` with a
    minus sign and no entry of the same scores added back (IWAE's log-mean-exp, JEM's energy of
    data against a `logsumexp` of samples); a log-softmax picked by a constant column
    (`log_softmax(d)[:, 0]`, a two-class discriminator's); a gathered log-probability the loss
    also reads elsewhere (GRPO's k3 KL estimator `exp(ref - logp) - (ref - logp) - 1`).
    """

    code = "GD246"
    slug = "loss-unbounded-below"
    severity = Severity.WARNING
    summary = ("the loss holds a term -exp(v) or -v**2 of a model output: it has no lower "
               "bound, and the optimizer sends v to infinity (a VAE's KL with its sign flipped)")
    fix = "flip the sign of the term (a KL divergence is -0.5 * sum(1 + logvar - mu**2 - exp(logvar)))"

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("loss_unbounded"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            term = e.get("term")
            if not pids or term == "variance_added":  # bounded: variance-sign-flipped's
                continue
            loc, text = e.loc, None
            if term == "weighted_square":
                yield self._weighted(a, e, pids)
                continue
            if loc is not None:
                assigned = a.source.loss_assignment(loc.path, loc.line)
                if assigned is not None:
                    loc, text = Location(loc.path, assigned[0]), assigned[1]
                    line = a.source.term_line(loc.path, loc.line, term)
                    if line is not None:
                        loc, text = Location(loc.path, line[0]), line[1]
            if term != "exp" and text and _variance_form(text):
                continue  # E[g²] - λ·E[g]²: a variance (the scale-invariant log loss), bounded
            said = f"`{text}`" if text else "the loss"
            if term == "linear":
                yield self.finding(
                    f"the loss backpropagated here holds a max of two multiples of one value "
                    f"whose factors have the same sign (through {said}), of a value the model "
                    f"computes from {a.names(pids)}: that max is a line in each direction, not a V, "
                    f"so the loss has no lower bound and the optimizer sends the value to "
                    f"infinity (a pinball loss needs factors of opposite signs: q and q - 1)",
                    loc, step=a.next_step_number(e.seq),
                    evidence={"term": term, "op": e.get("op"), "params": pids[:16]},
                    fix=("give the two branches factors of opposite signs: the pinball loss of "
                         "quantile q is torch.max(q * err, (q - 1) * err) with err = target - pred"))
                continue
            if term in ("logsumexp", "log_softmax"):
                yield self.finding(
                    f"the loss backpropagated here holds a log-softmax with a positive sign "
                    f"({_TERM[term]}, through {said}), of scores the model computes from "
                    f"{a.names(pids)}: that is a log-likelihood, never above 0, so minimising it "
                    f"maximises the cross-entropy: the loss has no lower bound and the optimizer "
                    f"spreads the scores apart instead of fitting the data (CQL's regulariser is "
                    f"logsumexp(q) - q[a], never negative)",
                    loc, step=a.next_step_number(e.seq),
                    evidence={"term": term, "op": e.get("op"), "params": pids[:16]},
                    fix=("flip the sign of that term: the cross-entropy (and CQL's conservative "
                         "term) is logsumexp(x, dim=1) - x.gather(1, a), and a log-likelihood is "
                         "minimised as -log_softmax(x).gather(1, a)"))
                continue
            kind = "an exp" if term == "exp" else "a square"
            yield self.finding(
                f"the loss backpropagated here holds {kind} term with a negative sign "
                f"({_TERM.get(term, term)}, through {said}), of a value the model computes from "
                f"{a.names(pids)}: the loss has no lower bound, so the optimizer lowers it by "
                f"sending that value to infinity instead of fitting the data (a VAE's KL term "
                f"with its sign flipped does this: the KL divergence is never negative)",
                loc, step=a.next_step_number(e.seq),
                evidence={"term": term, "op": e.get("op"), "params": pids[:16]},
                fix=("flip the sign of that term: the KL divergence of a diagonal Gaussian from "
                     "N(0, 1) is -0.5 * sum(1 + logvar - mu**2 - exp(logvar)), and it is added "
                     "to the loss"))


    def _weighted(self, a, e, pids):
        """A squared error scaled by a weight tensor with entries of the other sign."""
        loc, said, name = e.loc, "the loss", None
        if loc is not None:
            origin = a.source.square_weight_origin(loc.path)
            if origin is not None:
                loc, said, name = Location(loc.path, origin[0]), f"`{origin[1]}`", origin[2]
            else:
                assigned = a.source.loss_assignment(loc.path, loc.line)
                if assigned is not None:
                    loc, said = Location(loc.path, assigned[0]), f"`{assigned[1]}`"
        weights = f"`{name}`" if name else "the weight tensor"
        return self.finding(
            f"the loss backpropagated here holds a squared error multiplied by a weight tensor "
            f"({weights}, made by {said}) with entries that make the term negative, of a value the "
            f"model computes from {a.names(pids)}: on those entries the loss falls as the error "
            f"grows, so it has no lower bound and the optimizer pushes the prediction away from "
            f"its target there instead of fitting it",
            loc, step=a.next_step_number(e.seq),
            evidence={"term": "weighted_square", "op": e.get("op"), "params": pids[:16]},
            fix=(f"make every entry of {weights} non-negative: check its sign and units (a cosine "
                 f"of degrees, a difference taken in the wrong order); a term meant to push values "
                 f"apart needs a bound (a hinge or a clamp)"))


def _mean_of(node):
    """The expression a mean is taken of: ``x.mean()``, ``torch.mean(x)``, or None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "mean":
        root = node.func.value
        if isinstance(root, ast.Name) and root.id in ("torch", "th"):
            return node.args[0] if node.args else None
        return root
    return None


def _squared(node):
    """The expression squared in ``x ** 2`` or ``x.pow(2)``, or None."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) \
            and isinstance(node.right, ast.Constant) and node.right.value == 2:
        return node.left
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "pow" \
            and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == 2:
        return node.func.value
    return None


def _variance_form(text: str) -> bool:
    """Whether ``text`` subtracts the square of a mean of ``g`` from the mean of ``g``'s
    squares (``(g ** 2).mean() - lam * g.mean() ** 2``): a variance, never below 0 for a factor
    of at most 1 (a literal factor above 1 is not exempt)."""
    try:
        tree = ast.parse(text.strip().removeprefix("return ").strip(), mode="exec")
    except SyntaxError:
        return False
    mean_of_squares, squares_of_mean = set(), set()
    big_factor = False
    for node in walk(tree):
        inner = _mean_of(node)
        if inner is not None and _squared(inner) is not None:
            mean_of_squares.add(ast.unparse(_squared(inner)))
        inner = _squared(node)
        if inner is not None and _mean_of(inner) is not None:
            squares_of_mean.add(ast.unparse(_mean_of(inner)))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) \
                and any(isinstance(side, ast.Constant) and isinstance(side.value, (int, float))
                        and side.value > 1 for side in (node.left, node.right)):
            big_factor = True
    return bool(mean_of_squares & squares_of_mean) and not big_factor
