"""Every option of ``graddoctor check``, defined once (``OPTIONS``), the frozen
``CheckOptions`` the library gets, and the one resolver every front door goes through.

One row per option: its python name, command-line flags (the long one, without its dashes, is
also its ``[tool.graddoctor]`` key, unless the row says why it is ``cli_only``), kind (type,
choices, validation), default and help. The CLI builds its options from the rows; config.py
finds and reads ``[tool.graddoctor]``, whose keys and values are validated here.

Resolution happens once per door, here: ``resolve()`` for a script check (the CLI's
``check``, ``check_script()``; the pyproject.toml under what was given), ``resolve_watch()``
for a block of the caller's own code (``watch()``, and the notebook magic and the pytest
plugin, which are built on it), ``check_values()`` for the few options of ``graddoctor
merge``. The run side takes the ``CheckOptions`` it is handed as they are. No torch, no typer
here.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, List, Literal, Mapping, Optional, Sequence

from .config import Config, ConfigError, find_config, read_table
from .errors import ScriptError

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


def _output_help() -> str:
    from .report.formats import SUFFIXES

    by_format: dict[str, list[str]] = {}
    for suffix, name in SUFFIXES.items():
        by_format.setdefault(name, []).append(suffix)
    named = "; ".join(f"{' or '.join(s)}: {name}" for name, s in by_format.items())
    return (f"Write the report to this file instead of stdout. Without --format the file's name "
            f"sets the format ({named}; any other name: text).")


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
           "(at most 8 x the budget). A later training phase of the script (a student after its "
           "teacher, fine-tuning after pre-training) gets as many updates again.", field="steps", zero="run to the end", watch=0),
    Option("epoch_batches", ("--epoch-batches",), Count(), 17,  # see instrument/dataloader.py
           "Batches per DataLoader epoch in the replay (0 = the real length). The default, 17, is "
           "larger than and not divisible by the common accumulation factors, so epoch-end bugs "
           "show.", field="epoch_batches", zero="the real length", watch=0),
    Option("timeout", ("--timeout",), Seconds(), 600.0,
           "Wall-clock limit in seconds (0 = none).", field="timeout",
           zero="no limit", watch=NOT_IN_WATCH),
    Option("device", ("--device",), Choice(("auto", "cpu", "cuda")), "auto",
           "auto: as the script decides (a script that stops for want of a GPU before it trains is "
           "run again on an emulated one, see --emulate-cuda); cpu: hide CUDA; cuda: require it.",
           field="device", watch=NOT_IN_WATCH),
    Option("emulate_cuda", ("--emulate-cuda",), Flag(), False,
           "Run the script's GPU path on this CPU: torch.cuda answers as one GPU per local rank, "
           "tensors put on 'cuda' live on the CPU, autocast('cuda') runs as CPU autocast, a "
           "GradScaler is enabled, nccl becomes gloo (docs/emulate-cuda.md).",
           field="emulate_cuda", watch=False),
    Option("format", ("--format", "-f"), Choice(tuple(FORMATS)), "text", _format_help(),
           cli_only="a report goes where one run sends it: see --output", watch=NOT_IN_WATCH),
    Option("output", ("--output", "-o"), File(), None,
           _output_help(), cli_only="a file of one run",
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
    Option("quiet", ("--quiet", "-q"), Flag(), False,
           "Text report: only the findings and the verdict (no header, no update timeline, no "
           "progress line).", cli_only="how one run's report is printed", watch=NOT_IN_WATCH),
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


def script_arguments_hint(args: list[str], option: str) -> str | None:
    """``graddoctor check train.py --lr 0.5``: options after the script are graddoctor's, so
    --lr is unknown; the command with the script's arguments after ``--`` (``args``: the
    command line after ``graddoctor``)."""
    import shlex

    if not args or args[0] != "check":
        return None
    split = split_script_arguments(args[1:])
    if split is None or not split[1]:
        return None
    ours, script = split
    return (f"if {option or 'it'} is for the script: the script's arguments go after `--` "
            f"(options before it are graddoctor's):\n  graddoctor check "
            f"{shlex.join([*ours, '--', *script])}")


def as_flags(values: Mapping[str, Any]) -> list[str]:
    """Values by python name as the command line that gives them (``{"steps": 3, "module":
    True}`` -> ``--steps 3 --module``); a value of None, or a flag off, is left out."""
    out: list[str] = []
    for name, value in values.items():
        option = OPTIONS[name]
        if value is None:
            continue
        if isinstance(option.kind, Flag):
            out += [option.flag] if value else []
        elif isinstance(value, (list, tuple)):
            for item in value:
                out += [option.flag, str(item)]
        else:
            out += [option.flag, str(getattr(value, "value", value))]
    return out


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


# -- [tool.graddoctor] -----------------------------------------------------------------------

def validate_config(table: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Check every key and value of a ``[tool.graddoctor]`` table by the option table; return
    them under the CLI's python names. ``ConfigError`` names the file and the key."""
    values: dict[str, Any] = {}
    for raw_key, value in table.items():
        option = CONFIG_KEYS.get(raw_key.replace("_", "-"))
        if option is None:
            from .errors import did_you_mean

            raise ConfigError(f"{path}: [tool.graddoctor] unknown option {raw_key!r}"
                              f"{did_you_mean(raw_key, CONFIG_KEYS)} (known: {', '.join(CONFIG_KEYS)})")
        try:
            values[option.name] = option.check(value, "config", where=path)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return values


def load_config(start_dir: str) -> Config:
    """The closest ``[tool.graddoctor]`` from ``start_dir`` upward, validated."""
    path = find_config(start_dir)
    if path is None:
        return Config()
    return Config(path=path, values=validate_config(read_table(path) or {}, path))


def merge_config(command_line: Mapping[str, Any], given: set[str], config: Config) -> dict[str, Any]:
    """Command line wins where the user typed the option; else the config; else the default."""
    return {key: value if key in given or key not in config.values else config.values[key]
            for key, value in command_line.items()}


# -- resolution: once per door -----------------------------------------------------------------

def check_values(values: Mapping[str, Any], source: Source,
                 wanted: Mapping[str, Option] | None = None,
                 known: Iterable[str] | None = None) -> dict[str, Any]:
    """Each value checked and normalised by its row (``wanted``: the rows it may name, default
    every option). ``TypeError`` for an unknown name (``known``: the names its message lists),
    ``ScriptError`` naming the first bad value (as a ``--flag`` for ``source="library"``, by
    keyword for ``"python"``)."""
    wanted = OPTIONS if wanted is None else wanted
    checked: dict[str, Any] = {}
    for name, value in values.items():
        option = wanted.get(name)
        if option is None:
            raise TypeError(f"unknown option {name!r} (known: {', '.join(known or wanted)})")
        try:
            checked[name] = option.check(value, source)
        except ValueError as exc:
            raise ScriptError(str(exc)) from None
    return checked


def _check_selectors(settings: Mapping[str, Any], where, leave_one: bool = True) -> None:
    """``select``/``ignore`` name rules that exist (and, with ``leave_one``, leave at least one
    to run); ``where(key)`` says who gave the key."""
    from .rules.engine import selected_rules, selector_suggestions, unknown_selectors

    for key in ("select", "ignore"):
        unknown = unknown_selectors(settings[key])
        if unknown:
            raise ScriptError(f"{where(key)}: no rule is named {', '.join(map(repr, unknown))}"
                              f"{selector_suggestions(unknown)} "
                              "(use a slug or a code prefix; see `graddoctor rules`)")
    if leave_one and (settings["select"] or settings["ignore"]) and \
            not selected_rules(settings["select"], settings["ignore"]):
        raise ScriptError(f"select {', '.join(settings['select']) or '(all)'} and ignore "
                          f"{', '.join(settings['ignore'])} leave no rule to run")


def _display(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return path if rel.startswith("..") else rel


@dataclass(frozen=True)
class Resolved:
    """A script check's options, and every setting they came from by python name (with the
    other options given, such as the CLI's --grad-flow, which the config can switch on)."""

    options: CheckOptions
    settings: Mapping[str, Any] = field(default_factory=dict)


def resolve(target: str, args: Sequence[str] = (), values: Mapping[str, Any] | None = None,
            explicit: Iterable[str] = (), *, source: Source, use_config: bool = True,
            redirect_stdout: bool = False, pictures: bool = False) -> Resolved:
    """The options of a script check: ``values`` (python names) validated by the option table,
    under them ``[tool.graddoctor]`` of the closest pyproject.toml above the script (a value in
    ``explicit`` beats the config, the others do not), under that the table's defaults.
    ``ScriptError`` names the first bad value (as a ``--flag`` for ``source="library"``, the
    CLI; by keyword for ``source="python"``). ``pictures``: record every update's gradient
    norms (a picture was asked for; --grad-flow, typed or configured, asks too). A time limit
    of 0 or infinity is None: no limit; the trace file is named from the folder the check
    starts in."""
    values = dict(values or {})
    wanted = {**SCRIPT_OPTIONS, **{name: OPTIONS[name] for name in values if name in OPTIONS}}
    checked = check_values(values, source, wanted, known=SCRIPT_OPTIONS)
    explicit = set(explicit)
    config = Config()
    if use_config:
        module = bool(checked.get("module", OPTIONS["module"].default))
        start = os.getcwd() if module else os.path.dirname(os.path.abspath(target))
        try:
            config = load_config(start)
        except ConfigError as exc:
            raise ScriptError(str(exc)) from None
    shown = _display(config.path) if config.path else None
    # what was given beats the config where it was given explicitly; the defaults never do
    defaults = {name: option.check(option.default, source)
                for name, option in wanted.items() if name not in checked}
    settings = merge_config({**defaults, **checked}, explicit & checked.keys(), config)

    def where(key: str) -> str:
        if key in explicit or key not in config.values:
            return OPTIONS[key].flag if source == "library" else key
        return f"{shown}: [tool.graddoctor] {key}"

    _check_selectors(settings, where)
    fields = {o.field: settings[o.name] for o in SCRIPT_OPTIONS.values()}
    if fields["timeout"] == 0 or math.isinf(fields["timeout"] or 0):
        fields["timeout"] = None
    if fields["trace_path"]:  # where the check starts, whatever directory the script goes to
        fields["trace_path"] = os.path.abspath(fields["trace_path"])
    options = CheckOptions(target=target, args=tuple(args), **fields,
                           redirect_stdout=redirect_stdout, config_path=shown,
                           grad_flow=pictures or bool(settings.get("grad_flow")))
    return Resolved(options, settings)


def resolve_watch(values: Mapping[str, Any], *, target: str = "watch()") -> CheckOptions:
    """The options of a block of the caller's own code (``watch()``): the watch options given
    (by keyword), the others at their watch defaults; no config, no time limit."""
    values = dict(values)
    checked = check_values({name: values.pop(name, option.watch)
                            for name, option in WATCH_OPTIONS.items()}, "python", WATCH_OPTIONS)
    if values:
        raise TypeError(f"watch() got unknown option(s) {', '.join(map(repr, values))} "
                        f"(known: {', '.join(WATCH_OPTIONS)})")
    _check_selectors(checked, lambda key: key, leave_one=False)
    return CheckOptions(target=target, **{WATCH_OPTIONS[n].field: v for n, v in checked.items()},
                        timeout=None)


def plot_problem(path: str) -> str | None:
    """--plot's value: a picture format matplotlib writes, matplotlib itself (an optional
    extra) and a file that can be written; None when all is well."""
    from .report.output import unwritable_reason
    from .report.plot import PLOT_SUFFIXES, missing_matplotlib

    if not path.lower().endswith(PLOT_SUFFIXES):
        return f"--plot {path}: the file must end in {', '.join(PLOT_SUFFIXES)}"
    reason = missing_matplotlib()
    if reason:
        return f"--plot: {reason}"
    reason = unwritable_reason(path)
    return f"--plot {reason}" if reason else None
