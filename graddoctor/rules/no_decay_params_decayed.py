from __future__ import annotations

import ast
from dataclasses import replace

from ..findings import Severity
from ..analysis.optimizer_settings import misspells
from .base import Rule, plural, related
from ..analysis.source import walk


class NoDecayParamsDecayed(Rule):
    """
    ## What it does
    Finds an optimizer whose param groups set the biases and norm weights (the 1-D parameters)
    apart from the weight matrices, the shape of the usual decay / no-decay split, while weight
    decay still reaches them:

    * a group of only biases and norm weights decays them at least as much as a group of only
      matrices with the same lr decays the matrices: the no-decay group was given the decay
      (`'weight_decay': weight_decay` copied onto it, a misspelt `'weight_decay'` key, no key
      at all so the optimizer's default applies), or the two groups are swapped (`ndim == 1`
      where `ndim > 1` was meant);
    * a group with `weight_decay=0` holds biases and no norm weight while a decaying group with
      the same lr holds the norm weights: the no-decay list of names (`["bias",
      "LayerNorm.weight"]`) does not match this model's norm layers (`ln_1`, `norm`).

    It points at the no-decay group's dict when the groups are written as a list of dicts, at
    the list of names when the script has one, else at the optimizer's construction.

    ## Why is this bad?
    The split exists because weight decay is meant for the weight matrices: decaying a norm's
    scale or a bias pulls it toward 0 at every update (a LayerNorm's gain toward switching its
    output off), which the loss does not ask for. The split changes nothing when both sides get
    the same decay, and swapped it decays exactly what it should spare while the matrices go
    unregularised. Nothing fails and the loss still goes down, so the slip stays in copied
    training scripts.

    ## Example
    ```python
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([
        {"params": decay, "weight_decay": 0.1},
        {"params": no_decay, "weight_decay": 0.1},
    ], lr=6e-4)
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.AdamW([
        {"params": decay, "weight_decay": 0.1},
        {"params": no_decay, "weight_decay": 0.0},
    ], lr=6e-4)
    ```

    ## Stays silent on
    One group over every parameter (decaying everything is a choice, not a broken split);
    biases and norm weights given a smaller decay than the matrices; groups that differ in lr
    (Caffe's biases at twice the lr with the same decay, layer-wise lr decay); detectron2's
    groups (norm layers without decay, conv and linear biases with it); groups where every
    decay is 0; a group of one parameter, or of free tensors (a temperature, `log_alpha`) that
    are no module's weight or bias; a group added after the first step (a norm layer unfrozen
    with `add_param_group`, which takes the optimizer's default decay). Not seen: a decay changed per group after construction (a
    weight-decay schedule written onto every group).
    """

    code = "GD230"
    slug = "no-decay-params-decayed"
    severity = Severity.WARNING
    summary = ("the optimizer's param groups set the biases and norm weights apart from the weight "
               "matrices, but weight decay still reaches them (the no-decay group decays, or the "
               "groups are swapped, or its name list misses the norm layers)")
    fix = "give the group of biases and norm weights 'weight_decay': 0.0"

    def check(self, a):
        first_step: dict[int, int] = {}
        for s in a.steps:
            if not s.get("skipped"):
                first_step.setdefault(s.get("opt"), s.seq)
        for opt in a.optimizers:
            if opt not in first_step or _decay_key_misspelt(a, opt):
                continue  # param-group-key-unread names the cause
            groups = _groups(a, opt, first_step[opt])
            if groups is None:
                continue
            found = _split_decayed(a, groups) or _names_miss_norms(a, groups)
            if found is not None:
                yield self._finding(a, opt, groups, found)

    def _finding(self, a, opt, groups, found):
        form, target, other = found
        name = a.optimizer_name(opt)
        event = target.event
        loc, where = event.loc, None
        if form == "names":
            where = _name_list_line(a, event.loc)
        if where is None:
            where = _group_dict_line(a, event.loc, target.index)
        if where is not None and loc is not None:
            loc = replace(loc, line=where, function="", via="", hook="")
        vectors = target.vectors
        if form == "same":
            message = (f"{name}'s param groups set {plural(len(vectors), 'bias and norm weight', 'biases and norm weights')} "
                       f"({a.names(vectors)}) apart from the weight matrices, but give them "
                       f"weight_decay={target.wd:g}, as much as the matrices get "
                       f"({other.wd:g}): the split meant to spare them from weight decay spares "
                       f"nothing, and every update pulls them toward 0")
            fix = self.fix
        elif form == "swapped":
            message = (f"{name}'s decay / no-decay groups are swapped: the group of biases and "
                       f"norm weights ({a.names(vectors)}) gets weight_decay={target.wd:g} while "
                       f"the weight matrices ({a.names(other.pids)}) get {other.wd:g}: it decays "
                       f"what the split is meant to spare and leaves the matrices unregularised")
            fix = ("swap the groups: the weight decay for the matrices (p.dim() >= 2), "
                   "'weight_decay': 0.0 for the biases and norm weights (p.dim() < 2)")
        else:
            norms = other.norm_weights
            message = (f"{name}'s weight_decay=0 group holds {plural(len(target.biases), 'bias', 'biases')} "
                       f"({a.names(target.biases)}) but none of the norm weights: "
                       f"{a.names(norms)} sit in a group with weight_decay={other.wd:g}, so the "
                       f"exemption misses them (a list of names such as 'LayerNorm.weight' that "
                       f"this model's norm layers do not match)")
            fix = ("put the norm weights in the weight_decay=0 group: select them by module type "
                   "(isinstance(m, nn.LayerNorm)) or by p.dim() < 2, not by a list of names")
        rel = [related(event, f"{name}'s construction")] if where is not None else []
        first = next((s for s in a.steps if s.get("opt") == opt and s.seq > event.seq), None)
        if first is not None:
            rel.append(related(first, "a step that decays them"))
        return self.finding(message, loc, related=tuple(rel), fix=fix,
                            step=a.step_number.get(first.seq) if first is not None else None,
                            evidence={"opt": opt, "form": form, "weight_decay": target.wd,
                                      "other_weight_decay": other.wd,
                                      "params": a.param_names(vectors if form != "names"
                                                              else other.norm_weights, 16)})


class _Group:
    """One param group: where it was added, its index among the optimizer's groups, its lr,
    weight decay and parameters sorted by shape and name."""

    def __init__(self, a, event, index, pids, lr, wd):
        self.event, self.index, self.pids, self.lr, self.wd = event, index, pids, lr, wd
        shapes = [a.params[p].get("shape") if p in a.params else None for p in pids]
        names = [(a.params[p].get("name") or "") if p in a.params else "" for p in pids]
        self.known = all(s is not None for s in shapes)
        self.vectors = [p for p, s in zip(pids, shapes) if s is not None and len(s) <= 1]
        self.matrices = [p for p, s in zip(pids, shapes) if s is not None and len(s) >= 2]
        self.biases = [p for p, s, n in zip(pids, shapes, names)
                       if s is not None and len(s) <= 1 and n.endswith("bias")]
        self.norm_weights = [p for p, s, n in zip(pids, shapes, names)
                             if s is not None and len(s) == 1 and n.endswith("weight")]
        self.only_vectors = self.known and bool(pids) and len(self.vectors) == len(pids)
        self.only_matrices = self.known and bool(pids) and len(self.matrices) == len(pids)


def _groups(a, opt, before: int) -> list[_Group] | None:
    """The optimizer's param groups given before its first step (``before``), in order, or
    None when a group's settings were not recorded. A group added later (gradual unfreezing
    with ``add_param_group``) takes the optimizer's defaults without being a split."""
    groups: list[_Group] = []
    for event in a.by_kind.get("optimizer_init", ()):
        if event.get("opt") != opt or event.seq > before:
            continue
        hyper = event.get("hyper")
        lrs = event.get("lrs") or []
        if not hyper:
            return None
        pids = list(event.get("params") or ())
        for g, settings in enumerate(hyper):
            if settings is None or g >= len(lrs):
                return None
            wd = settings.get("weight_decay")
            if wd is None:
                return None
            # one event per add_param_group: an event with several groups cannot tell which
            # parameters are whose
            group_pids = pids if len(hyper) == 1 else []
            groups.append(_Group(a, event, len(groups), group_pids, lrs[g], float(wd)))
    return groups or None


def _same(x, y) -> bool:
    return x is not None and y is not None and abs(x - y) <= 1e-12 * max(abs(x), abs(y), 1e-30)


def _split_decayed(a, groups):
    """``("same" | "swapped", vector group, matrix group)``: a group of only biases and norm
    weights (two or more, one at least a module's weight or bias) decayed at least as much as
    a group of only matrices with the same lr."""
    for v in groups:
        if not (v.only_vectors and v.wd > 0 and len(v.pids) >= 2 and (v.biases or v.norm_weights)):
            continue
        for m in groups:
            if m.only_matrices and _same(m.lr, v.lr) and v.wd >= m.wd:
                return ("same" if _same(v.wd, m.wd) else "swapped"), v, m
    return None


def _names_miss_norms(a, groups):
    """``("names", zero group, decaying group)``: a weight_decay=0 group of only 1-D
    parameters holding biases and no norm weight, while a decaying group with the same lr holds
    norm weights — and no weight_decay=0 group holds any."""
    if any(g.wd == 0 and g.norm_weights for g in groups):
        return None
    for z in groups:
        if not (z.wd == 0 and z.only_vectors and z.biases):
            continue
        for d in groups:
            if d.wd > 0 and d.norm_weights and _same(d.lr, z.lr):
                return "names", z, d
    return None


def _group_dict_line(a, loc, index: int) -> int | None:
    """The line of the ``index``-th dict of the list of param groups given to the call on
    ``loc``'s line: written in the call, in a variable of the same function or the module, or
    returned by a function of the script's that the call calls."""
    if loc is None:
        return None
    tree = a.source.tree(loc.path)
    if tree is None:
        return None
    for call in walk(tree):
        if not (isinstance(call, ast.Call) and call.lineno <= loc.line <= (call.end_lineno or call.lineno)):
            continue
        given = call.args[0] if call.args else next(
            (k.value for k in call.keywords if k.arg == "params"), None)
        dicts = _resolve(tree, given, _enclosing(tree, call), depth=0)
        if dicts is not None and index < len(dicts):
            return dicts[index].lineno
    return None


def _enclosing(tree, node):
    """The function whose body holds ``node``, else the module."""
    best = tree
    for f in walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and f.lineno <= node.lineno <= (f.end_lineno or f.lineno):
            if best is tree or f.lineno >= best.lineno:
                best = f
    return best


def _resolve(tree, expr, scope, depth: int):
    """The dicts of a list of param groups that ``expr`` evaluates to, or None."""
    if expr is None or depth > 2:
        return None
    if isinstance(expr, (ast.List, ast.Tuple)):
        if expr.elts and all(isinstance(e, ast.Dict) for e in expr.elts):
            return list(expr.elts)
        return None
    if isinstance(expr, ast.Name):
        found = [n.value for n in walk(scope) if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == expr.id for t in n.targets)]
        if len(found) == 1:
            return _resolve(tree, found[0], scope, depth + 1)
        return None
    if isinstance(expr, ast.Call) and isinstance(expr.func, (ast.Name, ast.Attribute)):
        callee = expr.func.id if isinstance(expr.func, ast.Name) else expr.func.attr
        defs = [f for f in walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                and f.name == callee]
        if len(defs) != 1:
            return None
        returns = [r.value for r in walk(defs[0]) if isinstance(r, ast.Return) and r.value is not None]
        if len(returns) == 1:
            return _resolve(tree, returns[0], defs[0], depth + 1)
    return None


def _name_list_line(a, loc) -> int | None:
    """The line of the one list (tuple, set) of string names with "bias" in one of them that
    the script assigns to a variable (``no_decay = ["bias", "LayerNorm.weight"]``), or None."""
    if loc is None:
        return None
    tree = a.source.tree(loc.path)
    if tree is None:
        return None
    lines = []
    for node in walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple, ast.Set)):
            elts = node.value.elts
            if elts and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elts) \
                    and any("bias" in e.value for e in elts):
                lines.append(node.lineno)
    return lines[0] if len(lines) == 1 else None


def _decay_key_misspelt(a, opt) -> bool:
    """Whether a param group of the optimizer spells ``weight_decay`` wrong (``weight_deacy``):
    its decay is the default for a reason param-group-key-unread reports."""
    return any(misspells(key, "weight_decay", e.get("settings") or ())
               for e in a.of_kind("optimizer_init") if e["opt"] == opt
               for keys in e.get("unread") or () for key, _ in keys or ())
