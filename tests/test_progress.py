"""The status line: only on a terminal, erased before the script writes, never over a half line."""

from __future__ import annotations

import io
import sys

from graddoctor.report.progress import CLEAR_LINE, Progress


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_nothing_happens_when_stderr_is_not_a_terminal():
    stream = io.StringIO()
    out_before, err_before = sys.stdout, sys.stderr
    with Progress("train.py", 10, stream=stream) as progress:
        assert sys.stdout is out_before and sys.stderr is err_before
        progress.update(3)
    assert stream.getvalue() == ""


def test_status_line_is_drawn_erased_before_output_and_removed_at_the_end(monkeypatch):
    monkeypatch.delenv("TERM", raising=False)
    tty = Tty()
    script_out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", script_out)
    with Progress("train.py", 10, stream=tty, redraw_s=0.0) as progress:
        assert tty.getvalue() == CLEAR_LINE + "graddoctor ▸ train.py · step 0/10"
        progress.update(3)
        assert tty.getvalue().endswith(CLEAR_LINE + "graddoctor ▸ train.py · step 3/10")
        before = len(tty.getvalue())
        print("epoch 0: loss 0.5")  # the script's own output
        assert tty.getvalue()[before:] == CLEAR_LINE  # erased first
        assert script_out.getvalue() == "epoch 0: loss 0.5\n"
        progress.update(4)
        assert tty.getvalue().endswith("step 4/10")
    assert sys.stdout is script_out  # the proxy is gone
    assert tty.getvalue().endswith(CLEAR_LINE)


def test_a_half_written_line_is_never_overwritten(monkeypatch):
    monkeypatch.delenv("TERM", raising=False)
    tty = Tty()
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    with Progress("train.py", None, stream=tty, redraw_s=0.0) as progress:
        sys.stdout.write("training... ")
        drawn = tty.getvalue()
        progress.update(2)
        assert tty.getvalue() == drawn  # skipped: the script is in the middle of a line
        sys.stdout.write("done\n")
        progress.update(3)
        assert tty.getvalue().endswith("graddoctor ▸ train.py · step 3")


def test_a_burst_of_short_steps_is_drawn_once_until_the_line_is_erased(monkeypatch):
    monkeypatch.delenv("TERM", raising=False)
    tty = Tty()
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    with Progress("train.py", 1000, stream=tty, redraw_s=3600.0) as progress:
        drawn = tty.getvalue()
        for steps in range(1, 200):
            progress.update(steps)
        assert tty.getvalue() == drawn  # the line from the start is still on screen
        print("epoch 0")  # the script's output erases it: the next step draws at once
        progress.update(200)
        assert tty.getvalue().endswith("step 200/1000")


def test_proxy_delegates_everything_else(monkeypatch):
    monkeypatch.delenv("TERM", raising=False)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    with Progress("x", 1, stream=Tty()):
        assert sys.stdout is not out
        assert sys.stdout.getvalue() == out.getvalue()
        sys.stdout.writelines(["a\n", "b\n"])
    assert out.getvalue() == "a\nb\n"


def test_dumb_terminal_gets_no_status_line(monkeypatch):
    monkeypatch.setenv("TERM", "dumb")
    tty = Tty()
    with Progress("x", 1, stream=tty) as progress:
        progress.update(1)
    assert tty.getvalue() == ""


def test_recorder_calls_step_callbacks_and_survives_their_failure():
    from graddoctor.instrument.recorder import Recorder
    from graddoctor.instrument.topics import COUNTED_STEP

    rec = Recorder(step_budget=None)
    seen = []
    rec.subscribe(COUNTED_STEP, seen.append)
    rec.subscribe(COUNTED_STEP, lambda n: 1 / 0)
    rec.progress.count_step()
    rec.progress.count_step()
    assert seen == [1, 2]
    errors = rec.trace.of_kind("internal_error")
    assert errors and errors[0]["where"] == "step callback"
