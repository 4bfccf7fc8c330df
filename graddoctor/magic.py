"""IPython: ``%load_ext graddoctor`` registers the ``%%graddoctor`` cell magic, which runs a cell
under ``graddoctor.watch()`` and shows the report below it. A front door like the CLI; the
notebook cell mapping it shares with ``graddoctor check nb.ipynb`` is notebook.py."""

from __future__ import annotations

import os

from .api import watch
from .errors import ScriptError
from .notebook import CELL_NAMES
from .options import WATCH_OPTIONS


def _parse_magic_line(line: str) -> dict:
    """``%%graddoctor --select GD1 --fail-on error --steps 5`` -> watch() keyword options."""
    import shlex

    flags = {flag: option for option in WATCH_OPTIONS.values() for flag in option.flags}
    options: dict = {}
    words = shlex.split(line)
    i = 0
    while i < len(words):
        word = words[i]
        flag, _, value = word.partition("=")
        option = flags.get(flag)
        if option is None:
            raise ValueError(f"%%graddoctor: unknown option {word!r} "
                             f"(known: {', '.join(sorted(flags))})")
        if not _:
            i += 1
            if i >= len(words):
                raise ValueError(f"%%graddoctor: {flag} needs a value")
            value = words[i]
        if option.name in ("select", "ignore"):
            options.setdefault(option.name, []).append(value)
        elif option.name in ("steps", "epoch_batches"):
            try:
                options[option.name] = int(value)
            except ValueError:
                raise ValueError(f"%%graddoctor: {flag} must be a whole number, not {value!r}") \
                    from None
        else:
            options[option.name] = value
        i += 1
    return options


def graddoctor_cell_magic(line: str, cell: str, shell=None):
    """Run the cell under ``graddoctor.watch()`` and show the report below it. Options as on
    the command line: ``%%graddoctor --select GD1 --fail-on error``. Returns nothing; the
    ``Watch`` is kept in the user's namespace as ``_graddoctor`` (``_graddoctor.report``)."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    try:
        options = _parse_magic_line(line)
        w = watch(**options)
    except (ValueError, ScriptError) as exc:
        print(f"graddoctor: error: {exc}")
        return None
    w.label = f"cell [{getattr(shell, 'execution_count', '?')}]"
    w.namespace = getattr(shell, "user_ns", None)
    from .status import StopReplay

    # the step budget (--steps N) ends the cell quietly, as it ends a watch() block: IPython
    # must not show graddoctor's stop as the cell's traceback
    saved = (getattr(shell, "custom_exceptions", ()), getattr(shell, "CustomTB", None))
    quiet = hasattr(shell, "set_custom_exc")
    if quiet:
        shell.set_custom_exc((StopReplay,), lambda self, etype, value, tb, tb_offset=None: None)
    try:
        with w:
            result = shell.run_cell(cell)
            # a syntax error never runs the cell (error_before_exec): a crash all the same
            error = getattr(result, "error_in_exec", None) or \
                getattr(result, "error_before_exec", None)
            if error is not None:  # IPython showed it (or, for our stop, kept quiet)
                w.failed_with(error)
    finally:
        if quiet:
            shell.custom_exceptions, shell.CustomTB = saved
    shell.user_ns["_graddoctor"] = w
    try:  # IPython numbers its cells' files: show "In [5], line 2" for them
        numbers = dict(getattr(shell.compile, "_filename_map", {}))
        for filename, number in numbers.items():
            CELL_NAMES[filename] = f"In [{number}]"
            CELL_NAMES[os.path.relpath(filename) if not filename.startswith("<") else filename] = \
                f"In [{number}]"
        if numbers:  # the title names the cell by the number its locations show ("In [3]")
            import dataclasses

            title = f"cell [{list(numbers.values())[-1]}]"
            if w.report is not None and w.report.run.script != title:
                w.report = dataclasses.replace(
                    w.report, run=dataclasses.replace(w.report.run, script=title))
    except Exception:
        pass
    report = w.report
    _show(report)
    return None


def _show(report) -> None:
    try:
        from rich.console import Console

        console = Console(force_jupyter=None)
        if getattr(console, "is_jupyter", False):
            console.print(report)
            return
    except Exception:
        pass
    print(report.render("text"))  # terminal IPython: the text, not the repr of a string


def load_ipython_extension(ipython) -> None:
    """``%load_ext graddoctor``: registers ``%%graddoctor``."""

    def magic(line: str, cell: str):
        return graddoctor_cell_magic(line, cell, ipython)

    magic.__doc__ = graddoctor_cell_magic.__doc__
    ipython.register_magic_function(magic, magic_kind="cell", magic_name="graddoctor")
