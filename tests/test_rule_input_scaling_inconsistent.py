"""input-scaling-inconsistent (GD394): a model called on an array's raw values in one place and
on the same array (or a split of it) standardised in another (source only; the fixtures run
the rule end to end)."""

from __future__ import annotations

import ast

from graddoctor.rules.input_scaling_inconsistent import inconsistent_input_scaling

HEAD = "model = Net()\n"


def _found(src):
    return [(line, text, base, scaled) for line, text, _, base, scaled
            in inconsistent_input_scaling(ast.parse(HEAD + src))]


def test_raw_training_batch_by_name_standardised_evaluation():
    src = "u_in = u[idx]\np = model(u_in)\nq = model((u[400:] - m) / s)\n"
    assert _found(src) == [(2, "u[idx]", "u", 4)]


def test_a_split_evaluated_raw_after_standardised_training():
    src = "p = model(normalize(x_train[i]).float())\nq = model(x_test.to(dev))\n"
    assert _found(src) == [(3, "x_test", "x_test", 2)]


def test_consistent_calls_other_arrays_and_unbuilt_callables_are_silent():
    assert _found("p = model((x - m) / s)\nq = model((x_test - m) / s)\n") == []
    assert _found("p = model(x[i])\nq = model(x_test)\n") == []
    assert _found("p = model((x - m) / s)\nq = model(z)\n") == []
    assert inconsistent_input_scaling(ast.parse("p = f((x - m) / s)\nq = f(x)\n")) == []


def test_a_name_assigned_something_else_is_not_raw():
    src = "v = model(u0)\nv = v + noise\np = model(v)\nq = model((v - m) / s)\n"
    assert _found(src) == []


def test_a_network_named_like_a_scaling_helper_is_no_standardisation():
    # fast style transfer: the loss network gets the transformer network's output and the
    # content image itself
    src = ("transformer = TransformerNet()\nout = transformer(content)\n"
           "f_out = model(out)\nf_content = model(content)\n")
    assert _found(src) == []
    # a scaling helper that is no network of the file still counts
    src = "f_out = model(transform(content))\nf_content = model(content)\n"
    assert _found(src) == [(3, "content", "content", 2)]
