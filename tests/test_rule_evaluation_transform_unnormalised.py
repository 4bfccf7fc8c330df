"""evaluation-transform-unnormalised (GD382): the source search for an evaluation pipeline
that leaves out the training pipeline's standardisation, and the rule over a trace whose
backward names the script."""

from __future__ import annotations

import ast

from graddoctor.analysis import Analysis
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.rules.evaluation_transform_unnormalised import unnormalised_evaluation
from graddoctor.trace import TraceBuilder

SLUG = "evaluation-transform-unnormalised"


def _found(src):
    return [(line, ev, tr) for line, ev, tr, _ in unnormalised_evaluation(ast.parse(src))]


def test_an_evaluation_pipeline_without_the_training_normalisation_is_found():
    src = (
        "import torchvision.transforms as T\n"                                             # 1
        "train_tf = T.Compose([T.RandomCrop(32, 4), T.ToTensor(), T.Normalize(M, S)])\n"   # 2
        "test_tf = T.Compose([T.ToTensor()])\n"                                            # 3
        "def train_transform(x):\n"                                                        # 4
        "    return (x - MEAN) / STD\n"                                                    # 5
        "def eval_transform(x):\n"                                                         # 6
        "    x = x.float()\n"                                                              # 7
        "    return x\n")                                                                  # 8
    assert _found(src) == [(3, "test_tf", "train_tf"), (8, "eval_transform", "train_transform")]


def test_pipelines_that_agree_or_cannot_be_paired_are_left_alone():
    src = (
        "import torchvision.transforms as T\n"
        "train_tf = T.Compose([T.ToTensor(), T.Normalize(M, S)])\n"
        "val_tf = T.Compose([T.ToTensor(), T.Normalize(M, S)])\n"
        "def train_transform(x):\n"
        "    return (x - MEAN) / STD\n"
        "def test_transform(x):\n"
        "    return train_transform(x)\n"
        "def train_aug(x):\n"                 # neither normalises: the model does
        "    return x.flip(-1)\n"
        "def eval_aug(x):\n"
        "    return x\n"
        "preprocess = T.Compose([T.ToTensor()])\n")   # no train/eval in its name
    assert _found(src) == []


def test_standardisation_written_as_methods_or_functions_counts():
    # the centre subtracted and the scale divided through tensor methods or torch functions
    for body in ("x.sub(MEAN).div(STD)", "x.sub_(MEAN).div_(STD)", "torch.div(torch.sub(x, MEAN), STD)",
                 "(x - MEAN).div(STD)", "x.sub(self.mean) / self.std"):
        src = ("def train_transform(x):\n    return (x - MEAN) / STD\n"
               f"def eval_transform(x):\n    return {body}\n")
        assert _found(src) == [], body
        flipped = (f"def train_transform(x):\n    return {body}\n"
                   "def eval_transform(x):\n    return x.float()\n")
        assert _found(flipped) == [(4, "eval_transform", "train_transform")], body
    # a division of an uncentred value, or a subtraction alone, is no standardisation
    for body in ("x.div(STD)", "x.sub(MEAN)", "x.div(255.0)"):
        src = ("def train_transform(x):\n    return (x - MEAN) / STD\n"
               f"def eval_transform(x):\n    return {body}\n")
        assert _found(src) == [(4, "eval_transform", "train_transform")], body


def test_the_finding_points_at_the_evaluation_pipeline(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "train_tf = T.Compose([T.ToTensor(), T.Normalize(M, S)])\n"                        # 1
        "test_tf = T.Compose([T.ToTensor()])\n"                                            # 2
        "loss.backward()\n")                                                               # 3
    t = TraceBuilder(str(script))
    t.backward(line=3)
    found = list(find_rule(SLUG)().check(Analysis(t.trace)))
    assert [f.location.line for f in found] == [2]
    assert found[0].severity is Severity.WARNING
