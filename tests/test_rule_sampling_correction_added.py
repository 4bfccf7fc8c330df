"""sampling-correction-added (GD349): sums adding a log sampling probability to scores, read from
the source (analysis/sampling_correction.py), and the rule."""

from __future__ import annotations

from graddoctor.analysis.sampling_correction import corrections_added
from graddoctor.trace import TraceBuilder
from rule_traces import findings

SLUG = "sampling-correction-added"


def _lines(tmp_path, text):
    script = tmp_path / "train.py"
    script.write_text(text)
    return [line for line, _, _ in corrections_added(str(script))]


def test_added_corrections_in_each_spelling_are_read(tmp_path):
    assert _lines(tmp_path, "logits = logits + torch.log(q[items])\n"
                            "scores = scores + sampling_probs.log()\n"
                            "logits += log_sampling_prob\n"
                            "sim = sim.add(self.log_q)\n"
                            "x = logits + log_expected_count[s].unsqueeze(0)\n") == [1, 2, 3, 4, 5]


def test_subtracted_signed_or_prior_corrections_are_not(tmp_path):
    assert _lines(tmp_path, "logits = logits - log_q\n"
                            "logits = logits + neg_log_q[items]\n"
                            "logits = logits + tau * torch.log(prior)\n"
                            "logits = logits + torch.log(class_freq)\n"
                            "out = h + log_q\n"
                            "log_w = log_p - log_q\n") == []


def test_the_rule_reads_the_files_whose_backwards_ran(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\n"
                      "logits = scores_of(batch)\n"
                      "logits = logits + log_q[batch]\n"
                      "loss = logits.logsumexp(1).mean()\n"
                      "loss.backward()\n")
    t = TraceBuilder(str(script))
    t.backward(line=5)
    found = findings(t, SLUG)
    assert [f.location.line for f in found] == [3]
    assert "log_q[batch]" in found[0].message and "`-`" in found[0].fix
    assert findings(TraceBuilder(str(script)), SLUG) == []  # no backward ran in the file
