"""Standard JSON only: NaN and ±Infinity become the strings "nan", "inf", "-inf".

Python's ``json`` writes ``NaN`` / ``Infinity`` literals that strict parsers (JavaScript, jq,
most CI tools) reject. Gradient norms are exactly where such values show up.
"""

from __future__ import annotations

import math
from typing import Any


def json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value
