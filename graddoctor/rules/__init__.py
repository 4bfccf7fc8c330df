"""The rule registry: every rule module in this package, found by itself.

A rule is one file here, named after its slug (``missing_zero_grad.py`` holds
``missing-zero-grad``), with one ``Rule`` subclass in it; adding the file registers it (in code
order). ``base``, ``docs`` and ``notes`` are the shared pieces and ``engine`` selects and runs
the rules: not rules.
Importing this must not import torch (``graddoctor rules`` is instant).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from .base import Rule

NOT_RULES = {"base", "docs", "engine", "notes"}


def _discover() -> tuple[type[Rule], ...]:
    found: list[type[Rule]] = []
    for info in pkgutil.iter_modules(__path__):
        if info.name in NOT_RULES or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        found.extend(obj for obj in vars(module).values()
                     if inspect.isclass(obj) and issubclass(obj, Rule) and obj is not Rule
                     and obj.__module__ == module.__name__ and not obj.__name__.startswith("_"))
    return tuple(sorted(found, key=lambda rule: rule.code))


ALL_RULES: tuple[type[Rule], ...] = _discover()


def find_rule(name: str) -> type[Rule] | None:
    """Look a rule up by slug or code, case-insensitively."""
    key = name.strip().lower()
    for rule in ALL_RULES:
        if key in (rule.slug, rule.code.lower()):
            return rule
    return None
