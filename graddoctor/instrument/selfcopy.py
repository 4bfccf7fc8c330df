"""A weight copy that is no copy, written back onto the parameters it was taken from: the write
copies a parameter's memory onto itself and changes nothing.

Lookahead keeps "slow weights" and every k steps pulls them toward the fast ones and copies them
back (``p.data.copy_(slow)``); SAM saves the weights before its ascent and restores them before
the base step (``p.data = state[p]["old_p"]``); early stopping restores the best weights
(``p.data.copy_(best[n])``); an EMA/SWA copy is lerped toward the model. When that copy was
taken as ``p.data``, ``p.detach()`` or the parameter itself (``[p.data for p in params]``,
no ``clone()``), it is the parameter's own memory: the optimizer's in-place updates (and the
script's ascent) moved it too, and the restore writes the current weights onto themselves.
Lookahead then never steps back, SAM's base step starts from the perturbed weights ``w + e``,
the "best" model is the last one. Nothing fails.

The invariant, over the writes of the script's own code: ``Tensor.copy_(src)``,
``Tensor.set_(src)`` and ``t.data = src`` (not ``lerp_``, which torch's Adam calls per parameter) whose destination is the
memory of an optimizer-owned parameter and whose source is that very memory (the same object, or
one starting at the same address with the same shape, strides and dtype). A memory that two
parameter objects share (weights tied through ``.data``, re-tied every forward) is left alone.
A ``self_copy`` aside names the parameters and the write (loc: the script's line), once per
parameter and line (16 a line, 8 lines); the rule (rules/weight_copy_aliases_params.py) reads the line's source (a source that is a
call, ``p.data = p.data.to(device)``, returns its input when there is nothing to convert: no
snapshot) and names the assignment that stored the copy.

Cost: the three writes are wrapped until the optimizers have stepped ``_STEPS`` times (Lookahead
syncs every 5 to 10 steps), then put back; each wrapped call compares two tensors' addresses
and shapes (no device read), and only a write onto its own memory looks its caller up.
"""

from __future__ import annotations

import sys

import torch

from .. import events as ev
from .dependency import close_before_compile
from .inlinable import watched
from .recorder import Recorder
from .topics import STEPPED
from .patcher import put_back

_STEPS = 12  # optimizer steps the wrappers stay for
_LINES = 8  # lines told at most
_PER_LINE = 16  # parameters told per line at most
_LABEL = "weight self-copy"
# not ``lerp_``: torch's own Adam and AdamW (single-tensor, the CPU default) call it once per
# parameter per step, so its wrapper would add a Python call per tensor to every early step
_METHODS = ("copy_", "set_")


def _same_memory(dst, src) -> bool:
    if src is dst:
        return True
    if not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor):
        return False
    try:
        return (src.data_ptr() == dst.data_ptr() and src.data_ptr() != 0 and src.dtype == dst.dtype
                and src.shape == dst.shape and src.stride() == dst.stride())
    except Exception:  # no storage (a wrapper subclass, sparse, a functorch tensor)
        return False


class SelfCopyWatcher:
    def __init__(self, rec: Recorder, owned):
        self.rec = rec
        self._owned = owned  # read-only view of the optimizer-owned pids
        self._open = True
        self._steps = 0
        self._lines: dict = {}  # (file, line) -> the pids told there
        self._restore: list = []  # (owner, name, original) put back when the window ends

    def install(self, patcher) -> None:
        for name in _METHODS:
            original = getattr(torch.Tensor, name, None)
            if original is None:
                continue
            wrapper = patcher.patch(torch.Tensor, name, watched(original, self._before(name)))
            self._restore.append((torch.Tensor, name, original, wrapper))
        data = getattr(torch._C.TensorBase, "data", None)
        if data is not None and hasattr(data, "__set__") and "data" not in vars(torch.Tensor):
            watcher = self

            def get(tensor):
                return data.__get__(tensor, type(tensor))

            def set_(tensor, value):
                if watcher._open:
                    watcher._seen(".data =", tensor, value, sys._getframe(1))
                data.__set__(tensor, value)

            wrapper = patcher.patch(torch.Tensor, "data", property(get, set_, doc=data.__doc__))

            self._restore.append((torch.Tensor, "data", data, wrapper))
        close_before_compile(patcher, self._close)

    def after_step(self, opt, optimizer) -> None:
        self._steps += 1
        if self._steps >= _STEPS:
            self._close()

    def _close(self) -> None:
        if not self._open:
            return
        self._open = False
        self.rec.retire(STEPPED, self.after_step)
        for owner, name, original, wrapper in self._restore:
            try:  # not from under another watcher's wrapper
                put_back(owner, name, original, wrapper)
            except Exception as exc:
                self.rec.internal_error(_LABEL, exc)

    def _before(self, name: str):
        def before(args, kwargs) -> None:
            if not self._open or not args:
                return
            src = args[1] if len(args) > 1 else kwargs.get("end" if name == "lerp_" else
                                                             "source" if name == "set_" else "src")
            if src is None:
                return
            self._seen(name, args[0], src, sys._getframe(2))
        return before

    def _seen(self, how: str, dst, src, frame) -> None:
        try:
            if not _same_memory(dst, src):
                return
            if not self.rec.finder.is_user_file(frame.f_code.co_filename):
                return
            line = (frame.f_code.co_filename, frame.f_lineno)
            if line not in self._lines and len(self._lines) >= _LINES:
                return
            pids = self._owners(dst)
            if len(pids) != 1:
                return  # not a stepped parameter's, or a memory two parameters share (tying)
            told = self._lines.setdefault(line, set())
            if pids[0] in told or len(told) >= _PER_LINE:
                return
            told.add(pids[0])
            self.rec.emit_aside(ev.self_copy(params=pids, how=how, steps=self._steps), self.rec.here())
        except Exception as exc:
            self._close()
            self.rec.internal_error(_LABEL, exc)

    def _owners(self, dst) -> list[int]:
        """The optimizer-owned parameters whose memory ``dst`` is (two: tied weights)."""
        ptr, shape = dst.data_ptr(), dst.shape
        tensors = self.rec.tensors
        found = []
        for pid in self._owned:
            param = tensors.object(pid)
            if param is not None and param.data_ptr() == ptr and param.shape == shape:
                found.append(pid)
                if len(found) > 1:
                    break
        return found
