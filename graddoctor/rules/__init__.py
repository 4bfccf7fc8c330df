"""The rule registry. Importing it must not import torch (``graddoctor rules`` is instant)."""

from __future__ import annotations

from .base import Rule
from .eval_in_train_mode import EvalInTrainMode
from .frozen_bn_train_mode import FrozenBnTrainMode
from .misplaced_zero_grad import MisplacedZeroGrad
from .missing_zero_grad import MissingZeroGrad
from .param_not_in_optimizer import ParamNotInOptimizer
from .param_without_grad import ParamWithoutGrad
from .partial_zero_grad import PartialZeroGrad
from .stale_grad import StaleGrad
from .train_in_eval_mode import TrainInEvalMode

ALL_RULES: tuple[type[Rule], ...] = (
    MissingZeroGrad,
    PartialZeroGrad,
    StaleGrad,
    MisplacedZeroGrad,
    ParamNotInOptimizer,
    ParamWithoutGrad,
    FrozenBnTrainMode,
    TrainInEvalMode,
    EvalInTrainMode,
)


def find_rule(name: str) -> type[Rule] | None:
    """Look a rule up by slug or code, case-insensitively."""
    key = name.strip().lower()
    for rule in ALL_RULES:
        if key in (rule.slug, rule.code.lower()):
            return rule
    return None
