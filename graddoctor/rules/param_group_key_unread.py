from __future__ import annotations

import ast
import dataclasses

from ..findings import Severity
from ..analysis.optimizer_settings import TORCH_SETTINGS, meant_setting
from .base import Rule, related
from ..analysis.source import walk

def key_sites(tree, key: str) -> tuple[bool, list[int]]:
    """Whether the script reads the key itself (``group["lr_mult"]``, ``g.get("LR")``: its own
    scheduler or update uses it), and the lines that write it into a dict (``"LR": 1e-2``,
    ``dict(LR=1e-2)``)."""
    read, written = False, []
    for node in walk(tree) if tree is not None else ():
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and node.slice.value == key and not isinstance(node.ctx, ast.Store):
            read = True
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "pop", "setdefault") and node.args \
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == key:
            read = True
        elif isinstance(node, ast.Dict):
            written.extend(k.lineno for k in node.keys
                           if isinstance(k, ast.Constant) and k.value == key)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "dict":
            written.extend(k.value.lineno for k in node.keywords if k.arg == key)
    return read, written


class ParamGroupKeyUnread(Rule):
    """
    ## What it does
    Finds a param group given to one of torch's optimizers with a key its step never reads
    that is meant as one of its settings: a misspelling (`"LR"`, `"weight_deacy"`,
    `"learning_rate"`, `"maximise"`) or a setting of another update rule (`"momentum"` in an
    Adam group, `"betas"` in an SGD group), when the optimizer steps after it.

    ## Why is this bad?
    torch's optimizers fill each param group's settings from their defaults
    (`group.setdefault("lr", defaults["lr"])`) and keep any other key without a word. A
    misspelt key is never read: that group trains with the default value (a head meant to
    learn at 1e-2 crawls at the backbone's 1e-5, a decay meant to be 0 stays 0.01).

    ## Example
    ```python
    optimizer = torch.optim.AdamW([
        {"params": backbone.parameters()},
        {"params": head.parameters(), "LR": 1e-2},
    ], lr=1e-5)
    ```

    ## Use instead
    ```python
    optimizer = torch.optim.AdamW([
        {"params": backbone.parameters()},
        {"params": head.parameters(), "lr": 1e-2},
    ], lr=1e-5)
    ```

    ## Stays silent on
    Keys of the script's own that are no setting's spelling (`"name"`, `"lr_scale"`,
    `"layer_id"`); a key the script reads itself (`group["lr_mult"]` in its own scheduler); keys
    torch's schedulers add (`initial_lr`, `max_lr`); an optimizer class whose step is not
    torch's (it may read any key); an optimizer that never steps after it.
    """

    code = "GD324"
    slug = "param-group-key-unread"
    severity = Severity.WARNING
    summary = ("a param group holds a misspelt or foreign setting (\"LR\", \"weight_deacy\", "
               "momentum for Adam) that torch's step never reads")
    fix = "spell the key as the optimizer names its setting (`\"lr\"`, `\"weight_decay\"`)"

    def check(self, a):
        for event in a.of_kind("optimizer_init"):
            unread, settings = event.get("unread"), event.get("settings") or []
            if not unread:
                continue
            later = [s for s in a.steps
                     if s["opt"] == event["opt"] and s.seq > event.seq and not s.get("skipped")]
            if not later:
                continue
            tree = a.source.tree(event.loc.path) if event.loc is not None else None
            before = sum(1 for e in a.of_kind("optimizer_init")
                         if e["opt"] == event["opt"] and e.seq < event.seq)
            groups = sum(1 for e in a.of_kind("optimizer_init") if e["opt"] == event["opt"])
            for index, keys in enumerate(unread):
                for key, value in keys or ():
                    read, written = key_sites(tree, key)
                    if read:
                        continue
                    meant = meant_setting(key, settings)
                    foreign = meant is None and key in TORCH_SETTINGS
                    if meant is None and not foreign:
                        continue
                    line = written[0] if len(written) == 1 else None
                    yield self._finding(a, event, index, before + index, groups, key, value,
                                        meant, later, line)

    def _finding(self, a, event, local, index, groups, key, value, meant, later, line):
        cls = event["cls"]
        shown = f" = {value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
        group = f"param group {index}" if groups > 1 else "its param group"
        steps = a.count(later)
        if meant is not None:
            kept = _group_value(event, local, meant)
            why = (f'`"{key}"{shown}` in {group} of {cls} is not a setting of {cls}, which names '
                   f'it `"{meant}"`: torch fills `"{meant}"` from the optimizer\'s default'
                   + (f" ({kept})" if kept else "")
                   + f' and never reads `"{key}"`, so that group trains with the default '
                   f"{meant} in all {steps} update{'s' if steps != 1 else ''}")
            fix = f'rename the key to `"{meant}"`'
        else:
            why = (f'`"{key}"{shown}` in {group} of {cls} is a setting of other optimizers, not '
                   f"of {cls}: its step never reads it, so none of the {steps} "
                   f"update{'s' if steps != 1 else ''} uses it")
            fix = (f'drop `"{key}"` or use an optimizer whose update has it '
                   f'(`{cls}` reads: {", ".join(sorted(event.get("settings") or [])[:8])})')
        loc = event.loc if line is None else dataclasses.replace(event.loc, line=line)
        return self.finding(why, loc,
                            related=(related(event, f"{cls} is built here"),
                                     related(later[0], f"the first {cls} step")),
                            evidence={"optimizer": cls, "key": key, "value": value,
                                      "meant": meant, "group": index, "steps_after": steps},
                            fix=fix)


def _group_value(event, index: int, setting: str) -> str | None:
    if setting == "lr":
        lrs = event.get("lrs") or []
        if index < len(lrs) and isinstance(lrs[index], (int, float)):
            return f"lr {lrs[index]:g}"
        return None
    hyper = event.get("hyper") or []
    if index < len(hyper) and hyper[index] and setting in hyper[index]:
        return f"{setting} {hyper[index][setting]}"
    return None
