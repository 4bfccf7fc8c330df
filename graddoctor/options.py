"""Every option of ``graddoctor check``, defined once (``OPTIONS``), and the frozen
``CheckOptions`` the library gets.

One row per option: its python name, command-line flags (the long one, without its dashes, is
also its ``[tool.graddoctor]`` key, unless the row says why it is ``cli_only``), kind (type,
choices, validation), default and help. The CLI builds its options from the rows, config.py reads the pyproject keys and validates the values with them,
and ``check.validated`` validates library callers' values with them. No torch, no typer here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Literal, Optional

from .report.formats import FORMATS

# who gave the value (the command line is typer's): "library" speaks of --flags (the CLI's own
# checks, CheckOptions), "python" of keyword arguments (graddoctor.check_script / watch)
Source = Literal["config", "library", "python"]


class Invalid(ValueError):
    """A value the option cannot take (the caller words the message: ``Option.error``)."""


# -- kinds: a type, what a valid value is, how to check one ---------------------------------

class Kind:
    annotation: Any = str  # the python type the command line parses into
    requirement = "a string"  # "<name> must be <requirement>"
    says_value = True  # messages end with ", not <value>"

    def check(self, value: Any, source: Source) -> Any:
        """The value, normalised; ``Invalid`` when the option cannot take it."""
        return value

    def cli(self) -> dict:
        """Constraints typer enforces on the command line."""
        return {}

    def cli_default(self, default: Any) -> Any:
        return default

    def describe(self, source: Source) -> str:
        return self.requirement


@dataclass(frozen=True)
class Count(Kind):
    """A whole number >= 0 (booleans are not numbers here)."""

    annotation = int
    requirement = "a whole number >= 0"

    def check(self, value, source):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise Invalid(value)
        return value

    def cli(self):
        return {"min": 0}


@dataclass(frozen=True)
class Seconds(Kind):
    """A number >= 0, not NaN. A pyproject value must be a TOML number; the library takes
    whatever ``float()`` reads (as it always has) and None (no limit)."""

    annotation = float
    requirement = "a number >= 0"

    def check(self, value, source):
        if source in ("library", "python"):
            if value is None:
                return None
            try:
                seconds = float(value)
            except (TypeError, ValueError):
                raise Invalid(value) from None
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Invalid(value)
        else:
            seconds = float(value)
        if math.isnan(seconds) or seconds < 0:
            raise Invalid(value)
        return seconds

    def cli(self):
        return {"min": 0}

    def describe(self, source):
        return "a number of seconds >= 0" if source != "config" else self.requirement


@dataclass(frozen=True)
class Choice(Kind):
    choices: tuple[str, ...] = ()

    @property
    def annotation(self):
        return Literal[self.choices]

    @property
    def requirement(self):
        return f"one of {', '.join(self.choices)}"

    def check(self, value, source):
        if value not in self.choices:
            raise Invalid(value)
        return str(getattr(value, "value", value))  # a str Enum member: its value


@dataclass(frozen=True)
class Selectors(Kind):
    """Rule selectors (slugs or code prefixes): a string or a list of strings, each of them
    possibly comma-separated; normalised to a flat tuple."""

    annotation = Optional[List[str]]
    requirement = "a string or a list of strings"
    says_value = False

    def check(self, value, source):
        items = [value] if isinstance(value, str) else value
        if items is None:
            return ()
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
            raise Invalid(value)
        return split_selectors(items)

    def cli_default(self, default):
        return None  # nothing typed (typer's list options start from None)


@dataclass(frozen=True)
class Flag(Kind):
    """On or off. A pyproject value must be a TOML boolean; the library takes any truth value."""

    annotation = bool
    requirement = "true or false"

    def cli(self):
        return {"show_default": False}  # "[default: no-grad-flow]" says nothing

    def check(self, value, source):
        if source == "config" and not isinstance(value, bool):
            raise Invalid(value)
        return bool(value)


@dataclass(frozen=True)
class File(Kind):
    annotation = Optional[str]


def split_selectors(items) -> tuple[str, ...]:
    """``["GD1,stale-grad", "GD2"]`` -> ``("GD1", "stale-grad", "GD2")``."""
    return tuple(part.strip() for item in items or () for part in item.split(",") if part.strip())


# -- the table -------------------------------------------------------------------------------

NOT_IN_WATCH = type("NotInWatch", (), {"__repr__": lambda self: "NOT_IN_WATCH"})()

@dataclass(frozen=True)
class Option:
    name: str  # the python name: the CLI's parameter, the config's value key
    flags: tuple[str, ...]  # on the command line, the long one first
    kind: Kind
    default: Any
    help: str
    field: str | None = None  # the CheckOptions field; None: the CLI's own (report rendering)
    zero: str = ""  # what 0 means, for a count or a time
    cli_only: str = ""  # why it cannot be set in [tool.graddoctor]; "": it can (the default)
    # graddoctor.watch(): its default there (a block of the caller's own code is watched whole:
    # no step budget, real DataLoader epochs); NOT_IN_WATCH: an option of scripts only
    watch: Any = None

    @property
    def flag(self) -> str:
        return self.flags[0]

    @property
    def config_key(self) -> str | None:
        """Its key in [tool.graddoctor] (the long flag without dashes), None for CLI-only."""
        return None if self.cli_only else self.flag[2:]

    @property
    def negative_flags(self) -> tuple[str, ...]:
        """``--no-grad-flow``: a flag that can be switched on in the config can be switched off
        on the command line."""
        return (f"--no-{self.flag[2:]}",) if isinstance(self.kind, Flag) and self.config_key else ()

    def check(self, value: Any, source: Source, where: str = "") -> Any:
        """The value, normalised; ``ValueError`` with the message for ``source`` (``where``:
        the pyproject.toml, for a config value)."""
        try:
            return self.kind.check(value, source)
        except Invalid:
            raise ValueError(self.error(value, source, where)) from None

    def error(self, value: Any, source: Source, where: str = "") -> str:
        if source == "config":
            subject, hint = f"{where}: [tool.graddoctor] {self.config_key}", ""
        elif source == "python":
            subject, hint = self.name, f" (0 = {self.zero})" if self.zero else ""
        else:
            subject, hint = self.flag, f" (0 = {self.zero})" if self.zero else ""
        message = f"{subject} must be {self.kind.describe(source)}{hint}"
        return f"{message}, not {value!r}" if self.kind.says_value else message


def _format_help() -> str:
    listed = ", ".join(f"{f.name} ({f.summary})" if f.summary else f.name for f in FORMATS.values())
    return f"Report format: {listed}."


_SELECTORS_HELP = "these rules (slug or code prefix; repeatable or comma-separated)."

OPTIONS: dict[str, Option] = {o.name: o for o in (
    Option("module", ("--module", "-m"), Flag(), False,
           "Run SCRIPT as a module, like `python -m`.", field="module", watch=NOT_IN_WATCH,
           cli_only="it says what SCRIPT is, which the command line gives"),
    Option("steps", ("--steps",), Count(), 10,
           "Updates to replay (0 = run to the end); the optimizer steps after one backward count "
           "once. A DataLoader-driven script goes on until its third epoch has begun (two epoch "
           "boundaries), at most 2 x epoch-batches + 1 steps, and every optimizer steps twice "
           "(at most 8 x the budget).", field="steps", zero="run to the end", watch=0),
    Option("epoch_batches", ("--epoch-batches",), Count(), 17,  # see instrument/dataloader.py
           "Batches per DataLoader epoch in the replay (0 = the real length). The default, 17, is "
           "larger than and not divisible by the common accumulation factors, so epoch-end bugs "
           "show.", field="epoch_batches", zero="the real length", watch=0),
    Option("timeout", ("--timeout",), Seconds(), 600.0,
           "Wall-clock limit in seconds (0 = none).", field="timeout",
           zero="no limit", watch=NOT_IN_WATCH),
    Option("device", ("--device",), Choice(("auto", "cpu", "cuda")), "auto",
           "auto: as the script decides; cpu: hide CUDA; cuda: require it.",
           field="device", watch=NOT_IN_WATCH),
    Option("emulate_cuda", ("--emulate-cuda",), Flag(), False,
           "Run the script's GPU path on this CPU: torch.cuda answers as one GPU per local rank, "
           "tensors put on 'cuda' live on the CPU, autocast('cuda') runs as CPU autocast, a "
           "GradScaler is enabled, nccl becomes gloo (docs/emulate-cuda.md).",
           field="emulate_cuda", watch=False),
    Option("format", ("--format", "-f"), Choice(tuple(FORMATS)), "text", _format_help(),
           cli_only="a report goes where one run sends it: see --output", watch=NOT_IN_WATCH),
    Option("output", ("--output", "-o"), File(), None,
           "Write the report to this file instead of stdout; without --format, a .json or "
           ".sarif name sets the format.", cli_only="a file of one run",
           watch=NOT_IN_WATCH),
    Option("fail_on", ("--fail-on",), Choice(("error", "warning", "info", "never")), "warning",
           "Exit 1 when a finding is at least this severe.", field="fail_on", watch="warning"),
    Option("trace", ("--trace",), File(), None,
           "Also write the recorded events as JSON lines (for bug reports).", field="trace_path",
           cli_only="a file of one run", watch=None),
    Option("select", ("--select",), Selectors(), (), f"Only {_SELECTORS_HELP}", field="select",
           watch=()),
    Option("ignore", ("--ignore",), Selectors(), (), f"Skip {_SELECTORS_HELP}", field="ignore",
           watch=()),
    Option("grad_flow", ("--grad-flow",), Flag(), False,
           "Text report: add the per-layer gradient norms of the last update.", watch=NOT_IN_WATCH),
    Option("plot", ("--plot",), File(), None,
           "Also draw the gradient flow to this .png, .svg or .pdf file (matplotlib: pip install "
           "'graddoctor[plots]'): mean and max gradient per layer, and the heatmap of every update.",
           cli_only="a file of one run", watch=NOT_IN_WATCH),
    Option("allow_incomplete", ("--allow-incomplete",), Flag(), False,
           "Judge a run that crashed or timed out after its first backward or step by its "
           "findings alone (exit 0 or 1), like a complete check; by default such an incomplete check "
           "exits 2.", field="allow_incomplete", watch=NOT_IN_WATCH),
    Option("diff", ("--diff",), Flag(), False,
           "Print the fixes of the findings that have one as a unified diff (each verified by "
           "running the fixed script; each hunk says its fix's safety and verification) instead "
           "of the report; writes nothing.", cli_only="an action of one run, not a setting",
           watch=NOT_IN_WATCH),
    Option("fix", ("--fix",), Flag(), False,
           "Apply the safe fixes in place, those verified by running the fixed script (a temporary "
           "copy, same options and arguments); never into a file changed since the check.",
           cli_only="it changes files: typed each time", watch=NOT_IN_WATCH),
    Option("unsafe_fixes", ("--unsafe-fixes",), Flag(), False,
           "With --diff/--fix: also the unsafe fixes (they change behaviour a person should judge).",
           cli_only="it changes files: typed each time", watch=NOT_IN_WATCH),
    Option("no_verify", ("--no-verify",), Flag(), False,
           "With --diff/--fix: do not run the fixed script; --fix then writes unverified fixes.",
           cli_only="it changes files: typed each time", watch=NOT_IN_WATCH),
    Option("nproc_per_node", ("--nproc-per-node",), Count(), 0,
           "Check a distributed script: start this many ranks through torch.distributed.run (as "
           "torchrun does, on this machine) and merge their reports into one.",
           zero="a single process", cli_only="a way to launch one run, not a setting of the script",
           watch=NOT_IN_WATCH),
)}

CONFIG_KEYS: dict[str, Option] = {o.config_key: o for o in OPTIONS.values() if o.config_key}
"""[tool.graddoctor] key -> its option: every option but the ``cli_only`` ones."""
CLI_ONLY: dict[str, Option] = {o.name: o for o in OPTIONS.values() if o.cli_only}
# the keyword arguments of graddoctor.check_script (the options of a check, by python name) and
# of graddoctor.watch() (those that mean something for a block of the caller's own code)
SCRIPT_OPTIONS: dict[str, Option] = {o.name: o for o in OPTIONS.values() if o.field}
WATCH_OPTIONS: dict[str, Option] = {o.name: o for o in OPTIONS.values() if o.field
                                    and o.watch is not NOT_IN_WATCH}
DEFAULT_STEPS = OPTIONS["steps"].default


def split_script_arguments(tokens: list[str]) -> tuple[list[str], list[str]] | None:
    """The arguments of ``graddoctor check`` (after ``check``) split into graddoctor's own and
    those meant for the script, which belong after ``--``: ``train.py --lr 0.5 --steps 3`` ->
    (``train.py --steps 3``, ``--lr 0.5``). An unknown option, the values after it and any
    argument after the script are the script's. None when an unknown option comes before the
    script (then it is no script argument: a typo)."""
    takes_value = {flag: not isinstance(o.kind, Flag) for o in OPTIONS.values()
                   for flag in (*o.flags, *o.negative_flags)}
    takes_value.update({"-h": False, "--help": False})
    ours: list[str] = []
    script: list[str] = []
    seen_script = False
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token == "--":
            script += tokens[i:]
            break
        name = token.split("=", 1)[0]
        if name in takes_value:
            ours.append(token)
            if takes_value[name] and "=" not in token and i < len(tokens):
                ours.append(tokens[i])
                i += 1
        elif token.startswith("-") and token != "-":
            if not seen_script:
                return None
            script.append(token)
            while i < len(tokens) and not tokens[i].startswith("-"):  # its values
                script.append(tokens[i])
                i += 1
        elif not seen_script:
            ours.append(token)
            seen_script = True
        else:
            script.append(token)
    return ours, script
DEFAULT_TIMEOUT = OPTIONS["timeout"].default
DEFAULT_EPOCH_BATCHES = OPTIONS["epoch_batches"].default  # see instrument/dataloader.py for why 17


@dataclass(frozen=True)
class CheckOptions:
    target: str
    args: tuple[str, ...] = ()
    module: bool = OPTIONS["module"].default  # target is a module name (python -m)
    steps: int = DEFAULT_STEPS  # optimizer steps to replay; 0 = no limit
    timeout: float | None = DEFAULT_TIMEOUT  # seconds; None or 0 = no limit
    device: str = OPTIONS["device"].default  # one of its choices in OPTIONS
    emulate_cuda: bool = OPTIONS["emulate_cuda"].default  # GPU path, tensors on the CPU
    fail_on: str = OPTIONS["fail_on"].default  # one of its choices in OPTIONS
    select: tuple[str, ...] = ()  # rule slugs or code prefixes; empty = all
    ignore: tuple[str, ...] = ()
    trace_path: str | None = None
    allow_incomplete: bool = OPTIONS["allow_incomplete"].default  # crashed/timeout after steps: exit by findings
    epoch_batches: int = DEFAULT_EPOCH_BATCHES  # batches per DataLoader epoch in the replay; 0 = real
    redirect_stdout: bool = False  # send the script's prints to stderr (machine output on stdout)
    config_path: str | None = None  # the pyproject.toml whose [tool.graddoctor] was applied
    # record every update's gradient norms for a picture (HTML report, --plot, --grad-flow)
    grad_flow: bool = False
