from __future__ import annotations

import ast
import bisect
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule

_LOOK_AHEAD = 400  # events after a backward read for the steps and clears of its gradients


class LossTermTrainsNothing(Rule):
    """
    ## What it does
    Finds a term of a loss whose gradient no optimizer step ever applies, while the loss's other
    terms train the model: its graph was cut on the way to the parameters it is meant to train
    (`d(fake.detach())` in a GAN generator's step, `critic(s, actor(s).detach())` beside an
    actor's penalty, samples drawn under `torch.no_grad()`), so it reaches only another
    optimizer's parameters (the discriminator's, the critic's), and their gradients from this
    backward are cleared before any step applies them. Several terms can be cut to the same
    model (a vocoder's adversarial and feature-matching terms both on `D(wav.detach())`). At the first backwards of each line the
    loss's linear top (sums, differences, negations and constant factors) is split into its
    terms and the parameters each term reaches are noted; the gradient ledger says which of them
    a step applied. Reported when the same term reaches only cleared, unapplied gradients at two
    backwards of the line or more and is applied at none, at the statement that cuts the graph
    when the source shows one (`.detach()`, `.data`, `torch.no_grad()`; for a term written by
    hand, `((d_fake - 1) ** 2).mean()`, or a helper's call, `1e-3 * adversarial_loss(d_out)`,
    followed back through the assignments of the names it reads, such as
    `_, d_out, fmaps = msd(y, y_hat.detach())`), else at the term's assignment.

    ## Why is this bad?
    The term is computed, printed and added to the loss, and the loss still falls through its
    other terms, so training looks normal. But the term's gradient lands in parameters the step
    after the backward does not update: a GAN generator is then trained by its reconstruction
    term alone and the adversarial term never shapes its samples; an actor never follows the
    critic. Nothing fails.

    ## Example
    ```python
    fake = G(z)
    g_adv = mse(D(fake.detach()), ones)     # reaches D only; opt_G steps G
    g_loss = g_adv + 100 * l1(fake, real)
    g_loss.backward(); opt_G.step()
    ```

    ## Use instead
    ```python
    g_adv = mse(D(fake), ones)              # the gradient flows through D into G
    ```

    ## Stays silent on
    A term whose gradient reaches a parameter some step applies (an auxiliary head on a
    detached feature whose head the optimizer owns; a generator's adversarial term through D);
    the discriminator's own step on `fake.detach()`; losses of one term; a cut by `dist.sample()`
    where `rsample()` is meant (sample-not-reparameterised tells it); a term of data or of
    parameters no optimizer owns only (a regulariser on a frozen copy adds nothing and takes
    nothing); a backward none of whose terms trains anything (other rules say that);
    gradient accumulation (the step after several backwards applies them all).
    """

    code = "GD294"
    slug = "loss-term-trains-nothing"
    severity = Severity.WARNING
    summary = ("a term of the loss reaches only parameters whose gradients no step applies "
               "(its graph cut by .detach() on the way to the model): it trains nothing")
    fix = ("remove the .detach() (or no_grad) on the path from this term to the parameters it "
           "should train, or drop the term")

    def check(self, a):
        owned = {pid for pids in a.opt_params.values() for pid in pids}
        backwards = a.of_kind("backward")
        seen: dict = {}  # backward line -> [(aside, dead terms' keys, applied terms' keys, dead terms, ...)]
        for e in a.of_kind("loss_term_params"):
            b = next((x for x in backwards if x.seq > e.seq and x.get("thread") == e.get("thread")), None)
            if b is None or b.get("in_step") is not None:
                continue
            written = set(b.get("fresh", ())) | set(b.get("accumulated", ())) | set(b.get("cleared_outside", ()))
            applied, dropped, steps, clears = _applied(a, b, written)
            terms = e.get("terms") or ()
            alive = [t for t in terms if applied.intersection(t["params"])]
            # dead: every gradient it wrote to a stepped parameter was dropped unapplied (one
            # still pending when the look-ahead or the run ends counts as applied: not known)
            dead = [t for t in terms if (mine := owned.intersection(t["params"]) & written)
                    and mine <= dropped]
            key = (e.loc.path, e.loc.line) if e.loc is not None else None
            used = {_key(t) for t in terms if applied.intersection(t["params"])}
            seen.setdefault(key, []).append((e, {_key(t) for t in dead} if alive else set(),
                                             used, dead, applied, steps, clears))
        # a cut that sample-not-reparameterised explains (a sample() where rsample() is meant,
        # at a backward of that line) is told there, with its fix
        told = {(c.loc.path, c.get("backward")) for c in a.of_kind("reparam_cut") if c.loc is not None}
        for key, obs in seen.items():
            if key is None or key in told:
                continue
            # a term dead at two backwards of the line at least, and applied at none
            counts: dict = {}
            for o in obs:
                for path in o[1]:
                    counts[path] = counts.get(path, 0) + 1
            used = set().union(*(o[2] for o in obs))
            # in the script's operand order: the first dead term written, whatever the set order
            common = sorted((path for path, n in counts.items() if n >= 2 and path not in used),
                            key=lambda k: (list(k[:-1]), k[-1]))
            if not common:
                continue
            e, _, _, dead, applied, steps, clears = next(o for o in obs if common[0] in o[1])
            term = next(t for t in dead if _key(t) == common[0])
            yield self._finding(a, e, term, applied, steps, clears)

    def _finding(self, a, e, term, applied, steps, clears):
        loc = e.loc
        path, line = loc.path, loc.line
        name, cut, where = None, None, None
        assigned = a.source.loss_assignment(path, line)
        term_text, operand_text = None, None
        if assigned is not None:
            name = _term_name(assigned[1], term["path"])
            if name is not None:
                found = a.source.term_assignment(path, assigned[0], name)
                if found is not None:
                    term_text = found
                    cut = a.source.graph_cut(path, found[0], _function(term["op"]), whole=True)
            else:
                # a term that is no plain name (a helper's call, `generator_loss(d_fake)`): the
                # cut behind the names its expression reads
                cut = a.source.operand_cut(path, assigned[0], tuple(term["path"]))
                operand_text = a.source.sum_operand_text(path, assigned[0], tuple(term["path"]))
            where = Location(path, assigned[0])
        if cut is not None:
            loc = Location(path, cut[0])
        elif term_text is not None:
            loc = Location(path, term_text[0])
        elif where is not None:
            loc = where
        pids = sorted(term["params"])
        said = (f"`{name}`" if name else f"the term `{operand_text}`" if operand_text
                else f"the {term['op'].replace('Backward0', '')} term")
        stepped = sorted({a.optimizer_name(s["opt"]) for s in steps})
        how = ""
        if cut is not None:
            how = f"; its graph is cut at `{cut[1]}` ({cut[2]})"
        cleared = [c for c in clears if set(c["params"]) & set(pids)]
        fate = (f"cleared by the zero_grad at line {cleared[0].loc.line} before any step applies them"
                if cleared and cleared[0].loc is not None else "never applied by a step")
        return self.finding(
            f"the loss backpropagated here adds {said}, whose gradient reaches only "
            f"{a.names(pids)}: this backward's gradients for them are {fate}, while the step after "
            f"it ({', '.join(stepped) or 'the optimizer'}) updates the parameters the loss's other "
            f"terms reach{how}. The term trains nothing: the loss still falls through the other "
            f"terms, but this one never moves the parameters it was written for",
            loc, step=a.next_step_number(e.seq),
            evidence={"term": name or term["op"], "op": term["op"], "params": pids[:16],
                      "stepped": stepped},
            fix=("let this term's gradient reach the parameters it should train: remove the "
                 ".detach() (or the torch.no_grad()) on its path to them (in a GAN generator's "
                 "step, call D(fake), not D(fake.detach())), or drop the term"))


def _key(term) -> tuple:
    """A term as the backwards of one line are compared: its operand path and its op."""
    return (*term["path"], term["op"])


def _applied(a, b, written: set):
    """(the pids of ``written`` whose gradient from backward ``b`` a step applied, those whose
    gradient was dropped first (a clear, or a later backward that found no gradient), the
    steps after ``b`` that applied some, the clears that dropped some)."""
    pending = set(written)
    applied: set = set()
    dropped: set = set()
    steps, clears = [], []
    for x in _after(a, b.seq):
        if not pending:
            break
        if x.get("thread") != b.get("thread"):
            continue
        if x.kind == "clear":
            gone = pending.intersection(x["params"])
            if gone:
                clears.append(x)
                pending -= gone
                dropped |= gone
        elif x.kind == "backward":
            gone = pending.intersection(set(x.get("fresh", ())) | set(x.get("cleared_outside", ())))
            pending -= gone
            dropped |= gone
        elif x.kind == "step" and not x.get("skipped"):
            mine = pending.intersection(a.opt_params.get(x["opt"], ()))
            if mine:
                applied |= mine
                pending -= mine
                steps.append(x)
    return applied, dropped, steps, clears


def _after(a, seq: int):
    """The ``_LOOK_AHEAD`` events after ``seq``."""
    events = a.events
    start = bisect.bisect_right([x.seq for x in events], seq)
    return events[start:start + _LOOK_AHEAD]


def _function(op: str) -> str:
    """The functional name of a loss's autograd node: ``MseLossBackward0`` -> ``mse_loss``."""
    base = re.sub(r"Backward\d*$", "", op)
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", base).lower()


def _term_name(text: str, path) -> str | None:
    """The variable that the operand at ``path`` (additions' operand indices) of the loss's
    assignment ``text`` names, or None."""
    try:
        tree = ast.parse(text.strip())
    except SyntaxError:
        return None
    stmt = tree.body[0] if tree.body else None
    expr = getattr(stmt, "value", None)
    steps = list(path)
    for _ in range(32):
        if expr is None:
            return None
        if isinstance(expr, ast.UnaryOp):
            expr = expr.operand
        elif isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Mult, ast.Div)):
            if isinstance(expr.left, ast.Constant) and not isinstance(expr.op, ast.Div):
                expr = expr.right
            elif isinstance(expr.right, ast.Constant):
                expr = expr.left
            else:
                return None
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
                and expr.func.attr in ("mean", "sum") and not expr.args:
            expr = expr.func.value
        elif isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub)):
            if not steps:
                return None
            expr = expr.left if steps.pop(0) == 0 else expr.right
        elif isinstance(expr, ast.Name):
            return expr.id if not steps else None
        else:
            return None
    return None
