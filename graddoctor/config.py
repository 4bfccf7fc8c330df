"""``[tool.graddoctor]`` in pyproject.toml: found from the script's folder upward and read.
Its keys and values are validated by the option table, and overridden by whatever the user
typed, in the one resolver (options.py ``load_config``, ``resolve``): every option of ``check``
is a key (its long flag without the dashes) but the rows marked ``cli_only``. No torch here.

    [tool.graddoctor]
    steps = 20
    epoch-batches = 17
    device = "cpu"              # or: emulate-cuda = true (a GPU script's GPU path, on the CPU)
    fail-on = "error"
    select = ["GD1"]
    ignore = ["param-without-grad"]
    timeout = 300
    grad-flow = true
    allow-incomplete = false
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Config:
    path: str | None = None  # the pyproject.toml it came from; None = no configuration found
    values: Mapping[str, Any] = field(default_factory=dict)  # python names: fail_on, not fail-on


def _toml_reader():
    """tomllib (3.11+), else tomli when installed, else None."""
    try:
        import tomllib

        return tomllib
    except ModuleNotFoundError:
        try:
            import tomli

            return tomli
        except ModuleNotFoundError:
            return None


def read_table(path: str) -> dict | None:
    """The ``[tool.graddoctor]`` table of one pyproject.toml, or None when it has none."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror})") from None
    if b"graddoctor" not in raw:  # cheap: most pyproject.toml files never mention us
        return None
    toml = _toml_reader()
    if toml is None:
        raise ConfigError(
            f"{path} has a [tool.graddoctor] table, and reading it needs Python 3.11+ or the "
            "'tomli' package: pip install tomli")
    try:
        data = toml.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, toml.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    table = data.get("tool", {}).get("graddoctor")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.graddoctor] must be a table")
    return table


def find_config(start_dir: str) -> str | None:
    """The closest pyproject.toml with a ``[tool.graddoctor]`` table, from start_dir upward."""
    folder = os.path.abspath(start_dir)
    while True:
        candidate = os.path.join(folder, "pyproject.toml")
        if os.path.isfile(candidate) and read_table(candidate) is not None:
            return candidate
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent
