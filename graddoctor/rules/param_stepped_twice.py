from __future__ import annotations

import ast

from ..analysis import written
from ..findings import Severity
from ..trace import Location
from .base import Rule, related
from ..analysis.source import walk


class ParamSteppedTwice(Rule):
    """
    ## What it does
    Finds one optimizer that owns the same memory twice: a parameter listed twice in its
    parameters (a tied weight handed over through two modules' `parameters()`), or two
    `nn.Parameter` objects over one storage — weight tying written as
    `self.out.weight = nn.Parameter(self.emb.weight)` or `self.out.weight.data =
    self.emb.weight.data` instead of assigning the parameter itself. Read once when the
    optimizer is built (where each parameter's memory starts); reported when both entries get a
    gradient and the optimizer steps them, at the tying line when the script shows it, else at
    the optimizer.

    ## Why is this bad?
    The optimizer updates each entry on its own, so each step moves that memory twice. Listed
    twice, the parameter gets its update twice (SGD: twice the learning rate; Adam: its moments
    and step count advanced twice per step; torch only warns that a group holds duplicates).
    Tied through `nn.Parameter(...)` or `.data`, the two Parameters get separate gradients, each
    with one use's share only, and separate optimizer states: the shared weight is moved by two
    updates that neither sum the two uses' gradients (as real tying does) nor follow one
    optimizer state, and `state_dict()` saves it twice. The model trains, with an effective
    learning rate and a tying that are not what the script says.

    ## Example
    ```python
    class LM(nn.Module):
        def __init__(self, vocab, d):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.out = nn.Linear(d, vocab, bias=False)
            self.out.weight = nn.Parameter(self.emb.weight)  # a second Parameter, same memory
    ```

    ## Use instead
    ```python
            self.out.weight = self.emb.weight  # one Parameter: parameters() yields it once
    ```

    ## Stays silent on
    Weight tying by assigning the Parameter itself (one object, which `parameters()` yields
    once); an untied copy (`nn.Parameter(w.clone())`); parameters that are views of one flat
    buffer at different offsets; fp32 master copies of half-precision weights; two optimizers
    that share a parameter (`param-in-two-optimizers`); shared entries that never get a
    gradient or are never stepped (frozen); DTensor and lazy parameters.
    """

    code = "GD308"
    slug = "param-stepped-twice"
    severity = Severity.WARNING
    summary = ("one optimizer owns the same memory twice (a parameter listed twice, or two "
               "Parameters over one tensor): every step updates those weights twice")
    fix = ("give the optimizer each tensor once: tie weights by assigning the Parameter itself "
           "(`self.out.weight = self.emb.weight`), and pass model.parameters() (which yields a "
           "tied weight once) instead of concatenated lists")

    def check(self, a):
        for init in a.of_kind("optimizer_init"):
            pairs = [tuple(p) for p in init.get("aliases") or () if len(p) == 2]
            if not pairs:
                continue
            opt = init.get("opt")
            trained = _trained(a, opt)
            pairs = [(x, y) for x, y in dict.fromkeys(pairs) if x in trained and y in trained]
            if not pairs:
                continue
            cls = a.optimizer_name(opt)
            twice = [x for x, y in pairs if x == y]
            shared = [(x, y) for x, y in pairs if x != y]
            if shared:
                x, y = shared[0]
                first, second = a.param_name(x), a.param_name(y)
                tie = _tying_line(a, init.loc, first, second)
                target, source = tie[1:] if tie else (_owner(second), _owner(first))
                message = (f"{second} and {first} are two Parameters over one tensor's memory "
                           f"(nn.Parameter(other) or `.data = other.data` makes a new Parameter "
                           f"that shares the storage), and this {cls} owns both: each step "
                           f"updates those weights twice, each time with one use's gradient "
                           f"only and its own optimizer state, so the weights are not tied the "
                           f"way real tying sums both uses' gradients into one update")
                if len(shared) > 1:
                    message += f" ({len(shared) - 1} more such pair{'s' if len(shared) > 2 else ''})"
                loc = tie[0] if tie else init.loc
                notes = (related(init, f"the {cls} that owns both"),) if tie else ()
                yield self.finding(
                    message, loc, related=notes,
                    fix=("tie the weights by assigning the Parameter itself "
                         f"(`{target} = {source}`, no nn.Parameter(...) or .data): "
                         "one Parameter, which parameters() yields once and whose gradient sums "
                         "both uses"),
                    evidence={"pairs": [[a.param_name(x), a.param_name(y)] for x, y in shared],
                              "optimizer": opt, "cause": "shared_storage"})
            if twice:
                yield self.finding(
                    f"{a.names(twice)} {'is' if len(twice) == 1 else 'are'} listed twice in "
                    f"the parameters given to this {cls} (a tied weight reached through two "
                    f"modules' parameters(), or lists concatenated): each step applies "
                    f"{'its' if len(twice) == 1 else 'their'} update twice (torch only warns "
                    f"that a param group holds duplicates)",
                    init.loc,
                    fix=("give the optimizer each parameter once: model.parameters() yields a "
                         "tied weight once; for a list, drop repeats "
                         "(`list({id(p): p for p in params}.values())`)"),
                    evidence={"params": a.param_names(twice), "optimizer": opt,
                              "cause": "listed_twice"})


def _trained(a, opt) -> set[int]:
    """The pids a backward wrote and a step of ``opt`` then applied."""
    pending: set[int] = set()
    trained: set[int] = set()
    owned = set(a.opt_params.get(opt, ()))
    for e in a.of_kind("backward", "step"):
        if e.kind == "backward":
            pending.update(written(e))
        elif e.get("opt") == opt and not e.get("skipped"):
            trained.update((owned & pending) - set(e.get("without_grad") or ()))
    return trained


def _owner(name: str) -> str:
    """``model.out.weight`` -> ``self.out.weight`` as the tying line writes it inside the
    model (the last two parts: a module attribute and its parameter)."""
    parts = name.split(" ")[0].split(".")
    return "self." + ".".join(parts[-2:]) if len(parts) >= 3 else ".".join(parts)


def _tying_line(a, where: Location | None, first: str, second: str) -> tuple | None:
    """The assignment in the optimizer's file that makes one of the two Parameters from the
    other (``x.out.weight = nn.Parameter(x.emb.weight)``, ``x.out.weight.data =
    x.emb.weight.data``): its target ends with one's last two parts, its value names the
    other's. ``(location, target, source)`` with the two as the line writes them (``.data`` and
    ``nn.Parameter(...)`` taken off), or None when no single such line is found."""
    if where is None:
        return None
    tree = a.source.tree(where.path)
    if tree is None:
        return None
    ends = [".".join(n.split(" ")[0].split(".")[-2:]) for n in (first, second)]
    if len(set(ends)) < 2 or any("." not in e for e in ends):
        return None
    found = {}
    for node in walk(tree):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        value = node.value
        if isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords:
            value = value.args[0]  # nn.Parameter(x), torch.nn.Parameter(x)
        try:
            target, source = ast.unparse(node.targets[0]), ast.unparse(value)
        except Exception:
            continue
        target = target[: -len(".data")] if target.endswith(".data") else target
        source = source[: -len(".data")] if source.endswith(".data") else source
        for mine, other in ((ends[0], ends[1]), (ends[1], ends[0])):
            if (target == mine or target.endswith("." + mine)) and \
                    (source == other or source.endswith("." + other)):
                found[node.lineno] = (target, source)
    if len(found) != 1:
        return None
    [(line, (target, source))] = found.items()
    return Location(where.path, line), target, source
