"""The rule registry. Importing it must not import torch (``graddoctor rules`` is instant)."""

from __future__ import annotations

from .accumulation_leftover import AccumulationLeftover
from .base import Rule
from .clip_before_backward import ClipBeforeBackward
from .clip_before_unscale import ClipBeforeUnscale
from .clip_in_accumulation import ClipInAccumulation
from .eval_in_train_mode import EvalInTrainMode
from .frozen_bn_train_mode import FrozenBnTrainMode
from .misplaced_zero_grad import MisplacedZeroGrad
from .missing_zero_grad import MissingZeroGrad
from .nonfinite_grad import NonfiniteGrad
from .param_not_in_optimizer import ParamNotInOptimizer
from .param_without_grad import ParamWithoutGrad
from .partial_zero_grad import PartialZeroGrad
from .scheduler_before_optimizer import SchedulerBeforeOptimizer
from .stale_grad import StaleGrad
from .train_in_eval_mode import TrainInEvalMode
from .unscaled_accumulation import UnscaledAccumulation

ALL_RULES: tuple[type[Rule], ...] = (
    MissingZeroGrad,
    PartialZeroGrad,
    StaleGrad,
    MisplacedZeroGrad,
    ParamNotInOptimizer,
    ParamWithoutGrad,
    # AMP, clipping, accumulation, schedules (GD2xx)
    ClipBeforeUnscale,
    ClipInAccumulation,
    ClipBeforeBackward,
    UnscaledAccumulation,
    AccumulationLeftover,
    SchedulerBeforeOptimizer,
    NonfiniteGrad,
    # BatchNorm and train/eval modes (GD3xx)
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
