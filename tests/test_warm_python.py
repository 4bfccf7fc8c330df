"""tests/warm_python.py, the warm fork that the CLI tests run ``python ARGS`` in: for small
programs that do not import torch (cheap to start fresh), a warm child gives what a fresh
interpreter gives: exit code, stdout, stderr (tracebacks included)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

import warm_python
from conftest import cli_env, run_python

PROGRAMS = {
    "exit code and prints": "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)\n",
    "exit with a message": "import sys\nsys.exit('bad configuration')\n",
    "exit None": "raise SystemExit(None)\n",
    "exit code above 255": "import sys\nsys.exit(256 + 7)\n",
    "uncaught exception": "def f():\n    raise ValueError('boom')\nprint('before')\nf()\n",
    "chained exception": "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    raise KeyError('k') from e\n",
    "KeyboardInterrupt": "raise KeyboardInterrupt\n",
    "syntax error": "def f(:\n    pass\n",
    "os._exit": "import os\nprint('lost')\nos._exit(4)\n",
    "atexit handler": "import atexit\natexit.register(print, 'at exit')\nprint('main')\n",
    "non-daemon thread is joined": textwrap.dedent("""\
        import threading, time
        def late():
            time.sleep(0.3)
            print('thread done', flush=True)
        threading.Thread(target=late).start()
        print('main done', flush=True)
        """),
    "argv, __main__, sys.path[0], cwd and stdin": textwrap.dedent("""\
        import os, sys
        print(sys.argv, __name__, sys.path[0] == os.path.dirname(os.path.realpath(__file__)))
        print(os.getcwd(), sys.stdin.read(), sys.stdout.encoding, sys.stdout.errors)
        print(sys.stderr.errors, sys.stdout.line_buffering, sys.stderr.line_buffering)
        """),
    "unencodable output": "print('caf\\u00e9 \\u2713')\n",
    "file descriptor 1 and a child process": textwrap.dedent("""\
        import os, subprocess, sys
        print('print', flush=True)
        os.write(1, b'fd 1\\n')
        subprocess.run([sys.executable, '-c', 'print(\"child\")'])
        """),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_a_warm_child_runs_a_script_as_a_fresh_interpreter_does(tmp_path, name, encoding):
    (tmp_path / "prog.py").write_text(PROGRAMS[name])
    args = ("prog.py", "an arg", "ü")
    fresh = subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True,
                           input="typed", env=cli_env(PYTHONIOENCODING=encoding), timeout=120)
    warm = run_python(*args, cwd=tmp_path, input="typed", PYTHONIOENCODING=encoding)
    assert (warm.returncode, warm.stdout, warm.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert warm_python.last_run == "warm"


@pytest.mark.parametrize("name", ["exit code and prints", "uncaught exception",
                                  "argv, __main__, sys.path[0], cwd and stdin"])
def test_a_warm_child_runs_a_module_as_python_m_does(tmp_path, name):
    (tmp_path / "prog_mod.py").write_text(PROGRAMS[name])
    args = ("-m", "prog_mod", "x")
    fresh = subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True,
                           input="typed", env=cli_env(), timeout=120)
    warm = run_python(*args, cwd=tmp_path, input="typed")
    assert (warm.returncode, warm.stdout, warm.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_timeout_kills_the_child_and_its_children(tmp_path):
    (tmp_path / "prog.py").write_text(textwrap.dedent("""\
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
        print(child.pid, flush=True)
        time.sleep(600)
        """))
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as info:
        run_python("prog.py", cwd=tmp_path, timeout=5)
    assert time.monotonic() - started < 60
    assert info.value.output.strip().isdigit(), (info.value.output, info.value.stderr)
    grandchild = int(info.value.output)
    for _ in range(100):
        if not _running(grandchild):
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the script's child process survived the timeout")


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_a_changed_start_up_environment_gets_its_own_warm_process(tmp_path):
    (tmp_path / "prog.py").write_text("import sys\nprint(sys.flags.dont_write_bytecode)\n")
    value = "" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "1"  # not as the first one
    result = run_python("prog.py", cwd=tmp_path, PYTHONDONTWRITEBYTECODE=value)
    assert result.stdout == ("1\n" if value else "0\n")
    assert warm_python.last_run == "warm"
    assert len(warm_python._warm) <= warm_python.KEEP
