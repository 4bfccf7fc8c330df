"""Jupyter notebooks as scripts: the cell mapping and compiler behind ``graddoctor check nb.ipynb``
and every report's ``cell``/``cell_line`` (the ``%%graddoctor`` cell magic: magic.py).

``graddoctor check nb.ipynb`` runs the notebook's code cells in order as one script. Each line
of code keeps the line number it has in the ``.ipynb`` file (nbformat writes one source line
per line of JSON), so every location the instrumentation records — ``path:line``, in the
trace, JSON and SARIF — points into the notebook file itself; the text report, and the JSON's
``cell``/``cell_line``, name the cell (its position among all cells, from 1, Markdown cells
included) and the line in it. A notebook not laid out that way (hand-written JSON with one
string per cell) is numbered as its code cells joined in order, with a note.

IPython syntax a plain interpreter cannot run is skipped with a note: line magics and shell
escapes (``%pip``, ``!ls``, ``x = !ls``) become ``pass``; ``%time stmt`` / ``%timeit stmt``
run ``stmt`` once; a cell magic runs its body as Python when it is Python (``%%time``,
``%%capture``, ``%%timeit``, ``%%prun``, ``%%graddoctor``), else the cell is skipped.

No torch here. nbformat reads the notebook when installed (plain JSON otherwise).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from .errors import ScriptError

SUFFIX = ".ipynb"
PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "graddoctor"}
RUN_ONCE_LINE_MAGICS = {"time", "timeit"}
_ASSIGNED_ESCAPE = re.compile(r"^[\w.,\s\[\]()*]+=\s*[!%]")
_HELP = re.compile(r"^[?]*[\w.]+\s*[?]{1,2}$|^[?]{1,2}[\w.]+$")


def is_notebook(path: str) -> bool:
    return str(path).lower().endswith(SUFFIX)


@dataclass
class Layout:
    """A notebook as graddoctor runs it: ``lines[n]`` is the Python text of file line n + 1
    (blank between cells), ``cells[n]`` the (cell, line in cell) it came from."""

    path: str
    lines: list[str] = field(default_factory=list)
    cells: dict[int, tuple[int, int]] = field(default_factory=dict)  # file line -> (cell, line)
    notes: list[str] = field(default_factory=list)
    in_file: bool = True  # line numbers are the .ipynb file's

    @property
    def source(self) -> str:
        return "".join(self.lines)

    def where(self, line: int) -> tuple[int, int] | None:
        return self.cells.get(line)


def _read(path: str) -> tuple[list[dict], str]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ScriptError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ScriptError(f"{path} is not a notebook (not UTF-8 text)") from None
    try:
        import nbformat
    except ModuleNotFoundError:
        nbformat = None
    try:
        if nbformat is not None:
            nb = nbformat.reads(text, as_version=4)
        else:
            nb = json.loads(text)
    except Exception as exc:
        raise ScriptError(f"{path} is not a Jupyter notebook: {exc}") from None
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        raise ScriptError(f"{path} is not a Jupyter notebook (no cells; nbformat 4 expected)")
    return cells, text


def _source_lines(cell: dict) -> list[str]:
    source = cell.get("source", "")
    text = "".join(source) if isinstance(source, list) else str(source)
    return text.splitlines(keepends=True)


def _file_lines(cells: list[dict], text: str) -> list[list[int]] | None:
    """For each cell, the file line (1-based) of each of its source lines; None when the file
    is not laid out one source line per line of JSON."""
    lines = text.splitlines()
    out: list[list[int]] = []
    pos = 0
    for cell in cells:
        source = _source_lines(cell)
        while pos < len(lines) and not lines[pos].lstrip().startswith('"source":'):
            pos += 1
        if pos >= len(lines):
            return None
        head = lines[pos].lstrip()[len('"source":'):].strip().rstrip(",")
        if head == "[]" or head == '""':
            if source:
                return None
            out.append([])
            pos += 1
            continue
        if head != "[":
            try:
                one = json.loads(head)
            except ValueError:
                return None
            if [one] != source and not (one == "" and not source):
                return None
            out.append([pos + 1] * len(source))
            pos += 1
            continue
        numbers = []
        for k, expected in enumerate(source, start=1):
            if pos + k >= len(lines):
                return None
            try:
                got = json.loads(lines[pos + k].strip().rstrip(","))
            except ValueError:
                return None
            if got != expected:
                return None
            numbers.append(pos + k + 1)
        out.append(numbers)
        pos += len(source) + 1
    return out


def _python_line(line: str, where: str, notes: list[str]) -> str:
    """One line of a code cell as plain Python (IPython syntax replaced, with a note)."""
    body = line.lstrip()
    indent = line[: len(line) - len(body)]
    end = "\n"
    stripped = body.rstrip()
    if not stripped or stripped.startswith("#"):
        return line if line.endswith("\n") else line + end
    shown = stripped if len(stripped) <= 60 else stripped[:57] + "..."
    if stripped.startswith("%") and not stripped.startswith("%%"):
        name, _, rest = stripped[1:].partition(" ")
        if name in RUN_ONCE_LINE_MAGICS and rest.strip() and not rest.strip().startswith("-"):
            notes.append(f"{where}: `%{name}` dropped, its statement run once")
            return f"{indent}{rest.strip()}{end}"
        notes.append(f"{where}: IPython magic `{shown}` skipped")
        return f"{indent}pass{end}"
    if stripped.startswith("!"):
        notes.append(f"{where}: shell escape `{shown}` skipped")
        return f"{indent}pass{end}"
    if _ASSIGNED_ESCAPE.match(stripped) and not re.match(r"^[\w.,\s\[\]()*]+==", stripped):
        notes.append(f"{where}: IPython `{shown}` skipped")
        return f"{indent}pass{end}"
    if _HELP.match(stripped):
        notes.append(f"{where}: IPython help `{shown}` skipped")
        return f"{indent}pass{end}"
    return line if line.endswith("\n") else line + end


def _cell_python(cell_no: int, source: list[str], notes: list[str]) -> list[str]:
    first = next((i for i, line in enumerate(source) if line.strip()), None)
    if first is not None and source[first].lstrip().startswith("%%"):
        name = source[first].lstrip()[2:].split(maxsplit=1)[0] if source[first].strip() != "%%" else ""
        if name not in PYTHON_CELL_MAGICS:
            notes.append(f"cell {cell_no}: `%%{name}` cell skipped (not Python)")
            return ["\n"] * len(source)
        notes.append(f"cell {cell_no}, line {first + 1}: cell magic `%%{name}` dropped, its body "
                     f"run as Python")
        source = list(source)
        source[first] = "\n"
    return [_python_line(line, f"cell {cell_no}, line {n}", notes)
            for n, line in enumerate(source, start=1)]


def layout(path: str) -> Layout:
    """Read a notebook and lay its code cells out as one script (see the module's doc)."""
    cells, text = _read(path)
    out = Layout(path=os.path.abspath(path))
    numbers = _file_lines(cells, text)
    if numbers is None:
        out.in_file = False
        out.notes.append("the notebook's JSON does not hold one source line per line, so line "
                         "numbers count the code cells' lines joined in order (cell and line in "
                         "the cell are exact)")
    python: dict[int, str] = {}
    next_line = 1
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        source = _source_lines(cell)
        converted = _cell_python(index + 1, source, out.notes)
        if numbers is not None:
            places = numbers[index]
        else:
            places = list(range(next_line, next_line + len(source)))
            next_line += len(source) + 1
        for k, (place, line) in enumerate(zip(places, converted), start=1):
            python[place] = line
            out.cells[place] = (index + 1, k)
    last = max(python, default=0)
    out.lines = [python.get(n, "\n") for n in range(1, last + 1)]
    return out


_CACHE: dict[str, tuple[tuple, Layout]] = {}


def cached_layout(path: str) -> Layout | None:
    """The layout of a notebook, read once per version of the file; None when unreadable."""
    full = os.path.abspath(path)
    try:
        stat = os.stat(full)
    except OSError:
        return None
    key = (stat.st_mtime_ns, stat.st_size)
    known = _CACHE.get(full)
    if known is not None and known[0] == key:
        return known[1]
    try:
        found = layout(full)
    except ScriptError:
        return None
    _CACHE[full] = (key, found)
    return found


def cell_of(path: str, line: int) -> tuple[int, int] | None:
    """(cell, line in the cell) of a notebook location; None when it is not one."""
    if not is_notebook(path):
        return None
    found = cached_layout(path)
    return found.where(line) if found is not None else None


# IPython cells run under %%graddoctor: their file name -> "In [5]" (IPython's own numbering)
CELL_NAMES: dict[str, str] = {}


def describe(path: str, line: int | None) -> str:
    """``nb.ipynb, cell 4, line 3`` for a notebook location, ``In [5], line 3`` for a cell run
    under ``%%graddoctor``, else ``path:line``."""
    if path in CELL_NAMES:
        return f"{CELL_NAMES[path]}, line {line}"
    where = cell_of(path, line) if line is not None else None
    if where is None:
        return f"{path}:{line}" if line is not None else path
    return f"{path}, cell {where[0]}, line {where[1]}"


def location_json(path: str, line: int) -> dict:
    """A location for the JSON report: ``{path, line}``, plus ``cell``/``cell_line`` in a
    notebook."""
    out: dict = {"path": path, "line": line}
    where = cell_of(path, line)
    if where is not None:
        out["cell"], out["cell_line"] = where
    return out


def compile_notebook(path: str):
    """The notebook as one code object (file name: the notebook's path) and the notes on what
    was skipped. Its Python text is put in ``linecache`` for tracebacks and the report's
    excerpts. ``ScriptError`` for what cannot run."""
    import linecache

    found = layout(path)
    _CACHE.pop(found.path, None)
    source = found.source
    try:
        code = compile(source, found.path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = found.where(exc.lineno or 0)
        at = f"cell {where[0]}, line {where[1]}" if where else f"line {exc.lineno}"
        raise ScriptError(f"{path}, {at}: syntax error: {exc.msg}") from None
    linecache.cache[found.path] = (len(source), None, found.lines, found.path)
    return code, found.notes


class ShellStandIn:
    """What ``get_ipython()`` returns in a notebook run as a script (a kernel gives every
    notebook that name): magics called through it run as the cells' own magic lines do —
    ``%time stmt`` / ``%timeit stmt`` run ``stmt`` once, the body of ``%%time``, ``%%capture``,
    ``%%timeit``... runs once as Python — and the rest (``%matplotlib``, shell commands) does
    nothing. ``user_ns`` is the notebook's namespace."""

    def __init__(self, namespace: dict):
        self.user_ns = namespace

    def run_line_magic(self, magic_name: str, line: str, _stack_depth: int = 1):
        stmt = (line or "").strip()
        if magic_name in RUN_ONCE_LINE_MAGICS and stmt and not stmt.startswith("-"):
            exec(compile(stmt, f"<%{magic_name}>", "exec"), self.user_ns)
        return None

    def run_cell_magic(self, magic_name: str, line: str, cell: str):
        if magic_name in PYTHON_CELL_MAGICS:
            exec(compile(cell, f"<%%{magic_name}>", "exec"), self.user_ns)
        return None

    def magic(self, line: str):
        name, _, rest = (line or "").lstrip("%").partition(" ")
        return self.run_line_magic(name, rest)

    def system(self, cmd: str) -> None:
        return None

    def getoutput(self, cmd: str, split: bool = True) -> list:
        return []

    def __repr__(self) -> str:
        return "<graddoctor's stand-in for get_ipython(): a notebook run as a script>"


def notebook_display(*objects, **kwargs) -> None:
    """``display()`` for a notebook run as a script: IPython's when installed, else print."""
    try:
        from IPython.display import display
    except ModuleNotFoundError:
        for obj in objects:
            print(repr(obj))
        return
    display(*objects, **kwargs)


def python_lines(path: str) -> list[str] | None:
    """The Python text of a notebook, line by line as it ran (for excerpts and suppressions)."""
    found = cached_layout(path)
    return found.lines if found is not None else None
