"""Find the user's line: the first stack frame that is not graddoctor, torch or the stdlib."""

from __future__ import annotations

import dis
import os
import sys
import sysconfig

from . import frameworks
from .trace import Location

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_WALKS_KEPT = 4096  # places ``LocationFinder.here`` remembers its walks from
_WALKS_PER_PLACE = 3  # walks remembered per place (the newest)


def _library_roots() -> tuple[str, ...]:
    roots = {_PKG_DIR}
    for key in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.realpath(path))
            roots.add(path)
    try:  # torch's own folder wherever it lives
        import torch

        roots.add(os.path.dirname(os.path.abspath(torch.__file__)))
    except Exception:  # pragma: no cover - torch is a dependency
        pass
    for name in ("typer", "click", "rich"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            roots.add(os.path.dirname(os.path.abspath(mod.__file__)))
    return tuple(sorted(roots))


def same_chain(frame, chain: tuple):
    """The user's frame when the stack from ``frame`` is the one ``LocationFinder.chain`` read
    (the same code objects, the user's at the same instruction), else None."""
    codes, code, lasti = chain
    for expected in codes:
        if frame is None or frame.f_code is not expected:
            return None
        frame = frame.f_back
    if frame is not None and frame.f_code is code and frame.f_lasti == lasti:
        return frame
    return None


class LocationFinder:
    """Caches, per code object filename, whether a frame belongs to the user."""

    def __init__(self, relative_to: str | None = None):
        self._roots = _library_roots()
        self._is_user: dict[str, bool] = {}
        # the working directory the check started in: relative file names are resolved against
        # it and shown relative to it, also after the script changed directory
        self._rel = os.path.abspath(relative_to or os.getcwd())
        self._display: dict[str, str] = {}
        # The caches below are keyed by the id of a code object, never by the code object: a
        # code object's hash is computed on each lookup from its whole content (the constants
        # of a script's <module> code hold every function the script defines: microseconds per
        # event), and two code objects of the same text compare equal across files. ``_codes``
        # holds each of those code objects, so that no other takes its id while it is a key.
        self._codes: dict[int, object] = {}
        self._locations: dict[tuple, Location] = {}  # (id of code object, line) -> its Location
        self._framework: dict[str, str] = {}  # library filename -> its framework ('' for none)
        # (user code's id and line, the first and last framework frame's code id and line) ->
        # the framework-aware Location of that call path
        self._via: dict[tuple, Location] = {}
        # the hot path's caches (``here``): filename -> True (the user's), a framework's name,
        # or False (any other library); (id of code object, f_lasti) -> its Location (f_lasti names
        # one instruction, so one line: no line-table scan per event)
        self._kinds: dict[str, bool | str] = {}
        self._at: dict[tuple, Location] = {}
        # (id of the start frame's code object, its f_lasti) -> the latest ``_WALKS_PER_PLACE``
        # walks ``here`` made from there, newest first, each (the chain it walked, as ``chain``
        # reads it but without the start frame's own code; the location it found): a stack
        # that ``same_chain`` finds the same gives the same location, read in fewer steps than
        # the walk (the describers of each backward ask from the same places every turn,
        # through one of a few paths of the hooks)
        self._walked: dict[tuple, tuple] = {}

    def is_user_file(self, filename: str) -> bool:
        known = self._is_user.get(filename)
        if known is None:
            if filename.startswith("<"):  # <frozen ...>, <string>: generated code
                known = filename.startswith("<ipython-input-")  # a cell of terminal IPython
            else:
                path = self.absolute(filename)
                known = not any(path == r or path.startswith(r + os.sep) for r in self._roots)
                if known and ("site-packages" in path or "dist-packages" in path):
                    known = False  # third-party libraries: keep looking for the user's line
            self._is_user[filename] = known
        return known

    @property
    def base_dir(self) -> str:
        """The folder shown paths are relative to (the working directory at the start)."""
        return self._rel

    def absolute(self, filename: str) -> str:
        """A code object's file name as an absolute path: a relative one is relative to where
        the check started (the script may have changed directory since)."""
        return os.path.normpath(os.path.join(self._rel, filename))

    def display_path(self, filename: str) -> str:
        shown = self._display.get(filename)
        if shown is None and filename.startswith("<"):
            shown = self._display[filename] = filename
        if shown is None:
            path = self.absolute(filename)
            try:
                rel = os.path.relpath(path, self._rel)
                shown = path if rel.startswith("..") else rel
            except ValueError:  # other drive on Windows
                shown = path
            self._display[filename] = shown
        return shown

    def user_frames(self, frame):
        """The user's frames on a stack, innermost first, from ``frame`` outward: the one stack
        walk every caller shares (locations, the mode watcher, the watchdog, parameter names)."""
        is_user = self.is_user_file
        while frame is not None:
            if is_user(frame.f_code.co_filename):
                yield frame
            frame = frame.f_back

    def location(self, frame) -> Location:
        """A frame's location, cached per code line (the same few call lines recur every step)."""
        code = frame.f_code
        key = (id(code), frame.f_lineno)
        location = self._locations.get(key)
        if location is None:
            self._codes[key[0]] = code
            location = self._locations[key] = Location(self.display_path(code.co_filename),
                                                       key[1], code.co_name)
        return location

    def framework_of(self, filename: str) -> str:
        known = self._framework.get(filename)
        if known is None:
            known = self._framework[filename] = frameworks.framework_of_path(os.path.abspath(filename))
        return known

    def _kind(self, filename: str) -> bool | str:
        """True for a user file, else its framework's name, or False (``here``'s cache)."""
        kind = self._kinds[filename] = True if self.is_user_file(filename) else (
            self.framework_of(filename) or False)
        return kind

    def caller_of(self, skip: int = 1) -> Location | None:
        """The line that called the user's function holding the innermost user frame above the
        caller (``reset(optimizer)`` in the loop, for a ``zero_grad()`` inside ``def reset``):
        None at module level, or when library frames (a framework calling the user's hook) lie
        between that function and the next user frame."""
        kinds = self._kinds
        frame = sys._getframe(skip)
        while frame is not None:
            filename = frame.f_code.co_filename
            kind = kinds.get(filename)
            if kind is True or (kind is None and self._kind(filename) is True):
                break
            frame = frame.f_back
        if frame is None or frame.f_code.co_name == "<module>":
            return None
        outer = frame.f_back
        if outer is None or not self.is_user_file(outer.f_code.co_filename):
            return None
        return self._at_instruction(outer)

    def _at_instruction(self, frame) -> Location:
        """``location(frame)``, cached per code object and instruction (``f_lasti`` names one
        instruction, so one line: no line-table scan per event)."""
        code = frame.f_code
        key = (id(code), frame.f_lasti)
        location = self._at.get(key)
        if location is None:
            self._codes[key[0]] = code
            location = self._at[key] = self.location(frame)
        return location

    def instruction_location(self, frame) -> Location:
        """A frame's location as ``here`` finds it (cached per code object and instruction)."""
        return self._at_instruction(frame)

    def here_and_caller(self, skip: int = 1) -> tuple[Location | None, Location | None]:
        """``(here(skip), caller_of(skip))``, in one walk up the stack when no framework frame
        lies below the innermost user frame (a plain loop's ``zero_grad()``, every update);
        otherwise the two as they are."""
        kinds = self._kinds
        frame = sys._getframe(skip)
        while frame is not None:
            code = frame.f_code
            kind = kinds.get(code.co_filename)
            if kind is None:
                kind = self._kind(code.co_filename)
            if kind is True:
                break
            if kind:  # a framework's frame: ``here`` tells how the call went through it
                return self.here(skip + 1), self.caller_of(skip + 1)
            frame = frame.f_back
        else:  # no user frame: ``here`` falls back to a library frame, ``caller_of`` has none
            return self.here(skip + 1), None
        location = self._at_instruction(frame)
        if code.co_name == "<module>":
            return location, None
        outer = frame.f_back  # as caller_of
        if outer is None or not self.is_user_file(outer.f_code.co_filename):
            return location, None
        return location, self._at_instruction(outer)

    def chain(self, frame) -> tuple | None:
        """What ``here`` walks from ``frame`` when only other libraries' frames (no
        framework's) lie below the user's frame: ``(their code objects, the user frame's code
        object, its f_lasti)``; None otherwise. A stack that ``same_chain`` finds the same
        gives ``here`` the same location (the steady hooks' test of the call site)."""
        kinds = self._kinds
        codes = []
        while frame is not None:
            code = frame.f_code
            kind = kinds.get(code.co_filename)
            if kind is None:
                kind = self._kind(code.co_filename)
            if kind is True:
                return tuple(codes), code, frame.f_lasti
            if kind:
                return None
            codes.append(code)
            frame = frame.f_back
        return None

    def here(self, skip: int = 1) -> Location | None:
        """Location of the innermost user frame above the caller; without one, the outermost
        third-party library frame that called into torch (a framework's own loop).

        When frames of a training framework lie between the call and that user frame, the
        location says so (``via``); when the framework made the call on its own behalf
        (Lightning's automatic optimization), it is the user's hook that caused it
        (``hook``: the loss ``training_step`` returned, the optimizer ``configure_optimizers``
        made) rather than the ``trainer.fit(...)`` line. See graddoctor/frameworks.py."""
        start = sys._getframe(skip)
        key = (id(start.f_code), start.f_lasti)
        for (codes, code, lasti), location in self._walked.get(key, ()):
            # same_chain from the frame after ``start`` (whose code the key names), written out:
            # every event asks; the stack's bottom (None) ends it as a mismatch
            frame = start
            try:
                for expected in codes:
                    frame = frame.f_back
                    if frame.f_code is not expected:
                        break
                else:
                    frame = frame.f_back
                    if frame.f_code is code and frame.f_lasti == lasti:
                        return location
            except AttributeError:
                pass
        kinds = self._kinds
        frame = start
        inner = outer = None  # the innermost and outermost framework frames crossed
        while frame is not None:  # hot path: several times per step
            code = frame.f_code
            kind = kinds.get(code.co_filename)
            if kind is None:
                kind = self._kind(code.co_filename)
            if kind is True:
                if inner is None:
                    location = self._at_instruction(frame)
                    self._remember_walk(key, start, frame, location)
                    return location
                return self._through_framework(start, frame, inner, outer)
            if kind:
                outer = frame
                if inner is None:
                    inner = frame
            frame = frame.f_back
        fallback = None
        frame = start
        while frame is not None:
            filename = frame.f_code.co_filename
            if fallback is None and "site-packages" in filename and not filename.startswith(_PKG_DIR):
                fallback = frame
            frame = frame.f_back
        if fallback is not None:
            f = fallback
            return Location(self.display_path(f.f_code.co_filename), f.f_lineno, f.f_code.co_name)
        return None

    def _remember_walk(self, key: tuple, start, user, location: Location) -> None:
        """``here``'s walk from ``start`` to the user's frame ``user`` (no framework frame
        between), kept for the next call from the same instruction."""
        walked = self._walked
        known = walked.get(key, ())
        if user is start or (not known and len(walked) >= _WALKS_KEPT):
            return  # (the user's own frame: nothing walked)
        codes = []
        frame = start
        while frame is not user:
            codes.append(frame.f_code)
            frame = frame.f_back
        del codes[0]  # start's own (the key's)
        self._codes[key[0]] = start.f_code
        walked[key] = (((tuple(codes), user.f_code, user.f_lasti), location),
                       *known[:_WALKS_PER_PLACE - 1])

    def _through_framework(self, start, user, inner, outer) -> Location:
        """The location of a call that reached the user's frame ``user`` through a framework's
        frames (between ``start`` and ``user``), cached per user line and the framework's first
        and last frame on the way (their code and line: the same call path through the
        framework; the frames in between are walked again only on a miss)."""
        key = (id(user.f_code), user.f_lineno, id(inner.f_code), inner.f_lineno, id(outer.f_code),
               outer.f_lineno)
        found = self._via.get(key)
        if found is None:
            codes = self._codes
            codes[key[0]], codes[key[2]], codes[key[4]] = user.f_code, inner.f_code, outer.f_code
            crossed = []
            frame = start
            while frame is not user:
                if self.framework_of(frame.f_code.co_filename):
                    crossed.append(frame)
                frame = frame.f_back
            via = self.framework_of(crossed[-1].f_code.co_filename)  # the one the user called
            found = self._hook_location(crossed, via, user)
            if found is None:
                base = self.location(user)
                found = Location(base.path, base.line, base.function, via)
            self._via[key] = found
        return found

    def _hook_location(self, crossed, via: str, user=None) -> Location | None:
        """The user's hook behind a framework's own call, from its table: the innermost framework
        function listed there names the hooks; the first one the user wrote (its code lies in a
        user file), on the object found through the framework frames' ``self``, wins. None (the
        user's own line) when the user called that function themselves
        (``frameworks.USER_CALLABLE``)."""
        for frame in crossed:  # innermost first
            code = frame.f_code
            table = frameworks.HOOKS.get(self.framework_of(code.co_filename))
            key = frameworks.hook_key(code.co_filename, code.co_name)
            hooks = table and table.get(key)
            if not hooks:
                continue
            if user is not None and frame.f_back is user and key in frameworks.USER_CALLABLE:
                return None
            for owner in self._owners(crossed):
                for hook in hooks:
                    code = _hook_code(owner, hook)
                    if code is not None and self.is_user_file(code.co_filename):
                        return Location(self.display_path(code.co_filename), _hook_line(code, hook),
                                        hook, via, hook)
            return None
        return None

    @staticmethod
    def _owners(crossed):
        """The objects whose hooks may have caused the call: each framework frame's ``self`` and
        what it trains (``.lightning_module``, ``.model``, ``.trainer.lightning_module``)."""
        seen = set()
        for frame in crossed:
            try:
                obj = frame.f_locals.get("self")
            except Exception:
                continue
            if obj is None:
                continue
            candidates = [obj]
            try:
                trainer = getattr(obj, "trainer", None)
            except Exception:  # a LightningModule not attached to a Trainer raises
                trainer = None
            for holder in (obj, trainer):
                for attr in frameworks.OWNER_ATTRS:
                    try:
                        candidates.append(getattr(holder, attr, None))
                    except Exception:  # a property that cannot answer yet
                        pass
            for cand in candidates:
                if cand is not None and id(type(cand)) not in seen:
                    seen.add(id(type(cand)))
                    yield cand

    def from_traceback(self, tb) -> Location | None:
        """The deepest user frame of an exception's traceback (where the user's code failed)."""
        found = None
        while tb is not None:
            filename = tb.tb_frame.f_code.co_filename
            if self.is_user_file(filename):
                found = Location(self.display_path(filename), tb.tb_lineno, tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
        return found


def site_key(frame, held: dict) -> tuple[int, int]:
    """``(id of the frame's code object, its line)``: a key for the sets and dicts a watcher
    consults on every call. A code object is never the key itself: its hash is computed from
    its whole content on each lookup (microseconds for a script's module code, whose constants
    hold every function the script defines), and two of the same text in two files are equal.
    ``held`` (id -> code object, the caller's) keeps each one alive, so that no other code
    object takes its id while it is a key."""
    code = frame.f_code
    key = id(code)
    if key not in held:
        held[key] = code
    return key, frame.f_lineno


def _hook_line(code, hook: str) -> int:
    """The line of a hook to point at: the last ``return <value>`` of one whose result the
    framework uses (the loss of ``training_step``), else its ``def`` line."""
    if hook in frameworks.RETURNING:
        lines = []
        last = code.co_firstlineno
        for ins in dis.get_instructions(code):
            if ins.positions is not None and ins.positions.lineno:
                last = ins.positions.lineno
            if ins.opname == "RETURN_VALUE" or ins.opname == "RETURN_CONST":
                lines.append(last)
        explicit = [n for n in lines if n != code.co_firstlineno]
        if explicit:
            return max(explicit)
    return code.co_firstlineno


def _hook_code(owner, hook: str):
    """The code of a hook: a method of the owner's class (an override), or a plain function the
    owner holds (the Trainer's ``compute_loss_func``)."""
    code = getattr(getattr(type(owner), hook, None), "__code__", None)
    if code is None:
        try:
            held = vars(owner).get(hook)
        except TypeError:  # no __dict__
            return None
        code = getattr(held, "__code__", None)
    return code
