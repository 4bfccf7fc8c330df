"""What the model really registers: attributes that look like registration but are not.

* ``module.requires_grad = False`` sets a plain attribute on the Module object: it freezes
  nothing (``requires_grad_(False)`` was meant); so do the other names of that wish
  (``FREEZE_FLAGS``: ``requires_grad_ = False``, which shadows the method, misspellings such
  as ``require_grad``, Keras' ``trainable``). Seen through a class-level ``__setattr__`` on
  ``nn.Module`` that sets the attribute first and then looks the name up (one set lookup per
  module attribute set; the rest runs only for those names): a ``module_attr`` event at the
  assignment, once per line and module.
* ``model.eval = True`` / ``model.train = False``: a value assigned over the module's method
  (the same ``__setattr__``, for those two names), which switches no mode: a ``module_attr``
  event naming the BatchNorm and dropout layers under the module as the mode watcher numbers
  them. A callable assigned there (a monkeypatched method) is not recorded.
* The same names set on a tensor (``p.requires_grad_ = False``, ``p.trainable = False``): torch
  reads only ``requires_grad``, so the parameter keeps training. Seen through a data
  descriptor per name on ``torch.Tensor`` (``TensorAttrWatcher``), which stores the value in
  the tensor's ``__dict__`` as Python would and records the set: no other attribute of a
  tensor goes through it, so ``p.grad = None`` and the rest cost nothing. A ``param_attr``
  event per line and leaf tensor (at most ``PARAM_ATTR_EVENTS`` per line).
* Submodules, parameters or trainable tensors held in a plain ``list``/``tuple``/``dict``
  attribute (or a plain tensor attribute) of a module: ``nn.Module`` registers none of them, so
  ``model.parameters()`` leaves them out. Found at the end of the run, only when some tracked
  tensor that got a gradient is owned by no optimizer (``find_unregistered``): an
  ``unregistered`` event per attribute, at its assignment in the class when found, and the
  tensors are named by that path (``model.blocks[0].weight``).
* A parameter an optimizer owns, replaced in its module after the optimizer was built (a new
  ``nn.Parameter`` assigned over it, ``model.apply(init)`` that assigns new ones,
  ``load_state_dict(assign=True)``, a submodule assigned over the one holding it): the optimizer
  keeps stepping the old tensor, which the model no longer uses. Seen through torch's global
  parameter and module registration hooks, which run before the new one is stored: a
  ``param_replaced`` event at the user's line, only when a replaced tensor is owned by an
  optimizer (or replaced such a one before: a reset that runs every epoch) (registrations cost a dict lookup; none happen per step).
* One module object with parameters registered at two positions or more of a ``ModuleList`` or
  ``Sequential`` that the script's own code builds (``nn.ModuleList([layer] * n)``,
  ``nn.Sequential(*[block] * n)``, ``append(layer)`` of one layer in a loop): the "n layers" are
  one layer applied n times, with one set of weights. Seen through the same module registration
  hook: one identity scan of the container's modules per registration into a container (at most
  ``_REPEAT_SCAN`` of them; registrations happen while models are built, never per step), a
  ``module_repeated`` event at each repeat (at most ``_REPEAT_EVENTS`` per call line).
* A new parameter registered once an optimizer exists that replaces none an optimizer owns (a layer built inside ``forward``, ``self.scale = nn.Parameter(...)`` in the loop): a
  ``param_created`` event at the user's line, at most ``_CREATED_EVENTS`` per line, then one at
  each new step for ``_CREATED_STEPS`` steps (a forward building many layers fills the first
  ones in one step). Healthy
  loops register nothing once they train, so this costs nothing per step.
* A BatchNorm registered by the script's own code with Keras' arguments in PyTorch's places
  (``nn.BatchNorm2d(c, 0.8)``: PyTorch's second positional argument is eps, not momentum; a
  momentum of 0.99, which PyTorch weighs the other way round): a ``norm_arguments`` event at the
  user's line, at most ``_NORM_EVENTS`` per line; two attribute reads per BatchNorm registered.
"""

from __future__ import annotations

import ast
import linecache
import os
import sys

import torch

from .. import events as ev
from ..trace import Location
from .planned import PARSE_LOCK
from .identities import Identities
from .names import LiveModules
from .patcher import WatchedAttribute
from .recorder import Recorder


# Attribute names written to freeze (or unfreeze) that torch never reads: the method's name
# without its call, the flag misspelt, Keras' name. ``requires_grad`` itself is one only on a
# module (on a tensor it is the flag).
FREEZE_FLAGS = frozenset({
    "requires_grad_", "require_grad", "require_grad_", "requires_grads", "require_grads",
    "requires_gard", "require_gard", "requires_gradient", "require_gradient",
    "requires_gradients", "required_grad", "requries_grad", "requieres_grad", "reqires_grad",
    "requres_grad", "requirs_grad", "requiresGrad", "requireGrad", "trainable",
})
MODULE_FLAGS = FREEZE_FLAGS | {"requires_grad"}
PARAM_ATTR_EVENTS = 256  # param_attr events recorded per call line (a loop over the parameters)


MODE_METHODS = ("train", "eval")
_MODULE_WATCHED = MODULE_FLAGS | set(MODE_METHODS)


class ModuleAttrWatcher:
    """A freeze flag set as an attribute on an ``nn.Module``, or a value assigned over its
    ``train``/``eval`` method (see the module docstring)."""

    def __init__(self, rec: Recorder, modes):
        self.rec = rec
        self.modes = modes  # the ModeWatcher: numbers the BatchNorm/dropout layers as it does
        self._mid = Identities()
        self._seen: set[tuple] = set()  # (path, line, mid) recorded

    def _wrap_setattr(self, original):
        watcher = self

        def __setattr__(module, name, value):
            original(module, name, value)  # first, exactly as without graddoctor
            if name in _MODULE_WATCHED:
                try:
                    watcher._flag_set(module, name, value)
                except Exception as exc:
                    watcher.rec.internal_error("module attribute", exc)

        return __setattr__

    def _flag_set(self, module, name: str, value) -> None:
        rec = self.rec
        if name not in module.__dict__:  # a property or a descriptor of its class took it
            return
        caller = sys._getframe(2)  # the frame that assigned (below: __setattr__, this method)
        if not rec.finder.is_user_file(caller.f_code.co_filename):
            return
        loc = rec.here(3)
        if loc is None:
            return
        mode_method = name in MODE_METHODS
        if mode_method and callable(value):
            return  # a method replaced on purpose (a monkeypatch), not a mode written as a value
        mid = self._mid(module)
        key = (loc.path, loc.line, mid)
        if key in self._seen:
            return
        self._seen.add(key)
        params = [] if mode_method else [rec.track(p) for p in module.parameters()]
        layers = self.modes.layer_ids(module) if mode_method else None
        shown = value if isinstance(value, (bool, int, float, str)) or value is None else repr(value)
        rec.emit_aside(ev.module_attr(mid=mid, cls=type(module).__name__, name=name, value=shown,
                                      params=params, layers=layers), loc)

    def install(self, patcher) -> None:
        Module = torch.nn.Module
        patcher.patch(Module, "__setattr__", self._wrap_setattr(Module.__setattr__))


class TensorAttrWatcher:
    """A freeze flag set as an attribute on a tensor (see the module docstring)."""

    def __init__(self, rec: Recorder):
        self.rec = rec
        self._seen: set[tuple] = set()  # (path, line, pid) recorded
        self._per_line: dict[tuple, int] = {}  # (path, line) -> param_attr events recorded

    def _told(self, tensor, name: str, value) -> None:
        try:
            self._flag_set(tensor, name, value)
        except Exception as exc:
            self.rec.internal_error("tensor attribute", exc)

    def _flag_set(self, tensor, name: str, value) -> None:
        rec = self.rec
        if not isinstance(tensor, torch.Tensor) or not tensor.is_leaf:
            return
        caller = sys._getframe(3)  # the frame that assigned (below: __set__, _told, this method)
        if not rec.finder.is_user_file(caller.f_code.co_filename):
            return
        loc = rec.here(4)
        if loc is None:
            return
        line = (loc.path, loc.line)
        if self._per_line.get(line, 0) >= PARAM_ATTR_EVENTS:
            return
        pid = rec.track(tensor)
        if (*line, pid) in self._seen:
            return
        self._seen.add((*line, pid))
        self._per_line[line] = self._per_line.get(line, 0) + 1
        shown = value if isinstance(value, (bool, int, float, str)) or value is None else repr(value)
        cls = "Parameter" if isinstance(tensor, torch.nn.Parameter) else "Tensor"
        rec.emit_aside(ev.param_attr(pid=pid, cls=cls, name=name, value=shown,
                                     requires_grad=bool(tensor.requires_grad)), loc)

    def install(self, patcher) -> None:
        Tensor = torch.Tensor
        for name in sorted(FREEZE_FLAGS):
            # after the mode watcher's requires_grad_ wrapper, which this one hands calls on to
            patcher.patch(Tensor, name, WatchedAttribute(name, Tensor.__dict__.get(name)
                                                       or getattr(Tensor, name, None), self._told))


_CREATED_EVENTS = 8  # param_created events recorded per call line
_CREATED_STEPS = 3  # past those, one more at each of this many later steps
_REPEAT_EVENTS = 16  # module_repeated events recorded per call line
_REPEAT_SCAN = 4096  # containers with more modules than this are not scanned for repeats
_STACKS = (torch.nn.ModuleList, torch.nn.Sequential)
_NORM_EVENTS = 4  # norm_arguments events recorded per call line
_BatchNorm = torch.nn.modules.batchnorm._BatchNorm  # BatchNorm1d/2d/3d, SyncBatchNorm, lazy ones
# frames crossed on the way to the code that builds a container: torch's and graddoctor's own
# (the ``Module.__setattr__`` wrapper above, for ``layers[i] = layer``); with the separator:
# torchvision's files are not torch's
_INNER_DIRS = tuple(os.path.dirname(f) + os.sep for f in (
    torch.__file__, os.path.dirname(os.path.abspath(__file__))) if f)


class ParamLifeWatcher:
    """Optimizer-owned parameters replaced in their module, and parameters created once
    training runs (see the module docstring)."""

    def __init__(self, rec: Recorder, owned):
        self.rec = rec
        self.owned = owned  # OptimizerWatcher.owned_pids(): a read-only live view
        self._successors: set[int] = set()  # pids that replaced owned ones (replaced again: reported)
        self._created: dict[tuple, tuple] = {}  # (path, line) -> (param_created events recorded, last step)
        self._repeats: dict[tuple, int] = {}  # (path, line) -> module_repeated events recorded

    def _parameter(self, module, name, param):
        try:
            old = module._parameters.get(name) if name in module._parameters else None
            replaced = False
            if old is not None and old is not param:
                replaced = self._replaced(module, name, "parameter", [old],
                                          [param] if isinstance(param, torch.Tensor) else [])
            if not replaced and old is not param and isinstance(param, torch.Tensor) and self.owned:
                self._new(module, name, param)
        except Exception as exc:
            self.rec.internal_error("parameter registration", exc)

    def _new(self, module, name, param) -> None:
        """A parameter registered once an optimizer exists (a model built later is recorded
        once; the rule wants the same line at two steps or more)."""
        rec = self.rec
        loc = rec.here(3)
        if loc is None:
            return
        key = (loc.path, loc.line)
        done, last = self._created.get(key, (0, None))
        step = rec.progress.steps
        # past the first events of a line, one more at each new step (a few): a forward that
        # builds many layers per step fills the first ones in its first step, and the rule
        # tells "built at every step" from "built once after the optimizer" by the steps seen
        if done >= _CREATED_EVENTS and (step == last or done >= _CREATED_EVENTS + _CREATED_STEPS):
            return
        self._created[key] = (done + 1, step)
        rec.emit_aside(ev.param_created(owner=type(module).__name__, attr=name,
                                        params=[rec.track(param)], step=step), loc)

    def _module(self, module, name, submodule):
        try:
            if isinstance(module, _STACKS) and isinstance(submodule, torch.nn.Module):
                self._repeat(module, name, submodule)
            if isinstance(submodule, _BatchNorm) and _keras_arguments(submodule):
                self._norm_arguments(submodule)
        except Exception as exc:
            self.rec.internal_error("module registration", exc)
        try:
            old = module._modules.get(name) if name in module._modules else None
            if old is not None and old is not submodule:
                new = list(submodule.parameters()) if isinstance(submodule, torch.nn.Module) else []
                self._replaced(module, name, "module", list(old.parameters()), new)
        except Exception as exc:
            self.rec.internal_error("module registration", exc)

    def _repeat(self, module, name, submodule) -> None:
        """A ``module_repeated`` event when ``submodule`` (with parameters) already fills
        another position of the container ``module``, built by the script's own code."""
        held = module._modules
        if len(held) > _REPEAT_SCAN or id(submodule) not in set(map(id, held.values())):
            return
        positions = [key for key, m in held.items() if m is submodule and key != name]
        if not positions:
            return  # the same module assigned again at its own position
        params = list(submodule.parameters())
        if not params:
            return  # an activation or dropout shared between positions: no weights to share
        frame = sys._getframe(3)  # above: this method, _module, add_module (or __setattr__)
        while frame is not None and _INNER_DIRS and frame.f_code.co_filename.startswith(_INNER_DIRS):
            frame = frame.f_back  # ModuleList.__init__ / extend / append, Sequential.__init__
        rec = self.rec
        if frame is None or not rec.finder.is_user_file(frame.f_code.co_filename):
            return  # a library builds it: its architecture, not the script's mistake
        loc = rec.here(3)
        if loc is None:
            return
        key = (loc.path, loc.line)
        done = self._repeats.get(key, 0)
        if done >= _REPEAT_EVENTS:
            return
        self._repeats[key] = done + 1
        rec.emit_aside(ev.module_repeated(container=type(module).__name__,
                                          cls=type(submodule).__name__,
                                          positions=[*positions, name],
                                          params=[rec.track(p) for p in params]), loc)

    def _norm_arguments(self, norm) -> None:
        """A ``norm_arguments`` event for a BatchNorm built by the script's own code with
        Keras' arguments in PyTorch's places (``_keras_arguments``)."""
        frame = sys._getframe(3)  # above: this method, _module, add_module (or __setattr__)
        while frame is not None and _INNER_DIRS and frame.f_code.co_filename.startswith(_INNER_DIRS):
            frame = frame.f_back  # Sequential.__init__, ModuleList.append
        rec = self.rec
        if frame is None or not rec.finder.is_user_file(frame.f_code.co_filename):
            return  # a library's architecture
        loc = rec.here(3)
        if loc is None:
            return
        key = (loc.path, loc.line, "norm")
        done = self._repeats.get(key, 0)
        if done >= _NORM_EVENTS:
            return
        self._repeats[key] = done + 1
        momentum = norm.momentum
        rec.emit_aside(ev.norm_arguments(
            cls=type(norm).__name__, eps=float(norm.eps),
            momentum=float(momentum) if momentum is not None else None,
            params=[rec.track(p) for p in norm.parameters(recurse=False)]), loc)

    def _replaced(self, module, name, via, old, new) -> bool:
        """Whether a ``param_replaced`` event was recorded."""
        if not self.owned:
            return False  # no optimizer yet: a replacement before it is built is how models are made
        rec = self.rec
        number = rec.tensors.get
        kept = {id(t) for t in new}
        owned, successors = self.owned, self._successors
        pids = [pid for t in old if id(t) not in kept
                and (pid := number(t)) is not None and (pid in owned or pid in successors)]
        if not pids:
            return False
        new_pids = [rec.track(t) for t in new]
        successors.update(new_pids)
        rec.emit_aside(ev.param_replaced(owner=type(module).__name__, attr=name, via=via,
                                         old=pids, new=new_pids), rec.here(2))
        return True

    def install(self, patcher) -> None:
        modules = torch.nn.modules.module
        for register, hook in (("register_module_parameter_registration_hook", self._parameter),
                               ("register_module_module_registration_hook", self._module)):
            function = getattr(modules, register, None)
            if function is not None:
                patcher.handle(function(hook))


# -- plain containers --------------------------------------------------------------------------

_INTERNALS = frozenset(vars(torch.nn.Module()))  # _parameters, _modules, hooks...


def _keras_arguments(norm) -> bool:
    """eps of 0.1 or more (Keras' momentum given as PyTorch's second positional argument,
    ``BatchNorm2d(c, 0.8)``), or Keras' momentum as PyTorch's (the weight of the new batch, the
    opposite meaning) while the module tracks running statistics: 0.9 <= momentum < 1 (exactly
    1, the last batch's statistics, is a deliberate choice: MAML's batch statistics)."""
    eps, momentum = norm.eps, norm.momentum
    if isinstance(eps, (int, float)) and eps >= 0.1:
        return True
    return bool(norm.track_running_stats) and isinstance(momentum, (int, float)) \
        and 0.9 <= momentum < 1


def _items(value):
    """(holder, [(key, item)]) of an attribute that may hold unregistered tensors, else None."""
    if isinstance(value, (list, tuple)):
        return ("list" if isinstance(value, list) else "tuple"), list(enumerate(value))
    if isinstance(value, dict):
        return "dict", list(value.items())
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        return "tensor", [(None, value)]
    return None


def _tensors_in(item):
    """(suffix, tensor) pairs of one item of a container: a module's parameters, or a tensor."""
    if isinstance(item, torch.nn.Module):
        return [(f".{name}", p) for name, p in item.named_parameters()]
    if isinstance(item, torch.Tensor):
        return [("", item)]
    return []


def find_unregistered(rec: Recorder, variables: dict[str, object] | None, owned,
                      reported: set[int], live: LiveModules | None = None) -> None:
    """Emit an ``unregistered`` event per module attribute that holds, in a plain container or
    as a plain tensor, tracked tensors that no optimizer owns and no module registers, and name
    those tensors by that path. Runs at each optimizer's first step (the model may be local to
    a function that has returned by the end) and at the end of the run; returns at once when
    every tracked tensor is owned or already in ``reported`` (which it extends)."""
    alive = {}
    for pid in rec.tracked_pids():
        if pid in owned or pid in reported:
            continue
        tensor = rec.tensor(pid)
        if tensor is not None:
            alive[id(tensor)] = pid
    if not alive:
        return
    found: dict[tuple, tuple] = {}  # (id(module), attr) -> (path, module, attr, holder, hits)

    def roots():
        accounted: set[int] = set()  # pids the user's models register
        for var, value in (variables or {}).items():
            if issubclass(type(value), torch.nn.Module) and not var.startswith("_"):
                yield var, value
                accounted.update(pid for p in value.parameters()
                                 if (pid := alive.get(id(p))) is not None)
        accounted.update(pid for *_, hits in found.values() for _, pid in hits)
        if len(accounted) == len(alive):
            return  # every one registered or found from the user's variables: no heap scan
        # then the live modules (a model local to a function that has returned), by class
        for obj in (live or LiveModules()).get():
            yield type(obj).__name__, obj

    for prefix, root in roots():
        registered = None  # the root's own parameters: a plain list of references to modules
        for sub_name, sub in root.named_modules():  # registered in the same model is harmless
            for attr, value in list(vars(sub).items()):
                if attr in _INTERNALS or (id(sub), attr) in found:
                    continue
                items = _items(value)
                if items is None:
                    continue
                holder, pairs = items
                path = f"{prefix}.{sub_name}.{attr}" if sub_name else f"{prefix}.{attr}"
                hits = []
                for key, item in pairs:
                    where = path if key is None else f"{path}[{key!r}]"
                    for suffix, tensor in _tensors_in(item):
                        pid = alive.get(id(tensor))
                        if pid is not None:
                            if registered is None:
                                registered = {id(p) for p in root.parameters()}
                            if id(tensor) not in registered:
                                hits.append((where + suffix, pid))
                if hits:
                    found[(id(sub), attr)] = (path, sub, attr, holder, hits)
    names = {}
    for path, sub, attr, holder, hits in found.values():
        names.update((pid, name) for name, pid in hits)
        reported.update(pid for _name, pid in hits)
        rec.emit(ev.unregistered(owner=type(sub).__name__, attr=attr, holder=holder, name=path,
                                 pids=[pid for _name, pid in hits]),
                 assignment(rec, type(sub), attr))
    rec.name_params(names)


def assignment(rec: Recorder, cls, attr: str) -> Location | None:
    """Where a method of ``cls`` (or of a base class in the user's code) assigns ``self.<attr>``:
    ``__init__`` first. None when not found."""
    for klass in cls.__mro__:
        methods = [f for f in vars(klass).values() if hasattr(f, "__code__")]
        methods.sort(key=lambda f: f.__name__ != "__init__")
        for function in methods:
            code = function.__code__
            if not rec.finder.is_user_file(code.co_filename):
                continue
            line = _assigned_at(code, attr)
            if line is not None:
                return Location(rec.finder.display_path(code.co_filename), line, code.co_name)
    return None


def _assigned_at(code, attr: str) -> int | None:
    """The first line in the function of ``code`` that assigns ``self.<attr>`` (its first
    argument's attribute), read from its source with ``ast``."""
    source = "".join(linecache.getlines(code.co_filename))
    if not source:
        return None
    with PARSE_LOCK:  # the script's threads may get here together
        tree = ast.parse(source)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name != code.co_name:
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        if first != code.co_firstlineno and node.lineno != code.co_firstlineno:
            continue
        args = node.args.posonlyargs + node.args.args
        if not args:
            return None
        this = args[0].arg
        for inner in ast.walk(node):
            targets = (inner.targets if isinstance(inner, ast.Assign)
                       else [inner.target] if isinstance(inner, ast.AnnAssign) else [])
            for target in targets:
                for t in ast.walk(target):
                    if (isinstance(t, ast.Attribute) and t.attr == attr
                            and isinstance(t.value, ast.Name) and t.value.id == this):
                        return t.lineno
        return None
    return None
