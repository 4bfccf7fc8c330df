"""Gradients changed in place by code graddoctor does not watch.

``p.grad /= k``, a hand-written unscale or clip, or a manual all-reduce change a ``.grad``
between the last backward and the step. graddoctor notices it from the grad tensor's identity
and version counter (never its values): before each clip (here) and right before each optimizer
step (in the optimizer watcher's per-step pass, ``optim.grad_norms``, which emits ``grad_edit``).
Rules use it to stay quiet where the user rescaled gradients by hand.
"""

from __future__ import annotations

from .recorder import Recorder


def edited_pids(rec: Recorder, pids) -> list[int]:
    """Params whose ``.grad`` is no longer what graddoctor last saw, nor what zero_grad left."""
    known, zeroed = rec.known_grad, rec.zeroed_grad
    return [pid for pid, state in rec.grad_states(pids)
            if state != known.get(pid) and state != zeroed.get(pid)]
