"""Patch a method on a base class and on every loaded subclass that overrides it.

PyTorch classes such as ``LRScheduler`` are subclassed with their own ``step``; patching only
the base misses those. One shared depth counter per method name makes an override that calls
``super().step()`` record once, and lets a watcher tell its own nested calls apart.
"""

from __future__ import annotations

from typing import Callable


def all_subclasses(base: type) -> list[type]:
    found, stack = [], [base]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            if sub not in found:
                found.append(sub)
                stack.append(sub)
    return found


def patch_tree(patcher, base: type, name: str, make_wrapper: Callable) -> None:
    """``make_wrapper(original) -> wrapper`` for ``base.name`` and each override of it."""
    for cls in [base, *all_subclasses(base)]:
        original = cls.__dict__.get(name)
        if original is not None and callable(original):
            patcher.patch(cls, name, make_wrapper(original))


class Depth:
    """A re-entrancy counter: ``with depth: ...``; ``depth.active`` while inside a call."""

    def __init__(self) -> None:
        self.level = 0

    def __enter__(self) -> "Depth":
        self.level += 1
        return self

    def __exit__(self, *exc) -> None:
        self.level -= 1

    @property
    def active(self) -> bool:
        return self.level > 0
