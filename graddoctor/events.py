"""Every event kind, one typed constructor each: the only place their data keys and defaults live.

A constructor returns ``(kind, data)``, a ``Made``; ``Recorder.emit(made, loc)`` (the
instrumentation) and ``Trace.put(made, loc)`` / ``TraceBuilder`` (traces written by hand in
tests) turn it into an ``Event``, whose ``data`` is read-only from then on. The parameter names
are the data keys, so ``constructor(**event.data)`` rebuilds an event's data (the tests check
that for real runs). Lists in ``data`` belong to the event once it is made: the caller hands
over a list it will not change again. No torch here.

Event kinds and their ``data`` (ids are small ints graddoctor assigns):

=================  ==========================================================================
kind               data
=================  ==========================================================================
run_start          script, argv, device, torch_version
param              pid, name, shape, is_parameter, requires_grad       (at first sight),
                   stepped_requires_grad (requires_grad as the last step that owned it read it;
                   None: no step read it)
optimizer_init     opt, cls, params [pid], lrs [float|None] (the lr of each param group it adds,
                   in order: one event per ``add_param_group``, which the constructor calls per
                   group; None in a trace written before it was recorded), hyper [{name: number
                   | [number, number]}|None] (each such group's update-rule settings that are
                   plain numbers: betas, momentum, dampening, weight_decay, eps, alpha; None when
                   not recorded), aliases [[pid, pid]] (only when any: a parameter of this group
                   whose memory starts where one the optimizer already owns does, with that
                   one's pid first: the same tensor listed twice, or two Parameters over one
                   storage; instrument/optim.py), unread [[[key, number|None]]|None] and
                   settings [str] (only when any: per group, the keys a torch optimizer's step
                   never reads, with the optimizer's own setting names beside them)
backward           fresh [pid], accumulated [pid], cleared_outside [pid],
                   extra_leaves (non-parameter leaves this backward writes, e.g. FGSM input; the
                   count of its call line's latest graph walk, see instrument/backward.py),
                   in_step (opt id when run inside ``optimizer.step(closure)``, else None),
                   scaled (bool: backward of ``scaler.scale(loss)``), scale (float|None),
                   loss_scale_factor (float|None: how the loss was divided, when known),
                   loss_terms (list|None: the loss terms below that factor, each as how it was
                   reduced: "mean" | "sum" | "none" | None when its node does not say; None
                   when the factor is; a constant dividing a "sum" makes a mean),
                   batch ([loader, epoch, index] of the batch a DataLoader served last, or None),
                   graph_nodes (int|None: interior autograd nodes its graph walk reached; only
                   for a backward with retain_graph/create_graph whose line was walked),
                   history ([[seq, [pid]]]|None: per earlier backward whose graph this one
                   reaches again, its event's seq and the tracked leaves fed through those
                   nodes; [] when nothing is shared, None when not looked at; see
                   instrument/backward.py),
                   scaler, scaler_enabled (only present when given: a scaled backward),
                   allreduce (only present when a DistributedDataParallel forward ran since the
                   previous backward: True when this backward all-reduces the gradients, False
                   when every such forward ran under ``no_sync()``),
                   repeats (only present when this backward starts from the very loss tensor an
                   earlier backward with retain_graph ran: that backward's seq),
                   updated_by_hand ([pid], only present when not empty: tensors no optimizer
                   owns, written by this backward, that changed since a backward last wrote
                   them: a hand-written update), applied_by_hand ([pid] among those, only present
                   when not empty: the ones whose grad this backward adds onto although it is
                   the one that earlier backward wrote: the update applied it, nothing cleared it),
                   rescaled ([pid], only present when not empty: tensors whose grad, applied by a
                   step, the script changed in place to something other than zero before this
                   backward added onto it: ``p.grad *= momentum``, a hand-written momentum),
                   autocast_fp16 ([path, line], only present when a float16 autocast was entered
                   with gradients on since the previous backward: where),
                   loss_negated (only present when the loss is a torch loss function times a
                   negative constant, ``-F.cross_entropy(...)``, ``1 - loss``, or its reciprocal,
                   ``1 / loss``: that function's autograd node, ``NllLossBackward0``, with a
                   ``1/`` prefix for the reciprocal),
                   loss_constant (only present, True, for one of a run's first
                   ``amp.CONSTANT_CHECKS`` backwards whose loss adds a tensor with no graph: a
                   sum at its top, under constant factors, one of whose operands autograd does
                   not reach — a penalty from ``p.data`` / ``.detach()``, a number, a sum
                   started from 0 over one term: the source tells them apart),
                   hand_step_cosine (only present after one of a run's first hand-written updates
                   of module parameters, no optimizer: the cosine between the change of their
                   values and the gradient that update applied; -1 for plain SGD, +1 for ascent),
                   hand_step_scale (only present after one of those updates, of any CPU leaf
                   tensors, that moved them by the gradient times one negative number: that
                   number's size, the step size applied; instrument/handstep.py)
(threads)          backward, clear, step_begin and step made in a thread other than the one that
                   runs the script also carry thread (1, 2, ...: ``THREADED_KINDS``)
clear              via ("optimizer.zero_grad" | "module.zero_grad"), opt (id|None),
                   set_to_none, params [pid], caller ([path, line, function] of the line that
                   called the user's helper holding the zero_grad() call, ``reset(opt)`` in the loop; None
                   at module level)
step_begin         opt, closure (bool), norm_pids [pid], norms [float] (L2 norm of each grad about
                   to be applied, parallel to norm_pids; empty for closure steps; both None when
                   not measured: every grad was already seen finite by a clip_grad_norm_ or
                   GradScaler.unscale_ and is unchanged since; measured anyway on each optimizer's
                   first update and from the step budget's last update on),
                   nonfinite [pid] (grads with NaN/Inf),
                   frozen [[pid, moved_by, freeze]] (owned params with requires_grad False and a
                   .grad that is not None: the step updates them, torch skips only a None grad;
                   not checked for closure steps. moved_by: what moves such a param when its grad
                   is zero — "weight_decay", "momentum" (SGD/RMSprop buffer), "moments" (Adam
                   family), "unknown" (an optimizer class graddoctor does not know), or None
                   (nothing: plain SGD, Adagrad, lr 0); freeze: seq of the param's latest freeze
                   event, or None),
                   edited_params [pid] (owned params with a .grad changed in place since the
                   latest step that owns them, by code other than the optimizer — an EMA,
                   ``copy_``, a clamp under no_grad; seen through ``tensor._version``, so edits
                   through ``p.data`` are not seen; not checked for closure steps),
                   moved [pid] (tracked tensors that no optimizer owns and that got a gradient,
                   whose values changed since the previous optimizer step: copied back from an
                   fp32 master copy, updated by hand; each listed once, at most the first
                   ``optim.MOVE_CHECKS`` steps after their first gradient are looked at),
                   lrs [float|None] (each param group's ``lr`` as the step reads it, in group
                   order; None for a group whose lr is not a plain number, e.g. a tensor; the
                   list is None when not read: a trace written before it was recorded)
step               opt, closure (bool: a closure was given and ran a backward; Lightning passes
                   one to every step), skipped (bool: GradScaler skipped the update),
                   without_grad [pid] (owned params whose .grad was None)
epoch_start        loader, epoch, real_len, replay_len (the replay's shorter epoch, see
                   ``--epoch-batches``; None for a stream without length), planned (only on a
                   loader's first epoch, when the source and the frame's variables tell it: the
                   count of the loop around the script's loop over the loader, ["epochs", E]
                   for ``for epoch in range(E)`` or ["steps", N] for ``while step < N``, or
                   ["updates", N] for a framework's count of optimizer steps (Lightning's
                   ``max_steps``); instrument/planned.py)
short_len          loader, real_len, replay_len (the first ``len()`` of a DataLoader that
                   returned the replay's shorter epoch length, per loader; an aside)
phase_hold         wait ("loop" | "switch" | "evaluation" | "later"), updates (at the step budget),
                   until (when the wait ended), cut (None: reached; "updates" | "seconds": the cap ended it;
                   "long": the pass is longer than the cap, not waited for), cap, cap_s (the caps:
                   updates in all, seconds after the budget) — the step budget held until
                   the loop around a script's training loop (one without a DataLoader) began
                   its next pass, a stage switch on its counter ran, its first evaluation ran,
                   or ("later") a later statement of the script that trains (a fine-tuning
                   stage, a student after its teacher, a second task) had run as many updates
                   as the budget (loc: that loop's header, the switch's ``if``, the line of the
                   training loop calling the evaluation, or the later statement; an aside;
                   instrument/phases.py); a "loop" wait that was reached also says the loop's
                   planned count (["epochs", E] for ``for epoch in range(E)``) and passes (its
                   passes done when the next began, so ``(until - 1) / passes`` updates a pass),
                   both absent when the source or the frame's values do not tell them
unscale            scaler, opt, enabled, implicit (called by ``scaler.step``), scale
scaler_step        scaler, opt, enabled, fused, skipped, found_inf (after ``scaler.step``; a
                   skipped one is also recorded as a ``step`` with skipped=True)
scaler_update      scaler, enabled, scale (the new scale)
scaler_init        scaler, cls, enabled (``is_enabled()`` once constructed), requested (the
                   ``enabled`` argument as given, default True; None when the constructor's
                   arguments could not be read: a subclass of its own), init_scale (float|None:
                   the scale it starts from, as constructed) — the user's
                   constructor call of a GradScaler (loc: that line)
scaler_load        scaler (``GradScaler.load_state_dict``: its scale and growth count now
                   come from a checkpoint, not from its construction)
clip               via (clip_grad_norm_ | clip_grad_value_ | clip_grads_with_norm_),
                   params [pid] (tracked params passed), with_grad [pid], untracked, limit
                   (max_norm or clip_value: a float, inf included), norm_type, norm_only (max_norm
                   is inf: computes the norm, clips nothing), total_norm (CPU only),
                   edited [pid] (grads changed in place by unwatched code before the clip),
                   spent (the iterable given was a generator, or a filter/map over one, that
                   had already been iterated before this call: True; a collection, a tensor
                   or a fresh generator: False; another one-shot iterator: None), clipped,
                   kept (clip_grad_value_'s first ``clip.VALUE_MEASURED`` calls over CPU
                   gradients only: the share of the gradients' elements beyond clip_value, and
                   the clamped gradients' norm over the given one)
grad_edit          opt, params [pid] (grads changed in place by unwatched code before a step),
                   factors [float|None] (only on one of the first edited steps right after a
                   sampled backward, when some group has one: per param group, the constant c
                   such that every sampled edited CPU grad of the group is c times what the
                   backward left, ``p.grad *= lr``; instrument/editfactor.py)
scheduler_step     sched, cls, opt (the optimizer it drives), lrs [float|None] (each param group's
                   lr right after the step: what it wrote; None when the step raised),
                   metric ("none": no argument | "integer" | "number": another real number |
                   "tensor" | "grad_tensor": a tensor that requires grad, a training loss |
                   "other"; what step() got: ReduceLROnPlateau's metric, another scheduler's
                   deprecated epoch),
                   grad (grad mode on at the call); for a ``ReduceLROnPlateau`` only: value
                   (float|None: the metric it was fed, one element read like torch reads it)
                   and mode ("min" | "max": which way it counts an improvement)
scheduler_init     sched, cls, opt, args {name: number|list} (the schedule's length and shape as
                   the constructor set them: T_max, total_iters, step_size, milestones,
                   start_factor, total_steps, T_0, ...; OneCycleLR's rise_steps (where its
                   first phase ends); for a ``LambdaLR`` over a
                   ``functools.partial`` its numeric keywords, such as transformers'
                   num_warmup_steps / num_training_steps), children [sched] (the schedulers a
                   SequentialLR / ChainedScheduler steps itself), base_lrs [float|None],
                   lrs [float|None] (each group's lr once constructed: a warm-up's first
                   factor already applied) — the user's constructor call (loc: that line)
train / eval       the user's outermost Module.train()/eval() call: mode (bool), leaf (it named
                   one BatchNorm/dropout layer), root (class), frozen (every parameter under it
                   frozen), modules [mid] (BatchNorm/dropout layers it covers), calls (merged)
mode_module        mid, name, cls, layer ("batchnorm" | "dropout"), has_params, frozen, owned,
                   trainable, updated (changed in place outside an optimizer: EMA),
                   track_running_stats, momentum, p, freeze (seq of its freeze event | None),
                   for a dropout layer seen in train mode under no_grad: model (the script's
                   name of the outermost model holding it whose parameters no optimizer trains:
                   a frozen teacher or an EMA copy, ``teacher``; None: not looked at, or every
                   model holding it trains), model_unchanged (int|None: across how many
                   updates its parameters were seen unchanged so far, looked at from one of its
                   forwards to a later one, at most ``MODEL_STATIC_AFTER``), model_changed
                   (they changed between two of its forwards: an EMA / momentum teacher)
mode_forward       training, grad, inference, modules [mid], grad_modules [mid] (gradient flows
                   through), calls, recalibrating, nested (a no-grad forward made inside an
                   outermost module call that also ran grad-enabled ones: targets computed in
                   the training forward) — one per call line and mode while no other
                   event happens (loc: the user's call of the outermost module)
freeze             calls (parameters frozen from this line with requires_grad_(False); a step's
                   ``frozen`` entries name it)
bn_reset           modules [mid], calls (reset_running_stats() by the user)
update_bn          (torch.optim.swa_utils.update_bn called; its forwards are ``recalibrating``)
compile            target, fullgraph, backend (a torch.compile call; graddoctor's hooks run at its
                   graph breaks)
dropout_default    fn (dropout | dropout1d | ... | alpha_dropout | torch.dropout | ... |
                   scaled_dot_product_attention | nn.Dropout), p, cls (class of the module whose
                   method made the call), name (that module's path, e.g. ``model.blocks.0``, or
                   None), grad (grad mode on), how: a dropout that runs in training mode, with
                   p > 0, while that module is in eval mode — "default" (F.dropout's
                   ``training`` left at True), "explicit" (a training flag given and true, no
                   sign of Monte Carlo dropout), "sdpa" (SDPA's ``dropout_p`` > 0),
                   "unregistered" (an nn.Dropout in train mode that is no submodule of the
                   eval-mode module calling it: built in forward, or held in a plain list) —
                   the first such call of each call line (loc: that call); mode ("eval" | "train":
                   a "default" call seen while its module trains, told once per call line, for a
                   run that may stop before the script evaluates)
pair_labels        how ("constant": every row's label is one column, "self": most rows' labels
                   point at the row's own similarity with itself, "triplet": the positive given
                   is the negative's rows reordered; "triplet-apart": three separately
                   embedded batches whose anchor is nearer the negative given at two calls;
                   "cat": MoCo's cat([l_pos, l_neg]) labelled off the positive's column), fn (the loss function), rows, columns (the
                   similarity matrix's shape; the batch for a triplet), label (the one label,
                   "constant"; the positive's column, "cat"), share (the rows labelled with themselves, "self"; the rows whose
                   anchor is nearer the negative given than the positive, "triplet",
                   "triplet-apart"; the rows labelled off the positive's column, "cat") — a
                   pairwise-similarity loss whose targets do not point at each row's positive,
                   at one of its first calls, once per call line (loc: the loss call; an aside;
                   instrument/pairlabels.py)
pair_pull          how ("self": a distance's self-pairs pushed apart; "both": on net the same-label
                   pairs pushed apart and the different-label ones pulled together; "push_same":
                   only same-label pairs pushed; "pull_diff": only different-label pairs pulled),
                   fn (what made the pairwise matrix: "cdist", "pairwise_distance",
                   "mm", "matmul", "__matmul__", "cosine_similarity"), distance (a distance; else a
                   similarity), shape (the matrix's sizes), same_pairs (pairs sharing a label),
                   push_same, push_diff, pull_same, pull_diff (the gradient's push and pull per
                   pair of each side, distance orientation), matrix_line (the line that made the
                   matrix), classes (the labels are a ``cross_entropy``'s class targets over the
                   matrix's columns, prototypes or candidates, not a comparison) — a pairwise loss over a batch's compared labels whose gradient moves
                   the pairs the wrong way, at each of the first 3 backwards (at least 2), once
                   per matrix line (loc: the line to change; an aside; instrument/pairpull.py)
self_match         size (N of the (N, N) input), on_diagonal (the share of rows whose maximum is
                   on the diagonal, >= 0.9) — a cross_entropy over a square input whose labels
                   never point at the diagonal (a similarity matrix with each sample's
                   similarity to itself left in), at one of its first calls, once per call line
                   (loc: the loss call; an aside; instrument/loss_inputs.py)
advantage_grad     params [pid] (optimizer-owned parameters the weight reaches and the
                   log-probability does not) — a loss at one of the first 3 backwards after a
                   ``torch.distributions`` log_prob holds a product of a log-probability and a
                   weight that carries gradient (an advantage not detached), once per backward
                   line (loc: the backward; an aside; instrument/policygrad.py)
policy_sign        dist (the log_prob's distribution class, or "log_softmax" for a gather of
                   one along its last axis), critic (the regression that says which side is the
                   return: "mse_loss" | "smooth_l1_loss" | "huber_loss" | "square" | "none": no
                   critic in the loss), weight ("advantage": the log-probability's weight is the
                   critic's R - V | "cost": its negation | "return": no critic, weights never
                   negative and not one value), sign ("minimised" | "maximised": how the loss
                   holds the term) — a policy-gradient term whose weight, oriented by the critic
                   in the same loss (or, without one, by the returns' sign), makes the optimizer
                   lower the probability of the better actions, at the first 3 backwards of a line after log-probabilities,
                   once per backward line (loc: the backward; an aside; instrument/policysign.py)
degree_scaled      form ("sqrt": each entry of the propagation matrix is sqrt(d_i d_j) | "row": d_i |
                   "column": d_j | "both": d_i d_j, d the count of entries of each row), nodes (its
                   rows), degree (the largest d), edges (0 for a matrix; for an edge list, its
                   edges, each weighed by the form, d counted in the edge list) — a square
                   non-negative matrix without gradient that a matrix product of the loss's graph
                   multiplies by, or the weight per edge of a scatter's gathered messages
                   (`index_add_(0, col, h[row] * norm)`), its degree normalisation inverted, at
                   the first 3 backwards of a line, once per backward line (loc: the backward;
                   an aside; instrument/degreenorm.py)
self_scatter       op ("index_add" | "scatter_add" | "scatter_reduce"), edges (the index's length),
                   nodes (its distinct values) — a dim-0 scatter of the loss's graph whose every
                   message row was gathered with the scatter's own index (x[src] scattered back to
                   src: no feature crosses an edge), at the first 3 backwards of a line, once per
                   backward line (loc: the backward; an aside; instrument/selfscatter.py)
edges_across_graphs graphs (the batch vector's distinct values), nodes (its length), edges (the
                   message-passing edges, self-loops left out), across (their share joining two
                   graphs), reached (the graphs their targets lie in) — a batch of graphs whose
                   readout scatters by a sorted batch vector while a message-passing scatter's
                   edges join its graphs (20% or more) or reach under a quarter of them, at the
                   first 3 backwards of a line, once per backward line (loc: the backward; an
                   aside; instrument/selfscatter.py)
softmax_over_edges op ("index_add" | "scatter_add" | "scatter_reduce"), edges (the index's
                   length), targets (its distinct values), fn ("softmax" | "log_softmax") — a
                   dim-0 scatter into two targets or more whose message rows are weighed by a
                   (log-)softmax over dim 0 of one value per edge (below the message, above its
                   gathers): attention normalised over every edge, not each target's, at the
                   first 3 backwards of a line, once per backward line (loc: the backward; an
                   aside; instrument/selfscatter.py)
token_copy         positions (the targets compared), lookups (the embedding lookups below the
                   loss), stepwise (the ids were read one step at a time, a (batch,) lookup per
                   step of a decoder loop, each step's ids a column of the targets) — a
                   nll_loss/cross_entropy whose integer targets are, position for
                   position, the ids an embedding below it read, with a recurrent layer between
                   and no lookup of the targets one position later, at the first 3 backwards of
                   a line, once per backward line (loc: the backward; an aside;
                   instrument/tokencopy.py)
unshuffle_misplaced rows, length (the positions a row's unshuffle permutes), kept (the tokens
                   a gather below kept per row), placed (the share of them put back where they
                   were taken from) — a gather along dim 1 by rows of permutations over a
                   cat along dim 1, whose first part comes from a gather of k < length distinct
                   positions per row, that puts fewer than half of the kept tokens back at
                   their positions (an MAE's ids_restore that is not the inverse of the
                   shuffle), at the first 2 backwards of a line, once per backward line (loc:
                   the backward; an aside; instrument/unshuffle.py)
token_labels_shifted end ("first" | "last": the batch's first position or each row's last
                   real one), rows (the batch's rows), values (distinct labels counted there),
                   classes (the scores' classes), vocab (the embedding's rows) — a
                   nll_loss/cross_entropy over a tagger's scores whose labels are laid out on a
                   right-padded id batch (its padding ignored) but count a varying label at a
                   position that holds one id in every row ([CLS], [SEP]): the labels one position
                   off the tokens, at the first 3 backwards of a line, once per backward line (loc:
                   the backward; an aside; instrument/tokenlabels.py)
gan_same_target    critic, generator (the two modules' classes), critic_params, generator_params
                   [pid] (their parameters, at most 32 each), cosine (of the two gradients),
                   offset (the intercept of a line fitted through them over G's gradient's
                   size; None when D's gradient is one constant), samples (values compared), critic_step ([path, line] of D's call in its own
                   step, or None), critic_fake_as_real (D's own backward gave its output on G's
                   samples the gradients of the real samples' target: D's loss labels G's samples
                   real; None when unknown), same_samples (False: D's and G's steps saw
                   different samples, each step drawing its own noise, and both gradients are
                   one constant of the same sign, a WGAN critic's ± 1/N, or lines in D's output
                   (or its sigmoid) with one target; cosine is then 1.0) —
                   at the first 8 backwards, a module D evaluated on another
                   module G's output both detached (D's step) and with the gradient flowing into
                   G (G's step) got two gradients on its output for the same samples that point
                   the same way: G is trained toward D's target for its samples (loc: G's step's
                   call of D; an aside; instrument/adversarial.py)
ratio_fault        fault ("cancels": an importance ratio of one value over itself, identically 1 |
                   "denominator": the subtracted log-probability, of the same distribution at
                   the same actions, carries gradient into the numerator's parameters |
                   "inverted": only the subtracted log-probability carries gradient, or a
                   constant divided by a probability gathered from a softmax (dist "softmax":
                   an importance weight p_logged / p) |
                   "minimised": a clipped surrogate's min reached with a positive sign, or its
                   max with a negative one), dist (the log_prob's class, "log_softmax" or
                   "softmax" for a gather of one, or None), params
                   [pid] (optimizer-owned parameters behind it), backward (the line of the
                   backward) — at the first 3 backwards of a line after a ``torch.distributions``
                   log_prob, once per fault (loc: the numerator's log_prob call; an aside;
                   instrument/ratios.py)
fresh_sample_scored dist (the class of the distribution), params [pid] (optimizer-owned
                   parameters the log-probability reaches), acted (the line of the earlier
                   sample the script used), sampled (the line of the fresh sample), backward
                   (the line of the backward) — a loss that weights the log_prob of a
                   ``sample()`` drawn after another sample of a distribution with equal
                   parameters, read by nothing but log_prob, and holds no log_prob of that
                   other sample (loc: the log_prob call; an aside, once per line; at most 8
                   windows; instrument/freshsample.py)
batch_reduced_target op (the reduction: "max", "mean", ...), dims ([int] reduced, None: every
                   dim), batch (the batch size reduced), shape ([int] of the reduced tensor), fn
                   (the regression loss, or "hand-written squared error" / "hand-written
                   absolute error"), loss_line (the line of the loss) — a regression loss whose
                   side without gradient holds a reduction over dim 0 of a model's per-sample
                   output broadcast back onto the batch and combined with values not derived
                   from that output (loc: the reduction; an aside, once per line; first 6
                   backwards; instrument/batchtarget.py)
reparam_cut        dist (the class of the distribution sampled; None for a hand-written
                   reparameterisation), params [pid] (optimizer-owned parameters behind its
                   parameters), op (the autograd node where the sample enters the loss's graph
                   as a constant), via ("sample": ``sample()`` | "scale" / "location": a
                   ``torch.randn_like`` noise multiplied by / added to a ``.detach()`` of a
                   tensor with gradient: ``mu + eps * std.detach()``; loc: that op's line),
                   backward (the line of the backward)
                   — a ``sample()`` (with gradients on, of a distribution with ``rsample`` and
                   parameters that need a gradient) that a loss at one of the first 8 windows
                   uses as a constant, while it trains that distribution and holds no
                   score-function term of the sample, once (loc: the ``sample()`` call; an
                   aside; instrument/reparam.py)
loss_no_graph      fn (the loss function: "smooth_l1_loss", "cross_entropy"...), constants (the
                   operands with no graph among the sums of the next backward's loss, its
                   linear top: the constant term, a wrapped 0 that ``sum()`` starts from, a
                   number added), backward (the line of that backward) — a wrapped loss
                   function called with gradients on whose tensor arguments all need no
                   gradient (a prediction ``.detach()``-ed, made under ``torch.no_grad()``, sent
                   through NumPy): its value is a constant; at the first 4 backwards after such
                   calls, once per call line and backward (loc: the loss call; an aside;
                   instrument/constloss.py)
entropy_sign       term ("entropy": a ``torch.distributions`` entropy() minimised in a loss that
                   also holds a score-function log_prob | "log_prob": a distribution's
                   log_prob of its own rsample maximised), dist (its class) — the entropy
                   bonus with the wrong sign, at the first 3 backwards of a line (loc: the
                   call that made the term; an aside; instrument/entropysign.py)
linear_stack       widths ([in, hidden, out] of the two nn.Linear layers), between (the ops between
                   them that only move values: View, Transpose, NativeDropout...), called_by
                   ("user" | "container": who called the second layer), first_at ([path, line,
                   function] of the first layer's construction, or None), listed (the
                   nn.Sequential listing both lists an activation module), activations_in_model
                   (the outermost model holds one), chain (linear layers in a row up to the
                   second), ends_in_loss (the second's output is a loss function's
                   prediction) — one nn.Linear's output
                   read by another with nothing nonlinear between, at the forwards of the first
                   backwards (loc: the second layer's call in the script, or its construction
                   when nn.Sequential calls it; an aside)
dropout_on_output  module (the dropout's class: Dropout | Dropout1d | AlphaDropout ...), p, fn (the
                   loss: cross_entropy | mse_loss | smooth_l1_loss | huber_loss |
                   binary_cross_entropy(_with_logits)), direct (bool|None: the user's code
                   called the dropout module itself, not a container such as nn.Sequential;
                   None: unknown) — at one of the first backwards, the
                   prediction that loss reads is the output of a dropout module run in training
                   mode, once per run (loc: the user's line that ran the dropout; an aside;
                   instrument/dropoutout.py)
output_discarded   module (the class of the module called), leaf (bool: it has no child modules),
                   frames ([[path, line]]: the script's frames from the call outward while they
                   run inside a module's forward, innermost first) — at one of the first
                   backwards, the output of a module call the script made inside another
                   module's forward reached neither that backward's graph nor the next one's,
                   once per line (loc: the call's line; an aside; instrument/discarded.py)
bn_batch           batch (the first size of the input), shape (the input's), layer (the BatchNorm's
                   name), cls (BatchNorm1d | BatchNorm2d | ...), turn (backward calls before the
                   forward) — a BatchNorm layer in train mode, tracking running statistics and
                   not frozen, given an input with a gradient enabled in one of the first
                   backward turns; once per turn and first size (loc: the user's line that ran
                   the model; an aside; instrument/modes.py)
pixels_unscaled    module (Conv2d | Conv3d | Linear: the layer that took them), shape (the
                   batch's), low, high (its smallest and largest value), over (the share of its
                   values above 32) — a batch with no graph, integer-valued in [0, 255] and
                   reaching up past 32, given to a layer at one of the first training forwards:
                   raw 8-bit pixels never scaled, once per run (loc: the user's line that ran
                   the layer; an aside; instrument/pixelscale.py)
pixels_scaled_twice module, shape (as pixels_unscaled), low, high (the batch's smallest and largest
                   value) — a batch with no graph given to one of those layers at one of the
                   first training forwards, every value within +-1/255 and spread over half of
                   that range: an image divided by 255 twice, once per run (loc: the user's line
                   that ran the layer; an aside; instrument/pixelscale.py)
grid_scale         how (pixels: most values past [-1, 1], the largest past 2 | unit: every
                   coordinate spanning [0, 1], none below 0), low, high (the grid's smallest and
                   largest value), outside (the share of its values past +-1.05), coords (2 | 3),
                   size (the sampled input's spatial sizes), padding (padding_mode), mode, grad
                   (whether the grid carries a gradient) — a grid given to F.grid_sample at one
                   of its first 8 calls that is not in normalised coordinates, once per call line
                   (loc: the grid_sample call; an aside; instrument/gridscale.py)
bag_offsets        how (decreasing: a start below the one before | empty: half the bags empty or
                   more while the last holds half the input or more), bags, items (the flat
                   input's length), drops (the starts that go down), empty (bags of no items or
                   fewer), last (the last bag's items) — offsets given to F.embedding_bag at one
                   of its first 8 calls that are no running start positions, once per call line
                   (loc: the call; an aside; instrument/bagoffsets.py)
self_product_offset op (the product's autograd node: ``BmmBackward0``, ``MmBackward0``), shape
                   (the square matrices'), params [pid] (tracked tensors the matrix reaches),
                   line (the backward's line) — the loss's graph at one of the first backwards
                   of a line holds a matrix multiplied by itself, not by its transpose (the
                   same saved tensor both sides, the same strides), compared with a constant
                   (minus a constant: an identity; or a regression loss's input): an
                   orthogonality penalty ||A A^T - I|| written A @ A (loc: the backward; an
                   aside; instrument/lossterms.py)
placeholder_targets fn (mse_loss | l1_loss | smooth_l1_loss | huber_loss | log), shape (the target's),
                   how (rows: rows of 2-8 coordinates, some all 0 | sparse: a map whose zeros
                   stand apart from its positive values | padded: sequences of frames ending
                   in all-zero frames of varying length), share (of the rows or values that
                   are 0; of the frames that are padding), rows (rows or values judged; padded
                   sequences), width (the row's length; 1 for sparse; the frame's size), low,
                   high (the filled values' range; the real lengths') — a regression loss at one of its first
                   8 calls with a gradient, reduced over every element, whose target holds a
                   fill value where there is nothing to regress, once per call line (loc: the
                   loss call; an aside; instrument/placeholders.py); fn log: a sparse map
                   without gradient given to torch.log / Tensor.log at the first backwards (loc:
                   the log call)
normaliser_sign    op (div | reciprocal), sum (the summing node below the denominator), shape,
                   negative, positive (the denominator's shares of each sign), feature (the
                   signed activation below the sum, by its function's name, or None) — a
                   quotient whose denominator, a sum of products of activations, holds both
                   signs (5 % each at least) in the graph of one of the first 3 backwards; once
                   per op and shape (loc: the backward's line; an aside; instrument/normsign.py)
distance_bias      shape (the softmax's), heads (the heads that prefer distant keys), of (the
                   heads in all), ratio (median weight of the farthest kept key over the
                   query's own) — a causal softmax over square scores whose batch-mean weights
                   rise with the distance in the second half of the rows, in the graph of one of
                   the first 3 backwards; once per shape (loc: the backward's line; an aside;
                   instrument/distancebias.py)
channel_pool       op (max | amax | mean | sum | logsumexp), shape (the pooled input's), dims ([1])
                   — a reduction over exactly dim 1 of a convolution's channels-first output
                   (through elementwise ops), read by a linear layer (through views and
                   activations), in the graph of one of the first 3 backwards; once per op and
                   shape (loc: the backward's line; an aside; instrument/channelpool.py)
cells_transposed   shape (the indexed map's), cells (read), inside (of them, positives), positives
                   — a map read by index tensors (batch, row, column) at cells none or few of
                   which a binary cross-entropy target of the same loss marks, all of which it
                   marks once row and column are swapped, in the graph of one of the first 3
                   backwards; once per shape (loc: the backward's line; an aside;
                   instrument/cellswap.py)
ignored_mask       ignore_index, shape (the target's), ignored (its pixels at ignore_index), pixels
                   — a softmax's or sigmoid's output multiplied by a 0/1 mask without graph that
                   is 1 at exactly the pixels a cross-entropy of the same loss ignores, in the
                   graph of one of the first 3 backwards; once per target shape (loc: the
                   backward's line; an aside; instrument/ignoredmask.py)
overlap_scores     shape (the mask's), producer (linear | matmul | convolution | sum | difference |
                   layer norm | batch norm: the layer whose signed output the scores are, through
                   views and indexing) — a division whose numerator multiplies those scores by
                   a 0/1 mask without graph and whose denominator reads the same scores (a soft
                   dice, IoU or Tversky ratio on no probabilities), in the graph of one of the
                   first 3 backwards; once per shape (loc: the backward's line; an aside;
                   instrument/overlapscores.py)
padding_kept       op (mul: a product with the mask | masked_fill: the mask filled), fill (the pad
                   id), rows, shape (the token batch's), kept (the share of its positions the
                   mask keeps) — a 0/1 mask without graph, multiplied into (or filled into) the
                   graph of one of the first 3 backwards, that keeps exactly the padded
                   positions of a token batch embedded just before (the real tokens left out);
                   once per op and shape (loc: the backward's line; an aside;
                   instrument/padmask.py)
padding_pooled     fill (the pad id), rows, shape (the token batch's), padded (the share of its
                   positions that are padding), axis (batch-first | length-first: the pooled
                   tensor's layout) — a mean over the token axis of a tensor holding the padded
                   batch's positions with no 0/1 mask of the batch applied below it, read by a
                   layer on the way to the loss of one of the first 3 backwards; once per shape
                   (loc: the backward's line; an aside; instrument/padmask.py)
easy_weighted      fn (binary_cross_entropy_with_logits | binary_cross_entropy | cross_entropy),
                   shape (the weight's), rho (the weight's mean rank correlation with the loss
                   within the groups of one target value), groups, elements — an unreduced
                   classification loss multiplied by a weight with a graph of its own that falls
                   as the loss rises, in the graph of one of the first 3 backwards; once per fn
                   and shape (loc: the backward's line; an aside; instrument/easyweight.py)
output_range       fn (mse_loss | l1_loss | smooth_l1_loss | huber_loss), activation (sigmoid |
                   tanh | softmax | relu | softplus | exp: what made the prediction), low, high
                   (its range; high None: unbounded), outside (the share of the targets outside
                   it, >= 0.25), target_low, target_high — a regression loss at one of its
                   first 8 calls with a gradient, once per call line (loc: the loss call; an
                   aside; instrument/losses.py)
target_in_inputs   fn (the loss function), column, columns (the model input's width), window
                   (bool: the columns are the steps of a series, each next to the one before):
                   a loss target whose values one column of the data a first layer of the
                   prediction reads holds (first 8 calls with a gradient, CPU) — once per loss
                   call line (loc: the loss call)
full_rows_loss     fn (the loss function), rows (N): a loss with a gradient whose target is the
                   same N-row tensor at a line's first calls and whose prediction has those N
                   rows with no row selection in its graph, its target not an input the
                   prediction's first layers read — once per loss call line (loc: the loss
                   call; an aside; instrument/fullrows.py)
constant_targets   fn (the loss function), value (the one value; None when varied), calls, values
                   (targets' values read), samples (their first dimensions), basis (converted |
                   dataset-one | served | unknown: where the targets came from,
                   instrument/constlabels.py), stage (few | many | varied: a line told before
                   whose targets then differed), ignore_index (None, or the ignore_index of a
                   cross_entropy / nll_loss whose targets held it: then values and samples count
                   the other targets, the ones the loss trains on, and those held one value): a
                   loss call line with a gradient whose targets held one value at every call — at most once per stage and line (loc: the loss
                   call; an aside)
ordinal_shifted    fn (binary_cross_entropy_with_logits | binary_cross_entropy), levels (the
                   target's columns), rows (the targets read): a binary cross-entropy whose 0/1
                   target is a cumulative (ordinal) encoding — every row's ones a prefix of its
                   columns — with its first column 1 in every row read (256 rows, 2 calls or more) while
                   a later column varies: the level `y > 0` written `y >= 0`, one threshold that
                   never separates anything — once (loc: the loss call; an aside)
class_weights      fn (cross_entropy | nll_loss | binary_cross_entropy_with_logits), classes
                   [int], shares [float] (each class's share of the targets counted; for
                   pos_weight, each output's share of positives), weights [float]: a loss's
                   per-class weights that grow with the classes' frequency (cross_entropy: the
                   most frequent class and the rarest; pos_weight: outputs with rare positives
                   weighed below 1); by_hand (bool): the weights are a per-class table looked
                   up by each sample's label and multiplied into an unreduced cross_entropy by
                   the script (``w[y] * ce``; loc: the backward; instrument/handweights.py),
                   once — once per function (loc: the loss call)
weighted_class_absent fn (cross_entropy | nll_loss), cls (the class singled out), weight (its
                   weight), others (the one weight every other class has), targets (counted over
                   the first calls), top, top_share (the most frequent target class and its
                   share) — a loss's class weights that put one class below all the others (a
                   no-object or background class's down-weighting) while none of the targets
                   counted is that class; once per function (loc: the loss call;
                   instrument/loss_inputs.py)
uniform_weight     fn (cross_entropy | nll_loss | binary_cross_entropy_with_logits |
                   binary_cross_entropy), value (float: every entry of the weight), numel (int:
                   the weight's entries), classes (int: the loss's classes or outputs), positives
                   (float | None: for a binary loss, the share of its targets above 0.5),
                   pos_weight (bool: a binary loss was also given pos_weight): a loss's `weight`
                   whose entries are all one value other than 1 at each of its first calls (a
                   scalar `weight=` meant as pos_weight, class weights that came out equal): it
                   only rescales the loss — once per function (loc: the loss call; an aside)
loss_broadcast     fn (mse_loss | l1_loss | smooth_l1_loss | huber_loss | "the hand-written
                   squared error" | "the hand-written absolute error": seen in the loss's
                   graph at a backward, loc: that backward's line), input_shape,
                   target_shape, shape (their broadcast), reduction, grad (a gradient flows into
                   input or target): a regression loss whose broadcast has more elements than
                   input and target — the first such call of each call line (loc: the user's
                   loss line); or, with narrowed_from (the shape of the tensor the target is a
                   view of), a target that expands against the input along dims that tensor
                   has the input's sizes on (y[:, :1] of a y shaped like the prediction)
factor_broadcast   op (mul | div), term_shape (the side with the gradient), factor_shape,
                   shape (their broadcast), factor_grad (the factor carries gradient too): a
                   product or quotient in the loss's pointwise top between per-sample
                   tensors of two layouts ((N, 1) and (N,)) that broadcast to (N, N) — the
                   first at each backward line (loc: that backward; an aside;
                   instrument/factorcast.py)
loss_input         fn (cross_entropy | nll_loss | binary_cross_entropy_with_logits | kl_div | ctc_loss),
                   problem ("softmax" | "sigmoid" | "relu": its input came out of that op;
                   "probabilities": cross_entropy's rows lie in [0, 1] and sum to 1; "logits":
                   nll_loss's rows are not log-normalised and no log op precedes them; "dim":
                   a log_softmax normalised a dimension of another size than the classes;
                   "swapped": the input needs no gradient and the target of the same shape does:
                   ``criterion(labels, outputs)``; "rows": cross_entropy's or nll_loss's
                   (N, C) input was reshaped from a tensor whose dimensions its rows of C
                   consecutive values cut across: a (B, C, T) output viewed as (-1, C); "order":
                   the (N, C) input was reshaped from (S0, S1, C) and the flat targets are the
                   (S0, S1) embedded tokens laid out as (S1, S0): seq-first scores against
                   batch-first targets or the reverse),
                   classes (size of the class dimension), normalised (the size of the dimension
                   the log_softmax normalised, for "dim"; else None), source (the shape
                   reshaped from, only for "rows" and "order"): a classification loss a
                   gradient flows through given the wrong kind of score — the first
                   such call of each call line (loc: the user's loss line)
target_domain      fn (a loss of instrument/lossdomain.py's DOMAINS), problem ("outside-unit":
                   a binary cross-entropy's or multilabel_soft_margin_loss's targets leave
                   [0, 1]; "zero-one": a margin loss's (+1/-1) targets hold zeros and nothing
                   below 0; "multi-label": cross_entropy's float targets have rows with two
                   values above 0.5, or multilabel_margin_loss's integer targets are 0/1 rows;
                   "negative": cross_entropy's probability targets or poisson_nll_loss's counts
                   go below 0; "log-target" / "prob-target": kl_div's target is negative with
                   log_target=False / positive with log_target=True), low, high (the targets'
                   smallest and largest value), share (the share of target values, or of
                   cross_entropy's rows, outside the domain, where measured; else None),
                   integral (every target a whole number, for "outside-unit" and "zero-one";
                   else None), classes (cross_entropy's and ctc_loss's class count, else
                   None), blank (ctc_loss's blank index, else None), detail ("padding":
                   ctc_loss's blank labels are padding its target_lengths count; "negative":
                   its labels out of range go below 0; else None);
                   for ctc_loss problem is "blank" / "out-of-range" (a label within
                   target_lengths equal to the blank / outside the classes) or "unalignable"
                   (with zero_infinity, sequences too long for their input_lengths): one of the
                   first 8 calls of a loss a gradient flows through, whose target lies outside
                   the domain the loss reads it in, once per call line (loc: the loss call; an
                   aside; instrument/lossdomain.py)
idle_forward       mid, cls, params [pid] (the module's own parameters that got no gradient so
                   far), grad (grad mode on), inference (inference mode on), training (the
                   module's .training): a forward of a module that owns optimizer parameters
                   without a gradient at every step so far (2 at least), checkpoint (None, or
                   who called the reentrant torch.utils.checkpoint it ran in under no_grad:
                   "user" | "transformers" | "library"), library (the code that called the
                   module is a library's, not the user's: a BertModel's pooler), outer
                   [[path, line]] (the user's frames that called the one at loc, innermost
                   first, 4 at most: where a `with torch.no_grad()` may sit, or a `.data` that
                   cuts the output of the module that called this one) — watched
                   only from then on, the first call of each call line and mode (loc: the user's
                   line that called it, or that called the checkpoint)
idle_loss          mid, cls, params [pid] (as idle_forward's), fn (the loss function:
                   "mse_loss", "cross_entropy"...): a loss whose input carries the output of a
                   forward with gradients on of a module watched for idle_forward — a loss
                   computed from that module that no backward ever reached, since the module's
                   parameters got no gradient — the first call of each module and call line
                   (loc: the user's loss line)
idle_detach        mid, cls, params [pid] (as idle_forward's): a ``.detach()`` of a tensor whose
                   graph carries the output of a forward with gradients on of a module watched for
                   idle_forward (its parameters never got a gradient) — where that output is cut
                   from the loss, once per module and line (loc: the user's detach line)
optimizer_attr     opt, cls (the optimizer's class), name (the attribute the user's code set:
                   ``optimizer.lr = ...``), key (the ``param_groups`` key it stands for: "lr"
                   for ``learning_rate``), value (float|None: the value set, None when not a
                   plain number), kept [float|None] (each param group's value of that key at
                   that moment, what the optimizer steps with), scheduler (str|None: the class
                   of the torch LR scheduler the attribute was set on, ``scheduler.lr = ...``,
                   whose optimizer ``opt`` is; None: set on the optimizer): a torch.optim
                   optimizer's hyper-parameter set as an attribute, which torch's step never
                   reads — the first of each call line, object and name (loc: the assignment)
functional_grad    api (``torch.autograd.grad``, ``torch.autograd.functional.*`` or ``torch.func.*``
                   as the user called it), create_graph (bool for ``torch.autograd.grad``, else
                   None), of_data (True, present only when the outputs' graph reaches no
                   leaf requiring grad but the call's inputs: a gradient of data alone, such
                   as force labels from a reference potential): a gradient graddoctor does
                   not follow (it is returned, not accumulated in ``.grad``) — the first call
                   of each call line (loc: that call)
folded             turns, steps, backwards, events, epochs (how many of each the recorder folded
                   out here; epochs: ``epoch_start`` events), copies [[first, last, count]]: each folded turn repeated exactly (but
                   for the values listed in instrument/fold.py) the kept turn whose events have
                   seqs first..last, count times. Only in long runs (see ``FOLD_AFTER``); the
                   analysis counts the folded steps, backwards and copies (``Analysis.weight``)
ddp_no_sync        ddp (a DistributedDataParallel model's id): ``with model.no_sync():`` entered
                   (loc: that line)
ddp_init           ddp (its id, as ``ddp_no_sync``'s), params [pid] (the wrapped module's
                   parameters, tracked from here), world (the process group's size, None when
                   not read) — a DistributedDataParallel built (loc: the user's line that built
                   it; instrument/ddp.py)
sampler_iter       sampler, epoch (its ``epoch`` attribute: what set_epoch last set), shuffle,
                   set_at ([path, line] of the user's latest ``set_epoch`` call on it; absent when
                   none) — a DistributedSampler starting an epoch (loc: the user's loop over its
                   DataLoader)
replica_checksum   opt, step (the run's step count after this step), value (float: a checksum of
                   the parameters it owns, a ``Deferred`` while the run goes on), params (how
                   many) — after an optimizer's first steps in a multi-rank process group;
                   without DistributedDataParallel also layout (int: a hash of the shapes of
                   the parameters it was built over) and initial (float: their checksum as
                   built, ``Deferred`` while the run goes on); bypassed (True, only when so: a
                   DistributedDataParallel was built over them but its forward never ran)
grad_allreduce     opt (the optimizer whose step applied them), op ("sum" | "avg" | "max" | ...: the
                   ReduceOp's name, lower case), world (the group's size), params (how many
                   gradients), via ("grad": the all-reduce was given each ``.grad``, a view of
                   all of it or its ``.data`` | "flat": a buffer whose values the step's
                   gradients hold as a whole, a ``torch.cat`` copied back), scale (float|None: the
                   gradients the step applies over what the all-reduce produced: 1.0 when nothing
                   divided them afterwards, 1 / world when the script averaged them; None when
                   they disagree), before (bool: the gradients were changed in place between the
                   backward and the all-reduce, e.g. divided first; a buffer's values were not
                   the gradients') — a ``torch.distributed.all_reduce`` (or
                   ``all_reduce_coalesced``) the script called on gradients (a
                   DistributedDataParallel's too: it averaged them already), judged at the step
                   that applies them, one per all-reduce line, for the first
                   ``ddp.ALLREDUCE_UPDATES`` such updates (loc: the all-reduce call)
batch_fingerprint  loader, epoch, index (the batch, as ``backward``'s ``batch``), value (float: a
                   position-weighted sum of up to 65,536 evenly spaced elements of the batch's
                   first tensor, a ``Deferred`` while the run goes on), sampler (str|None: the
                   class of the loader's sampler, of its batch sampler when it has one of its
                   own; None for an IterableDataset), replicas ([num_replicas, rank] of a
                   sampler that has both, a DistributedSampler; else None) — the first
                   ``dataloader.PRINT_BATCHES`` batches that feed a backward, in a process
                   group (loc: the DataLoader's construction when graddoctor saw it, else the
                   loop's ``iter()``); rank 0 compares them across ranks (ranks-same-batches)
grad_flow          opt, columns [[step, [pid], [norm], [lr]]] (one per optimizer update kept whole:
                   the step number, the L2 norm of each gradient it applied, nan when not finite,
                   the lr of each param group, None when not a plain number), bands [[first,
                   last, count, [pid], [min], [median], [max], [lr]]] (the updates of a long run's
                   middle, folded into bands of steps: per gradient the min, median and max of its
                   norm, the lrs of its last update; a merged band's median is the mean of its
                   parts' medians) — only when a
                   picture is asked for (instrument/gradflow.py), once per optimizer at the end
                   of the run
module_attr        mid, cls, name ("requires_grad", a misspelling of it, ``requires_grad_``,
                   "trainable": registration.FREEZE_FLAGS; "train" | "eval"), value, params
                   [pid] (its parameters when set; [] for train/eval), layers ([mid]: for
                   train/eval, the BatchNorm and dropout layers under it, as ``train``/``eval``
                   and ``mode_forward`` number them; else None): an attribute of that name set
                   on an ``nn.Module`` object by the user's code (loc: the assignment; once per
                   line and module) — it freezes nothing, or it hides the module's train() /
                   eval() method (a value that is not callable) and switches no mode
param_attr         pid, cls ("Parameter" | "Tensor"), name (``requires_grad_``, a misspelling
                   of ``requires_grad``, "trainable": registration.FREEZE_FLAGS), value,
                   requires_grad (the tensor's own flag at that moment): such an attribute set
                   on a leaf tensor by the user's code, where torch reads only
                   ``requires_grad`` (loc: the assignment; once per line and tensor, at most
                   ``registration.PARAM_ATTR_EVENTS`` per line)
unregistered       owner (class of the module holding it), attr, holder ("list" | "tuple" |
                   "dict" | "tensor"), name (the path shown: ``model.blocks``), pids [pid] —
                   tracked tensors no module registers, found at the end of the run in a plain
                   container (or as a plain tensor) attribute of a module (loc: the attribute's
                   assignment in the class, when found)
param_reset        via ("torch.nn.init.<initialiser>" | "load_state_dict"), params [pid] (optimizer-
                   owned parameters it set back, after the first optimizer step), state (for
                   load_state_dict: [the state's number, 0, 1, ... in order of first load: the
                   same number for the very same tensors, [each value's version]]: the same
                   unchanged state when equal; else None), values (for the first loads
                   (``resets.FINGERPRINTS``): a float fingerprint of the state's values, a
                   strided sample of its first floating tensors, which tells a state edited
                   through ``.data`` (no version change) from an unchanged one; else None),
                   kept (for load_state_dict: whether the module's ``state_dict()``, or a
                   holder's, was called since its previous load: what it learnt was saved;
                   else None): an aside at the user's call
reseed             fn (torch.manual_seed | torch.random.manual_seed | torch.cuda.manual_seed[_all] |
                   random.seed | numpy.random.seed), seed (int|None: the value given, None when not
                   a plain int), caller ([path, line, function] of the line that called the user's
                   helper holding the call, as for ``clear``; None at module level): the global
                   RNG set to a seed (loc: the call; an aside)
hook_stacked       api (register_hook | register_forward_hook | register_forward_pre_hook |
                   register_full_backward_hook | register_full_backward_pre_hook), target (tensor |
                   module), pid (int|None: the tensor's, or a parameter of the module's), shape
                   (the tensor's, else None), cls (the module's class, else None), copies (hooks
                   registered at this line on this object and not removed, this one included),
                   updates (how many distinct update counts they were registered at), caller
                   ([path, line, function] of the line that called the user's helper holding the
                   call, as for ``clear``): a hook registered again at one line on an object
                   still holding the earlier copies, whose copy then changed the value the
                   earlier copies had already transformed (loc: the registration; an aside, once
                   per line)
loader_sampler     loader, sampler (its class), shuffle (bool|None: draws in a random order),
                   dataset_len (int|None), reach (int|None: how many distinct dataset indices the
                   sampler can ever draw, None when not knowable), weights (int|None: the length
                   of a WeightedRandomSampler's weights) — once per DataLoader, at its first
                   ``iter()`` (loc: the sampler's construction when graddoctor saw it, else that
                   ``iter()``; an aside)
batch_labels       loader, index (the batch's index in the loader's first epoch), size (labels in
                   it), distinct (how many different ones), value (int|None: the label when there
                   is one), classes (int|None: how many the dataset holds, where it says so without
                   loading a sample) — the first ``LABEL_BATCHES`` batches of a DataLoader that
                   never shuffles (a SequentialSampler), with 1-D integer CPU labels (loc: the
                   DataLoader's construction, else its first ``iter()``; an aside)
batch_spread       loader, index, size, slot ("input" | "target": the batch's first or last item),
                   mean, var, low, high (floats: of that item's values in the batch) — the same batches as
                   batch_labels, for items that hold one float per sample (a regression target,
                   a scalar input) (loc: as batch_labels; an aside)
loaders_zipped     inputs, labels (loader numbers), length (both datasets'): two DataLoaders that
                   each shuffle in an order of their own (a RandomSampler with no generator)
                   over datasets of one length, read in lockstep for one backward, one serving
                   bare integer labels — once per run (loc: the labels loader's construction,
                   else its first ``iter()``; an aside)
state_carried      cls (the recurrent module's class: LSTM | GRU | RNN | LSTMCell | GRUCell |
                   RNNCell, or the script's subclass of one), loader (its number), sampler (the
                   class that draws its samples), batch ([epoch, index] of the batch this forward
                   is given), previous ([epoch, index] of the batch of the module's previous
                   forward), rows (the state's batch dimension), shared ("storage": the state
                   given is a view of the one returned | "values": a copy of it), call ([path,
                   line, function] of the module's call, or None) — a training forward of a
                   recurrent module whose initial state is the state it returned at its previous
                   forward, on another batch of a DataLoader that draws its samples at random;
                   once per line, in the first turns (loc: the outermost user line that holds
                   the state given, else the module's call; an aside; instrument/statecarry.py)
dataset_drift      cls (the dataset's class), attr (the attribute holding the stored array, e.g.
                   "data" or "tensors[0]"), numpy (bool: a NumPy array, not a tensor), rows (stored rows found
                   changed by a fetch of their own index that had been fetched before),
                   fetches (fetches of the dataset looked at) — a DataLoader's fetch that wrote
                   into rows of an array the dataset holds, at an index it had already served:
                   the stored data changes again at every read, once per dataset and array (loc:
                   the dataset's ``__getitem__``; an aside; instrument/datasetreads.py)
augment_misaligned cls (the dataset's class), image, mask (the two fields of a sample: an index or
                   a key), op (the name of the op one of them went through and the other did
                   not, or went through another way), moved ("image" or "mask": which one),
                   shape (their last two axes) — a sample whose image and mask (the same last
                   two axes) have pixels from different places after the dataset's
                   augmentation; once per dataset (loc: the line of that op; an aside;
                   instrument/augalign.py). With cls "" the training loop's: a batch the
                   model reads flipped along other image axes than another tensor of its
                   last two axes in the same turn; image and mask are then {"line", "axes"
                   (flipped, counted from the end)} of the two flips (loc: the target's flip;
                   instrument/flipalign.py)
target_remapped    fn (the loss function), shape (the target's), how ("void": an out-of-range
                   served label made a class the others keep; "shifted": labels covering the
                   classes moved by a constant onto ignore_index; "rescaled": a float target
                   served standardised or in [0, 1] scaled down again), and by how: raw, new,
                   classes, ignore_index, count, values, labels, shift / scale, offset, served,
                   mean, std, target_mean, target_std — a loss target made element by element
                   from a served batch's tensor so that it no longer means the dataset's labels
                   (loc: the loss call; an aside; instrument/targetmap.py)
label_map_averaged cls (the dataset's class), field (the sample's field: an index or a key), op
                   ("interpolate"), mode (its mode: bilinear, bicubic, area...), levels (the
                   values of the label map it was given), new (the ids at the made-up pixels),
                   share (of the field's pixels made up: their id is none of the ids of the
                   map's pixels they were averaged from), shape (its last two axes) —
                   a dataset's label map resized by an averaging interpolation and made integer
                   again: class ids made up at the boundaries; once per dataset (loc: the
                   resize; an aside; instrument/augalign.py)
collate_reordered  collate (the collate function's name), moved (the batch field whose rows are
                   in another order of the samples), kept (a field in the order it is compared
                   with), rows (the batch's samples), displaced (rows of ``kept`` that are not
                   the sample of ``moved``'s row) — a script's collate_fn that returns one
                   field's rows reordered (sorted, permuted) and another's not: their rows no
                   longer pair; once per collate function (loc: the collate's line that
                   reorders, or its first line; an aside; instrument/augalign.py)
label_offset       cls, inputs (attribute of the array a field of the sample equals at its own
                   index), labels (attribute of the array another field equals at index + offset),
                   offset (int, not 0), samples (how many were compared), field (the label's
                   place in the batch: an index or a key) — a dataset whose samples pair each
                   row's input with another row's label, in a table whose rows have no order
                   (row i + offset is no nearer row i than another row is); sliced ([rows,
                   input start, label start] when the two are row slices of two tables of as
                   many rows at different starts, `TensorDataset(x[:n], y[k:k + n])`, else
                   None); once per dataset (loc: the dataset's ``__getitem__``, or where a
                   sliced one was made; an aside; instrument/datasetreads.py)
loader_rows        loader, base (the number of the dataset its samples come from, through
                   ``Subset``s and a ``SubsetRandomSampler``), rows (how many of its rows the
                   loader can serve), shared ([[loader, rows]]: earlier loaders over the same
                   base and how many rows they share with this one), made ([path, line] of the
                   DataLoader's construction, or None), copied ([[loader, rows]]: earlier
                   loaders over another dataset whose input rows hold the same values as this
                   one's: copies of the same samples) — once per DataLoader, at its first
                   ``iter()``, when it serves part of its base or shares rows with an earlier
                   loader that serves part of it (two loaders over a whole dataset share none:
                   no split was made), or has copied rows (loc: the line that made its subset: the ``Subset``,
                   ``random_split`` or sampler, else the loader; an aside;
                   instrument/dataloader.py)
batch_pairing      problem ("other-batch": the loss's target is a tensor of a batch served in an
                   earlier turn than the model's inputs | "permuted": the model's inputs are the
                   rows of one batch in another order, the target in the loader's |
                   "labels-permuted": the inputs in the loader's order, the target one of the
                   batch's tensors with its rows in another order), fn (the loss
                   node's function), loader, input_batch ([epoch, index] of the inputs' batch),
                   target_loader, target_batch ([epoch, index] of the target's), field (the
                   target's place in its batch: "[1]", "['label']"), rows, model_line (set when
                   loc is the loss module's call given the target: the model's call's line) —
                   once per problem, in the first turns (loc: the model's call, or the loss
                   module's call that names the target; an aside)
attention_mask     api (nn.MultiheadAttention | F.scaled_dot_product_attention), argument
                   (key_padding_mask | attn_mask), problem ("inverted": the keys the mask leaves
                   out are exactly the tokens that are not the batch's fill id; "additive01": a
                   float mask of only 0 and 1, or 0 and -1, which attention adds to its scores),
                   convention ("True leaves out" | "True attends" | "added" | "none"), and for
                   "inverted" fill (the padding id), rows, removed (share of keys left out),
                   dtype; for "additive01" values; "missing": no mask at all and not causal over
                   keys of a padded token batch's shape, with fill, rows, padded_rows, padded
                   (share of the positions that are padding) — at one of the first masked calls, once per call line
                   and problem (loc: the attention call; an aside; instrument/attnmask.py)
zero_weight        terms (how many terms of a sum in the loss are multiplied by a Python number
                   that is exactly 0; 0: none any more), names (the variables bound to 0 in the
                   user's innermost frames at every backward of the line so far) — at a backward
                   line's first backward whose loss holds such a term, and again each time that
                   changes (loc: the backward; an aside; instrument/lossterms.py)
smoothing_high     label_smoothing (the cross_entropy argument, >= 0.5), classes — a cross_entropy
                   that smooths its targets this much, once per call line (loc: the loss call;
                   an aside; instrument/loss_inputs.py)
label_smoothing    label_smoothing (the cross_entropy argument, > 0), classes, floor (the value
                   every class but one or two holds in each target row), target_smoothing (floor
                   x classes: the smoothing the targets carry already) — cross_entropy given
                   class-probability targets smoothed already, at one of its first calls, once
                   per call line (loc: the loss call; an aside; instrument/loss_inputs.py)
mixup_unmixed      fn (the loss whose target it is), loader, batch ([epoch, index]), field (the
                   target's name in the batch), rows, lam (the mix weight of each row's own
                   sample) — the model's inputs are a mixup of that batch's rows (lam * x +
                   (1 - lam) * x[perm]) and the loss's only target is the batch's labels in the
                   loader's order, in the first turns, once per run (loc: the model's call; an
                   aside; instrument/batchpairs.py)
last_step_padded  module (the recurrent layer's class), rows, length (its input's), padded (rows whose
                   last step is padding: all zeros, or an embedding's filler id), packed (the
                   layer ran on a PackedSequence and the position read is of
                   pad_packed_sequence's output: length is that output's, padded the rows shorter
                   than it, whose row there is the padding value), time_dim (the axis of time of the tensor
                   read: 1, or 0 for a seq-first packed output) — the loss reads position
                   length - 1 of that layer's output (``out[:, -1]``; ``out[-1]`` seq-first when
                   packed), once per run, in the first turns (loc: the layer's call; an aside)
causal_read_early  module (the causal module's class: RNN | LSTM | GRU | TransformerEncoder...,
                   or "torch.stack": the stacked states of a recurrence unrolled by hand),
                   positions (the time positions of its output the loss reads, at most 8), read
                   (how many), length (T), unread (positions, holding data, that no read output
                   has seen), rows, seq_first, direction (only for a bidirectional RNN read at one
                   end: "forward" | "backward", the direction whose read has not seen the
                   unread positions, both together having seen them all) — at one of the first
                   backwards, the gradient on a causal module's output is nonzero only at those
                   positions, the same in every row, so the later positions never reach the
                   loss; once per run (loc: the module's call; an aside; instrument/causalread.py)
custom_backward    cls (a torch.autograd.Function subclass defined in the user's code), input
                   (index of the forward argument whose gradient disagrees), ratio (float|None:
                   the backward's gradient over the numerical one along random directions, when
                   they are proportional), forward ([path, line] of the apply call checked): its
                   backward checked once against finite differences of its forward in float64
                   and found wrong (loc: the backward's ``def``; an aside). With identity set:
                   its forward returned that input unchanged and its backward, read at a real
                   call, passed the gradient through times ratio > 0; names (the words the
                   script calls it by: class, docstring's first line, the apply call's function
                   and line). With ignores_grad set: the backward returned the same gradient for
                   two different incoming gradients (checked whatever the forward). With
                   given_to set: the backward returned None for input (a floating tensor that
                   needed a gradient at the call) and a nonzero gradient for input given_to, a
                   tensor that needed none: its returned tuple is out of order with forward's
                   arguments (checked whatever the forward). With identity and input_cut
                   set: the Function returned that input unchanged at two calls with grad on,
                   none of its inputs needing a gradient (its backward never runs); loc: the
                   user's line above the apply that cuts the graph (``.detach()``, ``.data``),
                   else the apply call. With surrogate set ({step, peak: the input where the
                   forward steps and where the backward is largest, at_step, largest, finite,
                   wrong_sign}): a one-step elementwise forward (a spike, a sign) whose backward,
                   read along a line through the input's range, is no bump at the step
loss_padding       fn (cross_entropy | nll_loss), pad (the padding index), fraction (of the
                   target positions equal to it), ignore_index, reduction, source ("padding_idx":
                   an nn.Embedding's; "fill": the id filling the token batches' shorter rows;
                   "targets": the id filling the targets' own shorter rows): a classification loss whose integer targets are mostly the
                   padding index of an embedding the script uses, which the loss does not ignore
                   — the first such call of each call line (loc: the loss line; an aside)
prompt_trained     fn (cross_entropy | nll_loss), ignore_index, rows (of the token batch the
                   targets were read against), inverted_rows (rows whose ignored positions are one
                   run at the row's end holding real tokens, with counted positions before it),
                   offset (label j is the token at j + offset), kept (counted positions per such
                   row, mean), ignored_real (real tokens in its ignored end run, mean): a token
                   loss whose prompt mask is inverted, training the prompts and ignoring the
                   responses — the first such call of each loss line (loc: the loss line; an aside)
masked_visible     how (product | where | masked_fill | index | ignore_index | labels: how the loss
                   is restricted), counted (share of the positions it counts), visible (share of
                   those whose model input holds the target's values: the token, or the values read
                   by a first layer that gets a gradient there), hidden (share of the other positions
                   the model hides: other values, no gradient, or for tokens another id; for
                   mask_id, the share of the counted labels that are the mask id), by
                   (gradient | values | channel | tokens | mask_id: what shows the hiding), positions,
                   features (values per position), normalised (the input matched the target only
                   after an affine map or each position's standardisation), input_at ([path, line]
                   of the script's call that gave the model the input with the mask as a channel),
                   ignore_index (tokens: the loss's), mask_id (the id written into the labels where
                   the input keeps its tokens): a masked reconstruction loss that counts the
                   positions the model sees and leaves out those it hides, or labels given the mask
                   id the input never holds — the first one of each backward line at the first 4
                   backwards (loc: the backward, or for tokens the loss call; an aside;
                   instrument/maskvisible.py, promptmask.py, tokencopy.py)
real_index         argument (ignore_index | padding_idx), value (the index set apart), api
                   (nn.CrossEntropyLoss | nn.NLLLoss | F.cross_entropy | F.nll_loss |
                   nn.Embedding | F.embedding), size (the loss's classes or the embedding's
                   rows), layout ("classes": one label per sample | "rows": label rows it does
                   not pad | "padded rows": rows it pads and occurs inside of too | "tokens": an
                   embedded token batch | "categories": one embedded id per sample), share (of the positions counted that hold it), and
                   as the layout has them median (the median other class's share), classes
                   (present), seen (labels counted), inside, content (occurrences out of the
                   runs at the rows' ends, and those positions): the value a loss ignores or an
                   embedding pads with occurs in the data as a real class or token — once per
                   site (loc: the module's construction, else the call; an aside;
                   instrument/realindex.py)
low_precision      opt, cls, dtype (the parameters' dtype), what ("eps": the optimizer's eps
                   rounds to 0 in that dtype | "frozen": its first updates changed almost no
                   element whose gradient was non-zero), eps (float|None), lr (float|None),
                   unchanged (float|None: the fraction of such elements that kept their value),
                   params (int: how many tensors of that dtype) — once per optimizer and what
                   (loc: the optimizer's construction; an aside)
graph_kept         name (the variable that keeps them, as found in the script's frame: ``total``,
                   ``history``, ``tracker.sums``), holder ("tensor" | "list" | "dict" |
                   "attribute"), steps (how many earlier backwards' graphs it holds), line (the
                   backward's line) — autograd graphs of earlier backwards still alive several
                   backwards later (loc: the backward that found them; an aside)
target_grad        fn (mse_loss | l1_loss | smooth_l1_loss | huber_loss | kl_div |
                   binary_cross_entropy | binary_cross_entropy_with_logits | cross_entropy |
                   "hand-written cross-entropy" | "hand-written squared error" |
                   "hand-written cosine similarity": read from the loss's graph at a backward),
                   params [pid] (tracked tensors both the input's and the target's graph reach),
                   input_op, target_op (the autograd nodes that made each side, past reshapes):
                   a loss whose target needs a gradient that flows into the parameters making
                   its input, neither side made from the other and no symmetric consistency —
                   the first such call of each call line (loc: the loss call, or for a
                   hand-written one the backward; an aside; instrument/stopgrad.py)
constraint_broken  opt, params [pid], kinds (of the writes: "clamp", "zero", "norm"), bounds (per
                   parameter: [lower, upper] of a clamp, [None, bound] of a row norm, None for a
                   mask), written (entries the writes changed), broken (entries or rows outside
                   the constraint at the next forward), times (writes undone per parameter, the
                   least), backward ([path, line] of the backward before the write, or None) —
                   parameters written in place between a backward and the optimizer's step into
                   a clamp, a 0/1 mask or a row-norm bound that the step then broke, still broken
                   at the next forward (loc: the step; an aside; instrument/constraints.py)
self_copy          params [pid] (the optimizer-owned parameter written), how (copy_ | set_ |
                   .data =), steps (optimizer steps before the write): the script's code wrote a
                   stepped parameter's memory onto itself (the source is the same object, or the
                   same address, shape, strides and dtype): a weight copy taken without clone()
                   written back (Lookahead's slow weights, SAM's saved weights) — in the first 12
                   optimizer steps, once per parameter and line (16 a line, 8 lines)
                   (loc: the write; an aside; instrument/selfcopy.py)
weights_edited     params [pid] (optimizer-owned parameters whose sampled values changed), sampled
                   (how many were compared), before ([path, line] of the previous backward, or
                   None): at least half of the sampled optimizer-owned CPU parameters changed in
                   place between the previous backward and this one, with no optimizer step in
                   between (SAM's ascent to w + e) — at the first 16 backwards, 4 at most
                   (loc: the backward about to run; an aside; instrument/weightedits.py)
weights_edit_kept  params [pid] (the edited parameters still at their edited values), sampled
                   (how many of the edited ones were compared), edited_at ([path, line] of the
                   backward that saw the edit): an optimizer step begins while at least half of
                   the parameters a weights_edited named hold the values of that backward, not
                   those of the update's first backward (SAM's w + e never undone before the base
                   step) (loc: the step; an aside; instrument/weightedits.py)
anchor_alias       params [pid] (the parameters pulled towards themselves), how ("same": ``p - p``
                   in the loss's graph; "shared": the squared, absolute or norm difference of a
                   parameter and a constant exactly zero at two backwards with a step between
                   them that moved the parameter, never non-zero): a penalty's anchor that is the live parameters (an EWC, L2-SP
                   or FedProx anchor stored without a copy) — at the first 4 backwards of each
                   backward line, once
                   (loc: the backward; an aside; instrument/anchors.py)
grad_graph_unused  backward ([path, line] of the last backward before the step, or None), steps (the
                   optimizer steps at which the call line's gradients went unused): gradients
                   returned by torch.autograd.grad with a graph (create_graph=True) that no later
                   backward or autograd.grad differentiated before the optimizer step, at every
                   step its line was seen in the first 6 steps and at least twice — once per call
                   line (loc: the autograd.grad call; an aside; instrument/gradgraph.py)
softmax_axis       dim (the dimension a softmax normalised), summed (the one the matrix product after
                   it sums the softmax's output over, mapped back to the softmax's dimensions),
                   shape (the softmax's output shape), params [pid] (tracked tensors below the
                   softmax), op ("softmax" or "normalize": a division by an L2 norm), cosine
                   (both operands of the product normalised: cosine similarities), param (the
                   parameter normalised, or None): attention weights normalised over another
                   axis than the one the next matmul sums over, or vectors normalised over
                   another axis than a similarity product sums — at the first 3 backwards, once
                   per (dim, summed, shape) (loc: the backward; an aside; instrument/attnaxis.py)
attention_scale    how ("multiplied": the scores scaled by sqrt(d); "other_dim": by 1/sqrt(n) of
                   another size n of the scores), n, d (the size Q@K^T contracts), factor (the
                   constant factor between the product and the softmax, Q's and K's included),
                   shape (the scores' shape), params [pid] (tracked tensors below the softmax):
                   attention scores scaled the wrong way before a softmax over their last axis —
                   at the first 3 backwards, once per (how, n, d, shape)
                   (loc: the backward; an aside; instrument/attnaxis.py)
masked_fill_weight share (the mean weight a softmax over the last axis gives the positions a
                   masked_fill just below it filled, over the rows holding masked and unmasked
                   positions both), masked (the mean share of those rows' positions that are
                   masked), rows (how many such rows), shape (the softmax's output shape), params
                   [pid] (tracked tensors below the softmax): the fill value masks nothing (0, a
                   typo'd 1e-9) or gives the masked positions the weight (+1e9) — at the first 3
                   backwards, once per shape; with after (True, only when set) the masked_fill
                   is just above the softmax or log_softmax instead, taking padding positions
                   (each row's at one end, rows of different lengths) out of its result without
                   a renormalisation, and share is the weight the normaliser gave them; with
                   multiplied (True, only when set) the scores were multiplied by a 0/1 tensor
                   without gradient instead of filled (loc: the backward; an aside;
                   instrument/attnaxis.py)
stream_interleaved shape (the token batch's shape), axis (its time axis: the one along which the
                   loss's targets are the ids one step later), stride (how many tokens of the 1-D
                   stream the batch is a view of one step along that axis skips), stream (the
                   stream's length), params [pid] (the embedding's weight): a language model's
                   sequences interleave its corpus (batchify's view without the transpose) — at the
                   first 3 backwards, once per (axis, stride)
                   (loc: the backward; an aside; instrument/streamaxis.py)
temperature_multiplied factor (the constant factor between a product of L2-normalised vectors
                   and the log_softmax of a loss, both sides' factors included), shape (the
                   logits' shape), params [pid] (tracked tensors below the log_softmax): a
                   contrastive loss's cosine similarities scaled by a constant below 1 (a
                   temperature multiplied instead of divided) — at the first 3 backwards, once
                   per (factor, shape) (loc: the backward; an aside; instrument/attnaxis.py)
masked_mean        how (product | where | masked_fill | ignore_index: how the mask zeroes the
                   per-element loss; ignore_index: an unreduced nll/cross-entropy's ignored targets), reduced (the reductions below the loss: "mean", "mean+mean",
                   "sum/numel"), kept (the share of elements the mask keeps), elements (how many
                   the masked value has), same_mask (the mask equals the first one seen at this
                   line: a constant of the model), at_mean (the location is the mean's call, not
                   the backward), mask_operand (0/1: the mask's side of a product): a masked per-element loss averaged over every position, the
                   masked-out ones included — at the first 4 backwards, once per masked value and
                   backward (loc: the mean/sum call; an aside; instrument/maskmean.py)
loss_repeated      fn (the loss function), first_line (the line of its first call), params [pid]
                   (tracked tensors below the prediction): a loss called a second time on the
                   same prediction and target with the same options, both terms reaching the
                   loss — at the first 3 backwards, once per line (loc: the second call; an
                   aside; instrument/repeatedloss.py)
term_repeated      op (the autograd node of the repeated term), first_line (the line of the
                   first copy), params [pid] (tracked tensors below the term): two terms summed
                   into the loss that are the same ops with the same arguments on the same
                   inputs — at the backwards after the first 2 optimizer steps, once per line
                   (loc: the line that made the copy; an aside; instrument/repeatedterm.py)
view_axes          shape_in, shape_out (the sizes a view/reshape was given and returned), params [pid]
                   (tracked tensors below it): a view or reshape whose output is its input's axes
                   in another order (``x.view(B, C, T)`` of a (B, T, C) tensor), made from the
                   user's code and reaching the loss — at the first 3 backwards, once per pair
                   of shapes (loc: the view call; an aside; instrument/viewaxes.py)
shuffled_apart     kind ("permutation": two drawn orders, ``torch.randperm``/``numpy.random.permutation``;
                   "shuffle": two sequences shuffled in place), length, first [path, line] (the
                   first draw's line), arrays {name: "labels" | "rows"} (the drawing frame's
                   variables of that length: one value a row or whole numbers, or vectors): two random orders of one length drawn by the script's code
                   between two backwards (or before the first), from two lines, that differ — until
                   the 3rd backward, once per pair of lines (loc: the second draw; an aside;
                   instrument/shuffles.py)
input_written      module (the class), argument (the forward's parameter written), forward [path, line]
                   (its def), view (the input is a view of a larger tensor), rows (the rows of
                   the tensor it shares), batch (its own rows): a module call whose forward wrote
                   in place into a tensor argument that shares one tensor with an earlier call's
                   written argument (slices of the script's data, or the same tensor) — at the
                   first 4 backwards, once (loc: the model's call; an aside;
                   instrument/inputwrite.py)
rows_misaligned    fn (the loss), scores_from, scores (the shape the loss's input was flattened from
                   and to, read from the view node below it), target_from, target (the same for
                   its target): a loss whose input and target were flattened from the same
                   axes in another order ((B, T, C) scores and a (T, B) target), so each row's
                   target is another position's — at the first 3 backwards, once per line
                   (loc: the target's flattening call; an aside; instrument/viewaxes.py)
samples_pushed_up  fn (the torch loss called unreduced), samples (its values with a non-zero
                   gradient), pushed (those with a negative one), above (the lowest base loss
                   among them), consumers (the uses of the result in the loss's graph): a
                   per-sample loss used twice or more (a term and a weight made from it) whose
                   gradient is negative on its hardest samples (all, or all above a value and
                   none below) — at the first 3 backwards, twice at a line, once per line (loc:
                   the loss call; an aside; instrument/samplepush.py)
norm_batch         shape (the sizes of the tensor a norm reduced), dims (the axes it reduced; None: all),
                   batch (its axis 0: the samples), penalty (how the loss pulls the norm to a
                   target: "square", "abs", "relu", "clamp", "softplus", or a regression loss's
                   name): a norm on the loss's path over axis 0 of per-sample values (as long as
                   the leading axis of a tensor without gradient the graph read), shifted by a
                   constant and penalised, at_backward (a later phase's graph read alone: loc is
                   its backward) — at the first 3 backwards and a later phase's, once per line
                   (loc: the norm's call; an aside; instrument/normbatch.py)
spread_minimised   form ("var": a var/std over axis 0; "centred": a square or norm of z - z.mean(0)),
                   shape (the (samples, features) sizes of z), params [pid] (tracked tensors
                   below it): the whole loss, through reductions and positive constant factors,
                   is the spread of one batch around its own mean — at the first 3 backwards,
                   once per backward line (loc: the backward; an aside; instrument/spreadloss.py)
feature_variance   fn ("var" or "std"), shape (the (samples, features) sizes it reduced), penalty
                   (how the loss pulls it to a target: "relu", "clamp", "square", ..., or a
                   regression loss's name): a variance or standard deviation on the loss's path
                   over axis 1 of a batch of samples (axis 0 as long as the leading axis of a
                   tensor without gradient the graph read), shifted by a constant and penalised
                   (VICReg's variance hinge per sample) — at the first 3 backwards, once per
                   backward line (loc: the backward; an aside; instrument/featurevar.py)
shift_cancelled    consumer ("softmax", "log_softmax" or "cross_entropy"), grad (the term carries
                   gradient), value (the largest absolute value of a constant term; None when it
                   carries gradient), scalar (one number for every row, else one per row),
                   classes (the length of the axis it is constant along): a
                   term added alike to every class of a row before a shift-invariant softmax,
                   which cancels it — from the user's code, at the first 3 backwards, once per
                   line (loc: the line that added the term; an aside; instrument/shiftcancel.py)
softmax_batch      fn ("softmax" or "log_softmax"), shape (its result's sizes), batch (the samples: dim 0):
                   a softmax on the loss's path taken over dim 0 of a per-sample tensor (another
                   axis longer than 1, not a square (B, B) matrix, dim 0 as long as a tensor
                   without gradient the graph read) — at the first 3 backwards, once per
                   function, shape and dim; target (True: a soft target without gradient, its
                   values probabilities, multiplied with a log_softmax over the classes, whose
                   rows do not sum to 1 over them: normalised over another axis)
                   (loc: the backward; an aside; instrument/softmaxbatch.py)
class_axis         fn ("softmax" or "log_softmax"), shape (its result's sizes), dim (the axis it
                   normalised), picked (the axis the loss reads the target's class along), how
                   ("gather": a gather along picked whose index differs along dim; "target": a
                   product with a tensor without gradient that is a distribution along picked):
                   class scores normalised over another axis than the one the loss picks the
                   class along — at the first 3 backwards, once per function, shape, axes and how
                   (loc: the backward; an aside; instrument/classaxis.py)
loglik_minimised   picks (how many picks of log-probabilities the loss's linear top reaches):
                   a loss that rises with the log-probability of the served labels (each pick
                   a gather or index of a log_softmax, or the log of one of a softmax, reached
                   with a positive sign only through means, sums, views and factors of one
                   sign; its index the integer labels of the latest DataLoader batch): a
                   hand-written negative log-likelihood without its minus — at the first 3
                   backwards, once per backward line (loc: the backward; an aside;
                   instrument/loglikesign.py)
gather_batch       shape (the gather's input sizes), index (its index's sizes), largest (the
                   index's largest value), batch (the samples: dim 0): a gather on the loss's
                   path along dim 0 of a per-sample tensor (another axis longer than 1, not a
                   square (B, B) matrix, dim 0 as long as a tensor without gradient the graph
                   read) with one row of picks per sample, narrower than dim 1, whose numbers are
                   all below dim 1's length, itself below the batch: class or action numbers
                   used as row numbers; crossed (bool): instead, an advanced index `x[:, idx]`
                   of a (B, C) per-sample tensor by one class number per sample (length B,
                   numbers below C, B != C): every row reads every sample's class, a (B, B)
                   result — at the first 3 backwards, once per shape and index shape
                   (loc: the backward; an aside; instrument/gatherbatch.py)
weighted_reduced   fn (the torch loss: "mse_loss", "cross_entropy", ...), reduction ("mean" or
                   "sum"), input_shape (the loss input's sizes), factor_shape (the other factor's
                   sizes), factor_grad (whether it has a gradient): a product on the loss's path
                   of a loss torch already reduced over the batch and a factor with one row per
                   sample (dim 0 as long as the loss input's, 4 rows or more) — at the first 3
                   backwards, once per loss, reduction and shapes (loc: the backward; an aside;
                   instrument/reducedweight.py)
reduce_batch       fn ("logsumexp", "max", "min", "amax", "amin" or "prod"), shape (its input's
                   sizes), dims (the input's dimensions it reduces, the batch's among them),
                   batch (the samples: dim 0), batch_dim (only where the batch is not dim 0: a
                   samples-first layout, [K, B], the axis as long as the DataLoader's batch): a
                   reduction that is neither a sum nor a mean taken over the
                   batch axis of a per-sample tensor on the loss's path while another axis longer than 1 is
                   left, and the loss depends on its result (a gradient arrives at it) — at the
                   first 3 backwards, once per function, shape and dims (loc: the backward; an
                   aside, emitted during that backward; instrument/reducebatch.py)
same_compared      how ("twins": two nodes of the loss's graph computed the same values from the
                   same inputs and meet in an op that compares them; "constant": a loss function's
                   constant operand equals its gradient-carrying one at two optimizer steps, never
                   apart; "repeated": twins each compared by one difference or loss function with
                   a different constant target, at two backwards: a rollout restarted from its
                   initial input), op (the comparing op: difference, product, matrix product,
                   concatenation, mse_loss, kl_div, ...), core (the autograd node of each twin, or
                   of the gradient-carrying operand), shape (its output's, when saved), params
                   [pid] (tracked tensors the twin reaches), starts [op] (the autograd nodes
                   where the two twin computations begin, their inputs shared: EmbeddingBackward0
                   for two lookups of the same rows; empty for "constant"): a loss that compares a value with
                   itself (two identical views, negatives equal to the positives, a teacher that
                   is the student) — at the first 3 backwards of each backward line, once per line
                   (loc: the backward; an aside; instrument/samevalue.py)
aggregate_sum      op (mm | bmm: the product divided), batched (its operand has batch dimensions),
                   differ (mean |row sums - column sums| over the row sums' mean), rows (N): a
                   product M @ H divided row by row by the sums of M's columns (the axis it
                   keeps) instead of its rows (the axis it sums) — at the divisions before the
                   first backwards, once per line (loc: the division; an aside; instrument/aggsum.py)
field_rows         api (nn.Embedding | F.embedding), rows (the table's), fields (columns of the
                   (batch, fields) ids), calls (read), sizes [int] (each column's largest id + 1),
                   covered (their sum), top (the largest of them): categorical fields looked up in
                   one table without their offsets — every column's ids start at the same place
                   and their sizes add up to about the table's rows — once per call site, at the
                   end of the run (loc: the lookup; instrument/fieldrows.py)
table_columns_unit api (nn.Embedding | F.embedding), rows, cols (the table's), steps (the
                   optimizer steps at which each of its columns had unit norm and not each of
                   its rows), read (the steps it was read at): an embedding table renormalised after each update across its
                   rows (F.normalize(weight, dim=0)) — once per table, at the end of the run (loc:
                   its first lookup read after a step; instrument/fieldrows.py)
cumulative_order   op (cumsum | logcumsumexp | cumprod), case (inclusive | axis | unsorted | reversed),
                   key (the name of the per-row key read in the op's frames, or None), rows (the
                   normalizer's rows; for axis, the axis the rendering sums; or None), dim: a
                   cumulative op that runs in another order than the loss needs — a ranking
                   normalizer (`h - logcumsumexp(h, 0)`: a Cox risk set) over rows that no
                   key in the frames orders (unsorted), or in ascending order under a survival
                   indicator (reversed); a product `alpha * cumprod(1 - alpha)` with no shift
                   (inclusive transmittance), or an exclusive one along another axis than the
                   rendering's sum (axis) — at the first 3 backwards after cumulative ops,
                   once per call line (loc: the op's call; an aside; instrument/cumorder.py)
cumulative_axis    op (cumsum | logcumsumexp | cumprod), shape (its result's, 3 axes or more), dim
                   (the axis it runs over, from 0), cdf (it ends at 1, or 0 for logcumsumexp,
                   everywhere: a distribution's CDF) — a cumulative op with a graph whose result
                   the loss reads, at the first 3 backwards after cumulative ops, once per call
                   line (loc: the op's call; an aside; instrument/cumorder.py)
returns_order      steps (the log-probabilities weighted), gamma (the discount under which the
                   weights read as returns backwards), name (the script's name for the weights'
                   tensor, or None): per-step policy-gradient weights whose order is the reverse
                   of a discounted-return recursion — read backwards they are returns of a reward
                   with at most 3 values, read in the steps' order they are not — at the first 3
                   backwards after log-probabilities, once per backward line (loc: the backward;
                   an aside; instrument/returnorder.py)
draw_twin          fn (rand | randn | randint | rand_like | randn_like | randint_like), module (the
                   class called), position (the argument's), twin_line (the line of the draw the
                   other input was built from, or None), shape [int]: a module call given a bare
                   random draw that none of its other arguments came from, while one of them came
                   from another draw of the very same call (a diffusion timestep drawn again) —
                   in the first 3 windows of draws before a backward, once per draw line (loc: the
                   draw given; an aside; instrument/drawtwin.py)
noise_redrawn      fn (mse_loss | l1_loss | smooth_l1_loss | huber_loss), params [pid] (tracked
                   tensors the input's graph reaches), numel (the target's size): the target is,
                   to the last bit, the first standard-normal draw of the CPU generator after
                   the model's forward ended — a fresh noise the model never saw (a diffusion
                   loss's noise drawn again) — at one of the first 3 backwards' losses, once per
                   call line (loc: the loss call; an aside; instrument/redrawn.py)
constant_term      name (the backward frame's variable bound to the term), value (its last
                   value), loss_low, loss_high (the loss's values at the same backwards), params
                   [pid] (tracked tensors the term reaches), origin (the frame's variable, computed
                   only for the term, farthest below it whose values stayed the same too, or
                   None): a named term of the loss's linear top
                   whose value stayed the same at the first 4 backwards of a line while the loss
                   moved, sharing an activation with the rest of the loss, no saturating op or
                   zero factor of its own (loc: the backward; an aside; instrument/constantterm.py)
batch_reduction    summed, averaged (how each term reduces its batch axis: "sum", "mean",
                   "MseLoss(reduction=sum)"), batch (N: the summed term's rows), averaged_rows
                   (the averaged term's rows: N, or N times the tokens of each sample),
                   summed_name, averaged_name (the backward frame's variables bound to each term,
                   or None), broadcast (the summed term is added to every sample's value before
                   the mean, `(log_prob + s.sum()).mean()`; summed_name then names the
                   per-sample value that holds it): two terms of a backward's loss, computed
                   from one per-sample activation, one summed over the batch and one averaged
                   over it — their balance changes with the batch size — at the first 3 backwards of each
                   backward line, once per line (loc: the backward; an aside;
                   instrument/batchreduce.py)
sample_range       critic, generator (the two modules' class names), activation, low, high (the
                   range the generator's output activation bounds its samples to; high None for
                   unbounded above), data_min, data_max (of the data the critic was given),
                   outside (the data's share outside the range), how (excludes: a quarter or
                   more outside; half: the data in one half of a range split by 0), name (the
                   calling frame's variable bound to the data, or None): a module compared a
                   generator's bounded samples with data on another range — at the first 8
                   backwards, once per critic (loc: the critic's call on the data; an aside;
                   instrument/samplerange.py)
loss_term_params   terms [{path (the additions' operand indices from the loss's root to the
                   term), op (the term's autograd node), params [pid] (tracked tensors it
                   reaches)}], line (the backward's line): a backward's loss adds up terms
                   that fall into two groups or more sharing no parameter — at the first
                   backwards of each line (loc: the backward; an aside; instrument/deadterm.py)
loss_unbounded     term ("exp" | "square" | "linear" | "logsumexp": x[a] - logsumexp(x) |
                   "log_softmax": log_softmax(x).gather(1, a), both with a positive sign |
                   "variance_added": mean(x ** 2) + c * mean(x) ** 2, a variance whose minus
                   became a plus: bounded, not scale-invariant any more | "weighted_square":
                   a square times a weight tensor with an entry of the other sign), op
                   (the autograd node: ``ExpBackward0``, ``PowBackward0``), params [pid]
                   (tracked tensors its argument reaches), line (the backward's line): a
                   backward's loss holds a term -c * exp(v) or -c * v**2 (c > 0) of an unbounded
                   v that needs a gradient, or a log-likelihood minimised: the loss has no lower bound
                   and the optimizer lowers it without end — once per backward line (loc: the
                   backward; an aside; instrument/lossterms.py)
loss_derived_weight kinds (["self"]: a scalar weight that is a function of the reduced loss it
                   multiplies alone, a focal-style modulation of a batch mean; ["ratio"]: of
                   several loss terms, balancing weights; ["scale"]: a mean of x times a
                   divisor of x's size, c / mean(|x|), whose product no longer changes with
                   x's size), terms (how many such products) — loss
                   weights computed from the loss terms with their graph (loc: that backward; an
                   aside; instrument/lossderived.py)
concave_term       form ("where" | "min": a choice between two tensors of opposite signs;
                   "weights": a product with constant weights of both signs), negative (the
                   result's share of negative elements), line (the call's line): a term that
                   takes the negative one of two opposite lines nearly everywhere (a pinball
                   loss with q and q - 1 swapped), held by a backward's loss with a positive
                   sign — at the first 3 backwards (loc: the call; an aside;
                   instrument/concave.py)
flow_identity_dims dims [feature columns, 16 at most], features (the latent's width), line
                   (the backward's line): the latent a square of the loss saves equals, in those
                   columns, the data a product of the graph saves, every row, while other
                   columns differ — at the first 3 backwards of each line (loc: the backward;
                   an aside; instrument/flowidentity.py)
log_det_positions  op ("slogdet": log|det W| of a 1x1 convolution's weight; "sum": the sum of
                   a parameter shaped with size-1 axes that scales a tensor broadcast over them),
                   positions (the positions the transform is applied at), params [pid] (the
                   parameter, when tracked), line (the backward's line): the loss holds that
                   log-det with no constant factor while the transform covers more positions
                   — at the first 3 backwards of each line (loc: the backward; an aside;
                   instrument/logdetpositions.py)
log_scale_reversed linear (+1 | -1: the sign the loss's linear top holds a log-scale s with),
                   exp (+1 | -1: the sign an exp(±s) below a product or square takes it with),
                   op (s's autograd node), params [pid] (tracked tensors s reaches), bounded (s
                   is a bounded op's output: tanh, sigmoid, clamp), line (the backward's line):
                   a backward's loss holds s linearly and through exp(±s) with signs that pull
                   s the same way (a flow's log-det subtracted, a Gaussian NLL's log-variance
                   negated) — once per backward line (loc: the backward; an aside;
                   instrument/lossterms.py); power (only present when true: what pulls s the
                   log's way is a positive power of the scale S = s held linearly, a Gaussian
                   KL's sigma ** 2 beside +log(sigma); exp is then that power's sign)
sampled_scores     scores [{kind ("sim" a dot product | "dist" a distance), op (its autograd
                   node), draws [int] (the draws its lookups' indices are), up (the share of the
                   gradient's mass that descent uses to raise the score's similarity; None: not
                   read), mass, names [str] (the frames' variables bound to it)}], draws {id:
                   {loc [path, line], fn}} (the script's random integer draws since the previous
                   backward that a lookup read), line (the backward's line), ranges (only
                   present when not empty: [{draw, loc, fn, high (the bound the draw was asked
                   for), rows (the embedding table its lookup reads), others [int] (the other
                   tables' rows), data (the data's indices into the table counted), beyond (their
                   share at high or above)}] per drawn lookup with high < rows): a backward's loss
                   scores embeddings looked up at indices the script drew at random — at the
                   2nd to 5th backwards (loc: the backward; an aside; instrument/negsample.py)
loss_weight_learned params [pid] (the learned weights), kinds (["mul"] a product's factor,
                   ["div"] a quotient's denominator), terms (how many weighted terms), elements
                   [[int]|None] (per param: the indices along dim 0 of the elements its terms
                   select, ``s[2]``; None: the whole tensor), backwards
                   (how many backwards of the line showed the factor moving one way), line (the
                   backward's line), reversed [bool] (per param: its only other path is a
                   regulariser term whose slope has the term's sign, ``exp(-s) * loss - s``):
                   a backward's loss weighs terms that are losses by construction
                   with a monotone factor of a learned tensor that reaches the loss no other way
                   (or only through such a reversed regulariser),
                   and the steps moved that factor only the way its gradient's fixed sign says,
                   at each of the line's first backwards — once per backward line (loc: the
                   backward; an aside; instrument/lossweight.py)
grad_stops         params [pid] (the parameters whose gradient was exactly zero and that the
                   diagnosed backward's graph reaches), stops [str] (the autograd nodes where the
                   gradient toward them stops: non-zero in, zero out, nearest the loss first:
                   ``RoundBackward0``, ``ClampBackward1``; a matmul or convolution whose saved
                   weight is all zero gets ``:zero_weights``), loss_zero (the loss itself was 0) —
                   one diagnosed backward after an update with exactly-zero gradients (loc: the
                   backward; an aside)
state_overwritten  cls (the module's class), params [pid] (the parameters the load placed
                   that an initialiser overwrote),
                   weights (how many of them are weights, two dimensions or more: every one
                   an initialiser overwrote), via ["torch.nn.init.<initialiser>"], at [[path,
                   line, function]] (the user's lines of those calls, at most a few) — a
                   ``load_state_dict`` before the first optimizer step whose placed weights
                   were all overwritten by ``torch.nn.init`` before it (``reset_parameters()``,
                   ``model.apply(init)``): written at the end of a run that stepped (loc: the
                   load; an aside; instrument/resets.py)
state_not_loaded   cls (the module's class), keys (in the state dict), params (the module's
                   parameters), unexpected / missing (the first keys of each side), prefix
                   (["strip" | "add", "module."] when one prefix places the state's keys, else
                   None) — ``load_state_dict(strict=False)`` placed none of the module's
                   parameters (loc: that call; an aside)
diverging          opt, first, last (the optimizer's own update counts: its total gradient norm
                   grew ``divergence.GROWTH``-fold or more at each update after ``first`` up to
                   ``last``), norms [float, float] (the totals at ``first`` and ``last``), factor
                   (growth per update), nonfinite (the run ended in a NaN/Inf norm rather than
                   reaching ``divergence.RUN`` updates and ``TOTAL``-fold) — once per optimizer
                   (loc: None; the next ``step_begin`` of ``opt`` is the step it was seen at; an
                   aside; instrument/divergence.py)
state_self_load    cls (the module's class), params (how many of its parameters the state holds) —
                   ``load_state_dict`` given a state whose every parameter tensor is the module's
                   own (the same storage): nothing is copied; the "other" module is the same one
                   (``target = model``) or shares all its parameters (loc: that call; an aside)
mask_regrown       cls (the module's class), param, mask (its attribute names: the parameter and
                   the module's 0/1 tensor), regrown (entries where the mask is 0 that are no
                   longer zero), masked (entries where it is 0), steps (optimizer steps so far),
                   defined_at ([path, first line, last line] of the module's class when the
                   script defines it, or None), pid (the parameter's, or None) — a weight that was zero wherever its mask is 0
                   at its first forward, found nonzero there after an update, read after the
                   module's forward ran (loc: the script's line running that forward; an
                   aside; instrument/maskonce.py)
mask_not_causal    cls (the module's class), param, mask (their attribute names), kernel ([kh, kw]),
                   open_after ([row, column] kernel positions after the centre in raster order
                   that the mask keeps, 8 at most), defined_at (as ``mask_regrown``'s) — a 0/1
                   mask of a 2-D convolution's weight that hides positions after the centre (the
                   positions before it all kept) but keeps others: part of a row below the
                   centre, or a row below while the centre row's right part is hidden (loc: the
                   script's line running the module's first forward; an aside;
                   instrument/maskonce.py)
mask_sees_itself   cls (the last masked layer's class), layers (masked linear layers chained
                   through pointwise activations), inputs (d), blocks (k: outputs = k * d),
                   seen (outputs' positions that depend on their own input), defined_at (as
                   ``mask_regrown``'s) — a chain of 0/1-masked linear layers whose dependencies
                   between positions form an order (MADE's) while outputs depend on their own
                   position too (loc: the script's line running the last layer's first forward;
                   an aside; instrument/maskonce.py)
straight_through_cancelled forms ["add" | "sub": x + (y - x) or (y - x) + x, x - (x - y)],
                   kept [the class name of each cancelled node] — a loss whose graph sums a
                   tensor with a difference that subtracts it again, so its gradient along the
                   sum is exactly zero (a straight-through estimator without .detach()), at
                   the first 3 backwards, once per backward line (loc: that backward; an
                   aside; instrument/stcancel.py)
symmetric_units    opt, params [pid] (stepped parameters whose rows are all equal, and whose
                   gradient's rows are all equal and not all zero), rows [int] (each one's row
                   count: its units), step (the optimizer's step
                   after which they were compared) — a layer whose units stayed copies of each
                   other (loc: that step; an aside)
copies_identical   opt, groups [[pid]] (stepped parameters, distinct tensors, whose values are equal
                   and whose gradients are equal and not all zero: each group is one tensor and its
                   copies), step (the optimizer's step after which they were compared) — modules
                   copied from one initialised module that never diverge (loc: that step; an
                   aside; instrument/symmetry.py)
model_copy         copy, model (the user's names of a module no optimizer trains and of one whose
                   parameters an optimizer owns, of the same parameter shapes), opt (the model's
                   optimizer), params (the copy's tensor count), equal (bool: the same sampled
                   values at the first step: a copy of the model), forwards, targets (the copy's
                   forwards after the first step, and those without gradient: under no_grad or
                   with an output that carries none), written (bool: the copy's parameters were
                   changed during the run), written_step (int|None), measured (intervals between
                   two steps of ``opt`` measured), pulls [[step, cos, share, copy_moved]] (per
                   interval in which the script's own code changed the model: the cosine of that
                   change with the way from the model to the copy, its length over that way, and
                   whether the copy changed too), follows [[step, share, cos, exact]] (per
                   measured interval in which the copy moved: the share of the way from the copy
                   to the model, after the step, that its move covered, the cosine of its move
                   with that way, and whether it then held the model's values exactly), norms
                   (the copy's BatchNorm layers with running statistics matched to the model's),
                   stale_norms [str] (those of a written copy whose statistics never moved while
                   the model's counted batches) — written at the end (loc: the copy's first
                   forward that gave targets, or None)
decay_share        opt, cls (the optimizer's class), group (the param group's index), weight_decay,
                   lr (plain numbers, lr None for a tensor), decoupled (bool: AdamW's decay, or
                   ``decoupled_weight_decay=True``), steps [int] (the step measured at each update),
                   ratios [float] (per measured update, the element-weighted median over the
                   group's CPU parameters with a gradient of the decay term over the loss's:
                   coupled ``weight_decay * ||p|| / ||g||``, decoupled
                   ``weight_decay * ||p|| / sqrt(numel)``) — each param group with a weight decay
                   of one of torch's optimizers, over its first ``decay.MEASURED`` updates (loc:
                   None; an aside; instrument/decay.py)
eps_share          opt, cls (Adam | AdamW | NAdam | RAdam | RMSprop | Adagrad), group (the param
                   group's index), eps, steps [int] (the run's step count after each measured
                   update), shares [float] (per measured update: the fraction of the group's
                   elements with a second moment that lie in parameters where eps ≥ 10 ×
                   sqrt(v) on most elements), ratios [float] (per measured update: the
                   element-weighted median over those parameters of their median eps / sqrt(v))
                   — each param group with eps ≥ 1e-5 of one of torch's adaptive optimizers,
                   over its first ``epsshare.MEASURED`` updates (loc: None; an aside;
                   instrument/epsshare.py)
activation_saturated fn (tanh | sigmoid), module (the class of the layer whose output it took),
                   layer (its name after the user's variables, or None), threshold (|x| above
                   which its gradient is below 1 % of its largest: 3 for tanh, 6 for sigmoid),
                   shares [float] (per call watched: the fraction of its inputs beyond the
                   threshold), init (bool: the location is the nn.init call that last set the
                   layer's weight, else the line that built the layer), data_input (bool: the
                   layer's input had no graph at some call: a batch of data) — a tanh or sigmoid
                   (module or functional) whose input was a parameterised layer's output at its
                   first training calls, that layer's weight as initialised in this run, every
                   call saturated on most inputs, its output not taken by a binary
                   cross-entropy; once per layer, when the first steps' window closes (loc: the
                   weight's initialisation or the layer's construction; an aside;
                   instrument/saturation.py)
step_edit          opt, steps [int] (the run's step count at each measurement), back [float|None]
                   (per measured update: the cosine between the change the script's own code made
                   to the optimizer's parameters before its next step, Δh, and minus the change
                   the step made, -Δs: 1 when the edit takes the update back; None when nothing
                   changed them), share [float] (|Δh| / |Δs|), home [float|None] (the cosine
                   between Δh and the way back to their values before the optimizer's first
                   step), home_share [float|None] (|Δh| over the distance to those values),
                   redrawn [[pid]] (the parameters whose values the edit replaced by unrelated
                   ones: a re-initialisation by hand) —
                   the optimizer's first ``undo.MEASURED`` updates of CPU parameters, sampled;
                   only when some edit changed them (loc: the step after the last measured
                   update; an aside; instrument/undo.py)
snapshot_alias     via ("load_state_dict" | "torch.save"), taken ([path, line, function] of the
                   user's outermost ``Module.state_dict()`` call that made the dict's tensors),
                   params [pid] (optimizer-owned parameters whose live storage those tensors
                   still share), tensors (how many of the given object's tensors are such
                   references, buffers included), total (its tensors), steps (steps of the
                   optimizers owning those parameters since the ``state_dict()`` call): a state
                   dict that is no copy, restored or saved after the parameters it refers to were
                   stepped (loc: the user's ``load_state_dict`` / ``torch.save`` call; an aside)
snapshot_held      name (the variable of the caller's frame holding the dict), params [pid]
                   (optimizer-owned parameters whose live storage its tensors share), steps (steps
                   of their optimizers since): a ``state_dict()`` result that is no copy, still
                   held by a variable at the next optimizer step and given to no
                   ``load_state_dict``/``torch.save`` before it, for the first 8 calls; alike
                   (None, or for a dict found among the items of a list or tuple held by a
                   variable of a frame on the step's stack: how many of its items are state
                   dicts sharing the dict's live storage, 2 or more: snapshots collected from one
                   model, or clients that are the same model) (loc: the user's ``state_dict()``
                   call; an aside)
param_created      owner (class of the module), attr (the name it was registered under), params
                   [pid] (the new parameter, tracked from here), step (optimizer steps so far) —
                   a parameter registered once an optimizer exists that replaces none an
                   optimizer owns (a layer built in ``forward``); at most 8 per call line (loc:
                   the user's line that built it; an aside)
param_replaced     owner (class of the module), attr (the name it was registered under), via
                   ("parameter": a tensor assigned over a parameter; "module": a submodule
                   assigned over one whose parameters an optimizer owns), old [pid] (the
                   replaced tensors, each owned by an optimizer at that moment), new [pid] (what
                   took their place: the new parameters, tracked from here) — a registration
                   that drops optimizer-owned parameters from the model (loc: the user's line
                   that made it: the assignment, ``model.apply(...)``'s function,
                   ``load_state_dict(assign=True)``)
module_repeated    container (ModuleList | Sequential, or a subclass's name), cls (the repeated
                   module's class), positions [str] (the names it is registered under in the
                   container so far: "0", "1", ...), params [pid] (its parameters, tracked from
                   here) — one module object with parameters registered again in a
                   ModuleList/Sequential built by the script's own code (``[layer] * n``); at
                   each repeat, at most 16 per call line (loc: the user's line that built or
                   extended the container; an aside; instrument/registration.py)
norm_arguments     cls (BatchNorm1d | BatchNorm2d | ...), eps, momentum (as the module holds
                   them; momentum None for a cumulative average), params [pid] (its affine
                   parameters, tracked from here) — a BatchNorm module registered into a module
                   by the script's own code with Keras' arguments in PyTorch's meaning: eps of
                   0.1 or more (``BatchNorm2d(c, 0.8)``: the second positional argument is eps),
                   or a momentum in [0.9, 1) while it tracks running statistics; at most 4 per
                   line (loc: the user's line that built it; an aside; instrument/registration.py)
batch_layout       cls (the module's class: LSTM | GRU | RNN | MultiheadAttention |
                   TransformerEncoderLayer | TransformerDecoderLayer | Transformer, or the
                   script's subclass of one), layout ("batch_first": the input's dim 0 is a batch
                   size and dim 1 is not | "seq_first": dim 1 is one and dim 0 is not), shape
                   [dim0, dim1] (the 3-D input's first two dimensions), batch (the batch size it
                   was compared with), source ("loader": the samples of the batch a DataLoader
                   served last | "loss_target": the leading dimension of the latest loss call's
                   target), forwards (how many forwards looked so when it was recorded), call
                   ([path, line, function] of the user's line that called the module, or None)
                   — a module the script built with ``batch_first=False``, once per
                   construction and layout: batch-first at its second such forward, seq-first
                   at its first (loc: the construction, else the call; an aside;
                   instrument/batchfirst.py)
dependency         model (the class of the model), batch (its batch size), source ("loader":
                   the DataLoader batch's | "loss_target": a loss target's leading dimension |
                   "pairwise": the loss compares the (N, D) output's rows with each other,
                   ``cdist(out, out)`` or ``out @ out.T`` | None: not known, so the batch was not judged), mixed (True: the output for
                   one sample depends on other samples of the batch | False: it does not | None:
                   not judged), op (the autograd node that first mixes them, nearest the output:
                   ``ViewBackward0``, ``SoftmaxBackward0``; None), op_at ([path, line,
                   function] of the user's line that made that node, from a forward run again
                   with anomaly mode's tracebacks; None), seq (None, or {k: the shift of the
                   token targets against the ids of one of the forward's embeddings, 1 | 0 |
                   -1; positions; t: the position probed; future: the output at t depends on
                   later positions; past: on earlier ones; target_at: [path, line, function]
                   of the loss call whose targets gave k}), modules ([[cls, path, line,
                   function, flag]] the attention, Transformer and recurrent modules the
                   forward called, outermost, where the user's code called them; flag
                   "masked" | "bidirectional" | ""), forward ([path, first line] of the model
                   class's forward in the user's files, or None) — one probe of a model's
                   first training forward: one extra ``torch.autograd.grad`` of an output row
                   (loc: the user's line that called the model; an aside;
                   instrument/dependency.py)
internal_error     where, error
run_end            status, steps
=================  ==========================================================================

``train``/``eval``, ``mode_forward``, ``freeze`` and ``bn_reset`` are aggregates: the mode watcher
keeps them open while no other event happens and emits them finished (instrument/modes.py).
``dropout_default``, ``loss_broadcast``, ``factor_broadcast``, ``loss_input``, ``target_domain``, ``idle_forward``, ``idle_loss``, ``functional_grad``,
``grad_stops``, ``self_product_offset`` and ``optimizer_attr``, ``module_attr``, ``param_attr``, ``param_replaced``, ``module_repeated``, ``state_self_load``, ``diverging``, ``norm_arguments``, ``output_range``, ``grid_scale``, ``bag_offsets``, ``channel_pool``, ``normaliser_sign``, ``distance_bias``, ``easy_weighted``, ``overlap_scores``, ``weighted_class_absent``, ``ignored_mask``, ``padding_kept``, ``padding_pooled``, ``unshuffle_misplaced``, ``cells_transposed``, ``placeholder_targets``, ``advantage_grad``, ``policy_sign``, ``degree_scaled``, ``self_scatter``, ``softmax_over_edges``, ``edges_across_graphs``, ``token_copy``, ``token_labels_shifted``, ``cumulative_order``, ``cumulative_axis``, ``returns_order``, ``draw_twin``, ``self_match``, ``pair_labels``, ``pair_pull``, ``ratio_fault``, ``reparam_cut``, ``fresh_sample_scored``, ``batch_reduced_target``, ``loss_no_graph``, ``constant_term``, ``pixels_unscaled``, ``dropout_on_output``, ``output_discarded``, ``bn_batch``, ``eps_share``, ``activation_saturated`` are *aside* kinds (``ASIDE_KINDS``): observations made in the middle of a
forward (or, for an attribute set on an optimizer, between any two calls), emitted with
``Recorder.emit_aside`` so that they close none of the mode watcher's open aggregates (the
analysis' mode timeline passes over them too).
Scale values may be a ``Deferred`` device value while the run goes on; the final trace holds
the number (instrument/recorder.py). Rules ignore kinds they do not know.
"""

from __future__ import annotations

from typing import Any, Callable

Made = tuple[str, dict]  # (kind, data): what Recorder.emit and Trace.put take

# ``mode_module``'s model_unchanged: over how many optimizer steps (backward calls without an
# optimizer) the parameters of a model run with dropout in train mode under no_grad are looked
# at before it counts as static, a frozen teacher rather than an EMA copy (instrument/modes.py)
MODEL_STATIC_AFTER = 3


def run_start(*, script: str, argv: list[str], device: str, torch_version: str) -> Made:
    return "run_start", {"script": script, "argv": argv, "device": device,
                         "torch_version": torch_version}


def param(*, pid: int, name: str | None, shape: list[int] | None, is_parameter: bool,
          requires_grad: bool | None, stepped_requires_grad: bool | None = None) -> Made:
    return "param", {"pid": pid, "name": name, "shape": shape, "is_parameter": is_parameter,
                     "requires_grad": requires_grad, "stepped_requires_grad": stepped_requires_grad}


def optimizer_init(*, opt: int, cls: str, params: list[int], lrs: list | None = None,
                   hyper: list | None = None, aliases: list[list[int]] | None = None,
                   unread: list | None = None, settings: list[str] | None = None) -> Made:
    """``aliases``, ``unread`` and ``settings`` are only written when there are some."""
    data = {"opt": opt, "cls": cls, "params": params, "lrs": lrs, "hyper": hyper}
    if aliases:
        data["aliases"] = aliases
    if unread:
        data["unread"] = unread
        data["settings"] = settings
    return "optimizer_init", data


def backward(*, fresh: list[int], accumulated: list[int], cleared_outside: list[int],
             extra_leaves: int = 0, in_step: int | None = None, scaled: bool = False,
             scale: Any = None, loss_scale_factor: float | None = None,
             loss_terms: list | None = None,
             batch: list[int] | None = None, graph_nodes: int | None = None,
             history: list[list] | None = None, scaler: int | None = None,
             scaler_enabled: bool | None = None, allreduce: bool | None = None,
             repeats: int | None = None, updated_by_hand: list[int] | None = None,
             applied_by_hand: list[int] | None = None, autocast_fp16: list | None = None,
             loss_negated: str | None = None, hand_step_cosine: float | None = None,
             hand_step_scale: float | None = None,
             loss_constant: bool | None = None, thread: int | None = None,
             rescaled: list[int] | None = None) -> Made:
    """``scale``: a float, a ``Deferred`` device value, or None. ``scaler`` and
    ``scaler_enabled`` are only written when given (rules tell a missing key from None);
    ``thread`` too (see ``THREADED_KINDS``)."""
    data = {"fresh": fresh, "accumulated": accumulated, "cleared_outside": cleared_outside,
            "extra_leaves": extra_leaves, "in_step": in_step, "scaled": scaled, "scale": scale,
            "loss_scale_factor": loss_scale_factor, "loss_terms": loss_terms,
            "batch": batch, "graph_nodes": graph_nodes, "history": history}
    if scaler is not None:
        data["scaler"] = scaler
    if scaler_enabled is not None:
        data["scaler_enabled"] = scaler_enabled
    if allreduce is not None:
        data["allreduce"] = allreduce
    if repeats is not None:
        data["repeats"] = repeats
    if updated_by_hand:
        data["updated_by_hand"] = updated_by_hand
    if applied_by_hand:
        data["applied_by_hand"] = applied_by_hand
    if rescaled:
        data["rescaled"] = rescaled
    if autocast_fp16 is not None:
        data["autocast_fp16"] = autocast_fp16
    if loss_negated is not None:
        data["loss_negated"] = loss_negated
    if hand_step_cosine is not None:
        data["hand_step_cosine"] = hand_step_cosine
    if hand_step_scale is not None:
        data["hand_step_scale"] = hand_step_scale
    if loss_constant:
        data["loss_constant"] = True
    return "backward", _threaded(data, thread)


# the kinds whose order makes the gradient ledger's phases: an event of one of them made in a
# thread other than the one running the script carries ``thread`` (1, 2, ... in order of first
# appearance; added by ``Recorder.emit``), so that the ledger follows each thread's own loop
THREADED_KINDS = frozenset({"backward", "clear", "step_begin", "step"})


def _threaded(data: dict, thread: int | None) -> dict:
    if thread is not None:
        data["thread"] = thread
    return data


def clear(*, via: str, opt: int | None, params: list[int], set_to_none: bool = True,
          thread: int | None = None, caller: list | None = None) -> Made:
    return "clear", _threaded({"via": via, "opt": opt, "set_to_none": set_to_none,
                               "params": params, "caller": caller}, thread)


def step_begin(*, opt: int, norm_pids: list[int] | None, norms: list[float] | None,
               closure: bool = False, nonfinite: list[int] | None = None,
               frozen: list[list] | None = None, edited_params: list[int] | None = None,
               moved: list[int] | None = None, lrs: list | None = None,
               thread: int | None = None) -> Made:
    """``frozen``: ``[pid, moved_by, freeze]`` entries (see the table above)."""
    return "step_begin", _threaded({"opt": opt, "closure": closure, "norm_pids": norm_pids,
                                    "norms": norms, "nonfinite": [] if nonfinite is None else nonfinite,
                                    "frozen": [] if frozen is None else frozen,
                                    "edited_params": [] if edited_params is None else edited_params,
                                    "moved": [] if moved is None else moved,
                                    "lrs": lrs},
                                   thread)


def step(*, opt: int, closure: bool = False, skipped: bool = False,
         without_grad: list[int] | None = None, thread: int | None = None) -> Made:
    return "step", _threaded({"opt": opt, "closure": closure, "skipped": skipped,
                              "without_grad": [] if without_grad is None else without_grad}, thread)


def epoch_start(*, loader: int, epoch: int, real_len: int | None, replay_len: int | None,
                planned: list | None = None) -> Made:
    """``planned`` is only written when known."""
    data = {"loader": loader, "epoch": epoch, "real_len": real_len, "replay_len": replay_len}
    if planned is not None:
        data["planned"] = planned
    return "epoch_start", data


def short_len(*, loader: int, real_len: int, replay_len: int) -> Made:
    return "short_len", {"loader": loader, "real_len": real_len, "replay_len": replay_len}


def phase_hold(*, wait: str, updates: int, until: int, cut: str | None, cap: int,
               cap_s: float, planned: list | None = None, passes: int | None = None) -> Made:
    data = {"wait": wait, "updates": updates, "until": until, "cut": cut, "cap": cap,
            "cap_s": cap_s}
    if planned is not None and passes is not None:
        data["planned"], data["passes"] = list(planned), passes
    return "phase_hold", data


def unscale(*, scaler: int, opt: int, enabled: bool, implicit: bool, scale: Any) -> Made:
    return "unscale", {"scaler": scaler, "opt": opt, "enabled": enabled, "implicit": implicit,
                       "scale": scale}


def scaler_step(*, scaler: int, opt: int, enabled: bool, fused: bool, skipped: bool,
                found_inf: bool | None) -> Made:
    return "scaler_step", {"scaler": scaler, "opt": opt, "enabled": enabled, "fused": fused,
                           "skipped": skipped, "found_inf": found_inf}


def scaler_update(*, scaler: int, enabled: bool, scale: Any) -> Made:
    return "scaler_update", {"scaler": scaler, "enabled": enabled, "scale": scale}


def scaler_init(*, scaler: int, cls: str, enabled: bool, requested: bool | None,
                init_scale: float | None = None) -> Made:
    return "scaler_init", {"scaler": scaler, "cls": cls, "enabled": enabled, "requested": requested,
                           "init_scale": init_scale}


def scaler_load(*, scaler: int) -> Made:
    return "scaler_load", {"scaler": scaler}


def clip(*, via: str, params: list[int], with_grad: list[int], untracked: int,
         limit: float | str | None, norm_type: float | str | None, norm_only: bool,
         total_norm: float | str | None, edited: list[int], spent: bool | None = None,
         clipped: float | None = None, kept: float | None = None) -> Made:
    """``spent`` None: not known (a trace written before it was recorded, or an iterator
    graddoctor cannot look into). ``clipped`` and ``kept`` are only written when measured."""
    data = {"via": via, "params": params, "with_grad": with_grad, "untracked": untracked,
            "limit": limit, "norm_type": norm_type, "norm_only": norm_only,
            "total_norm": total_norm, "edited": edited, "spent": spent}
    if clipped is not None:
        data["clipped"] = clipped
        data["kept"] = kept
    return "clip", data


def grad_edit(*, opt: int, params: list[int], factors: list | None = None) -> Made:
    """``factors`` is only written when some group has one."""
    data = {"opt": opt, "params": params}
    if factors:
        data["factors"] = factors
    return "grad_edit", data


def scheduler_step(*, sched: int, cls: str, opt: int | None, lrs: list | None = None,
                   metric: str = "none", grad: bool = True, value: float | None = None,
                   mode: str | None = None) -> Made:
    data = {"sched": sched, "cls": cls, "opt": opt, "lrs": lrs, "metric": metric, "grad": grad}
    if mode is not None:  # a ReduceLROnPlateau's step: what it was fed and how it reads it
        data["value"] = value
        data["mode"] = mode
    return "scheduler_step", data


def scheduler_init(*, sched: int, cls: str, opt: int | None, args: dict,
                   children: list[int] | None = None, base_lrs: list | None = None,
                   lrs: list | None = None) -> Made:
    return "scheduler_init", {"sched": sched, "cls": cls, "opt": opt, "args": args,
                              "children": [] if children is None else children,
                              "base_lrs": base_lrs, "lrs": lrs}


def mode_set(*, mode: bool, leaf: bool, root: str, frozen: bool, modules: list[int],
             calls: int = 1) -> Made:
    """``train`` (mode True) or ``eval``."""
    return "train" if mode else "eval", {"mode": mode, "leaf": leaf, "root": root,
                                         "frozen": frozen, "modules": modules, "calls": calls}


def mode_module(*, mid: int, name: str, cls: str, layer: str, has_params: bool,
                frozen: bool | None, owned: bool | None, trainable: bool | None, updated: bool,
                track_running_stats: bool | None, momentum: float | None, p: float | None,
                freeze: int | None = None, model: str | None = None,
                model_unchanged: int | None = None, model_changed: bool = False) -> Made:
    return "mode_module", {"mid": mid, "name": name, "cls": cls, "layer": layer,
                           "has_params": has_params, "frozen": frozen, "owned": owned,
                           "trainable": trainable, "updated": updated,
                           "track_running_stats": track_running_stats, "momentum": momentum,
                           "p": p, "freeze": freeze, "model": model,
                           "model_unchanged": model_unchanged, "model_changed": model_changed}


def mode_forward(*, training: bool, grad: bool, inference: bool, modules: list[int],
                 grad_modules: list[int], calls: int = 1, recalibrating: bool = False,
                 nested: bool = False) -> Made:
    return "mode_forward", {"training": training, "grad": grad, "inference": inference,
                            "modules": modules, "grad_modules": grad_modules, "calls": calls,
                            "recalibrating": recalibrating, "nested": nested}


def freeze(*, calls: int = 1) -> Made:
    return "freeze", {"calls": calls}


def bn_reset(*, modules: list[int], calls: int = 1) -> Made:
    return "bn_reset", {"modules": modules, "calls": calls}


def update_bn() -> Made:
    return "update_bn", {}


def torch_compile(*, target: str, fullgraph: bool, backend: str) -> Made:
    """A ``torch.compile`` call (kind ``compile``)."""
    return "compile", {"target": target, "fullgraph": fullgraph, "backend": backend}


def bn_batch(*, batch: int, shape: list[int], layer: str, cls: str, turn: int) -> Made:
    return "bn_batch", {"batch": batch, "shape": shape, "layer": layer, "cls": cls, "turn": turn}


def dropout_default(*, fn: str, p: float | None, cls: str, name: str | None, grad: bool,
                    how: str = "default", mode: str = "eval") -> Made:
    return "dropout_default", {"fn": fn, "p": p, "cls": cls, "name": name, "grad": grad, "how": how,
                               "mode": mode}


def target_in_inputs(*, fn: str, column: int, columns: int, window: bool = False) -> Made:
    return "target_in_inputs", {"fn": fn, "column": column, "columns": columns, "window": window}


def full_rows_loss(*, fn: str, rows: int) -> Made:
    return "full_rows_loss", {"fn": fn, "rows": rows}


def constant_targets(*, fn: str, value, calls: int, values: int, samples: int, basis: str,
                     stage: str, ignore_index: int | None = None) -> Made:
    return "constant_targets", {"fn": fn, "value": value, "calls": calls, "values": values,
                                "samples": samples, "basis": basis, "stage": stage,
                                "ignore_index": ignore_index}


def ordinal_shifted(*, fn: str, levels: int, rows: int) -> Made:
    return "ordinal_shifted", {"fn": fn, "levels": levels, "rows": rows}


def class_weights(*, fn: str, classes: list[int], shares: list[float], weights: list[float],
                  by_hand: bool = False) -> Made:
    return "class_weights", {"fn": fn, "classes": classes, "shares": shares, "weights": weights,
                             "by_hand": by_hand}


def uniform_weight(*, fn: str, value: float, numel: int, classes: int, positives: float | None,
                   pos_weight: bool) -> Made:
    return "uniform_weight", {"fn": fn, "value": value, "numel": numel, "classes": classes,
                              "positives": positives, "pos_weight": pos_weight}


def loss_broadcast(*, fn: str, input_shape: list[int], target_shape: list[int], shape: list[int],
                   reduction: str | None, grad: bool, narrowed_from: list[int] | None = None) -> Made:
    data = {"fn": fn, "input_shape": input_shape, "target_shape": target_shape,
            "shape": shape, "reduction": reduction, "grad": grad}
    if narrowed_from is not None:  # the target is a slice of a tensor of this shape
        data["narrowed_from"] = narrowed_from
    return "loss_broadcast", data


def factor_broadcast(*, op: str, term_shape: list[int], factor_shape: list[int], shape: list[int],
                     factor_grad: bool) -> Made:
    return "factor_broadcast", {"op": op, "term_shape": term_shape, "factor_shape": factor_shape,
                                "shape": shape, "factor_grad": factor_grad}


def linear_stack(*, widths: list[int], between: list[str], called_by: str,
                 first_at: list | None, listed: bool, activations_in_model: bool, chain: int,
                 ends_in_loss: bool) -> Made:
    return "linear_stack", {"widths": widths, "between": between, "called_by": called_by,
                            "first_at": first_at, "listed": listed,
                            "activations_in_model": activations_in_model, "chain": chain,
                            "ends_in_loss": ends_in_loss}


def dropout_on_output(*, module: str, p: float, fn: str, direct: bool | None) -> Made:
    return "dropout_on_output", {"module": module, "p": p, "fn": fn, "direct": direct}


def output_discarded(*, module: str, leaf: bool, frames: list[list]) -> Made:
    return "output_discarded", {"module": module, "leaf": leaf, "frames": frames}


def pixels_scaled_twice(*, module: str, shape: list[int], low: float, high: float) -> Made:
    return "pixels_scaled_twice", {"module": module, "shape": shape, "low": low, "high": high}


def pixels_unscaled(*, module: str, shape: list[int], low: float, high: float, over: float) -> Made:
    return "pixels_unscaled", {"module": module, "shape": shape, "low": low, "high": high,
                               "over": over}


def bag_offsets(*, how: str, bags: int, items: int, drops: int, empty: int, last: int) -> Made:
    return "bag_offsets", {"how": how, "bags": bags, "items": items, "drops": drops, "empty": empty,
                           "last": last}


def grid_scale(*, how: str, low: float, high: float, outside: float, coords: int,
               size: list[int], padding: str, mode: str, grad: bool) -> Made:
    return "grid_scale", {"how": how, "low": low, "high": high, "outside": outside,
                          "coords": coords, "size": size, "padding": padding, "mode": mode,
                          "grad": grad}


def self_product_offset(*, op: str, shape: list[int], params: list[int], line: int | None = None) -> Made:
    return "self_product_offset", {"op": op, "shape": shape, "params": params, "line": line}


def placeholder_targets(*, fn: str, shape: list[int], how: str, share: float, rows: int,
                        width: int, low: float, high: float) -> Made:
    return "placeholder_targets", {"fn": fn, "shape": shape, "how": how, "share": share,
                                   "rows": rows, "width": width, "low": low, "high": high}


def channel_pool(*, op: str, shape: list[int], dims: list[int]) -> Made:
    return "channel_pool", {"op": op, "shape": shape, "dims": dims}


def distance_bias(*, shape: list[int], heads: list[int], of: int, ratio: float) -> Made:
    return "distance_bias", {"shape": shape, "heads": heads, "of": of, "ratio": ratio}


def normaliser_sign(*, op: str, sum: str, shape: list[int], negative: float, positive: float,
                    feature: str | None) -> Made:
    return "normaliser_sign", {"op": op, "sum": sum, "shape": shape, "negative": negative,
                               "positive": positive, "feature": feature}


def cells_transposed(*, shape: list[int], cells: int, inside: int, positives: int) -> Made:
    return "cells_transposed", {"shape": shape, "cells": cells, "inside": inside,
                                "positives": positives}


def ignored_mask(*, ignore_index: int, shape: list[int], ignored: int, pixels: int) -> Made:
    return "ignored_mask", {"ignore_index": ignore_index, "shape": shape, "ignored": ignored,
                            "pixels": pixels}


def padding_kept(*, op: str, fill: int, rows: int, shape: list[int], kept: float) -> Made:
    return "padding_kept", {"op": op, "fill": fill, "rows": rows, "shape": shape, "kept": kept}


def padding_pooled(*, fill: int, rows: int, shape: list[int], padded: float, axis: str) -> Made:
    return "padding_pooled", {"fill": fill, "rows": rows, "shape": shape, "padded": padded,
                              "axis": axis}


def overlap_scores(*, shape: list[int], producer: str) -> Made:
    return "overlap_scores", {"shape": shape, "producer": producer}


def weighted_class_absent(*, fn: str, cls: int, weight: float, others: float, targets: int,
                          top: int, top_share: float) -> Made:
    return "weighted_class_absent", {"fn": fn, "cls": cls, "weight": weight, "others": others,
                                     "targets": targets, "top": top, "top_share": top_share}


def easy_weighted(*, fn: str, shape: list[int], rho: float, groups: int, elements: int) -> Made:
    return "easy_weighted", {"fn": fn, "shape": shape, "rho": rho, "groups": groups,
                             "elements": elements}


def output_range(*, fn: str, activation: str, low: float, high: float | None, outside: float,
                 target_low: float, target_high: float) -> Made:
    return "output_range", {"fn": fn, "activation": activation, "low": low, "high": high,
                            "outside": outside, "target_low": target_low,
                            "target_high": target_high}


def pair_labels(*, how: str, fn: str, rows: int, columns: int, label: int | None = None,
                share: float | None = None, halves: bool | None = None) -> Made:
    return "pair_labels", {"how": how, "fn": fn, "rows": rows, "columns": columns,
                           "label": label, "share": share, "halves": halves}


def pair_pull(*, how: str, fn: str, distance: bool, shape: list[int], same_pairs: int,
              push_same: float, push_diff: float, pull_same: float, pull_diff: float,
              matrix_line: int, classes: bool = False) -> Made:
    return "pair_pull", {"how": how, "fn": fn, "distance": distance, "shape": shape,
                         "same_pairs": same_pairs, "push_same": push_same, "push_diff": push_diff,
                         "pull_same": pull_same, "pull_diff": pull_diff,
                         "matrix_line": matrix_line, "classes": classes}


def self_match(*, size: int, on_diagonal: float) -> Made:
    return "self_match", {"size": size, "on_diagonal": on_diagonal}


def gan_same_target(*, critic: str, generator: str, critic_params: list[int],
                    generator_params: list[int], cosine: float, offset: float | None,
                    samples: int, critic_step: list | None,
                    critic_fake_as_real: bool | None = None, same_samples: bool = True) -> Made:
    return "gan_same_target", {"critic": critic, "generator": generator,
                               "critic_params": critic_params, "generator_params": generator_params,
                               "cosine": cosine, "offset": offset, "samples": samples,
                               "critic_step": critic_step, "critic_fake_as_real": critic_fake_as_real,
                               "same_samples": same_samples}


def entropy_sign(*, term: str, dist: str) -> Made:
    return "entropy_sign", {"term": term, "dist": dist}


def ratio_fault(*, fault: str, dist: str | None, params: list[int], backward: int | None) -> Made:
    return "ratio_fault", {"fault": fault, "dist": dist, "params": params, "backward": backward}


def fresh_sample_scored(*, dist: str, params: list[int], acted: int | None, sampled: int | None,
                        backward: int | None) -> Made:
    return "fresh_sample_scored", {"dist": dist, "params": params, "acted": acted,
                                   "sampled": sampled, "backward": backward}


def batch_reduced_target(*, op: str, dims: list[int] | None, batch: int, shape: list[int], fn: str,
                         loss_line: int | None) -> Made:
    return "batch_reduced_target", {"op": op, "dims": dims, "batch": batch, "shape": shape,
                                    "fn": fn, "loss_line": loss_line}


def reparam_cut(*, dist: str | None, params: list[int], op: str, via: str,
                backward: int | None) -> Made:
    return "reparam_cut", {"dist": dist, "params": params, "op": op, "via": via, "backward": backward}


def advantage_grad(*, params: list[int]) -> Made:
    return "advantage_grad", {"params": params}


def policy_sign(*, dist: str, critic: str, weight: str, sign: str) -> Made:
    return "policy_sign", {"dist": dist, "critic": critic, "weight": weight, "sign": sign}


def degree_scaled(*, form: str, nodes: int, degree: int, edges: int = 0) -> Made:
    return "degree_scaled", {"form": form, "nodes": nodes, "degree": degree, "edges": edges}


def self_scatter(*, op: str, edges: int, nodes: int) -> Made:
    return "self_scatter", {"op": op, "edges": edges, "nodes": nodes}


def edges_across_graphs(*, graphs: int, nodes: int, edges: int, across: float, reached: int) -> Made:
    return "edges_across_graphs", {"graphs": graphs, "nodes": nodes, "edges": edges, "across": across,
                                   "reached": reached}


def softmax_over_edges(*, op: str, edges: int, targets: int, fn: str) -> Made:
    return "softmax_over_edges", {"op": op, "edges": edges, "targets": targets, "fn": fn}


def unshuffle_misplaced(*, rows: int, length: int, kept: int, placed: float) -> Made:
    return "unshuffle_misplaced", {"rows": rows, "length": length, "kept": kept, "placed": placed}


def token_copy(*, positions: int, lookups: int, stepwise: bool = False) -> Made:
    return "token_copy", {"positions": positions, "lookups": lookups, "stepwise": stepwise}


def token_labels_shifted(*, end: str, rows: int, values: int, classes: int, vocab: int) -> Made:
    return "token_labels_shifted", {"end": end, "rows": rows, "values": values, "classes": classes,
                                    "vocab": vocab}


def draw_twin(*, fn: str, module: str, position: int, twin_line: int | None,
              shape: list[int]) -> Made:
    return "draw_twin", {"fn": fn, "module": module, "position": position,
                         "twin_line": twin_line, "shape": shape}


def returns_order(*, steps: int, gamma: float, name: str | None) -> Made:
    return "returns_order", {"steps": steps, "gamma": gamma, "name": name}


def cumulative_order(*, op: str, case: str, key: str | None, rows: int | None,
                     dim: int | None) -> Made:
    return "cumulative_order", {"op": op, "case": case, "key": key, "rows": rows, "dim": dim}


def cumulative_axis(*, op: str, shape: list[int], dim: int, cdf: bool = False) -> Made:
    return "cumulative_axis", {"op": op, "shape": shape, "dim": dim, "cdf": cdf}


def loss_input(*, fn: str, problem: str, classes: int, normalised: int | None = None,
               source: list[int] | None = None) -> Made:
    data = {"fn": fn, "problem": problem, "classes": classes, "normalised": normalised}
    if source is not None:  # "rows": the shape the (N, C) input was reshaped from
        data["source"] = source
    return "loss_input", data


SOFT_CE = "the hand-written cross-entropy"
"""``target_domain``'s fn for the soft targets of a cross-entropy written by hand."""


def target_domain(*, fn: str, problem: str, low: float, high: float, share: float | None = None,
                  integral: bool | None = None, classes: int | None = None, blank: int | None = None,
                  detail: str | None = None) -> Made:
    return "target_domain", {"fn": fn, "problem": problem, "low": low, "high": high,
                             "share": share, "integral": integral, "classes": classes,
                             "blank": blank, "detail": detail}


def idle_forward(*, mid: int, cls: str, params: list[int], grad: bool, inference: bool,
                 training: bool, checkpoint: str | None = None, library: bool = False,
                 outer: list | None = None) -> Made:
    return "idle_forward", {"mid": mid, "cls": cls, "params": params, "grad": grad,
                            "inference": inference, "training": training, "checkpoint": checkpoint,
                            "library": library, "outer": outer or []}


def idle_detach(*, mid: int, cls: str, params: list[int]) -> Made:
    return "idle_detach", {"mid": mid, "cls": cls, "params": params}


def idle_loss(*, mid: int, cls: str, params: list[int], fn: str, unused: bool = False) -> Made:
    """``unused``: the module's output does not depend on those parameters (its forward never
    uses them), written only when so."""
    data = {"mid": mid, "cls": cls, "params": params, "fn": fn}
    if unused:
        data["unused"] = True
    return "idle_loss", data


def functional_grad(*, api: str, create_graph: bool | None = None, of_data: bool = False) -> Made:
    """``create_graph``: for ``torch.autograd.grad``, whether it was asked for (None: another
    entry point). ``of_data``: its outputs' graph reaches no leaf requiring grad but its inputs
    (a gradient of a function of data alone); the key is present only then."""
    data = {"api": api, "create_graph": create_graph}
    if of_data:
        data["of_data"] = True
    return "functional_grad", data


def param_reset(*, via: str, params: list[int], state: list | None = None,
                values: float | None = None, kept: bool | None = None) -> Made:
    return "param_reset", {"via": via, "params": params, "state": state, "values": values,
                           "kept": kept}


def reseed(*, fn: str, seed: int | None, caller: list | None = None) -> Made:
    return "reseed", {"fn": fn, "seed": seed, "caller": caller}


def hook_stacked(*, api: str, target: str, pid: int | None, shape: list[int] | None,
                 cls: str | None, copies: int, updates: int, caller: list | None = None) -> Made:
    return "hook_stacked", {"api": api, "target": target, "pid": pid, "shape": shape, "cls": cls,
                            "copies": copies, "updates": updates, "caller": caller}


def loader_sampler(*, loader: int, sampler: str, shuffle: bool | None, dataset_len: int | None,
                   reach: int | None, weights: int | None = None,
                   levels: list[tuple[float, int]] | None = None) -> Made:
    return "loader_sampler", {"loader": loader, "sampler": sampler, "shuffle": shuffle,
                              "dataset_len": dataset_len, "reach": reach, "weights": weights,
                              "levels": levels}


def batch_labels(*, loader: int, index: int, size: int, distinct: int, value: int | None,
                 classes: int | None) -> Made:
    return "batch_labels", {"loader": loader, "index": index, "size": size, "distinct": distinct,
                            "value": value, "classes": classes}


def batch_spread(*, loader: int, index: int, size: int, slot: str, mean: float, var: float,
                 low: float, high: float) -> Made:
    return "batch_spread", {"loader": loader, "index": index, "size": size, "slot": slot,
                            "mean": mean, "var": var, "low": low, "high": high}


def loaders_zipped(*, inputs: int, labels: int, length: int) -> Made:
    return "loaders_zipped", {"inputs": inputs, "labels": labels, "length": length}


def state_carried(*, cls: str, loader: int, sampler: str | None, batch: list, previous: list,
                  rows: int, shared: str, call: list | None = None) -> Made:
    return "state_carried", {"cls": cls, "loader": loader, "sampler": sampler, "batch": batch,
                             "previous": previous, "rows": rows, "shared": shared, "call": call}


def batch_pairing(*, problem: str, fn: str, loader: int, input_batch: list, target_loader: int,
                  target_batch: list, field: str, rows: int, model_line: int | None = None) -> Made:
    data = {"problem": problem, "fn": fn, "loader": loader, "input_batch": input_batch,
            "target_loader": target_loader, "target_batch": target_batch, "field": field,
            "rows": rows}
    if model_line is not None:
        data["model_line"] = model_line
    return "batch_pairing", data


def attention_mask(*, api: str, argument: str, problem: str, convention: str, **data) -> Made:
    return "attention_mask", {"api": api, "argument": argument, "problem": problem,
                              "convention": convention, **data}


def zero_weight(*, terms: int, names: list) -> Made:
    return "zero_weight", {"terms": terms, "names": names}


def smoothing_high(*, label_smoothing: float, classes: int) -> Made:
    return "smoothing_high", {"label_smoothing": label_smoothing, "classes": classes}


def label_smoothing(*, label_smoothing: float, classes: int, floor: float,
                    target_smoothing: float) -> Made:
    return "label_smoothing", {"label_smoothing": label_smoothing, "classes": classes,
                               "floor": floor, "target_smoothing": target_smoothing}


def loss_repeated(*, fn: str, first_line: int | None, params: list[int]) -> Made:
    return "loss_repeated", {"fn": fn, "first_line": first_line, "params": params}


def term_repeated(*, op: str, first_line: int | None, params: list[int]) -> Made:
    return "term_repeated", {"op": op, "first_line": first_line, "params": params}


def mixup_unmixed(*, fn: str, loader: int, batch: list, field: str, rows: int, lam: float) -> Made:
    return "mixup_unmixed", {"fn": fn, "loader": loader, "batch": batch, "field": field,
                             "rows": rows, "lam": lam}


def last_step_padded(*, module: str, rows: int, length: int, padded: int, packed: bool = False,
                     time_dim: int = 1) -> Made:
    return "last_step_padded", {"module": module, "rows": rows, "length": length, "padded": padded,
                                "packed": packed, "time_dim": time_dim}


def causal_read_early(*, module: str, positions: list[int], read: int, length: int, unread: int,
                      rows: int, seq_first: bool, direction: str | None = None) -> Made:
    fields = {"module": module, "positions": positions, "read": read, "length": length,
              "unread": unread, "rows": rows, "seq_first": seq_first}
    if direction is not None:
        fields["direction"] = direction
    return "causal_read_early", fields


def custom_backward(*, cls: str, input: int, ratio: float | None, forward: list | None,
                    identity: bool = False, names: list[str] | None = None,
                    ignores_grad: bool = False, given_to: int | None = None,
                    input_cut: bool = False, surrogate: dict | None = None) -> Made:
    fields = {"cls": cls, "input": input, "ratio": ratio, "forward": forward,
              "identity": identity, "names": names}
    if surrogate is not None:
        fields["surrogate"] = surrogate
    if ignores_grad:
        fields["ignores_grad"] = True
    if given_to is not None:
        fields["given_to"] = given_to
    if input_cut:
        fields["input_cut"] = True
    return "custom_backward", fields


def loss_padding(*, fn: str, pad: int, fraction: float, ignore_index: int | None,
                 reduction: str | None, source: str = "padding_idx") -> Made:
    return "loss_padding", {"fn": fn, "pad": pad, "fraction": fraction,
                            "ignore_index": ignore_index, "reduction": reduction, "source": source}


def masked_visible(*, how: str, counted: float, visible: float, hidden: float, by: str,
                   positions: int, features: int, normalised: bool,
                   input_at: list | None = None, ignore_index: int | None = None,
                   mask_id: int | None = None) -> Made:
    return "masked_visible", {"how": how, "counted": counted, "visible": visible, "hidden": hidden,
                              "by": by, "positions": positions, "features": features,
                              "normalised": normalised, "input_at": input_at,
                              "ignore_index": ignore_index, "mask_id": mask_id}


def prompt_trained(*, fn: str, ignore_index: int, rows: int, inverted_rows: int, offset: int,
                   kept: float, ignored_real: float) -> Made:
    return "prompt_trained", {"fn": fn, "ignore_index": ignore_index, "rows": rows,
                              "inverted_rows": inverted_rows, "offset": offset, "kept": kept,
                              "ignored_real": ignored_real}


def real_index(*, argument: str, value: int, api: str, size: int, layout: str, share: float,
               median: float | None = None, classes: int | None = None, seen: int | None = None,
               inside: int | None = None, content: int | None = None) -> Made:
    return "real_index", {"argument": argument, "value": value, "api": api, "size": size,
                          "layout": layout, "share": share, "median": median, "classes": classes,
                          "seen": seen, "inside": inside, "content": content}


def low_precision(*, opt: int, cls: str, dtype: str, what: str, eps: float | None,
                  lr: float | None, unchanged: float | None, params: int) -> Made:
    return "low_precision", {"opt": opt, "cls": cls, "dtype": dtype, "what": what, "eps": eps,
                             "lr": lr, "unchanged": unchanged, "params": params}


def graph_kept(*, name: str, holder: str, steps: int, line: int | None = None) -> Made:
    return "graph_kept", {"name": name, "holder": holder, "steps": steps, "line": line}


def grad_stops(*, params: list[int], stops: list[str], loss_zero: bool) -> Made:
    return "grad_stops", {"params": params, "stops": stops, "loss_zero": loss_zero}


def state_not_loaded(*, cls: str, keys: int, params: int, unexpected: list[str],
                     missing: list[str], prefix: list[str] | None) -> Made:
    return "state_not_loaded", {"cls": cls, "keys": keys, "params": params,
                                "unexpected": unexpected, "missing": missing, "prefix": prefix}


def diverging(*, opt: int, first: int, last: int, norms: list[float], factor: float,
              nonfinite: bool) -> Made:
    return "diverging", {"opt": opt, "first": first, "last": last, "norms": norms,
                         "factor": factor, "nonfinite": nonfinite}


def state_overwritten(*, cls: str, params: list[int], weights: int, via: list[str],
                      at: list) -> Made:
    return "state_overwritten", {"cls": cls, "params": params, "weights": weights, "via": via,
                                 "at": at}


def state_self_load(*, cls: str, params: int) -> Made:
    return "state_self_load", {"cls": cls, "params": params}


def mask_regrown(*, cls: str, param: str, mask: str, regrown: int, masked: int, steps: int,
                 defined_at: list | None, pid: int | None = None) -> Made:
    return "mask_regrown", {"cls": cls, "param": param, "mask": mask, "regrown": regrown,
                            "masked": masked, "steps": steps, "defined_at": defined_at, "pid": pid}


def mask_not_causal(*, cls: str, param: str, mask: str, kernel: list[int], open_after: list[list[int]],
                    defined_at: list | None) -> Made:
    return "mask_not_causal", {"cls": cls, "param": param, "mask": mask, "kernel": kernel,
                               "open_after": open_after, "defined_at": defined_at}


def mask_sees_itself(*, cls: str, layers: int, inputs: int, blocks: int, seen: int,
                     defined_at: list | None) -> Made:
    return "mask_sees_itself", {"cls": cls, "layers": layers, "inputs": inputs, "blocks": blocks,
                                "seen": seen, "defined_at": defined_at}


def straight_through_cancelled(*, forms: list[str], kept: list[str]) -> Made:
    return "straight_through_cancelled", {"forms": forms, "kept": kept}


def symmetric_units(*, opt: int, params: list[int], rows: list[int], step: int) -> Made:
    return "symmetric_units", {"opt": opt, "params": params, "rows": rows, "step": step}


def copies_identical(*, opt: int, groups: list[list[int]], step: int) -> Made:
    return "copies_identical", {"opt": opt, "groups": groups, "step": step}


def model_copy(*, copy: str, model: str, opt: int | None, params: int, equal: bool, forwards: int,
               targets: int, written: bool, written_step: int | None, measured: int,
               pulls: list[list], follows: list[list] | None = None, model_targets: int = 0,
               model_target_at: list | None = None, norms: int = 0,
               stale_norms: list[str] | None = None) -> Made:
    return "model_copy", {"copy": copy, "model": model, "opt": opt, "params": params, "equal": equal,
                          "forwards": forwards, "targets": targets, "written": written,
                          "written_step": written_step, "measured": measured, "pulls": pulls,
                          "follows": list(follows or ()), "model_targets": model_targets,
                          "model_target_at": model_target_at, "norms": norms,
                          "stale_norms": list(stale_norms or ())}


def decay_share(*, opt: int, cls: str, group: int, weight_decay: float, lr: float | None,
                decoupled: bool, steps: list[int], ratios: list[float]) -> Made:
    return "decay_share", {"opt": opt, "cls": cls, "group": group, "weight_decay": weight_decay,
                           "lr": lr, "decoupled": decoupled, "steps": steps, "ratios": ratios}


def eps_share(*, opt: int, cls: str, group: int, eps: float, steps: list[int],
              shares: list[float], ratios: list[float]) -> Made:
    return "eps_share", {"opt": opt, "cls": cls, "group": group, "eps": eps, "steps": steps,
                         "shares": shares, "ratios": ratios}


def activation_saturated(*, fn: str, module: str, layer: str | None, threshold: float,
                         shares: list[float], init: bool, data_input: bool) -> Made:
    return "activation_saturated", {"fn": fn, "module": module, "layer": layer,
                                    "threshold": threshold, "shares": shares, "init": init,
                                    "data_input": data_input}


def step_edit(*, opt: int, steps: list[int], back: list, share: list, home: list,
              home_share: list, redrawn: list | None = None) -> Made:
    return "step_edit", {"opt": opt, "steps": steps, "back": back, "share": share, "home": home,
                         "home_share": home_share,
                         "redrawn": redrawn if redrawn is not None else [[] for _ in steps]}


def param_created(*, owner: str, attr: str, params: list[int], step: int) -> Made:
    return "param_created", {"owner": owner, "attr": attr, "params": params, "step": step}


def optimizer_attr(*, opt: int, cls: str, name: str, key: str, value: float | None,
                   kept: list, scheduler: str | None = None) -> Made:
    return "optimizer_attr", {"opt": opt, "cls": cls, "name": name, "key": key, "value": value,
                              "kept": kept, "scheduler": scheduler}


def module_attr(*, mid: int, cls: str, name: str, value: Any, params: list[int],
                layers: list[int] | None = None) -> Made:
    return "module_attr", {"mid": mid, "cls": cls, "name": name, "value": value, "params": params,
                           "layers": layers}


def param_attr(*, pid: int, cls: str, name: str, value: Any, requires_grad: bool) -> Made:
    return "param_attr", {"pid": pid, "cls": cls, "name": name, "value": value,
                          "requires_grad": requires_grad}


def unregistered(*, owner: str, attr: str, holder: str, name: str, pids: list[int]) -> Made:
    return "unregistered", {"owner": owner, "attr": attr, "holder": holder, "name": name,
                            "pids": pids}


def snapshot_alias(*, via: str, taken: list | None, params: list[int], tensors: int, total: int,
                   steps: int) -> Made:
    return "snapshot_alias", {"via": via, "taken": taken, "params": params, "tensors": tensors,
                              "total": total, "steps": steps}


def snapshot_held(*, name: str, params: list[int], steps: int, alike: int | None = None) -> Made:
    return "snapshot_held", {"name": name, "params": params, "steps": steps, "alike": alike}


def param_replaced(*, owner: str, attr: str, via: str, old: list[int], new: list[int]) -> Made:
    return "param_replaced", {"owner": owner, "attr": attr, "via": via, "old": old, "new": new}


def module_repeated(*, container: str, cls: str, positions: list[str], params: list[int]) -> Made:
    return "module_repeated", {"container": container, "cls": cls, "positions": positions,
                               "params": params}


def norm_arguments(*, cls: str, eps: float, momentum: float | None, params: list[int]) -> Made:
    return "norm_arguments", {"cls": cls, "eps": eps, "momentum": momentum, "params": params}


def folded(*, turns: int, steps: int, backwards: int, events: int, epochs: int,
           copies: list[list[int]]) -> Made:
    return "folded", {"turns": turns, "steps": steps, "backwards": backwards, "events": events,
                      "epochs": epochs, "copies": copies}


def ddp_no_sync(*, ddp: int) -> Made:
    return "ddp_no_sync", {"ddp": ddp}


def sampler_iter(*, sampler: int, epoch: int | None, shuffle: bool,
                 set_at: list | None = None) -> Made:
    data = {"sampler": sampler, "epoch": epoch, "shuffle": shuffle}
    if set_at is not None:  # where the user's code last called set_epoch on it
        data["set_at"] = set_at
    return "sampler_iter", data


def replica_checksum(*, opt: int, step: int, value: Any, params: int, layout: int | None = None,
                     initial: Any = None, bypassed: bool = False) -> Made:
    data = {"opt": opt, "step": step, "value": value, "params": params}
    if layout is not None:  # no DDP: the optimizer's parameters' shapes and values as built
        data["layout"] = layout
        data["initial"] = initial
    if bypassed:  # a DDP was built over them, but its forward never ran (ddp-forward-bypassed)
        data["bypassed"] = True
    return "replica_checksum", data


def ddp_init(*, ddp: int, params: list[int], world: int | None) -> Made:
    return "ddp_init", {"ddp": ddp, "params": params, "world": world}


def grad_allreduce(*, opt: int, op: str, world: int, params: int, via: str, scale: float | None,
                   before: bool) -> Made:
    return "grad_allreduce", {"opt": opt, "op": op, "world": world, "params": params, "via": via,
                              "scale": scale, "before": before}


def batch_fingerprint(*, loader: int, epoch: int, index: int, value: Any, sampler: str | None,
                      replicas: list[int] | None = None) -> Made:
    return "batch_fingerprint", {"loader": loader, "epoch": epoch, "index": index, "value": value,
                                 "sampler": sampler, "replicas": replicas}


def grad_flow(*, opt: int, columns: list[list], bands: list[list]) -> Made:
    return "grad_flow", {"opt": opt, "columns": columns, "bands": bands}


def batch_layout(*, cls: str, layout: str, shape: list[int], batch: int, source: str,
                 forwards: int = 1, call: list | None = None) -> Made:
    return "batch_layout", {"cls": cls, "layout": layout, "shape": shape, "batch": batch,
                            "source": source, "forwards": forwards, "call": call}


def dependency(*, model: str, batch: int, source: str | None, mixed: bool | None, op: str | None,
               op_at: list | None, seq: dict | None, modules: list, forward: list | None) -> Made:
    return "dependency", {"model": model, "batch": batch, "source": source, "mixed": mixed,
                          "op": op, "op_at": op_at, "seq": seq, "modules": modules,
                          "forward": forward}


def internal_error(*, where: str, error: str) -> Made:
    return "internal_error", {"where": where, "error": error}


def loss_no_graph(*, fn: str, constants: int, backward: int | None) -> Made:
    return "loss_no_graph", {"fn": fn, "constants": constants, "backward": backward}


def target_grad(*, fn: str, params: list[int], input_op: str, target_op: str) -> Made:
    return "target_grad", {"fn": fn, "params": params, "input_op": input_op, "target_op": target_op}


def constraint_broken(*, opt: int, params: list[int], kinds: list[str], bounds: list, written: int,
                      broken: int, times: int, backward: list | None) -> Made:
    return "constraint_broken", {"opt": opt, "params": params, "kinds": kinds, "bounds": bounds,
                                 "written": written, "broken": broken, "times": times,
                                 "backward": backward}


def self_copy(*, params: list[int], how: str, steps: int) -> Made:
    return "self_copy", {"params": params, "how": how, "steps": steps}


def weights_edited(*, params: list[int], sampled: int, before: list | None) -> Made:
    return "weights_edited", {"params": params, "sampled": sampled, "before": before}


def weights_edit_kept(*, params: list[int], sampled: int, edited_at: list | None) -> Made:
    return "weights_edit_kept", {"params": params, "sampled": sampled, "edited_at": edited_at}


def anchor_alias(*, params: list[int], how: str) -> Made:
    return "anchor_alias", {"params": params, "how": how}


def grad_graph_unused(*, backward: list | None, steps: int) -> Made:
    return "grad_graph_unused", {"backward": backward, "steps": steps}


def softmax_axis(*, dim: int, summed: int, shape: list[int], params: list[int],
                 op: str = "softmax", cosine: bool = False, param: int | None = None) -> Made:
    # op: "softmax", or "normalize" (a division by a norm over one dimension); cosine: both
    # operands of the product are L2-normalised; param: the parameter normalised, if one is
    return "softmax_axis", {"dim": dim, "summed": summed, "shape": shape, "params": params,
                            "op": op, "cosine": cosine, "param": param}


def attention_scale(*, how: str, n: int, d: int, factor: float, shape: list[int],
                    params: list[int]) -> Made:
    return "attention_scale", {"how": how, "n": n, "d": d, "factor": factor, "shape": shape,
                               "params": params}


def masked_fill_weight(*, share: float, masked: float, rows: int, shape: list[int],
                       params: list[int], after: bool = False, multiplied: bool = False) -> Made:
    data = {"share": share, "masked": masked, "rows": rows, "shape": shape, "params": params}
    if after:
        data["after"] = True
    if multiplied:  # the scores were multiplied by a 0/1 mask, not filled
        data["multiplied"] = True
    return "masked_fill_weight", data


def stream_interleaved(*, shape: list[int], axis: int, stride: int, stream: int,
                       params: list[int]) -> Made:
    return "stream_interleaved", {"shape": shape, "axis": axis, "stride": stride,
                                  "stream": stream, "params": params}


def temperature_multiplied(*, factor: float, shape: list[int], params: list[int]) -> Made:
    return "temperature_multiplied", {"factor": factor, "shape": shape, "params": params}


def masked_mean(*, how: str, reduced: str, kept: float, elements: int, same_mask: bool,
                at_mean: bool, mask_operand: int | None = None) -> Made:
    return "masked_mean", {"how": how, "reduced": reduced, "kept": kept, "elements": elements,
                           "same_mask": same_mask, "at_mean": at_mean, "mask_operand": mask_operand}


def feature_variance(*, fn: str, shape: list[int], penalty: str) -> Made:
    return "feature_variance", {"fn": fn, "shape": shape, "penalty": penalty}


def spread_minimised(*, form: str, shape: list[int], params: list[int]) -> Made:
    return "spread_minimised", {"form": form, "shape": shape, "params": params}


def samples_pushed_up(*, fn: str, samples: int, pushed: int, above: float, consumers: int) -> Made:
    return "samples_pushed_up", {"fn": fn, "samples": samples, "pushed": pushed, "above": above,
                                 "consumers": consumers}


def norm_batch(*, shape: list[int], dims: list[int] | None, batch: int, penalty: str,
               at_backward: bool = False) -> Made:
    return "norm_batch", {"shape": shape, "dims": dims, "batch": batch, "penalty": penalty,
                          "at_backward": at_backward}


def shift_cancelled(*, consumer: str, grad: bool, value: float | None, scalar: bool,
                    classes: int) -> Made:
    return "shift_cancelled", {"consumer": consumer, "grad": grad, "value": value, "scalar": scalar,
                               "classes": classes}


def softmax_batch(*, fn: str, shape: list[int], batch: int, target: bool = False) -> Made:
    return "softmax_batch", {"fn": fn, "shape": shape, "batch": batch, "target": target}


def loglik_minimised(*, picks: int) -> Made:
    return "loglik_minimised", {"picks": picks}


def gather_batch(*, shape: list[int], index: list[int], largest: int, batch: int,
                 crossed: bool = False) -> Made:
    return "gather_batch", {"shape": shape, "index": index, "largest": largest, "batch": batch,
                            "crossed": crossed}


def weighted_reduced(*, fn: str, reduction: str, input_shape: list[int], factor_shape: list[int],
                     factor_grad: bool) -> Made:
    return "weighted_reduced", {"fn": fn, "reduction": reduction, "input_shape": input_shape,
                                "factor_shape": factor_shape, "factor_grad": factor_grad}


def reduce_batch(*, fn: str, shape: list[int], dims: list[int], batch: int,
                 batch_dim: int = 0) -> Made:
    fields = {"fn": fn, "shape": shape, "dims": dims, "batch": batch}
    if batch_dim:
        fields["batch_dim"] = batch_dim
    return "reduce_batch", fields


def class_axis(*, fn: str, shape: list[int], dim: int, picked: int, how: str) -> Made:
    return "class_axis", {"fn": fn, "shape": shape, "dim": dim, "picked": picked, "how": how}


def view_axes(*, shape_in: list[int], shape_out: list[int], params: list[int],
              classes: int | None = None, one_hot: bool = False) -> Made:
    return "view_axes", {"shape_in": shape_in, "shape_out": shape_out, "params": params,
                         "classes": classes, "one_hot": one_hot}


def shuffled_apart(*, kind: str, length: int, first: list, arrays: dict) -> Made:
    return "shuffled_apart", {"kind": kind, "length": length, "first": first, "arrays": arrays}


def input_written(*, module: str, argument: str, forward: list, view: bool, rows: int,
                  batch: int) -> Made:
    return "input_written", {"module": module, "argument": argument, "forward": forward,
                             "view": view, "rows": rows, "batch": batch}


def rows_misaligned(*, fn: str, scores_from: list[int], scores: list[int], target_from: list[int],
                    target: list[int]) -> Made:
    return "rows_misaligned", {"fn": fn, "scores_from": scores_from, "scores": scores,
                               "target_from": target_from, "target": target}


def same_compared(*, how: str, op: str, core: str, shape: list | None, params: list[int],
                  starts: list[str]) -> Made:
    return "same_compared", {"how": how, "op": op, "core": core, "shape": shape, "params": params,
                             "starts": starts}


def aggregate_sum(*, op: str, batched: bool, differ: float, rows: int) -> Made:
    return "aggregate_sum", {"op": op, "batched": batched, "differ": differ, "rows": rows}


def field_rows(*, api: str, rows: int, fields: int, calls: int, sizes: list[int], covered: int,
               top: int) -> Made:
    return "field_rows", {"api": api, "rows": rows, "fields": fields, "calls": calls,
                          "sizes": sizes, "covered": covered, "top": top}


def table_columns_unit(*, api: str, rows: int, cols: int, steps: int, read: int) -> Made:
    return "table_columns_unit", {"api": api, "rows": rows, "cols": cols, "steps": steps,
                                  "read": read}


def noise_redrawn(*, fn: str, params: list[int], numel: int) -> Made:
    return "noise_redrawn", {"fn": fn, "params": params, "numel": numel}


def constant_term(*, name: str, value: float, loss_low: float, loss_high: float,
                  params: list[int], origin: str | None = None) -> Made:
    return "constant_term", {"name": name, "value": value, "loss_low": loss_low,
                             "loss_high": loss_high, "params": params, "origin": origin}


def batch_reduction(*, summed: str, averaged: str, batch: int, averaged_rows: int,
                    summed_name: str | None, averaged_name: str | None,
                    broadcast: bool = False, times_reciprocal: bool = False) -> Made:
    return "batch_reduction", {"summed": summed, "averaged": averaged, "batch": batch,
                               "averaged_rows": averaged_rows, "summed_name": summed_name,
                               "averaged_name": averaged_name, "broadcast": broadcast,
                               "times_reciprocal": times_reciprocal}


def sample_range(*, critic: str, generator: str, activation: str, low: float, high: float | None,
                 data_min: float, data_max: float, outside: float, how: str, name: str | None) -> Made:
    return "sample_range", {"critic": critic, "generator": generator, "activation": activation,
                            "low": low, "high": high, "data_min": data_min, "data_max": data_max,
                            "outside": outside, "how": how, "name": name}


def sampled_scores(*, scores: list[dict], draws: dict, line: int | None = None,
                   ranges: list[dict] | None = None) -> Made:
    data = {"scores": scores, "draws": draws, "line": line}
    if ranges:
        data["ranges"] = ranges
    return "sampled_scores", data


def log_scale_reversed(*, linear: float, exp: float, op: str, params: list[int], bounded: bool,
                       line: int | None = None, power: bool = False) -> Made:
    data = {"linear": linear, "exp": exp, "op": op, "params": params, "bounded": bounded, "line": line}
    if power:
        data["power"] = True
    return "log_scale_reversed", data


def log_det_positions(*, op: str, positions: int, params: list[int], line: int | None = None) -> Made:
    return "log_det_positions", {"op": op, "positions": positions, "params": params, "line": line}


def flow_identity_dims(*, dims: list[int], features: int, line: int | None = None) -> Made:
    return "flow_identity_dims", {"dims": dims, "features": features, "line": line}


def concave_term(*, form: str, negative: float, line: int | None = None) -> Made:
    return "concave_term", {"form": form, "negative": negative, "line": line}


def loss_term_params(*, terms: list[dict], line: int | None = None) -> Made:
    return "loss_term_params", {"terms": terms, "line": line}


def loss_unbounded(*, term: str, op: str, params: list[int], line: int | None = None) -> Made:
    return "loss_unbounded", {"term": term, "op": op, "params": params, "line": line}


def loss_derived_weight(*, kinds: list[str], terms: int) -> Made:
    return "loss_derived_weight", {"kinds": kinds, "terms": terms}


def loss_weight_learned(*, params: list[int], kinds: list[str], terms: int, backwards: int,
                        elements: list | None = None, line: int | None = None,
                        reversed: list | None = None) -> Made:
    return "loss_weight_learned", {"params": params, "kinds": kinds, "terms": terms,
                                   "backwards": backwards,
                                   "elements": elements if elements is not None else [None for _ in params],
                                   "line": line,
                                   "reversed": reversed if reversed is not None else [False for _ in params]}


def dataset_drift(*, cls: str, attr: str, numpy: bool, rows: int, fetches: int) -> Made:
    return "dataset_drift", {"cls": cls, "attr": attr, "numpy": numpy, "rows": rows,
                             "fetches": fetches}


def augment_misaligned(*, cls: str, image: Any, mask: Any, op: str, moved: str,
                       shape: list[int]) -> Made:
    return "augment_misaligned", {"cls": cls, "image": image, "mask": mask, "op": op,
                                  "moved": moved, "shape": shape}


def target_remapped(*, fn: str, shape: list[int], how: str, **detail: Any) -> Made:
    return "target_remapped", {"fn": fn, "shape": shape, "how": how, **detail}


def label_map_averaged(*, cls: str | None, field: Any, op: str, mode: str, levels: list[int],
                       new: list[int], share: float, shape: list[int]) -> Made:
    return "label_map_averaged", {"cls": cls, "field": field, "op": op, "mode": mode,
                                  "levels": levels, "new": new, "share": share, "shape": shape}


def collate_reordered(*, collate: str, moved: Any, kept: Any, rows: int, displaced: int) -> Made:
    return "collate_reordered", {"collate": collate, "moved": moved, "kept": kept, "rows": rows,
                                 "displaced": displaced}


def label_offset(*, cls: str, inputs: str, labels: str, offset: int, samples: int,
                 field: Any, sliced: list | None = None) -> Made:
    """``sliced``: ``[rows, input_start, label_start]`` when the dataset's two tensors are row
    slices of two tables at different starts (``TensorDataset(x[:n], y[k:k + n])``), at the
    dataset's construction."""
    return "label_offset", {"cls": cls, "inputs": inputs, "labels": labels, "offset": offset,
                            "samples": samples, "field": field, "sliced": sliced}


def loader_rows(*, loader: int, base: int, rows: int, shared: list, made: list | None,
                copied: list | None = None) -> Made:
    return "loader_rows", {"loader": loader, "base": base, "rows": rows, "shared": shared,
                           "made": made, "copied": copied or []}


def run_end(*, status: str, steps: int) -> Made:
    return "run_end", {"status": status, "steps": steps}


CONSTRUCTORS: dict[str, Callable[..., Made]] = {
    "run_start": run_start, "param": param, "grad_flow": grad_flow, "optimizer_init": optimizer_init,
    "backward": backward, "clear": clear, "step_begin": step_begin, "step": step,
    "epoch_start": epoch_start, "short_len": short_len, "phase_hold": phase_hold, "unscale": unscale, "scaler_step": scaler_step,
    "scaler_update": scaler_update, "scaler_init": scaler_init, "scaler_load": scaler_load,
    "clip": clip, "grad_edit": grad_edit,
    "scheduler_step": scheduler_step, "scheduler_init": scheduler_init, "train": mode_set, "eval": mode_set,
    "mode_module": mode_module, "mode_forward": mode_forward, "freeze": freeze,
    "bn_reset": bn_reset, "update_bn": update_bn, "compile": torch_compile,
    "dropout_default": dropout_default, "loss_broadcast": loss_broadcast, "loss_input": loss_input,
    "factor_broadcast": factor_broadcast,
    "target_domain": target_domain,
    "class_weights": class_weights, "uniform_weight": uniform_weight, "target_in_inputs": target_in_inputs,
    "ordinal_shifted": ordinal_shifted,
    "full_rows_loss": full_rows_loss, "constant_targets": constant_targets,
    "idle_forward": idle_forward, "idle_loss": idle_loss, "idle_detach": idle_detach,
    "functional_grad": functional_grad,
    "reseed": reseed, "hook_stacked": hook_stacked, "param_reset": param_reset, "loader_sampler": loader_sampler, "custom_backward": custom_backward,
    "loss_padding": loss_padding, "prompt_trained": prompt_trained, "masked_visible": masked_visible, "real_index": real_index, "low_precision": low_precision, "graph_kept": graph_kept,
    "grad_stops": grad_stops, "target_grad": target_grad, "noise_redrawn": noise_redrawn, "anchor_alias": anchor_alias, "constraint_broken": constraint_broken, "grad_graph_unused": grad_graph_unused, "weights_edited": weights_edited, "weights_edit_kept": weights_edit_kept, "self_copy": self_copy,
    "loss_unbounded": loss_unbounded, "loss_term_params": loss_term_params, "sampled_scores": sampled_scores, "log_scale_reversed": log_scale_reversed, "log_det_positions": log_det_positions, "flow_identity_dims": flow_identity_dims, "concave_term": concave_term, "loss_weight_learned": loss_weight_learned, "loss_derived_weight": loss_derived_weight, "batch_reduction": batch_reduction, "constant_term": constant_term,
    "sample_range": sample_range, "softmax_axis": softmax_axis, "view_axes": view_axes, "rows_misaligned": rows_misaligned, "shuffled_apart": shuffled_apart, "input_written": input_written, "loss_repeated": loss_repeated,
    "term_repeated": term_repeated,
    "softmax_batch": softmax_batch,
    "reduce_batch": reduce_batch,
    "gather_batch": gather_batch,
    "loglik_minimised": loglik_minimised,
    "weighted_reduced": weighted_reduced,
    "class_axis": class_axis,
    "shift_cancelled": shift_cancelled,
    "norm_batch": norm_batch,
    "samples_pushed_up": samples_pushed_up,
    "feature_variance": feature_variance,
    "spread_minimised": spread_minimised,
    "masked_mean": masked_mean,
    "attention_scale": attention_scale,
    "masked_fill_weight": masked_fill_weight,
    "stream_interleaved": stream_interleaved,
    "temperature_multiplied": temperature_multiplied,
    "same_compared": same_compared,
    "field_rows": field_rows, "table_columns_unit": table_columns_unit,
    "aggregate_sum": aggregate_sum,
    "optimizer_attr": optimizer_attr, "module_attr": module_attr, "param_attr": param_attr,
    "unregistered": unregistered, "param_replaced": param_replaced,
    "module_repeated": module_repeated, "norm_arguments": norm_arguments,
    "output_range": output_range, "advantage_grad": advantage_grad, "policy_sign": policy_sign, "degree_scaled": degree_scaled, "self_scatter": self_scatter, "softmax_over_edges": softmax_over_edges, "edges_across_graphs": edges_across_graphs, "token_copy": token_copy, "unshuffle_misplaced": unshuffle_misplaced, "token_labels_shifted": token_labels_shifted, "cumulative_order": cumulative_order, "cumulative_axis": cumulative_axis, "returns_order": returns_order, "draw_twin": draw_twin, "grid_scale": grid_scale, "bag_offsets": bag_offsets, "channel_pool": channel_pool, "normaliser_sign": normaliser_sign, "distance_bias": distance_bias, "easy_weighted": easy_weighted, "weighted_class_absent": weighted_class_absent, "overlap_scores": overlap_scores, "ignored_mask": ignored_mask, "padding_kept": padding_kept, "cells_transposed": cells_transposed, "placeholder_targets": placeholder_targets,
    "pixels_unscaled": pixels_unscaled, "self_product_offset": self_product_offset,
    "pixels_scaled_twice": pixels_scaled_twice, "dropout_on_output": dropout_on_output,
    "output_discarded": output_discarded,
    "linear_stack": linear_stack, "bn_batch": bn_batch,
    "gan_same_target": gan_same_target, "entropy_sign": entropy_sign, "self_match": self_match,
    "pair_labels": pair_labels,
    "pair_pull": pair_pull,
    "ratio_fault": ratio_fault, "reparam_cut": reparam_cut, "loss_no_graph": loss_no_graph,
    "fresh_sample_scored": fresh_sample_scored, "batch_reduced_target": batch_reduced_target,
    "snapshot_alias": snapshot_alias, "snapshot_held": snapshot_held, "folded": folded,
    "padding_pooled": padding_pooled,
    "ddp_no_sync": ddp_no_sync, "ddp_init": ddp_init, "sampler_iter": sampler_iter,
    "replica_checksum": replica_checksum, "batch_layout": batch_layout,
    "batch_fingerprint": batch_fingerprint, "batch_labels": batch_labels,
    "batch_spread": batch_spread,
    "grad_allreduce": grad_allreduce, "dependency": dependency,
    "param_created": param_created, "loaders_zipped": loaders_zipped, "batch_pairing": batch_pairing,
    "state_carried": state_carried,
    "last_step_padded": last_step_padded, "causal_read_early": causal_read_early,
    "attention_mask": attention_mask,
    "label_smoothing": label_smoothing, "mixup_unmixed": mixup_unmixed,
    "zero_weight": zero_weight, "smoothing_high": smoothing_high,
    "symmetric_units": symmetric_units, "copies_identical": copies_identical, "mask_regrown": mask_regrown,
    "mask_not_causal": mask_not_causal, "mask_sees_itself": mask_sees_itself,
    "straight_through_cancelled": straight_through_cancelled, "state_not_loaded": state_not_loaded,
    "state_overwritten": state_overwritten,
    "state_self_load": state_self_load, "diverging": diverging,
    "step_edit": step_edit, "decay_share": decay_share, "eps_share": eps_share,
    "activation_saturated": activation_saturated, "model_copy": model_copy,
    "dataset_drift": dataset_drift, "label_offset": label_offset, "loader_rows": loader_rows,
    "augment_misaligned": augment_misaligned, "target_remapped": target_remapped,
    "label_map_averaged": label_map_averaged, "collate_reordered": collate_reordered,
    "internal_error": internal_error, "run_end": run_end,
}
"""kind -> its constructor (``train`` and ``eval`` share ``mode_set``)."""

ASIDE_KINDS = frozenset({"self_product_offset", "dropout_default", "class_weights", "uniform_weight", "ordinal_shifted", "target_in_inputs", "full_rows_loss", "constant_targets", "loss_broadcast", "factor_broadcast", "loss_input", "target_domain", "idle_forward", "idle_loss", "idle_detach",
                         "functional_grad",
                         "optimizer_attr", "module_attr", "param_attr", "short_len", "phase_hold", "param_replaced", "reseed",
                         "hook_stacked", "param_reset", "snapshot_alias", "snapshot_held",
                         "loader_sampler", "custom_backward", "loss_padding", "prompt_trained", "real_index", "low_precision",
                         "graph_kept", "grad_stops", "batch_layout", "batch_labels", "batch_spread",
                         "param_created", "loaders_zipped", "symmetric_units", "copies_identical", "mask_regrown", "mask_not_causal", "mask_sees_itself", "straight_through_cancelled", "dependency",
                         "module_repeated", "state_not_loaded", "state_overwritten", "state_self_load", "diverging",
                         "norm_arguments",
                         "output_range", "target_grad", "noise_redrawn", "anchor_alias", "constraint_broken", "grad_graph_unused", "loss_unbounded", "loss_term_params", "sampled_scores", "log_scale_reversed", "log_det_positions", "flow_identity_dims", "concave_term", "loss_weight_learned", "loss_derived_weight", "batch_reduction", "constant_term", "sample_range", "advantage_grad", "grid_scale", "bag_offsets", "channel_pool", "normaliser_sign", "distance_bias", "easy_weighted", "overlap_scores", "weighted_class_absent", "ignored_mask", "padding_kept", "cells_transposed", "placeholder_targets", "weights_edited", "weights_edit_kept", "self_copy",
                         "same_compared", "aggregate_sum",
                         "gan_same_target", "entropy_sign", "policy_sign", "degree_scaled", "self_scatter", "softmax_over_edges", "edges_across_graphs", "token_copy", "unshuffle_misplaced", "token_labels_shifted", "step_edit", "decay_share", "eps_share",
                         "activation_saturated", "ratio_fault", "reparam_cut",
                         "fresh_sample_scored", "batch_reduced_target", "loss_no_graph", "self_match", "pair_labels", "pair_pull", "batch_pairing", "last_step_padded",
                         "state_carried",
                         "padding_pooled",
                         "causal_read_early", "pixels_unscaled", "pixels_scaled_twice", "dropout_on_output", "output_discarded", "linear_stack", "bn_batch",
                         "attention_mask", "label_smoothing", "zero_weight", "smoothing_high",
                         "mixup_unmixed", "softmax_axis", "view_axes", "rows_misaligned", "shuffled_apart", "input_written", "loss_repeated", "term_repeated", "softmax_batch", "reduce_batch", "gather_batch", "loglik_minimised", "weighted_reduced", "class_axis", "masked_visible", "shift_cancelled", "norm_batch", "samples_pushed_up", "feature_variance", "spread_minimised", "masked_mean", "attention_scale", "masked_fill_weight", "stream_interleaved",
                         "temperature_multiplied", "dataset_drift", "label_offset", "loader_rows",
                         "augment_misaligned", "cumulative_order", "cumulative_axis", "returns_order", "draw_twin",
                         "target_remapped", "label_map_averaged", "collate_reordered"})
"""Observations made inside a forward or between two calls (``Recorder.emit_aside``): they close
no aggregate, and the analysis and the timeline treat them as details, not as calls of the loop
(an attribute assignment is no call, and only its line's first one is recorded: as a call it
would set the first turn apart from the identical later ones)."""


# -- how the loop's turns name events --------------------------------------------------------
# The report's update timeline (analysis/turns.py) and the recorder's folding
# (instrument/fold.py) cut the trace into the same turns of the training loop, so they share
# this vocabulary; it lives here, below both.

# Short label per event kind; extend it when you add a kind worth naming differently.
CALL_LABELS = {
    "backward": "backward",
    "clear": "zero_grad",
    "step": "step",
    "clip": "clip",
    "unscale": "unscale",
    "scale": "scale",
    "scaler_scale": "scale",
    "scaler_step": "scaler.step",
    "scaler_update": "scaler.update",
    "scheduler_step": "sched.step",
    "train": "train()",
    "eval": "eval()",
    "epoch_start": "epoch",
    "freeze": "requires_grad_(False)",
    "bn_reset": "reset_running_stats()",
    "update_bn": "update_bn()",
    "grad_edit": "grad edit",
    "ddp_no_sync": "no_sync",
    "compile": "compile",
}
# Never calls: set-up, bookkeeping, the numeric summary that accompanies a step.
NOT_CALLS = {"run_start", "run_end", "param", "optimizer_init", "scheduler_init", "internal_error",
             "scaler_init", "scaler_load",  # set-up of a GradScaler, like optimizer_init
             "ddp_init",  # set-up, like optimizer_init
             "step_begin",
             "unregistered",  # end-of-run facts about the modules, like ``param``
             "sampler_iter",  # a DistributedSampler's epoch: the DataLoader's epoch shows already
             "replica_checksum",  # bookkeeping after a step
             "batch_fingerprint",  # bookkeeping before a backward: the batch's checksum
             "grad_allreduce",  # bookkeeping at a step: what the script's all-reduce made
             "grad_flow",  # the per-update gradient norms for the pictures, written at the end
             "model_copy",  # what a copy of the model did over the run, written at the end
             "field_rows",  # a lookup site's fields over the run, written at the end
             "table_columns_unit",  # a table's norms over the run, written at the end
             "folded",  # stands for turns the recorder folded out; the timeline counts them apart
             "mode_module", *ASIDE_KINDS}  # aside kinds: details of a forward or a loss call
# A call that makes another one internally at the same line shows once: scaler.step(opt) runs
# unscale_ (when the user did not) and optimizer.step(); scaler.scale(loss).backward() is one call.
ABSORBS = {"scaler.step": {"step", "unscale"}, "backward": {"scale"}}


def is_per_forward(kind: str) -> bool:
    """Forward passes of modules (BatchNorm, dropout, ...) happen many times per update."""
    return "forward" in kind
