"""Patch attributes and register hooks so that every one is undone on exit."""

from __future__ import annotations

from typing import Any

_MISSING = object()

# Tables that live for one check (registered with ``per_check``): emptied as each check starts
# and again as it ends, so that a finished check leaves nothing of itself in them (wrappers, the
# watchers their calls reach, the recorder, the script's objects).
_per_check: list = []


def per_check(table):
    """``table`` (a dict, set or list) emptied as each check starts and as it ends."""
    _per_check.append(table)
    return table


# Wrappers whose watcher's window ended while another watcher's wrapper sat on top of them:
# ``{id(wrapper): (wrapper, what it replaced)}``, held alive so that an id is never reused
# within a check.
_retired: dict = per_check({})
# ``{id(rebuilt wrapper): (rebuilt, the wrapper it stands for)}``: a wrapper rebuilt in place
# without one watcher's call (``inlinable.unwatch``) is still the one its own watcher installed.
_stand_ins: dict = per_check({})


def put_back(owner: Any, name: str, original: Any, wrapper: Any) -> bool:
    """Put ``original`` back as ``owner.<name>`` when a watcher's window ends, only where that
    watcher's ``wrapper`` is the one installed (or a stand-in rebuilt from it). With another
    watcher's wrapper on top, putting the original back would drop that one before its own
    window ends: ``wrapper`` is left inside it, marked retired (its watcher's test, closed, makes
    it pass-through), and when the upper watcher puts back what it replaced, the retired wrappers
    below are skipped and the function comes back as it was before them. True when put back.
    Every watcher that puts its patches back during the run goes through here; the patcher's
    undo at the end of the check restores whatever is left."""
    current = _installed(owner, name)
    entry = _stand_ins.get(id(current))
    original = _unretired(original)
    if current is not wrapper and not (entry is not None and entry[0] is current and entry[1] is wrapper):
        _retired[id(wrapper)] = (wrapper, original)
        for reroute in _reroutes:  # a wrapper on top that calls this one itself (``watched``'s
            # one frame for several watchers) is rebuilt to call the original instead
            if reroute(owner, name, wrapper, original):
                return True
        return False
    setattr(owner, name, original)
    return True


def _unretired(original: Any) -> Any:
    """``original`` past the retired wrappers it may be (each replaced by what it wrapped)."""
    for _ in range(64):
        below = _retired.get(id(original))
        if below is None or below[0] is not original:
            break
        original = below[1]
    return original


# ``reroute(owner, name, wrapper, original) -> bool``: take ``wrapper`` out from under the wrapper
# installed above it where that one calls it directly (``inlinable`` registers its own)
_reroutes: list = []


def on_covered(reroute) -> None:
    """Register a ``reroute`` that ``put_back`` tries when another wrapper sits on top."""
    if reroute not in _reroutes:
        _reroutes.append(reroute)


def stand_in(rebuilt: Any, replaced: Any) -> None:
    """``rebuilt`` now stands where ``replaced`` was installed, doing its work (less one
    watcher's call): ``put_back`` of ``replaced`` takes it as that wrapper."""
    entry = _stand_ins.get(id(replaced))
    if entry is not None and entry[0] is replaced:
        replaced = entry[1]  # a stand-in of a stand-in stands for the wrapper first installed
    _stand_ins[id(rebuilt)] = (rebuilt, replaced)


# The tensor and autograd-node hooks registered during a check (``check_hook``), removed as it
# ends. A hook on a tensor or node is held by the graph's C++ nodes, which the collector cannot
# see: a hook whose closure reaches (through its watcher and the recorder) anything that keeps
# that graph alive is a cycle no collection frees, and it held the whole check (recorder, trace,
# watchers, the script's model) for the rest of the process. Handles whose hooks are gone are
# dropped as the list grows, so that a long run's list stays the size of its live hooks.
_hooks: list = []
_hooks_kept = 256  # the length past which the list is pruned


def check_hook(handle):
    """``handle`` (a ``RemovableHandle`` of a tensor or node hook) removed when the check ends."""
    global _hooks_kept
    _hooks.append(handle)
    if len(_hooks) > _hooks_kept:
        _hooks[:] = [h for h in _hooks if _hook_alive(h)]
        _hooks_kept = max(256, 2 * len(_hooks))
    return handle


def _hook_alive(handle) -> bool:
    ref = getattr(handle, "hooks_dict_ref", None)
    try:
        hooks = ref() if ref is not None else None
        return hooks is not None and handle.id in hooks
    except Exception:
        return True


def remove_check_hooks() -> list[BaseException]:
    """Remove every hook ``check_hook`` was given (most were removed by their watcher already:
    a second removal does nothing). Returns the errors."""
    global _hooks_kept
    handles = _hooks[:]
    _hooks.clear()
    _hooks_kept = 256
    errors = []
    for handle in handles:
        try:
            handle.remove()
        except Exception as error:
            errors.append(error)
    return errors


def forget_check_tables() -> None:
    """A check starts or ends: every ``per_check`` table is emptied."""
    for table in _per_check:
        table.clear()


def _installed(owner: Any, name: str) -> Any:
    own = getattr(owner, "__dict__", None)
    if own is not None and name in own:
        return own[name]
    return getattr(owner, name, None)


class _JitBuiltinAliases(dict):
    """``{id(wrapper): wrapper}`` of the wrappers entered in torch.jit's table of builtins under
    their function's aten op. A ``watched`` wrapper of a builtin (``torch.where``) is a Python
    function JIT's table does not know: code scripted while a check runs (``torch.distributed.optim``
    scripts its functional optimizers at import, so ``import ignite`` does) resolved the name to
    the wrapper, tried to compile it from source, and failed on the builtin it unwraps to
    (inspect: "got builtin_function_or_method"). Entered under the builtin's op, the wrapper is
    compiled as the op itself, as scripted code is not watched anyway. Each entry leaves the
    table when the check ends (``per_check`` clears this), and the wrapper is held until then
    so that its id is not reused while the table names it."""

    def clear(self) -> None:
        table = _jit_builtin_table()
        if table is not None:
            for key in self:
                table.pop(key, None)
        super().clear()


def _jit_builtin_table():
    try:
        from torch.jit import _builtins
        return _builtins._get_builtin_table()
    except Exception:  # torch without the private table: scripting a wrapper fails as before
        return None


_jit_aliases: _JitBuiltinAliases = per_check(_JitBuiltinAliases())


def alias_for_jit(wrapper, function):
    """Enter ``wrapper`` in torch.jit's builtin table under ``function``'s aten op, when
    ``function`` has one (``_JitBuiltinAliases``); returns ``wrapper``."""
    table = _jit_builtin_table()
    if table is None or wrapper is function:
        return wrapper
    op = table.get(id(function))
    if op is not None:
        table[id(wrapper)] = op
        _jit_aliases[id(wrapper)] = wrapper
    return wrapper


class Patcher:
    """Records every patched attribute and hook handle; ``undo()`` restores them all, newest
    first, even when one restore fails."""

    def __init__(self) -> None:
        self._undo: list[tuple[str, Any, Any, Any]] = []
        self._patched: list | None = None  # ``originals``' (owner, name, first old), kept until a change

    def patch(self, owner: Any, name: str, new: Any) -> Any:
        """Set ``owner.<name>`` to ``new``, undone at the end; returns ``new`` (the wrapper a
        watcher hands ``put_back`` when its window ends)."""
        old = owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else _MISSING
        self._undo.append(("attr", owner, name, old))
        self._patched = None
        if callable(new):
            alias_for_jit(new, old if old is not _MISSING else getattr(owner, name, None))
        setattr(owner, name, new)
        return new

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
