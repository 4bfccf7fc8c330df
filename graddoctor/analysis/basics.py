"""Two small helpers every part of the analysis shares (the ``Analysis`` itself, the accumulation
windows, the mode timeline, the rules). They live apart from ``Analysis`` so that the modules it
builds lazily can use them without importing the package that imports them. No torch."""

from __future__ import annotations

from ..trace import Event


def written(backward: Event) -> tuple[int, ...]:
    """The parameters a backward wrote: fresh, accumulated onto, or cleared outside zero_grad."""
    return (*backward.get("fresh", ()), *backward.get("accumulated", ()),
            *backward.get("cleared_outside", ()))


def listing(names, limit: int) -> str:
    """'fc.weight, fc.bias and 3 more': how messages list parameters and layers."""
    names = list(dict.fromkeys(names))
    text = ", ".join(names[:limit])
    return text + (f" and {len(names) - limit} more" if len(names) > limit else "")
