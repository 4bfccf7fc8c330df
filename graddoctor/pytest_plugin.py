"""graddoctor in pytest (registered through the ``pytest11`` entry point; off unless used).

* the ``graddoctor`` fixture: ``with graddoctor: train_one_epoch(model, loader)`` checks the
  block (``with graddoctor(select="GD1", fail_on="error"):`` for other options);
* the marker ``@pytest.mark.graddoctor(select=..., fail_on=...)`` checks the whole test;
* ``pytest --graddoctor`` checks every test (those that never train are left alone).

A finding at or above ``fail_on`` fails the test, with the text report (plain) as the failure
message; findings below it are attached to the test's report (a "graddoctor" section, shown
with ``-rA`` and on failure). An exception raised inside a checked block is the test's own
failure: it goes on unchanged, the report is attached. Unused, the plugin costs one marker
look-up per test and never imports torch.
"""

from __future__ import annotations

from typing import Any

import pytest

from .options import OPTIONS

FAIL_ON = OPTIONS["fail_on"].kind.choices
SECTION = "graddoctor"


def pytest_addoption(parser) -> None:
    group = parser.getgroup("graddoctor", "graddoctor: gradient bugs in training code")
    group.addoption("--graddoctor", action="store_true", default=False,
                    help="check every test with graddoctor.watch(); a test that trains fails on "
                         "a finding at or above --graddoctor-fail-on")
    group.addoption("--graddoctor-fail-on", default=None, choices=FAIL_ON,
                    help="lowest severity that fails a checked test (default: warning)")
    group.addoption("--graddoctor-emulate-cuda", action="store_true", default=False,
                    help="checked tests take their GPU path with every tensor on the CPU "
                         "(graddoctor check --emulate-cuda)")


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "graddoctor(**options): check the whole test with graddoctor.watch(**options) "
        "(steps, epoch_batches, select, ignore, fail_on, trace, emulate_cuda); a finding at or above fail_on "
        "fails the test")


def _defaults(node) -> dict[str, Any]:
    """Options for a check of this test: ``--graddoctor-fail-on``, then the marker's."""
    options: dict[str, Any] = {}
    fail_on = node.config.getoption("--graddoctor-fail-on", None)
    if fail_on:
        options["fail_on"] = fail_on
    if node.config.getoption("--graddoctor-emulate-cuda", False):
        options["emulate_cuda"] = True
    marker = node.get_closest_marker("graddoctor")
    if marker is not None:
        if marker.args:
            raise pytest.UsageError("@pytest.mark.graddoctor takes keyword options only "
                                    "(select=..., fail_on=...)")
        options.update(marker.kwargs)
    return options


def _summary(report) -> str:
    counts = report.summary()
    return (f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info "
            f"in {report.run.steps} optimizer step(s)")


def _attach(item, report, fail_on: str) -> None:
    """Findings below the failing threshold (or all, when the test fails anyway) go into the
    test's report; the JSON summary into ``user_properties`` (junitxml)."""
    if not report.findings and not report.internal_errors:
        return
    item.add_report_section("call", SECTION, report.render("text"))
    item.user_properties.append((SECTION, {**report.summary(), "fail_on": fail_on,
                                           "status": report.run.status}))


def _verdict(item, watch, raised: bool) -> None:
    """After a checked block or test: attach the report; fail on findings at or above
    fail_on (unless the block raised: that failure is the test's own)."""
    report = watch.report
    if report is None:
        return
    failing = report.at_or_above(watch.fail_on)
    if not failing or raised:
        _attach(item, report, watch.fail_on)
    else:  # the failure message holds the report
        pytest.fail(f"graddoctor: {len(failing)} finding(s) at or above fail_on={watch.fail_on!r}"
                    f" ({_summary(report)})\n\n{report.render('text')}", pytrace=False)


class GradDoctor:
    """The ``graddoctor`` fixture: a context manager that checks its block (``with
    graddoctor:``); call it for other options (``with graddoctor(fail_on="error"):``).
    ``reports`` holds the report of every block of the test, ``report`` the latest."""

    def __init__(self, item, defaults: dict[str, Any]):
        self._item = item
        self._defaults = defaults
        self._options = dict(defaults)
        self._active: list = []
        self.reports: list = []

    def __call__(self, **options: Any) -> "GradDoctor":
        block = GradDoctor(self._item, {**self._defaults, **options})
        block.reports = self.reports  # one list for the test
        return block

    @property
    def report(self):
        return self.reports[-1] if self.reports else None

    def __enter__(self):
        from .api import watch

        w = watch(**self._options)
        w.label = f"graddoctor fixture in {self._item.nodeid}"
        w.__enter__()
        self._active.append(w)
        return w

    def __exit__(self, exc_type, exc, tb) -> bool:
        w = self._active.pop()
        quiet = w.__exit__(exc_type, exc, tb)
        if w.report is not None:
            self.reports.append(w.report)
        _verdict(self._item, w, raised=exc is not None and not quiet)
        return quiet


@pytest.fixture
def graddoctor(request) -> GradDoctor:
    """Check a block of the test with graddoctor: ``with graddoctor: train(model, loader)``."""
    return GradDoctor(request.node, _defaults(request.node))


def _checks_whole_test(item) -> bool:
    if "graddoctor" in getattr(item, "fixturenames", ()):  # the fixture checks its blocks
        return False
    return item.get_closest_marker("graddoctor") is not None or \
        bool(item.config.getoption("--graddoctor", False))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if not _checks_whole_test(item):
        return (yield)
    from .api import watch

    w = watch(**_defaults(item))
    w.label = item.nodeid
    result, raised = None, False
    try:
        with w:
            result = yield
    except BaseException:
        raised = True
        raise
    finally:
        trained = w.report is not None and (w.report.run.steps or w.report.run.backward_calls)
        marked = item.get_closest_marker("graddoctor") is not None
        if trained or marked:  # --graddoctor alone: tests that never train stay quiet
            _verdict(item, w, raised)
    return result
