"""loss-term-repeated (GD187): the same loss on the same prediction and target twice in one
objective, where the second term was meant to take another operand."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from graddoctor import events as ev
from graddoctor.instrument.graphpaths import post_order
from graddoctor.instrument.repeatedloss import call_key, starts_on
from rule_traces import builder, findings, only

SLUG = "loss-term-repeated"


def _prediction():
    return torch.randn(6, 4, requires_grad=True) * 1.0


def test_a_module_call_and_a_functional_call_with_default_options_are_one_term():
    out, y = _prediction(), torch.randint(0, 4, (6,))
    plain = call_key("cross_entropy", out, y, (out, y), {})
    module = call_key("cross_entropy", out, y, (out, y),
                      {"weight": None, "ignore_index": -100, "reduction": "mean",
                       "label_smoothing": 0.0})
    assert plain is not None and plain == module


def test_other_labels_options_or_predictions_are_other_terms():
    out, y = _prediction(), torch.randint(0, 4, (6,))
    plain = call_key("cross_entropy", out, y, (out, y), {})
    assert call_key("cross_entropy", out, y[torch.randperm(6)], (out, y), {}) != plain
    assert call_key("cross_entropy", out, y.clone(), (out, y), {}) != plain  # equal, not the same
    assert call_key("cross_entropy", out, y, (out, y), {"label_smoothing": 0.1}) != plain
    assert call_key("cross_entropy", out, y, (out, y), {"weight": torch.ones(4)}) != plain
    other = _prediction()
    assert call_key("cross_entropy", other, y, (other, y), {}) != plain
    assert call_key("cross_entropy", out, y, (out, y), {"reduction": "none"}) is None
    assert call_key("kl_div", out, y, (out, y), {}) is None  # no start node of its own


def test_the_start_nodes_on_a_prediction_are_counted_in_the_graph():
    out, y = _prediction(), torch.randint(0, 4, (6,))
    twice = F.cross_entropy(out, y) + F.cross_entropy(out, y)
    assert starts_on(post_order(twice.grad_fn, 1000), out.grad_fn, "cross_entropy") == 2
    F.cross_entropy(out, y).item()  # logged: not in the loss's graph
    once = F.cross_entropy(out, y) + out.pow(2).mean()
    assert starts_on(post_order(once.grad_fn, 1000), out.grad_fn, "cross_entropy") == 1
    t = (torch.rand(6, 4) > 0.5).float()
    bce = F.binary_cross_entropy_with_logits(out, t) * 2 + F.binary_cross_entropy_with_logits(out, t)
    assert starts_on(post_order(bce.grad_fn, 1000), out.grad_fn,
                     "binary_cross_entropy_with_logits") == 2


def _trace(params):
    t = builder(params=[0, 1])
    t.put(ev.loss_repeated(fn="cross_entropy", first_line=8, params=list(params)), line=9)
    t.clear([0, 1], line=10)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    return t


def test_the_rule_points_at_the_repeat_and_names_the_first_call():
    f = only(_trace([0, 1]), SLUG)
    assert f.location.line == 9 and "as on line 8" in f.message


def test_the_rule_is_silent_when_nothing_trained_makes_the_prediction():
    assert findings(_trace([7]), SLUG) == []


# -- any term summed into the loss twice, read from the graph (instrument/repeatedterm.py) ------
from graddoctor.instrument.repeatedterm import linear_terms, line_to_change, same_computation  # noqa: E402
from graddoctor.location import Location  # noqa: E402


def _repeated_pairs(loss):
    terms = linear_terms(loss.grad_fn)
    budget = [5000]
    return [(a, b) for i, a in enumerate(terms) for b in terms[i + 1:]
            if type(a) is type(b) and same_computation(a, b, budget)]


def _chamfer(a, b, second_dim):
    d = torch.cdist(a, b) ** 2
    return (d.min(dim=2)[0].mean(dim=1) + d.min(dim=second_dim)[0].mean(dim=1)).mean()


def test_a_chamfer_direction_written_twice_is_one_repeated_term():
    a, b = torch.randn(2, 5, 3, requires_grad=True), torch.randn(2, 7, 3)
    assert len(_repeated_pairs(_chamfer(a, b, 2))) == 1
    assert _repeated_pairs(_chamfer(a, b, 1)) == []  # the other direction: another term


def test_scaled_copies_are_one_term_and_other_operands_are_not():
    x = torch.randn(4, 3, requires_grad=True)
    y, z = torch.randn(4, 3), torch.randn(4, 3)
    assert len(_repeated_pairs(0.7 * F.l1_loss(x.exp(), y) + 0.3 * F.l1_loss(x.exp(), y))) == 1
    assert _repeated_pairs(F.l1_loss(x.exp(), y) + F.l1_loss(x.exp(), z)) == []
    assert _repeated_pairs(F.l1_loss(x.exp(), y) + F.l1_loss(x.sigmoid(), y)) == []
    # slices of one recomputed value are other terms: the walk does not pass through a slice
    assert _repeated_pairs(x.exp()[:, :1].pow(2).mean() + x.exp()[:, 1:].pow(2).mean()) == []
    # a product by a computed weight ends a term: the weights tell the terms apart
    w1, w2 = torch.rand(4, 3), torch.rand(4, 3)
    assert _repeated_pairs((x.exp() * w1).mean() + (x.exp() * w2).mean()) == []


def test_random_draws_are_never_the_same_computation():
    x = torch.randn(8, 16, requires_grad=True)
    torch.manual_seed(0)
    twice = F.dropout(x, 0.5).pow(2).mean() + F.dropout(x, 0.5).pow(2).mean()
    assert _repeated_pairs(twice) == []
    noise = (x + torch.randn(8, 16)).exp().mean() + (x + torch.randn(8, 16)).exp().mean()
    assert _repeated_pairs(noise) == []  # exp's saved results differ


def _loc(line):
    return Location("train.py", line, "f")


def test_the_line_to_change_is_where_the_two_copies_part():
    # the same frame at two lines: the later line
    assert line_to_change(((1, _loc(30)), (2, _loc(12))), ((1, _loc(30)), (2, _loc(13)))) == (_loc(13), 12)
    # two calls of a helper: the line that called it twice
    assert line_to_change(((1, _loc(37)), (2, _loc(9))), ((1, _loc(37)), (3, _loc(9)))) == (_loc(37), 37)
    # two statements at the top level
    assert line_to_change(((1, _loc(31)), (2, _loc(14))), ((1, _loc(32)), (3, _loc(14)))) == (_loc(32), 31)
    # one line run twice (a loop, one expression twice): that line
    assert line_to_change(((1, _loc(33)),), ((1, _loc(33)),)) == (_loc(33), 33)


def _term_trace(params, also_call=False):
    t = builder(params=[0, 1])
    if also_call:
        t.put(ev.loss_repeated(fn="cross_entropy", first_line=8, params=list(params)), line=9)
    t.put(ev.term_repeated(op="MinBackward0", first_line=8, params=list(params)), line=9)
    t.clear([0, 1], line=10)
    t.backward(fresh=[0, 1], line=11)
    t.step(0, line=12)
    return t


def test_the_rule_tells_a_repeated_term_at_the_copy():
    f = only(_term_trace([0, 1]), SLUG)
    assert f.location.line == 9 and "here and on line 8" in f.message
    assert f.evidence["op"] == "MinBackward0"


def test_a_term_told_by_its_loss_call_too_is_told_once():
    f = only(_term_trace([0, 1], also_call=True), SLUG)
    assert "cross_entropy is called again" in f.message


def test_a_repeated_term_nothing_trained_makes_is_silent():
    assert findings(_term_trace([7]), SLUG) == []


def test_a_patched_function_maps_to_the_first_original_it_replaced():
    import types

    from graddoctor.instrument.patcher import Patcher

    def original(x):
        return x

    def outer(x):
        return x

    def inner(x):
        return x

    owner = types.SimpleNamespace(fn=original)
    patcher = Patcher()
    patcher.patch(owner, "fn", inner)
    patcher.patch(owner, "fn", outer)
    try:
        assert patcher.originals() == {id(outer): (outer, original)}
        assert patcher.originals().original_of(outer) is original
        assert patcher.originals().original_of(inner) is inner  # no longer installed
    finally:
        patcher.undo()
    assert owner.fn is original


def test_the_originals_keep_a_wrapper_put_back_during_the_run_alive_so_its_id_is_never_reused():
    """A watcher whose windows are spent puts the original back itself (not through the
    patcher): its wrapper must not be freed while a mode still maps its id, else a wrapper made
    later at the same address is sent to the wrong original (a thread of the script crashed on
    ``F.mse_loss`` called as ``Tensor.norm``)."""
    import gc
    import types
    import weakref

    from graddoctor.instrument.patcher import Patcher

    def original(x):
        return x

    owner = types.SimpleNamespace(fn=original)
    patcher = Patcher()

    def wrapper(x):
        return original(x)

    patcher.patch(owner, "fn", wrapper)
    gone = weakref.ref(wrapper)
    try:
        originals = patcher.originals()
        owner.fn = original  # as a watcher's own restore does
        del wrapper
        gc.collect()
        assert gone() is not None
        made_later = lambda x: -x  # noqa: E731
        assert originals.original_of(made_later) is made_later
        del originals
        gc.collect()
        assert gone() is None
    finally:
        patcher.undo()
    assert owner.fn is original


def test_the_term_watcher_leaves_the_steps_and_backwards_once_its_windows_are_spent():
    from graddoctor.instrument import Recorder
    from graddoctor.instrument.repeatedterm import _WINDOWS, RepeatedTermWatcher
    from graddoctor.instrument.topics import DESCRIBE_LOSS, STEPPED

    rec = Recorder(step_budget=None)
    watcher = RepeatedTermWatcher(rec)
    rec.subscribe(STEPPED, watcher.after_step)
    rec.subscribe(DESCRIBE_LOSS, watcher.describe_loss)
    watcher._windows = _WINDOWS
    watcher.after_step(0, None)
    assert watcher.after_step not in list(rec.subscribers(STEPPED).now)
    assert watcher.describe_loss not in list(rec.subscribers(DESCRIBE_LOSS).now)
