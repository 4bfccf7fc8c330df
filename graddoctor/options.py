"""Options of one check, frozen: the CLI builds them, the library reads them."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_STEPS = 10
DEFAULT_TIMEOUT = 600.0
DEFAULT_EPOCH_BATCHES = 17  # see instrument/dataloader.py for why 17


@dataclass(frozen=True)
class CheckOptions:
    target: str
    args: tuple[str, ...] = ()
    module: bool = False  # target is a module name (python -m)
    steps: int = DEFAULT_STEPS  # optimizer steps to replay; 0 = no limit
    timeout: float | None = DEFAULT_TIMEOUT  # seconds; None or 0 = no limit
    device: str = "auto"  # auto | cpu | cuda
    fail_on: str = "warning"  # error | warning | info | never
    select: tuple[str, ...] = ()  # rule slugs or code prefixes; empty = all
    ignore: tuple[str, ...] = ()
    trace_path: str | None = None
    epoch_batches: int = DEFAULT_EPOCH_BATCHES  # batches per DataLoader epoch in the replay; 0 = real
    redirect_stdout: bool = False  # send the script's prints to stderr (machine output on stdout)
    config_path: str | None = None  # the pyproject.toml whose [tool.graddoctor] was applied
