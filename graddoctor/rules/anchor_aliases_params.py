from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_COPIES = ("clone", "copy", "deepcopy", "copy_", "cpu", "to", "numpy", "tolist", "item")


_DISTANCES = ("dist", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")


def _called(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _over_parameters(node: ast.AST) -> bool:
    """``X.parameters()`` / ``X.named_parameters()`` / ``X.state_dict()`` (whose tensors share
    the parameters' memory), possibly inside a call such as zip or ``.items()``."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr in ("parameters", "named_parameters", "state_dict") for n in walk(node))


def _uncopied(element: ast.AST) -> bool:
    """The stored element is the parameter itself or a view of its memory: ``p``, ``p.data``,
    ``p.detach()`` (nothing that copies: ``clone``, ``deepcopy``, ``.cpu()``...)."""
    for n in walk(element):
        if isinstance(n, ast.Call) and isinstance(n.func, (ast.Attribute, ast.Name)):
            name = n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id
            if name in _COPIES:
                return False
    node = element
    while True:
        if isinstance(node, ast.Name):
            return True
        if isinstance(node, ast.Attribute) and node.attr == "data":
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "detach" and not node.args:
            node = node.func.value
        else:
            return False


def _anchor_value(value: ast.AST) -> bool:
    if isinstance(value, (ast.DictComp, ast.ListComp)):
        element = value.value if isinstance(value, ast.DictComp) else value.elt
        return any(_over_parameters(g.iter) for g in value.generators) and _uncopied(element)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("dict", "list") \
            and len(value.args) == 1 and not value.keywords:
        return _over_parameters(value.args[0])
    return False


def anchor_lines(tree: ast.AST) -> list[tuple[int, str]]:
    """The assignments that store the parameters themselves (``{n: p for n, p in
    m.named_parameters()}``, ``[p.detach() for p in m.parameters()]``, ``dict(m.named_parameters())``,
    ``{k: v for k, v in m.state_dict().items()}``) under a name (or attribute) that a statement
    which subtracts (or takes a distance: ``torch.dist``, ``F.mse_loss``) reads: the anchor
    candidates, ``[(line, name)]``."""
    found: list[tuple[int, str]] = []
    subtracted: set[str] = set()  # names read by a statement that subtracts (or takes a distance)
    for node in walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return)) and any(
                isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub)
                or isinstance(n, ast.Call) and _called(n) in _DISTANCES for n in walk(node)):
            for n in walk(node):
                if isinstance(n, ast.Name):
                    subtracted.add(n.id)
                elif isinstance(n, ast.Attribute):
                    subtracted.add(n.attr)
    for node in walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and _anchor_value(node.value):
            target = node.targets[0]
            name = target.id if isinstance(target, ast.Name) else \
                target.attr if isinstance(target, ast.Attribute) else None
            if name is not None and name in subtracted:
                found.append((node.lineno, name))
    return sorted(found)


class AnchorAliasesParams(Rule):
    """
    ## What it does
    Finds a penalty that pulls parameters towards an anchor which is the live parameters
    themselves: an EWC, L2-SP or FedProx term `sum(F * (p - anchor) ** 2)` whose anchor was
    stored as a reference (`{n: p for n, p in model.named_parameters()}`,
    `dict(model.named_parameters())`) or as a view of their memory (`p.detach()`, `p.data`)
    instead of a copy. At the first backwards of each backward line, and again when the loss
    gains a term (a penalty switched on after a first task or a warm-up), the loss's graph is
    read: a difference `p - p` of a parameter with itself, or a squared (absolute, norm,
    `torch.dist`) difference between a parameter and a constant that is exactly zero at two
    backwards with an optimizer step between them that moved the parameter, and never anything
    else. It points at the assignment that stored the anchor when the script has one (a
    comprehension or `dict()`/`list()` over `parameters()` without a copy, whose name a
    subtraction or a distance reads), else at the backward.

    ## Why is this bad?
    The anchor moves with the parameters: the optimizer's in-place update changes the anchor as
    well, so `p - anchor` is zero at every step and the penalty adds nothing, with a zero
    gradient. The model forgets the first task (EWC), drifts away from the pretrained weights
    (L2-SP) or from the global model (FedProx) as if the penalty were not there. Nothing fails;
    the penalty just always reads 0.

    ## Example
    ```python
    anchor = {n: p.detach() for n, p in model.named_parameters()}
    ...
    penalty = sum((fisher[n] * (p - anchor[n]) ** 2).sum() for n, p in model.named_parameters())
    ```

    ## Use instead
    ```python
    anchor = {n: p.detach().clone() for n, p in model.named_parameters()}
    ```

    ## Stays silent on
    Anchors copied with `clone()` / `copy.deepcopy` (equal to the parameters right after they
    are taken, then apart); an anchor copied again at the start of each FedProx round (equal at
    the round's first step only: one non-zero difference clears it); accumulated micro-batches
    (their zero differences count once per step); differences of parameters that no optimizer
    steps; distances between activations (a feature-distillation `torch.dist(out, teacher_out)`).
    Not seen: a penalty that starts after the check's step budget (an anchor taken at the end of
    a first task longer than the budget is never used in the run).
    """

    code = "GD263"
    slug = "anchor-aliases-params"
    severity = Severity.WARNING
    summary = ("a penalty's anchor (EWC, L2-SP, FedProx) is the live parameters, not a copy: "
               "p - anchor is 0 at every step and the penalty does nothing")
    fix = "store a copy as the anchor: {n: p.detach().clone() for n, p in model.named_parameters()}"

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("anchor_alias"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids:
                continue
            how = e.get("how")
            loc, text = e.loc, None
            if loc is not None:
                tree = a.source.tree(loc.path)
                lines = anchor_lines(tree) if tree is not None else []
                if len(lines) == 1:
                    loc, text = Location(loc.path, lines[0][0]), lines[0][1]
            seen = ("the loss subtracts each of these parameters from itself (p - p): the anchor "
                    "holds the parameter objects, not copies" if how == "same" else
                    "the squared difference between each of these parameters and its anchor is "
                    "exactly 0 at every backward after an optimizer step: the anchor shares the "
                    "parameters' memory (p.detach(), p.data or a state_dict() tensor kept "
                    "without clone()), so every in-place update moves it too")
            where = f" (`{text}`, stored here)" if text else ""
            yield self.finding(
                f"a penalty pulls {a.names(pids)} towards an anchor{where} that is the live "
                f"parameters themselves: {seen}. The penalty is 0 with a zero gradient at every "
                f"step, so it constrains nothing (EWC forgets the first task, L2-SP and FedProx "
                f"drift freely)",
                loc, step=a.next_step_number(e.seq),
                evidence={"params": pids[:16], "how": how},
                fix=("store a copy as the anchor: `p.detach().clone()` (or copy.deepcopy of the "
                     "model) when the anchor is taken, not `p`, `p.detach()` or `p.data`"))
