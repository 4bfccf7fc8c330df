from __future__ import annotations

from ..findings import Severity
from .base import Rule, plural, related

GROWTH_RUN = 3  # walked backwards in a row, one update apart, whose graph grows
GROWTH_FACTOR = 2  # ... to at least this many times its first size


class HiddenStateNotDetached(Rule):
    """
    ## What it does
    Finds a `backward(retain_graph=True)` that goes back through the autograd graph of an
    earlier update, whose gradients an optimizer step has already applied: truncated
    backpropagation through time where the hidden state carried from one chunk to the next is
    never detached (an RNN's `h`, an LSTM's cell state `c`, a running memory).

    ## Why is this bad?
    Without `detach()`, the hidden state keeps the whole history of every earlier chunk. PyTorch
    first refuses ("Trying to backward through the graph a second time"); `retain_graph=True`
    makes that error go away, and then each backward runs through all earlier chunks again: the
    gradients it adds come from activations computed with parameter values the optimizer has
    since changed, every chunk's activations stay in memory, and each backward costs more than
    the last. The truncation is gone, silently. With layers that save their weights for the
    backward (`nn.RNNCell`, `nn.GRUCell`, `nn.LSTM`), it ends a few chunks later in "one of the
    variables needed for gradient computation has been modified by an inplace operation".

    ## Example
    ```python
    h = torch.zeros(batch, hidden)
    for x, y in chunks:
        optimizer.zero_grad()
        h = cell(x, h)
        loss_fn(head(h), y).backward(retain_graph=True)
        optimizer.step()
    ```

    ## Use instead
    ```python
    h = torch.zeros(batch, hidden)
    for x, y in chunks:
        optimizer.zero_grad()
        h = cell(x, h.detach())  # the chunk boundary: gradients stop here
        loss_fn(head(h), y).backward()
        optimizer.step()
    ```

    ## Stays silent on
    TBPTT that detaches the state at each chunk boundary (a recursive `repackage_hidden`
    included), even with `retain_graph=True` left over; one step per sequence with a fresh
    state for the next; a graph rebuilt each step from a fresh state; two task losses or a
    GAN's two backwards sharing one retained graph on purpose.
    """

    code = "GD110"
    slug = "hidden-state-not-detached"
    severity = Severity.WARNING
    summary = ("a backward() with retain_graph=True goes back through the graph of an update already "
               "applied (hidden state not detached)")
    fix = ("detach the state carried to the next chunk (h = h.detach(); for an LSTM both h and c) "
           "and drop retain_graph=True")

    def check(self, a):
        backwards = a.of_kind("backward")
        hits: dict = {}  # loc of the backward -> [(backward, earlier backward, step, pids)]
        for b in backwards:
            hit = self._reaches_applied_history(a, b)
            if hit is not None:
                hits.setdefault(b.loc, []).append(hit)
        sizes = self._sizes(backwards)
        for loc, found in hits.items():
            yield self._shared_finding(a, loc, found, sizes.get(loc, []))
        for loc, walked in sizes.items():
            if loc not in hits:
                finding = self._growth_finding(a, loc, walked)
                if finding is not None:
                    yield finding

    # -- the history of an earlier update, walked again -------------------------------------
    @staticmethod
    def _reaches_applied_history(a, b):
        """(b, earlier backward, step, pids) for the first earlier backward whose graph ``b``
        reaches again, when an optimizer step owning the parameters fed through it ran between
        the two (the history belongs to an update already applied); else None."""
        for entry in b.get("history") or ():
            seq, pids = entry[0], entry[1]
            earlier = a.event(seq)
            if earlier is None or earlier.kind != "backward" or earlier.seq >= b.seq or not pids:
                continue  # no tracked parameter behind the shared nodes: no update to speak of
            opts = set().union(*(a.owners.get(pid, set()) for pid in pids))
            for i in range(a.step_index(earlier.seq), a.step_index(b.seq)):
                step = a.steps[i]
                if step.get("opt") in opts and not step.get("skipped"):
                    owned = [pid for pid in pids if step["opt"] in a.owners.get(pid, ())]
                    return b, earlier, step, owned
        return None

    def _shared_finding(self, a, loc, found, walked):
        b, earlier, step, pids = found[0]
        step_no = a.step_number.get(step.seq)
        first = a.next_step_number(earlier.seq)
        where = f"update {first}" if first is not None else "an earlier update"
        growth = self._growth_text(walked)
        message = (
            f"this backward goes back through the autograd graph of {where}, whose gradients "
            f"step {step_no} already applied: a tensor carried between updates (an RNN hidden or "
            f"cell state) is not detached, and retain_graph=True keeps its history alive. Every "
            f"backward walks all earlier chunks again, adds gradients to {a.names(pids)} computed "
            f"from activations of outdated parameters, keeps them all in memory and costs more "
            f"than the last{growth}")
        if self._crashed_after(a, [hit[0] for hit in found]):
            message += (". The script crashed right after this backward: when the error is \"one "
                        "of the variables needed for gradient computation has been modified by an "
                        "inplace operation\", this is its cause (weights an earlier chunk saved for "
                        "its backward were changed by the optimizer since)")
        notes = [related(step, f"step {step_no} applied the gradients of that earlier history already")]
        if earlier.loc != loc:
            notes.append(related(earlier, "the backward that first went through that history"))
        return self.finding(
            message, loc, related=notes, step=a.next_step_number(b.seq),
            evidence={"params": a.param_names(pids, limit=8), "occurrences": len(found),
                      "first_update": first, "applied_by_step": step_no,
                      "graph_nodes": [e["graph_nodes"] for e in walked]})

    @staticmethod
    def _crashed_after(a, backwards) -> bool:
        """The run crashed and one of these backwards is the last thing it recorded (the
        parameter names are written after the end)."""
        if a.status != "crashed":
            return False
        last = next((e for e in reversed(a.events)
                     if e.kind not in ("param", "run_end", "internal_error")), None)
        return last is not None and any(last is b for b in backwards)

    # -- a graph that grows from update to update (history not looked at) -------------------
    @staticmethod
    def _sizes(backwards) -> dict:
        """loc -> the backwards of that line that were walked for their graph, in order."""
        sizes: dict = {}
        for b in backwards:
            if b.get("graph_nodes") is not None:
                sizes.setdefault(b.loc, []).append(b)
        return sizes

    @staticmethod
    def _growth_text(walked) -> str:
        counts = [e["graph_nodes"] for e in walked]
        if len(counts) < 2 or any(x >= y for x, y in zip(counts, counts[1:])):
            return ""
        return f" (graph: {' → '.join(map(str, counts[:4]))}{' → ...' if len(counts) > 4 else ''} nodes)"

    def _growth_finding(self, a, loc, walked):
        """Info: GROWTH_RUN walked backwards in a row, each after an optimizer step, whose graph
        grows to GROWTH_FACTOR times its size, none of them checked for shared history (more
        nodes than a walk marks, or a torch without Node.metadata). A graph that grows for
        other reasons (a curriculum of longer sequences) would look the same: hence info."""
        run: list = []
        for e in walked:
            if e.get("history") is not None:
                run = []  # looked at, and nothing applied was shared: it grows for other reasons
                continue
            if run:
                if a.steps_before(e.seq) == a.steps_before(run[-1].seq):
                    continue  # the same update: its first walked backward stands for it
                if e["graph_nodes"] <= run[-1]["graph_nodes"]:
                    run = []
            run.append(e)
            if len(run) >= GROWTH_RUN and run[-1]["graph_nodes"] >= GROWTH_FACTOR * run[0]["graph_nodes"]:
                counts = [x["graph_nodes"] for x in run]
                return self.finding(
                    f"the autograd graph of this backward(retain_graph=True) grew from {counts[0]} "
                    f"to {counts[-1]} nodes over {plural(len(run), 'update')}: if a tensor carried "
                    f"from one update to the next (an RNN hidden state) is not detached, every "
                    f"backward walks all earlier chunks again. graddoctor could not check which "
                    f"nodes are shared here (the graph is too large to mark, or this torch has no "
                    f"Node.metadata); a graph that grows by design (longer sequences) looks the same",
                    loc, severity=Severity.INFO, step=a.next_step_number(run[-1].seq),
                    evidence={"graph_nodes": counts})
        return None
