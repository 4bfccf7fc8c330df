"""unpacked-slices-mismatched (GD369): the source search for tuple unpackings whose parallel
subscripts disagree, and the rule over a trace whose backward names the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.unpacked_slices_mismatched import mismatched_unpackings
from graddoctor.trace import TraceBuilder

SLUG = "unpacked-slices-mismatched"


def _found(src: str):
    return [(h["line"], h["kind"], h["names"]) for h in mismatched_unpackings(ast.parse(src))]


def test_one_part_given_to_two_names_is_found():
    assert _found("out = net(x)\nmu, log_var = out[:, 0:1], out[:, 0:1]\n") == [
        (2, "duplicate", ("mu", "log_var"))]
    assert _found("loc, scale = p[..., 0], p[..., 0]\n") == [(1, "duplicate", ("loc", "scale"))]


def test_aligned_arrays_sliced_at_other_rows_are_found_with_the_slice_to_change():
    src = ("x_tr, y_tr = x[:2000], labels[:2000]\n"
           "x_cal, y_cal = x[2000:2500], labels[2500:3000]\n"
           "x_te, y_te = x[2500:], labels[2500:]\n")
    hits = mismatched_unpackings(ast.parse(src))
    assert [(h["line"], h["kind"]) for h in hits] == [(2, "rows")]
    assert hits[0]["fixed"] == "labels[2000:2500]"
    assert hits[0]["sibling"] == 1
    # the inputs' slice is the one landing on another split's rows
    swapped = ("a_tr, b_tr = a[:100], b[:100]\n"
               "a_va, b_va = a[:50], b[100:150]\n")
    assert mismatched_unpackings(ast.parse(swapped))[0]["fixed"] == "a[100:150]"


def test_right_unpackings_stay_silent():
    for src in (
        "mu, log_var = out[:, 0:1], out[:, 1:2]\n",                   # two columns
        "inp, tgt = seq[:, :-1], seq[:, 1:]\n",                        # next-step targets
        "xb, yb = x[idx], y[idx]\n",                                  # one index, two arrays
        "a, b = x[i], x[i]\n",                                        # no fixed part
        "first, kept = x[0], x[0]\nfirst = first * 2\n",              # a copy kept before an edit
        "x_lag, y_next = x[:-1], y[1:]\nx_tr, y_tr = x[:800], y[:800]\n",  # a lag: no literal rows
        "x_a, y_b = x[:100], y[100:200]\n",                           # never paired at one range
        "x_a, y_b = x[:100], y[50:150]\nx_tr, y_tr = x[:800], y[:800]\n",  # overlapping rows
        "mu, log_var = out.chunk(2, 1)\n",                            # a call
    ):
        assert _found(src) == [], src


def test_the_finding_is_a_warning_at_the_unpacking(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("out = net(x)\n"
                      "mu, log_var = out[:, 0:1], out[:, 0:1]\n"
                      "loss.backward()\n")
    t = TraceBuilder(str(script))
    t.backward(line=3)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [2]
    assert found[0].severity is Severity.WARNING
    assert "log_var" in found[0].fix


def test_a_copied_call_keeping_the_first_calls_part_is_found():
    from graddoctor.rules.unpacked_slices_mismatched import copied_calls

    def found(src):
        return [(h["line"], h["first"], h["text"]) for h in copied_calls(ast.parse(src))]

    src = ("x, v = X[idx], valid[idx]\n"
           "a = masked_mse(r, yr, v[:, 0:1])\n"
           "b = masked_mse(r2, yr2, v[:, 0:1])\n"
           "c = masked_mse(r3, yr3, valid[:, 1:])\n")
    assert found(src) == [(3, 2, "v[:, 0:1]")]
    # the other column only assigned, never given to a call: nothing says it was meant here
    assert found(src.replace("c = masked_mse(r3, yr3, valid[:, 1:])", "m = valid[:, 1:]")) == []
    src = ("l1 = f(p1, y[:, 0], m[:, 0])\n"
           "l2 = f(p2, y[:, 1], m[:, 1])\n"
           "l3 = f(p3, y[:, 2], m[:, 1])\n")
    assert found(src) == [(3, 2, "m[:, 1]")]
    for quiet in (
        "a = F.mse_loss(q1, t[:, 0:1])\nb = F.mse_loss(q2, t[:, 0:1])\n",          # twin critics
        "a = f(p1, y[:, 0], m[:, 0])\nb = f(p2, y[:, 1], m[:, 1])\n",              # each its own
        "a = f(p1, y[:, 0], both)\nb = f(p2, y[:, 1], both)\n",                    # one shared mask
        "a = f(pred, y[:, 0], m[:, 0])\nb = f(other, y[:, 1], m[:, 0])\nc = m[:, 1]\n",  # not siblings
        "a = f(p1, m[:, 0], k=1)\nb = f(p2, m[:, 0], k=1)\nc = m[:, 1]\n",         # keywords
    ):
        assert found(quiet) == [], quiet


def test_the_copied_call_is_a_warning_at_the_later_call(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("a = masked_mse(r, yr, v[:, 0:1])\n"
                      "b = masked_mse(r2, yr2, v[:, 0:1])\n"
                      "c = masked_mse(r3, yr3, v[:, 1:2])\n"
                      "loss.backward()\n")
    t = TraceBuilder(str(script))
    t.backward(line=4)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [2]
    assert found[0].severity is Severity.WARNING
    assert found[0].related[0].location.line == 1


def test_one_of_a_pair_reordered_alone_is_found_and_its_fix_reorders_both():
    src = ("xs, ys = draw(8, 16)\nperm = torch.randperm(16)\n"
           "x_ctx, y_ctx = xs[:, perm], ys\n")
    hits = [h for h in mismatched_unpackings(ast.parse(src)) if h["kind"] == "permuted"]
    assert [(h["line"], h["names"], h["fixed"]) for h in hits] == [
        (3, ("x_ctx", "y_ctx"), "ys[:, perm]")]


def test_pairs_reordered_together_later_or_not_a_pair_are_silent():
    head = "xs, ys = draw(8, 16)\nperm = torch.randperm(16)\n"
    for tail in ("a, b = xs[:, perm], ys[:, perm]\n",
                 "a, b = xs[:, perm], ys\nb = b[:, perm]\n",
                 "a, b = xs[:, perm], other\n",
                 "a, b = xs[:, 0:4], ys\n"):
        assert [h for h in mismatched_unpackings(ast.parse(head + tail))
                if h["kind"] == "permuted"] == [], tail
