from __future__ import annotations

from ..findings import Severity
from ..trace import Location
from .base import Rule

# the calls that make one module out of another, searched in the script for the line to change
_COPY_CALLS = ("deepcopy", "load_state_dict", "copy_")


def _split(name: str) -> list[str]:
    return name.split(" ")[0].split(".")


def _owners(names: list[str]) -> list[str]:
    """The part of each name that tells the copies apart, up to where they differ:
    'members.0.0.weight', 'members.1.0.weight' -> 'members.0', 'members.1'."""
    parts = [_split(n) for n in names]
    tail = 0
    while all(len(p) > tail + 1 for p in parts) and len({p[-1 - tail] for p in parts}) == 1:
        tail += 1
    return [".".join(p[:len(p) - tail]) if tail else ".".join(p) for p in parts]


class CopiesStayIdentical(Rule):
    """
    ## What it does
    Finds trained modules that are exact copies of each other: after the third update, two or
    more distinct parameter tensors that one optimizer steps hold the same values and get the
    same gradient (not zero). It happens when an ensemble, a set of heads, experts or twin
    critics are made with `copy.deepcopy` of one initialised module (or loaded from one
    state), and each copy is fed the same data.

    ## Why is this bad?
    Copies that start equal and see the same inputs get the same gradients at every update,
    so they never diverge: a five-member ensemble is one model five times (its spread, the
    uncertainty estimate, is zero), two critics give the same value (clipped double-Q takes
    the minimum of one number), and every head or expert learns the same function. Nothing
    fails and the loss goes down; the diversity the copies were built for never appears.

    ## Example
    ```python
    base = make_member()
    members = nn.ModuleList([copy.deepcopy(base) for _ in range(5)])
    ```

    ## Use instead
    ```python
    members = nn.ModuleList([make_member() for _ in range(5)])  # one initialisation each
    ```

    ## Stays silent on
    Members built by separate constructor calls; copies fed different data (bootstrap rows, a
    different batch or augmentation per member), whose gradients differ at the first update;
    a target network, EMA or teacher copy the optimizer does not step; tied weights (one
    tensor); equal vectors without a weight matrix among them (the biases of two branches summed
    into one output); two models loaded from one checkpoint (said as info: they may be meant
    alike); constant or zero initialisations whose units are copies (`symmetric-units`
    reports the cause); parameters whose gradient is zero; single values; tensors on an
    accelerator (not read).
    """

    code = "GD167"
    slug = "copies-stay-identical"
    severity = Severity.WARNING
    summary = ("trained modules are exact copies of each other: equal parameters get equal "
               "gradients, so the copies never diverge")
    fix = ("build each copy with its own constructor call (or re-initialise it after copying, "
           "e.g. `m.apply(lambda l: l.reset_parameters() if hasattr(l, 'reset_parameters') "
           "else None)`), or feed each copy its own data")

    def check(self, a):
        for event in a.by_kind.get("copies_identical", ()):
            groups = [list(g) for g in event.get("groups") or () if len(g) >= 2]
            if not groups:
                continue
            # copies of whole modules: the same owner pattern in every group
            pairs: dict[str, list[str]] = {}
            tensors = 0
            for group in groups:
                owners = _owners([a.param_name(p) for p in group])
                for other in owners[1:]:
                    pairs.setdefault(owners[0], [])
                    if other not in pairs[owners[0]]:
                        pairs[owners[0]].append(other)
                tensors += len(group)
            original, copies = max(pairs.items(), key=lambda kv: len(kv[1]))
            cls = a.optimizer_class(event.get("opt")) or "the optimizer"
            step = event.get("step")
            shown = ", ".join(f"`{c}`" for c in copies[:4]) + (
                f" and {len(copies) - 4} more" if len(copies) > 4 else "")
            loc, text = self._copy_site(a, event, [original] + copies)
            made = f" (made at `{text}`)" if text else ""
            # two loads of one checkpoint: the copies may be meant alike (a harness, a baseline)
            checkpoint = bool(text) and "load_state_dict" in text and ".state_dict()" not in text
            extra = ""
            if len(pairs) > 1:
                extra = f"; {len(pairs) - 1} other set{'s' if len(pairs) > 2 else ''} of copies too"
            yield self.finding(
                f"{shown} {'is a copy' if len(copies) == 1 else 'are copies'} of `{original}`"
                f"{made}: after {step} updates of {cls}, {tensors} parameter tensors hold the "
                f"same values as their counterparts and get the same gradients{extra}. Copies "
                f"that start equal and see the same data never diverge, so they learn one "
                f"function between them"
                + (" (both were loaded from one checkpoint: if they are meant to differ, give "
                   "each its own data or initialisation)" if checkpoint else ""),
                loc or event.loc, step=step,
                severity=Severity.INFO if checkpoint else None,
                evidence={"original": original, "copies": copies,
                          "groups": [a.param_names(g) for g in groups], "after_updates": step})

    @staticmethod
    def _copy_site(a, event, owners) -> tuple[Location | None, str | None]:
        """The script's call that copied the module, found by name in the file of the step:
        the first whose text names one of the copies, else the first deepcopy."""
        if event.loc is None:
            return None, None
        found = a.source.calls_named(event.loc.path, _COPY_CALLS)
        if not found:
            return None, None
        # the innermost name that is not an index: 'model.heads.1' -> 'heads', 'q2' -> 'q2'
        roots = {next((part for part in reversed(o.split(".")) if not part.isdigit()), "")
                 for o in owners}
        named = [c for c in found if any(r and r in c[1] for r in roots)]
        deep = [c for c in found if "deepcopy" in c[1]]
        chosen = (named or deep or [None])[0]
        if chosen is None:
            return None, None
        return Location(event.loc.path, chosen[0]), chosen[1]
