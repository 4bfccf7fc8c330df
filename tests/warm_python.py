"""``python ARGS`` for the tests, without paying for the interpreter's start each time.

A fresh ``python -m graddoctor check ...`` spends ~3 s of CPU importing torch and
torch._dynamo for a replay that takes ~0.1 s. ``run_python`` instead asks a warm process (this
file run as a script: a plain interpreter that has imported torch and graddoctor and nothing
else, started once per test process) to ``fork()``; the child becomes ``python ARGS`` as the
interpreter would run it — its own process, process group, working directory, environment,
file descriptors 0/1/2 (stdin from the given text, stdout and stderr to files), ``sys.argv``,
``sys.path[0]`` and ``__main__`` (through ``runpy``, like ``python -m`` / ``python script.py``)
— and ends the way an interpreter ends (exit code of ``SystemExit``, traceback and 1 for an
uncaught exception, SIGINT for an uncaught KeyboardInterrupt, ``os._exit``; non-daemon threads
joined, atexit handlers run, stdout/stderr flushed), only without tearing down every module
(seconds in a fork, where it writes to every page shared with the warm process). The test gets
a ``subprocess.CompletedProcess`` (or ``subprocess.TimeoutExpired``), as from
``subprocess.run``; on a timeout the child's whole process group is killed.

What a warm child cannot show: the cost and side effects of the first import of torch (so the
tests that check what gets imported, and a few end-to-end tests, start real interpreters).
Environment variables that may only matter when an interpreter or torch starts (``PYTHON*``
but ``PYTHONIOENCODING``, ``OMP_*``, ``MKL_*``, ``TORCH*``, ...) cannot change in a fork: a call
with other values gets a warm process started with them. ``GRADDOCTOR_TESTS_FRESH=1`` makes
every call start a fresh interpreter.
"""

from __future__ import annotations

import json
import locale
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STARTUP_TIMEOUT = 600  # a busy machine can take minutes to import torch
# what the warm process imports before it forks: what a check imports anyway (torch, torch._dynamo,
# graddoctor; a report format's modules are imported by their own import statements all the same)
PRELOAD = ("torch", "torch._dynamo", "torch.utils.data", "torch.nn.utils.clip_grad",
           "torch.optim.lr_scheduler", "typer", "rich.console",
           "graddoctor.cli", "graddoctor.run.session", "graddoctor.instrument", "graddoctor.rules",
           "graddoctor.rules.engine", "graddoctor.report.text", "graddoctor.report.json_format",
           "graddoctor.report.sarif", "graddoctor.report.progress")
STARTUP_ONLY = ("PYTHON", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "TORCH", "CUDA", "LD_", "MALLOC")


def _startup_env(env: dict) -> dict:
    return {k: v for k, v in env.items()
            if k.startswith(STARTUP_ONLY) and k != "PYTHONIOENCODING"}


# -- the client: used by the tests ---------------------------------------------------------------
class _Warm:
    def __init__(self, env: dict):
        self.env = dict(env)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.log, cwd=HERE,
            env={k: v for k, v in self.env.items() if k != "PYTHONIOENCODING"})  # see _stdio
        self.buffer = b""
        ready = self._message(time.monotonic() + STARTUP_TIMEOUT)
        if ready != {"ready": True}:
            raise RuntimeError(f"the warm interpreter did not start: {ready}\n{self._log()}")

    def _log(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-5000:]

    def _message(self, deadline: float | None):
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], wait)[0]:
                return None  # timed out
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the warm interpreter ended (rc={self.proc.wait()})\n{self._log()}")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, request: dict, timeout: float | None) -> tuple[int, bool]:
        """(wait status, timed out)."""
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        pid = self._message(None)["pid"]
        deadline = None if timeout is None else time.monotonic() + timeout
        done = self._message(deadline)
        if done is not None:
            return done["status"], False
        for kill in (os.killpg, os.kill):  # the child's process group: its own children too
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return self._message(None)["status"], True

    def close(self) -> None:
        if self.alive():
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.log.close()


_warm: dict[frozenset, _Warm] = {}  # by start-up environment, the most recently used last
KEEP = 2  # warm processes at most (~0.5 GB each)


def _warm_for(env: dict) -> _Warm | None:
    """A warm process started with ``env``'s start-up variables (started when first needed:
    torch itself may set one, e.g. TORCHINDUCTOR_CACHE_DIR, after the first has started);
    None when every call is to run fresh."""
    if os.environ.get("GRADDOCTOR_TESTS_FRESH"):
        return None
    key = frozenset(_startup_env(env).items())
    warm = _warm.pop(key, None)
    if warm is not None and not warm.alive():
        warm.close()
        warm = None
    if warm is None:
        while len(_warm) >= KEEP:
            _warm.pop(next(iter(_warm))).close()
        warm = _Warm(env)
    _warm[key] = warm
    return warm


def stop() -> None:
    while _warm:
        _warm.popitem()[1].close()


def _text(data: bytes) -> str:
    """As ``subprocess.run(text=True)`` decodes."""
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


last_run = ""  # "warm" or "fresh": how the last run_python ran


def run_python(args: list[str], *, cwd: str, env: dict, timeout: float | None = None,
               input: str | None = None) -> subprocess.CompletedProcess:
    """``python ARGS`` (``-m module ...`` or ``script.py ...``) in ``cwd`` with ``env``: like
    ``subprocess.run([sys.executable, *args], capture_output=True, text=True, ...)``."""
    global last_run
    cmd = [sys.executable, *args]
    warm = _warm_for(env)
    last_run = "fresh" if warm is None else "warm"
    if warm is None:
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout, input=input if input is not None else "")
    with tempfile.TemporaryDirectory(prefix="warm-python-") as tmp:
        names = {k: os.path.join(tmp, k) for k in ("stdin", "stdout", "stderr")}
        with open(names["stdin"], "w", encoding=locale.getpreferredencoding(False)) as f:
            f.write(input or "")
        request = {"args": list(args), "cwd": os.fspath(cwd), "env": dict(env), **names}
        status, timed_out = warm.run(request, timeout)
        with open(names["stdout"], "rb") as out, open(names["stderr"], "rb") as err:
            stdout, stderr = _text(out.read()), _text(err.read())
    if timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(cmd, os.waitstatus_to_exitcode(status), stdout, stderr)


# -- the warm process ----------------------------------------------------------------------------
def _serve() -> dict:
    """Fork a child per request; report its pid, then its wait status. Returns (in the child
    only) the request the child is to carry out."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    import gc

    gc.collect()
    gc.freeze()  # a collection in a child must not write to the pages it shares with this one
    os.write(1, b'{"ready": true}\n')
    pending = b""
    while True:
        while b"\n" not in pending:
            chunk = os.read(0, 65536)
            if not chunk:
                sys.exit(0)  # the tests are done
            pending += chunk
        line, pending = pending.split(b"\n", 1)
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return request
        os.write(1, json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        os.write(1, json.dumps({"status": status}).encode() + b"\n")


def _stdio(env: dict) -> None:
    """New sys.stdin/stdout/stderr on file descriptors 0/1/2, made as the interpreter made this
    process's own at its start (started without PYTHONIOENCODING), but for the encoding and
    error handler that ``env``'s PYTHONIOENCODING gives (stderr keeps backslashreplace)."""
    import io

    def stream(fd, mode, like, name, encoding, errors):
        unbuffered = isinstance(like.buffer, io.RawIOBase)  # PYTHONUNBUFFERED
        buffer = io.open(fd, mode + "b", buffering=0 if unbuffered else -1, closefd=False)
        (buffer if unbuffered else buffer.raw).name = name
        text = io.TextIOWrapper(buffer, encoding=encoding or like.encoding,
                                errors=errors or like.errors, newline="\n",
                                line_buffering=like.line_buffering, write_through=like.write_through)
        text.mode = mode
        return text

    encoding, _, errors = env.get("PYTHONIOENCODING", "").partition(":")
    errors = errors or ("strict" if encoding else "")
    sys.stdin = sys.__stdin__ = stream(0, "r", sys.__stdin__, "<stdin>", encoding, errors)
    sys.stdout = sys.__stdout__ = stream(1, "w", sys.__stdout__, "<stdout>", encoding, errors)
    sys.stderr = sys.__stderr__ = stream(2, "w", sys.__stderr__, "<stderr>", encoding, "")


def _become(request: dict) -> None:
    """In the forked child: be ``python ARGS``."""
    import runpy

    os.setpgid(0, 0)
    os.chdir(request["cwd"])
    process = sys.modules.get("multiprocessing.process")
    if process is not None:  # taken when torch imports it: spawned workers resolve paths by it
        process.ORIGINAL_DIR = os.path.abspath(os.getcwd())
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, name, flags in ((0, "stdin", os.O_RDONLY),
                            (1, "stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, "stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(request[name], flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    _stdio(request["env"])
    args = request["args"]
    if args[0] == "-m":  # python -m: sys.path[0] is the working directory
        sys.argv = ["-m", *args[2:]]
        sys.path[0] = os.getcwd()
        runpy._run_module_as_main(args[1], alter_argv=True)
    else:  # python script.py: sys.path[0] is the script's folder
        import builtins
        import types
        from importlib.machinery import SourceFileLoader

        sys.argv = list(args)
        sys.path[0] = os.path.dirname(os.path.realpath(args[0]))
        main = types.ModuleType("__main__")
        path = os.path.abspath(args[0])
        main.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins,
                             __loader__=SourceFileLoader("__main__", path))
        sys.modules["__main__"] = main
        with open(path, "rb") as f:
            source = f.read()
        exec(compile(source, path, "exec"), main.__dict__)


def _exit_code(exc: SystemExit) -> int:
    """What the interpreter makes of an uncaught SystemExit (printing a non-int code)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return 1


def _finalize(code: int, interrupted: bool) -> None:
    """End the child the way the interpreter ends a program, minus the teardown of every
    module (seconds in a forked child: it writes to every page torch shares with the warm
    process): non-daemon threads joined, atexit handlers run, stdout and stderr flushed."""
    import atexit
    import threading

    try:
        threading._shutdown()
    except BaseException:
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            if stream is sys.stdout and code == 0:
                code = 120  # as the interpreter does when stdout cannot be flushed at exit
    if interrupted:  # an uncaught KeyboardInterrupt ends the interpreter by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _program_frames(tb, module: bool):
    """The traceback as the interpreter shows it: without this file's frames, nor (for a
    script; ``python -m`` shows them) runpy's."""
    import runpy

    skip = {_program_frames.__code__.co_filename}
    if not module:
        skip.add(runpy._run_code.__code__.co_filename)
    while tb is not None and tb.tb_frame.f_code.co_filename in skip:
        tb = tb.tb_next
    return tb


def _child(request: dict) -> None:
    code, interrupted = 0, False
    try:
        try:
            _become(request)
        except SystemExit as exc:
            code = _exit_code(exc)
        except BaseException as exc:
            exc.__traceback__ = _program_frames(exc.__traceback__, request["args"][0] == "-m")
            sys.excepthook(type(exc), exc, exc.__traceback__)
            code, interrupted = 1, isinstance(exc, KeyboardInterrupt)
        _finalize(code, interrupted)
    finally:
        os._exit(1)  # never back into the warm process's loop


if __name__ == "__main__":
    _keep = sys.modules["__main__"]  # runpy replaces __main__; this frame still needs its globals
    _child(_serve())
