"""Learning-rate schedulers: their construction and every user call of ``scheduler.step()``.

``LRScheduler.step`` is patched on the base class and on each loaded subclass that overrides it
(``ReduceLROnPlateau``, ``SequentialLR``, ``ChainedScheduler``, ``CosineAnnealingWarmRestarts``,
...). Calls made by PyTorch itself are not the user's: the initial step inside the constructor
(``_initial_step``) and the steps a ``SequentialLR`` / ``ChainedScheduler`` makes on the
schedulers it holds. PyTorch also wraps ``optimizer.step`` on the instance for its own "scheduler
before optimizer" warning; that wrapper still runs the class's step, so the global optimizer
step hooks keep firing.

``__init__`` is patched the same way (outermost call only: a subclass's ``__init__`` calls
``super().__init__``), so that the lr timeline (analysis/lr.py) knows each scheduler's optimizer,
its schedule's arguments and the lr it set at construction (a warm-up's first factor), and a
scheduler that is built but never stepped can be told. Each step records the lrs it wrote, read
after the step: a few dict reads per call.

``scheduler.lr = 1e-3`` (or ``learning_rate``) sets an attribute no torch scheduler reads: the
scheduler and its optimizer take the lr from ``param_groups``. A data descriptor per name on
``LRScheduler`` (``WatchedAttribute``: nothing else a scheduler sets goes through it) records
it as an ``optimizer_attr`` event with the scheduler's class, for a scheduler whose class
is torch's in ``step`` and ``get_lr`` and gives the name no meaning of its own, once per line,
scheduler and name, unless its optimizer's groups hold that lr already.
"""

from __future__ import annotations

import functools
import numbers
import sys

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from .. import events as ev
from .identities import Identities
from .optim import group_lrs, plain_number
from .patcher import WatchedAttribute
from .recorder import Recorder
from .subclasses import Depth, patch_tree

# the attributes that say a schedule's length and shape, as torch's schedulers name them
ARGS = ("T_max", "eta_min", "total_iters", "start_factor", "end_factor", "factor", "step_size",
        "gamma", "milestones", "T_0", "T_mult", "total_steps", "power", "patience", "cooldown",
        "total_size", "last_epoch")


def schedule_args(scheduler) -> dict:
    attrs = getattr(scheduler, "__dict__", {})
    args: dict = {}
    for name in ARGS:
        value = attrs.get(name)
        if name == "milestones" and value is None:
            value = attrs.get("_milestones")  # SequentialLR's: when it hands over to the next
        if name == "milestones" and value is not None:
            try:
                value = sorted(int(m) for m in value)
            except Exception:
                value = None
            if value is not None:
                args[name] = value
            continue
        number = plain_number(value)
        if number is not None:
            args[name] = number
    phases = attrs.get("_schedule_phases")  # OneCycleLR: its rise ends at the first phase's end
    if type(phases) is list and phases and type(phases[0]) is dict:
        end = plain_number(phases[0].get("end_step"))
        if end is not None:
            args["rise_steps"] = int(end) + 1
    lambdas = attrs.get("lr_lambdas")
    if isinstance(lambdas, list):
        for fn in lambdas[:1]:  # transformers' schedules: functools.partial with their lengths
            if isinstance(fn, functools.partial):
                for key, value in fn.keywords.items():
                    if isinstance(value, numbers.Real) and not isinstance(value, bool):
                        args[key] = float(value) if isinstance(value, float) else int(value)
                name = getattr(fn.func, "__name__", None)
                if isinstance(name, str):
                    args["lr_lambda"] = name
    return args


def metric_value(args, kwargs) -> float | None:
    """The metric a ``ReduceLROnPlateau`` was fed, as a float (it reads it with ``float()``
    itself: a one-element tensor costs no sync it does not make already); None otherwise."""
    value = args[0] if args else kwargs.get("metrics", kwargs.get("metric"))
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return None
        value = value.detach()
    elif not isinstance(value, numbers.Real) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except Exception:
        return None
    return number if number == number else None


def metric_kind(args, kwargs) -> str:
    value = args[0] if args else kwargs.get("metrics", kwargs.get("metric", kwargs.get("epoch")))
    if value is None:
        return "none"
    if isinstance(value, torch.Tensor):
        return "grad_tensor" if value.requires_grad else "tensor"
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return "integer"  # an epoch index (the deprecated scheduler.step(epoch)), or a count
    if isinstance(value, numbers.Real):
        return "number"
    return "other"


# names a script sets on a scheduler meaning the learning rate; torch's schedulers read none
LR_ATTRIBUTES = ("lr", "learning_rate")


def _reads_param_groups(scheduler, name: str) -> bool:
    """Whether the scheduler's class is torch's where it computes and sets the lr (``step``,
    ``get_lr``) and no class of its own gives ``name`` a meaning (a scheduler of the script's
    own may read ``self.lr``)."""
    cls = type(scheduler)
    for method in ("step", "get_lr"):
        module = getattr(getattr(cls, method, None), "__module__", None) or ""
        if not module.startswith("torch."):
            return False
    return not any(name in vars(c) for c in cls.__mro__ if c is not LRScheduler)


class SchedulerWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.scheduler_id = Identities()  # scheduler -> its number
        self._in_step = Depth()
        self._in_init = Depth()
        self._constructing = Depth()
        self._attrs_seen: set[tuple] = set()  # (path, line, scheduler, name) recorded

    def _wrap_step(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def step(scheduler, *args, **kwargs):
            if watcher._in_step.active or watcher._in_init.active or watcher._constructing.active:
                return original(scheduler, *args, **kwargs)
            made = loc = None
            try:
                optimizer = getattr(scheduler, "optimizer", None)
                made = dict(sched=watcher.scheduler_id(scheduler), cls=type(scheduler).__name__,
                            opt=rec.optimizer_id(optimizer) if optimizer is not None else None,
                            metric=metric_kind(args, kwargs), grad=torch.is_grad_enabled())
                mode = getattr(scheduler, "mode", None) if isinstance(scheduler, ReduceLROnPlateau) else None
                if mode in ("min", "max"):
                    made.update(mode=mode, value=metric_value(args, kwargs))
                loc = rec.here(2)
            except Exception as exc:
                rec.internal_error("lr_scheduler.step", exc)
            lrs = None
            try:
                with watcher._in_step:
                    result = original(scheduler, *args, **kwargs)
                lrs = group_lrs(getattr(scheduler, "optimizer", None))
                return result
            finally:
                if made is not None:
                    try:
                        rec.emit(ev.scheduler_step(lrs=lrs, **made), loc)
                    except Exception as exc:
                        rec.internal_error("lr_scheduler.step", exc)

        return step

    def _wrap_get_lr(self, original):
        """A framework that drives a scheduler without its ``step()``: ignite's ``LRScheduler``
        handler advances ``last_epoch`` and reads ``get_lr()`` (flagged as within a step, as
        torch's own ``step`` flags it) and writes the lrs into the param groups itself. Such a
        read outside ``step`` is that scheduler's step: recorded as one, with the lrs it
        returns."""
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def get_lr(scheduler, *args, **kwargs):
            result = original(scheduler, *args, **kwargs)
            if (watcher._in_step.active or watcher._in_init.active or watcher._constructing.active
                    or not getattr(scheduler, "_get_lr_called_within_step", False)):
                return result  # torch's own step, or a plain read (torch warns on those)
            try:
                optimizer = getattr(scheduler, "optimizer", None)
                lrs = [plain_number(v) for v in result] if isinstance(result, (list, tuple)) else None
                rec.emit(ev.scheduler_step(sched=watcher.scheduler_id(scheduler),
                                           cls=type(scheduler).__name__,
                                           opt=rec.optimizer_id(optimizer) if optimizer is not None else None,
                                           grad=torch.is_grad_enabled(), lrs=lrs), rec.here(2))
            except Exception as exc:
                rec.internal_error("lr_scheduler.get_lr", exc)
            return result

        return get_lr

    def _wrap_initial_step(self, original):
        watcher = self

        @functools.wraps(original)
        def _initial_step(scheduler, *args, **kwargs):
            with watcher._in_init:
                return original(scheduler, *args, **kwargs)

        return _initial_step

    def _wrap_init(self, original):
        watcher, rec = self, self.rec

        @functools.wraps(original)
        def __init__(scheduler, *args, **kwargs):
            if watcher._constructing.active:
                return original(scheduler, *args, **kwargs)
            with watcher._constructing:
                original(scheduler, *args, **kwargs)
            try:
                watcher._constructed(scheduler)
            except Exception as exc:
                rec.internal_error("lr_scheduler construction", exc)

        return __init__

    def _constructed(self, scheduler) -> None:
        rec = self.rec
        optimizer = getattr(scheduler, "optimizer", None)
        children = getattr(scheduler, "_schedulers", None)
        base = getattr(scheduler, "base_lrs", None)
        rec.emit(ev.scheduler_init(
            sched=self.scheduler_id(scheduler), cls=type(scheduler).__name__,
            opt=rec.optimizer_id(optimizer) if optimizer is not None else None,
            args=schedule_args(scheduler),
            children=[self.scheduler_id(c) for c in children] if isinstance(children, (list, tuple)) else [],
            base_lrs=[plain_number(b) for b in base] if isinstance(base, list) else None,
            lrs=group_lrs(optimizer)), rec.here(3))

    def _attribute_told(self, scheduler, name: str, value) -> None:
        try:
            self._attribute_set(scheduler, name, value)
        except Exception as exc:
            self.rec.internal_error("lr_scheduler attribute", exc)

    def _attribute_set(self, scheduler, name: str, value) -> None:
        rec = self.rec
        caller = sys._getframe(3)  # the frame that assigned (below: __set__, _attribute_told, this)
        if not rec.finder.is_user_file(caller.f_code.co_filename):
            return
        optimizer = scheduler.__dict__.get("optimizer")
        if not isinstance(optimizer, torch.optim.Optimizer) or not _reads_param_groups(scheduler, name):
            return
        loc = rec.here(4)
        if loc is None:
            return
        seen = (loc.path, loc.line, self.scheduler_id(scheduler), name)
        if seen in self._attrs_seen:
            return
        number = plain_number(value)
        kept = group_lrs(optimizer) or []
        if number is not None and kept and all(k == number for k in kept):
            return  # the groups step with that lr anyway
        self._attrs_seen.add(seen)
        rec.emit_aside(ev.optimizer_attr(opt=rec.optimizer_id(optimizer),
                                         cls=type(optimizer).__name__, name=name, key="lr",
                                         value=number, kept=kept,
                                         scheduler=type(scheduler).__name__), loc)

    def install(self, patcher) -> None:
        for name in LR_ATTRIBUTES:
            patcher.patch(LRScheduler, name, WatchedAttribute(name, None, self._attribute_told))
        patch_tree(patcher, LRScheduler, "step", self._wrap_step)
        patch_tree(patcher, LRScheduler, "get_lr", self._wrap_get_lr)
        patch_tree(patcher, LRScheduler, "_initial_step", self._wrap_initial_step)
        patch_tree(patcher, LRScheduler, "__init__", self._wrap_init)
