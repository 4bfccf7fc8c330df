"""Whether the loss reads a causal sequence module's output only where it has seen part of each
sequence (summary-before-sequence-end).

A causal sequence module (a unidirectional ``nn.RNN``/``LSTM``/``GRU``; a Transformer encoder or
decoder, or an ``nn.MultiheadAttention`` outside them, run with a causal mask or ``is_causal``)
gives at position t an output that has read the positions 0..t only. A loss that reads such an output at an early position alone (``out[:, 0]``
of a one-direction GRU taken as the sequence's summary, ``out[0]`` of a seq-first LSTM,
``h[:, 0]`` of a causal encoder, a fixed middle index) never depends on the later positions: the
model trains and is silently bad. Read from gradients, at the first ``WINDOW`` backwards only:

* Global module forward hooks (removed with the window) note each such module's output (the
  outermost Transformer call: a causal encoder's layers are not noted again), its time
  dimension, its directions, and for each position whether the module's input holds the same
  values in every row there (padding past every row's end, or a position no row fills).
* A causal module whose input was made by something that mixes positions both ways (a
  bidirectional RNN's or a non-causal attention's output, a batched product, a convolution,
  found by walking its input's graph back, through the causal modules noted before it) is not
  noted: its early outputs have seen later positions through its input.
* A gradient hook on that output (torch's own ``register_hook``: it reads, never changes the
  gradient) looks, once, at the gradient a script's backward gives it: for each row and
  direction, the positions where it is nonzero. When every row that gets a gradient gets it at
  the same positions (one position, or a fixed slice shorter than what it leaves out: a loss
  at every step but the last is no summary), the outputs read have seen, for a
  forward direction, positions 0..max of them; for a backward one, min of them..T - 1. The
  positions neither direction's read outputs have seen, among those whose input is not the same
  in every row, are never read by the loss. Found at two backwards of the same call, at the
  same positions (a position drawn anew for each batch, as CPC reads its context, is a
  design): ``causal_read_early`` (an aside at the module's call), once per run.

A recurrence unrolled by hand is read the same way: ``torch.stack`` is wrapped for the window
(put back with it) and a stack of ``_MIN_STEPS`` tensors or more along dim 0 or 1, each a step's
state whose graph reaches the state of the step before within ``_STEP_NODES`` nodes (breadth
first) while the first's does not reach the second's (``h = cell(x[:, t], h); hs.append(h)``,
an Elman step written with matrices, a spiking neuron's membrane), gets a hook on its node
(``Node.register_prehook``: it reads the gradient arriving at the stack) judged like a
one-direction module's output, every position counted as filled (``module="torch.stack"``).

A bidirectional RNN is two causal modules side by side: read at its last step only
(``out[:, -1]``), both together have seen everything, but the backward direction there has read
a single position. That is the same verdict for one direction (``direction`` in the event),
made when the union is whole. (A read at position 0, whose forward half has seen position 0
alone, stays silent: it is the layout of a first-step summary beside a backward half that has
read everything.)

Silent: a read of the last position (``out[:, -1]``) of a one-direction module or of every
position (language models, taggers, pooling over time, attention pooling); a read whose
positions differ between rows (each row's last real step gathered with its length, max
pooling); a bidirectional RNN read at each direction's own end (``cat(out[:, -1, :H],
out[:, 0, H:])``, or ``h_n``); a non-causal Transformer (CLS pooling);
``pack_padded_sequence`` (its output is no tensor); a loss that reads the final hidden state
(``h_n``, or an LSTM's ``c_n``: a gradient hook on each notes that one got a gradient), alone or
with an early step; positions past p that hold padding in every row (the same input in every
row there, or hidden in every row by the call's own key padding mask). Skipped:
threads other than the script's, torch.compile (the window closes before it runs), gradients of
graddoctor's own probes (no script backward runs).
"""

from __future__ import annotations

import weakref
from collections import deque
from threading import get_ident

import torch
from torch import nn

from .. import events as ev
from .dependency import close_before_compile, register_module_hooks
from .inlinable import watched_call
from .patcher import check_hook, put_back
from .recorder import Recorder
from .topics import STEPPED

WINDOW = 8  # backwards watched, from the first one
_OUTPUTS = 8  # outputs noted per backward at most
_MIN_ROWS_SPREAD = 2  # rows needed to tell a fixed read from one that varies (else one position)
_STACKS = 16  # stacks of recurrent steps watched per backward at most
_MIN_STEPS = 3  # steps a stack of recurrent states holds, at least
_STEP_NODES = 64  # graph nodes walked back from one step's state to find the step before

_tensor_register_hook = torch.Tensor.register_hook  # torch's own: dependency.py wraps the script's calls


def _register_hook(tensor, hook):
    return check_hook(_tensor_register_hook(tensor, hook))  # removed when the check ends

_TRANSFORMERS = (nn.TransformerEncoder, nn.TransformerEncoderLayer,
                 nn.TransformerDecoder, nn.TransformerDecoderLayer)
_DECODERS = (nn.TransformerDecoder, nn.TransformerDecoderLayer)
_NODES = 300  # graph nodes walked back from a causal module's input at most
# graph nodes that mix positions of a sequence (attention's batched products, convolutions)
_MIXING = ("Bmm", "ScaledDotProduct", "_ScaledDotProduct", "_EfficientAttention",
           "_FlashAttention", "Convolution")


def causal_mask(mask) -> bool:
    """Whether an attention mask is square and hides exactly the positions after each query's
    own (``generate_square_subsequent_mask``, ``torch.triu(ones, 1).bool()``); a (batch * heads,
    T, T) mask is read at its first entry."""
    if not isinstance(mask, torch.Tensor) or mask.dim() not in (2, 3):
        return False
    if mask.dim() == 3:
        mask = mask[0]
    length = int(mask.shape[0])
    if length < 2 or int(mask.shape[1]) != length:
        return False
    with torch.no_grad():
        hidden = mask if mask.dtype == torch.bool else mask < -1e4
        above = torch.ones(length, length, dtype=torch.bool, device=mask.device).triu(1)
        return bool((hidden == above).all())


def _transformer_causal(module, args, kwargs) -> bool:
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    if isinstance(module, _DECODERS):
        if kwargs.get("tgt_is_causal") is True:
            return True
        mask = kwargs.get("tgt_mask", args[2] if len(args) > 2 else None)
    else:
        if kwargs.get("is_causal") is True:
            return True
        mask = kwargs.get("mask", kwargs.get("src_mask", args[1] if len(args) > 1 else None))
    return causal_mask(mask)


def _attention_causal(args, kwargs) -> bool:
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    if kwargs.get("is_causal") is True:
        return True
    return causal_mask(kwargs.get("attn_mask", args[5] if len(args) > 5 else None))


def _key_padding(module, args, kwargs):
    """The call's own key padding mask, (batch, T) with True (or -inf) at padding: a position
    it hides in every row holds no data, whatever the module's input holds there (the output
    of an earlier layer differs between rows at padding positions too)."""
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    if isinstance(module, nn.MultiheadAttention):
        mask = kwargs.get("key_padding_mask", args[3] if len(args) > 3 else None)
    elif isinstance(module, _DECODERS):
        mask = kwargs.get("tgt_key_padding_mask", args[4] if len(args) > 4 else None)
    else:
        mask = kwargs.get("src_key_padding_mask", args[2] if len(args) > 2 else None)
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        return None
    return mask if mask.dtype == torch.bool else mask < -1e4


def _batch_first(module) -> bool | None:
    layer = module
    if isinstance(module, (nn.TransformerEncoder, nn.TransformerDecoder)):
        layers = getattr(module, "layers", None)
        if not layers:
            return None
        layer = layers[0]
    attention = getattr(layer, "self_attn", None)
    return None if attention is None else bool(getattr(attention, "batch_first", False))


def unread_positions(nonzero: torch.Tensor, forward: tuple[bool, ...], filled: torch.Tensor,
                     min_rows: int = _MIN_ROWS_SPREAD) -> tuple[list[int], int] | None:
    """The positions a causal read never sees, from ``nonzero`` (rows, T, directions: where the
    gradient on the output is not zero), ``forward`` (per direction: reads 0..t at t, else
    t..T - 1) and ``filled`` (T: the input differs between rows there). ``(read positions of
    the first direction read, positions unread)``; None when any direction read is read at
    positions that differ between rows, or nothing is read, or nothing informative is unread,
    or several positions are read and fewer are left unread (a loss at every step but the
    last, whose next token there is none of: not a summary)."""
    rows, length, directions = nonzero.shape
    seen = torch.zeros(length, dtype=torch.bool)
    read_any, positions = False, None
    for d in range(directions):
        mask = nonzero[:, :, d]
        reached = mask.any(1)
        if not bool(reached.any()):
            continue
        mask = mask[reached]
        first = mask[0]
        if not bool((mask == first).all()):
            return None  # each row read elsewhere: lengths, max pooling
        at = first.nonzero().flatten().tolist()
        if int(mask.shape[0]) < min_rows and len(at) > 1:
            return None  # one row: a pooling's pattern cannot be told from a fixed read
        read_any = True
        if positions is None:
            positions = at
        if forward[d]:
            seen[:max(at) + 1] = True
        else:
            seen[min(at):] = True
    if not read_any:
        return None
    unread = [t for t in range(length) if not bool(seen[t]) and bool(filled[t])]
    if not unread or len(positions) > 1 and len(unread) < len(positions):
        return None  # most positions read: a loss per step that leaves out the last (no target)
    return positions, unread


def short_direction(nonzero: torch.Tensor, forward: tuple[bool, ...], filled: torch.Tensor,
                    min_rows: int = _MIN_ROWS_SPREAD) -> tuple[int, list[int], list[int]] | None:
    """A bidirectional output read at its last step only, where both directions together have
    seen everything but the backward one alone has not: ``out[:, -1]`` gives the forward
    direction's full read and the backward direction's first step, which has seen the last
    position alone. ``(direction, its read positions, the positions it has not seen)``, or None
    (either direction read where rows differ, a direction not read, each direction read at its
    own far end: ``cat(out[:, -1, :H], out[:, 0, H:])``; a read at position 0, whose forward
    half has seen position 0 alone, is left as the design earlier checks chose)."""
    rows, length, directions = nonzero.shape
    if directions != 2:
        return None
    reads = []
    for d in range(directions):
        mask = nonzero[:, :, d]
        reached = mask.any(1)
        if not bool(reached.any()):
            return None  # one direction is not read at all: another question
        mask = mask[reached]
        if not bool((mask == mask[0]).all()):
            return None
        at = mask[0].nonzero().flatten().tolist()
        if int(mask.shape[0]) < min_rows and len(at) > 1:
            return None
        reads.append(at)
    for d, at in enumerate(reads):
        if forward[d]:
            continue  # a forward half read at 0 beside a backward half that has read it all:
            # the layout of a read at position 0, kept as a design (a CLS-like first step)
        unread = [t for t in range(min(at)) if bool(filled[t])]
        if len(unread) >= len(at) and len(unread) >= 2:
            return d, at, unread
    return None


def forward_recurrence(steps) -> bool:
    """Whether ``steps`` (the tensors given to one ``torch.stack``) are the states of a
    recurrence run forward: all of one shape, each with a graph, the second's and the last's
    graphs reaching the step just before theirs within ``_STEP_NODES`` nodes (``h = f(x_t, h)``),
    the first's not reaching the second's (a backward recurrence stacked in time order reads the
    other way)."""
    first = steps[0]
    if not isinstance(first, torch.Tensor) or first.dim() < 1 or first.dim() > 3:
        return False
    shape = first.shape
    for step in steps:
        if not isinstance(step, torch.Tensor) or step.grad_fn is None or step.shape != shape:
            return False
    nodes = [step.grad_fn for step in steps]
    if len(set(map(id, nodes))) != len(nodes):
        return False  # one tensor stacked several times: no sequence of steps
    last = len(steps) - 1
    return _reaches(nodes[1], nodes[0]) and _reaches(nodes[last], nodes[last - 1]) \
        and not _reaches(nodes[0], nodes[1])


def _reaches(root, target) -> bool:
    """Breadth first: the step before is a few nodes away, while a depth-first walk could go
    down another chain (a spiking layer's input membrane) through every earlier step."""
    seen, queue = set(), deque([root])
    while queue:
        node = queue.popleft()
        if node is None or node in seen:
            continue
        if node is target and node is not root:
            return True
        if len(seen) >= _STEP_NODES:
            return False
        seen.add(node)
        queue.extend(child for child, _ in node.next_functions)
    return False


class _Watch:
    __slots__ = ("module", "time_dim", "forward", "filled", "loc", "turn", "done", "final",
                 "handles", "__weakref__")

    def __init__(self, module: str, time_dim: int, forward: tuple, filled, loc, turn: int):
        self.module, self.time_dim, self.forward, self.filled, self.loc = module, time_dim, forward, filled, loc
        self.turn = turn
        self.done = False
        self.final = False  # the final hidden state got a gradient: the whole sequence is read
        self.handles: list = []


class CausalReadWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        self.active = False
        self._handles: list = []
        self._backwards = 0
        self._depth = 0  # Transformer calls open on the script's thread
        self._noted = 0  # outputs noted since the last backward
        self._watches: list[_Watch] = []
        self._ready: list[tuple] = []  # verdicts of the gradient hooks, emitted on the script's thread
        self._told = False
        # this turn's outputs of modules that mix a sequence's positions both ways (a
        # bidirectional RNN, attention without a causal mask): ids of their grad_fns
        self._mixers: set[int] = set()
        # this turn's noted causal outputs: id of the output's grad_fn -> the input's grad_fn
        self._through: dict[int, object] = {}
        # (module class, call site) -> the positions its first verdict read (() once they
        # differed), and how many verdicts it had
        self._sites: dict[tuple, object] = {}
        self._seen_at: dict[tuple, int] = {}
        self._restore: list = []  # (owner, name, original, wrapper): torch.stack, put back
        self._stacks = 0  # stacks of recurrent states watched since the last backward

    def _stop(self) -> None:
        self.active = False
        restore, self._restore = self._restore, []
        for owner, name, original, wrapper in restore:
            try:  # not from under another watcher's wrapper
                put_back(owner, name, original, wrapper)
            except Exception as exc:
                self.rec.internal_error("causal read (stack)", exc)
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        watches, self._watches = self._watches, []
        for watch in watches:
            for handle in watch.handles:
                handle.remove()
        self._mixers, self._through, self._ready = set(), {}, []

    # -- module hooks ------------------------------------------------------------------------
    def _pre(self, module, args):
        if isinstance(module, _TRANSFORMERS) and get_ident() == self.rec.script_thread:
            self._depth += 1
        return None

    def _post(self, module, args, *rest):
        transformer = isinstance(module, _TRANSFORMERS)
        if get_ident() != self.rec.script_thread:
            return None
        if transformer:
            self._depth = max(0, self._depth - 1)
        if not self.active or self._told or self._noted >= _OUTPUTS:
            return None
        attention = isinstance(module, nn.MultiheadAttention)
        if not (transformer or attention or isinstance(module, nn.RNNBase)) \
                or not torch.is_grad_enabled():
            return None
        try:
            kwargs, output = rest if len(rest) == 2 else ({}, None)
            final = None
            if attention:
                if self._depth:
                    return None
                if not _attention_causal(args, kwargs):
                    self._mixer(output)
                    return None
                batch_first = bool(module.batch_first)
                out = output[0] if isinstance(output, (tuple, list)) and output else output
                forward = (True,)
            elif transformer:
                if self._depth:
                    return None
                if not _transformer_causal(module, args, kwargs):
                    self._mixer(output)
                    return None
                batch_first = _batch_first(module)
                out = output
                forward = (True,)
            else:
                batch_first = bool(module.batch_first)
                out = output[0] if isinstance(output, (tuple, list)) and output else output
                if module.bidirectional:
                    self._mixer(output)
                forward = (True, False) if module.bidirectional else (True,)
                final = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
            named = kwargs if isinstance(kwargs, dict) else {}
            data = args[0] if args else next((named[k] for k in ("input", "src", "tgt", "query")
                                              if k in named), None)
            padding = None if isinstance(module, nn.RNNBase) else _key_padding(module, args, kwargs)
            self._note(module, batch_first, out, data, forward, final, padding)
        except Exception as exc:
            self._stop()
            self.rec.internal_error("causal read (forward)", exc)
        return None

    def _note(self, module, batch_first, out, data, forward, final, padding=None) -> None:
        if batch_first is None or not isinstance(out, torch.Tensor):
            return
        if not isinstance(data, torch.Tensor) or out.dim() != 3 or not out.requires_grad \
                or data.dim() != 3:
            return
        time_dim = 1 if batch_first else 0
        length = int(out.shape[time_dim])
        if length < 2 or int(data.shape[time_dim]) != length or int(out.shape[2]) % len(forward):
            return
        self._through[id(out.grad_fn)] = data.grad_fn
        if len(forward) == 1 and self._mixed_before(data.grad_fn):
            return  # its input at an early position has seen the later ones already
        with torch.no_grad():
            x = data.detach() if batch_first else data.detach().transpose(0, 1)
            if int(x.shape[0]) < 2:
                filled = torch.ones(length, dtype=torch.bool)
            else:
                filled = (x != x[:1]).flatten(2).any(2).any(0).cpu()
            if padding is not None and tuple(padding.shape) == (int(x.shape[0]), length):
                filled &= ~padding.detach().all(0).cpu()
        watch = _Watch(type(module).__name__, time_dim, forward, filled, self.rec.here(), self._backwards)
        watcher = self

        def hook(grad, watch_ref=weakref.ref(watch)):
            watch = watch_ref()
            try:
                # None: the RNN's output sequence reached no loss (only h_n is read), so torch
                # calls the hook of that unused output without a gradient
                if grad is None or watch is None or watch.done or watcher._told or not watcher.active \
                        or not (watcher.rec.running_backwards and watcher.rec.in_backward()):
                    return None
                watch.done = True
                watcher._judge(watch, grad)
            except Exception as exc:
                watcher.rec.internal_error("causal read (gradient)", exc)
            return None

        def final_hook(grad, watch_ref=weakref.ref(watch)):
            watch = watch_ref()
            try:
                if grad is not None and watch is not None and watcher.rec.running_backwards \
                        and watcher.rec.in_backward() and bool((grad != 0).any()):
                    watch.final = True
            except Exception as exc:
                watcher.rec.internal_error("causal read (gradient)", exc)
            return None

        watch.handles.append(_register_hook(out, hook))
        # h_n (and an LSTM's c_n): read too, it has seen the whole sequence
        for state in (final if isinstance(final, (tuple, list)) else (final,)):
            if isinstance(state, torch.Tensor) and state.requires_grad:
                watch.handles.append(_register_hook(state, final_hook))
        self._watches.append(watch)
        self._noted += 1

    # -- recurrences unrolled by hand: their states stacked -----------------------------------
    def _stacked(self, args, kwargs, result) -> None:
        """``torch.stack`` (wrapped for the window): a stack of the states of a recurrence the
        script unrolls itself (``h = cell(x[:, t], h); hs.append(h)``, a spiking neuron's
        membrane) gets a hook on its node, judged like a recurrent module's output."""
        if not self.active or self._told or self._stacks >= _STACKS \
                or not isinstance(result, torch.Tensor) or result.grad_fn is None \
                or get_ident() != self.rec.script_thread:
            return
        try:
            steps = args[0] if args else kwargs.get("tensors")
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            if not isinstance(steps, (list, tuple)) or len(steps) < _MIN_STEPS \
                    or not isinstance(dim, int):
                return
            time_dim = dim % result.dim()
            if time_dim > 1 or result.dim() > 4 or not forward_recurrence(steps):
                return
            self._note_stack(result, time_dim)
        except Exception as exc:
            self._stop()
            self.rec.internal_error("causal read (stack)", exc)

    def _note_stack(self, result: torch.Tensor, time_dim: int) -> None:
        length = int(result.shape[time_dim])
        # the rows: the steps' leading axis (a batch); steps of one axis stacked first are one
        # sequence's (its features, no batch)
        batched = time_dim == 1 or result.dim() >= 3
        watch = _Watch("torch.stack", time_dim, (True,), torch.ones(length, dtype=torch.bool),
                       self.rec.here(), self._backwards)
        watcher = self

        def hook(grad_outputs, watch_ref=weakref.ref(watch), batched=batched):
            watch = watch_ref()
            try:
                grad = grad_outputs[0] if grad_outputs else None
                if not isinstance(grad, torch.Tensor) or watch is None or watch.done \
                        or watcher._told or not watcher.active \
                        or not (watcher.rec.running_backwards and watcher.rec.in_backward()):
                    return None
                watch.done = True
                with torch.no_grad():
                    g = grad.detach()
                    if not batched:
                        g = g.unsqueeze(0) if watch.time_dim == 0 else g
                    elif watch.time_dim == 0:
                        g = g.transpose(0, 1)
                    rows, length = int(g.shape[0]), int(g.shape[1])
                    nonzero = (g.reshape(rows, length, -1) != 0).any(2, keepdim=True).cpu()
                watcher._judge_nonzero(watch, nonzero, rows, length)
            except Exception as exc:
                watcher.rec.internal_error("causal read (gradient)", exc)
            return None

        watch.handles.append(check_hook(result.grad_fn.register_prehook(hook)))
        self._watches.append(watch)
        self._stacks += 1

    def _mixer(self, output) -> None:
        out = output[0] if isinstance(output, (tuple, list)) and output else output
        if isinstance(out, torch.Tensor) and out.grad_fn is not None and len(self._mixers) < 64:
            self._mixers.add(id(out.grad_fn))

    def _mixed_before(self, root) -> bool:
        """Whether the graph that made a causal module's input mixes a sequence's positions
        both ways (a bidirectional RNN's or a non-causal attention's output, a batched product
        or a convolution), passing over the inside of the causal modules noted before it; True
        also when the walk stops before it has seen the whole graph (nothing is then said)."""
        seen, stack = set(), [root]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            if len(seen) >= _NODES:
                return True
            seen.add(node)
            key = id(node)
            if key in self._mixers or type(node).__name__.startswith(_MIXING):
                return True
            if key in self._through:
                stack.append(self._through[key])
                continue
            stack.extend(child for child, _ in node.next_functions)
        return False

    def _judge(self, watch: _Watch, grad: torch.Tensor) -> None:
        with torch.no_grad():
            g = grad.detach()
            if watch.time_dim == 0:
                g = g.transpose(0, 1)
            rows, length, width = g.shape
            directions = len(watch.forward)
            nonzero = (g.reshape(rows, length, directions, width // directions) != 0).any(3).cpu()
        self._judge_nonzero(watch, nonzero, rows, length)

    def _judge_nonzero(self, watch: _Watch, nonzero: torch.Tensor, rows: int, length: int) -> None:
        found = unread_positions(nonzero, watch.forward, watch.filled)
        direction = None
        if found is None:
            short = short_direction(nonzero, watch.forward, watch.filled)
            if short is None:
                return
            d, positions, unread = short
            direction = "forward" if watch.forward[d] else "backward"
        else:
            positions, unread = found
        self._ready.append((watch, positions, unread, int(rows), int(length), direction))
        self.rec.resume(STEPPED, self.after_step)  # a verdict to emit at the step

    # -- the script's thread: verdicts out, the window ----------------------------------------
    def _emit_ready(self) -> None:
        ready, self._ready = self._ready, []
        for watch, positions, unread, rows, length, direction in ready:
            if self._told:
                break
            if watch.final:
                continue  # the final hidden state is read as well
            # a read at the same positions in two backwards: a position drawn per batch (CPC's
            # context at a random step) is a design, not a summary
            site = (watch.module, watch.loc, direction)
            before = self._sites.setdefault(site, positions)
            if before != positions:
                self._sites[site] = ()
            if before != positions or self._seen_at.get(site, 0) < 1:
                self._seen_at[site] = self._seen_at.get(site, 0) + 1
                continue
            self._told = True
            self.rec.emit_aside(ev.causal_read_early(
                module=watch.module, positions=positions[:8], read=len(positions),
                length=length, unread=len(unread), rows=rows,
                seq_first=watch.time_dim == 0, direction=direction), watch.loc)

    def describe_loss(self, tensors) -> dict:
        if not self.active and not self._ready:
            return {}
        try:
            self._emit_ready()
            if self.active:
                self._backwards += 1
                self._noted = 0
                self._stacks = 0
                self._mixers, self._through = set(), {}
                # an output of an earlier turn that got no gradient will get none now
                kept = []
                for watch in self._watches:
                    if watch.done or watch.turn < self._backwards - 1:
                        for handle in watch.handles:
                            handle.remove()
                    else:
                        kept.append(watch)
                self._watches = kept
                if self._backwards > WINDOW or self._told:
                    self._stop()
        except Exception as exc:
            self._stop()
            self.rec.internal_error("causal read", exc)
        return {}

    def after_step(self, opt, optimizer) -> None:
        """``STEPPED``: emit what this step's backward found (the gradient hooks ran in it)."""
        try:
            self._emit_ready()
            if self._told and self.active:
                self._stop()
        except Exception as exc:
            self._stop()
            self.rec.internal_error("causal read", exc)
        if not self.active and not self._ready:
            # the window closed: only a gradient hook still queued can give it work (it resumes
            # the watcher)
            self.rec.retire(STEPPED, self.after_step)

    # -- install -----------------------------------------------------------------------------
    def _before_compile(self) -> None:
        if self.active:
            self._stop()

    def install(self, patcher) -> None:
        close_before_compile(patcher, self._before_compile)
        # only the causal modules' calls: no other module's call reaches the hooks below
        self._handles = register_module_hooks(patcher, self._pre, None, classes=_TRANSFORMERS) + \
            register_module_hooks(patcher, None, self._post,
                                  classes=(*_TRANSFORMERS, nn.MultiheadAttention, nn.RNNBase))
        original = torch.stack
        wrapper = patcher.patch(torch, "stack", watched_call(original, self._stacked))
        self._restore.append((torch, "stack", original, wrapper))
        self.active = True
