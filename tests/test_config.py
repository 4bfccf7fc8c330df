"""[tool.graddoctor] in pyproject.toml, and the command line over it."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from typer.testing import CliRunner

from graddoctor.cli import app
from graddoctor.config import Config, ConfigError, find_config
from graddoctor.options import load_config, merge_config as merge, validate_config as validate
from graddoctor.options import split_selectors
from report_samples import MISSING_ZERO_GRAD, UNUSED_LAYER, write

runner = CliRunner()


def pyproject(folder, body: str) -> str:
    path = os.path.join(str(folder), "pyproject.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(textwrap.dedent(body))
    return path


def check(*args):
    result = runner.invoke(app, ["check", *args])
    report = None
    if "--format" in args and result.stdout.strip().startswith("{"):
        report = json.loads(result.stdout)
    return result, report


# -- unit ----------------------------------------------------------------------------------

def test_found_from_the_script_folder_upward_skipping_unrelated_pyprojects(tmp_path):
    root = pyproject(tmp_path, '[tool.graddoctor]\nsteps = 3\n')
    sub = tmp_path / "pkg" / "train"
    sub.mkdir(parents=True)
    pyproject(tmp_path / "pkg", '[project]\nname = "pkg"\n')  # closer, but not ours
    assert find_config(str(sub)) == root
    assert load_config(str(sub)) == Config(root, {"steps": 3})


def test_no_config_anywhere(tmp_path):
    assert load_config(str(tmp_path)) == Config()


def test_every_key_and_its_spellings():
    values = validate({"steps": 4, "device": "cpu", "fail-on": "error", "select": "GD1,stale-grad",
                       "ignore": ["GD106"], "timeout": 30}, "p")
    assert values == {"steps": 4, "device": "cpu", "fail_on": "error", "select": ("GD1", "stale-grad"),
                      "ignore": ("GD106",), "timeout": 30.0}
    assert validate({"fail_on": "never"}, "p") == {"fail_on": "never"}


@pytest.mark.parametrize("table, message", [
    ({"stpes": 3}, "unknown option 'stpes'"),
    ({"steps": -1}, "steps must be a whole number >= 0"),
    ({"steps": True}, "steps must be a whole number"),
    ({"steps": 2.5}, "steps must be a whole number"),
    ({"timeout": "60"}, "timeout must be a number"),
    ({"device": "tpu"}, "device must be one of auto, cpu, cuda"),
    ({"fail-on": "warn"}, "fail-on must be one of error, warning, info, never"),
    ({"select": [1]}, "select must be a string or a list of strings"),
])
def test_bad_values_are_named(table, message):
    with pytest.raises(ConfigError, match=message):
        validate(table, "pyproject.toml")


def test_invalid_toml_is_reported(tmp_path):
    pyproject(tmp_path, '[tool.graddoctor]\nsteps = \n')
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(str(tmp_path))


def test_without_a_toml_reader_the_message_says_what_to_install(tmp_path, monkeypatch):
    import graddoctor.config as config

    pyproject(tmp_path, '[tool.graddoctor]\nsteps = 3\n')
    monkeypatch.setattr(config, "_toml_reader", lambda: None)
    with pytest.raises(ConfigError, match="Python 3.11\\+ or the 'tomli' package: pip install tomli"):
        load_config(str(tmp_path))


def test_merge_typed_options_win():
    typed = {"steps": 10, "fail_on": "warning", "select": ()}
    config = Config("p", {"steps": 3, "fail_on": "error", "select": ("GD1",)})
    assert merge(typed, {"steps"}, config) == {"steps": 10, "fail_on": "error", "select": ("GD1",)}
    assert merge(typed, set(), Config()) == typed


def test_split_selectors():
    assert split_selectors(["GD1, stale-grad", "", "GD2"]) == ("GD1", "stale-grad", "GD2")
    assert split_selectors(None) == ()


# -- through the CLI (real, tiny scripts) ---------------------------------------------------

def test_config_fail_on_and_command_line_override(tmp_path):
    script = write(tmp_path, "train.py", UNUSED_LAYER)  # one warning
    pyproject(tmp_path, '[tool.graddoctor]\nfail-on = "error"\nsteps = 3\n')
    result, report = check(script, "--format", "json")
    assert result.exit_code == 0, result.output
    assert report["run"]["steps"] == 3 and report["run"]["step_budget"] == 3
    assert report["run"]["config"].endswith("pyproject.toml")
    assert [f["rule"] for f in report["findings"]] == ["param-without-grad"]
    result, report = check(script, "--format", "json", "--fail-on", "warning", "--steps", "2")
    assert result.exit_code == 1
    assert report["run"]["steps"] == 2


def test_config_ignore_and_a_typed_ignore_replaces_it(tmp_path):
    script = write(tmp_path, "train.py", UNUSED_LAYER)
    pyproject(tmp_path, '[tool.graddoctor]\nignore = ["param-without-grad"]\nsteps = 3\n')
    result, report = check(script, "--format", "json")
    assert result.exit_code == 0 and report["findings"] == []
    result, report = check(script, "--format", "json", "--ignore", "GD101")
    assert result.exit_code == 1 and [f["code"] for f in report["findings"]] == ["GD106"]


def test_select_by_code_prefix(tmp_path):
    script = write(tmp_path, "train.py", UNUSED_LAYER)
    result, report = check(script, "--format", "json", "--steps", "3", "--select", "GD101,GD102")
    assert result.exit_code == 0 and report["findings"] == []
    result, report = check(script, "--format", "json", "--steps", "3", "--select", "GD10")
    assert result.exit_code == 1


def test_bad_config_or_unknown_rule_exits_2_with_one_clear_line(tmp_path):
    script = write(tmp_path, "train.py", MISSING_ZERO_GRAD)
    pyproject(tmp_path, '[tool.graddoctor]\nstpes = 3\n')
    result, _ = check(script)
    assert result.exit_code == 2
    assert "unknown option 'stpes'" in result.stderr and "Traceback" not in result.output
    pyproject(tmp_path, '[tool.graddoctor]\nselect = ["GD9"]\n')
    result, _ = check(script)
    assert result.exit_code == 2 and "[tool.graddoctor] select: no rule is named 'GD9'" in result.stderr
    os.remove(os.path.join(str(tmp_path), "pyproject.toml"))
    result, _ = check(script, "--ignore", "zero-grad")
    assert result.exit_code == 2 and "--ignore: no rule is named 'zero-grad'" in result.stderr


# -- one table for every option (graddoctor/options.py) ---------------------------------------

def test_exact_messages_for_bad_values():
    """The wording users see for a bad [tool.graddoctor] value (pinned: the table words them)."""
    cases = {
        "steps": (-1, "p: [tool.graddoctor] steps must be a whole number >= 0, not -1"),
        "timeout": ("60", "p: [tool.graddoctor] timeout must be a number >= 0, not '60'"),
        "device": ("tpu", "p: [tool.graddoctor] device must be one of auto, cpu, cuda, not 'tpu'"),
        "fail-on": ("warn", "p: [tool.graddoctor] fail-on must be one of error, warning, info, "
                            "never, not 'warn'"),
        "select": ([1], "p: [tool.graddoctor] select must be a string or a list of strings"),
        "ignore": (3, "p: [tool.graddoctor] ignore must be a string or a list of strings"),
    }
    for key, (value, message) in cases.items():
        with pytest.raises(ConfigError) as info:
            validate({key: value}, "p")
        assert str(info.value) == message
    with pytest.raises(ConfigError) as info:
        validate({"stpes": 3}, "p")
    assert str(info.value) == ("p: [tool.graddoctor] unknown option 'stpes' (did you mean 'steps'?) "
                               "(known: steps, epoch-batches, timeout, device, emulate-cuda, "
                               "fail-on, select, ignore, grad-flow, allow-incomplete)")


@pytest.mark.parametrize("value", [float("nan"), -0.5, True])
def test_a_configured_timeout_must_be_a_real_number(value):
    """NaN is refused in pyproject.toml too, naming the file, before it can reach the library."""
    with pytest.raises(ConfigError, match="timeout must be a number >= 0"):
        validate({"timeout": value}, "p")
    assert validate({"timeout": float("inf")}, "p") == {"timeout": float("inf")}


def test_config_keys_are_the_table_rows():
    from graddoctor.options import CONFIG_KEYS, OPTIONS

    assert list(CONFIG_KEYS) == ["steps", "epoch-batches", "timeout", "device", "emulate-cuda",
                                 "fail-on", "select", "ignore", "grad-flow", "allow-incomplete"]
    for key, option in CONFIG_KEYS.items():
        assert OPTIONS[option.name] is option
        assert option.field or option.name == "grad_flow"  # the library takes the others


def test_the_command_line_options_are_the_table_rows():
    """Flags, help, defaults and choices of `check` come from the table, and nothing else."""
    import typer

    from graddoctor.options import OPTIONS

    command = typer.main.get_command(app).commands["check"]
    params = {p.name: p for p in command.params if p.name not in ("help", "script", "script_args")}
    assert list(params) == list(OPTIONS)
    for name, option in OPTIONS.items():
        param = params[name]
        assert set(param.opts) == set(option.flags), name
        assert set(param.secondary_opts) == set(option.negative_flags), name
        assert param.help == option.help
        assert param.default == option.kind.cli_default(option.default), name
    help_text = runner.invoke(app, ["check", "--help"], env={"COLUMNS": "200"}).stdout
    assert "<auto|cpu|cuda>" in help_text and "<error|warning|info|never>" in help_text
    assert "<text|json|sarif|github|html|markdown>" in help_text
    assert "Settings come from [tool.graddoctor] in the closest" in help_text


def test_choices_and_keys_are_spelled_only_in_the_table():
    """A drift guard: no other module spells a list of choices or keys again."""
    import graddoctor
    from graddoctor.options import CONFIG_KEYS, OPTIONS

    spelled = [", ".join(f'"{c}"' for c in o.kind.choices) for o in OPTIONS.values()
               if hasattr(o.kind, "choices")]
    spelled.append(", ".join(f'"{k}"' for k in CONFIG_KEYS))
    package = os.path.dirname(graddoctor.__file__)
    for folder, _, files in os.walk(package):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or path == os.path.join(package, "options.py"):
                continue
            with open(path, encoding="utf-8") as f:
                source = f.read()
            assert not [s for s in spelled if s in source], path


def test_every_command_line_option_is_a_config_key_or_says_why_not():
    """epoch-batches was an option and not a key: each option of `check` is accepted in
    [tool.graddoctor] (its default validates there), or the table says why it is CLI-only."""
    import typer

    from graddoctor.options import CLI_ONLY, CONFIG_KEYS, OPTIONS

    command = typer.main.get_command(app).commands["check"]
    options = [p for p in command.params if p.param_type_name == "option" and p.name != "help"]
    assert options
    for param in options:
        option = OPTIONS[param.name]
        if param.name in CLI_ONLY:
            assert option.config_key is None and option.cli_only, param.name
            continue
        key = param.opts[0][2:]
        assert CONFIG_KEYS.get(key) is option, f"--{key} is not accepted in [tool.graddoctor]"
        validate({key: option.default if option.default != () else []}, "p")
    assert set(CLI_ONLY) == {"module", "format", "output", "trace", "plot", "nproc_per_node",
                             "diff", "fix", "unsafe_fixes", "no_verify", "quiet"}


def test_epoch_batches_grad_flow_and_allow_incomplete_in_the_config(tmp_path):
    assert validate({"epoch-batches": 5, "grad-flow": True, "allow_incomplete": False}, "p") == \
        {"epoch_batches": 5, "grad_flow": True, "allow_incomplete": False}
    with pytest.raises(ConfigError) as info:
        validate({"allow-incomplete": "yes"}, "p")
    assert str(info.value) == "p: [tool.graddoctor] allow-incomplete must be true or false, not 'yes'"
    with pytest.raises(ConfigError, match="epoch-batches must be a whole number >= 0"):
        validate({"epoch-batches": -1}, "p")


def test_configured_epoch_batches_reaches_the_replay_and_a_typed_one_wins(tmp_path):
    script = write(tmp_path, "train.py", textwrap.dedent('''\
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(64, 2), torch.randn(64, 1)), batch_size=2)
        for epoch in range(3):
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
    '''))
    pyproject(tmp_path, "[tool.graddoctor]\nepoch-batches = 3\nsteps = 0\n")
    _, report = check(script, "--format", "json")
    assert report["run"]["steps"] == 9, report["run"]  # 3 epochs of 3 batches
    _, report = check(script, "--format", "json", "--epoch-batches", "4")
    assert report["run"]["steps"] == 12


def test_the_replay_and_the_option_table_agree_on_the_default_epoch_length():
    """The instrumentation cannot read the option table (it sits below it), so each names 17."""
    from graddoctor.instrument.dataloader import DEFAULT_EPOCH_BATCHES
    from graddoctor.options import OPTIONS

    assert OPTIONS["epoch_batches"].default == DEFAULT_EPOCH_BATCHES
