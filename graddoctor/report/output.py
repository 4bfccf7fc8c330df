"""Where a report goes: a file checked before the script runs and written atomically, or stdout
written so that an odd terminal encoding cannot lose it."""

from __future__ import annotations

import io
import os
import stat
import sys
import tempfile


def _special(path: str) -> bool:
    """An existing target that is not a regular file (/dev/stdout, a FIFO): written in place."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def unwritable_reason(path: str) -> str | None:
    """Why ``path`` cannot take a report, or None. Probes by really opening the file (``os.access``
    says yes to root on a read-only file system or in /proc); a file it had to create is
    removed again, an existing one is left untouched."""
    if os.path.isdir(path):
        return f"{path} is a directory"
    if _special(path):
        return None if os.access(path, os.W_OK) else f"{path} is not writable"
    folder = os.path.dirname(os.path.realpath(path))
    if not os.path.isdir(folder):
        return f"{path}: folder {folder} does not exist"
    existed = os.path.exists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        return f"{path} is not writable ({exc.strerror or exc})"
    if not existed:
        try:
            os.remove(path)
        except OSError:
            pass
    try:  # the atomic write needs a temporary file next to it
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".graddoctor-")
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        return f"{path}: cannot write in folder {folder} ({exc.strerror or exc})"
    return None


def write_file(path: str, text: str) -> None:
    """Write the whole report or nothing: a temporary file in the same folder, then a rename
    (what a killed process leaves is the previous version, never half of one).
    The file keeps the permissions of the one it replaces; a symlink keeps pointing at it."""
    if _special(path):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    path = os.path.realpath(path)
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".graddoctor-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            mode = os.stat(path).st_mode & 0o7777
        except OSError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


class ReportStdout:
    """Where a report for stdout goes: a private copy of file descriptor 1 taken before the
    script runs, so that a script that closes fd 1 or points it elsewhere, and the watchdog's
    report written while fd 1 still goes to stderr (--format json), reach the real stdout.
    Only when ``sys.stdout`` is the process's fd 1 (not a test runner's capture); else None
    and the report is printed through ``sys.stdout``."""

    fd: int | None = None
    encoding: str = "utf-8"

    @classmethod
    def keep(cls) -> None:
        if cls.fd is not None:
            return
        try:
            if sys.stdout is None or sys.stdout.fileno() != 1:
                return
            cls.encoding = sys.stdout.encoding or "utf-8"
            cls.fd = os.dup(1)
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            cls.fd = None

    @classmethod
    def write(cls, text: str) -> bool:
        """Write ``text`` there; False when there is no such copy (or it failed)."""
        fd = cls.fd
        if fd is None:
            return False
        data = text.encode(cls.encoding, "backslashreplace")
        try:
            try:
                sys.stdout.flush()  # what graddoctor printed before goes first
            except Exception:
                pass
            while data:
                data = data[os.write(fd, data):]
            return True
        except OSError:
            return False

    @classmethod
    def end_machine_output(cls) -> None:
        """After a JSON or SARIF report on stdout: whatever the process prints from now on (the
        script's atexit handlers) goes to stderr, as the script's own prints did, so stdout holds
        one document."""
        try:
            sys.stdout.flush()
        except Exception:
            pass
        try:
            os.dup2(2, 1)
        except OSError:
            pass


def write_stdout(text: str) -> None:
    """Print the report; characters the terminal's encoding lacks become escapes, not a crash.
    A script that closed stdout gets its report on stderr."""
    if ReportStdout.write(text):
        return
    stream = sys.stdout
    try:
        try:
            stream.write(text)
        except UnicodeEncodeError:
            encoding = getattr(stream, "encoding", None) or "ascii"
            stream.write(text.encode(encoding, "backslashreplace").decode(encoding))
        stream.flush()
    except (OSError, ValueError):  # fd 1 closed: what is left
        sys.stderr.write(text)
        sys.stderr.flush()


def say(line: str) -> None:
    """One line of graddoctor's own on stderr (what it wrote, where a report went instead)."""
    stream = sys.stderr
    if stream is None:
        return
    stream.write(f"{line}\n")
    stream.flush()


def write_report(report, fmt, output: str | None, render) -> None:
    """The report in format ``fmt`` to ``output`` (written whole, atomically) or stdout."""
    text = fmt.render(report, render)
    if output:
        write_file(output, text)
    else:
        write_stdout(text)
        if fmt.document:  # what the script prints at exit (atexit) goes after it, to stderr
            ReportStdout.end_machine_output()


def emit_report(report, fmt, output: str | None, render, shown: str | None = None) -> None:
    """The report, then (with ``output``) a one-line verdict naming the file as it was typed
    (``shown``)."""
    write_report(report, fmt, output, render)
    if output:
        from .text import verdict

        say(f"graddoctor: wrote {shown or output}: {verdict(report).plain}")


def script_traceback(report) -> str | None:
    """A script that raised: its traceback as python prints it (the script's own frames), for
    stderr before the report, so that a crash under graddoctor is as debuggable as without.
    None for any other end, and for graddoctor's own stop (a rank's SIGTERM: no exception of
    the script's, python prints none)."""
    error = report.run.error or {}
    text = error.get("traceback") or ""
    ours = any(line.startswith("graddoctor.") for line in text.splitlines())
    if report.run.status == "crashed" and text and not ours:
        return "Traceback (most recent call last):\n" + text.rstrip("\n")
    return None
