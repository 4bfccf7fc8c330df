from __future__ import annotations

import ast

from ..findings import Severity
from ..location import Location
from .base import Related, Rule
from ..analysis.source import walk


_IDLE_SPAN = 10  # lines above a `.item()` term where a loss of a module without gradient defers to GD106


def _learnable_names(tree: ast.AST) -> set[str]:
    """Texts of the names and attributes the file binds to a trainable leaf: ``nn.Parameter(...)``
    or a tensor made with ``requires_grad=True``."""
    found = set()
    for node in walk(tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        call = node.value
        callee = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
        if callee == "Parameter" or any(k.arg == "requires_grad" and isinstance(k.value, ast.Constant)
                                        and k.value.value is True for k in call.keywords):
            found.update(ast.unparse(t) for t in node.targets if isinstance(t, (ast.Name, ast.Attribute)))
    return found


def _scaled_by_learnable(tree: ast.AST | None, grad_line: int, backward_line: int) -> bool:
    """Whether, between the ``autograd.grad`` statement at ``grad_line`` and the backward at
    ``backward_line``, its result is multiplied by a trainable leaf of the script (GradNorm's
    ``weights * g``): the loss then keeps a graph through that factor, and the gradient norms
    are data on purpose."""
    if tree is None:
        return False
    learnable = _learnable_names(tree)
    if not learnable:
        return False
    statements = sorted((n for n in walk(tree) if isinstance(n, ast.Assign)
                         and (n.end_lineno or n.lineno) >= grad_line and n.lineno <= backward_line),
                        key=lambda n: n.lineno)
    tainted: set[str] = set()
    for node in statements:
        reads = {ast.unparse(n) for n in walk(node.value) if isinstance(n, (ast.Name, ast.Attribute))}
        holds_grad = node.lineno <= grad_line <= (node.end_lineno or node.lineno)
        if holds_grad or reads & tainted:
            if not holds_grad:
                for prod in walk(node.value):
                    if isinstance(prod, ast.BinOp) and isinstance(prod.op, (ast.Mult, ast.Div)):
                        sides = [{ast.unparse(n) for n in walk(side) if isinstance(n, (ast.Name, ast.Attribute))}
                                 for side in (prod.left, prod.right)]
                        if (sides[0] & tainted and sides[1] & learnable) \
                                or (sides[1] & tainted and sides[0] & learnable):
                            return True
            tainted.update(ast.unparse(t) for t in node.targets)
    return False


class PenaltyWithoutGraph(Rule):
    """
    ## What it does
    Finds a gradient penalty built from `torch.autograd.grad(...)` called without
    `create_graph=True` whose result is added into the loss that is then backpropagated (an R1
    or WGAN-GP penalty, a gradient-norm regulariser, input-gradient smoothing). It also finds a
    penalty on the parameters computed from their values cut from the graph (`p.data`,
    `p.detach()`: an L2 or L1 regulariser written by hand) when the backpropagated loss adds a
    term autograd does not reach at every backward of the run's first ones; it points at the
    statement that computes it. And it finds a loss term computed, with gradients on, by a loss
    function (`mse_loss`, `smooth_l1_loss`, `cross_entropy`, `kl_div`... or their `nn` modules)
    from a prediction with no graph, whose value the loss that is backpropagated adds, with an
    operand without graph in that loss's sum at every backward checked: the prediction was
    `.detach()`-ed, read through `.data`, sent through NumPy or `.item()`, or computed under
    `torch.no_grad()`, as the source shows, also where the script calls a loss helper of its
    own with a cut argument (`stft_loss(pred.detach(), y)`: the helper's loss call reads its
    parameter). It points at the statement that cuts it. And it
    finds a term of that sum computed through an op that has no gradient, from a value the
    loss's other terms train through: a Dice or IoU term on `F.one_hot(logits.argmax(1))` or
    on `(torch.sigmoid(x) > 0.5).float()` beside a cross-entropy on `logits`, a `round()`-ed
    prediction (the source shows the op on the name the other terms read). And it finds a term
    added to the backpropagated loss as a number read out with `.item()` (`loss = loss +
    penalty().item()`, `loss += lam * reg.item()`), at the statement that adds it.

    ## Why is this bad?
    Without `create_graph=True`, `autograd.grad` returns plain tensors with no history: the
    penalty computed from them is a constant. Adding it to the loss changes the number printed
    but not one gradient: the regulariser does nothing, and the run trains as if it were not
    there (a WGAN-GP critic without its Lipschitz constraint, an R1-regularised GAN without R1).
    A loss term on a detached prediction is the same: a detection model's box term, an
    auxiliary or consistency term, a distillation term, each silently trains nothing while the
    other terms keep the sum differentiable, so torch raises no error. A term made through
    argmax or a threshold is the same: the segmentation model trains on its cross-entropy alone,
    and the Dice term meant to fix class imbalance only shifts the printed loss.

    ## Example
    ```python
    grad, = torch.autograd.grad(d_real.sum(), real_in, retain_graph=True)
    r1 = grad.pow(2).sum(1).mean()
    loss = d_loss + 10.0 * r1
    loss.backward()
    ```

    ## Use instead
    ```python
    grad, = torch.autograd.grad(d_real.sum(), real_in, create_graph=True)
    r1 = grad.pow(2).sum(1).mean()
    loss = d_loss + 10.0 * r1
    loss.backward()
    ```

    ## Stays silent on
    `create_graph=True`; a gradient of a function whose graph holds no trainable leaf but the
    inputs it is taken for (force labels computed as the gradient of a reference potential,
    also in a helper called before the loop); an input gradient used to perturb the input (FGSM, adversarial
    training: the loss is computed by the model on the perturbed input, also when a helper
    builds it and the caller hands its result straight to the model); a gradient computed
    for logging or for a hand-written update that never reaches the backpropagated loss;
    gradient norms taken as data and multiplied by a trainable factor before the loss (GradNorm's
    `weights * g`: the loss trains the task weights through that factor); an L2
    penalty computed from the parameters themselves, and a detached copy of it kept for logging;
    a loss on detached values computed for a log or under `torch.no_grad()` (validation) that no
    backward's loss adds; a probe trained on detached features through its own backward; a
    detached target (a parameter's `.detach()` as a center loss's target); a sum that starts
    from 0 or adds a constant tensor; a constant term computed on data or on a frozen model's
    output, nothing cut from the graph (an energy distance's real-against-real term, a frozen
    backbone's loss reported in the sum); a cut at a module whose parameters get no gradient at
    all, which `param-without-grad` reports at that line; argmax or a threshold used to
    weight a term that keeps its graph (hard-example mining: `ce * (pred.argmax(1) != y)`), or
    for a metric that the loss does not add; a soft Dice on softmax probabilities; `.item()`
    values summed for a log under another name than the loss's, or scaling the loss
    (`loss * w.item()`, `loss / n.item()`: a factor, not a term); a `.item()` term whose loss
    is the only one of its module's parameters (param-without-grad names the module there).
    """

    code = "GD237"
    slug = "penalty-without-graph"
    severity = Severity.WARNING
    summary = ("a penalty or loss term added to the loss has no graph (torch.autograd.grad "
               "without create_graph=True, computed from p.data / p.detach(), or a loss on a "
               "detached or no_grad prediction, or through argmax or a threshold): it adds "
               "a constant, no gradient")
    fix = "pass create_graph=True to torch.autograd.grad so that the penalty can be backpropagated"

    def check(self, a):
        yield from self._grad_penalties(a)
        yield from self._cut_penalties(a)
        yield from self._constant_losses(a)
        yield from self._item_terms(a)

    def _item_terms(self, a):
        """Backward lines whose loss the source builds by adding a number read out of a tensor
        with ``.item()``: that term is a constant whatever the graph holds."""
        told = set()
        lines = {(b.loc.path, b.loc.line) for b in a.of_kind("backward") if b.loc is not None}
        # a loss whose module got no gradient at all: param-without-grad reports it at that loss
        idle = [(e.loc.path, e.loc.line) for e in a.of_kind("idle_loss") if e.loc is not None]
        for path, line in sorted(lines):
            found = a.source.item_term(path, line)
            if found is None or (path, found[0]) in told \
                    or any(p == path and found[0] - _IDLE_SPAN <= ln <= found[0] for p, ln in idle):
                continue
            told.add((path, found[0]))
            at, text = found
            yield self.finding(
                f"this statement (`{text}`) adds to the loss backpropagated at line {line} a term "
                f"read out with `.item()`: a Python number, with no graph, so the term changes "
                f"the loss value but not one gradient — the penalty or auxiliary loss it "
                f"computes (an EWC or proximal penalty, a regulariser) never trains anything",
                Location(path, at),
                related=(Related(Location(path, line), "the backward of that loss"),),
                evidence={"backward_line": line, "via": "item"},
                fix=("add the tensor itself to the loss (drop `.item()` there) and keep "
                     "`.item()` for the value you log"))

    def _constant_losses(self, a):
        """Loss functions called with gradients on, on inputs with no graph (``loss_no_graph``),
        whose value the source adds into the loss of a backward whose linear top holds an
        operand with no graph at every backward checked after them."""
        by_call: dict[tuple, list] = {}
        for e in a.of_kind("loss_no_graph"):
            if e.loc is not None:
                by_call.setdefault((e.loc.path, e.loc.line), []).append(e)
        # modules whose parameters got no gradient at all, where they ran: param-without-grad
        # reports such a forward (under no_grad, or cut) at its line already
        idle = {(e.loc.path, e.loc.line) for e in a.of_kind("idle_forward") if e.loc is not None}
        told: set = set()  # cuts reported: a helper's two loss calls fed by one cut are one bug
        for (path, line), events in by_call.items():
            lines = {e.get("backward") for e in events}
            times = a.count(events)  # folded copies included: a later phase's turns fold too
            if times < 2 or len(lines) != 1 or any(not e.get("constants") for e in events):
                continue  # a phase, a backward of another loss, or no constant term in its sum
            backward = lines.pop()
            if backward is None or a.source.value_reaches_backward(path, line) != backward:
                continue  # computed for a log, not added to the loss
            fn = events[0].get("fn")
            cut = a.source.graph_cut(path, line, fn)
            if cut is None:
                continue  # data, or a frozen model's output: a constant by design, nothing cut
            at, _text, how = cut
            if (path, at) in idle or (path, at) in told:
                continue
            told.add((path, at))
            cause = (f"its input is cut from the graph here ({how})" if at != line
                     else f"its input is cut from the graph ({how})")
            related = [Related(Location(path, backward), "the backward of that loss")]
            if at != line:
                related.insert(0, Related(Location(path, line), f"the {fn} term it feeds"))
            yield self.finding(
                f"the {fn} at line {line} is added to the loss backpropagated at line {backward}, "
                f"but {cause}: the term is a constant at each of the {times} backwards checked. It "
                f"changes the loss value and not one gradient, so what it should train never "
                f"learns from it",
                Location(path, at), related=tuple(related),
                evidence={"backward_line": backward, "via": "loss", "function": fn, "how": how,
                          "loss_line": line, "backwards": times},
                fix=("compute the loss term from the prediction itself, not from a `.detach()`, "
                     "`.data`, NumPy or `torch.no_grad()` copy of it (keep a detached copy for "
                     "logging only); drop the term if it is not meant to train anything"))

    def _cut_penalties(self, a):
        """Backward lines whose every checked loss adds a term with no graph (``loss_constant``:
        the run's first backwards), the source showing a term made from parameters cut from
        the graph."""
        by_line: dict[tuple, list] = {}
        for b in a.of_kind("backward"):
            if b.loc is not None:
                by_line.setdefault((b.loc.path, b.loc.line), []).append(b)
        for (path, line), backwards in by_line.items():
            flagged = [i for i, b in enumerate(backwards) if b.get("loss_constant")]
            if not flagged or any(not b.get("loss_constant") for b in backwards[:flagged[-1]]):
                continue
            times = a.count(backwards[:flagged[-1] + 1])
            if times < 2:
                continue
            if a.source.item_term(path, line) is not None:
                continue  # the term is cut by its `.item()`, told at that statement
            found = a.source.cut_penalty(path, line)
            if found is None:
                hard = a.source.hard_cut_term(path, line)
                if hard is not None:
                    yield self._hard_term(path, line, times, *hard)
                continue
            at, text = found
            yield self.finding(
                f"this penalty is computed from the parameters' values cut from the graph "
                f"(`.data` / `.detach()`), and the loss backpropagated at line {line} adds it as a "
                f"term with no graph at each of the {times} backwards checked: it changes the loss value "
                f"but not one gradient, so the regulariser does nothing",
                Location(path, at),
                related=(Related(Location(path, line), "the backward of that loss"),),
                evidence={"backward_line": line, "via": "cut", "backwards": times},
                fix="compute the penalty from the parameters themselves (`p.pow(2).sum()`, not "
                    "`p.data` or `p.detach()`), or use the optimizer's weight_decay")

    def _hard_term(self, path, line, times, at, text, how, name):
        """A term of the loss made through an op without gradient (argmax, a threshold) from a
        value the loss's other terms train through."""
        return self.finding(
            f"this term of the loss is computed from `{name}` through {how}, which has no "
            f"gradient: the loss backpropagated at line {line} adds it as a term with no graph "
            f"at each of the {times} backwards checked, so it changes the loss value but not one "
            f"gradient — what it measures (a Dice/IoU overlap, a hard-label agreement) is never "
            f"trained, only the other terms are",
            Location(path, at),
            related=(Related(Location(path, line), "the backward of that loss"),),
            evidence={"backward_line": line, "via": "hard", "how": how, "name": name,
                      "backwards": times},
            fix=(f"compute the term from a soft, differentiable version of `{name}`: its "
                 f"softmax (or sigmoid) probabilities instead of one_hot(argmax(...)) or a "
                 f"thresholded mask; keep the hard version for metrics only"))

    def _grad_penalties(self, a):
        backwards = a.of_kind("backward")
        seen = set()
        for e in a.of_kind("functional_grad"):
            if e.get("api") != "torch.autograd.grad" or e.get("create_graph") is not False:
                continue
            if e.get("of_data"):
                continue  # a gradient of data alone (labels from a reference function): no
                # parameter is upstream, so create_graph could not give the loss any gradient
            if e.loc is None or (e.loc.path, e.loc.line) in seen:
                continue
            if not any(b.seq > e.seq for b in backwards):
                continue
            line = a.source.result_reaches_backward(e.loc.path, e.loc.line)
            if line is None:
                continue
            if _scaled_by_learnable(a.source.tree(e.loc.path), e.loc.line, line):
                continue  # the norms weigh a trainable factor (GradNorm's task weights)
            if a.source.computed_before_loop(e.loc.path, e.loc.line, line):
                # taken once before the loop whose every pass backpropagates: a graph built once
                # could not be backpropagated at each pass anyway, so the result is data (force
                # targets from a reference potential), a constant on purpose
                continue
            seen.add((e.loc.path, e.loc.line))
            yield self.finding(
                "torch.autograd.grad is called without create_graph=True, and the loss "
                f"backpropagated at line {line} is computed from its result: that result has no "
                "history, so the penalty is a constant that changes the loss value but no gradient",
                e.loc, related=(Related(Location(e.loc.path, line), "the backward of that loss"),),
                evidence={"backward_line": line})
