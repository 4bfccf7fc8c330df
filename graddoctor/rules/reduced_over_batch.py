from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule

# the names a script calls each reduction by
_NAMES = {
    "logsumexp": ("logsumexp",),
    "max": ("max", "amax"),
    "min": ("min", "amin"),
    "amax": ("amax", "max"),
    "amin": ("amin", "min"),
    "prod": ("prod",),
}
_NAMESPACES = frozenset({"torch", "special"})
# the ops samples-mixed-in-batch names when it finds the batch mixed inside the model's forward
_MIXING = ("Logsumexp", "Max", "Min", "Amax", "Amin", "Prod")


def _receiver_is_module(func) -> bool:
    value = func.value if isinstance(func, ast.Attribute) else None
    return isinstance(value, ast.Name) and value.id in _NAMESPACES


def first_axis_dims(text: str) -> tuple[int, ...] | None:
    """The literal dimensions one reduction call's source names (``torch.logsumexp(x, dim=0)``,
    ``x.max(0)``, ``torch.min(q, dim=0)``, ``x.logsumexp((0, 1))``), else None (no literal
    dim, or a second tensor: ``torch.min(a, b)``)."""
    try:
        call = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call):
        return None
    value = next((k.value for k in call.keywords if k.arg == "dim"), None)
    if value is None:
        position = 1 if _receiver_is_module(call.func) or isinstance(call.func, ast.Name) else 0
        value = call.args[position] if len(call.args) > position else None
    try:
        dim = ast.literal_eval(value) if value is not None else None
    except (ValueError, TypeError, SyntaxError):
        return None
    if isinstance(dim, bool):
        return None
    if isinstance(dim, int):
        return (dim,)
    if isinstance(dim, tuple) and dim and all(isinstance(d, int) and not isinstance(d, bool)
                                              for d in dim):
        return dim
    return None


def _over_first(text: str, ndim: int, axis: int = 0) -> bool:
    dims = first_axis_dims(text)
    return dims is not None and any(d in (axis, axis - ndim) for d in dims)


def _with_dim(text: str, dim: int) -> str | None:
    """The call's source with its literal dim 0 replaced by ``dim`` when it is written as a
    keyword or as the method's first argument; None otherwise."""
    try:
        call = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call):
        return None
    for keyword in call.keywords:
        if keyword.arg == "dim" and isinstance(keyword.value, ast.Constant):
            keyword.value = ast.Constant(dim)
            return ast.unparse(call)
    position = 1 if _receiver_is_module(call.func) or isinstance(call.func, ast.Name) else 0
    if len(call.args) > position and isinstance(call.args[position], ast.Constant):
        call.args[position] = ast.Constant(dim)
        return ast.unparse(call)
    return None


def _samples_first_fix(text: str, event, axis: int) -> str:
    left = [i for i in range(len(event["shape"])) if i not in event["dims"]]
    if len(left) == 1:
        size = event["shape"][left[0]]
        return (f"reduce over dim {left[0]} (the axis of {size} each sample "
                f"owns: its importance samples, draws or heads), not dim {axis} (the batch), e.g. "
                f"`{_replace_dim(text, axis, left[0]) or text}`")
    return f"reduce over the axis each sample owns, not dim {axis} (the batch)"


def _replace_dim(text: str, old: int, new: int) -> str | None:
    """The call's source with its literal dim ``old`` written as ``new`` (keyword or the first
    argument that names it); None when it is written otherwise."""
    try:
        call = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call):
        return None
    for keyword in call.keywords:
        if keyword.arg == "dim" and isinstance(keyword.value, ast.Constant):
            keyword.value = ast.Constant(new)
            return ast.unparse(call)
    position = 1 if _receiver_is_module(call.func) or isinstance(call.func, ast.Name) else 0
    if len(call.args) > position and isinstance(call.args[position], ast.Constant):
        call.args[position] = ast.Constant(new)
        return ast.unparse(call)
    return None


class ReducedOverBatch(Rule):
    """
    ## What it does
    Finds a `logsumexp`, `max`, `min` or `prod` on the loss's path taken over dim 0, the batch,
    of per-sample scores that have an axis of their own it was meant to reduce: a mixture
    density network's `torch.logsumexp(log_pi + log_prob, dim=0)` on (batch, components)
    log-likelihoods, a multi-class hinge's `margins.max(dim=0)` on (batch, classes), the
    pessimistic `q.min(dim=0)` of an ensemble of critics on (batch, heads), a log-softmax by
    hand `logits - logits.logsumexp(0, keepdim=True)`, a product of per-frame probabilities over
    dim 0 of (batch, frames). Seen in the graph of the first backwards: the reduction's input
    is laid out like a batch of samples (dim 0 as long as the data or targets the graph read and
    the DataLoader's batch, another axis longer than 1, not a square (B, B) matrix), an axis
    longer than 1 is left after it, and the loss depends on its result (a gradient that is not
    zero reaches it). A samples-first layout is read too, where the batch is not dim 0: an
    importance-weighted bound's `torch.logsumexp(log_w, dim=1)` on [K, B] log-weights, an
    ensemble's `q.min(dim=1)` on critics stacked heads-first (heads, B): the one axis as long
    as the DataLoader's latest batch (dim 0 not that long, a tensor of data with that leading
    size read below) reduced while another axis longer than 1 is left. Reported at the call
    with that dim in the script.

    ## Why is this bad?
    A sum or a mean over the batch is how a loss averages its samples; a log-sum-exp, a max, a
    min or a product over the batch is not: it combines each sample's score with the other
    samples' before the sample's own axis is reduced. The MDN's likelihood of one component
    sums over the whole batch, the hinge keeps the worst sample per class, the actor maximises
    the worst state per critic head. The loss still falls, the shapes agree (the final
    `.mean()` takes whatever axis is left), and the model learns something else than each
    sample's likelihood or margin; at inference, one sample at a time, the same line computes
    a different number.

    ## Example
    ```python
    def mdn_nll(log_pi, mu, log_sigma, y):          # (N, K) each
        log_prob = -0.5 * ((y - mu) / log_sigma.exp()) ** 2 - log_sigma - HALF_LOG_2PI
        return -torch.logsumexp(log_pi + log_prob, dim=0).mean()
    ```

    ## Use instead
    ```python
        return -torch.logsumexp(log_pi + log_prob, dim=-1).mean()   # over each sample's components
    ```

    ## Stays silent on
    A reduction over each sample's own axes (`dim=1`, `dim=-1`); a reduction over every axis
    (one number for the batch: a global max); sums and means over the batch (the loss's final
    reduction, a REINFORCE baseline, VICReg's per-feature variance); a (B, B) similarity or
    distance matrix reduced over either axis (InfoNCE's and CLIP's logsumexp over the batch,
    batch-hard triplet mining's max and min); a (samples, candidates) matrix whose columns are as
    long as another tensor of the data (captions against images: each caption's logsumexp
    over the images); the batch's marginal of a (log-)softmax over the classes (a clustering's
    entropy of the mean assignment, `logsumexp(log_p, dim=0) - log(B)`); a batch max subtracted
    for stability and added back (the loss does not depend on it: its gradient cancels); a bag
    of instances served one at a time (multiple-instance learning's max over the instances of a
    DataLoader batch of another size) and a (K, 1) bag; reductions of values without gradient
    (a target under `no_grad`, `target-reduced-over-batch`'s); one in the model's forward, which
    `samples-mixed-in-batch` reports; a samples-first [K, B] tensor reduced over its K (dim 0),
    and a (captions, images) matrix reduced over the images when the captions are data of their
    own. Not seen: a samples-first layout without a DataLoader (nothing says which axis is the
    batch). Not told apart: a reduction over a batch of one sample's
    instances when no DataLoader tells the bag from a batch (a bag passed as one tensor, its
    instances counted as samples); a `sum` or `mean` over the batch followed by a `log` (the
    mixture written with probabilities, `log((pi * prob).sum(0))`), which looks like a batch
    statistic on purpose.
    """

    code = "GD199"
    slug = "reduced-over-batch"
    severity = Severity.WARNING
    summary = ("a logsumexp, max, min or prod on the loss's path is taken over dim 0, the batch: "
               "each sample's score is combined with the other samples' instead of over its own "
               "axis")
    fix = "reduce over each sample's own axis (`dim=1` or `dim=-1`), not over dim 0 (the batch)"

    def _samples_first(self, event, path, line, text, axis):
        shape = "×".join(str(s) for s in event["shape"])
        left = [str(s) for i, s in enumerate(event["shape"]) if i not in event["dims"]]
        return self.finding(
            f"`{text}` reduces a {shape} tensor over dim {axis}, the batch's {event['batch']} "
            f"samples (a samples-first layout: the DataLoader's batch is dim {axis}), and leaves "
            f"{'its axis of length ' if len(left) == 1 else 'its axes of sizes '}{'×'.join(left)}: "
            f"each value the loss reads combines the {event['batch']} samples by a {event['fn']} "
            f"instead of each sample's own values (an importance-weighted bound's K samples), so "
            f"every sample's term depends on the others",
            Location(path, line),
            evidence={"fn": event["fn"], "shape": event["shape"], "dims": event["dims"],
                      "batch": event["batch"], "batch_dim": axis},
            fix=_samples_first_fix(text, event, axis))

    def check(self, a):
        events = list(a.by_kind.get("reduce_batch", ()))
        if not events:
            return
        mixed = [str(e.get("op") or "") for e in a.by_kind.get("dependency", ()) if e.get("mixed")]
        if any(op.startswith(_MIXING) for op in mixed):
            return  # samples-mixed-in-batch names the reduction inside forward
        used: set = set()
        for event in events:
            if event.loc is None:
                continue
            fn = event["fn"]
            path = event.loc.path
            ndim = len(event["shape"])
            axis = event.get("batch_dim") or 0
            calls = [(line, text) for line, text, _forward in
                     a.source.calls_named(path, frozenset(_NAMES.get(fn, (fn,))))
                     if _over_first(text, ndim, axis) and (path, line) not in used]
            if not calls:
                continue
            line, text = calls[0]
            used.add((path, line))
            if axis:
                yield self._samples_first(event, path, line, text, axis)
                continue
            shape = "×".join(str(s) for s in event["shape"])
            left = [str(s) for i, s in enumerate(event["shape"]) if i not in event["dims"]]
            fixed = _with_dim(text, -1 if ndim == 2 else 1)
            yield self.finding(
                f"`{text}` reduces a {shape} tensor over dim 0, its {event['batch']} samples, and "
                f"leaves {'its axis of length ' if len(left) == 1 else 'its axes of sizes '}"
                f"{'×'.join(left)}: each value the loss reads combines "
                f"the {event['batch']} samples' scores by a {fn} instead of one sample's scores "
                f"over its own axis, so every sample's term depends on the others and the loss "
                f"is no per-sample {'likelihood' if fn == 'logsumexp' else 'score'} averaged "
                f"over the batch",
                Location(path, line),
                evidence={"fn": fn, "shape": event["shape"], "dims": event["dims"],
                          "batch": event["batch"]},
                fix=(f"`{fixed}`: reduce each sample over its own axis" if fixed and ndim == 2 else
                     "reduce over the sample's own axis it was meant for (`dim=-1` for the last), "
                     "not dim 0 (the batch)"))
