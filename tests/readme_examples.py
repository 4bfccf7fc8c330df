"""The code blocks of the documentation's sections (README.md and docs/*.md), for the tests that run them."""

from __future__ import annotations

import os
import re

from conftest import ROOT


def readme_blocks(section: str, language: str = "python", page: str = "README.md") -> list[str]:
    """The ```language blocks under the heading ``## section`` of a page (up to the next ``## ``)."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = f.read()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start:end if end != -1 else None]
    return re.findall(rf"```{language}\n(.*?)```", body, flags=re.S)
