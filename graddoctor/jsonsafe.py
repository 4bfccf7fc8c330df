"""Standard JSON only: NaN and ±Infinity become the strings "nan", "inf", "-inf".

Python's ``json`` writes ``NaN`` / ``Infinity`` literals that strict parsers (JavaScript, jq,
most CI tools, code-scanning uploads) reject. Gradient norms and GradScaler scales are exactly
where such values show up. Every JSON document graddoctor writes goes through ``dumps``.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _key(key: Any) -> Any:
    """A dict key json accepts as is (str, int, finite float, bool, None), else its text."""
    if isinstance(key, float):
        return key if math.isfinite(key) else str(key)
    return key if key is None or isinstance(key, (str, int)) else str(key)


def json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {_key(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def restore_non_finite(value: Any) -> Any:
    """The inverse of ``json_safe`` for numbers: "inf", "-inf" and "nan" become floats again,
    so a document read back (a trace written with --trace) means what it meant when written.
    A string that is exactly one of those three words is taken for the number it stands for."""
    if isinstance(value, str):
        return _NON_FINITE.get(value, value)
    if isinstance(value, dict):
        return {key: restore_non_finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [restore_non_finite(item) for item in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``json_safe(value)``: strict JSON (``allow_nan=False``); what json
    cannot write (a tensor, a path) is written as its ``str``."""
    return json.dumps(json_safe(value), default=str, allow_nan=False, **kwargs)
