"""reference-from-trained-model (GD354): the values analysis/frozen_role_source.py reads as a
reference's (teacher's) output computed by the trained model, and the rule over a trace's
backwards."""

from __future__ import annotations

from textwrap import dedent

import pytest

from graddoctor.analysis.frozen_role_source import role_values_from_trained_model

_HEAD = """\
import copy
policy = LM()
ref = copy.deepcopy(policy)
opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
"""


def _read(tmp_path, text):
    path = tmp_path / "dpo.py"
    path.write_text(dedent(text))
    return [(line, role, value, trained, frozen) for line, role, value, trained, frozen
            in role_values_from_trained_model(str(path))]


@pytest.mark.parametrize("body, found", [
    ("for b in data:\n    with torch.no_grad():\n        ref_c = logps(policy, b)\n        ref_r = logps(ref, b)\n"
     "    use(ref_c, ref_logits, ref_chosen, logp_ref, teacher_logits, old_logps, prefix_ids, ref_logprobs, ref_all).backward()\n", [(7, "reference", "ref_c", "policy", "ref")]),
    ("for b in data:\n    ref_logits = policy(b)\n    use(ref_c, ref_logits, ref_chosen, logp_ref, teacher_logits, old_logps, prefix_ids, ref_logprobs, ref_all).backward()\n", [(6, "reference", "ref_logits", "policy", "ref")]),
    ("for b in data:\n    (ref_chosen, ref_rejected) = forward_pair(policy, b)\n    use(ref_c, ref_logits, ref_chosen, logp_ref, teacher_logits, old_logps, prefix_ids, ref_logprobs, ref_all).backward()\n",
     [(6, "reference", "ref_chosen", "policy", "ref")]),
    ("while True:\n    logp_ref = policy.forward(b)\n    use(ref_c, ref_logits, ref_chosen, logp_ref, teacher_logits, old_logps, prefix_ids, ref_logprobs, ref_all).backward()\n", [(6, "reference", "logp_ref", "policy", "ref")]),
])
def test_a_reference_value_from_the_policy_is_read(tmp_path, body, found):
    assert _read(tmp_path, _HEAD + body) == found


@pytest.mark.parametrize("body", [
    "for b in data:\n    ref_c = logps(ref, b)\n    use(ref_c, ref_logits, ref_chosen, logp_ref, teacher_logits, old_logps, prefix_ids, ref_logprobs, ref_all).backward()\n",
    "ref_c = logps(policy, b)\nfor b in data:\n    use(ref_c, ref_logits, ref_chosen, logp_ref, teacher_logits, old_logps, prefix_ids, ref_logprobs, ref_all).backward()\n",  # before training: the policy is the reference
    "for b in data:\n    with policy.disable_adapter():\n        ref_c = logps(policy, b)\n    use(ref_c, ref_logits, ref_chosen, logp_ref, teacher_logits, old_logps, prefix_ids, ref_logprobs, ref_all).backward()\n",
    "for b in data:\n    with torch.no_grad(), null_ref_context():\n        ref_c = logps(policy, b)\n    use(ref_c, ref_logits, ref_chosen, logp_ref, teacher_logits, old_logps, prefix_ids, ref_logprobs, ref_all).backward()\n",
    "for b in data:\n    old_logps = logps(policy, b)\n    use(ref_c, ref_logits, ref_chosen, logp_ref, teacher_logits, old_logps, prefix_ids, ref_logprobs, ref_all).backward()\n",  # PPO's old log-probs
    "for b in data:\n    ref_c = logps(policy, b)\n",  # no backward in the loop
    "for b in data:\n    prefix_ids = policy(b)\n    use(ref_c, ref_logits, ref_chosen, logp_ref, teacher_logits, old_logps, prefix_ids, ref_logprobs, ref_all).backward()\n",
])
def test_references_adapters_off_precomputed_and_old_logps_read_as_nothing(tmp_path, body):
    assert _read(tmp_path, _HEAD + body) == []


def test_no_frozen_model_kept_reads_as_nothing(tmp_path):
    text = ("policy = LM()\nopt = torch.optim.Adam(policy.parameters())\n"
            "for b in data:\n    ref_c = logps(policy, b)\n    use(ref_c, ref_logits, ref_chosen, logp_ref, teacher_logits, old_logps, prefix_ids, ref_logprobs, ref_all).backward()\n")
    assert _read(tmp_path, text) == []


def test_a_teacher_value_from_the_student(tmp_path):
    text = ("teacher = Big()\nstudent = Small()\nopt = torch.optim.SGD(student.parameters(), lr=0.1)\n"
            "for x in data:\n    with torch.no_grad():\n        teacher_logits = student(x)\n    use(ref_c, ref_logits, ref_chosen, logp_ref, teacher_logits, old_logps, prefix_ids, ref_logprobs, ref_all).backward()\n")
    assert _read(tmp_path, text) == [(6, "teacher", "teacher_logits", "student", "teacher")]


def test_the_rule_looks_only_at_files_whose_backwards_ran(tmp_path):
    from graddoctor.analysis import Analysis
    from graddoctor.rules import find_rule
    from graddoctor.trace import TraceBuilder

    script = tmp_path / "dpo.py"
    script.write_text(_HEAD + "for b in data:\n    ref_c = logps(policy, b)\n    use(ref_c, ref_logits, ref_chosen, logp_ref, teacher_logits, old_logps, prefix_ids, ref_logprobs, ref_all).backward()\n")
    rule = find_rule("reference-from-trained-model")()
    b = TraceBuilder(path=str(script))
    b.optimizer(0, [0], line=4)
    assert list(rule.check(Analysis(b.trace))) == []
    b.backward(fresh=[0], line=7)
    found = list(rule.check(Analysis(b.trace)))
    assert [f.location.line for f in found] == [6]
    assert found[0].fix == "compute `ref_c` with `ref`, not `policy`"


def test_a_step_function_that_calls_backward_is_read_as_the_loop(tmp_path):
    body = ("def train_step(b):\n    with torch.no_grad():\n        ref_logprobs = logps(policy, b)\n"
            "    use(ref_c, ref_logits, ref_chosen, logp_ref, teacher_logits, old_logps, prefix_ids, ref_logprobs, ref_all).backward()\n")
    assert _read(tmp_path, _HEAD + body) == [(7, "reference", "ref_logprobs", "policy", "ref")]
    # a function whose own loop trains: what it computes before the loop is the starting policy
    body = ("def train(data):\n    ref_all = logps(policy, data)\n    for b in data:\n"
            "        use(ref_c, ref_logits, ref_chosen, logp_ref, teacher_logits, old_logps, prefix_ids, ref_logprobs, ref_all).backward()\n")
    assert _read(tmp_path, _HEAD + body) == []


def test_an_adapter_switched_off_by_a_call_before_the_statement_reads_as_nothing(tmp_path):
    body = ("for b in data:\n    with torch.no_grad():\n        policy.disable_adapter_layers()\n"
            "        ref_c = logps(policy, b)\n        policy.enable_adapter_layers()\n    use(ref_c, ref_logits, ref_chosen, logp_ref, teacher_logits, old_logps, prefix_ids, ref_logprobs, ref_all).backward()\n")
    assert _read(tmp_path, _HEAD + body) == []


def test_a_reference_named_output_the_loop_never_reads_is_nothing(tmp_path):
    # one of a model's many outputs (a teacher computed under no_grad inside its forward)
    text = _HEAD + "for b in data:\n    logits, ref_c = policy(b)\n    ce(logits).backward()\n"
    assert _read(tmp_path, text) == []
