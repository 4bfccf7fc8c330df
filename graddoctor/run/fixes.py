"""``graddoctor check --diff`` / ``--fix``: the findings' edits (``Finding.autofix``, built by
the rules) verified by running the fixed script, shown as a diff, written in place.

Verification runs a temporary copy of the script with the edits made (next to the original,
so that its imports and relative files resolve the same; removed afterwards) under the same
options and arguments, in this process (``run_check``), and compares the findings: a fix is
*fixed* when its finding is gone and no new finding appeared, *not fixed* when it is still
there, *fix introduced a finding* when the fixed script has a finding the original had not.
All fixes are tried together first; when that run is not clean, each fix alone, so that a
verdict belongs to its own fix. Only edits in the script itself can be verified this way (an
imported module would have to be changed in place).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Iterable

from ..edits import apply_edits, edits_by_path, fixable, line_map, unified_diff
from ..findings import INTRODUCED, NOT_FIXED, VERIFIED, Autofix, Finding
from ..options import CheckOptions
from ..report.model import Report

GOOD_STATUSES = ("completed", "step-limit")


def _full(path: str, base_dir: str | None) -> str:
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(base_dir or os.getcwd(), path))


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except OSError:
        return None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def candidates(report: Report, unsafe: bool) -> list[Finding]:
    return fixable(report.findings, unsafe=unsafe)


def verify(report: Report, options: CheckOptions, *, unsafe: bool = False,
           run=None) -> Report:
    """The report with each candidate fix's ``verification`` set (see the module's doc).
    ``run``: the check to run the fixed copy with (default ``run_check``)."""
    if run is None:
        from .session import run_check as run
    chosen = candidates(report, unsafe)
    if not chosen or options.module:
        note = "a module run (-m) is not verified" if chosen else ""
        return _with(report, {id(f): (None, note) for f in chosen})
    script = _full(options.target, report.base_dir)
    verdicts: dict[int, tuple[str | None, str]] = {}
    elsewhere = [f for f in chosen if any(_full(e.path, report.base_dir) != script
                                         for e in f.autofix.edits)]
    for f in elsewhere:
        verdicts[id(f)] = (None, "the edit is in another file than the script: not verified")
    mine = [f for f in chosen if id(f) not in verdicts]
    if mine:
        together = _try(report, options, mine, script, run)
        if together is not None and all(v == VERIFIED for v, _ in together.values()):
            verdicts.update(together)
        elif len(mine) == 1 and together is not None:
            verdicts.update(together)
        else:
            for f in mine:
                alone = _try(report, options, [f], script, run)
                verdicts.update(alone if alone is not None else
                                {id(f): (None, "the fixed script could not be checked")})
    return _with(report, verdicts)


def _with(report: Report, verdicts: dict) -> Report:
    findings = []
    for f in report.findings:
        if id(f) in verdicts:
            v, note = verdicts[id(f)]
            f = dataclasses.replace(f, autofix=dataclasses.replace(
                f.autofix, verification=v, verification_note=note))
        findings.append(f)
    return dataclasses.replace(report, findings=findings)


def _key(f: Finding, path_of, line_of) -> tuple | None:
    if f.location is None:
        return (f.rule, None, None)
    return (f.rule, path_of(f.location.path), line_of(f.location.path, f.location.line))


def _try(report: Report, options: CheckOptions, fixes: list[Finding], script: str, run):
    """Run the script with ``fixes`` made; {id(finding): (verdict, note)}, or None when the
    copy could not be made."""
    text = _read(script)
    if text is None or _digest(text) != fixes[0].autofix.digest:
        return {id(f): (None, "the script changed since the check") for f in fixes}
    edits = [e for f in fixes for e in f.autofix.edits]
    new_text = apply_edits(text, edits)
    folder, name = os.path.split(script)
    copy = os.path.join(folder, f".{os.path.splitext(name)[0]}.graddoctor-fix-{os.getpid()}.py")
    try:
        with open(copy, "w", encoding="utf-8", newline="") as f:
            f.write(new_text)
    except OSError as exc:
        return {id(f): (None, f"could not write the fixed copy: {exc}") for f in fixes}
    try:
        fixed = run(dataclasses.replace(options, target=copy, trace_path=None, redirect_stdout=True))
    except Exception as exc:
        return {id(f): (None, f"the fixed script could not be run: {type(exc).__name__}: {exc}")
                for f in fixes}
    finally:
        try:
            os.remove(copy)
        except OSError:
            pass
    if fixed.run.status not in GOOD_STATUSES:
        why = (fixed.run.error or {}).get("message") or fixed.run.status
        return {id(f): (NOT_FIXED, f"the fixed script ended {fixed.run.status}: {why}") for f in fixes}
    new_of = line_map(edits, text)

    def path_of(p):
        full = _full(p, fixed.base_dir)
        return script if full == copy else full

    def old_line(p, line):  # findings of the original run, in the fixed copy's lines
        return new_of(line) if _full(p, report.base_dir) == script else line

    def same_line(p, line):
        return line

    before = {_key(f, lambda p: _full(p, report.base_dir), old_line) for f in report.findings}
    after = [(_key(f, path_of, same_line), f) for f in fixed.findings]
    new = [f for k, f in after if k not in before]
    out = {}
    for f in fixes:
        k = _key(f, lambda p: _full(p, report.base_dir), old_line)
        still = any(k2 == k for k2, _ in after)
        if new:
            g = new[0]
            where = f" at line {g.location.line}" if g.location else ""
            out[id(f)] = (INTRODUCED, f"{g.code} {g.rule}{where} of the fixed script")
        elif still:
            out[id(f)] = (NOT_FIXED, "the finding is still there in the fixed script")
        else:
            out[id(f)] = (VERIFIED, "")
    return out


# -- showing and writing ---------------------------------------------------------------------

def to_apply(report: Report, *, unsafe: bool, unverified: bool) -> list[Finding]:
    """The fixes ``--fix`` writes: safe ones (and unsafe with ``--unsafe-fixes``), verified
    unless ``unverified``."""
    return fixable(report.findings, unsafe=unsafe, verified_only=not unverified)


def mark(f: Finding) -> str:
    fix = f.autofix
    if fix.verification is None:
        state = "not verified" + (f" ({fix.verification_note})" if fix.verification_note else "")
    elif fix.verification == VERIFIED:
        state = "verified"
    else:
        state = fix.verification + (f": {fix.verification_note}" if fix.verification_note else "")
    return f"{f.code} {fix.safety.value}, {state}"


def diff(report: Report, findings: Iterable[Finding]) -> str:
    """The unified diff of these findings' edits, each hunk marked with its fixes' codes,
    safety and verification."""
    out = []
    for path, edits in edits_by_path(findings).items():
        full = _full(path, report.base_dir)
        old = _read(full)
        if old is None:
            continue
        # an insertion belongs to the hunk of the line above it too (at the end of a file, only that)
        marks = [(range(max(1, e.line - (e.line == e.end_line)), max(e.end_line, e.line) + 1), mark(f))
                 for f in findings for e in f.autofix.edits if e.path == path]
        out.append(unified_diff(path, old, apply_edits(old, edits), marks))
    return "".join(out)


def write(report: Report, findings: Iterable[Finding]) -> tuple[list[Finding], list[str]]:
    """Make the edits in place; (the findings fixed, a line per file left alone and why).
    A file whose text is not the one the fixes were computed on is left alone."""
    done, skipped = [], []
    by_path: dict[str, list[Finding]] = {}
    for f in findings:
        by_path.setdefault(f.autofix.edits[0].path, []).append(f)
    for path, group in by_path.items():
        full = _full(path, report.base_dir)
        text = _read(full)
        if text is None or any(f.autofix.digest != _digest(text) for f in group):
            skipped.append(f"{path}: changed since the check, not touched")
            continue
        new = apply_edits(text, [e for f in group for e in f.autofix.edits])
        tmp = full + ".graddoctor-tmp"
        with open(tmp, "w", encoding="utf-8", newline="") as out:
            out.write(new)
        os.replace(tmp, full)
        done.extend(group)
    return done, skipped


def refused(report: Report) -> list[Finding]:
    return [f for f in report.findings if f.autofix is not None and f.autofix.refused]


__all__ = ["verify", "diff", "write", "to_apply", "candidates", "refused", "Autofix"]


def act(report: Report, options: CheckOptions, ending, *, as_diff: bool,
        verified_only: bool = True, unsafe: bool = False) -> int:
    """``--diff`` / ``--fix`` after a check: the fixes verified by running the fixed script
    (``verified_only``; off: --no-verify), then the diff printed (``as_diff``) or the fixes
    written, the report written where ``ending`` (run/finish.py) says; the exit code."""
    from ..report.output import emit_report, say, write_report, write_stdout

    if verified_only:
        report = verify(report, options, unsafe=unsafe)
    chosen_fixes = candidates(report, unsafe)
    for f in refused(report):
        where = f"{f.location.path}:{f.location.line}" if f.location else ""
        say(f"graddoctor: {f.code} {f.rule} {where}: no fix: {f.autofix.refused}")
    verified = sum(1 for f in chosen_fixes if f.autofix.verified)
    if as_diff:
        if ending.output:
            write_report(report, ending.fmt, ending.output, ending.render)
        write_stdout(diff(report, chosen_fixes))
        say(f"graddoctor: {len(chosen_fixes)} fix{'es' if len(chosen_fixes) != 1 else ''} in "
            f"the diff, {verified} verified by running the fixed script")
        return report.exit_code()
    chosen = to_apply(report, unsafe=unsafe, unverified=not verified_only)
    # the report shows what is left, read against the file as it is before the edits
    left_report = dataclasses.replace(report, findings=[f for f in report.findings if f not in chosen])
    emit_report(left_report, ending.fmt, ending.output, ending.render, ending.shown)
    done, skipped = write(report, chosen)
    for line in skipped:
        say(f"graddoctor: {line}")
    left = [f for f in chosen_fixes if f not in done]
    say(f"graddoctor: fixed {len(done)} finding{'s' if len(done) != 1 else ''}"
        + (f" ({sum(1 for f in done if f.autofix.verified)} verified)" if done else "")
        + (f"; {len(left)} fix{'es' if len(left) != 1 else ''} not applied (not verified, "
           f"unsafe or overlapping: see --diff)" if left else ""))
    return dataclasses.replace(report, findings=[f for f in report.findings if f not in done]).exit_code()
