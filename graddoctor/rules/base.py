"""The rule interface: one small class per rule, its docs in its docstring.

The docstring has four sections — What it does / Why is this bad? / Example / Use instead —
and feeds ``graddoctor explain``, the SARIF help text and the README alike.
"""

from __future__ import annotations

import inspect
import re
from typing import TYPE_CHECKING, ClassVar, Iterable, Sequence

from ..findings import Autofix, Edit, Finding, ProcessFacts, Related, Role, Safety, Severity
from ..trace import Location

if TYPE_CHECKING:
    from ..analysis import Analysis
    from .source import Source


class Rule:
    code: ClassVar[str]
    slug: ClassVar[str]
    severity: ClassVar[Severity]
    summary: ClassVar[str]  # one line, for `graddoctor rules`
    fix: ClassVar[str] = ""
    # the fix in a training framework's own terms, keyed by framework ("lightning",
    # "accelerate", "transformers"; graddoctor/frameworks.py): a finding whose location came
    # through that framework, or made in a run driven by it, gets that variant
    # (rules/engine.py); `explain` and the SARIF help list them under "Fix in a framework"
    fixes: ClassVar[dict[str, str]] = {}
    # the safety of the rule's mechanical fix (``autofix``); None: the rule offers no edit
    fix_safety: ClassVar[Safety | None] = None

    def check(self, a: "Analysis") -> Iterable[Finding]:  # pragma: no cover - interface
        """The findings of this rule over one analysed trace (``graddoctor.analysis``)."""
        raise NotImplementedError

    def check_processes(self, processes: Sequence[ProcessFacts]) -> Iterable[Finding]:
        """The findings of this rule across the processes of one run (the ranks of a
        distributed run, spawned workers), when their reports are merged (report/merge.py).
        Most rules judge one trace and find nothing here."""
        return ()

    def across_ranks(self, finding: Finding, world_size: int) -> Finding:
        """This rule's finding as the merged report of ``world_size`` ranks says it, once it
        is known which ranks saw it (``finding.ranks``): what a bug on some ranks does to the
        update every rank applies. Most findings read the same: returned as they are."""
        return finding

    def finding(self, message: str, location: Location | None, *, related=(), step=None,
                evidence=None, severity: Severity | None = None, fix: str | None = None,
                fixes: dict[str, str] | None = None) -> Finding:
        """``fix``: this finding's own fix (default: the rule's); ``fixes``: its variants by
        framework (default: the rule's ``fixes`` with the rule's fix, none with a fix of its own)."""
        if fixes is None:
            fixes = self.fixes if fix is None else {}
        return Finding(
            rule=self.slug, code=self.code, severity=severity or self.severity, message=message,
            location=location, fix=self.fix if fix is None else fix,
            related=_merge_related(related), step=step, evidence=evidence or {}, fixes=fixes,
        )

    def autofix(self, finding: Finding, src: "Source") -> Autofix | None:
        """The edit that fixes ``finding`` in ``src`` (the file its location points at, parsed
        with libcst: rules/source.py), or None when this occurrence cannot be fixed
        mechanically. Only rules with a ``fix_safety`` are asked."""
        return None

    def edit(self, title: str, *edits: Edit, safety: Safety | None = None) -> Autofix | None:
        """An ``Autofix`` of this rule's safety (None when no edit was made)."""
        edits = tuple(e for e in edits if e is not None)
        if not edits:
            return None
        return Autofix(title=title, safety=safety or self.fix_safety or Safety.UNSAFE, edits=edits)

    @classmethod
    def docs(cls) -> str:
        docs = inspect.cleandoc(cls.__doc__ or "")
        if cls.fixes:
            from ..frameworks import TITLES

            docs += "\n\n## Fix in a framework\n" + "\n".join(
                f"- **{TITLES.get(name, name)}**: {text}" for name, text in cls.fixes.items())
        if cls.fix_safety is not None:
            how = inspect.cleandoc(cls.autofix.__doc__ or "").replace("\n", " ")
            docs += (f"\n\n## Automatic fix\n**{cls.fix_safety.value}** (`graddoctor check --diff` "
                     f"shows it, `--fix` applies it{'' if cls.fix_safety is Safety.SAFE else ' with --unsafe-fixes'}"
                     f", once verified by running the fixed script): {how}")
        return docs

    @classmethod
    def fix_for(cls, framework: str) -> str:
        """The fix in that framework's terms when the rule has one, else the plain fix."""
        return cls.fixes.get(framework, cls.fix) if framework else cls.fix

    @classmethod
    def doc_section(cls, title: str) -> str:
        """The text under ``## <title>`` in the docs ('' when absent)."""
        match = re.search(rf"^## {re.escape(title)}\s*\n(.*?)(?=^## |\Z)", cls.docs(), re.S | re.M)
        return match.group(1).strip() if match else ""


def _merge_related(items) -> tuple[Related, ...]:
    """Drop missing ones; join the notes of entries that point at the same line."""
    merged: dict = {}
    for r in items:
        if r is None:
            continue
        key = (r.location.path, r.location.line)
        merged[key] = Related(r.location, f"{merged[key].note}; {r.note}",
                              merged[key].roles + r.roles) if key in merged else r
    return tuple(merged.values())


def plural(count: int, word: str, many: str | None = None) -> str:
    """'1 step', '3 steps'; '2 micro-batches' with ``many``."""
    return f"{count} {word if count == 1 else (many or word + 's')}"


def times(count: int) -> str:
    """'once', 'twice', '3 times'."""
    return {1: "once", 2: "twice"}.get(count, f"{count} times")


def one_or_many(count: int, one: str, many: str) -> str:
    """The word that agrees with ``count``: it/them, its/their, a layer/3 layers."""
    return one if count == 1 else many


def helper_call(a, event) -> Related | None:
    """For a call inside the user's helper (a ``zero_grad()`` in ``def reset``) that is in no
    loop of its own: the helper's call site, when a loop holds it (the line to move)."""
    data = event.get("caller") if event is not None else None
    loc = event.loc if event is not None else None
    if not data or loc is None or loc.via:
        return None
    caller = Location(str(data[0]), int(data[1]), str(data[2]))
    source = a.source
    if source.inside_loop(loc.path, loc.line) is not False \
            or not source.inside_loop(caller.path, caller.line):
        return None  # the loop is in the same function (a main()), or the call is in no loop
    name = loc.function or "the helper"
    return Related(caller, f"the call of {name}() in the loop that runs this clear",
                   (Role.HELPER_CALL,))


def related(event, note: str, role: Role | None = None) -> Related | None:
    """A related location for an event (``role``: what it is to the finding, for code that
    acts on it), or None when the event has no location."""
    if event is None or event.loc is None:
        return None
    return Related(event.loc, note, (role,) if role is not None else ())
