"""analysis.source.squeeze_assignment: the line that squeezed a loss argument on an explicit dim."""

from __future__ import annotations

import textwrap

from graddoctor.analysis.source import squeeze_assignment

TEXT = textwrap.dedent("""\
    import torch.nn.functional as F
    for xb, yb in loader:
        pred = model(xb).squeeze(0)
        loss = F.mse_loss(pred, yb)
        other = model(xb).squeeze()
        loss2 = F.mse_loss(other, yb)
        loss3 = F.mse_loss(model(xb).squeeze(0), yb)
    """)


def test_squeeze_on_an_earlier_line(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(TEXT)
    assert squeeze_assignment(str(path), 4, 0) == (3, "pred = model(xb).squeeze(0)", "0")
    assert squeeze_assignment(str(path), 4, 1) is None  # yb: never assigned by a squeeze


def test_squeeze_without_dim_or_inline_is_none(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(TEXT)
    assert squeeze_assignment(str(path), 6, 0) is None  # squeeze() with no dim
    assert squeeze_assignment(str(path), 7, 0) is None  # not a name: the loss line itself
