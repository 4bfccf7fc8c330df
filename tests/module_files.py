"""Python files written into a test's folder and imported from there: a fake library under
``site-packages`` or a user's script, as the location finder sees them."""

from __future__ import annotations

import importlib.util
import textwrap


def load(path, text: str, **names):
    """Write ``text`` (dedented) to ``path``, import it as a module of its own and return it;
    ``names`` go into its globals before it runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    spec = importlib.util.spec_from_file_location(f"m{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(names)
    spec.loader.exec_module(module)
    return module
