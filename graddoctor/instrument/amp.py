"""GradScaler (``torch.amp.GradScaler`` and the older ``torch.cuda.amp.GradScaler``).

The class methods ``scale``, ``unscale_``, ``step`` and ``update`` are patched, so the calls are
seen also when the scaler disabled itself (``torch.cuda.amp.GradScaler()`` without CUDA: then
``scale`` returns the loss unchanged, but the call order still tells the bug).

* ``scale(loss)`` marks the tensor it returns; the backward of a marked tensor carries
  ``scaled=True``, the scale and the scaler (a loss describer of ``BackwardWatcher``).
* ``unscale_(opt)`` -> ``unscale`` event; ``implicit=True`` when ``step`` called it itself.
* ``step(opt)`` that did not run the optimizer (inf/NaN found) -> a ``step`` event with
  ``skipped=True`` (the ledger treats it as consuming the gradients, like the user does with the
  ``zero_grad`` that follows), then a ``scaler_step`` event.
* ``update()`` -> ``scaler_update`` with the new scale.
* construction -> ``scaler_init`` at the user's constructor line (with the ``enabled`` it was
  given, so that a scaler that turned itself off without CUDA is told from one turned off on
  purpose); ``load_state_dict`` -> ``scaler_load``. Once per construction or load.
* ``autocast.__enter__`` (the script's own float16 autocast with grad enabled): the next
  backward carries ``autocast_fp16`` (where that autocast was entered), scaled or not.

Host reads: the scale once per ``scale()`` and ``update()`` call; never per parameter.
"""

from __future__ import annotations

import functools
import inspect
import weakref

import torch

from .. import events as ev
from .identities import Identities
from .lossfactor import constant_term, loss_scaling, may_be_negated, negated_criterion
from .optim import plain_number
from .recorder import Deferred, Recorder
from .subclasses import Depth, patch_tree
from .topics import GRADS_UNSCALED


class ScaleCopies:
    """The current scale of each scaler as a ``Deferred`` copy, read once when the run ends:
    recording it never synchronises the host with the device (the same path on CPU, so a CPU
    run shows it too). The scale changes only in ``update()`` (in place): while the tensor's
    version is unchanged the previous copy is shared, one copy per update instead of three."""

    def __init__(self) -> None:
        self._last: dict[int, tuple] = {}  # id(scaler) -> (scale tensor, its _version, Deferred)

    def __call__(self, scaler) -> Deferred | None:
        scale = getattr(scaler, "_scale", None)
        if not scaler.is_enabled() or scale is None:
            return None
        last = self._last.get(id(scaler))
        if last is not None and last[0] is scale and last[1] == scale._version:
            return last[2]
        copy = Deferred(scale.detach().clone())
        self._last[id(scaler)] = (scale, scale._version, copy)
        return copy


# the run's first backwards whose loss is walked for a term with no graph (``loss_constant``)
CONSTANT_CHECKS = 16


class GradScalerWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._marked: dict[int, tuple[weakref.ref, dict]] = {}  # id(tensor) -> (ref, facts)
        self._constant_checks = 0  # backwards whose loss was looked at for a term without graph
        self.scaler_id = Identities()  # scaler -> its number
        self._unscaled = rec.subscribers(GRADS_UNSCALED)
        # an enabled, unfused GradScaler.step is running (read by the optimizer watcher: the
        # step runs only if unscale_ found every value finite)
        self.in_scaler_step = False
        self._in_step = Depth()
        self._in_unscale = Depth()
        self._in_scale = Depth()
        self._in_update = Depth()
        self._in_init = Depth()
        self._in_load = Depth()
        self._scale_value = ScaleCopies()
        self._fp16_at: list | None = None  # [path, line] of a float16 autocast since the last backward

    # -- marking scaled tensors --------------------------------------------------------------
    def _mark(self, out, facts: dict) -> None:
        if isinstance(out, torch.Tensor):
            key = id(out)
            marked = self._marked

            def forget(ref, key=key):
                entry = marked.get(key)
                if entry is not None and entry[0] is ref:
                    del marked[key]

            marked[key] = (weakref.ref(out, forget), facts)
        elif isinstance(out, (list, tuple)):
            for item in out:
                self._mark(item, facts)

    def _loss_facts(self, tensors) -> dict | None:
        """The facts of the first of the backward'ed tensors that ``scale`` returned."""
        items = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
        return next((f for t in items if (f := self._facts(t)) is not None), None)

    def _facts(self, tensor) -> dict | None:
        entry = self._marked.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            return entry[1]
        return None

    def describe_loss(self, tensors) -> dict:
        fp16, self._fp16_at = self._fp16_at, None
        facts = self._loss_facts(tensors) if self._marked else None  # no scaled tensor alive: none
        if facts is None:
            factor, terms = loss_scaling(tensors)
            out = {"loss_scale_factor": factor, "loss_terms": terms}
        else:
            factor, terms = loss_scaling(tensors, skip_top=bool(facts["enabled"]))
            out = {"scaled": True, "scale": facts["scale"], "scaler": facts["scaler"],
                   "scaler_enabled": facts["enabled"], "loss_scale_factor": factor,
                   "loss_terms": terms}
        if fp16 is not None:
            out["autocast_fp16"] = fp16
        if may_be_negated(tensors):
            negated = negated_criterion(tensors)
            if negated is not None:
                out["loss_negated"] = negated
        if self._constant_checks < CONSTANT_CHECKS:
            self._constant_checks += 1
            if constant_term(tensors):
                out["loss_constant"] = True
        return out

    def _wrap_autocast_enter(self, original):
        """Note where a float16 autocast with gradients on is entered (what the next backward
        goes through); the context is entered exactly as it would be."""
        watcher = self

        @functools.wraps(original)
        def __enter__(ctx):
            result = original(ctx)
            try:
                if watcher._fp16_at is None and getattr(ctx, "_enabled", False) \
                        and getattr(ctx, "fast_dtype", None) is torch.float16 and torch.is_grad_enabled():
                    loc = watcher.rec.here()
                    if loc is not None:
                        watcher._fp16_at = [loc.path, loc.line]
            except Exception as exc:
                watcher.rec.internal_error("autocast", exc)
            return result

        return __enter__

    # -- wrappers --------------------------------------------------------------------------
    def _guarded(self, original, depth: Depth, where: str, record):
        """Wrap a GradScaler method: the original runs as it is, then ``record(scaler, result,
        *args, **kwargs)`` once per outermost call (the scaler calls its own methods, and an
        override calls ``super()``); a failure of ours becomes an internal error."""
        rec = self.rec

        @functools.wraps(original)
        def wrapper(scaler, *args, **kwargs):
            if depth.active:
                return original(scaler, *args, **kwargs)
            with depth:
                result = original(scaler, *args, **kwargs)
            try:
                record(scaler, result, *args, **kwargs)
            except Exception as exc:
                rec.internal_error(where, exc)
            return result

        return wrapper

    def _wrap_scale(self, original):
        return self._guarded(original, self._in_scale, "GradScaler.scale", self._record_scale)

    def _record_scale(self, scaler, result, *args, **kwargs) -> None:
        self._mark(result, {"scaler": self.scaler_id(scaler), "enabled": scaler.is_enabled(),
                            "scale": self._scale_value(scaler)})

    def _wrap_unscale(self, original):
        return self._guarded(original, self._in_unscale, "GradScaler.unscale_", self._record_unscale)

    def _record_unscale(self, scaler, result, optimizer) -> None:
        rec = self.rec
        opt = rec.optimizer_id(optimizer)
        pids, states = rec.grads.refresh_known(rec.opt_params.get(opt, ()))  # unscaling changed them in place
        for subscriber in self._unscaled.now:
            subscriber(pids)
        if scaler.is_enabled():  # it checked every value: finite, if scaler.step steps
            rec.grads.vouch_finite(pids, states, conditional=True)
        rec.emit(ev.unscale(scaler=self.scaler_id(scaler), opt=opt, enabled=scaler.is_enabled(),
                            implicit=self._in_step.active, scale=self._scale_value(scaler)),
                 rec.here(2))

    def _wrap_step(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def step(scaler, optimizer, *args, **kwargs):
            if watcher._in_step.active:
                return original(scaler, optimizer, *args, **kwargs)
            if rec.progress.stop_requested:
                rec.progress.maybe_stop(rec.optimizer_id(optimizer))
            before = rec.progress.steps
            outer = watcher.in_scaler_step
            fused = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
            # unfused: torch runs optimizer.step only if unscale_ found no inf/NaN
            watcher.in_scaler_step = scaler.is_enabled() and not fused
            try:
                with watcher._in_step:
                    result = original(scaler, optimizer, *args, **kwargs)
            finally:
                watcher.in_scaler_step = outer
            try:
                watcher._after_step(scaler, optimizer, before, fused)
            except Exception as exc:
                rec.internal_error("GradScaler.step", exc)
            return result

        return step

    def _after_step(self, scaler, optimizer, steps_before: int, fused: bool) -> None:
        rec = self.rec
        enabled = scaler.is_enabled()
        opt = rec.optimizer_id(optimizer)
        loc = rec.here(3)
        found_inf = None
        if enabled and fused:  # the optimizer skips inside its own kernel: ask the scaler
            state = scaler._per_optimizer_states.get(id(optimizer), {})
            found_inf = bool(sum(float(v.item()) for v in state.get("found_inf_per_device", {}).values()))
        skipped = (enabled and not fused and rec.progress.steps == steps_before
                   and isinstance(optimizer, torch.optim.Optimizer))
        if skipped:
            found_inf = True
            without = rec.grads.after_step(rec.opt_params.get(opt, ()))
            rec.emit(ev.step(opt=opt, closure=False, skipped=True, without_grad=without), loc)
            rec.progress.count_step(opt)
        elif enabled and not fused:
            found_inf = False
        rec.emit(ev.scaler_step(scaler=self.scaler_id(scaler), opt=opt, enabled=enabled,
                                fused=fused, skipped=bool(found_inf), found_inf=found_inf), loc)

    def _wrap_update(self, original):
        return self._guarded(original, self._in_update, "GradScaler.update", self._record_update)

    def _record_update(self, scaler, result, *args, **kwargs) -> None:
        self.rec.emit(ev.scaler_update(scaler=self.scaler_id(scaler), enabled=scaler.is_enabled(),
                                       scale=self._scale_value(scaler)), self.rec.here(2))

    def _wrap_init(self, original):
        watcher, rec = self, self.rec
        try:
            signature = inspect.signature(original)
        except (TypeError, ValueError):
            signature = None

        @functools.wraps(original)
        def __init__(scaler, *args, **kwargs):
            if watcher._in_init.active:  # torch.cuda.amp.GradScaler calls the base's
                return original(scaler, *args, **kwargs)
            with watcher._in_init:
                original(scaler, *args, **kwargs)
            try:
                watcher._constructed(scaler, signature, args, kwargs)
            except Exception as exc:
                rec.internal_error("GradScaler construction", exc)

        return __init__

    def _constructed(self, scaler, signature, args, kwargs) -> None:
        requested = None
        if signature is not None:
            try:
                bound = signature.bind(scaler, *args, **kwargs)
                bound.apply_defaults()
                given = bound.arguments.get("enabled")
                requested = given if isinstance(given, bool) else None
            except TypeError:
                pass
        self.rec.emit(ev.scaler_init(scaler=self.scaler_id(scaler), cls=type(scaler).__name__,
                                     enabled=bool(scaler.is_enabled()), requested=requested,
                                     init_scale=plain_number(getattr(scaler, "_init_scale", None))),
                      self.rec.here(3))

    def _wrap_load(self, original):
        return self._guarded(original, self._in_load, "GradScaler.load_state_dict", self._record_load)

    def _record_load(self, scaler, result, *args, **kwargs) -> None:
        self.rec.emit(ev.scaler_load(scaler=self.scaler_id(scaler)), self.rec.here(2))

    def install(self, patcher) -> None:
        base = torch.amp.GradScaler
        patch_tree(patcher, base, "scale", self._wrap_scale)
        patch_tree(patcher, base, "unscale_", self._wrap_unscale)
        patch_tree(patcher, base, "step", self._wrap_step)
        patch_tree(patcher, base, "update", self._wrap_update)
        patch_tree(patcher, base, "__init__", self._wrap_init)
        patch_tree(patcher, base, "load_state_dict", self._wrap_load)
        autocast = torch.amp.autocast_mode.autocast
        patcher.patch(autocast, "__enter__", self._wrap_autocast_enter(autocast.__enter__))
