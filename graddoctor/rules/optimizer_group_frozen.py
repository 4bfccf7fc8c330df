from __future__ import annotations

import ast
import re
from dataclasses import replace

from ..findings import Severity
from .base import Rule, plural, related
from ..analysis.source import walk

MIN_STEPS = 2  # updates of the optimizer after its construction

# the script says something about freezing somewhere: a frozen group may then be on purpose
# (frozen for now, unfrozen later; a flag that freezes a backbone)
_FREEZING = re.compile(r"requires_grad|freez", re.IGNORECASE)


class OptimizerGroupFrozen(Rule):
    """
    ## What it does
    Finds a param group given to an optimizer at its construction whose parameters all have
    `requires_grad=False` and get no gradient in any backward of the run, in a script that never
    freezes or unfreezes anything itself (its source mentions neither `requires_grad` nor
    `freeze`): the parameters were frozen by a library's default, and the script, which gave
    them a param group of their own (or the optimizer's only group), means to train them. The
    usual cause is `nn.Embedding.from_pretrained(weights)`, whose `freeze` defaults to True.

    ## Why is this bad?
    A parameter that does not require grad gets no `.grad`, and torch's optimizers skip a
    parameter without one: the pretrained table (or layer) never changes, while its param
    group's lr and weight decay suggest it is being fine-tuned. Nothing fails; the model is
    just worse than the fine-tuning it was meant to be.

    ## Example
    ```python
    self.emb = nn.Embedding.from_pretrained(vectors)         # freeze=True by default
    ...
    optimizer = torch.optim.Adam([{"params": model.emb.parameters(), "lr": 1e-4},
                                  {"params": model.head.parameters(), "lr": 1e-3}])
    ```

    ## Use instead
    ```python
    self.emb = nn.Embedding.from_pretrained(vectors, freeze=False)
    ```

    ## Stays silent on
    A script that freezes or unfreezes parameters itself (`requires_grad_(False)`,
    `freeze=True` written out, progressive unfreezing later), a frozen parameter in a group
    with trainable ones (`model.parameters()`: handing frozen weights to the optimizer is
    harmless), a group that gets a gradient at some backward, a group added mid-run
    (`added-group-frozen`), and an optimizer stepped fewer than two times.
    """

    code = "GD145"
    slug = "optimizer-group-frozen"
    severity = Severity.WARNING
    summary = ("a param group given to the optimizer holds only parameters a library froze "
               "(Embedding.from_pretrained's freeze=True): they get no gradient and never train")
    fix = ("set requires_grad=True on those parameters (p.requires_grad_(True)), or leave them out "
           "of the optimizer if they are meant to stay fixed")

    def check(self, a):
        first_step: dict[int, int] = {}
        for step in a.steps:
            first_step.setdefault(step.get("opt"), step.seq)
        texts: dict[str, bool] = {}
        for event in a.by_kind.get("optimizer_init", ()):
            opt = event.get("opt")
            pids = list(event.get("params") or ())
            started = first_step.get(opt)
            if not pids or started is None or started < event.seq or event.loc is None:
                continue  # added after a step: added-group-frozen's
            if not all(pid in a.params and a.params[pid].get("requires_grad") is False
                       for pid in pids):
                continue
            later = [s for s in a.steps if s.seq > event.seq and s.get("opt") == opt
                     and not s.get("skipped")]
            updates = sum(a.weight(s) for s in later)
            if updates < MIN_STEPS:
                continue
            end = a.events[-1].seq + 1
            if any(a.last_writer(pid, end) is not None for pid in pids):
                continue  # unfrozen at some point: a backward wrote them
            path = event.loc.path
            if path not in texts:
                texts[path] = _mentions_freezing(a, path)
            if texts[path]:
                continue
            yield self._finding(a, event, opt, pids, updates, later)

    def _finding(self, a, event, opt, pids, updates, later):
        path = event.loc.path
        pretrained = [(line, text) for line, text, _fwd in a.source.calls_named(path, ("from_pretrained",))
                      if "Embedding" in text]
        groups = sum(1 for e in a.by_kind.get("optimizer_init", ()) if e.get("opt") == opt)
        which = "its only param group" if groups == 1 else "a param group of its own"
        name = a.optimizer_name(opt)
        one = len(pids) == 1
        message = (f"{name} is given {plural(len(pids), 'parameter')} ({a.names(pids)}) in "
                   f"{which}, but {'it does' if one else 'they do'} not require grad and got no "
                   f"gradient in its {plural(updates, 'update')}: the optimizer skips a parameter "
                   f"without .grad, so {'it never trains' if one else 'they never train'}")
        loc, fix = event.loc, None
        rel = (related(later[0], f"a step that skips {'it' if one else 'them'}"),)
        if len(pretrained) == 1:
            line, text = pretrained[0]
            loc = replace(event.loc, line=line, function="", via="", hook="")
            cls = (re.search(r"(\w*Embedding\w*)\.from_pretrained", text) or [None, "Embedding"])[1]
            message += (f"; `{text}` froze {'it' if one else 'them'}: "
                        f"{cls}.from_pretrained's freeze defaults to True")
            fix = (f"pass freeze=False to nn.{cls}.from_pretrained to fine-tune the table, or "
                   "leave it out of the optimizer if it is meant to stay fixed")
            rel = (related(event, f"{name}'s param group that holds it"), *rel)
        return self.finding(message, loc, step=a.step_number.get(later[0].seq), related=rel,
                            fix=fix, evidence={"params": a.param_names(pids, 16), "opt": opt,
                                               "groups": groups, "updates": updates})


def _mentions_freezing(a, path: str) -> bool:
    """The script's code (not its comments or strings) names ``requires_grad`` or anything
    with "freez" in it: a name, an attribute, a keyword argument, a function."""
    tree = a.source.tree(path)
    if tree is None:
        return True  # cannot read it: assume the script freezes on purpose
    for node in walk(tree):
        name = node.id if isinstance(node, ast.Name) else \
            node.attr if isinstance(node, ast.Attribute) else \
            node.arg if isinstance(node, ast.keyword) else \
            node.name if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
        if name and _FREEZING.search(name):
            return True
    return False
