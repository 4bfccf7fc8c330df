"""Optimizer settings by name: which setting a param group's key misspells, which keys belong
to other torch optimizers. Strings only (no torch)."""

from __future__ import annotations

# torch optimizers' settings, by name: a key of one of them in a group of an optimizer that has
# no such setting was meant for another update rule (momentum in an Adam group)
TORCH_SETTINGS = frozenset({
    "lr", "momentum", "dampening", "nesterov", "weight_decay", "betas", "eps", "alpha", "rho",
    "lr_decay", "initial_accumulator_value", "momentum_decay", "lambd", "t0", "etas",
    "step_sizes", "centered", "amsgrad", "maximize", "decoupled_weight_decay"})
# spellings of a setting that are not near it letter for letter
_ALIASES = {"learningrate": "lr", "lrrate": "lr", "learnrate": "lr", "wd": "weight_decay",
            "weightdecayrate": "weight_decay", "l2": "weight_decay", "epsilon": "eps",
            "beta": "betas", "maximise": "maximize"}


def _plain(key: str) -> str:
    return key.lower().replace("_", "").replace("-", "").replace(" ", "")


def _distance(a: str, b: str) -> int:
    """Levenshtein distance, with an adjacent swap counting one (``deacy``)."""
    rows = [list(range(len(b) + 1))]
    for i, ca in enumerate(a, 1):
        row = [i]
        for j, cb in enumerate(b, 1):
            cost = min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cost = min(cost, rows[-2][j - 2] + 1)
            row.append(cost)
        rows.append(row)
    return rows[-1][-1]


def meant_setting(key: str, settings) -> str | None:
    """The optimizer's setting that ``key`` misspells: the same letters but for case and
    underscores (``LR``, ``weightDecay``), a known alias (``learning_rate``, ``wd``,
    ``epsilon``), or one or two letters off a long name (``weight_deacy``, ``momentun``)."""
    plain = _plain(key)
    for setting in settings:
        if _plain(setting) == plain:
            return setting
    alias = _ALIASES.get(plain)
    if alias in settings:
        return alias
    best = None
    for setting in settings:
        target = _plain(setting)
        allowed = 2 if len(target) >= 8 else 1 if len(target) >= 4 else 0
        if allowed and _distance(plain, target) <= allowed:
            best = setting if best is None else best
    return best


def misspells(key: str, setting: str, settings) -> bool:
    """Whether ``key`` is a misspelling of ``setting`` among ``settings``."""
    return meant_setting(key, settings) == setting
