"""Recurrent and attention modules built with ``batch_first=False`` (torch's default) and given
batch-first input: ``nn.LSTM(6, 16)`` fed ``(batch, seq, feature)`` runs over the batch as if it
were time, attention mixes different samples of the batch. Nothing fails and the model trains.

What is watched:

* The constructors of the modules that own a ``batch_first`` flag (``RNNBase``: RNN, LSTM, GRU;
  ``MultiheadAttention``; ``TransformerEncoderLayer`` / ``TransformerDecoderLayer``;
  ``Transformer``), wrapped: an instance built by the script's own code (the first frame outside
  torch is the user's) with ``batch_first`` False becomes a *site*, with the location of that
  construction (where ``batch_first=True`` goes). Only the outermost construction counts (the
  layers and attention a ``Transformer`` builds are its parts); ``TransformerEncoder`` /
  ``TransformerDecoder`` clone their layer, and the clones share its site.
* Only once a site exists (nothing before: a script without such a module pays nothing), the
  ``forward`` of those classes is patched, as modes.py patches BatchNorm's and dropout's: no cost
  to other modules, and nothing of graddoctor's on the script's objects (a forward pre-hook
  registered on each instance would be a closure in its hooks dict, which ``torch.save(model)``
  cannot pickle, and which ``copy.deepcopy`` would copy into the clones). So are the loss
  functions of ``torch.nn.functional`` (their ``nn`` modules call them), which remember the
  latest targets' first two dimensions.

A site's forward with a 3-D input ``(d0, d1, ...)``, ``d0 != d1``, with gradients on (an
evaluation under ``no_grad`` over a whole split is not compared: the DataLoader's latest batch
and the latest targets are the training loop's, and an epoch's partial last batch as long as the
sequence made ``model(x_test)`` look seq-first) is compared with the batch
sizes known at that moment: the number of samples in the batch a DataLoader served last
(``DataLoaderWatcher.batch_size``: its ``batch_size``, less for an epoch's partial last batch),
and the leading dimension of each of the latest (``TARGETS``) distinct loss targets, unless
that target is laid out like the input (its first two dimensions are ``(d0, d1)``: a per-time-step target of a seq-first model)
or ``d1`` is 1 (one sequence at a time, ``(T, 1, F)`` against a ``(T,)`` per-step target). The
input looks *batch-first* when ``d0`` is a batch size and ``d1`` is none, *seq-first* when ``d1``
is one and ``d0`` is not. A ``batch_layout`` aside event is recorded at the site's construction
the second time it looks batch-first, and the first time it looks seq-first (the rule wants the
first and none of the second). Only shapes are read: no device work, no host sync. Each site
is looked at for its first ``MAX_LOOKS`` forwards whose batch size is known.
"""

from __future__ import annotations

import functools
import os
import sys
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from .. import events as ev
from .inlinable import watched
from .recorder import Recorder

MIN_LOOKS = 2  # batch-first forwards before one is recorded (one could be a coincidence)
MAX_LOOKS = 64  # forwards judged per site
TARGETS = 4  # loss targets remembered (the latest distinct ones)
MAX_SITES = 4096  # modules watched (a model built per trial must not grow this without bound)
LOSSES = ("cross_entropy", "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
          "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div")
# the classes whose forward is watched, and the name of the input that carries the layout
FORWARDS = ((nn.RNN, "input"), (nn.LSTM, "input"), (nn.GRU, "input"),
            (nn.MultiheadAttention, "query"), (nn.TransformerEncoderLayer, "src"),
            (nn.TransformerDecoderLayer, "tgt"), (nn.Transformer, "src"))
BUILDERS = (nn.RNNBase, nn.MultiheadAttention, nn.TransformerEncoderLayer,
            nn.TransformerDecoderLayer, nn.Transformer)
CLONERS = ((nn.TransformerEncoder, "encoder_layer"), (nn.TransformerDecoder, "decoder_layer"))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def batch_first(module) -> bool | None:
    """The module's ``batch_first``: its own, or its self-attention's (a Transformer layer)."""
    flag = getattr(module, "batch_first", None)
    if flag is None:
        flag = getattr(getattr(module, "self_attn", None), "batch_first", None)
    return flag if isinstance(flag, bool) else None


class _Site:
    """One construction of a module with ``batch_first`` False (its clones share it)."""

    __slots__ = ("loc", "cls", "looks", "batch_first", "seq_first", "mark")

    def __init__(self, loc, cls: str):
        self.loc = loc
        self.cls = cls
        self.mark = None  # the batch and loss count of its latest look: one look per batch
        self.looks = 0  # forwards judged (a batch size was known)
        self.batch_first = 0  # of those, how many looked batch-first
        self.seq_first = 0  # ... and seq-first


def _json(location) -> list | None:
    return [location.path, location.line, location.function] if location is not None else None


class BatchFirstWatcher:
    def __init__(self, rec: Recorder, loader):
        self.rec = rec
        self.loader = loader  # the DataLoaderWatcher: ``batch_size()`` of the batch it served last
        self.patcher = None
        self._armed = False
        self._building = 0  # constructions of watched classes in progress (nested: parts)
        # id(module) -> (weak reference, its site): the modules watched
        self._sites: dict[int, tuple[weakref.ref, _Site]] = {}
        # the first two dimensions of the latest loss targets, newest first, each once (a step
        # with several losses: each model's own target is among them)
        self._targets: list[tuple] = []
        self._losses = 0  # loss calls seen (a site looks once per batch: its clones, a loop
        # calling it per time step, run it several times on one)

    # -- sites -----------------------------------------------------------------------------
    def site(self, module) -> _Site | None:
        entry = self._sites.get(id(module))
        return entry[1] if entry is not None and entry[0]() is module else None

    def _add(self, module, site: _Site) -> None:
        if len(self._sites) >= MAX_SITES:
            return
        key, sites = id(module), self._sites

        def forget(ref, key=key):
            if sites.get(key, (None,))[0] is ref:
                del sites[key]

        sites[key] = (weakref.ref(module, forget), site)
        if not self._armed:
            self._arm()

    def _built(self, module) -> None:
        """A construction of a watched class has ended (the outermost one)."""
        if batch_first(module) is not False:
            return
        frame = sys._getframe(2)  # the wrapper's caller
        while frame is not None and frame.f_code.co_filename.startswith((_TORCH_DIR, _PKG_DIR)):
            frame = frame.f_back  # LSTM.__init__ calling RNNBase.__init__, graddoctor's wrappers
        finder = self.rec.finder
        if frame is None or not finder.is_user_file(frame.f_code.co_filename):
            return  # a library's own module: it lays out its inputs itself
        self._add(module, _Site(finder.location(frame), type(module).__name__))

    def _wrap_init(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def __init__(module, *args, **kwargs):
            watcher._building += 1
            try:
                original(module, *args, **kwargs)
            finally:
                watcher._building -= 1
            if not watcher._building:
                try:
                    watcher._built(module)
                except Exception as exc:
                    rec.internal_error(f"{type(module).__name__}.__init__", exc)

        return __init__

    def _wrap_cloner(self, original, layer_arg: str):
        """TransformerEncoder/Decoder: the clones of a watched layer share its site."""
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def __init__(module, *args, **kwargs):
            original(module, *args, **kwargs)
            try:
                layer = args[0] if args else kwargs.get(layer_arg)
                site = watcher.site(layer) if layer is not None else None
                if site is not None:
                    for clone in getattr(module, "layers", ()):
                        if clone is not layer:
                            watcher._add(clone, site)
            except Exception as exc:
                rec.internal_error(f"{type(module).__name__}.__init__", exc)

        return __init__

    # -- forwards --------------------------------------------------------------------------
    def _wrap_forward(self, original, name: str):
        watcher, rec, sites = self, self.rec, self._sites

        def before(args, kwargs) -> None:
            entry = sites.get(id(args[0]))  # hot path: one dict lookup for a module not watched
            if entry is None or entry[0]() is not args[0]:
                return
            try:
                site = entry[1]
                if site.looks < MAX_LOOKS and not (rec.running_backwards and rec.in_backward()):
                    watcher._look(site, args[0], args[1] if len(args) > 1 else kwargs.get(name))
            except Exception as exc:
                rec.internal_error(f"{type(args[0]).__name__}.forward", exc)

        return watched(original, before)

    def batch_sizes(self, d0: int, d1: int) -> list[tuple[int, str]]:
        """The batch sizes known now, each with where it comes from ("loader" |
        "loss_target"), for an input whose first two dimensions are ``(d0, d1)``."""
        sizes = []
        size = self.loader.batch_size()
        if size:
            sizes.append((size, "loader"))
        if d1 != 1:
            sizes += [(target[0], "loss_target") for target in self._targets
                      if target[:2] != (d0, d1)]
        return sizes

    def _look(self, site: _Site, module, x) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or batch_first(module) is not False:
            return  # unbatched (2-D), a PackedSequence, or batch_first set since
        if not torch.is_grad_enabled():
            return  # an evaluation pass (a whole split at once): the batch sizes known are stale
        d0, d1 = int(x.shape[0]), int(x.shape[1])
        if d0 == d1:
            return  # T == B: either way
        sizes = self.batch_sizes(d0, d1)
        if not sizes:
            return
        batch = self.loader.current_batch
        mark = (None if batch is None else tuple(batch), self._losses)
        if mark == site.mark:
            return
        site.mark = mark
        site.looks += 1
        first = [s for s in sizes if s[0] == d0]
        second = [s for s in sizes if s[0] == d1]
        if first and not second:
            site.batch_first += 1
            if site.batch_first == MIN_LOOKS:
                self._record(site, "batch_first", d0, d1, first[0])
        elif second and not first:
            site.seq_first += 1
            if site.seq_first == 1:
                self._record(site, "seq_first", d0, d1, second[0])

    def _record(self, site: _Site, layout: str, d0: int, d1: int, size: tuple[int, str]) -> None:
        rec = self.rec
        call = rec.here()  # the user's line that called the module
        forwards = site.batch_first if layout == "batch_first" else site.seq_first
        rec.emit_aside(ev.batch_layout(cls=site.cls, layout=layout, shape=[d0, d1], batch=size[0],
                                       source=size[1], forwards=forwards, call=_json(call)),
                       site.loc or call)

    # -- loss targets ----------------------------------------------------------------------
    def _wrap_loss(self, original, fn: str):
        watcher, rec = self, self.rec

        def before(args, kwargs) -> None:
            target = args[1] if len(args) > 1 else kwargs.get("target")
            try:
                watcher._losses += 1
                if isinstance(target, torch.Tensor) and target.dim():
                    watcher._remember(tuple(target.shape[:2]))
            except Exception as exc:  # pragma: no cover - defensive
                rec.internal_error(f"F.{fn}", exc)

        loss = watched(original, before)  # torch.compile inlines it (inlinable.py)
        prepare = getattr(original, "__prepare_scriptable__", None)
        loss.__prepare_scriptable__ = prepare or (lambda: original)  # torch.jit.script: torch's own
        return loss

    def _remember(self, target: tuple) -> None:
        targets = self._targets
        if targets and targets[0] == target:
            return  # hot path: the same loss every step
        if target in targets:
            targets.remove(target)
        targets.insert(0, target)
        del targets[TARGETS:]

    def _arm(self) -> None:
        """Watch the forwards and the loss targets, from the first site on."""
        self._armed = True
        patcher = self.patcher
        if patcher is None:
            return
        for cls, name in FORWARDS:
            patcher.patch(cls, "forward", self._wrap_forward(cls.forward, name))
        for fn in LOSSES:
            original = getattr(F, fn, None)
            if original is not None:
                patcher.patch(F, fn, self._wrap_loss(original, fn))

    def install(self, patcher) -> None:
        self.patcher = patcher
        for cls in BUILDERS:
            patcher.patch(cls, "__init__", self._wrap_init(cls.__init__))
        for cls, layer_arg in CLONERS:
            patcher.patch(cls, "__init__", self._wrap_cloner(cls.__init__, layer_arg))
