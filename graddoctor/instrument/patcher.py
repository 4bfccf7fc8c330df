"""Patch attributes and register hooks so that every one is undone on exit."""

from __future__ import annotations

from typing import Any

_MISSING = object()


class Patcher:
    """Records every patched attribute and hook handle; ``undo()`` restores them all, newest
    first, even when one restore fails."""

    def __init__(self) -> None:
        self._undo: list[tuple[str, Any, Any, Any]] = []
        self._patched: list | None = None  # ``originals``' (owner, name, first old), kept until a change

    def patch(self, owner: Any, name: str, new: Any) -> None:
        old = owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else _MISSING
        self._undo.append(("attr", owner, name, old))
        self._patched = None
        setattr(owner, name, new)

    def handle(self, handle: Any) -> Any:
        self._undo.append(("handle", handle, None, None))
        return handle

    def originals(self) -> "Originals":
        """The function each plain function patched in replaced first (``Originals``): a
        ``TorchFunctionMode`` handed one of graddoctor's wrappers (torch looks the public name up
        again) calls the original, so that the wrapper, which already ran, does not run twice."""
        patched = self._patched
        if patched is None:  # each attribute once (with what it held first), in the order of
            # its last patch: where two attributes hold one function, the later one's says
            first: dict = {}
            last: dict = {}
            for index, (kind, owner, name, old) in enumerate(self._undo):
                if kind == "attr":
                    first.setdefault((id(owner), name), old)
                    last[(id(owner), name)] = (index, owner, name)
            patched = self._patched = [(owner, name, first[key]) for key, (_, owner, name)
                                       in sorted(last.items(), key=lambda item: item[1][0])]
        out = Originals()
        for owner, name, old in patched:
            new = owner.__dict__.get(name) if hasattr(owner, "__dict__") else None
            if callable(new) and callable(old) and not isinstance(old, (staticmethod, classmethod)):
                out[id(new)] = (new, old)
        return out

    def undo(self) -> list[BaseException]:
        errors: list[BaseException] = []
        self._patched = None
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


class Originals(dict):
    """``{id(installed function): (installed function, the function it replaced first)}``, read
    through ``original_of``. It holds each installed function alive: a watcher that puts its
    original back during the run (its windows spent) frees its wrapper, and a wrapper made
    later could get the freed one's id, and so the wrong original."""

    def original_of(self, func: Any) -> Any:
        entry = self.get(id(func))
        return entry[1] if entry is not None and entry[0] is func else func


class WatchedAttribute:
    """A data descriptor for one attribute name that a class does not define (or defines as a
    method, ``shadowed``), to see the script set it on an instance: the value lives in the
    instance's ``__dict__`` as without it, and ``told(obj, name, value)`` is called after it is
    stored. Reads give the instance's value, else ``shadowed`` bound as the class would give
    it, else the ``AttributeError`` Python would raise (on the class itself: ``shadowed``, else
    the descriptor). Patched onto the class (``Patcher.patch``),
    it costs nothing to the class's other attributes."""

    def __init__(self, name: str, shadowed: Any, told: Any):
        self.name, self.shadowed, self.told = name, shadowed, told

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:  # on the class: what it held, else the descriptor (as a property gives
            # itself): code that walks ``dir(cls)`` and reads each name (dynamo) must not fail
            return self if self.shadowed is None else self.shadowed.__get__(None, objtype)
        own = obj.__dict__
        if self.name in own:
            return own[self.name]
        if self.shadowed is None:
            raise AttributeError(f"'{type(obj).__name__}' object has no attribute '{self.name}'")
        return self.shadowed.__get__(obj, objtype)

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.name] = value  # first, exactly as without graddoctor
        self.told(obj, self.name, value)

    def __delete__(self, obj: Any) -> None:
        try:
            del obj.__dict__[self.name]
        except KeyError:
            raise AttributeError(self.name) from None
