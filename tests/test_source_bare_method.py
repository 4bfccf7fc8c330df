"""The source helper that finds a method named without its call (``optimizer.zero_grad``)."""
from graddoctor.analysis.source import bare_method_lines

SCRIPT = """\
opt.zero_grad
for step in range(3):
    opt.zero_grad  # named, not called
    clear = opt.zero_grad
    opt.zero_grad()
    loss.backward()
    for inner in range(2):
        model.zero_grad
"""


def test_finds_the_bare_statement_in_the_loop_around_the_line(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    assert bare_method_lines(str(path), 6, "zero_grad") == [(3, "opt.zero_grad"), (8, "model.zero_grad")]
    # the innermost loop only; a line outside every loop finds nothing
    assert bare_method_lines(str(path), 8, "zero_grad") == [(8, "model.zero_grad")]
    assert bare_method_lines(str(path), 1, "zero_grad") == []


def test_unreadable_or_invalid_source_finds_nothing(tmp_path):
    assert bare_method_lines(str(tmp_path / "missing.py"), 3, "zero_grad") == []
    bad = tmp_path / "bad.py"
    bad.write_text("for x in (:\n    opt.zero_grad\n")
    assert bare_method_lines(str(bad), 2, "zero_grad") == []


def test_outer_searches_the_outermost_loop_around_the_line(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("for epoch in range(2):\n    model.train\n    for i in range(3):\n"
                    "        loss.backward()\n")
    assert bare_method_lines(str(path), 4, "train") == []
    assert bare_method_lines(str(path), 4, "train", outer=True) == [(2, "model.train")]
