"""Whether a file is a Python script graddoctor can run, decided before anything heavy is
imported: a non-Python file is refused at once (exit 2), not run for seconds into a NameError.

python runs a file of any name, so a name alone refuses only what is plainly no script (text,
data, configuration, another language); any other name (``train``, ``train.py3``) runs when it
compiles. Notebooks (``.ipynb``) and ``-m module`` are checked where they are read."""

from __future__ import annotations

import os

from .errors import ScriptError

NOT_PYTHON = frozenset(
    ".txt .md .rst .log .csv .tsv .json .jsonl .yaml .yml .toml .cfg .ini .conf .env .xml .html "
    ".htm .sh .bash .zsh .fish .bat .ps1 .c .h .cc .cpp .hpp .cu .js .ts .r .jl .java .go .rs "
    ".pt .pth .ckpt .bin .safetensors .onnx .npy .npz .pkl .pickle .h5 .hdf5 .parquet .png .jpg "
    ".jpeg .gif .svg .pdf .zip .gz .tar .whl".split())

WHAT_RUNS = "graddoctor runs a Python training script, a notebook (.ipynb) or a module (-m package.module)"


def compile_script(path: str):
    """Read and compile a script, turning every reason it cannot run into ScriptError.
    Returns (the absolute file name, its source bytes, the code object)."""
    if not os.path.exists(path):
        raise ScriptError(f"no such file: {path}")
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "__main__.py")):
            path = os.path.join(path, "__main__.py")
        else:
            raise ScriptError(f"{path} is a directory, not a Python script")
    suffix = os.path.splitext(path)[1].lower()
    if suffix in NOT_PYTHON:
        raise ScriptError(f"{path} is not a Python script (a {suffix} file): {WHAT_RUNS}")
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:
        raise ScriptError(f"cannot read {path}: {exc.strerror}") from None
    if b"\0" in source:
        raise ScriptError(f"{path} is not a Python script (binary file)")
    full = os.path.abspath(path)
    try:  # an absolute file name, as python gives it: a script that changes directory keeps it
        code = compile(source, full, "exec", dont_inherit=True)
    except SyntaxError as exc:
        if not path.endswith((".py", ".pyw")):  # python runs any file name; this is not Python
            raise ScriptError(f"{path} is not a Python script (line {exc.lineno}: "
                              f"{exc.msg})") from None
        raise ScriptError(
            f"{path}:{exc.lineno}: syntax error: {exc.msg} — is this a Python script?"
        ) from None
    except ValueError as exc:
        raise ScriptError(f"{path} is not a Python script: {exc}") from None
    return full, source, code


def refusal(script: str, module: bool) -> str | None:
    """Why ``graddoctor check`` refuses this target at once, or None: PyTorch's launcher
    (graddoctor runs inside each rank, or launches through it itself), or a file that is no
    Python script (notes.txt, a checkpoint) or does not compile. A notebook is read, and a
    module found, where it runs."""
    from .notebook import is_notebook

    if (script in ("torch.distributed.run", "torch.distributed.launch") if module
            else os.path.basename(script) == "torchrun"):
        return (f"{script} is PyTorch's launcher: graddoctor runs inside each rank. Use "
                f"`graddoctor check --nproc-per-node N train.py -- ARGS` or `torchrun "
                f"--nproc-per-node N -m graddoctor check train.py -- ARGS` (see docs/distributed.md)")
    if module or is_notebook(script):
        return None
    try:
        compile_script(script)
    except ScriptError as exc:
        return str(exc)
    return None
