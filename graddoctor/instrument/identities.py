"""Numbers for the objects a run tracks (tensors, optimizers, modules, schedulers, ...).

``id()`` is not an identity over a run: CPython gives a freed object's address to the next
object of its size, so a loop that rebuilds its optimizer would make two optimizers one.
Each number is kept with a weak reference to its object and a lookup checks that the object
at that address is still that one; an object that takes no weak reference is held alive
instead, so its address cannot be reused while the run lasts.
"""

from __future__ import annotations

import operator
import weakref
from operator import is_
from typing import Any, Callable

call = getattr(operator, "call", None) or operator.methodcaller("__call__")  # a reference's object


class Identities:
    """Numbers 0, 1, 2, ... given to objects in the order first seen; one instance per kind.

    Hot loops may inline ``get``: ``n = ids.number.get(id(obj))`` and then
    ``n is not None and ids.refs[n]() is obj``."""

    __slots__ = ("number", "refs", "ints")

    def __init__(self) -> None:
        self.number: dict[int, int] = {}  # id(obj) -> its number (the latest object there)
        self.refs: list[Callable[[], Any]] = []  # number -> weakref (or a holder) of its object
        # number -> the int object it was given as (the one ``number`` and ``numbers`` hand
        # out): a list of numbers built from it holds no int of its own (numbers past 256 are
        # not cached by Python: a pass over ``range`` makes a new one per element)
        self.ints: list[int] = []

    def __call__(self, obj) -> int:
        """``obj``'s number, given now if it has none."""
        number = self.number.get(id(obj))
        if number is not None and self.refs[number]() is obj:
            return number
        number = len(self.refs)
        try:
            ref: Callable[[], Any] = weakref.ref(obj)
        except TypeError:  # no weak reference: kept alive, so its address stays its own
            ref = _Held(obj)
        self.refs.append(ref)
        self.ints.append(number)
        self.number[id(obj)] = number
        return number

    def get(self, obj) -> int | None:
        """``obj``'s number, or None if it has none (an object that died does not lend its
        number to one made at its address)."""
        number = self.number.get(id(obj))
        if number is not None and self.refs[number]() is obj:
            return number
        return None

    def numbers(self, objs: list) -> list:
        """Each object's number, None for one without (``map``s that run in C when all have
        one: a step's pass over thousands of tensors)."""
        numbers = list(map(self.number.get, map(id, objs)))
        if None not in numbers and all(map(is_, map(call, map(self.refs.__getitem__, numbers)),
                                           objs)):
            return numbers
        return list(map(self.get, objs))

    def object(self, number: int):
        """The object with this number while it lives, else None."""
        return self.refs[number]() if 0 <= number < len(self.refs) else None

    def __len__(self) -> int:
        return len(self.refs)


class _Held:
    __slots__ = ("obj",)

    def __init__(self, obj) -> None:
        self.obj = obj

    def __call__(self):
        return self.obj
