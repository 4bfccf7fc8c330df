"""A generator trained toward the discriminator's own target for its samples.

In a GAN the discriminator D is trained to push its output on generated samples toward "fake",
and the generator G to push that same output the other way ("real"). A generator loss written
with the fake label (``bce(D(G(z)), zeros)``, the label of D's fake term), or a WGAN generator
loss with its sign flipped (``D(G(z)).mean()``), trains G to help D: the gradient both losses
send into D's output on the same generated samples points the same way.

Read from values, at the first ``WINDOW`` backwards only, on the script's thread. Global module
hooks (removed with the window) note each outermost module call that has parameters: its
output, and whether one of its inputs is the output of another outermost call made before it
(the same memory: ``fake`` or ``fake.detach()``, whose producer still holds it). Such a call is
a module D evaluated on another module G's samples; a gradient hook on D's output keeps the
first gradient a backward gives it (at most ``_VALUES`` values). Once the same D has been
evaluated on the same samples both ways, detached (D's own step: only D is trained) and with
the gradient flowing into G (G's step), the two gradients are compared element by element: a
cosine near 1 says G's loss pushes D's output on its samples where D's loss does
(``gan_same_target``, an aside at G's call of D). The rule checks that D and G are stepped by
different optimizers.

A vocoder's discriminator called on (real, generated) audio returns lists of scores and
feature maps, no one tensor. An outermost call given a generator's samples hooks its submodules
until it ends (only such a call: no other module call pays for it); when its output is no one
tensor, the highest parts of it given the samples (each scale or period) are compared as above.
A generated sample trimmed to the data's length (``y_hat[:, :n]``: as many axes of more than
one entry, none longer, the memory of the output's base from its start) is the output still.

A non-saturating loss (``bce(D(fake), ones)``), the minimax form (``-bce(D(fake), zeros)``),
WGAN's ``-D(fake).mean()`` and hinge losses give the opposite sign.

A WGAN-GP draws fresh noise for each critic step and again for the generator's step, so D never
sees one batch of samples both ways. The first gradient of each kind per (D, G) is kept whatever
the samples; when both are one constant on every sample where they are not 0 (a critic's mean:
``1/N`` each, whatever was drawn; a hinge's active part), their signs are compared instead
(``same_samples`` false). Gradients that depend on D's output (logistic, least squares) are
compared by the target each call's own line gives (``_same_implied_target``: the gradient
against the sigmoid of the output or the output itself, ``y = -intercept / slope``), never
value by value: a least-squares generator below both targets rightly pushes the same way.

Either loss may hold the wrong target: G's (the fake label), or D's (its generated samples
labelled real, ``bce(D(fake.detach()), ones)``). D's own backward tells them apart: the
gradient it gives D's output on data no module made (the real samples) is, sample by sample, a
function of that output with the real target in it (a line in the output for a squared error,
in its sigmoid for a logistic loss, a constant for a WGAN critic). When the generated samples'
gradients lie on the real samples' line, their target is the real one (``critic_fake_as_real``)
and D's loss is the one to change. The outputs are kept with the gradients (at most ``_VALUES``
of each, at the first backwards only).
"""

from __future__ import annotations

import weakref
from threading import get_ident

import torch

from .. import events as ev
from .dependency import close_before_compile, register_module_hooks
from .patcher import check_hook
from .recorder import Recorder
from .samplerange import SampleRange
from .topics import STEPPED

WINDOW = 8  # backwards watched, from the first one
_OUTPUTS = 64  # outermost outputs remembered (their producers) per backward
_VALUES = 4096  # gradient values kept per call
_MIN_VALUES = 4  # samples compared at least
_SAME = 0.98  # cosine of the two gradients at least: one direction
# G's gradient against D's, fitted by a line: its intercept over G's gradient's size at most (one
# target: G's is D's scaled, 0.01 in the fake-label GANs tried; a least-squares GAN's two targets
# shift it: 0.8 to 1.1 where both push D's output the same way, below both targets)
_OFFSET = 0.1
_MAX_PIDS = 32
_INNER = 16  # calls inside one outermost call kept for it
_INNER_HOOKS = 64  # submodules hooked inside one outermost call

_tensor_register_hook = torch.Tensor.register_hook  # torch's own: dependency.py wraps the script's calls


def _register_hook(tensor, hook):
    return check_hook(_tensor_register_hook(tensor, hook))  # removed when the check ends


def _ptr(tensor) -> int | None:
    """Where a tensor's values start; None for one without storage (a functorch transform's
    wrapper, a fake or meta tensor) or with no elements."""
    try:
        return tensor.data_ptr() or None
    except Exception:
        return None


def _first_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


def _cropped(shape: tuple, root, t) -> bool:
    """Is ``t`` a crop from its start (``y_hat[:, :n]``, trimmed to the data's length) of an
    output of ``shape`` whose memory ``root`` owns: as many axes of more than one entry
    (``squeeze(1)`` taken), none longer, the same memory?"""
    mine, theirs = [n for n in t.shape if n != 1], [n for n in shape if n != 1]
    if len(mine) != len(theirs) or any(a > b for a, b in zip(mine, theirs)):
        return False
    try:
        return t.untyped_storage().data_ptr() == root.untyped_storage().data_ptr()
    except Exception:
        return False


def _affine(d_grad, g_grad) -> tuple[float, float | None]:
    """How much D's gradient varies over the samples (its standard deviation over its root mean
    square: 0 for a loss whose gradient is one constant, WGAN's and the hinge's), and the
    intercept of the least-squares line ``g = a * d + b`` over the root mean square of G's
    gradient: near 0 when G's gradient is D's scaled (one target), large when it is D's shifted
    (least squares toward another target); None when D's gradient does not vary."""
    d_mean, g_mean = float(d_grad.mean()), float(g_grad.mean())
    d_rms = float(d_grad.pow(2).mean().sqrt())
    d_var = float((d_grad - d_mean).pow(2).mean())
    spread = (d_var ** 0.5) / d_rms if d_rms else 0.0
    if d_var <= 0.0:
        return 0.0, None
    slope = float(((d_grad - d_mean) * (g_grad - g_mean)).mean()) / d_var
    g_rms = float(g_grad.pow(2).mean().sqrt())
    offset = abs(g_mean - slope * d_mean) / g_rms if g_rms else None
    return round(spread, 6), None if offset is None else round(offset, 6)


def _constant_level(grad) -> float | None:
    """The one value a gradient takes on every sample where it is not 0 (a WGAN critic's or
    generator's ``± 1/N``; a hinge's, 0 where the margin holds), when at least half the samples
    have it; None when it varies (a logistic or least-squares loss: a function of the output)."""
    nonzero = grad[grad != 0]
    if nonzero.numel() < max(_MIN_VALUES, grad.numel() // 2):
        return None
    level = float(nonzero.mean())
    if not level or float((nonzero - level).abs().max()) > 1e-3 * abs(level):
        return None
    return level


def _same_implied_target(d_values, d_grad, g_values, g_grad) -> bool:
    """Do two calls of D on different samples get their gradients from one target? A logistic
    or squared-error term's gradient is ``c * (f(x) - y)`` of the output ``x`` (``f``: the
    sigmoid, or the output itself): a line in ``f(x)`` whose slope and intercept give the target
    ``y = -intercept / slope``. The line is chosen on D's own call (the better fit of the two
    forms, r² at least 0.98) and fitted to G's call too; one target and slopes of one sign mean
    G's loss pulls D's outputs where D's loss does. False whenever a fit fails (outputs that
    barely vary, another loss form)."""
    if d_values is None or g_values is None or d_values.numel() != d_grad.numel() \
            or g_values.numel() != g_grad.numel() or min(d_grad.numel(), g_grad.numel()) < 8:
        return False
    best = None
    for transform in (lambda v: v, torch.sigmoid):
        fit = _line_fit(transform(d_values), d_grad)
        if fit is not None and fit[2] >= 0.98 and fit[0] and (best is None or fit[2] > best[1][2]):
            best = (transform, fit)
    if best is None:
        return False
    transform, (d_slope, d_intercept, _) = best
    fit = _line_fit(transform(g_values), g_grad)
    if fit is None or fit[2] < 0.98 or not fit[0] or (fit[0] > 0) != (d_slope > 0):
        return False
    d_target, g_target = -d_intercept / d_slope, -fit[1] / fit[0]
    spread = float((transform(d_values).max() - transform(d_values).min())) or 1.0
    return abs(d_target - g_target) <= 0.05 * max(1.0, abs(d_target), spread)


def _line_fit(x, y) -> tuple[float, float, float] | None:
    """``(slope, intercept, r2)`` of the least-squares line ``y = slope * x + intercept``; None
    when ``x`` does not vary."""
    x_mean, y_mean = float(x.mean()), float(y.mean())
    var = float((x - x_mean).pow(2).mean())
    if var <= 1e-18:
        return None
    slope = float(((x - x_mean) * (y - y_mean)).mean()) / var
    intercept = y_mean - slope * x_mean
    total = float((y - y_mean).pow(2).mean())
    residual = float((y - (slope * x + intercept)).pow(2).mean())
    return slope, intercept, (1.0 - residual / total) if total > 0 else 0.0


def _same_target(real, fake) -> bool | None:
    """Does D's own loss give its generated samples the target of its real ones? Each term's
    gradient is a function of D's output: ``c * (x - t)`` for a squared error, ``c * (sigmoid(x)
    - y)`` for a logistic loss, a constant for a WGAN critic. The real term's gradients (``real``:
    (outputs, gradients)) are fitted by a line in the output or in its sigmoid; the generated
    samples' gradients lie on that same line only when their target is the same. None when it
    cannot be told (no real term seen, no line fits)."""
    if real is None or fake[0] is None:
        return None
    (x_r, g_r), (x_f, g_f) = real, fake
    if min(x_r.numel(), x_f.numel()) < _MIN_VALUES or x_r.numel() != g_r.numel() \
            or x_f.numel() != g_f.numel():
        return None
    scale = float(g_r.pow(2).mean().sqrt())
    if not scale:
        return None
    spread = float(g_r.std()) / scale
    if spread < 1e-3:  # one constant (a WGAN critic): the same constant is the same target
        return bool(float((g_f - g_r.mean()).abs().max()) <= 0.05 * scale)
    best = None
    for transform in (lambda v: v, torch.sigmoid):
        fit = _line_fit(transform(x_r), g_r)
        if fit is not None and fit[2] >= 0.98 and (best is None or fit[2] > best[1][2]):
            best = (transform, fit)
    if best is None:
        return None
    transform, (slope, intercept, _) = best
    predicted = slope * transform(x_f) + intercept
    error = float((g_f - predicted).pow(2).mean().sqrt())
    return error <= 0.1 * max(scale, float(g_f.pow(2).mean().sqrt()))


class AdversarialWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.active = False
        self._handles: list = []
        self._backwards = 0
        # calls inside the outermost call now running that were given a generator's samples:
        # (module, producer, samples, output, "through" | "detached")
        self._inner: list[tuple] = []
        self._inner_handles: list = []  # the submodules' hooks of the outermost call now running
        # data_ptr of an outermost call's output -> (weak output, weak module)
        self._outputs: dict[int, tuple] = {}
        # (id of D, id of G's output) -> {"detached" | "through": (gradient, Location)}
        self._pairs: dict[tuple, dict] = {}
        self._players: dict[tuple, tuple] = {}  # the same key -> (weak D, weak G, weak samples)
        self._ready: list[tuple] = []  # keys whose two gradients are in, not judged yet
        # (id of D, id of G) -> {"detached" | "through": (gradient, Location, backward, values)}:
        # the first gradient of each kind whatever the samples (a WGAN draws fresh noise for
        # G's step), judged only when both are one constant (``_judge_loose``)
        self._loose: dict[tuple, dict] = {}
        self._loose_players: dict[tuple, tuple] = {}
        self._ready_loose: list[tuple] = []
        self._told = False
        # (id of a module, backward) -> the gradient its output got from that backward when it
        # was called on data no other module made (D on real samples), for telling which loss
        # has the wrong target: D's own loss pushes its output on real and generated samples
        # opposite ways
        self._plain: dict[tuple, torch.Tensor] = {}
        # the ranges of the samples and the data a module compares (samplerange.py)
        self.ranges = SampleRange(rec)

    # -- the window -------------------------------------------------------------------------
    def _stop(self) -> None:
        self.active = False
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._outputs = {}
        self._inner = []
        self._unhook_inner()

    def describe_loss(self, tensors) -> dict:
        """``DESCRIBE_LOSS``: a backward is about to run; judge what the last ones gave."""
        self._judge_ready()
        if self._plain:  # only the last backward's are still compared (in place: the hooks
            # hold the dict)
            for key in [k for k in self._plain if k[1] < self._backwards - 1]:
                del self._plain[key]
        if self.active:
            self._backwards += 1
            if len(self._outputs) > _OUTPUTS:
                self._outputs = {}
            if self._backwards >= WINDOW:
                self._stop()  # the gradient hooks of this backward's calls still fire
        return {}

    def after_step(self, opt, optimizer) -> None:
        """``STEPPED``: judge the pairs this step's backward completed (on the script's thread;
        the gradient hooks may run on autograd's)."""
        self._judge_ready()
        if not self.active and not self._ready and not self._ready_loose:
            # the window closed: only a gradient hook still set can give it work (it resumes
            # the watcher)
            self.rec.retire(STEPPED, self.after_step)

    def _judge_ready(self) -> None:
        if not self._ready and not self._ready_loose:
            return
        ready, self._ready = self._ready, []
        for key in ready:
            if self._told:
                break
            try:
                self._judge(key, self._pairs.pop(key, None) or {})
            except Exception as exc:
                self.rec.internal_error("adversarial", exc)
        loose, self._ready_loose = self._ready_loose, []
        for key in loose:
            if self._told:
                break
            try:
                self._judge_loose(key, self._loose.get(key) or {})
            except Exception as exc:
                self.rec.internal_error("adversarial", exc)
        if self._told:
            self._pairs, self._players = {}, {}
            self._loose, self._loose_players = {}, {}

    # -- module hooks (outermost calls only) -------------------------------------------------
    def _post(self, module, args, *rest):
        if not self.active or get_ident() != self.rec.script_thread:
            return None
        try:
            kwargs, output = rest if len(rest) == 2 else ({}, None)
            self._outer(module, args, output)
        except Exception as exc:
            self._stop()
            self.rec.internal_error("adversarial", exc)
        return None

    def _made_by(self, module, t):
        """``(sample, producer)`` when ``t`` is the output of an earlier outermost call of another
        module (``fake``, ``fake.detach()``, or a crop of it from its start: ``y_hat[:, :n]``,
        the same memory), else None."""
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
            return None
        ptr = _ptr(t)
        made = self._outputs.get(ptr) if ptr is not None else None
        if made is None:
            return None
        sample, producer, root = made[0](), made[1](), made[2]()
        if producer is None or producer is module or root is None:
            return None
        if sample is not None and _ptr(sample) != ptr:
            return None
        # the output may be gone when only a crop of it was kept (``gen(mel)[:, :n]``): its
        # memory's owner (the view's base) still stands for it
        if tuple(t.shape) != made[3] and not _cropped(made[3], root, t):
            return None
        return sample, producer, root

    def _pre(self, module, args) -> None:
        """An outermost call given a generator's samples: hook the calls of its submodules
        until it ends (a multi-scale discriminator's scales, ``self.discs[0](y_hat)``), only
        then, so that no other module call pays for them."""
        if not self.active or get_ident() != self.rec.script_thread:
            return None
        try:
            self._unhook_inner()
            if not any(self._made_by(module, t) is not None for t in args):
                return None
            for sub in module.modules():
                if sub is module or next(sub.parameters(recurse=False), None) is None \
                        and not sub._modules:
                    continue
                if len(self._inner_handles) >= _INNER_HOOKS:
                    break
                self._inner_handles.append(check_hook(sub.register_forward_hook(self._inner_post)))
        except Exception as exc:
            self._stop()
            self.rec.internal_error("adversarial", exc)
        return None

    def _unhook_inner(self) -> None:
        handles, self._inner_handles = self._inner_handles, []
        for handle in handles:
            handle.remove()

    def _inner_post(self, module, args, *rest):
        """A call inside an outermost call given a generator's samples: kept, when it was
        given them too, until the outermost call ends (``_outer`` takes it when that call's
        output is no one tensor)."""
        if not self.active or get_ident() != self.rec.script_thread:
            return None
        try:
            out = _first_tensor(rest[-1] if rest else None)
            if out is None or not torch.is_grad_enabled() or not out.requires_grad \
                    or not out.is_floating_point() or out.numel() < _MIN_VALUES \
                    or len(self._inner) >= _INNER or next(module.parameters(), None) is None:
                return None
            for t in args:
                made = self._made_by(module, t)
                if made is not None:
                    self._inner.append((module, made[1], made[2], out,
                                        "through" if t.requires_grad else "detached"))
                    break
        except Exception as exc:
            self._stop()
            self.rec.internal_error("adversarial", exc)
        return None

    def _outer(self, module, args, output) -> None:
        self._unhook_inner()
        inner, self._inner = self._inner, []
        out = _first_tensor(output)
        if out is None and inner and torch.is_grad_enabled() \
                and any(self._made_by(module, t) is not None for t in args):
            # a discriminator whose output is no one tensor (HiFi-GAN's multi-scale one returns
            # lists of scores and feature maps for the real and the generated samples): its
            # parts that scored the generated samples are compared instead
            inside = {id(m) for m in module.modules()}
            for sub, producer, sample, sub_out, how in inner:
                if id(sub) not in inside or sub is module:
                    continue
                # the highest part given the samples (a scale, not the first layer inside it)
                if any(other is not sub and any(m is sub for m in other.modules())
                       for other, *_ in inner):
                    continue
                self._watch(sub, producer, sample, sub_out, how)
            return
        if out is None or not torch.is_grad_enabled() or not out.requires_grad \
                or not out.is_floating_point() or out.numel() < _MIN_VALUES:
            return
        if next(module.parameters(), None) is None:
            return  # a loss module, an activation: not a model
        for t in args:
            made = self._made_by(module, t)
            if made is None:
                continue
            sample, producer, root = made
            self._watch(module, producer, root, out, "through" if t.requires_grad else "detached")
            if sample is not None:
                self.ranges.generated(module, producer, sample)
            break
        else:
            self._watch_plain(module, out)
            data = next((t for t in args if isinstance(t, torch.Tensor) and t.is_floating_point()
                         and t.numel()), None)
            if data is not None:
                self.ranges.plain(module, data)
        ptr = _ptr(out)
        if ptr is not None and len(self._outputs) < _OUTPUTS:
            root = out._base if out._base is not None else out
            self._outputs[ptr] = (weakref.ref(out), weakref.ref(module), weakref.ref(root),
                                  tuple(out.shape))

    def _watch_plain(self, module, out) -> None:
        """Keep the gradient of this call's output (a module on data no module made) from the
        backward that follows, once per module and backward."""
        key = (id(module), self._backwards)
        if key in self._plain or len(self._plain) >= _OUTPUTS:
            return
        self._plain[key] = None
        plain = self._plain
        values = out.detach().reshape(-1)[:_VALUES].double().clone()

        def hook(grad):
            try:
                # a custom Function's backward returning None for this output hands the hook None
                if grad is not None and plain.get(key) is None and self.rec.running_backwards:
                    plain[key] = (values, grad.detach().reshape(-1)[:_VALUES].double().clone())
            except Exception as exc:
                self.rec.internal_error("adversarial (gradient)", exc)
            return None

        _register_hook(out, hook)

    def _watch(self, module, producer, sample, out, how: str) -> None:
        key = (id(module), id(sample))
        known = self._players.get(key)
        if known is not None and known[2]() is not sample:
            self._pairs.pop(key, None)  # another batch of samples at the same id
        if key not in self._pairs and len(self._pairs) >= _OUTPUTS:
            return
        pair = self._pairs.setdefault(key, {})
        if how in pair:
            return
        lkey = (id(module), id(producer))
        if lkey not in self._loose and len(self._loose) >= _OUTPUTS:
            lkey = None
        loose = self._loose.setdefault(lkey, {}) if lkey is not None else None
        if lkey is not None:
            self._loose_players.setdefault(lkey, (weakref.ref(module), weakref.ref(producer)))
        self._players[key] = (weakref.ref(module), weakref.ref(producer), weakref.ref(sample))
        loc = self.rec.here()
        backward = self._backwards
        # D's outputs, kept for both kinds: with fresh noise for each step, each call's target is
        # read from its own outputs and gradients (``_implied_target``)
        values = out.detach().reshape(-1)[:_VALUES].double().clone()
        watcher = self

        def hook(grad):
            try:
                # a script's backward only (not an autograd.grad of graddoctor's probes)
                if grad is not None and how not in pair and not watcher._told \
                        and watcher.rec.running_backwards:
                    pair[how] = (grad.detach().reshape(-1)[:_VALUES].double().clone(), loc, backward,
                                 values)
                    if len(pair) == 2:
                        watcher._ready.append(key)
                        watcher.rec.resume(STEPPED, watcher.after_step)  # judged at the step
                    if loose is not None and how not in loose:
                        loose[how] = pair[how]
                        if len(loose) == 2:
                            watcher._ready_loose.append(lkey)
                            watcher.rec.resume(STEPPED, watcher.after_step)
            except Exception as exc:
                watcher.rec.internal_error("adversarial (gradient)", exc)
            return None

        _register_hook(out, hook)

    def _judge(self, key, pair) -> None:
        if len(pair) < 2:
            return
        d_grad, _, d_backward, d_values = pair["detached"]
        g_grad, g_loc, _, _ = pair["through"]
        d_step_loc = pair["detached"][1]
        if d_grad.numel() != g_grad.numel() or d_grad.numel() < _MIN_VALUES:
            return
        dot = float((d_grad * g_grad).sum())
        norms = float(d_grad.norm()) * float(g_grad.norm())
        if not norms or norms != norms:
            return
        cosine = dot / norms
        if cosine < _SAME:
            return
        spread, offset = _affine(d_grad, g_grad)
        if offset is not None and offset > _OFFSET:
            return  # G's gradient is D's shifted: least squares toward another target
        refs = self._players.get(key)
        if refs is None:
            return
        self._emit(refs[0](), refs[1](), cosine, offset, d_grad.numel(), d_step_loc, d_backward,
                   d_values, d_grad, g_loc)

    def _judge_loose(self, key, pair) -> None:
        """D's step and G's step on different samples (fresh noise for each): comparable only
        where both gradients on D's output are one constant, the same for every sample (a WGAN
        critic's ``D(fake).mean()``, a hinge's active part), whatever the samples were; the
        same sign then says G's loss pushes D's output where D's loss does."""
        if len(pair) < 2:
            return
        d_grad, d_loc, d_backward, d_values = pair["detached"]
        g_grad, g_loc, _, g_values = pair["through"]
        d_level, g_level = _constant_level(d_grad), _constant_level(g_grad)
        if d_level is not None and g_level is not None:
            if (d_level > 0) != (g_level > 0):
                return
        elif not _same_implied_target(d_values, d_grad, g_values, g_grad):
            return
        refs = self._loose_players.get(key)
        if refs is None:
            return
        self._emit(refs[0](), refs[1](), 1.0, None, min(d_grad.numel(), g_grad.numel()), d_loc,
                   d_backward, d_values, d_grad, g_loc, same_samples=False)

    def _emit(self, d_module, g_module, cosine, offset, samples, d_step_loc, d_backward, d_values,
              d_grad, g_loc, same_samples=True) -> None:
        if d_module is None or g_module is None:
            return
        self._told = True
        tensors = self.rec.tensors
        d_pids = [pid for p in d_module.parameters() if (pid := tensors.number.get(id(p))) is not None]
        g_pids = [pid for p in g_module.parameters() if (pid := tensors.number.get(id(p))) is not None]
        if not d_pids or not g_pids:
            return
        real = self._plain.get((id(d_module), d_backward))
        self._plain.clear()
        self.rec.emit_aside(ev.gan_same_target(
            critic=type(d_module).__name__, generator=type(g_module).__name__,
            critic_params=d_pids[:_MAX_PIDS], generator_params=g_pids[:_MAX_PIDS],
            cosine=round(cosine, 4), offset=offset, samples=int(samples),
            critic_step=[d_step_loc.path, d_step_loc.line] if d_step_loc is not None else None,
            critic_fake_as_real=_same_target(real, (d_values, d_grad)),
            same_samples=same_samples),
            g_loc)

    # -- install -----------------------------------------------------------------------------
    def _before_compile(self) -> None:
        if self.active:  # torch.compile warns about global module hooks
            self._stop()

    def install(self, patcher) -> None:
        close_before_compile(patcher, self._before_compile)
        self._handles = register_module_hooks(patcher, self._pre, self._post, outermost=True)
        self.active = True
