"""analysis/source.py's no_grad_block: the statement that turns gradients off around a line."""

from __future__ import annotations

import textwrap

from graddoctor.analysis.source import no_grad_block


def _file(tmp_path, text: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_the_innermost_with_or_decorator_that_holds_the_line(tmp_path):
    path = _file(tmp_path, """\
        import torch

        @torch.no_grad()
        def evaluate(model, x):
            return model(x)

        def step(model, x):
            with torch.enable_grad():
                a = model(x)
            with torch.no_grad():
                b = model(x)
                with torch.inference_mode():
                    c = model(x)
            with torch.set_grad_enabled(False):
                d = model(x)
            with torch.set_grad_enabled(True):
                e = model(x)
            return a
        """)
    assert no_grad_block(path, 5) == (3, "@torch.no_grad()")
    assert no_grad_block(path, 9) is None
    assert no_grad_block(path, 11) == (10, "with torch.no_grad():")
    assert no_grad_block(path, 13) == (12, "with torch.inference_mode():")
    assert no_grad_block(path, 15) == (14, "with torch.set_grad_enabled(False):")
    assert no_grad_block(path, 17) is None
    assert no_grad_block(path, 18) is None
