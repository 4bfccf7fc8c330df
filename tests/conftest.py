import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures")


def cli_env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")  # 2 cores: a thread pool per process fights the others
    env.pop("NO_COLOR", None)
    env.update(extra)
    return env


def run_cli(*args, cwd=None, timeout=120, input=None, **env) -> subprocess.CompletedProcess:
    """Run the real CLI in a fresh interpreter: ``python -m graddoctor ...``."""
    return subprocess.run(
        [sys.executable, "-m", "graddoctor", *args], cwd=cwd or ROOT, env=cli_env(**env),
        capture_output=True, text=True, timeout=timeout, input=input if input is not None else "",
    )


@pytest.fixture
def cli():
    return run_cli
