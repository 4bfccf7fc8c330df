from __future__ import annotations

from ..findings import Edit, Role, Safety, Severity
from .base import Rule, related


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _limit_text(limit: float) -> str:
    return f"{limit:g}"


class ClipZeroesGradients(Rule):
    """
    ## What it does
    Finds gradient clips whose limit is zero or negative — `clip_grad_norm_(params, 0)`,
    `clip_grad_value_(params, 0)`, a negative `max_norm` — on gradients an optimizer step then
    applies. It points at the clip. A clip whose gradients were already applied, or that is
    never followed by a step, is left to the other clipping rules.

    ## Why is this bad?
    Clipping has no "off" value: `clip_grad_norm_` multiplies every gradient by
    `max_norm / total_norm` (at most 1), so `max_norm=0` makes every gradient zero and a
    negative one reverses them — the optimizer climbs the loss. `clip_grad_value_` clamps to
    `[-v, v]`: zero for `v=0`, a constant for a negative `v`. The usual cause is a command-line
    option whose default of 0 was meant as "no clipping". The script runs, the loss never goes
    down (or goes up), and the logged norm looks healthy: it is measured before the clip.

    ## Example
    ```python
    parser.add_argument("--clip", type=float, default=0.0)  # 0 = off
    ...
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    optimizer.step()
    ```

    ## Use instead
    ```python
    loss.backward()
    if args.clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    optimizer.step()
    ```

    ## Stays silent on
    A clip option whose 0 means off guarding the call; a clip with an infinite `max_norm`
    that only measures the norm; a positive clip value.
    """

    code = "GD218"
    slug = "clip-zeroes-gradients"
    severity = Severity.ERROR
    summary = ("a gradient clip with a limit of 0 (or below) zeroes (or reverses) every gradient "
               "the optimizer step then applies")
    fix = "clip only with a positive limit: guard the call with `if max_norm > 0:`, or pass a positive max_norm"
    # unsafe: a limit of 0 may also have been a typo for a real limit, which the guard skips
    fix_safety = Safety.UNSAFE

    def autofix(self, finding, src):
        """Guard the clip with the script's own limit: ``if args.clip > 0:`` around a clip
        statement whose result is not kept (a kept norm would be undefined when skipped). A
        literal limit gets no edit: the right value is the user's to choose."""
        given = finding.evidence.get("argument")
        if not given or _is_number(given) or finding.location is None:
            return None
        s = src.statement_at(finding.location.line)
        body = getattr(s.node, "body", None) if s is not None else None
        if not body or len(body) != 1 or type(body[0]).__name__ != "Expr" \
                or type(body[0].value).__name__ != "Call":
            return None
        indent = src.indent(s)
        text = f"{indent}if {given} > 0:\n" + "".join(
            f"{indent}    {line}" if line.strip() else line for line in src.stmt_lines(s))
        end = s.end_line + 1
        last = src.line_text(s.end_line)
        if end > len(src.lines) and not last.endswith("\n"):
            edit = Edit(src.path, s.line, 0, s.end_line, len(last), text.rstrip("\n"))
        else:
            edit = Edit(src.path, s.line, 0, end, 0, text)
        return self.edit(f"clip only when {given} > 0", edit)

    def check(self, a):
        groups: dict = {}
        for state in a.ledger.clips:
            clip = state.clip
            limit = clip.get("limit")
            if not isinstance(limit, (int, float)) or not limit <= 0:
                continue  # positive, inf (a norm only) or NaN (torch raises or warns)
            applied = [p for p in state.unused if p in set(clip.get("with_grad") or ())]
            if applied:
                groups.setdefault(clip.loc, []).append((clip, applied))
        for loc, items in groups.items():
            clip, applied = items[0]
            via, limit = clip.get("via") or "clip_grad_norm_", float(clip.get("limit"))
            by_value = via == "clip_grad_value_"
            name = "clip_value" if by_value else "max_norm"
            if by_value:
                effect = ("clamps every gradient to [0, 0]: each becomes zero" if limit == 0 else
                          f"clamps every gradient to [{_limit_text(-limit)}, {_limit_text(limit)}], "
                          f"an empty range: each element becomes {_limit_text(limit)}, whatever the loss")
            else:
                effect = ("multiplies every gradient by max_norm / total_norm = 0: each becomes zero"
                          if limit == 0 else
                          "multiplies every gradient by max_norm / total_norm, a negative factor: "
                          "each points the other way and the optimizer climbs the loss")
            step = next((e for e in a.by_kind.get("step", ()) if e.seq > clip.seq and not e.get("skipped")), None)
            given = (a.source.call_argument(loc.path, loc.line, via, 1, name)
                     if loc is not None else None)
            shown = given if given and given != _limit_text(limit) else None
            if limit == 0:
                outcome = (f"the step updates {a.names(applied)} with zero gradients (only weight "
                           f"decay or momentum still moves them)")
            elif by_value:
                outcome = f"the step updates {a.names(applied)} with a constant that ignores the loss"
            else:
                outcome = f"the step moves {a.names(applied)} up the loss instead of down"
            message = (f"this {via}() gets {name}={_limit_text(limit)}"
                       + (f" (from {shown})" if shown else "")
                       + f" and {effect}; {outcome} — clipping has no 'off' value")
            if shown:
                fix = (f"clip only when the limit is positive: `if {shown} > 0:` around the "
                       f"{via}() call ({name}={_limit_text(limit)} does not turn clipping off)")
            else:
                fix = f"pass a positive {name} (1.0 is common), or remove the clip"
            yield self.finding(
                message, loc, fix=fix,
                related=(related(step, "the step that applies the clipped gradients", Role.STEP),),
                step=a.next_step_number(clip.seq),
                evidence={"clip": via, "limit": limit, "argument": given,
                          "params": [a.param_name(p) for p in dict.fromkeys(applied)],
                          "occurrences": a.count(c for c, _ in items)})
