"""The code blocks of the README's sections, for the tests that run them."""

from __future__ import annotations

import os
import re

from conftest import ROOT


def readme_blocks(section: str, language: str = "python") -> list[str]:
    """The ```language blocks under the README heading ``## section`` (up to the next ``## ``)."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start:end if end != -1 else None]
    return re.findall(rf"```{language}\n(.*?)```", body, flags=re.S)
