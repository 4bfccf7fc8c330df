"""Notebooks (graddoctor/notebook.py): ``graddoctor check nb.ipynb`` runs the code cells in
order as one script, IPython syntax skipped with a note, locations read ``cell N, line M`` in
text and point into the .ipynb file in JSON/SARIF; ``%%graddoctor`` (graddoctor/magic.py) in a
real Jupyter kernel."""

from __future__ import annotations

import json
import os
import re

import pytest

from conftest import ROOT
from graddoctor import check_script
from graddoctor.errors import ScriptError
from graddoctor.notebook import _python_line
from graddoctor.report.json_format import finding_to_dict, load_schema
from readme_examples import readme_blocks
from wire_round_trip import assert_round_trip

nbformat = pytest.importorskip("nbformat")
v4 = nbformat.v4

SETUP = "!pip install torch\n%matplotlib inline\nimport torch\ntorch.manual_seed(0)"
MODEL = "model = torch.nn.Linear(4, 2)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)"
LOOP = ("%%time\nfor _ in range(4):\n    loss = model(torch.randn(8, 4)).pow(2).mean()\n"
        "    loss.backward()\n    optimizer.step()")


def write(path, cells, indent=True):
    nb = v4.new_notebook()
    nb.cells = cells
    if indent:
        nbformat.write(nb, str(path))
    else:  # valid, but one line of JSON: not laid out one source line per line
        path.write_text(json.dumps(nb))
    return str(path)


def buggy(tmp_path, **kw):
    return write(tmp_path / "train.ipynb", [
        v4.new_markdown_cell("# Training"), v4.new_code_cell(SETUP), v4.new_code_cell(MODEL),
        v4.new_markdown_cell("the loop"), v4.new_code_cell(LOOP),
        v4.new_code_cell("%%bash\necho not python")], **kw)


def test_a_notebook_runs_as_one_script_and_findings_name_cell_and_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = check_script(buggy(tmp_path))
    assert report.run.status == "completed" and report.run.steps == 4
    [finding] = [f for f in report.active() if f.rule == "missing-zero-grad"]
    # the location is the line of the .ipynb file that holds `loss.backward()`
    assert finding.location.path == "train.ipynb"
    file_line = (tmp_path / "train.ipynb").read_text().splitlines()[finding.location.line - 1]
    assert json.loads(file_line.strip().rstrip(",")) == "    loss.backward()\n"
    assert finding_to_dict(finding)["location"] == {"path": "train.ipynb",
                                                    "line": finding.location.line,
                                                    "cell": 5, "cell_line": 4}
    assert_round_trip(report)  # cell and cell_line too
    text = report.render("text")
    assert "error GD101 missing-zero-grad  train.ipynb, cell 5, line 4" in text
    assert "❱ 4     loss.backward()" in text  # the cell's code, numbered in the cell
    assert "backward c5:L4 (GD101) → step c5:L5" in text  # the update timeline
    notes = "\n".join(report.run.notes)
    for skipped in ("cell 2, line 1: shell escape `!pip install torch` skipped",
                    "cell 2, line 2: IPython magic `%matplotlib inline` skipped",
                    "cell 5, line 1: cell magic `%%time` dropped", "cell 6: `%%bash` cell skipped"):
        assert skipped in notes
    sarif = json.loads(report.render("sarif"))["runs"][0]
    [result] = [r for r in sarif["results"] if r["properties"]["rule"] == "missing-zero-grad"]
    place = result["locations"][0]["physicalLocation"]
    assert place["artifactLocation"]["uri"] == "train.ipynb"
    assert place["region"]["startLine"] == finding.location.line
    assert result["properties"]["notebook"] == {"cell": 5, "line": 4}
    import jsonschema

    jsonschema.validate(report.to_json(), load_schema())


def test_a_notebook_in_one_line_of_json_still_names_cell_and_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = check_script(buggy(tmp_path, indent=False))
    [finding] = [f for f in report.active() if f.rule == "missing-zero-grad"]
    assert finding_to_dict(finding)["location"]["cell"] == 5
    assert finding_to_dict(finding)["location"]["cell_line"] == 4
    assert any("does not hold one source line per line" in n for n in report.run.notes)


def test_suppression_comment_in_a_cell(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path / "nb.ipynb", [v4.new_code_cell(
        "import torch\nmodel = torch.nn.Linear(4, 2)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nfor _ in range(3):\n"
        "    model(torch.randn(8, 4)).sum().backward()  # graddoctor: ignore[missing-zero-grad]\n"
        "    optimizer.step()")])
    report = check_script(path)
    assert [f.rule for f in report.suppressed()] == ["missing-zero-grad"]
    assert report.exit_code("warning") == 0


def test_display_is_there_as_in_a_kernel(tmp_path, capsys):
    path = write(tmp_path / "nb.ipynb", [v4.new_code_cell("display('shown')")])
    report = check_script(path)
    assert report.run.status == "no-training-loop" and report.run.error is None
    assert "shown" in capsys.readouterr().out


def test_a_syntax_error_names_the_cell(tmp_path):
    path = write(tmp_path / "nb.ipynb", [v4.new_code_cell("x = 1"), v4.new_code_cell("y = = 2")])
    with pytest.raises(ScriptError, match=r"nb.ipynb, cell 2, line 1: syntax error"):
        check_script(path)


def test_not_a_notebook(tmp_path):
    bad = tmp_path / "bad.ipynb"
    bad.write_text("{not json")
    with pytest.raises(ScriptError, match="is not a Jupyter notebook"):
        check_script(str(bad))


@pytest.mark.parametrize("line, python", [
    ("!ls -l\n", "pass\n"),
    ("    %timeit -n 3 f()\n", "    pass\n"),
    ("%time train(model)\n", "train(model)\n"),
    ("files = !ls\n", "pass\n"),
    ("model?\n", "pass\n"),
    ("x = 1  # !not an escape\n", "x = 1  # !not an escape\n"),
    ("a == !b\n", "a == !b\n"),  # not an assignment: left for Python to judge
    ("y = x % 2\n", "y = x % 2\n"),
])
def test_ipython_lines(line, python):
    assert _python_line(line, "cell 1, line 1", []) == python


def test_the_cli_takes_a_notebook(tmp_path, cli):
    path = buggy(tmp_path)
    done = cli("check", path, "--format", "json", cwd=str(tmp_path))
    assert done.returncode == 1, done.stderr
    findings = json.loads(done.stdout)["findings"]
    assert {"cell": 5, "cell_line": 4}.items() <= findings[0]["location"].items()


def test_cell_magic_in_a_real_kernel(tmp_path, monkeypatch):
    """%load_ext graddoctor + %%graddoctor, executed by a real Jupyter kernel (nbclient): the
    docs/api.md's "Use it in a notebook" cells as written, then a few more."""
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    setup, magic = readme_blocks("Use it in a notebook", page="docs/api.md")
    assert magic.startswith("%%graddoctor")
    nb.cells = [
        v4.new_code_cell(setup), v4.new_code_cell(magic),
        v4.new_code_cell("print(_graddoctor.failed, [f.rule for f in _graddoctor.findings])"),
        v4.new_code_cell("%%graddoctor --select nope\npass"),
    ]
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()

    def text(cell):
        out = []
        for o in cell.outputs:
            out.append(o.get("text") or o.get("data", {}).get("text/plain", ""))
        return re.sub(r"\x1b\[[0-9;]*m", "", "".join(out))  # rich colours it in a notebook

    shown = text(nb.cells[1])
    assert re.search(r"error GD101 missing-zero-grad  In \[\d+\], line 3\n", shown), shown
    assert "✗ 1 error" in shown
    assert text(nb.cells[2]).strip() == "True ['missing-zero-grad']"
    assert "graddoctor: error: select: no rule is named 'nope'" in text(nb.cells[3])
