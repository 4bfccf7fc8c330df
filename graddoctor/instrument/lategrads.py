"""Parameters that start receiving gradients after the graph walks looked for new leaves.

The backward watcher tracks a parameter no optimizer owns when a walk of a backward's graph
meets it, and walks a call line's graph at its first backwards, after a parameter registration
and then at gaps that double up to every 256th call. A parameter frozen when those walks ran
and unfrozen later (``p.requires_grad = True``: a C attribute, no call to wrap) joins the graph
unseen until the next periodic walk, which a replay of a few dozen updates may never reach;
gradual unfreezing after an optimizer built over ``filter(lambda p: p.requires_grad, ...)``
is then silent.

This watcher needs no walk: the modules the script's frames hold at each optimizer's first step
(the variables of the stepping frames, one attribute deep into a non-module ``self``) are
remembered weakly, and after the optimizer steps numbered 1 to ``EVERY_STEP_UNTIL``, then at
doubling counts, and after the first step of each epoch after the first (a DataLoader's
``EPOCH_BEGUN``: where scripts unfreeze), their parameters are swept for one that requires a
gradient, holds a ``.grad`` and is not tracked: a backward wrote it since the walks. It is tracked then, so the
next backwards read it like any leaf a walk found (the gradient ledger, hand updates, moves)
and param-not-in-optimizer judges it as it judges the others; the replay goes on past the
step budget for two more steps when a parameter was numbered since the last step
(``BUDGET_HOLD``), so that a backward records it even when the unfreeze came at the last epoch
the replay reaches. Cost: one integer test per step
between sweeps; a sweep is one pass over the held modules' parameters (attribute reads only,
no tensor read). Reading a ``.grad`` races with another thread's backward, which writes it
without the GIL (a crash, not a wrong answer): a sweep reads only the modules gathered in the
stepping thread's own frames, and once a second thread has stepped, sweeps stop for good (two
threads may share a model, and either may start a backward mid-sweep).
"""

from __future__ import annotations

import threading
import weakref
from itertools import compress, repeat
from operator import and_, attrgetter, is_, is_not
from threading import get_ident

import torch

from .identities import call
from .names import LiveModules, name_parameters, user_variables
from .recorder import Recorder
from .topics import BUDGET_HOLD, EPOCH_BEGUN, PARAMS_ADDED, STEPPED

EVERY_STEP_UNTIL = 16  # optimizer steps after each of which the modules are swept
HOLDS_MOST = 2  # holds of two steps past the budget, at most, for parameters numbered late
ROOTS_MOST = 64  # modules remembered (the stepping frames' variables)


class LateGradWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._roots: list[tuple[weakref.ref, int]] = []  # (module, the thread that held it)
        self._shared = False  # a second thread stepped: no sweep is safe from then on
        self._thread: int | None = None  # the first of them
        self._root_ids: set[int] = set()
        self._rooted: set[int] = set()  # optimizers whose first step gathered modules
        self._unrooted: set[int] = set()  # optimizers registered that have not stepped yet
        self._steps = 0
        self._next = 1
        # modules (un)registered anywhere (torch's global registration hooks), and the modules
        # and untracked parameters the every-step sweeps found (``_Tree``)
        self._registrations = 0
        self._tree: _Tree | None = None
        self._asleep = False  # off STEPPED until the progress' alarm at the next sweep
        self._recount = False  # woken: the next publication reads the count from the progress
        self._hold_until: int | None = None  # progress steps the replay goes on to
        self._epoch_pending = False  # an epoch began; its first step's sweep has not run
        self._tensors_seen = 0  # tensors numbered at the last sweep
        self._holds = 0  # times the replay was held past the budget
        rec.subscribe(STEPPED, self.after_step)
        rec.subscribe(PARAMS_ADDED, self.params_added)
        rec.subscribe(EPOCH_BEGUN, self.epoch_begun)
        rec.subscribe(BUDGET_HOLD, self.hold)

    def install(self, patcher) -> None:  # subscribed at construction
        module = torch.nn.modules.module
        registers = [getattr(module, name, None) for name in (
            "register_module_parameter_registration_hook", "register_module_module_registration_hook")]
        if None in registers:  # nothing tells a new parameter: every sweep walks the modules
            self._registrations = None
            return
        for register in registers:
            patcher.handle(register(self._registered))

    def _registered(self, module, name, value) -> None:
        if self._registrations is not None:
            self._registrations += 1

    def params_added(self, opt: int, pids) -> None:
        """``PARAMS_ADDED``: a new optimizer's first step gathers the modules its frames hold."""
        if opt not in self._rooted and not self._shared:
            self._unrooted.add(opt)
            self._wake()

    def epoch_begun(self, loader: int, epoch: int) -> None:
        """``EPOCH_BEGUN``: sweep after the epoch's first step (layers unfrozen at an epoch
        boundary get their first gradient there)."""
        if self._shared or not self._rooted:
            return
        self._next = min(self._next, self.rec.progress.steps_taken() + 1)
        self._epoch_pending = True
        self._wake()

    def hold(self) -> bool:
        """``BUDGET_HOLD``, asked as a step is counted past the budget (before its ``STEPPED``):
        the sweep an epoch's beginning asked for runs here when the budget would end the
        replay at this step; at an epoch's first step, a parameter numbered since the last
        sweep (by that sweep, or by a clip over ``model.parameters()`` after an unfreeze) holds
        two more steps, so that a backward records its gradient."""
        seen = self._tensors_seen  # (the sweep below moves it past what it tracks)
        began = self._epoch_pending  # only an epoch's first step is held for (where unfreezes are)
        if self._epoch_pending and not self._shared:
            self._epoch_pending = False
            try:
                self._sweep()
            except Exception as exc:
                self.rec.internal_error("late gradients: sweep", exc)
        rec = self.rec
        count = len(rec.tensors)
        if began and count > seen:
            # a parameter numbered since the last look (this sweep's, or a clip's over
            # model.parameters() after an unfreeze) has had no backward recorded yet
            is_parameter = rec.is_parameter
            if any(is_parameter.get(pid) for pid in range(seen, count)) \
                    and self._holds < HOLDS_MOST:
                self._holds += 1
                self._hold_until = rec.progress.steps + 2
            self._tensors_seen = count
        return self._hold_until is not None and rec.progress.steps < self._hold_until

    def _wake(self) -> None:
        """Back on ``STEPPED`` (the progress' alarm, or a new optimizer): the steps taken while
        off it are counted from the progress, as each publication would have counted them."""
        if not self._asleep:
            return
        self._asleep = False
        self._recount = True
        if not self._shared:
            self.rec.resume(STEPPED, self.after_step)

    def after_step(self, opt: int, optimizer) -> None:
        if self._recount:  # this publication included
            self._recount = False
            self._steps = self.rec.progress.steps_taken()
        else:
            self._steps += 1
        shared = self.rec.progress.threads_stepped  # (the steps taken while asleep included)
        if get_ident() != self._thread or shared:
            if self._thread is not None or shared:  # threads that train at once: no sweep is safe
                self._shared = True
                self._roots = []
                self.rec.retire(STEPPED, self.after_step)
                return
            self._thread = get_ident()
        if self._steps < self._next and opt in self._rooted:
            self._sleep()
            return
        if self._shared:  # retired, but a publication already under way still calls
            return
        if opt not in self._rooted:
            self._rooted.add(opt)
            self._unrooted.discard(opt)
            try:
                self._gather()
            except Exception as exc:
                self.rec.internal_error("late gradients: modules", exc)
        if self._steps < self._next:
            return
        self._next = self._steps + 1 if self._steps < EVERY_STEP_UNTIL else self._steps * 2
        self._epoch_pending = False
        try:
            self._sweep()
        except Exception as exc:
            self.rec.internal_error("late gradients: sweep", exc)

    def _sleep(self) -> None:
        """Between two sweeps, with every optimizer registered rooted: off ``STEPPED`` until the
        step of the next sweep (no step of these counts for anything but the count, which the
        progress keeps). Another thread's step meanwhile is read from the progress at waking,
        before any sweep. The alarm is set in steps counted with GradScaler-skipped ones, which
        never fall behind the steps taken: it wakes at or before the sweep's step, and a watcher
        woken early sleeps again."""
        if self._unrooted or self._asleep:
            return
        progress = self.rec.progress
        ahead = self._next - self._steps  # publications until the next sweep's
        self._asleep = True
        self.rec.retire(STEPPED, self.after_step)
        progress.wake_at(progress.steps + ahead, self._wake)

    def _gather(self) -> None:
        module = torch.nn.Module
        found = []
        for name, value in user_variables(self.rec).items():
            if isinstance(value, module):
                found.append(value)
            elif name == "self" and not isinstance(value, type):
                attrs = getattr(value, "__dict__", None)
                if isinstance(attrs, dict):  # a trainer object holding its models
                    found += [inner for inner in list(attrs.values()) if isinstance(inner, module)]
        for value in found:
            if len(self._roots) >= ROOTS_MOST:
                return
            if id(value) in self._root_ids:
                continue
            try:
                self._roots.append((weakref.ref(value), threading.get_ident()))
            except TypeError:
                continue
            self._root_ids.add(id(value))

    def _sweep(self) -> None:
        rec = self.rec
        if rec.others_in_backward():
            return
        thread = threading.get_ident()
        roots = [root for ref, held_by in self._roots
                 if held_by == thread and (root := ref()) is not None]
        tree = self._tree
        if tree is None or not tree.holds(roots, self._registrations):
            tree = self._tree = _Tree(roots, self._registrations, rec.tensors)
        # ``map``s in C (thousands of parameters in a mixture of experts or a LoRA model,
        # swept after each of the first steps), over the parameters untracked when the tree
        # was read: those that require a gradient and hold one, in ``parameters()`` order
        untracked = list(map(call, tree.untracked))
        if not all(map(is_not, untracked, repeat(None))):
            untracked = list(compress(untracked, map(is_not, untracked, repeat(None))))
        candidates = list(compress(untracked, map(and_, map(_requires_grad, untracked),
                                                  map(is_not, map(_grad, untracked),
                                                      repeat(None)))))
        tracked = False
        if candidates:
            for param in compress(candidates, map(is_, rec.tensors.numbers(candidates),
                                                  repeat(None))):
                rec.track(param)
                tracked = True
            tree.untracked = list(map(weakref.ref, compress(
                untracked, map(is_, rec.tensors.numbers(untracked), repeat(None)))))
        self._tensors_seen = len(rec.tensors)
        if self._steps >= EVERY_STEP_UNTIL:  # sweeps are rare from now on: hold nothing
            tree.dicts = None  # strongly (a dict holds its parameters); the rest is weak
        if tracked or len(rec.param_names) < len(rec.tensors):
            # named now, from the stepping frames, while a function's locals hold the model (the
            # end of the run names from the script's globals): these and those a walk tracked
            name_parameters(rec, live=LiveModules(scan=False))


class _Tree:
    """The modules of the sweep's roots and their parameters that were untracked, as one
    sweep read them; the next sweep reuses them while the same roots are swept, no parameter
    or module was registered anywhere since (torch's global hooks: ``module.x = ...``,
    ``register_parameter``, ``add_module``, a module's construction), every module lives and
    its ``_parameters`` and ``_modules`` hold as many entries (a deletion, a write into them
    directly). The modules and parameters are held weakly (the script's modules die when it
    drops them), their two dicts as they are: reading ``module._parameters`` goes through
    ``Module.__getattr__``'s slower lookup, a dict's length does not. Once sweeps are rare
    (after ``EVERY_STEP_UNTIL`` steps) the dicts are let go of (``dicts`` None: each holds its
    parameters, which would outlive a model the script drops) and read again from the live
    modules at each sweep: a long run's sweeps compare lengths, they do not walk the modules
    again. ``modules`` None: a class walks its own way, read through ``parameters()`` each
    time."""

    __slots__ = ("roots", "registrations", "modules", "dicts", "counts", "untracked")

    def __init__(self, roots: list, registrations: int | None, tensors):
        self.roots = list(map(id, roots))
        self.registrations = registrations
        found: list = []
        modules: list | None = [] if registrations is not None else None
        for root in roots:
            found += module_parameters(root, modules)
            if modules is not None and modules and modules[-1] is None:
                modules = None
        self.modules = self.dicts = self.counts = None
        if modules is not None:
            try:
                self.modules = list(map(weakref.ref, modules))
            except TypeError:  # a module without weak references: read each time
                self.modules = None
            else:
                self.dicts = [*map(_parameters, modules), *map(_children, modules)]
                self.counts = list(map(len, self.dicts))
        params = list(dict(zip(map(id, found), found)).values()) if len(roots) > 1 else found
        self.untracked = list(map(weakref.ref, compress(
            params, map(is_, tensors.numbers(params), repeat(None)))))

    def holds(self, roots: list, registrations: int | None) -> bool:
        if (self.modules is None or registrations != self.registrations
                or list(map(id, roots)) != self.roots):
            return False
        modules = list(map(call, self.modules))
        if not all(map(is_not, modules, repeat(None))):
            return False
        dicts = self.dicts if self.dicts is not None else \
            [*map(_parameters, modules), *map(_children, modules)]
        return list(map(len, dicts)) == self.counts


_parameters = attrgetter("_parameters")
_children = attrgetter("_modules")


_requires_grad = attrgetter("requires_grad")
_grad = attrgetter("grad")
_Module = torch.nn.Module
_PLAIN_WALK = (_Module.parameters, _Module.named_parameters, _Module._named_members)
# module classes whose tree walk is torch's own; weak: a class the script defined (and through
# its methods' globals, the script's namespace and model) goes when the check is over
_plain_types: "weakref.WeakSet[type]" = weakref.WeakSet()


def _plain(cls: type) -> bool:
    if cls in _plain_types:
        return True
    if cls.named_modules is not _Module.named_modules:
        return False
    _plain_types.add(cls)
    return True


def module_parameters(root, modules: list | None = None) -> list:
    """``list(root.parameters())``, in its order (the modules depth first, each module and each
    parameter once, none None), without its stack of generators: one list extension per module.
    A tree with a class that walks its own way (``parameters`` or ``named_modules`` overridden)
    is read through ``parameters()``. ``modules``: the modules walked are appended to it, then
    None when ``parameters()`` read the tree."""
    cls = type(root)
    if (cls.parameters, cls.named_parameters, cls._named_members) != _PLAIN_WALK:
        if modules is not None:
            modules.append(None)
        return list(root.parameters())
    seen: set[int] = set()
    found: list = []
    walked: list = []
    stack = [root]
    while stack:
        module = stack.pop()
        if module is None or id(module) in seen:
            continue
        if not _plain(type(module)):
            if modules is not None:
                modules.append(None)
            return list(root.parameters())
        seen.add(id(module))
        walked.append(module)
        found += module._parameters.values()
        children = module._modules
        if children:
            stack += reversed(children.values())
    if modules is not None:
        modules += walked
    if not all(map(is_not, found, repeat(None))):  # (``None in found`` would compare tensors)
        found = list(compress(found, map(is_not, found, repeat(None))))
    return list(dict(zip(map(id, found), found)).values()) if len(found) > 1 else found
