"""Where a report goes: a file checked before the script runs and written atomically, or stdout
written so that an odd terminal encoding cannot lose it."""

from __future__ import annotations

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


def write_stdout(text: str) -> None:
    """Print the report; characters the terminal's encoding lacks become escapes, not a crash."""
    stream = sys.stdout
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "ascii"
        stream.write(text.encode(encoding, "backslashreplace").decode(encoding))
    stream.flush()
