from __future__ import annotations

import ast

import re

from ..analysis.basics import written
from ..findings import Severity
from ..trace import Location
from .base import Rule, related
from ..analysis.source import walk

# autograd nodes whose gradient is zero everywhere (or zero once saturated), by what the script
# calls: the names searched in its source for the line to change, and what to do instead
_KINDS = {
    "Round": ("zero", ("round",)), "Floor": ("zero", ("floor",)), "Ceil": ("zero", ("ceil",)),
    "Trunc": ("zero", ("trunc", "fix")), "Sign": ("zero", ("sign",)), "Sgn": ("zero", ("sgn",)),
    "Clamp": ("saturated", ("clamp", "clip", "clamp_", "clip_")),
    "ClampMin": ("saturated", ("clamp", "clip", "clamp_min", "clamp_", "clip_")),
    "ClampMax": ("saturated", ("clamp", "clip", "clamp_max", "clamp_", "clip_")),
    "Hardtanh": ("saturated", ("hardtanh", "Hardtanh", "relu6", "ReLU6")),
    "Relu": ("dead", ("relu", "ReLU", "relu_")), "Threshold": ("dead", ("relu", "ReLU", "threshold", "Threshold")),
    "NativeDropout": ("dropped", ("dropout", "Dropout")),
    # a softmax over a dimension of length 1 is constant (1; 0 for log_softmax): attention
    # pooling over a (B, T, 1) score with dim=-1
    "Softmax": ("constant", ("softmax", "Softmax")),
    "LogSoftmax": ("constant", ("log_softmax", "LogSoftmax", "cross_entropy")),
    # a selection that drops the part of an output those parameters make (h_n[-1] of a
    # bidirectional RNN keeps one direction): found by the module's own call
    "Stack": ("part", ()), "Cat": ("part", ()), "Select": ("part", ()), "Slice": ("part", ()),
    "Split": ("part", ()), "SplitWithSizes": ("part", ()), "Unbind": ("part", ()),
    "Narrow": ("part", ()),
    # the gradient cannot pass a layer whose weight is all zero (zero initialisation)
    "ZeroWeights": ("zero_weights", ("zeros_", "constant_", "zero_", "fill_")),
    # nor reach the weights of a layer whose input is all zero: found by the layer's own call
    "ZeroInput": ("zero_input", ()),
    # nor either factor of a product of two that are both all zero (two embeddings initialised
    # to 0 whose lookups are multiplied): each one's gradient is the other
    "ZeroFactors": ("zero_factors", ("zeros_", "constant_", "zero_", "fill_")),
    # nor the branch of a product whose other factor is a constant that is 0 at every update: a
    # gate (Flamingo's tanh gate, ReZero's alpha) kept as a plain tensor, not a parameter
    "ZeroConstant": ("zero_constant", ()),
}


_RECURRENT_STATE = re.compile(r"(^|\.)(weight|bias)_hh_")


def _op(node_name: str) -> str:
    """``RoundBackward0`` -> ``Round``; a layer whose weight is all zero (``AddmmBackward0:
    zero_weights``, marked by the diagnosis) -> ``ZeroWeights``."""
    if node_name.endswith(":zero_weights"):
        return "ZeroWeights"
    if node_name.endswith(":zero_input"):
        return "ZeroInput"
    if node_name.endswith(":zero_factors"):
        return "ZeroFactors"
    if node_name.endswith(":zero_constant"):
        return "ZeroConstant"
    return node_name.split("Backward", 1)[0]


def _module_attrs(a, pids) -> tuple[str, ...]:
    """The attribute names of the modules that hold ``pids`` (``model.lstm.weight_ih_l0`` ->
    ``lstm``): the script calls them as ``self.lstm(x)``."""
    names = []
    for pid in pids:
        parts = a.param_name(pid).split(" ")[0].split(".")
        if len(parts) >= 2:
            names.append(parts[-2])
    return tuple(dict.fromkeys(names))


def _containers(a, pids) -> tuple[str, ...]:
    """The nearest named attribute above the modules of ``pids`` that are indexed
    (``flow.layers.1.net.0.weight`` -> ``net``), the model's own name left out."""
    names = []
    for pid in pids:
        parts = a.param_name(pid).split(" ")[0].split(".")[:-1]
        for part in reversed(parts[1:]):
            if not part.isdigit():
                names.append(part)
                break
    return tuple(dict.fromkeys(names))


def _roots(a, pids) -> tuple[str, ...]:
    """The names the script holds the models of ``pids`` by (``model.0.weight`` -> ``model``)."""
    names = []
    for pid in pids:
        parts = a.param_name(pid).split(" ")[0].split(".")
        if len(parts) >= 2:
            names.append(parts[0])
    return tuple(dict.fromkeys(names))


def _converged(stop) -> bool:
    """A loss of exactly 0 that is not a product with 0: a fit that is perfect (a hinge loss
    whose margins are all met, a regression on data it reproduces exactly) has nothing left to
    learn, and a zero gradient is right. A loss that is 0 because a (log-)softmax stops the
    gradient is no fit: over one class it is constant whatever the model outputs (cross_entropy
    of a single logit per sample is 0 for every input)."""
    return stop[1] and _op(stop[0]) != "Mul" and _KINDS.get(_op(stop[0]), ("",))[0] != "constant"


class GradsAlwaysZero(Rule):
    """
    ## What it does
    Finds parameters an optimizer steps whose gradient is exactly zero at every update the run
    measured, because the gradient stops at an operation on its way from the loss: `round`,
    `floor`, `sign` (their derivative is zero everywhere), a `clamp` or ReLU that is saturated or
    dead for every sample, a selection that drops the part of an output they make (`h_n[-1]` of a
    bidirectional LSTM keeps only one direction), a softmax over a dimension of length 1 (attention
    pooling over `(B, T, 1)` scores with `dim=-1`: always 1; `cross_entropy` over one logit per
    sample, whose loss is 0 for every input), a layer whose weights are all zero (every layer
    initialised with `nn.init.zeros_`; an embedding, sparse or dense, at zero under a layer at
    zero), a product of two factors that are both all zero (matrix factorisation's user and item
    embeddings both initialised to 0: each one's gradient is the other), a layer whose input is all zero at every update (the data
    multiplied by a mask of zeros, a placeholder tensor fed instead of the batch: its weights get
    nothing and its output ignores the data), a branch multiplied by a gate that the script's
    `__init__` makes as a plain tensor of zeros instead of an `nn.Parameter` (Flamingo's tanh
    gate `self.attn_gate = torch.zeros(1)`, ReZero's alpha: the optimizer never moves it, so it
    stays 0; pointed at that assignment). It also finds an optimizer all of whose gradients have become exactly
    zero (a loss multiplied by 0, an output clamped outside the targets' range). graddoctor
    reads the norms it already measures; after an update with zero gradients it follows one
    backward through the graph to the node where the gradient stops, and points at that call in
    the script.

    ## Why is this bad?
    A zero gradient moves nothing: those parameters keep their initial values (only weight
    decay shrinks them) while the loss goes down through the rest of the model, so nothing
    looks broken. Quantising activations with `torch.round` in `forward` without a
    straight-through estimator freezes every layer before it.

    ## Example
    ```python
    def forward(self, x):
        h = torch.sigmoid(self.enc(x))
        h = torch.round(h * 15) / 15
        return self.head(h)
    ```

    ## Use instead
    ```python
    def forward(self, x):
        h = torch.sigmoid(self.enc(x))
        q = torch.round(h * 15) / 15
        h = h + (q - h).detach()  # straight-through estimator
        return self.head(h)
    ```

    ## Stays silent on
    A straight-through estimator; a gradient that is zero at the first updates only (LoRA's B,
    a zero-initialised gate, a residual branch's or a "zero convolution"'s last layer start at
    zero and move at the first step); parameters that get no gradient at all (None:
    `param-without-grad`); gradients cleared by hand (`grads-cleared-before-step`); part of a
    model reached only through a multiplication by zero (`0 * sum(p.sum() ...)`, which keeps
    unused parameters in DDP's graph on purpose) or by a plain zero tensor the file sets again
    elsewhere (a gate a schedule opens by hand); a loss that is exactly 0 because the fit is
    perfect (a hinge loss whose margins are all met, constant data reproduced exactly); a layer
    whose input is zero at some updates only or in part (an RNN cell's first, zero hidden state;
    the layer after a zero-initialised one; masked features; padding rows); steps whose norms
    were not measured.
    """

    code = "GD124"
    slug = "grads-always-zero"
    severity = Severity.WARNING
    summary = ("the gradients of stepped parameters are exactly zero at every update: the "
               "gradient stops at an op (round, a saturated clamp, a dead ReLU) and they never train")
    fix = ("let the gradient through: a straight-through estimator around round/sign/floor "
           "(`x + (x.round() - x).detach()`), a clamp range that holds the targets")

    def check(self, a):
        stops = a.by_kind.get("grad_stops", ())
        if not stops:
            return
        windows = a.ledger.windows
        for opt, steps in a.applied_steps.items():
            owned = set(a.opt_params.get(opt, ()))
            measured = [m for step in steps if (m := self._measured(a, step, owned, windows)) is not None]
            if len(measured) < 2:
                continue
            finding = self._whole(a, opt, measured, stops) or self._partial(a, opt, measured, stops)
            if finding is not None:
                yield finding

    @staticmethod
    def _measured(a, step, owned: set, windows):
        """``(step, written pids, zero pids)`` of a step whose gradients were measured."""
        window = windows.get(step.seq)
        if not window:
            return None
        pids = {p for b in window for p in written(b) if p in owned}
        if not pids:
            return None
        norms, edited = a.measured_at(step, window[-1].seq)
        if norms is None:
            return None
        pids -= edited
        return step, pids, {p for p in pids if norms.get(p) == 0.0}

    def _whole(self, a, opt, measured, stops):
        """Every gradient the optimizer's last two measured updates applied is zero."""
        def all_zero(m) -> bool:
            return bool(m[1]) and m[2] == m[1]

        if not all(map(all_zero, measured[-2:])):
            return None
        first = len(measured) - 2
        while first > 0 and all_zero(measured[first - 1]):
            first -= 1
        pids = set(measured[-1][1])
        stop = self._stop_for(stops, pids, allow_mul=True)
        if stop is None:
            return None  # not diagnosed: where (and whether) the gradient stops is unknown
        if _op(stop[0]) == "ZeroConstant":  # the whole loss times 0: a factor of the loss
            stop = (stop[0].split(":", 1)[0],) + tuple(stop[1:])
        if _converged(stop):
            return None
        since = measured[first][0] if first > 0 else None
        return self._finding(a, opt, measured, pids, stop, whole=True, since=since)

    def _partial(self, a, opt, measured, stops):
        """Parameters whose every measured gradient was zero (written at two updates or more)."""
        seen: dict[int, int] = {}
        nonzero: set = set()
        for _, pids, zero in measured:
            for p in pids:
                seen[p] = seen.get(p, 0) + 1
            nonzero |= pids - zero
        always = {p for p, n in seen.items() if n >= 2 and p not in nonzero}
        if not always:
            return None
        # a stop the rule always knows first; a product with a constant zero only when the
        # source shows a gate kept as a plain tensor (below)
        stop = self._stop_for(stops, always, allow_mul=False, constant=False) \
            or self._stop_for(stops, always, allow_mul=False)
        if stop is None or _converged(stop):
            return None
        pids = always & set(stop[2])
        if _op(stop[0]) == "ZeroConstant":
            gate = self._constant_gate(a, stop[3], pids)
            if gate is None:
                # a part of the model multiplied by 0 with no plain-tensor gate in the source:
                # DDP's `0 * sum(p.sum() ...)` keeping unused parameters in the graph on purpose
                return None
            # only the parameters of the modules the gated branch calls
            pids = {p for p in pids if (set(_module_attrs(a, [p])) | set(_containers(a, [p]))) & gate[5]}
            if not pids:
                return None
        if _op(stop[0]) == "ZeroInput":
            # a recurrent layer's hidden-to-hidden weights meet the zero initial state: read at
            # its first position only, that is the position's own business (a bidirectional
            # RNN's out[:, 0]), not data that never arrives
            pids = {p for p in pids if not _RECURRENT_STATE.search(a.param_name(p))}
            if not pids:
                return None
        return self._finding(a, opt, measured, pids, stop, whole=False, since=None)

    @staticmethod
    def _stop_for(stops, pids: set, allow_mul: bool, constant: bool = True):
        """``(node name, loss was 0, its params, the event)`` of the first diagnosis that reaches
        ``pids`` and names a node this case accepts."""
        for event in stops:
            reached = set(event.get("params") or ())
            if not reached & pids:
                continue
            for name in event.get("stops") or ():
                if not constant and _op(name) == "ZeroConstant":
                    continue
                if _op(name) in _KINDS or allow_mul:
                    return name, bool(event.get("loss_zero")), reached & pids, event
        return None

    def _finding(self, a, opt, measured, pids, stop, whole: bool, since):
        cls = a.optimizer_class(opt) or "the optimizer"
        name, _, _, event = stop
        op = _op(name) if name else None
        how, calls = _KINDS.get(op, ("other", ())) if op else ("other", ())
        if op == "Mul" and whole:
            how = "factor"
        if how in ("part", "zero_input"):
            calls = _module_attrs(a, pids)
        if how == "zero_input" and not self._call_site(a, event, calls)[0]:
            # a Sequential's layers have no names to call: the Sequential's own attribute
            # (`self.net(h)` for `flow.layers.1.net.0`), else the model's call
            calls = _containers(a, pids)
            if not calls or not self._call_site(a, event, calls)[0]:
                calls = _roots(a, pids)
        loc, call_text = self._call_site(a, event, calls, prefer="weight" if how in ("zero_weights", "zero_factors") else None)
        gate = self._constant_gate(a, event, pids) if how == "zero_constant" else None
        if gate is not None:
            loc, call_text = Location(event.loc.path, gate[0]), gate[1]
        if op == "Mul" and whole and event is not None and event.loc is not None:
            assigned = a.source.loss_assignment(event.loc.path, event.loc.line)
            if assigned is not None:  # a factor of the loss that is 0
                loc, call_text = Location(event.loc.path, assigned[0]), assigned[1]
        upper_layers = how == "part" and _upper_layers_only(a, pids)
        if upper_layers and loc is not None:
            read = _state_read(a.source.tree(loc.path), loc.line)
            if read is not None:
                loc, call_text = Location(loc.path, read[0]), read[1]
        if loc is None and event is not None:
            loc = event.loc
        if loc is None:
            loc = measured[-1][0].loc
        updates = len(measured)
        where = f"`{call_text}`" if call_text else (f"`{name}`" if name else "an operation")
        reason = {
            "zero": f"{where} has a zero derivative everywhere, so no gradient passes it",
            "saturated": f"{where} is saturated for every element (all values outside its range), "
                         "so no gradient passes it",
            "dead": f"{where} is inactive for every element (a dead ReLU layer), so no gradient passes it",
            "dropped": f"{where} drops every element",
            "constant": (f"{where} gives the same output whatever its input (a softmax over a "
                         f"dimension of length 1 is always 1, and 0 after a log; a saturated one "
                         f"is exactly one-hot), so no gradient passes it"),
            "zero_weights": (f"the gradient stops at a layer whose weights are all zero (initialised "
                             f"by {where}): nothing flows back through it, and the layers before "
                             f"it (and its own weights, whose input is 0) stay where they are"
                             if call_text else "the gradient stops at a layer whose weights are "
                             "all zero: nothing flows back through it"),
            "part": (f"`{call_text}` reads a lower layer's final state of the stacked recurrent "
                     f"layer: the layers above it (these parameters) reach the loss nowhere"
                     if upper_layers and call_text and "[" in call_text else
                     f"only part of the output of {where} reaches the loss: the gradient stops at "
                     f"a selection (`{name}`) that drops the part these parameters make"),
            "factor": f"the loss `{call_text}` is multiplied by a factor that is 0",
            "zero_factors": (f"the gradient stops at a product of two factors that are both all "
                             f"zero (one of them initialised by {where}): "
                             f"each factor's gradient is the other factor, so neither ever moves"
                             if call_text else "the gradient stops at a product of two factors "
                             "that are both all zero: each factor's gradient is the other"),
            "zero_constant": (f"`{gate[3]}` multiplies their branch by `self.{gate[2]}`, a plain tensor "
                              f"made by {where}: not a parameter, so the optimizer never moves it, "
                              f"the factor stays 0 and the branch is cut from the loss for good (a "
                              f"gate initialised at zero must be an nn.Parameter to open)"
                              if gate is not None else "the gradient stops at a product with a "
                              "constant factor that is 0 at every update"),
            "zero_input": (f"the input of {where if call_text else 'their layer'} is all zeros at "
                           f"every update, so no gradient reaches its weights and its output is "
                           f"the same for every sample: the data never gets there"),
        }.get(how, f"the gradient stops at {where}" if name else "the loss does not depend on them")
        if whole:
            what = (f"every gradient {cls} applies is exactly zero"
                    + (f" from update {a.step_number.get(since.seq, '?')} on" if since is not None else "")
                    + f" ({a.names(pids)}): the model no longer trains")
        else:
            what = (f"the gradients of {a.names(pids)} are exactly zero at each of the {updates} "
                    f"measured updates of {cls}: they never train")
        single_class = how == "constant" and call_text is not None and "cross_entropy" in call_text
        if single_class:  # a log_softmax over one logit: 0 for every input
            reason = (f"{where} is taken over a single class (one score per sample): the "
                      f"log_softmax of one logit is 0 whatever it is, so the loss is 0 and no "
                      f"gradient passes it")
        fix = {
            "zero": (f"use a straight-through estimator: `h = h + (torch.{(op or 'Round').lower()}(h) "
                     f"- h).detach()` ({(op or 'Round').lower()}'s value forward, the identity's "
                     f"gradient backward)"),
            "saturated": "make the clamp's range hold the values it receives (scale the targets, "
                         "or use a smooth squashing such as sigmoid), or clamp only at inference",
            "dead": "revive the ReLU: a smaller learning rate or bias init, or LeakyReLU/GELU",
            "dropped": "use a dropout probability below 1",
            "constant": ("normalise over the dimension that holds the scores (for weights over "
                         "time steps of shape (B, T, 1): dim=1), or use a sigmoid for a single "
                         "score"),
            "zero_weights": (("initialise one factor of each low-rank pair randomly (LoRA's A "
                              "with nn.init.kaiming_uniform_, as peft does) and only the other (B) "
                              "to zero: with both at zero, each one's gradient is a product with "
                              "the other and stays zero")
                             if any("lora" in a.param_name(p).lower() for p in pids) else
                             "do not initialise weights to zero: keep the layers' default "
                             "initialisation (or nn.init.kaiming_uniform_ / xavier_uniform_); "
                             "zeros are fine for biases only"),
            "part": ("read the last layer's final state: `h_n[-1]` (h_n is (num_layers * "
                     "directions, batch, hidden), the first layer's state first)"
                     if upper_layers else
                     "use the whole output: for a bidirectional RNN's final state, both "
                     "directions (torch.cat([h_n[-2], h_n[-1]], dim=-1)); or remove the part "
                     "that is not used"),
            "zero_factors": ("initialise the factors randomly (nn.init.normal_(weight, std=0.01) "
                             "for embeddings): with both at zero, each one's gradient is a "
                             "product with the other and stays zero; at most one of them may "
                             "start at zero"),
            "factor": "check the factor the loss is multiplied by (a weight that is 0: an integer "
                      "division such as `step // total`, a schedule that starts at 0 and stays)",
            "zero_constant": (f"register the gate as a parameter: `self.{gate[2]} = "
                              f"nn.Parameter({gate[4]})` (it starts at 0 and the first steps open it)"
                              if gate is not None else "make the factor a parameter, or find what "
                              "keeps it at 0"),
            "zero_input": ("give the layer the batch: look for what zeroes or replaces its input "
                           "(a mask of zeros, `x * 0` left from debugging, a placeholder tensor "
                           "passed instead of the batch's inputs)"),
        }.get(how, "find where the loss stops depending on the parameters (a factor of 0, a "
                    "detached or constant term)")
        if single_class:
            fix = ("give the model one output per class for cross_entropy; for a real-valued "
                   "target use mse_loss, for a yes/no target binary_cross_entropy_with_logits on "
                   "the single score")
        return self.finding(
            f"{what}; {reason}", loc,
            related=(related(event, "the backward whose gradient stops there"),),
            step=a.step_number.get(measured[-1][0].seq),
            evidence={"params": a.param_names(sorted(pids)), "stops_at": name,
                      "measured_updates": updates, "all_parameters": whole},
            fix=fix)

    @staticmethod
    def _constant_gate(a, event, pids):
        """``(line, text, attribute, product, value, branch modules)`` of a module attribute the script's
        ``__init__`` sets to a zero tensor without making it a parameter (``self.gate =
        torch.zeros(1)``) and a method of the same class multiplies a branch by (through a
        call: ``out * self.gate.tanh()``), the branch calling a module that holds ``pids``."""
        if event is None or event.loc is None:
            return None
        tree = a.source.tree(event.loc.path)
        if tree is None:
            return None
        owners = set(_module_attrs(a, pids)) | set(_containers(a, pids))
        written = None
        for cls in walk(tree):
            if isinstance(cls, ast.ClassDef):
                if written is None:
                    written = _written_attrs_but_init(tree)
                found = _zero_gate_in_class(cls, owners, written)
                if found is not None:
                    return found
        return None

    @staticmethod
    def _call_site(a, event, calls, prefer: str | None = None) -> tuple[Location | None, str | None]:
        """The script's call of the op where the gradient stops, found by name in the file of
        the diagnosed backward: the first inside a ``forward``, else the first (among those whose
        text holds ``prefer``, when some do)."""
        if event is None or event.loc is None or not calls:
            return None, None
        found = a.source.calls_named(event.loc.path, calls)
        # an op inside a custom autograd.Function's forward runs without a graph (its backward
        # is the Function's own): the node where the gradient stopped was made elsewhere
        inside = _autograd_function_lines(a.source.tree(event.loc.path))
        found = [c for c in found if c[0] not in inside] or found
        if prefer is not None:
            found = [c for c in found if prefer in c[1]] or found
        if not found:
            return None, None
        line, text, _ = next((c for c in found if c[2]), found[0])
        return Location(event.loc.path, line), text


def _autograd_function_lines(tree) -> set[int]:
    """The lines of the classes that subclass ``torch.autograd.Function`` (``Function``,
    ``autograd.Function``, ``torch.autograd.Function``)."""
    lines: set[int] = set()
    if tree is None:
        return lines
    for node in walk(tree):
        if isinstance(node, ast.ClassDef) and any(
                (isinstance(b, ast.Name) and b.id == "Function")
                or (isinstance(b, ast.Attribute) and b.attr == "Function") for b in node.bases):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


_LAYER = re.compile(r"_l(\d+)(_reverse)?$")


def _upper_layers_only(a, pids) -> bool:
    """Whether the dead parameters are all a stacked RNN's layers above the first, forward
    direction (``weight_ih_l1``): a read of a lower layer's state (``h_n[0]``), not one
    direction of a bidirectional one."""
    found = [_LAYER.search(a.param_name(p) or "") for p in pids]
    return bool(found) and all(m is not None and int(m.group(1)) >= 1 and not m.group(2)
                               for m in found)


def _state_read(tree, call_line: int) -> tuple[int, str] | None:
    """``(line, text)`` of the first constant index into a name the recurrent call on
    ``call_line`` bound (``_, (h_n, _) = self.lstm(x)`` ... ``h_n[0]``), in its function."""
    if tree is None:
        return None
    for scope in walk(tree):
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            continue
        for stmt in walk(scope):
            if isinstance(stmt, ast.Assign) and stmt.lineno == call_line:
                names = {n.id for t in stmt.targets for n in walk(t) if isinstance(n, ast.Name)}
                reads = sorted((n.lineno, ast.unparse(n)) for n in walk(scope)
                               if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)
                               and n.value.id in names and n.lineno >= call_line
                               and isinstance(n.slice, (ast.Constant, ast.UnaryOp)))
                if reads:
                    return reads[0]
    return None


_ZERO_MAKERS = ("zeros", "zeros_like", "zero_", "tensor", "full")


def _zero_tensor(value) -> str | None:
    """The text of a call that makes a tensor of zeros (``torch.zeros(1)``, ``torch.tensor(0.0)``,
    ``torch.full((1,), 0.0)``), not wrapped in a parameter; None otherwise."""
    if not isinstance(value, ast.Call):
        return None
    func = value.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in _ZERO_MAKERS:
        return None
    if name == "tensor":
        if not value.args or not all(isinstance(c, ast.Constant) and c.value == 0
                                     for c in walk(value.args[0]) if isinstance(c, ast.Constant)):
            return None
    if name == "full":
        if len(value.args) < 2 or not (isinstance(value.args[1], ast.Constant) and value.args[1].value == 0):
            return None
    return ast.unparse(value)


def _self_attrs(node) -> set[str]:
    return {n.attr for n in walk(node) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "self"}


def _called_self_attrs(node) -> set[str]:
    names = set()
    for n in walk(node):
        if isinstance(n, ast.Call):
            func = n.func
            while isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and func.value.id == "self"):
                func = func.value
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
                names.add(func.attr)
    return names


def _written_attrs(tree) -> set[str]:
    """Attribute names the file assigns (``self.gate = ...``, ``block.gate = ...``, ``+=``) or
    writes in place (``model.gate.fill_(v)``): a gate set from a schedule is no constant."""
    names = set()
    for stmt in walk(tree):
        if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                for n in walk(t):
                    if isinstance(n, ast.Attribute):
                        names.add(n.attr)
        elif isinstance(stmt, ast.Call) and isinstance(stmt.func, ast.Attribute) \
                and stmt.func.attr.endswith("_") and isinstance(stmt.func.value, ast.Attribute):
            names.add(stmt.func.value.attr)
    return names


def _zero_gate_in_class(cls: ast.ClassDef, owners: set[str], written: set[str]):
    gates: dict[str, tuple[int, str, str]] = {}
    methods = [f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for f in methods:
        if f.name != "__init__":
            continue
        for stmt in walk(f):
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                t = stmt.targets[0]
                made = _zero_tensor(stmt.value)
                if made is not None and isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                        and t.value.id == "self":
                    gates[t.attr] = (stmt.lineno, ast.unparse(stmt), made)
    if not gates:
        return None
    rebound = written
    for f in methods:
        if f.name == "__init__":
            continue
        for node in walk(f):
            if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
                continue
            for gate_side, branch in ((node.right, node.left), (node.left, node.right)):
                hit = [g for g in _self_attrs(gate_side) if g in gates and g not in rebound]
                if hit and not _called_self_attrs(gate_side) & owners \
                        and _called_self_attrs(branch) & owners:
                    line, text, made = gates[hit[0]]
                    return line, text, hit[0], ast.unparse(node), made, _called_self_attrs(branch) & owners
    return None


def _written_attrs_but_init(tree) -> set[str]:
    """``_written_attrs`` of the file outside the ``__init__`` methods (where the gate is made)."""
    names: set[str] = set()
    for node in ast.iter_child_nodes(tree):
        names |= _written_outside_init(node)
    return names


def _written_outside_init(node) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__init__":
        return set()
    if isinstance(node, ast.ClassDef):
        names: set[str] = set()
        for child in node.body:
            names |= _written_outside_init(child)
        return names
    return _written_attrs(node)
