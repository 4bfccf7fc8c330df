"""After a check the interpreter is as it was: torch unpatched, no hook left, the process state
the script changed put back; checks are repeatable; the user's numbers are untouched."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import types

import pytest
import torch
import torch._dynamo  # noqa: F401  first imported by an optimizer; it rebinds torch.manual_seed
import torch.distributed
import torch.nn.utils.clip_grad
import torch.optim.lr_scheduler
import torch.utils.data

from conftest import cli_env, run_cli, run_cli_fresh
from graddoctor.run.session import run_check
from graddoctor.options import CheckOptions
from graddoctor.report.json_format import finding_to_dict
from reliability_helpers import MISBEHAVE, SCRIPTS

ALL_HOOKS = os.path.join(SCRIPTS, "all_hooks.py")
for _cls in (torch.optim.SGD, torch.optim.AdamW):  # torch wraps Cls.step at the first instance
    _cls([torch.zeros(1, requires_grad=True)])


def _owners() -> dict[str, object]:
    """Everything graddoctor patches or may patch, by name."""
    import torch.nn.modules.batchnorm

    owners = {
        "torch": torch, "torch.Tensor": torch.Tensor, "torch.autograd": torch.autograd,
        "torch.nn.Module": torch.nn.Module, "torch.nn.utils": torch.nn.utils,
        "torch.distributed": torch.distributed,  # all_reduce (hand-written data parallelism)
        "torch.nn.utils.clip_grad": torch.nn.utils.clip_grad,
        "DataLoader": torch.utils.data.DataLoader, "torch.amp.GradScaler": torch.amp.GradScaler,
        "LRScheduler": torch.optim.lr_scheduler.LRScheduler,
        "_BatchNorm": torch.nn.modules.batchnorm._BatchNorm, "torch.cuda": torch.cuda,
    }
    for name in dir(torch.optim):  # Optimizer and every subclass (some override zero_grad)
        obj = getattr(torch.optim, name)
        if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer):
            owners[f"torch.optim.{name}"] = obj
    return owners


def _global_hook_dicts() -> dict[str, dict]:
    import torch.nn.modules.module as module
    import torch.optim.optimizer as optimizer

    found = {f"optimizer.{n}": getattr(optimizer, n) for n in dir(optimizer)
             if n.startswith("_global_") and isinstance(getattr(optimizer, n), dict)}
    found.update({f"module.{n}": getattr(module, n) for n in dir(module)
                  if n.startswith("_global_") and isinstance(getattr(module, n), dict)})
    assert "optimizer._global_optimizer_pre_hooks" in found and "module._global_forward_hooks" in found
    return found


def _from_graddoctor(value) -> bool:
    """A function (or one it wraps) defined in graddoctor."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    while isinstance(value, (types.FunctionType, types.MethodType)):
        if str(getattr(value, "__module__", "")).startswith("graddoctor"):
            return True
        value = getattr(value, "__wrapped__", None)
    return False


class Snapshot:
    def __init__(self):
        self.attrs = {name: dict(vars(owner)) for name, owner in _owners().items()}
        self.hooks = {name: dict(d) for name, d in _global_hook_dicts().items()}
        self.argv, self.argv_list = list(sys.argv), sys.argv
        self.path = list(sys.path)
        self.main = sys.modules["__main__"]
        self.cwd = os.getcwd()
        self.streams = (sys.stdin, sys.stdout, sys.stderr)
        self.environ = dict(os.environ)
        self.signals = {s: signal.getsignal(s) for s in signal.valid_signals()
                        if s not in (signal.SIGKILL, signal.SIGSTOP)}
        self.torch = (torch.is_grad_enabled(), torch.get_default_dtype(), torch.get_num_threads(),
                      torch.is_anomaly_enabled())
        self.tracers = (sys.gettrace(), sys.getprofile())
        self.os_exit = os._exit
        self.skip_dirs = self._skip_dirs()

    @staticmethod
    def _skip_dirs():
        rules = sys.modules.get("torch._dynamo.trace_rules")
        return list(rules.SKIP_DIRS) if rules else None

    def assert_restored(self):
        for name, owner in _owners().items():
            now = vars(owner)
            for key, value in self.attrs[name].items():
                assert key in now and now[key] is value, f"{name}.{key} is not the original"
            strays = [k for k, v in now.items() if _from_graddoctor(v)]
            assert not strays, f"graddoctor left {name}.{strays}"
        for name, hooks in _global_hook_dicts().items():
            assert hooks == self.hooks[name], f"{name}: hooks left behind"
        assert sys.argv is self.argv_list and sys.argv == self.argv
        assert sys.path == self.path
        assert sys.modules["__main__"] is self.main
        assert os.getcwd() == self.cwd
        assert (sys.stdin, sys.stdout, sys.stderr) == self.streams
        assert dict(os.environ) == self.environ
        for sig, handler in self.signals.items():
            assert signal.getsignal(sig) == handler, f"signal {sig} handler changed"
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        assert (torch.is_grad_enabled(), torch.get_default_dtype(), torch.get_num_threads(),
                torch.is_anomaly_enabled()) == self.torch
        assert (sys.gettrace(), sys.getprofile()) == self.tracers
        assert os._exit is self.os_exit
        if self.skip_dirs is not None:
            assert self._skip_dirs() == self.skip_dirs
        assert not [t for t in threading.enumerate() if t.name.startswith("graddoctor")]


def _no_hooks_on(objects):
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            for module in obj.modules():
                for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                             "_backward_pre_hooks", "_state_dict_hooks", "_load_state_dict_pre_hooks"):
                    assert not getattr(module, attr, None), f"{type(module).__name__}.{attr}"
            for p in obj.parameters():
                assert not p._backward_hooks, "a gradient hook is left on a parameter"
                assert not getattr(p, "_post_accumulate_grad_hooks", None)
        elif isinstance(obj, torch.optim.Optimizer):
            assert not obj._optimizer_step_pre_hooks and not obj._optimizer_step_post_hooks
            assert "step" not in vars(obj) and "zero_grad" not in vars(obj)


SCENARIOS = {
    "every hook, step limit": (dict(target=ALL_HOOKS), "step-limit"),
    "every hook, messes up the process, crashes": (
        dict(target=ALL_HOOKS, args=("--mess", "--crash"), steps=0), "crashed"),
    "raises mid-run": (dict(target=MISBEHAVE, args=("raise-after",)), "crashed"),
    "KeyboardInterrupt": (dict(target=MISBEHAVE, args=("keyboard",)), "crashed"),
    "os._exit": (dict(target=MISBEHAVE, args=("os-exit",)), "completed"),
    "sys.exit(3)": (dict(target=MISBEHAVE, args=("exit3",)), "crashed"),
    "except Exception around the loop": (dict(target=MISBEHAVE, args=("catch-all",)), "step-limit"),
    "time limit": (dict(target=MISBEHAVE, args=("hang",), timeout=3), "timeout"),
    "module": (dict(target="gdpkg.train", module=True, args=("--crash",)), "crashed"),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_everything_is_restored_after_an_in_process_check(monkeypatch, scenario):
    kwargs, status = SCENARIOS[scenario]
    monkeypatch.syspath_prepend(SCRIPTS)
    if kwargs.get("module"):
        monkeypatch.chdir(SCRIPTS)
    import keep

    keep.objects.clear()
    before = Snapshot()
    report = run_check(CheckOptions(**kwargs))
    assert report.run.status == status, report.run
    assert report.internal_errors == []
    before.assert_restored()
    _no_hooks_on(keep.objects)
    keep.objects.clear()


def test_redirected_stdout_is_restored(capfd):
    """--format json without --output: the script's stdout (file descriptor 1 too) goes to
    stderr during the run, and comes back afterwards."""
    before = Snapshot()
    report = run_check(CheckOptions(target=MISBEHAVE, args=("ok",), redirect_stdout=True))
    assert report.run.status == "completed"
    print("after the check")
    os.write(1, b"fd 1 after the check\n")
    out, err = capfd.readouterr()
    assert "finished" in err and "finished" not in out
    assert "after the check" in out and "fd 1 after the check" in out
    before.assert_restored()


def _findings(report):
    return [finding_to_dict(f) for f in report.findings]


def test_two_runs_give_the_same_findings_in_process(monkeypatch):
    monkeypatch.syspath_prepend(SCRIPTS)
    seeded = os.path.join(SCRIPTS, "seeded_train.py")
    for options in (CheckOptions(target=MISBEHAVE, args=("raise-after",)),
                    CheckOptions(target=seeded, args=(os.devnull,), steps=0),
                    CheckOptions(target=ALL_HOOKS, steps=0)):
        first, second = run_check(options), run_check(options)
        assert _findings(first) == _findings(second)
        assert (first.run.status, first.run.steps) == (second.run.status, second.run.steps)


def test_two_runs_give_the_same_report_from_the_cli(tmp_path):
    def report():
        result = run_cli("check", MISBEHAVE, "-f", "json", "--", "raise-after")
        data = json.loads(result.stdout)
        data["run"].pop("duration_s")
        return result.returncode, data

    assert report() == report()


def test_results_are_bit_identical_with_and_without_graddoctor(tmp_path):
    """Two fresh interpreters, as the user runs them (start-up included, not forked warm)."""
    script = os.path.join(SCRIPTS, "seeded_train.py")
    plain = subprocess.run([sys.executable, script, str(tmp_path / "plain.pt")], env=cli_env(),
                           capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    checked = run_cli_fresh("check", "--steps", "0", "--fail-on", "never", script, "--",
                            str(tmp_path / "checked.pt"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    a = torch.load(tmp_path / "plain.pt", weights_only=False)
    b = torch.load(tmp_path / "checked.pt", weights_only=False)
    assert a["losses"] == b["losses"] and len(a["losses"]) == 18
    assert torch.equal(a["rng"], b["rng"]), "graddoctor consumed random numbers"
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for pid, state in a["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][pid][key]), (pid, key)
