"""Optimizers whose steps are crossed (``Analysis.crossings``): each loss's backward followed by
the step of the optimizer that trains the *other* model.

Read from the ledger's phases (analysis/ledger.py, ``Phase``). A crossing is two optimizers X
and Y over disjoint parameters and two phases P and Q of one thread, Q the first later phase in
which Y steps, where

* in P, X steps although P's backwards wrote none of X's parameters, while they wrote
  parameters of Y, and Y does not step in P;
* in Q, Y steps and Q's backwards wrote parameters of X, while X does not step in Q.

So X applies whatever its parameters held (another phase's gradient, or nothing: cleared just
before), and the gradient P gave Y waits for a step that comes after another loss's backward
(``opt_g, opt_d = self.optimizers()`` over ``configure_optimizers`` returning
``[opt_d, opt_g]``; ``d_loss.backward(); opt_g.step()``). Both halves are required: an
optimizer stepped without a gradient on its own (a head unused this iteration, a model whose
turn it is not) is stepped next to the optimizer that does get the phase's gradient, and a
model trained less often (a critic stepped five times per generator step) gets its gradient
from the phase it steps in.

Pure Python over the ``Analysis``; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..trace import Event

if TYPE_CHECKING:
    from . import Analysis
    from .ledger import Phase


@dataclass(frozen=True, eq=False)
class Crossing:
    """``starved`` (X's step in phase ``before``) got no gradient from that phase's backwards,
    which wrote ``lent`` (parameters of Y); ``late`` (Y's next step, in phase ``after``) follows
    backwards that wrote ``owed`` (parameters of X) while X did not step there."""

    starved: Event
    late: Event
    before: "Phase"
    after: "Phase"
    lent: tuple[int, ...]
    owed: tuple[int, ...]


def _applied(step: Event) -> bool:
    return not (step.get("skipped") or step.get("closure"))


def find_crossings(a: "Analysis") -> list[Crossing]:
    by_thread: dict = {}
    for phase in a.ledger.phases:
        by_thread.setdefault(phase.thread, []).append(phase)
    params = {opt: set(pids) for opt, pids in a.opt_params.items()}
    out: list[Crossing] = []
    for phases in by_thread.values():
        stepped = [{s["opt"] for s in p.steps if _applied(s)} for p in phases]
        for i, phase in enumerate(phases):
            if not phase.written:
                continue
            for step in phase.steps:
                x = step["opt"]
                mine = params.get(x)
                if not _applied(step) or not mine or mine & phase.written:
                    continue
                others = {o for pid in phase.written for o in a.owners.get(pid, ())} - stepped[i]
                for y in sorted(others):
                    theirs = params.get(y, set())
                    if y == x or theirs & mine:
                        continue
                    later = next((j for j in range(i + 1, len(phases)) if y in stepped[j]), None)
                    if later is None:
                        continue  # Y never steps again: optimizer-never-steps' matter
                    after = phases[later]
                    owed = mine & after.written
                    if not owed or x in stepped[later]:
                        continue
                    late = next(s for s in after.steps if s["opt"] == y and _applied(s))
                    out.append(Crossing(step, late, phase, after,
                                        tuple(sorted(theirs & phase.written)), tuple(sorted(owed))))
    return out


def explained_old_uses(a: "Analysis") -> set[tuple[int, int]]:
    """(step seq, pid) of the ledger's old uses a crossing accounts for: at a crossed step's
    line, the starved optimizer's parameters applying what they held, and the late optimizer's
    applying the gradient of the backward after which the other one stepped. Matched by line
    and optimizer, so the last turn (whose partner step the run never reached) counts too. The
    zero_grad rules leave those to the crossing: clearing more would not make the steps apply
    the right loss."""
    starved: set = set()
    late: dict = {}
    for c in a.crossings:
        starved.add((_where(c.starved), c.starved["opt"]))
        late.setdefault((_where(c.late), c.late["opt"]), set()).update(_where(b) for b in c.before.backwards)
    out: set[tuple[int, int]] = set()
    if not starved:
        return out
    for use in a.ledger.old_uses:
        key = (_where(use.step), use.opt)
        if key in starved and not use.fresh:
            out.add((use.step.seq, use.pid))
        elif key in late and all(_where(old.backward) in late[key] for old in use.old):
            out.add((use.step.seq, use.pid))
    return out


def _where(event: Event):
    return (event.loc.path, event.loc.line) if event.loc is not None else None
