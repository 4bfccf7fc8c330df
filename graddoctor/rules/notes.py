"""Run notes: remarks about the run itself, beside the findings (``run.notes`` in JSON, the
report's header). Each producer reads the analysis, like a rule, and returns its lines.

To add one: a function ``(analysis) -> list[str]`` and an entry in ``NOTE_PRODUCERS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ..analysis import Analysis


def short_epochs(a: "Analysis") -> list[str]:
    """Say when DataLoader epochs were replayed shorter than they are (``--epoch-batches``)."""
    short = [e for e in a.of_kind("epoch_start")
             if e.get("real_len") is not None and e.get("replay_len") is not None
             and e["replay_len"] < e["real_len"]]
    if not short:
        return []
    first = short[0]
    notes = [f"DataLoader epochs were replayed with {first['replay_len']} of their {first['real_len']} "
             f"batches (--epoch-batches; 0 replays full epochs)"]
    if not a.steps and a.backward_calls:
        notes.append("no optimizer step happened within those short epochs: if you accumulate over "
                     f"more than {first['replay_len']} batches, raise --epoch-batches")
    return notes


def short_len_crash(a: "Analysis") -> list[str]:
    """The script read the replay's shortened ``len(loader)`` and then crashed: the length may
    be why (``assert len(loader) % k == 0``), which the crash's own message cannot say."""
    reads = a.of_kind("short_len")
    if not reads or a.status != "crashed":
        return []
    first = reads[0]
    where = f" at {first.loc}" if first.loc else ""
    return [f"the script read len() of a DataLoader{where}, which the replay shortened to "
            f"{first['replay_len']} of its {first['real_len']} batches (--epoch-batches); if the "
            f"error comes from that length, --epoch-batches 0 replays whole epochs"]


def compiled(a: "Analysis") -> list[str]:
    """torch.compile hides the calls traced into a compiled graph."""
    calls = a.of_kind("compile")
    if not calls:
        return []
    where = ", ".join(sorted({str(e.loc) for e in calls if e.loc})) or "a library"
    note = (f"torch.compile was used ({where}): graddoctor sees zero_grad, backward and optimizer "
            f"steps at the graph breaks torch makes there; calls traced into a compiled graph "
            f"are not seen")
    if any(e.get("fullgraph") for e in calls):
        note += "; with fullgraph=True a graph that contains them cannot be checked"
    return [note]


def never_stepped(a: "Analysis") -> list[str]:
    """The replay was ended because backward calls went on without any optimizer step."""
    end = a.of_kind("run_end")
    if not end or end[-1].get("status") != "backward-limit":
        return []
    return [f"the replay was stopped after {a.backward_calls} backward calls: an optimizer was "
            f"created but never stepped"]


def no_optimizer(a: "Analysis") -> list[str]:
    """Backward calls but no torch.optim optimizer (a hand-written update): a limit of the
    check, not a bug of the script."""
    if a.optimizers or not a.backward_calls:
        return []
    return ["no torch.optim optimizer was seen: the update is written by hand, so graddoctor "
            "checks that its gradients are zeroed between updates and that its first updates go "
            "down the gradient, not the rest of what a step applies"]


NOT_A_GRADIENT = frozenset({"torch.func.functional_call"})  # runs a module with other tensors


def gradient_apis(events) -> list:
    """The ``functional_grad`` events of calls that compute gradients (torch.autograd.grad,
    torch.func.grad, ...; not functional_call)."""
    return [e for e in events if e.kind == "functional_grad" and e["api"] not in NOT_A_GRADIENT]


def _calls(events) -> str:
    sites: dict[str, list[str]] = {}
    for e in events:
        sites.setdefault(e["api"], []).append(str(e.loc) if e.loc else "a library")
    return ", ".join(f"{api} ({', '.join(where[:3])}{', ...' if len(where) > 3 else ''})"
                     for api, where in sites.items())


def functional_gradients(a: "Analysis") -> list[str]:
    """Gradients taken with torch.autograd.grad / torch.func: returned, not accumulated in
    .grad, so graddoctor does not follow them. Said loudly when they are all the script does."""
    taken = gradient_apis(a.of_kind("functional_grad"))
    if not taken:
        return []
    if not a.steps and not a.backward_calls:
        return [f"nothing was checked: the script takes its gradients with "
                f"{_calls(a.of_kind('functional_grad'))} and calls no backward() and no "
                f"optimizer step. graddoctor checks the gradients backward() accumulates in .grad "
                f"and the optimizer steps that apply them; the gradients these functions return, "
                f"and the updates made from them, are not followed"]
    return [f"gradients taken with {_calls(taken)} are not followed (graddoctor checks those "
            f"backward() accumulates in .grad and the optimizer steps that apply them)"]


def later_phases(tree, seen: set[int]) -> list[int]:
    """Lines of a later phase of the script, none of which ran: in the body (the module's, or a
    function's) around the last backward line seen, the calls in the statements after the one
    holding it that train (``training_calls``: a backward on a line never seen, a framework's
    fit, a function of the script that trains, as ``train(model, task_b)`` after
    ``train(model, task_a)``)."""
    import ast

    from ..analysis.source import walk  # the file's nodes, listed once per check
    from ..training_calls import FUNCTION_NODES, functions_of, later_training_statements, training_call_lines

    if tree is None or not seen:
        return []
    functions = functions_of(tree)
    last = max(seen)
    bodies = [tree.body] + [n.body for n in walk(tree) if isinstance(n, FUNCTION_NODES)]
    for body in bodies:
        holder = next((stmt for stmt in body if not isinstance(stmt, (*FUNCTION_NODES, ast.ClassDef))
                       and stmt.lineno <= last <= (stmt.end_lineno or stmt.lineno)), None)
        if holder is None:
            continue
        found = [line for later in later_training_statements(body, holder.end_lineno or holder.lineno, functions)
                 for line in training_call_lines(later, functions) if line not in seen]
        return sorted(set(found))
    return []


_CUTS = {"updates": "its cap of {cap} updates", "seconds": "its cap of {secs:g} seconds",
         "long": "that pass being longer than its cap of {cap} updates"}


def held_phase(a: "Analysis") -> list[str]:
    """The budget waited for the end of the first pass of the loop around the training loop, for
    its first evaluation, or for a later phase of the script (instrument/phases.py): how far,
    and when its cap ended the wait first, that what comes there is not checked."""
    if a.status != "step-limit":
        return []
    notes = []
    for e in a.of_kind("phase_hold"):
        if e.loc is None:
            continue
        if not e.get("cut"):
            if e["until"] > e["updates"]:
                what = (f"the loop at {e.loc} began its next pass" if e["wait"] == "loop"
                        else f"the stage switch at {e.loc} had run and an update followed"
                        if e["wait"] == "switch"
                        else f"the later phase of the script at {e.loc} had begun and as many "
                             f"updates of it as the budget had run" if e["wait"] == "later"
                        else f"the evaluation called at {e.loc} had run and one more update followed")
                notes.append(f"the step budget, reached at update {e['updates']}, was held to update "
                             f"{e['until']}, until {what}")
            continue
        if e["wait"] == "later":
            continue  # unreached_phase says it, in a later phase's terms
        what = (f"the end of the first pass of the loop at {e.loc}" if e["wait"] == "loop"
                else f"the stage switch at {e.loc}" if e["wait"] == "switch"
                else f"the first evaluation (called at {e.loc})")
        why = _CUTS.get(e["cut"], "its cap").format(cap=e.get("cap"), secs=e.get("cap_s") or 0)
        ran = (f"ran on to update {e['until']} and stopped" if e["until"] > e["updates"]
               else "stopped at the budget")
        notes.append(f"the replay {ran} before {what}, for {why}: the evaluation, scheduler, "
                     f"checkpoint or stage switch there is not checked; --steps reaches it")
    return notes


def unreached_phase(a: "Analysis") -> list[str]:
    """The step budget ended the run before a later phase of the script (a second task, a
    fine-tuning stage) ran: its bugs are not checked, and ``--steps`` reaches it. (The end of
    the first pass of an outer loop, and a first evaluation, the budget waits for: held_phase.)"""
    if a.status != "step-limit":
        return []
    backwards = [e for e in a.of_kind("backward") if e.loc is not None]
    if not backwards:
        return []
    path = backwards[-1].loc.path
    seen = {e.loc.line for e in backwards if e.loc.path == path}
    try:
        lines = later_phases(a.source.tree(path), seen)
    except Exception:  # a note must never break the report
        return []
    # a later phase that the budget waited for has run: not unreached
    begun = {e.loc.line for e in a.of_kind("phase_hold") if e.get("wait") == "later"
             and not e.get("cut") and e.loc is not None and e.loc.path == path}
    lines = [line for line in lines if line not in begun]
    if not lines:
        return []
    where = ", ".join(f"{path}:{line}" for line in lines[:3])
    return [f"the step budget ended the run before a later phase of the script ran ({where}: a "
            f"second task, a fine-tuning stage): what it does is not checked; a larger --steps "
            f"reaches it"]


NOTE_PRODUCERS: tuple[Callable[["Analysis"], list[str]], ...] = (
    short_epochs, short_len_crash, compiled, never_stepped, no_optimizer, functional_gradients,
    held_phase, unreached_phase)


def run_notes(a: "Analysis") -> list[str]:
    notes: list[str] = []
    for produce in NOTE_PRODUCERS:
        notes.extend(produce(a))
    return notes
