"""Custom ``torch.autograd.Function`` classes of the user's code: is their backward the
gradient of their forward?

A hand-written backward that returns the gradient with the wrong sign, a missing factor or
the wrong transpose trains without any error: autograd believes it. So the first time each such
class is applied with a gradient flowing (``Function.apply`` is wrapped), its backward is
compared with finite differences of its forward, once, on float64 copies of the inputs it
really got: for every input that needs a gradient, the backward's directional derivative
``<backward(v), u>`` against ``<(f(x + h u) - f(x - h u)) / 2h, v>`` along random directions
``u``, ``v`` (as ``torch.autograd.gradcheck``'s fast mode does: two forward calls per input,
whatever its size). A mismatch is recorded as a ``custom_backward`` aside event, with the ratio
of the two when they are proportional (-1: the sign; 0.5: a factor).

Without changing the run: the copies are detached, the forward runs on them with every random
generator it may draw from set to the state it had at the call and restored after (the script's
stream is untouched, and a dropout inside the forward draws the same mask at each evaluation),
the random directions come from a generator of graddoctor's own, autocast is off, what the
forward prints or warns is swallowed, and a failure of the check only skips it. Left alone: a
piecewise-constant forward (a straight-through estimator, a surrogate gradient: the numerical
derivative is zero or jumps), classes defined outside the user's files (torch's checkpointing,
libraries).

A forward that is flat where it was compared, one elementwise step between two values (a
spike ``(v > 0).float()``, a ``sign``), is read along a line instead: forward and backward
(incoming gradient of ones) on 4001 points spanning the range of the input it got. A surrogate
gradient is a bump at the step (a fast sigmoid's, a triangle, a box, an arctan's); a backward
with a value of the wrong sign, an infinite one, or a largest value more than 4 times its value
at the step (the bump centred elsewhere, a pole: ``1 / (k * v + 1) ** 2`` without ``abs``) is
recorded as a ``custom_backward`` aside with ``surrogate``.

A forward that returns one of its inputs unchanged (a gradient-reversal or gradient-scaling
layer: a backward that is not the forward's derivative is its purpose) is not compared with
finite differences. What its backward does is read from the run instead: at its next calls with
a gradient flowing, a hook on the real output's backward node (which only reads) compares the
gradient it returns for that input with the one it got. Passed through scaled by a positive
factor, it is recorded as a ``custom_backward`` aside event with ``identity`` set, the factor as
its ratio and the words the script calls the Function by (``names``): the rule decides whether
they name a reversal. A factor of 0 (a coefficient scheduled from 0, as DANN's) says nothing
yet: later calls are read, up to ``_PASS_THROUGH_CALLS``.

Whatever the forward (a straight-through estimator's too), the same check reads, by a hook on
the copies' backward node, what the backward returned for every tensor argument: None for an
input that needs a gradient while an input that needs none gets a nonzero one is a return
tuple out of forward's argument order (``return None, grad, None`` for ``(x, scale, clip)``),
which autograd swallows silently (it drops a gradient given to an input without one); recorded
as a ``custom_backward`` aside event with ``given_to``.

An identity Function applied with gradients on to inputs none of which needs a gradient (a
reversal on ``features.detach()``) never runs its backward: at its second such call (before any
call with a gradient), when a user line above the apply cuts the graph (``.detach()``,
``.data``), a ``custom_backward`` aside with ``identity`` and ``input_cut`` is recorded there.

Cost: a set lookup per ``apply`` call; the check runs once per class, off the per-step path;
the hook of an identity Function, on its first calls only.
"""

from __future__ import annotations

import contextlib
import io
import linecache
import re
import sys
import threading
import warnings
from typing import NamedTuple

import torch

from .. import events as ev
from ..location import Location
from .patcher import check_hook
from .inlinable import watched, watched_result
from .recorder import Recorder

_MAX_ELEMENTS = 4_000_000  # inputs larger than this (all together) are not checked
_TOLERANCE = 1e-3  # relative disagreement between the two directional derivatives
_PASS_THROUGH_CALLS = 8  # calls of an identity Function whose backward is read, at most
_SAMPLE = 65_536  # gradient elements compared
_MAX_NAMES = 24
_CUT_CALLS = 2  # calls of an identity Function on tensors without gradient before it is told
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Identity(NamedTuple):
    """A forward that returned its input number ``index`` unchanged."""

    index: int


class _Surrogate(NamedTuple):
    """A step forward (a spike, a binarisation) whose backward, read along a line through the
    step, is not a bump at it: ``info`` holds where the step and the largest value are."""

    index: int
    info: dict


class _Misrouted(NamedTuple):
    """A backward that returned None for input ``needed`` (it needed a gradient) and a gradient
    for input ``given_to`` (it needed none): its return tuple is out of order."""

    needed: int
    given_to: int


class CustomFunctionWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self._done: set = set()  # classes checked (or skipped)
        # identity Functions whose backward is still to be read: cls -> [input index, calls left]
        self._passing: dict = {}
        # .pending: (cls, input index, input) of the apply call in progress
        self._call = threading.local()
        self._busy = False
        self._original = None
        # identity Functions applied with grad on but to tensors without gradient: cls -> calls
        self._cut_calls: dict = {}
        self._cut_told: set = set()

    def _before(self, args, kwargs) -> None:
        if self._busy or not args:
            return
        cls = args[0]
        if not torch.is_grad_enabled():
            return
        passing = self._passing.get(cls)
        if passing is not None:
            inputs = args[1:]
            if passing[0] < len(inputs):
                self._call.pending = (cls, passing[0], inputs[passing[0]])
            return
        if cls in self._done:
            return
        try:
            forward = getattr(cls, "forward", None)
            code = getattr(forward, "__code__", None)
            if code is None or not self.rec.finder.is_user_file(code.co_filename):
                self._done.add(cls)
                return
            inputs = args[1:]
            if not any(isinstance(x, torch.Tensor) and x.requires_grad and x.is_floating_point()
                       for x in inputs):
                if cls not in self._cut_told:
                    # an identity Function on a tensor without gradient: read in ``_after``
                    self._call.cut = (cls, inputs)
                return  # wait for a call a gradient flows through
            self._done.add(cls)
            self._busy = True
            try:
                found = self._check(cls, inputs, kwargs)
            except Exception:
                found = None  # a forward that cannot run on float64 copies: not checked
            finally:
                self._busy = False
            if isinstance(found, _Misrouted):
                loc = self.rec.here(3)
                self.rec.emit_aside(
                    ev.custom_backward(cls=cls.__qualname__, input=found.needed, ratio=None,
                                       forward=[loc.path, loc.line] if loc is not None else None,
                                       given_to=found.given_to),
                    self._backward_location(cls) or loc)
            elif isinstance(found, _Surrogate):
                loc = self.rec.here(3)
                self.rec.emit_aside(
                    ev.custom_backward(cls=cls.__qualname__, input=found.index, ratio=None,
                                       forward=[loc.path, loc.line] if loc is not None else None,
                                       surrogate=found.info),
                    self._backward_location(cls) or loc)
            elif isinstance(found, _Identity):
                self._passing[cls] = [found.index, _PASS_THROUGH_CALLS]
                self._call.pending = (cls, found.index, inputs[found.index])
            elif found is not None:
                index, ratio, ignores = found
                loc = self.rec.here(3)
                self.rec.emit_aside(
                    ev.custom_backward(cls=cls.__qualname__, input=index, ratio=ratio,
                                       forward=[loc.path, loc.line] if loc is not None else None,
                                       ignores_grad=ignores),
                    self._backward_location(cls) or loc)
        except Exception as exc:
            self.rec.internal_error("checking a custom autograd.Function", exc)

    def _after(self, result) -> None:
        cut = getattr(self._call, "cut", None)
        if cut is not None:
            self._call.cut = None
            self._identity_without_grad(cut, result)
        pending = getattr(self._call, "pending", None)
        if pending is None or not torch.is_grad_enabled():
            return  # a call inside a forward (grad off) leaves the outer call's pending
        self._call.pending = None
        try:
            cls, index, x = pending
            passing = self._passing.get(cls)
            node = getattr(result, "grad_fn", None)
            if passing is None or passing[1] <= 0 or node is None \
                    or type(node).__name__ != cls.__name__ + "Backward" \
                    or not isinstance(x, torch.Tensor) or result.shape != x.shape \
                    or not torch.equal(result.detach(), x.detach()):
                return
            passing[1] -= 1
            loc = self.rec.here(3)
            names = self._names(cls)
            position = self._tensor_position(node, x)
            if position is None:
                return
            check_hook(node.register_hook(lambda grad_inputs, grad_outputs:
                                          self._passed(cls, index, position, grad_inputs,
                                                       grad_outputs, loc, names)))
        except Exception as exc:
            self.rec.internal_error("reading an identity autograd.Function's backward", exc)

    def _identity_without_grad(self, cut, result) -> None:
        """A Function whose forward returned one of its inputs unchanged (a gradient reversal,
        a gradient scaling), applied with grad on to inputs none of which needs a gradient: its
        backward never runs, so it does nothing. Told once per class, at its second such call,
        when no call with a gradient flowing came first."""
        try:
            cls, inputs = cut
            if cls in self._done or cls in self._cut_told or not torch.is_grad_enabled() \
                    or not isinstance(result, torch.Tensor) or result.requires_grad:
                return
            index = next((i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)
                          and x.is_floating_point() and x.shape == result.shape
                          and x.device == result.device and torch.equal(x, result)), None)
            if index is None:
                return
            calls = self._cut_calls[cls] = self._cut_calls.get(cls, 0) + 1
            if calls < _CUT_CALLS:
                return
            self._cut_told.add(cls)
            cutting = self._cutting_caller()
            if cutting is None:
                return  # data without gradient (the input batch): nothing says it was cut
            loc = self.rec.here(4)
            self.rec.emit_aside(
                ev.custom_backward(cls=cls.__qualname__, input=index, ratio=None,
                                   forward=[loc.path, loc.line] if loc is not None else None,
                                   identity=True, names=self._names(cls), input_cut=True),
                cutting)
        except Exception as exc:
            self.rec.internal_error("reading an identity autograd.Function's input", exc)

    def _cutting_caller(self) -> Location | None:
        """The first of the user's frames above the apply call (the apply's own included, 4 at
        most) whose line cuts the graph (``.detach()``, ``.data``): where the input lost it."""
        frame = sys._getframe(1)
        seen = 0
        while frame is not None and seen < 4:
            code = frame.f_code
            if self.rec.finder.is_user_file(code.co_filename):
                seen += 1
                text = linecache.getline(code.co_filename, frame.f_lineno)
                if ".detach()" in text or ".data" in text:
                    return Location(self.rec.finder.display_path(code.co_filename), frame.f_lineno,
                                    code.co_name)
            frame = frame.f_back
        return None

    @staticmethod
    def _tensor_position(node, x) -> int | None:
        """Which of the node's gradients is ``x``'s: the edge to ``x``'s grad_fn or to its
        gradient accumulator."""
        target = x.grad_fn
        for position, (fn, _) in enumerate(node.next_functions):
            if fn is None:
                continue
            if target is not None and fn is target:
                return position
            if target is None and getattr(fn, "variable", None) is x:
                return position
        return None

    def _passed(self, cls, index, position, grad_inputs, grad_outputs, loc, names) -> None:
        """The backward's hook: what it returned for the identity input against what it got."""
        try:
            if cls not in self._passing or position >= len(grad_inputs) or not grad_outputs:
                return
            got, gave = grad_outputs[0], grad_inputs[position]
            if got is None or got.shape != getattr(gave, "shape", None):
                return
            # a half-precision backward rounds its product: a multiple up to its precision
            tolerance = max(1e-6, 8 * torch.finfo(gave.dtype).eps) if gave.is_floating_point() \
                else 1e-6
            got = got.detach().reshape(-1)[:_SAMPLE].to(torch.float64)
            gave = gave.detach().reshape(-1)[:_SAMPLE].to(torch.float64)
            norm = float(got.norm())
            if norm == 0 or not bool(gave.any()):
                if self._passing[cls][1] <= 0:
                    del self._passing[cls]
                return  # nothing to read the sign from yet
            del self._passing[cls]
            factor = float((gave * got).sum()) / norm ** 2
            if factor <= 0 or float((gave - factor * got).norm()) > tolerance * factor * norm:
                return  # negated (a reversal) or not a multiple: nothing passed through
            self.rec.emit_aside(
                ev.custom_backward(cls=cls.__qualname__, input=index, ratio=factor,
                                   forward=[loc.path, loc.line] if loc is not None else None,
                                   identity=True, names=names),
                self._backward_location(cls) or loc)
        except Exception as exc:
            self.rec.internal_error("reading an identity autograd.Function's backward", exc)

    def _names(self, cls) -> list[str]:
        """The words the script calls this Function by: its class name and its docstring's
        first line, the function the apply call is in and the identifiers (comment included)
        of that line."""
        words: list[str] = [cls.__qualname__]
        doc = (getattr(cls, "__doc__", None) or "").strip().splitlines()
        if doc:
            words += _WORD.findall(doc[0])
        frame = sys._getframe(1)
        while frame is not None and not self.rec.finder.is_user_file(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is not None:
            code = frame.f_code
            words.append(getattr(code, "co_qualname", code.co_name))
            words += _WORD.findall(linecache.getline(code.co_filename, frame.f_lineno))
        return list(dict.fromkeys(words))[:_MAX_NAMES]

    def _backward_location(self, cls) -> Location | None:
        backward = getattr(cls, "backward", None)
        code = getattr(backward, "__code__", None)
        if code is None:
            return None
        line = code.co_firstlineno
        for offset in range(12):  # past the decorators, to the def
            text = linecache.getline(code.co_filename, line + offset).strip()
            if text.startswith(("def ", "async def ")):
                line += offset
                break
        return Location(self.rec.finder.display_path(code.co_filename), line, code.co_name)

    def _check(self, cls, inputs, kwargs) -> tuple[int, float | None, bool] | _Identity | None:
        """(index of the first input whose gradient disagrees, the ratio backward/numerical or
        None, whether the backward ignores the gradient it is given); a forward that returns an
        input unchanged; or None: agrees, or not checkable."""
        tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
        if sum(x.numel() for x in tensors) > _MAX_ELEMENTS:
            return None
        wanted = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)
                  and x.is_floating_point() and x.requires_grad]
        devices = sorted({x.device.index or 0 for x in tensors if x.device.type == "cuda"})
        device = tensors[0].device
        apply = self._original

        def copy(x, grad):
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                return x.detach().to(torch.float64).clone().requires_grad_(grad)
            return x

        cpu_state = torch.get_rng_state()
        cuda_states = [torch.cuda.get_rng_state(d) for d in devices]
        generator = torch.Generator(device=device)
        generator.manual_seed(20260)

        def run(xs, grad: bool):
            torch.set_rng_state(cpu_state)
            for d, state in zip(devices, cuda_states):
                torch.cuda.set_rng_state(state, d)
            with torch.set_grad_enabled(grad):
                out = apply(cls, *xs, **kwargs)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            return [o for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()]

        sink = io.StringIO()
        with torch.random.fork_rng(devices=devices), contextlib.redirect_stdout(sink), \
                contextlib.redirect_stderr(sink), warnings.catch_warnings(), _no_autocast(device):
            warnings.simplefilter("ignore")
            xs = [copy(x, i in wanted) for i, x in enumerate(inputs)]
            outs = run(xs, True)
            if not outs:
                return None
            for o in outs:
                for i in wanted:
                    if o.shape == xs[i].shape and torch.equal(o.detach(), xs[i].detach()):
                        # the identity: a gradient-reversal or -scaling layer; what its
                        # backward passes through is read from the run (``_after``)
                        return _Identity(i) if len(outs) == 1 else None
            vs = [torch.randn(o.shape, generator=generator, dtype=torch.float64, device=o.device)
                  for o in outs]
            differentiable = [(o, v) for o, v in zip(outs, vs) if o.requires_grad]
            if not differentiable:
                return None
            # what the backward returns for every tensor argument, those that need no gradient
            # included (autograd drops those after the node's hook has seen them)
            returned: list = []
            node = differentiable[0][0].grad_fn
            handle = None
            if node is not None and type(node).__name__ == cls.__name__ + "Backward":
                handle = node.register_hook(
                    lambda grad_inputs, grad_outputs: returned.append(tuple(grad_inputs)))
            try:
                grads = torch.autograd.grad([o for o, _ in differentiable],
                                            [xs[i] for i in wanted],
                                            [v for _, v in differentiable], allow_unused=True,
                                            retain_graph=True)
            finally:
                if handle is not None:
                    handle.remove()
            misrouted = _misrouted(inputs, wanted, returned[0] if returned else None)
            if misrouted is not None:
                return misrouted
            # the chain rule makes a backward linear in the gradient it is given: one that
            # returns the same values for two different incoming gradients ignores it (true of a
            # straight-through estimator too, which the comparison below leaves alone)
            others = [torch.randn(o.shape, generator=generator, dtype=torch.float64, device=o.device)
                      for o, _ in differentiable]
            again = torch.autograd.grad([o for o, _ in differentiable], [xs[i] for i in wanted],
                                        others, allow_unused=True)
            for i, grad, second in zip(wanted, grads, again):
                if grad is not None and second is not None and bool(grad.abs().sum() > 0) \
                        and torch.equal(grad, second):
                    return i, None, True
            base = [x.detach() if isinstance(x, torch.Tensor) else x for x in xs]
            for i, grad in zip(wanted, grads):
                flat = False
                ratios = []
                for _ in range(2):
                    u = torch.randn(base[i].shape, generator=generator, dtype=torch.float64,
                                    device=base[i].device)
                    analytic = float((grad * u).sum()) if grad is not None else 0.0
                    fine = _numerical(run, base, i, u, vs, 1e-6)
                    coarse = _numerical(run, base, i, u, vs, 1e-4)
                    if fine is None or coarse is None:
                        return None
                    scale = max(abs(fine), abs(coarse), 1e-12)
                    if abs(fine - coarse) > 1e-2 * scale:
                        ratios = None  # not smooth here (a step, a kink): no verdict
                        break
                    size = max(abs(analytic), abs(fine))
                    if abs(fine) < 1e-9 * max(abs(analytic), 1.0):
                        ratios = None  # a flat forward: a straight-through or surrogate gradient
                        flat = True
                        break
                    if abs(analytic - fine) <= _TOLERANCE * size + 1e-10:
                        ratios = None  # agrees
                        break
                    ratios.append(analytic / fine)
                if ratios:
                    ratio = ratios[0] if len(ratios) == 2 and \
                        abs(ratios[0] - ratios[1]) <= 1e-3 * max(abs(ratios[0]), 1e-12) else None
                    return i, ratio, False
                if flat and len(wanted) == 1 and len(outs) == 1 and outs[0].shape == base[i].shape:
                    info = _surrogate_off_step(run, base, i)
                    if info is not None:
                        return _Surrogate(i, info)
        return None

    def install(self, patcher) -> None:
        Function = torch.autograd.Function
        method = Function.__dict__.get("apply")
        if not isinstance(method, classmethod):
            return
        self._original = method.__func__
        watcher = self

        def before(args, kwargs) -> None:
            watcher._before(args, kwargs)

        def after(result) -> None:
            watcher._after(result)

        patcher.patch(Function, "apply",
                      classmethod(watched_result(watched(method.__func__, before), after)))


def _misrouted(inputs, wanted, grad_inputs) -> _Misrouted | None:
    """An input that needed a gradient and got None, while a tensor input that needed none got
    a nonzero one: the backward's return tuple is out of forward's argument order (a
    straight-through estimator returning ``None, grad, None`` for ``(x, scale, clip)``).
    The node's gradients are one per tensor argument, in order."""
    if grad_inputs is None:
        return None
    positions = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
    if len(positions) != len(grad_inputs):
        return None
    got = dict(zip(positions, grad_inputs))
    needed = [i for i in wanted if got.get(i) is None]
    given = [i for i in positions if i not in wanted and isinstance(got[i], torch.Tensor)
             and bool(got[i].detach().ne(0).any())]
    if not needed or not given:
        return None
    return _Misrouted(needed[0], given[0])


def _numerical(run, base, i, u, vs, h) -> float | None:
    plus = list(base)
    minus = list(base)
    plus[i] = base[i] + h * u
    minus[i] = base[i] - h * u
    high, low = run(plus, False), run(minus, False)
    if len(high) != len(vs) or len(low) != len(vs):
        return None
    total = 0.0
    for a, b, v in zip(high, low, vs):
        total += float(((a - b) / (2 * h) * v).sum())
    return total


def _no_autocast(device):
    try:
        return torch.autocast(device.type, enabled=False)
    except Exception:
        return contextlib.nullcontext()


_GRID = 4001  # points of the line a step's surrogate gradient is read along
_PEAK = 4.0  # a surrogate's largest value over its value at the step, at most


def _surrogate_off_step(run, base, i) -> dict | None:
    """For an elementwise forward that is one step between two values along the line through
    the range of the input it got (a spike ``(v > 0).float()``, a ``sign``), what its backward
    returns along that line for an incoming gradient of ones: a dict when it is not a bump at
    the step (a value below zero, an infinite one, or a largest value more than ``_PEAK`` times
    the one at the step: the surrogate is centred elsewhere or has a pole); else None."""
    reach = float(base[i].abs().max())
    if not reach > 0:
        return None
    line = torch.linspace(-reach, reach, _GRID, dtype=torch.float64, device=base[i].device)
    xs = list(base)
    xs[i] = line.clone().requires_grad_(True)
    try:
        outs = run(xs, True)
    except Exception:
        return None  # the other arguments do not broadcast against a line
    if len(outs) != 1 or outs[0].shape != line.shape or not outs[0].requires_grad:
        return None
    y = outs[0].detach()
    changes = (y[1:] != y[:-1]).nonzero().flatten()
    if changes.numel() != 1 or torch.unique(y).numel() != 2:
        return None
    g, = torch.autograd.grad(outs[0], xs[i], torch.ones_like(line), allow_unused=True)
    if g is None:
        return None
    j = int(changes[0])
    at_step = float(torch.maximum(g[j].abs(), g[j + 1].abs()))
    finite = bool(torch.isfinite(g).all())
    shown = torch.where(torch.isfinite(g), g, torch.full_like(g, float("inf")))
    top = int(shown.abs().argmax())
    rising = bool(y[j + 1] > y[j])
    sign = 1.0 if rising else -1.0
    negative = bool((sign * g < -1e-12 * max(at_step, 1.0)).any())
    high = float(shown.abs()[top])
    if finite and not negative and (at_step > 0 and high <= _PEAK * at_step or at_step == 0 and high == 0):
        return None
    return {"step": round(float(line[j] + line[j + 1]) / 2, 6), "peak": round(float(line[top]), 6),
            "at_step": at_step, "largest": high if finite else None, "finite": finite,
            "wrong_sign": negative}
