"""A real-valued target the model reads at the very step it is asked to output it.

The token case (an LM's unshifted labels) is read from the embeddings' ids in dependency.py;
this is the same leak for continuous series, where no embedding holds the ids: a forecaster's
window one step too late (the target is the window's last step), a seq2seq decoder given the
unshifted targets under teacher forcing, a decoder unrolled by hand fed ``y[:, k]`` at step k.

What is compared, over one probed forward (dependency.py records it):

* the *readers*: the calls of ``nn.RNNBase``, ``nn.RNNCellBase`` and ``nn.Linear`` modules
  inside the model given graph-free floating data (no gradient: data, not activations). Each
  module's calls make one timeline of steps (an RNN call of T steps adds T, a cell call or a
  decoder call of one step adds one), its inputs laid out (batch, step, features).
* the loss's target, laid out (batch, position, features) with the reader's feature size, and
  compared exactly (a copy, not a function of it) with every step of the timeline; a target
  position that holds fewer than ``_DISTINCT`` values over the batch says nothing.
* which steps the prediction at the matched position reads: one extra ``autograd.grad`` of a
  random-weighted projection of that position of one sample (``r``), with respect to the
  readers' outputs; a recurrent module reads every step up to the last one whose output (or
  final state) gets a gradient, a ``Linear`` over steps the steps that do, a ``Linear`` over a
  flat window (dense) all of it.

The model *copies* when the target at a position equals the input at the last step the
prediction there reads (``s == last``: no step between seeing the value and having to output
it). A dense or bidirectional reader sees every step, so any match is a copy, unless every target
position is in the input (the target *is* the input or part of it: reconstruction). A target that
is the reader's whole input position for position (an autoencoder, a denoiser given the clean
series) is a copy only when the prediction reads earlier steps and no later one (a causal model
with unshifted targets); an autoencoder's prediction reads the whole series through its
bottleneck, a per-frame autoencoder no other step. A target as long as the input that matches
it only at its own positions, some of them not (masked reconstruction: the hidden steps zeroed
in the input), is a reconstruction too. Targets the model must remember (a memory
task's first step) or that it reads one step later (teacher forcing with the shifted targets) are
not copies.
"""

from __future__ import annotations

import torch
from torch import nn

_DISTINCT = 4  # distinct values a target position needs over the batch
_MIN_ROWS = 8
_MAX_STEPS = 2048  # steps of one reader's timeline compared at most
_MAX_POSITIONS = 256
_MAX_VALUES = 1 << 22  # batch x steps x features compared per target position, at most
_TINY = 1e-6
REGRESSION = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")


def reader_call(module, args, output) -> dict | None:
    """What one call of a reader module read and returned, laid out batch first; None when it
    is not a call on graph-free floating CPU data."""
    if not args or not isinstance(args[0], torch.Tensor):
        return None
    x = args[0]
    if x.requires_grad or not x.is_floating_point() or x.device.type != "cpu":
        return None
    if isinstance(module, nn.RNNBase):
        if x.dim() != 3 or not isinstance(output, tuple) or not output:
            return None
        out = output[0]
        state = output[1] if len(output) > 1 else None
        if isinstance(state, tuple):
            state = state[0]
        first = bool(getattr(module, "batch_first", False))
        return {"module": module, "kind": "bi" if module.bidirectional else "rnn",
                "x": x if first else x.transpose(0, 1), "seq": out,
                "seq_first": not first, "state": state}
    if isinstance(module, nn.RNNCellBase):
        if x.dim() != 2:
            return None
        h = output[0] if isinstance(output, tuple) else output
        return {"module": module, "kind": "rnn", "x": x.unsqueeze(1), "seq": None,
                "seq_first": False, "state": h, "cell": True}
    if isinstance(module, nn.Conv1d) and isinstance(output, torch.Tensor) \
            and type(module).forward is nn.Conv1d.forward:
        # a subclass's own forward (a causal conv padding its input first) reads another tensor
        window = _conv_window(module, x)
        if window is None or output.dim() != 3:
            return None
        return {"module": module, "kind": "conv", "x": x.transpose(1, 2), "seq": output,
                "seq_first": False, "state": None, "window": window}
    if isinstance(module, nn.Linear) and isinstance(output, torch.Tensor):
        if x.dim() == 2:
            return {"module": module, "kind": "dense", "x": x.unsqueeze(-1), "seq": None,
                    "seq_first": False, "state": output, "cell": True}
        if x.dim() == 3:
            return {"module": module, "kind": "steps", "x": x, "seq": output,
                    "seq_first": False, "state": None}
    return None


def _conv_window(module, x):
    """``(left, dilation, kernel, stride)`` of a batched ``Conv1d`` call with zero padding:
    output position j reads input steps ``j * stride - left + i * dilation``; None for another
    padding mode (circular and reflected padding read steps from the other end)."""
    if x.dim() != 3 or module.padding_mode != "zeros":
        return None
    k, d, st = int(module.kernel_size[0]), int(module.dilation[0]), int(module.stride[0])
    pad = module.padding
    if pad == "same":
        left = d * (k - 1) // 2
    elif pad == "valid":
        left = 0
    else:
        left = int(pad[0])
    return left, d, k, st


def _grad_tensors(call) -> list:
    return [t for t in (call["seq"], call["state"])
            if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None]


def timelines(calls: list) -> list:
    """The readers' calls grouped by module, in call order: ``[calls]`` per module whose calls
    share one batch size and feature size."""
    by_module: dict = {}
    for call in calls:
        by_module.setdefault(id(call["module"]), []).append(call)
    lines = []
    for group in by_module.values():
        shape = tuple(group[0]["x"].shape[::2])
        if all(tuple(c["x"].shape[::2]) == shape for c in group) \
                and len({c["kind"] for c in group}) == 1:
            lines.append(group)
    return lines


def target_layout(target, B: int, f: int):
    """The target laid out (B, positions, f), and whether it was sequence-first; None when it
    cannot be."""
    if not isinstance(target, torch.Tensor) or not target.is_floating_point() or target.dim() == 0:
        return None
    if int(target.shape[0]) == B:
        flat = target
        seq_first = False
    elif target.dim() >= 2 and int(target.shape[1]) == B:
        flat = target.transpose(0, 1)
        seq_first = True
    else:
        return None
    per = flat[0].numel() if B else 0
    if per == 0 or per % f:
        return None
    return flat.reshape(B, per // f, f), seq_first


def matches(y, x) -> list[tuple[int, int]]:
    """``(t, s)`` where the target's position ``t`` holds exactly the input's step ``s`` in every
    sample, for target positions that vary over the batch."""
    B, T, f = y.shape
    S = int(x.shape[1])
    if B < _MIN_ROWS or T > _MAX_POSITIONS or S > _MAX_STEPS or B * S * f > _MAX_VALUES:
        return []
    found = []
    with torch.no_grad():
        xs = x.detach()
        ys = y.detach().to(xs.dtype)
        for t in range(T):
            column = ys[:, t]
            if torch.unique(column).numel() < _DISTINCT:
                continue
            same = (xs == column[:, None, :]).all(dim=2).all(dim=0)
            found.extend((t, int(s)) for s in same.nonzero().flatten().tolist())
    return found


def read_steps(line: list, grads: dict, r: int) -> tuple[set, int | None]:
    """The steps of a module's timeline whose outputs the probed prediction reads
    (``grads``: id(tensor) -> gradient), and the last one."""
    read: set = set()
    offset = 0
    tops = []
    for call in line:
        T = int(call["x"].shape[1])
        for t in _grad_tensors(call):
            g = grads.get(id(t))
            if g is not None:
                tops.append(float(g.detach().abs().max()))
        offset += T
    top = max(tops, default=0.0)
    if top == 0.0:
        return read, None
    floor = top * _TINY
    offset = 0
    for call in line:
        T = int(call["x"].shape[1])
        seq, state = call["seq"], call["state"]
        g = grads.get(id(seq)) if isinstance(seq, torch.Tensor) else None
        if g is not None and call["kind"] == "conv":
            left, d, k, st = call["window"]
            if g.dim() == 3 and 0 <= r < int(g.shape[0]):
                per = g[r].detach().abs().amax(0)
                for j in (per > floor).nonzero().flatten().tolist():
                    read.update(offset + s for s in (j * st - left + i * d for i in range(k))
                                if 0 <= s < T)
            offset += T
            continue
        if g is not None:
            g = g.detach()
            g = g.transpose(0, 1) if call["seq_first"] else g
            if g.dim() >= 2 and int(g.shape[1]) == T and 0 <= r < int(g.shape[0]):
                per = g[r].abs().reshape(T, -1).amax(1)
                read.update(offset + int(p) for p in (per > floor).nonzero().flatten().tolist())
        g = grads.get(id(state)) if isinstance(state, torch.Tensor) else None
        if g is not None:
            g = g.detach()
            rows = g[:, r] if g.dim() == 3 and not call.get("cell") else g[r] if g.dim() >= 1 else g
            if bool((rows.abs() > floor).any()):
                read.add(offset + T - 1)
                if call["kind"] in ("bi", "dense"):
                    read.update(range(offset, offset + T))
        if call["kind"] == "bi" and any(offset <= p < offset + T for p in read):
            read.update(range(offset, offset + T))
        offset += T
    return read, (max(read) if read else None)


def judge(kind: str, pairs: list, t: int, positions: int, whole: bool, read: set,
          last: int | None, steps: int | None = None) -> int | None:
    """The input step the prediction at position ``t`` copies its target from, or None."""
    if last is None:
        return None
    if not whole and positions == steps and all(tt == s for tt, s in pairs):
        return None  # masked reconstruction: the input's own positions, some of them hidden
    at_t = [s for tt, s in pairs if tt == t]
    if not at_t:
        return None
    matched = {tt for tt, _ in pairs}
    if not whole and positions == steps and len(matched) == positions \
            and len({s for _, s in pairs}) == positions:
        return None  # the whole input reordered (an autoencoder trained on the reversed series)
    if kind == "conv" and not whole:
        # a convolution reads its window directly, no memory between: a target step inside the
        # window of the prediction's own position is in view, unless the target is (part of)
        # the input itself
        if len(matched) == positions:
            # the target is the input (behind a padding that shifts its steps): a copy when the
            # prediction reads its own step last and earlier ones too (a causal model trained
            # on unshifted targets); a reconstruction otherwise
            return next((s for s in at_t if s == last and any(p < s for p in read)), None)
        return next((s for s in at_t if s in read), None)
    if kind in ("dense", "bi"):
        # every step is in view: a copy unless the target is (part of) the input itself
        if len(matched) == positions:
            return None
        return next((s for s in at_t if s in read), None)
    for s in at_t:
        if s != last:
            continue
        if kind == "rnn":
            # a recurrence reads every step up to the last one: a target that is the whole
            # input is copied when steps before it are read (not a sequence of one)
            return s if not whole or s >= 1 else None
        if s in read and (not whole or any(p < s for p in read)):
            return s  # a per-step autoencoder reads no other step
    return None


def grad_inputs(lines: list) -> list:
    return [t for line in lines for call in line for t in _grad_tensors(call)]
