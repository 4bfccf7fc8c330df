"""Patch attributes and register hooks so that every one is undone on exit."""

from __future__ import annotations

from typing import Any

_MISSING = object()


class Patcher:
    """Records every patched attribute and hook handle; ``undo()`` restores them all, newest
    first, even when one restore fails."""

    def __init__(self) -> None:
        self._undo: list[tuple[str, Any, Any, Any]] = []
        self._replaced: dict[int, tuple[Any, Any]] = {}  # id(new) -> (new, what it replaced)

    def patch(self, owner: Any, name: str, new: Any) -> None:
        old = owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else _MISSING
        self._undo.append(("attr", owner, name, old))
        # what a call by this name reached before: the owner's own value, or the inherited one
        reached = old if old is not _MISSING else getattr(owner, name, None)
        if reached is not None:
            self._replaced[id(new)] = (new, reached)
        setattr(owner, name, new)

    def replaced(self, new: Any) -> Any:
        """What the patch that set ``new`` replaced (a function torch calls by its public name,
        unwrapped), or None when ``new`` is no patch of this patcher's."""
        entry = self._replaced.get(id(new))
        return entry[1] if entry is not None and entry[0] is new else None

    def handle(self, handle: Any) -> Any:
        self._undo.append(("handle", handle, None, None))
        return handle

    def undo(self) -> list[BaseException]:
        errors: list[BaseException] = []
        while self._undo:
            kind, owner, name, old = self._undo.pop()
            try:
                if kind == "handle":
                    owner.remove()
                elif old is _MISSING:
                    delattr(owner, name)
                else:
                    setattr(owner, name, old)
            except BaseException as exc:  # keep restoring the rest
                errors.append(exc)
        return errors
