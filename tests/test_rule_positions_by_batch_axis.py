"""positions-by-batch-axis (GD144): the source reading (analysis/source.py table_sliced_by_batch)."""

from __future__ import annotations

import textwrap

import pytest

from graddoctor.analysis.source import table_sliced_by_batch

MODEL = """\
class Pos(nn.Module):
    def forward(self, ids):
        x = self.emb(ids)
        return {add}

layer = nn.TransformerEncoderLayer(32, 4, batch_first={batch_first})
pos = Pos()
{extra}
"""


def _read(tmp_path, add, batch_first="True", extra=""):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(MODEL.format(add=add, batch_first=batch_first, extra=extra)))
    return table_sliced_by_batch(str(path))


@pytest.mark.parametrize("add", ["x + self.pe[:x.size(0)]", "self.pe[:x.shape[0]] + x",
                                 "x + self.pos[:len(x)].unsqueeze(1)"])
def test_a_table_sliced_by_the_first_axis_of_batch_first_input(tmp_path, add):
    assert _read(tmp_path, add) == [(4, add, "Pos")]


@pytest.mark.parametrize("add, batch_first, extra", [
    ("x + self.pe[:x.size(0)]", "False", ""),  # sequence first: the tutorial's layout
    ("x + self.pe[:, :x.size(1)]", "True", ""),  # sliced by the sequence axis
    ("x + self.pe[:x.size(0)]", "True", "x = x.transpose(0, 1)"),  # the script swaps the axes
    ("x + self.pe[:ids.size(0)]", "True", ""),  # the length of another tensor
])
def test_silent_on_sequence_first_sequence_axis_or_swapped_axes(tmp_path, add, batch_first, extra):
    assert _read(tmp_path, add, batch_first, extra) == []


def test_a_class_the_script_never_builds_is_not_reported(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(MODEL.format(add="x + self.pe[:x.size(0)]", batch_first="True",
                                                 extra="")).replace("pos = Pos()", ""))
    assert table_sliced_by_batch(str(path)) == []
