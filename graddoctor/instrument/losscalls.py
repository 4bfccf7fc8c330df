"""Who hears of the calls of the loss functions graddoctor wraps (losses.py: the regression
losses; loss_inputs.py: the classification losses), and on which condition — one place, so a
new listener is one argument here and not one more in each wrapper:

* ``idle`` (IdleParamWatcher): every call, once it watches a module;
* ``constants`` (ConstantLossWatcher): calls on an input without gradient, grad mode on (a
  loss term with no graph);
* ``columns`` (TargetColumnWatcher), ``rows`` (FullRowsWatcher) and ``labels``
  (ConstantTargetsWatcher), ``prompts`` (PromptMaskWatcher), ``placeholders``
  (PlaceholderTargetWatcher), ``remaps`` (TargetRemapWatcher), ``directions``
  (AttentionMaskWatcher: the targets of a model whose attention mask is reversed): the first
  calls with a gradient
  (while each is ``open``; once closed, which is for good, it is dropped), not ``ctc_loss``'s
  (its targets are label sequences).
"""

from __future__ import annotations

import torch


class LossCalls:
    def __init__(self, idle=None, constants=None, columns=None, rows=None, labels=None,
                 repeats=None, prompts=None, placeholders=None, remaps=None, directions=None):
        self.idle, self.constants, self.columns, self.rows = idle, constants, columns, rows
        self.labels, self.repeats, self.prompts = labels, repeats, prompts
        self.placeholders = placeholders
        self.remaps = remaps
        self.directions = directions
        # whether any of the listeners to the first calls with a gradient is still held: once
        # none is, such a call is told to nobody (every call of a long run makes one)
        self._firsts = any(x is not None for x in (columns, rows, labels, repeats, prompts,
                                                   placeholders, remaps, directions))

    def heard(self, fn: str, input, target, args, kwargs) -> None:
        """A wrapped loss function is called (``fn``), with its input and target as read by
        the wrapper: told to each listener whose condition holds."""
        idle = self.idle
        if idle is not None and idle.watching:
            idle.loss_call(fn, input)
        if not isinstance(input, torch.Tensor) or not torch.is_grad_enabled():
            return
        if not input.requires_grad:
            if self.constants is not None:
                self.constants.loss_call(fn, args, kwargs)
            return
        if not self._firsts or fn == "ctc_loss":
            return
        # each of these closes for good after its first calls: it is then let go of here
        columns = self.columns
        if columns is not None:
            if columns.open:
                columns.loss_call(fn, input, target)
            else:
                self.columns = None
        rows = self.rows
        if rows is not None:
            if rows.open:
                rows.loss_call(fn, input, target, args, kwargs)
            else:
                self.rows = None
        labels = self.labels
        if labels is not None:
            if labels.open:
                labels.loss_call(fn, input, target, args, kwargs)
            else:
                self.labels = None
        repeats = self.repeats
        if repeats is not None:
            if repeats.open:
                repeats.loss_call(fn, input, target, args, kwargs)
            else:
                self.repeats = None
        prompts = self.prompts
        if prompts is not None:
            if prompts.open:
                prompts.loss_call(fn, input, target, args, kwargs)
            else:
                self.prompts = None
        placeholders = self.placeholders
        if placeholders is not None:
            if placeholders.open:
                placeholders.loss_call(fn, input, target, args, kwargs)
            else:
                self.placeholders = None
        remaps = self.remaps
        if remaps is not None:
            if remaps.open:
                remaps.loss_call(fn, input, target, args, kwargs)
            else:
                self.remaps = None
        directions = self.directions
        if directions is not None:
            if directions.open:
                directions.loss_call(fn, input, target, args, kwargs)
            else:
                self.directions = None
        if self.columns is None and self.rows is None and self.labels is None \
                and self.repeats is None and self.prompts is None and self.placeholders is None \
                and self.remaps is None and self.directions is None:
            self._firsts = False
