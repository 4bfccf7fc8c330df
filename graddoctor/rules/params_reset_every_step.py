from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Related, Rule, related
from ..analysis.source import walk

# a step_edit (instrument/undo.py) whose every measured update was taken back: the edit's
# change points against the step's (cosine) and is nearly as long
_BACK = 0.97
_SHARE = 0.9
# ... or pulled back toward the values before the first step by a fixed share of the way
_HOME = 0.99
_MEASURED = 3  # updates measured at least


class ParamsResetEveryStep(Rule):
    """
    ## What it does
    Finds parameters an optimizer steps that the script sets back between every two of its
    steps: re-initialised with `torch.nn.init` (a layer initialised in `forward`,
    `model.apply(init_weights)` inside the loop), reloaded from the same, unchanged state
    dict (`model.load_state_dict(initial_state)` in the loop), or edited by hand so that the
    update is taken back: the trained model overwritten by its EMA copy (`p.lerp_(ema_p,
    0.999)`), the initial values copied back (`p.copy_(p0)`), a projection that maps every
    update back onto the starting point. For the last ones the values of each optimizer's
    first updates are compared: the change the step made and the change the script's own
    code made before the next step. It points at that call or edit. An edit that pulls the
    parameters a fixed share of the way back to their initial values after every step (an EMA
    update written the wrong way round, `p.mul_(d).add_(ema_p, alpha=1 - d)` with an EMA
    copy that never changes) is a warning: the model cannot move far from where it started.
    Where the update reads right for the copy (`ema_p.mul_(d).add_(p, ...)`) but the loop
    around it binds the names the wrong way round (`for ema_p, p in zip(model.parameters(),
    ema.parameters())`), it points at the loop, whose zip's arguments are to swap; where the
    update sits in a function of the script whose one call passes the model and its copy in
    each other's places (`def update_ema(model, ema_model, d)` called as
    `update_ema(ema_model, model, d)`), it points at that call.
    Values re-drawn by hand (`w.data.normal_(0, 0.02)` in a `reset()` the loop calls,
    `p.data = torch.randn_like(p)`, `b.data.zero_()`) are found the same way: after every
    measured update, a tensor's values are replaced by ones unrelated to them (their cosine
    within ±0.3, the change larger than the step's); it points at the loop's call of the
    function that does it, or at the write.

    ## Why is this bad?
    Each update is undone before the next one: the parameters never get further than one step
    from their initial (or random) values. The loss is computed and backpropagated every
    iteration, the optimizer steps, and the model does not learn.

    ## Example
    ```python
    def forward(self, x):
        nn.init.xavier_uniform_(self.fc.weight)
        return self.fc(x)
    ```

    ## Use instead
    ```python
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)
        nn.init.xavier_uniform_(self.fc.weight)

    def forward(self, x):
        return self.fc(x)
    ```

    ## Stays silent on
    Initialisation before the first step; a part re-initialised now and then (a new stage, dead
    units revived every N steps); a best checkpoint restored once; a new state loaded every step
    (federated averaging: the global weights change between rounds); a state dict loaded into a
    copy no optimizer owns (an EMA or SWA model); an EMA of a separate copy; weight clipping
    (WGAN), max-norm and unit-norm projections; Lookahead's pull toward its slow weights every
    k steps; magnitude pruning with a fixed mask, weight noise, weight standardisation and sign
    binarisation between steps (the values are kept, rescaled or masked); a head re-drawn every
    few steps, not after each one. Tensors of a few elements can miss the re-draw test (two
    unrelated short vectors are often close by chance), and only 16 tensors are sampled.
    """

    code = "GD123"
    slug = "params-reset-every-step"
    severity = Severity.ERROR
    summary = ("stepped parameters are re-initialised or reloaded between every two steps: each "
               "update is undone")
    fix = ("initialise (or load) the parameters once, before the training loop, not in forward() "
           "or in the loop")

    def check(self, a):
        reported: set[int] = set()
        for finding, opt in self._resets(a):
            reported.add(opt)
            yield finding
        for edit in a.by_kind.get("step_edit", ()):
            if edit["opt"] not in reported:
                finding = self._edited(a, edit)
                if finding is not None:
                    reported.add(edit["opt"])
                    yield finding

    def _resets(self, a):
        resets = a.by_kind.get("param_reset", ())
        if not resets:
            return
        by_opt: dict[int, list] = {}
        for step in a.steps:
            if not step.get("skipped"):
                by_opt.setdefault(step["opt"], []).append(step)
        for opt, steps in by_opt.items():
            if a.count(steps) < 3:
                continue
            owned = set(a.opt_params.get(opt, ()))
            hits = []
            for before, after in zip(steps, steps[1:]):
                found = [e for e in a.span(before.seq + 1, after.seq - 1)
                         if e.kind == "param_reset" and owned.intersection(e.get("params") or ())
                         and _undoes(e, resets)]
                if not found:
                    break
                hits.append((found[0], after))
            else:
                yield self._finding(a, opt, steps, hits), opt

    def _finding(self, a, opt, steps, hits):
        reset, step = hits[0]
        pids = list(dict.fromkeys(p for e, _ in hits for p in e.get("params") or ()
                                  if p in set(a.opt_params.get(opt, ()))))
        cls = a.optimizer_class(opt) or "the optimizer"
        how = ("reloads the same saved state into" if reset["via"] == "load_state_dict"
               else f"re-initialises ({reset['via'].rsplit('.', 1)[-1]})")
        times = a.count(steps)
        return self.finding(
            f"this call {how} {a.names(pids)} between every two of the {times} steps of {cls}: "
            f"each update is undone before the next, so the model never trains",
            reset.loc,
            related=(related(step, "a step whose update it undoes"),),
            step=a.step_number.get(step.seq),
            evidence={"params": a.param_names(pids), "via": reset["via"], "steps": times},
            fix=("load the saved state once, before the training loop (keep the copy only to "
                 "compare against or to restore at the end)" if reset["via"] == "load_state_dict"
                 else "initialise the parameters once, in __init__ or before the training loop, "
                      "not in forward() or inside the loop"))


    def _edited(self, a, edit):
        back, share = edit["back"], edit["share"]
        home, home_share = edit["home"], edit["home_share"]
        if len(back) < _MEASURED:
            return None
        redrawn = _redrawn_every_time(edit)
        if redrawn:
            return self._redrawn(a, edit, redrawn)
        undone = all(b is not None and b >= _BACK for b in back) and all(
            s is not None and s >= _SHARE for s in share)
        pulled = not undone and all(h is not None and h >= _HOME for h in home) and all(
            s is not None and s > 0 for s in home_share)
        if not (undone or pulled):
            return None
        opt = edit["opt"]
        pids = list(a.opt_params.get(opt, ()))
        cls = a.optimizer_class(opt) or "the optimizer"
        where = _edit_line(a, opt, edit.loc)
        loc = where[0] if where is not None else edit.loc
        shown = f" (`{where[1]}`)" if where is not None else ""
        swapped = (_zip_swapped(a, opt, where) or _call_swapped(a, opt, where)) if pulled else None
        n = len(back)
        evidence = {"params": a.param_names(pids), "via": "hand edit", "steps": n,
                    "back": back, "share": share, "home": home, "home_share": home_share}
        if undone:
            mean = sum(share) / n
            return self.finding(
                f"between each of the first {n} steps of {cls} and the next, the script's own "
                f"code{shown} moves {a.names(pids)} back against the update the step made "
                f"(by {mean:.0%} of it): each update is undone before the next, so the model "
                f"never trains",
                loc, related=(related(edit, "the step after the updates measured"),),
                evidence=evidence, fix=_fix(where, undone=True))
        if _loads_moving_state(a, opt):
            return None  # pulled toward weights that move on each round (federated averaging)
        fraction = sorted(home_share)[n // 2]
        return self.finding(
            f"after every one of the first {n} steps of {cls}, the script's own code{shown} pulls "
            f"{a.names(pids)} {fraction:.2%} of the way back to their values before the first "
            f"step (as an EMA update written the wrong way round does: the model blended into a "
            f"copy that never changes): the model can never get further than about "
            f"{1 / fraction:,.0f} steps' worth of updates from its initial weights"
            + (f": the update reads right, but {swapped[1]} binds the copy's name to "
               f"the model's parameters and the model's name to the copy's" if swapped else ""),
            swapped[0] if swapped else loc,
            related=(related(edit, "the step after the updates measured"),)
            + ((Related(loc, "the update that writes the model"),) if swapped else ()),
            severity=Severity.WARNING, evidence=evidence,
            fix=swapped[2] if swapped else _fix(where, undone=False))


    def _redrawn(self, a, edit, pids):
        opt = edit["opt"]
        n = len(edit["redrawn"])
        cls = a.optimizer_class(opt) or "the optimizer"
        where = _edit_call(a, edit.loc) or _edit_line(a, opt, edit.loc)
        loc = where[0] if where is not None else edit.loc
        shown = f" (`{where[1]}`)" if where is not None else ""
        return self.finding(
            f"between each of the first {n} steps of {cls} and the next, the script's own "
            f"code{shown} replaces the values of {a.names(pids)} with values unrelated to them "
            f"(a re-initialisation by hand): each update to them is discarded before the next, "
            f"so they never train",
            loc, related=(related(edit, "the step after the updates measured"),),
            evidence={"params": a.param_names(pids), "via": "redrawn by hand", "steps": n},
            fix=("initialise the parameters once, in __init__ or before the training loop; "
                 "between steps leave them as the optimizer left them"))


def _loads_moving_state(a, opt) -> bool:
    """Whether the optimizer's parameters are loaded, between its steps, from states that differ
    from load to load: a client pulled to the global weights of federated averaging, which the
    rounds move on, is no blend into a copy that never changes."""
    owned = set(a.opt_params.get(opt, ()))
    states = [e.get("state") for e in a.by_kind.get("param_reset", ())
              if e["via"] == "load_state_dict" and owned.intersection(e.get("params") or ())]
    return len(states) >= 2 and None not in states and len(set(map(repr, states))) == len(states)


def _redrawn_every_time(edit) -> list[int]:
    """The parameters an edit replaced by unrelated values after every measured update."""
    rows = edit.get("redrawn") or []
    if len(rows) < _MEASURED or not all(rows):
        return []
    common = set(rows[0]).intersection(*map(set, rows[1:]))
    return [p for p in rows[0] if p in common]


def _edit_call(a, step_loc) -> tuple[Location, str] | None:
    """The call in the loop around the step into a function of the step's file that writes
    parameters by hand (``model.reset()`` whose body runs ``w.data.normal_()``)."""
    if step_loc is None:
        return None
    path = step_loc.path
    loop = a.source.innermost_loop(path, step_loc.line)
    tree = a.source.tree(path)
    if loop is None or tree is None:
        return None
    writes = {w[0] for w in a.source.param_writes(path)}
    writers = {f.name for f in walk(tree)
               if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
               and any(f.lineno <= line <= (f.end_lineno or f.lineno) for line in writes)
               and not (f.lineno <= loop[0] <= (f.end_lineno or f.lineno))}
    for node in walk(tree):
        if isinstance(node, ast.Call) and loop[0] <= node.lineno <= loop[1]:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else \
                node.func.id if isinstance(node.func, ast.Name) else None
            if name in writers:
                text = a.source.line_text(path, node.lineno).strip()
                if "'" not in text and '"' not in text:
                    text = text.split("#", 1)[0].rstrip()
                return Location(path, node.lineno), text
    return None


def _roots(text: str | None) -> set[str]:
    try:
        return {n.id for n in walk(ast.parse(text or "", mode="eval")) if isinstance(n, ast.Name)}
    except SyntaxError:
        return set()


def _edit_line(a, opt, step_loc) -> tuple[Location, str] | None:
    """The script's statement that writes the optimizer's parameters by hand: one in the loop
    around the step, else in the step's file, whose tensor is (or a loop takes it from) what the
    optimizer was built over; else the only such statement there. None when none is found."""
    if step_loc is None:
        return None
    path = step_loc.path
    writes = a.source.param_writes(path)
    if not writes:
        return None
    init = a.optimizers.get(opt)
    roots: set[str] = set()
    if init is not None and init.loc is not None and init.loc.path == path:
        roots = _roots(a.source.call_argument(path, init.loc.line, init.get("cls"), 0, "params"))
    roots -= {"torch", "filter", "list", "lambda", "p"}
    loop = a.source.innermost_loop(path, step_loc.line)
    inside = [w for w in writes if loop is not None and loop[0] <= w[0] <= loop[1]]
    for group in (inside, writes):
        ours = [w for w in group if w[1] in roots or (_roots(w[3]) & roots)]
        if ours:
            return Location(path, ours[0][0]), ours[0][2]
    for group in (inside, writes):
        if len(group) == 1:
            return Location(path, group[0][0]), group[0][2]
    return None


_COPY_NAMES = re.compile(r"ema|avg|average|shadow|target|tgt|teacher|copy|slow|momentum", re.I)


def _zip_swapped(a, opt, where) -> tuple[Location, str, str] | None:
    """``(the loop's line, its header, the fix)`` when the statement that pulls the model back is
    an EMA update written for the copy (``p_ema.mul_(d).add_(p, ...)``, its written name one of a
    copy) inside ``for p_ema, p in zip(model.parameters(), ema.parameters())``: the names are
    bound the wrong way round, the update reads right."""
    if where is None:
        return None
    loc, text = where
    init = a.optimizers.get(opt)
    if init is None or init.loc is None or init.loc.path != loc.path:
        return None
    roots = _roots(a.source.call_argument(loc.path, init.loc.line, init.get("cls"), 0, "params"))
    roots -= {"torch", "filter", "list", "lambda", "p"}
    tree = a.source.tree(loc.path)
    written = re.match(r"\s*([A-Za-z_][A-Za-z_0-9]*)", text or "")
    if tree is None or not roots or written is None or not _COPY_NAMES.search(written.group(1)):
        return None
    loops = [n for n in walk(tree) if isinstance(n, ast.For)
             and n.lineno < loc.line <= (n.end_lineno or n.lineno)
             and isinstance(n.target, ast.Tuple) and len(n.target.elts) == 2
             and all(isinstance(e, ast.Name) for e in n.target.elts)
             and isinstance(n.iter, ast.Call) and isinstance(n.iter.func, ast.Name)
             and n.iter.func.id == "zip" and len(n.iter.args) == 2]
    if not loops:
        return None
    loop = max(loops, key=lambda n: n.lineno)
    names = [e.id for e in loop.target.elts]
    if written.group(1) not in names:
        return None
    side = names.index(written.group(1))
    if not (_roots(ast.unparse(loop.iter.args[side])) & roots) \
            or _roots(ast.unparse(loop.iter.args[1 - side])) & roots:
        return None
    first, second = (ast.unparse(arg) for arg in loop.iter.args)
    header = f"for {names[0]}, {names[1]} in zip({first}, {second})"
    return (Location(loc.path, loop.lineno), f"the loop `{header}`",
            f"swap the zip's arguments: `for {names[0]}, {names[1]} in zip({second}, {first})`, so "
            f"`{written.group(1)}` is the copy's parameter and the copy moves toward the model")


def _call_swapped(a, opt, where) -> tuple[Location, str, str] | None:
    """``(the call's line, what it does, the fix)`` when the statement that pulls the model back
    sits in a function of the script (``def update_ema(model, ema_model, decay)``) whose one call
    passes the model and its copy in each other's places (``update_ema(ema_model, model,
    decay)``): two parameters given each other's names, one of them the model the optimizer
    steps. The function reads right; the call is the line to change."""
    if where is None:
        return None
    loc, _ = where
    init = a.optimizers.get(opt)
    tree = a.source.tree(loc.path)
    if tree is None or init is None or init.loc is None or init.loc.path != loc.path:
        return None
    roots = _roots(a.source.call_argument(loc.path, init.loc.line, init.get("cls"), 0, "params"))
    roots -= {"torch", "filter", "list", "lambda", "p"}
    functions = [n for n in walk(tree) if isinstance(n, ast.FunctionDef)
                 and n.lineno < loc.line <= (n.end_lineno or n.lineno)]
    if not roots or not functions:
        return None
    function = max(functions, key=lambda n: n.lineno)
    params = [arg.arg for arg in function.args.posonlyargs + function.args.args]
    calls = [n for n in walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == function.name]
    if len(calls) != 1:
        return None
    call = calls[0]
    given = [arg.id if isinstance(arg, ast.Name) else None for arg in call.args]
    for i, name in enumerate(given[:len(params)]):
        if name is None or name == params[i] or name not in params:
            continue
        j = params.index(name)
        if j < len(given) and given[j] == params[i] and ({params[i], name} & roots):
            fixed = list(call.args)
            fixed[i], fixed[j] = fixed[j], fixed[i]
            shown = ", ".join([ast.unparse(arg) for arg in fixed]
                              + [ast.unparse(kw) for kw in call.keywords])
            return (Location(loc.path, call.lineno),
                    f"the call `{ast.unparse(call)}`",
                    f"swap the arguments: `{function.name}({shown})` gives "
                    f"`{function.name}` the model as `{params[min(i, j)]}` and the copy as "
                    f"`{params[max(i, j)]}`, so the copy moves toward the model")
    return None


def _fix(where, undone: bool) -> str:
    text = where[1] if where is not None else ""
    if any(op in text for op in ("lerp_", "mul_", ".add_")) or not undone:
        return ("update the copy from the model, not the model from the copy: "
                "`ema_p.mul_(d).add_(p, alpha=1 - d)` (or `ema_p.lerp_(p, 1 - d)`), and leave the "
                "trained parameters as the optimizer left them")
    if re.search(r"copy_\(\s*[\w.\[\]]+\s*\)", text) or "load_state_dict" in text:
        return ("restore the saved values once, before the training loop (or only to evaluate, "
                "then put the trained values back), not between the steps")
    return ("leave the trained parameters as the optimizer left them between steps: an edit "
            "that maps each update back undoes it")


def _undoes(event, resets) -> bool:
    """An initialiser always discards the values; a load_state_dict only when it loads the same
    unchanged state as a load before it (a state that changes, e.g. federated averaging's
    global weights, moves the parameters on)."""
    if event["via"] != "load_state_dict":
        return True
    state = event.get("state")
    return state is not None and any(
        e.get("state") == state for e in resets if e.seq < event.seq and e["via"] == "load_state_dict")
