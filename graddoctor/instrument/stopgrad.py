"""Regression and distribution-matching losses whose *target* carries gradient into the
parameters that make their *input*: a stop-gradient left out.

``F.smooth_l1_loss(q(s).gather(1, a), r + gamma * q(s2).max(1)[0])`` (DQN's bootstrapped target
without ``torch.no_grad()``), ``F.kl_div(log_softmax(model(strong)), softmax(model(weak)))``
(a pseudo-label from the model itself, not detached), ``mse(pred, encoder(next_obs))`` (a latent
prediction target made by the encoder being trained): the loss's gradient flows into the target
as well, so the optimizer moves the target towards the prediction as much as the prediction
towards the target. The target chases the model (the Q-values drift, the pseudo-labels
collapse to whatever is easiest to predict).

The losses in ``torch.nn.functional`` that take a target of the input's kind (``mse_loss``,
``l1_loss``, ``smooth_l1_loss``, ``huber_loss``, ``kl_div``, ``binary_cross_entropy``,
``binary_cross_entropy_with_logits``, ``cross_entropy`` with probability targets) are patched
(their ``nn`` modules call them). Cost per call: a counter and two attribute reads (does the
target need a gradient at all?); only a target that does, under grad mode, in the losses of the
first ``_WINDOWS`` backwards that had such calls (and of a later training phase's: an optimizer
given parameters after they ran, ``LossWindow``; the wrappers stay, nothing is patched again),
has its graph and the input's walked (the leaves each reaches; a node budget). A call is
recorded (a ``target_grad`` aside event, once per call line) when

* target and input reach some tracked tensor in common (the same parameters), and
* the target is not made from the input or the input from the target (a Jensen-Shannon term
  compares each distribution with a mixture made of them: AugMix), and
* the two sides are not one value: one branch of the model (a softmax and a log-softmax of
  the same logits), or two that computed the same values from the same inputs and parameters
  (``softmax(f(x)) * log_softmax(f(x))``, an entropy written with two calls; a value compared
  with itself is loss-compares-with-itself's), and
* the pair is not a symmetric consistency: for ``mse``-like losses, rows of one output
  compared with each other (``h[:8]`` against ``h[8:]``: pairs of a batch; ``z[:, 1:]``
  against ``z[:, :-1]``: neighbouring time steps), or both sides made by the same kind of op of
  the same layer, with one shape (a Π-model's ``mse(softmax(f(x1)),
  softmax(f(x2)))``; a latent prediction ``mse(dyn(enc(x)), enc(x2))`` is made by two layers); for the
  others, the same pair of branches seen the other way round in the same loss (R-Drop's
  ``kl(p1 || p2) + kl(p2 || p1)``). Those train both sides on purpose.

The same loss written by hand is no call: at the first ``_WINDOWS`` backwards of each backward
line (``_LINES`` lines at most) the loss's graph is read from its root down its linear top
(sums, means, views, negations, differences, products by a factor without gradient: a mask, a
weight, a temperature) for the three shapes a comparison takes there:

* a *cross-entropy*: a product of two computed factors, one a log-probability (a
  ``log_softmax``, ``logsigmoid`` or ``log``, or a sum or difference of them: ``log q - log p``)
  and the other a distribution (a softmax, a sigmoid or an exp, a few shaping ops up: a
  ``torch.where`` on confidence, a sharpening, ``1 - t``). The distribution is the target, each
  log-probability the input. A log-probability of the very distribution it multiplies (an
  entropy's ``p * log p``, ``p * log_softmax(z)`` for ``p = softmax(z)``) is skipped;
* a *squared or absolute difference* of two computed sides (``(a - b) ** 2``, ``.pow(2)``,
  ``.abs()``, ``.norm(dim=1)``, ``d * d``, a Huber loss's ``torch.where``), ``b`` the target;
* a *cosine*: a product of two computed, L2-normalised factors (``F.normalize`` or
  ``F.cosine_similarity``: SimSiam's and BYOL's loss), the second the target.

One side compared by squared error or cosine with two others or more (a triplet's anchor with
its positive and its negative, a query with several documents) is metric learning, every side
trained on purpose: not taken. A squared error or cosine that a computed value scales
(``(mu_q - mu_p) ** 2 / var_p``, a Gaussian KL or likelihood with a learned variance) is no
regression onto a target: not taken.
A squared residual whose first side holds a log-probability among the terms of its linear top
(``(log_F(s) + log_pf) - (log_F(s') + log_pb)``, ``mse(V(s) + tau * log_pi, r + gamma * V(s'))``)
is a balance or consistency equation (a GFlowNet's detailed, trajectory or sub-trajectory
balance, path consistency learning), trained through both sides on purpose: not taken; so is
one whose second side holds, among its terms, the log-probability of the policy at the states
the first side's value reads (``mse(V(s), r - tau * log_pi(a|s) + gamma * V(s'))``: the same
states' data under the layers of both). A
bootstrapped regression predicts a value there (``q(s).gather(1, a)``); an entropy bonus on
the target side (SAC's ``- alpha * log_pi`` in ``r + gamma * (q' - alpha * log_pi)``) still
leaves the target.
A side made from a derivative of the model (``torch.autograd.grad(..., create_graph=True)``:
its graph differentiates a backward formula) is a term of an equation's residual, a
physics-informed ``u_t - k * u_xx`` or ``du - r * u * (1 - u)``, every term trained on
purpose: not taken.

Each pair is judged as a call of the matching loss (``kl_div``, ``mse_loss``) is, with the
same exemptions (one side made from the other; two outputs of one layer compared with one op;
a pair seen both ways round in one loss); a built-in loss's own pieces (``kl_div`` and
``cross_entropy`` compute such a product inside) are left to its call. A candidate is a
``target_grad`` event at the backward's line, ``fn`` naming the hand-written form; the rule
finds the line that computes it.

Candidates are held until the next backward (``describe_loss``), which decides the
symmetric pairs and emits the rest with their call line, less two kinds:

* a loss that backward does not reach (its input's branch is not in the backpropagated graph):
  one differentiated only with respect to its inputs by ``torch.autograd.grad`` (an attack's
  KL, TRADES' and PGD's inner loop), or never backpropagated;
* a target *anchored* by data: its branch is also the input of a loss against data (labels, a
  regression target) in the same backward, the same value or the same values computed by a
  second forward of the same inputs (TRADES' ``kl(log_softmax(f(x_adv)), softmax(f(x)))``
  beside ``cross_entropy(f(x), y)``). Both of its terms train that prediction on purpose, and
  the labels keep it from chasing the other side.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import events as ev
from .graphpaths import reached, saved
from .inlinable import watched
from .lossterms import PerLine, loss_root, loss_roots
from .losswindow import LossWindow
from .recorder import Recorder
from .samevalue import LazySaved, verify_twins

NAMES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "binary_cross_entropy",
         "binary_cross_entropy_with_logits", "cross_entropy")
# losses whose value is symmetric in (input, target): a consistency between two like outputs
_SYMMETRIC = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
_WINDOWS = 3  # backwards whose losses are judged (the calls since the previous backward)
_CALLS = 32  # calls judged per backward at most: past it the window's candidates are dropped
# (a symmetric pair may be cut in two)
_NODES = 20000  # nodes walked per side
_LINES = 8  # backward lines whose hand-written losses are read, at most
_TOP = 256  # nodes of a loss's linear top walked for hand-written comparisons
_PAIRS = 16  # hand-written pairs judged per backward, at most
_NEAR = 6  # levels below a factor searched for the distribution that makes it
# the hand-written comparisons, as the events name them
CROSS_ENTROPY, SQUARED, COSINE = ("hand-written cross-entropy", "hand-written squared error",
                                  "hand-written cosine similarity")
# nodes that keep the values they are given: a producer is read past them
_PASS = ("View", "Reshape", "UnsafeView", "Squeeze", "Unsqueeze", "Permute", "Transpose",
         "TBackward", "Clone", "ToCopy", "Expand", "Alias", "Contiguous")


def _producer(node):
    """The first node below ``node`` that is no reshape or copy (None: no graph)."""
    for _ in range(16):
        if node is None or not type(node).__name__.startswith(_PASS):
            return node
        parents = [child for child, _ in node.next_functions if child is not None]
        if len(parents) != 1:
            return node
        node = parents[0]
    return node


def _base(node):
    """The node a (log-)softmax or sigmoid normalised (the logits), else the producer itself:
    what identifies a branch of the model for the reversed-pair test."""
    node = _producer(node)
    if node is not None and type(node).__name__.startswith(
            ("SoftmaxBackward", "LogSoftmaxBackward", "SigmoidBackward", "LogSigmoidBackward")):
        parents = [child for child, _ in node.next_functions if child is not None]
        if len(parents) == 1:
            return _producer(parents[0])
    return node


def _own_leaves(node) -> frozenset:
    """The leaf tensors an op reads directly (a linear layer's weight and bias, past the
    weight's transpose): which layer made a value."""
    found = set()
    level = [node]
    for _ in range(2):
        following = []
        for item in level:
            for child, _ in getattr(item, "next_functions", ()):
                if child is None:
                    continue
                variable = getattr(child, "variable", None)
                if variable is not None:
                    found.add(id(variable))
                else:
                    following.append(child)
        level = following
    return frozenset(found)


def _same_layer(base_in, base_target, nodes_in: set, nodes_target: set) -> bool:
    """Both sides made by one layer in two calls (a Π-model). When neither side's op reads a
    leaf directly (an index of a view of the layer's output: ``out[pos]``), the layer is not
    known from its weights: the two sides must then come from two separate forwards, which share
    no computed node (a target built from the very activations it is compared with,
    ``encode(gt, anchors + reg_out)[pos]`` against ``reg_out[pos]``, shares them)."""
    own_in, own_target = _own_leaves(base_in), _own_leaves(base_target)
    if own_in != own_target:
        return False
    if own_in:
        return True
    return not any(getattr(node, "variable", None) is None for node in nodes_in & nodes_target)


# ops that pass a value on with one computed input: the branch of the model a value comes from
# is read past them (a temperature, an epsilon, a clamp, a confidence gate, the log of a softmax)
_PEEL = _PASS + ("SoftmaxBackward", "LogSoftmaxBackward", "SigmoidBackward", "LogSigmoidBackward",
                 "ExpBackward", "LogBackward", "WhereBackward", "ClampBackward", "ClampMinBackward",
                 "NegBackward", "AddBackward", "SubBackward", "RsubBackward", "MulBackward",
                 "DivBackward", "PowBackward")
_LOGS = ("LogSoftmaxBackward", "LogSigmoidBackward", "LogBackward")
_DISTRIBUTIONS = ("SoftmaxBackward", "SigmoidBackward", "ExpBackward")
# ops between a distribution and the factor a hand-written loss multiplies (a gate, a sharpening,
# a renormalisation, a smoothing, a selection of rows)
_SHAPING = _PASS + ("WhereBackward", "MulBackward", "DivBackward", "PowBackward", "AddBackward",
                    "SubBackward", "RsubBackward", "NegBackward", "ClampBackward", "ClampMinBackward",
                    "SumBackward", "MeanBackward", "IndexBackward", "SelectBackward", "SliceBackward",
                    "SplitBackward", "CatBackward", "StackBackward", "GatherBackward", "RepeatBackward")
# the linear top of a loss: a term's value reaches the loss through these unchanged in kind
_TOP_OPS = _PASS + ("SumBackward", "MeanBackward", "NegBackward", "AddBackward", "SubBackward",
                    "RsubBackward", "MulBackward", "DivBackward", "SelectBackward", "SliceBackward",
                    "IndexBackward", "CatBackward", "StackBackward", "SplitBackward", "UnbindBackward",
                    "WhereBackward")  # a hand-written Huber loss picks its branch per element
# what a squared error's difference is taken the size of, besides a square
_DISTANCES = ("AbsBackward0", "LinalgVectorNormBackward0", "NormBackward1", "NormBackward0")


def _computed(node) -> list:
    """The inputs of ``node`` that carry a gradient, as edges ``(node, output number)``."""
    return [edge for edge in node.next_functions if edge[0] is not None]


# ops that select rows (or elements) of one value, and views
_SELECT = _PASS + ("SliceBackward", "SelectBackward", "IndexBackward", "SplitBackward",
                   "SplitWithSizesBackward", "UnbindBackward", "GatherBackward", "NarrowBackward")


def _past(edge, ops: tuple, limit: int) -> tuple:
    """``edge`` read past the ops named by ``ops`` (prefixes of node names) that pass one
    computed input on, at most ``limit`` of them."""
    for _ in range(limit):
        node = edge[0]
        if node is None or not type(node).__name__.startswith(ops):
            return edge
        inputs = _computed(node)
        if len(inputs) != 1:
            return edge
        edge = inputs[0]
    return edge


def _selected_from(edge) -> tuple:
    """The value a side selects its rows from, past views and selections (``h[:8]``,
    ``z[:, 1:]``, a chunk): two sides with the same one compare parts of one output."""
    return _past(edge, _SELECT, 16)


def branch(edge) -> tuple:
    """The value a side of a comparison is made from, read past the ops that pass one computed
    input on (``_PEEL``), as the edge ``(node, output number)`` that feeds them: two chunks of
    one forward (``logits.chunk(2)``) are two branches, a softmax and a log-softmax of one
    logits tensor one."""
    return _past(edge, _PEEL, 32)


def log_terms(edge) -> list:
    """The log-probabilities a factor sums (``log q - log p``, ``-log_softmax(z) / T``): edges
    whose op (past views) is a log-softmax, a logsigmoid or a log; for the log of a ratio
    (``log(p / q)``), the edges of ``p`` and ``q``. Empty: no log-probability."""
    found, stack, seen = [], [edge], set()
    while stack and len(seen) < 64:
        edge = stack.pop()
        node = edge[0]
        if node is None or edge in seen:
            continue
        seen.add(edge)
        name = type(node).__name__
        inputs = _computed(node)
        if name.startswith(_LOGS):
            ratio = _producer(inputs[0][0]) if len(inputs) == 1 else None
            if ratio is not None and type(ratio).__name__ == "DivBackward0" and len(_computed(ratio)) == 2:
                found.extend(_computed(ratio))  # log(p / q): the terms log p and -log q
            else:
                found.append(edge)
        elif name.startswith(_PASS) or name.startswith("NegBackward") or (
                name.startswith(("AddBackward", "SubBackward"))):
            stack.extend(inputs)
        elif name.startswith(("MulBackward", "DivBackward")) and len(inputs) == 1:
            stack.extend(inputs)  # a constant factor: a temperature
        else:
            return []  # a term that is no log-probability: the factor is not one
    return found


def is_distribution(edge) -> bool:
    """Whether a factor is made from a softmax, a sigmoid or an exp a few shaping ops up (a
    confidence gate, a sharpening, ``1 - t``): a distribution playing the target."""
    level, seen = [edge[0]], set()
    for _ in range(_NEAR):
        following = []
        for node in level:
            if node is None or node in seen:
                continue
            seen.add(node)
            name = type(node).__name__
            if name.startswith(_DISTRIBUTIONS):
                return True
            if name.startswith(_SHAPING):
                following.extend(child for child, _ in _computed(node))
        level = following
    return False


def _normalised(edge) -> bool:
    """An L2-normalised value: a division whose divisor is made by a vector norm
    (``F.normalize``, ``F.cosine_similarity``'s operands)."""
    node = _producer(edge[0])
    if node is None or not type(node).__name__.startswith("DivBackward"):
        return False
    inputs = _computed(node)
    if len(inputs) != 2:
        return False
    divisor, steps = inputs[1][0], 0
    while divisor is not None and steps < 6:
        name = type(divisor).__name__
        if name.startswith(("LinalgVectorNormBackward", "NormBackward")):
            return True
        if not name.startswith(_PASS + ("ClampBackward", "ClampMinBackward", "ExpandBackward")):
            return False
        inputs = _computed(divisor)
        divisor = inputs[0][0] if len(inputs) == 1 else None
        steps += 1
    return False


def _shape(edge):
    """The shape of the value an edge carries (the node's metadata; no saved tensor read)."""
    try:
        meta = edge[0]._input_metadata
        return tuple(meta[edge[1]].shape)
    except Exception:  # an older torch, a node without metadata
        return None


def _difference(edge):
    """The two computed sides of the difference a square or absolute value is taken of, or
    None."""
    node = _producer(edge[0])
    if node is None or not type(node).__name__.startswith("SubBackward0"):
        return None
    inputs = _computed(node)
    if len(inputs) != 2 or len(node.next_functions) != 2:
        return None
    return inputs[0], inputs[1]


def comparisons(root, limit: int = _TOP) -> list:
    """``[(form, input edge, target edge)]``: the hand-written comparisons the loss's linear top
    holds (see the module's docs), at most ``_PAIRS``. A squared error or cosine scaled by
    another computed value (``(mu_q - mu_p) ** 2 / var_p``: a Gaussian KL or likelihood with a
    learned variance) is a term of a likelihood both of whose sides are trained, not a
    regression onto a target: not taken."""
    found: list = []
    stack, seen = [(root, False)], set()
    while stack and len(found) < _PAIRS:
        node, scaled = stack.pop()
        if node is None or (node, scaled) in seen:
            continue
        seen.add((node, scaled))
        if len(seen) > limit:
            break
        name = type(node).__name__
        inputs = _computed(node)
        if len(inputs) == 1 and (name in _DISTANCES or name == "PowBackward0" and getattr(
                node, "_saved_exponent", None) in (2, 2.0)):
            sides = _difference(inputs[0])
            if sides is not None and not scaled:
                found.append((SQUARED, *sides))
            continue
        if name == "MulBackward0" and len(inputs) == 2:
            a, b = inputs
            if a == b:  # d * d
                sides = _difference(a)
                if sides is not None and not scaled:
                    found.append((SQUARED, *sides))
                continue
            logs_a, logs_b = log_terms(a), log_terms(b)
            if logs_a and not logs_b and is_distribution(b):
                found.extend((CROSS_ENTROPY, term, b) for term in logs_a)
                continue
            if logs_b and not logs_a and is_distribution(a):
                found.extend((CROSS_ENTROPY, term, a) for term in logs_b)
                continue
            if _normalised(a) and _normalised(b):
                if not scaled:
                    found.append((COSINE, a, b))
                continue
            if logs_a or logs_b:
                continue  # a log-likelihood weighted by a computed factor (an advantage): not a target
            # a term weighted by a computed factor (a learned precision, a focal weight)
            stack.extend((edge[0], True) for edge in inputs)
            continue
        if name.startswith("DivBackward") and len(inputs) == 2:
            stack.append((inputs[0][0], True))  # over a computed divisor: a learned variance
            continue
        if name.startswith(_TOP_OPS):
            stack.extend((edge[0], scaled) for edge in inputs)
    return found[:_PAIRS]


def _holds_derivative(nodes) -> bool:
    """Whether a side is made from a derivative of the model taken with
    ``torch.autograd.grad(..., create_graph=True)``: its graph differentiates a backward
    formula (``TanhBackwardBackward0``, ``ThresholdBackwardBackward0``). A physics-informed
    residual ``u_t - k * u_xx`` or ``du - f(u)`` compares the model's derivatives with each
    other or with its output, the terms of one equation, none of them a target."""
    return any(type(node).__name__.endswith(("BackwardBackward0", "BackwardBackward1"))
               for node in nodes)


# the log-probability a balance or consistency residual holds as one of its terms: a policy's
# (``log_softmax``, ``logsigmoid``, a categorical's ``logits - logsumexp``, a Gaussian's log-scale)
_LOG_PROBABILITIES = ("LogSoftmaxBackward", "LogSigmoidBackward", "LogsumexpBackward", "LogBackward")
# ops a term's value passes through to a residual's side: its linear top, and the pick of the
# action taken (``log_pf.gather(-1, a).sum(1)``)
_TERM_OPS = _TOP_OPS + ("GatherBackward", "IndexSelectBackward")
_TERMS = 64  # nodes of a side's linear top searched for a log-probability


def _log_probability(edge):
    """The log-probability node a side holds as a term of its linear top, or None."""
    stack, seen = [edge[0]], set()
    while stack and len(seen) < _TERMS:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        name = type(node).__name__
        if name.startswith(_LOG_PROBABILITIES):
            return node
        if name.startswith(_TERM_OPS):
            stack.extend(child for child, _ in _computed(node))
    return None


# a layer's node and the name of the input it saves: where the data enters the network
_FIRST_LAYERS = {"AddmmBackward0": "_saved_mat1", "MmBackward0": "_saved_self",
                 "ConvolutionBackward0": "_saved_input"}
_INPUT_NODES = 400  # nodes walked per side for the data its layers read


def _data_read(node) -> set:
    """``(data pointer, shape)`` of the tensors without gradient that the layers below ``node``
    read (the states a value or a policy network is evaluated on)."""
    found, stack, seen = set(), [node], set()
    while stack and len(seen) < _INPUT_NODES:
        cur = stack.pop()
        if cur is None or cur in seen:
            continue
        seen.add(cur)
        name = _FIRST_LAYERS.get(type(cur).__name__)
        if name is not None:
            value = saved(cur, name)
            if isinstance(value, torch.Tensor) and not value.requires_grad:
                found.add((value.data_ptr(), tuple(value.shape)))
        stack.extend(child for child, _ in _computed(cur))
    return found


def consistency_on_one_state(input_edge, target_edge) -> bool:
    """Whether the target side holds a log-probability as a term (``r - tau * log_pi +
    gamma * V(s')``) of the policy at the very states the input side's value reads (``V(s)``):
    path consistency learning's residual, every term trained on purpose. A soft
    Q-learning target's entropy bonus is the next state's (``log_pi(a'|s')``): not this."""
    node = _log_probability(target_edge)
    if node is None:
        return False
    states = _data_read(input_edge[0])
    return bool(states) and bool(states & _data_read(node))


def holds_log_probability(edge) -> bool:
    """Whether a side of a squared residual holds a log-probability as a term of its linear
    top (``log_F(s) + log_pf``, ``V(s) + tau * log_pi``): the residual is a balance or
    consistency equation between probabilities and flows or values (GFlowNets' detailed and
    trajectory balance, path consistency learning), trained through every term on purpose. A
    regression onto a bootstrapped value predicts a value (``q(s).gather(1, a)``), not a
    log-probability."""
    stack, seen = [edge[0]], set()
    while stack and len(seen) < _TERMS:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        name = type(node).__name__
        if name.startswith(_LOG_PROBABILITIES):
            return True
        if name.startswith(_TERM_OPS):
            stack.extend(child for child, _ in _computed(node))
    return False


def _below(tensors) -> set | None:
    """The nodes of the graph a backward runs through, or None when it is too large to walk
    (then every candidate counts as reached), or without a graph given."""
    roots = loss_roots(tensors)
    if not roots:
        return None
    nodes: set = set()
    for root in roots:
        walked = reached(root, 4 * _NODES)
        if walked is None:
            return None
        nodes |= walked[0]
    return nodes


# built-in losses' nodes: their first input is the prediction, their target data when it is
# their only computed input
_DATA_LOSSES = ("NllLossBackward", "NllLoss2DBackward", "MseLossBackward", "L1LossBackward",
                "SmoothL1LossBackward", "HuberLossBackward", "BinaryCrossEntropyBackward",
                "BinaryCrossEntropyWithLogitsBackward")


def _fitted_to_data(nodes) -> list:
    """The branches (see ``branch``) that a built-in loss in ``nodes`` compares with data:
    ``cross_entropy(logits, y)``'s logits."""
    found = []
    for node in nodes:
        if type(node).__name__.startswith(_DATA_LOSSES):
            inputs = _computed(node)
            if len(inputs) == 1 and node.next_functions[0][0] is not None:
                found.append(branch(node.next_functions[0]))
                if len(found) >= _CALLS:
                    break
    return found


def _anchored(target_branch, supervised: list) -> bool:
    """Whether the target's branch is also compared with data (labels, a regression target)
    in the same loss: the same value, or the same values computed again by a second forward of
    the same inputs (TRADES' ``softmax(model(x_natural))`` beside ``cross_entropy(model(
    x_natural), y)``). Such a target is pulled towards the labels by its own term: both sides
    train on purpose, and it cannot chase the prediction away from the data."""
    for anchor in supervised:
        if anchor == target_branch:
            return True
        if (anchor[1] == target_branch[1] and type(anchor[0]) is type(target_branch[0])
                and anchor[0] is not None
                and verify_twins(anchor[0], target_branch[0], LazySaved()) is not None):
            return True
    return False


class TargetGradWatcher:
    def __init__(self, rec: Recorder):
        self.rec = rec
        # backwards whose built-in loss calls were judged; a later phase (an optimizer given
        # parameters after it closed) judges its first ones too: the wrappers never left
        self.loss_window = LossWindow(rec, _WINDOWS)
        self._calls = 0  # calls judged since the last backward
        self._done: set = set()  # call lines recorded
        self._pending: list = []  # (loc, input branch, target branch, event) until the next backward
        self._lines = PerLine(_WINDOWS, _LINES)  # backwards whose hand-written losses are read
        self._called: set = set()  # nodes of the built-in losses' arguments since the last backward

    def _wrap(self, original, fn: str):
        watcher, rec = self, self.rec

        window = watcher.loss_window

        def before(args, kwargs) -> None:
            if window.taken >= window.size and watcher._lines.exhausted:  # (window.closed)
                return
            target = args[1] if len(args) > 1 else kwargs.get("target")
            if not (isinstance(target, torch.Tensor) and target.requires_grad
                    and target.grad_fn is not None and torch.is_grad_enabled()):
                return  # data, a detached target, or no gradient at all: the usual call
            input = args[0] if args else kwargs.get("input")
            if not (isinstance(input, torch.Tensor) and input.grad_fn is not None):
                return  # the swapped arguments are loss-input-mismatch's
            if len(watcher._called) < 4 * _CALLS:  # its pieces are this call's, not hand-written
                watcher._called.update((input.grad_fn, target.grad_fn))
            if watcher.loss_window.closed:
                return
            try:
                watcher._calls += 1
                if watcher._calls <= _CALLS:
                    watcher._check(fn, input, target)
            except Exception as exc:
                rec.internal_error(f"F.{fn}", exc)

        loss = watched(original, before)  # torch.compile inlines it (inlinable.py)
        loss.__prepare_scriptable__ = lambda: original  # torch.jit.script compiles torch's own
        return loss

    def _check(self, fn: str, input, target) -> None:
        if fn == "cross_entropy" and not target.is_floating_point():
            return
        loc = self.rec.here()
        if loc in self._done:
            return
        candidate = self._judge(fn, (input.grad_fn, input.output_nr), (target.grad_fn, target.output_nr),
                                tuple(input.shape) == tuple(target.shape))
        if candidate is not None:
            self._pending.append((loc, *candidate))

    def _judge(self, fn: str, input_edge, target_edge, same_shape: bool):
        """``(input branch, target branch, event)`` when the target reaches parameters the input
        does and no exemption holds (see the module's docs), else None."""
        input_node, target_node = input_edge[0], target_edge[0]
        branch_in, branch_target = branch(input_edge), branch(target_edge)
        if branch_in == branch_target:
            return None  # one value on both sides: an entropy's p * log p, a pairwise difference
        walked_in = reached(input_node, _NODES)
        walked_target = reached(target_node, _NODES)
        if walked_in is None or walked_target is None:
            return None
        nodes_in, leaves_in = walked_in
        nodes_target, leaves_target = walked_target
        if target_node in nodes_in or input_node in nodes_target:
            return None  # one side is made from the other (a mixture against its parts: a JSD)
        if _holds_derivative(nodes_in) or _holds_derivative(nodes_target):
            return None  # an equation's residual (u_t - k * u_xx): every term trains on purpose
        common = leaves_in & leaves_target
        if not common:
            return None  # a separate network makes the target (a target network, a peer model)
        tensors = self.rec.tensors
        pids = sorted(pid for i in common
                      if (pid := tensors.number.get(i)) is not None and id(tensors.refs[pid]()) == i)
        if not pids:
            return None
        if fn in _SYMMETRIC and _selected_from(input_edge) == _selected_from(target_edge):
            return None  # rows of one output compared with each other (pairs of a batch, time steps)
        if fn in _SYMMETRIC and holds_log_probability(input_edge):
            return None  # a balance or consistency residual (GFlowNets, PCL): every term trains
        if fn in _SYMMETRIC and consistency_on_one_state(input_edge, target_edge):
            return None  # PCL written with the log-probability beside the reward: the same
        made_in, made_target = _producer(input_node), _producer(target_node)
        if (fn in _SYMMETRIC and type(made_in) is type(made_target) and same_shape
                and _same_layer(_base(input_node), _base(target_node), nodes_in, nodes_target)):
            return None  # two outputs of one layer made to agree (a Π-model): both sides train
        if branch_in[1] == branch_target[1] and branch_in[0] is not branch_target[0] \
                and verify_twins(branch_in[0], branch_target[0], LazySaved()) is not None:
            return None  # one value computed twice (softmax(f(x)) * log_softmax(f(x))): no target
        made = ev.target_grad(fn=fn, params=pids[:64], input_op=type(made_in).__name__,
                              target_op=type(made_target).__name__)
        return branch_in, branch_target, made

    def _read_handwritten(self, tensors) -> None:
        """The hand-written comparisons of the loss backpropagated now become candidates at the
        backward's line."""
        if self._lines.exhausted:
            return
        root = loss_root(tensors)
        if root is None:
            return
        loc = self.rec.here()
        if loc in self._done or not self._lines.admit(loc):
            return
        found = comparisons(root)
        compared: dict = {}  # (form, input branch) -> the target branches it is compared with
        for form, input_edge, target_edge in found:
            if form != CROSS_ENTROPY:
                compared.setdefault((form, branch(input_edge)), set()).add(branch(target_edge))
        for form, input_edge, target_edge in found:
            if form != CROSS_ENTROPY and len(compared[(form, branch(input_edge))]) > 1:
                continue  # an anchor pulled to a positive, pushed from a negative: metric learning
            if target_edge[0] in self._called or input_edge[0] in self._called:
                continue  # a piece of kl_div or cross_entropy: judged at its call
            fn = "mse_loss" if form != CROSS_ENTROPY else "kl_div"
            shape = _shape(input_edge)
            candidate = self._judge(fn, input_edge, target_edge,
                                    shape is not None and shape == _shape(target_edge))
            if candidate is not None:
                branch_in, branch_target, (kind, data) = candidate
                self._pending.append((loc, branch_in, branch_target, (kind, {**data, "fn": form})))

    def describe_loss(self, tensors) -> dict:
        """At each backward: the candidates of the losses computed since the last one (built-in
        calls and the hand-written comparisons of this loss), less the pairs seen both ways
        round, become events."""
        calls, self._calls = self._calls, 0
        if calls:
            self.loss_window.take()
        try:
            self._read_handwritten(tensors)
        except Exception as exc:
            self.rec.internal_error("target_grad", exc)
        called, self._called = self._called, set()
        del called
        pending, self._pending = self._pending, []
        if not pending or calls > _CALLS:
            return {}
        try:
            pairs = {(a, b) for _loc, a, b, _made in pending}
            backpropagated = _below(tensors)
            supervised = _fitted_to_data(backpropagated or ())
            for loc, a, b, made in pending:
                if (b, a) in pairs or loc in self._done:
                    continue  # R-Drop's kl(p1 || p2) + kl(p2 || p1): symmetric on purpose
                if backpropagated is not None and a[0] not in backpropagated:
                    continue  # a loss this backward does not reach: one only differentiated
                    # with respect to its inputs (an attack's autograd.grad), or not at all
                if _anchored(b, supervised):
                    continue  # the target is also fitted to data in this loss (TRADES)
                self._done.add(loc)
                self.rec.emit_aside(made, loc)
        except Exception as exc:
            self.rec.internal_error("target_grad", exc)
        return {}

    def install(self, patcher) -> None:
        for name in NAMES:
            original = getattr(F, name, None)
            if original is not None:
                patcher.patch(F, name, self._wrap(original, name))
