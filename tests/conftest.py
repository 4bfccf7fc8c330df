import gc
import os
import subprocess
import sys
import time

# One intra-op thread in the test processes themselves, as in the processes they start
# (cli_env): set before anything imports torch. Two xdist workers on two cores, each with a
# thread pool of two, spin against each other; the in-process fixture runs were ~10x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Compiled bytecode is cached, as Python does by default, also where the environment turns that
# off (PYTHONDONTWRITEBYTECODE): else every xdist worker rewrites the asserts of every test module
# again at each run (pytest keeps rewritten modules only where bytecode is written), and every
# test process, warm interpreter, rank and fresh interpreter compiles graddoctor from source.
# Set here, before the workers start and before the test modules are imported.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import pytest  # noqa: E402

import warm_python  # noqa: E402

pytest_plugins = ["pytester"]  # tests/test_pytest_plugin.py runs pytest inside pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures")


def cli_env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")  # 2 cores: a thread pool per process fights the others
    env.pop("NO_COLOR", None)
    env.update(extra)
    return env


def run_python(*args, cwd=None, timeout=120, input=None, **env) -> subprocess.CompletedProcess:
    """``python ARGS`` as its own process, forked from a warm interpreter that has torch and
    graddoctor imported already (tests/warm_python.py): the process-level behaviour of a real
    run (exit codes, file descriptors, os._exit, hangs, signals) without ~3 s of start-up."""
    return warm_python.run_python(list(args), cwd=cwd or ROOT, env=cli_env(**env),
                                  timeout=timeout, input=input)


def run_cli(*args, cwd=None, timeout=120, input=None, **env) -> subprocess.CompletedProcess:
    """The real CLI, ``python -m graddoctor ARGS``, as its own process (forked warm: see
    run_python)."""
    return run_python("-m", "graddoctor", *args, cwd=cwd, timeout=timeout, input=input, **env)


def run_cli_fresh(*args, cwd=None, timeout=300, input=None, **env) -> subprocess.CompletedProcess:
    """The real CLI in a fresh interpreter, start-up included: for the few end-to-end tests."""
    return subprocess.run(
        [sys.executable, "-m", "graddoctor", *args], cwd=cwd or ROOT, env=cli_env(**env),
        capture_output=True, text=True, timeout=timeout, input=input if input is not None else "",
    )


@pytest.fixture
def cli():
    return run_cli


def pytest_sessionfinish(session, exitstatus):
    warm_python.stop()


# The modules whose tests start interpreters, launches or kernels (seconds each, many waiting on
# a child) run first, then those with long in-process tests (test_trace_immutable's covering
# runs, with the test_fixtures tests that read them right after; hypothesis' searches):
# scheduled last, one of them keeps a worker busy while the other sits idle. xdist's worksteal
# hands the first half of this order to one worker, the second to the other, and at the end
# moves tests from the end of a worker's queue: short tests at both ends.
FIRST = ("test_distributed.py", "test_distributed_runs.py", "test_pytest_plugin.py",
         "test_reliability_script.py", "test_end_to_end.py", "test_reliability_hygiene.py",
         "test_wire_format.py", "test_children.py", "test_notebook.py", "test_run_like_python.py",
         "test_warm_python.py", "test_threads_race.py", "test_reliability_compile.py", "test_browser.py",
         "test_trace_immutable.py", "test_reliability_rules.py")


def pytest_collection_modifyitems(session, config, items):
    first = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(FIRST)))  # stable: else as collected
    _pair_fixture_tests(items)
    _after_the_runs_they_read(items)


def _pair_fixture_tests(items) -> None:
    """Each test of tests/test_fixes.py right after the tests/test_fixtures.py test of the same
    fixture: xdist hands each worker a run of neighbouring tests, so the two usually run on one
    worker, one after the other, and the second reads the first's run (tests/fixture_runs.py)
    instead of checking the fixture again."""
    def param(item):
        spec = getattr(item, "callspec", None)
        return spec.params.get("path") if spec is not None else None

    fixes = {param(i): i for i in items
             if i.path.name == "test_fixes.py" and i.originalname == "test_fix_removes_the_finding"}
    if not fixes:
        return
    paired = {id(i) for i in items if i.path.name == "test_fixtures.py"
              and i.originalname == "test_fixture" and param(i) in fixes}
    if not paired:
        return
    order = []
    for item in items:
        if id(item) in paired:
            order.append(item)
            order.append(fixes.pop(param(item)))
        elif not (item.path.name == "test_fixes.py" and item.originalname ==
                  "test_fix_removes_the_finding" and param(item) in fixes):
            order.append(item)
    order.extend(fixes.values())  # none: every one follows its fixture's test
    items[:] = order


def _fixture_param(item):
    spec = getattr(item, "callspec", None)
    return spec.params.get("path") if spec is not None else None


def _after_the_runs_they_read(items) -> None:
    """A test module that checks fixtures as tests/test_fixtures.py does and holds the runs for
    those tests (tests/fixture_runs.py: keep_for) names them in ``FIXTURE_RUNS_HELD`` (paths
    under fixtures/); their test_fixtures.py tests (with their test_fixes.py partners) move right
    after that module's tests, so that on one worker they read its runs."""
    held: dict[str, object] = {}  # fixture path -> the module holding its run
    last: dict[object, int] = {}  # module -> index of its last test
    for i, item in enumerate(items):
        names = getattr(item.module, "FIXTURE_RUNS_HELD", None) if hasattr(item, "module") else None
        if names:
            last[item.module] = i
            for name in names:
                held.setdefault(os.path.join(FIXTURES, name), item.module)
    if not held:
        return
    moved: dict[object, list] = {m: [] for m in last}
    rest = []
    for item in items:
        name = item.path.name
        if name in ("test_fixtures.py", "test_fixes.py") and _fixture_param(item) in held:
            moved[held[_fixture_param(item)]].append(item)
        else:
            rest.append(item)
    order = []
    for item in rest:
        order.append(item)
        module = getattr(item, "module", None)
        if module in moved and item is items[last[module]]:
            order.extend(moved.pop(module))
    for leftover in moved.values():
        order.extend(leftover)
    items[:] = order


# What the test process holds once it has imported the tests (torch, graddoctor, pytest, the
# frameworks a fixture imports) is moved out of reach of the cyclic collector (gc.freeze):
# graddoctor's heap scans (gc.get_objects: naming parameters after the modules that hold them,
# the idle-parameter search) and the collector's full passes then walk only what the tests made
# since, as in a `graddoctor check` process, instead of the ~10^5-10^6 objects of a long-lived
# test process (about a fifth of the in-process fixture checks' CPU time). Refrozen when a test
# imported something new, and once REFREEZE_AFTER_S CPU-seconds of tests have run since: what
# earlier tests leave alive (the runs tests/fixture_runs.py keeps, pytest's reports, caches)
# grows by ~5,000 objects a fixture test, and with it each full pass of the collector (25 ms
# after a freeze, 400-650 ms 100-200 fixture tests later: 13 % of their CPU). CPU time, not a
# count of tests: thousands of short tests leave little behind. Frozen objects are still freed
# by their reference counts; a cycle among them that becomes garbage waits for the next
# UNFREEZE_EVERY-th refreeze, which collects the whole heap once.
REFREEZE_AFTER_S = 1.5
# The young generations are collected once per GC_YOUNG allocations instead of Python's 700:
# a fixture check makes ~10^5 objects, most freed by their reference counts within the test
# (graphs, events, the report's dicts), so that a collection every 700 walked the same
# survivors again and again: ~2,600 collections of generation 0 and ~230 of generation 1 in
# the 91 fixture tests of numerics/, dense/ and tbptt/. With 20,000: 115 and 5, the collector's
# time there 2.2 -> 1.1 s and the tests' CPU 20.6 -> 19.4 s, peak memory unchanged (~420 MB);
# tests/test_steady_hooks.py with tests/test_trace_immutable.py (long loops): 6.3 -> 2.3 s and
# 60.5 -> 56.9 s.
# Only the test processes: the interpreters they start (warm children, ranks, fresh CLIs) keep
# Python's defaults, as a user's process does.
GC_YOUNG = 20_000
gc.set_threshold(GC_YOUNG, 20, 20)
UNFREEZE_EVERY = 50  # refreezes
_modules_when_frozen = 0
_frozen_at = 0.0  # time.process_time() of the last freeze
_refreezes = 0


def _freeze_what_is_imported() -> None:
    global _modules_when_frozen, _frozen_at, _refreezes
    _refreezes += 1
    if _refreezes % UNFREEZE_EVERY == 0:
        gc.unfreeze()  # the cycles frozen since become garbage the collection below sees
    gc.collect()  # the garbage left so far is freed, not frozen
    gc.freeze()
    _modules_when_frozen = len(sys.modules)
    _frozen_at = time.process_time()


def pytest_collection_finish(session):
    _freeze_what_is_imported()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if len(sys.modules) > _modules_when_frozen or \
            time.process_time() - _frozen_at > REFREEZE_AFTER_S:
        _freeze_what_is_imported()
