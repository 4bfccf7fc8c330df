"""``--emulate-cuda`` (graddoctor/run/emulate_cuda.py): a script takes its GPU path while every
tensor lives on the CPU. In-process checks of small scripts through ``run_check``; the CUDA
fixtures (fixtures/cuda/, fixtures/ddp/*cuda*) hold the findings, tests/test_fixtures.py and
tests/test_distributed.py run them."""

from __future__ import annotations

import glob
import os
import re
import textwrap

import pytest
import torch

import graddoctor
from conftest import ROOT
from graddoctor.errors import ScriptError
from graddoctor.options import CONFIG_KEYS, OPTIONS, CheckOptions
from graddoctor.run import emulate_cuda
from graddoctor.run.session import run_check


def _check(tmp_path, code: str, name: str = "train.py", **options):
    script = tmp_path / name
    script.write_text(textwrap.dedent(code))
    options.setdefault("emulate_cuda", True)
    return run_check(CheckOptions(target=str(script), **options))


LOOP = textwrap.dedent("""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        loss = model(torch.randn(4, 3, device="cuda")).pow(2).mean()
        loss.backward()
        opt.step()
""")


def test_the_fake_gpu_answers_and_says_so(tmp_path, capsys):
    report = _check(tmp_path, textwrap.dedent("""
        import torch
        assert torch.cuda.is_available()
        print("count", torch.cuda.device_count(), "current", torch.cuda.current_device())
        torch.cuda.set_device(0)
        print("name", torch.cuda.get_device_name(0))
        print("cap", torch.cuda.get_device_capability(), torch.cuda.is_bf16_supported())
        print("mem", torch.cuda.memory_allocated(), torch.cuda.max_memory_reserved())
        torch.cuda.empty_cache(); torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        torch.cuda.manual_seed(1); torch.cuda.manual_seed_all(1)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            pass
        torch.cuda.current_stream().wait_stream(s)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); b.record(); b.synchronize()
        print("ms", a.elapsed_time(b) >= 0)
        model = torch.nn.Linear(3, 1).cuda()
    """) + LOOP)
    out = capsys.readouterr().out
    assert "count 1 current 0" in out
    assert f"name {emulate_cuda.DEVICE_NAME}" in out
    assert "cap (8, 0) True" in out and "mem 0 0" in out and "ms True" in out
    assert report.run.status == "completed", report.run
    assert report.run.device == "cuda (emulated on cpu)"
    note = report.run.notes[0]
    assert note.startswith("CUDA was emulated (--emulate-cuda)")
    for said in ("is_available() -> True", "device_count() -> 1", "get_device_name() ->",
                 "set_device(0)", "memory_allocated() -> 0", "manual_seed_all() -> accepted"):
        assert said in note, said


def test_every_patch_is_undone_after_the_run(tmp_path):
    before = (torch.cuda.is_available, torch.cuda.device_count, torch.Generator, torch.load,
              torch.is_autocast_enabled, torch.get_autocast_dtype,
              torch.amp.autocast_mode.autocast.__init__, torch.distributed.init_process_group,
              torch.nn.parallel.DistributedDataParallel.__init__)
    _check(tmp_path, "import torch\nmodel = torch.nn.Linear(3, 1).cuda()\n" + LOOP)
    after = (torch.cuda.is_available, torch.cuda.device_count, torch.Generator, torch.load,
             torch.is_autocast_enabled, torch.get_autocast_dtype,
             torch.amp.autocast_mode.autocast.__init__, torch.distributed.init_process_group,
             torch.nn.parallel.DistributedDataParallel.__init__)
    assert before == after
    assert not torch.cuda.is_available()
    assert not torch.overrides._get_current_function_mode_stack()
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1).cuda()


def test_moves_copy_like_a_gpu_and_every_device_spelling_lands_on_the_cpu():
    with emulate_cuda.CudaEmulation(gpus=2):
        leaf = torch.ones(2, requires_grad=True)
        moved = leaf.cuda()
        assert not moved.is_leaf and moved.grad_fn is not None  # a copy, as on a GPU
        assert moved.cuda() is moved and moved.to("cuda") is moved  # already there: itself
        x = torch.arange(3.0)
        y = x.to("cuda:1", non_blocking=True)
        y.add_(1)
        assert x.tolist() == [0.0, 1.0, 2.0]  # the host tensor is not aliased
        assert y.cpu() is not y and y.to("cpu").tolist() == [1.0, 2.0, 3.0]
        for device in ("cuda", "cuda:1", torch.device("cuda"), torch.device("cuda", 1), 0):
            assert torch.zeros(2, device=device).device.type == "cpu"
            assert x.to(device).device.type == "cpu"
        assert torch.empty(2, pin_memory=True).device.type == "cpu"
        assert x.pin_memory() is x
        assert torch.Generator(device="cuda").device.type == "cpu"
        assert isinstance(torch.Generator(), torch.Generator)
        model = torch.nn.Linear(2, 2)
        weight = model.weight
        model.cuda()
        assert model.weight is weight and weight.is_leaf  # moved in place, as Module.cuda does
        for device in (0, 1):  # a bare index, as `model.to(gpu_id)` passes: a CUDA device
            assert model.to(device) is model and model.weight is weight
            assert torch.nn.Linear(2, 1).to(device=device).weight.device.type == "cpu"
        assert weight.cuda() is weight  # a parameter on the emulated GPU stays itself
        assert torch.cuda.device_count() == 2
        torch.set_default_device("cuda")
        try:
            assert torch.zeros(1).device.type == "cpu"
        finally:
            torch.set_default_device(None)
        with torch.device("cuda", 1):
            assert torch.ones(1).device.type == "cpu"
        parallel = torch.nn.DataParallel(torch.nn.Linear(2, 1).cuda(), device_ids=[0, 1])
        assert parallel(torch.randn(3, 2).cuda()).shape == (3, 1)


def test_graddoctors_own_call_of_a_saved_original_does_not_reach_its_wrapper():
    """Torch looks a Tensor method's name up again when it dispatches to the device mode: a
    watcher's call of the saved ``register_hook`` must not run the wrapper graddoctor installed
    over it (the dependency probe would take it for the script's hook and turn itself off)."""
    from graddoctor.instrument.patcher import Patcher

    calls = []
    original = torch.Tensor.register_hook

    def wrapper(tensor, *args, **kwargs):
        calls.append(1)
        return original(tensor, *args, **kwargs)

    with emulate_cuda.CudaEmulation() as emulation:
        patcher = Patcher()
        patcher.patch(torch.Tensor, "register_hook", wrapper)
        try:
            emulation.watch_originals(patcher.originals())
            x = torch.ones(2, requires_grad=True) * 2
            original(x, lambda grad: None)
            assert calls == []
            x.register_hook(lambda grad: None)
            assert calls == [1]
        finally:
            patcher.undo()


def test_a_dependency_bug_of_a_gpu_script_is_found_emulated(tmp_path):
    report = _check(tmp_path, """
        import torch
        from torch import nn
        torch.manual_seed(0)

        class Pool(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed, self.score, self.out = nn.Linear(5, 8), nn.Linear(8, 1), nn.Linear(8, 3)

            def forward(self, x):
                h = self.embed(x)
                a = torch.softmax(self.score(h).squeeze(-1), dim=0)
                return self.out((a.unsqueeze(-1) * h).sum(dim=1))

        model = Pool().cuda()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        scaler = torch.cuda.amp.GradScaler()
        for _ in range(4):
            x, y = torch.randn(8, 4, 5).cuda(), torch.randint(0, 3, (8,)).cuda()
            opt.zero_grad()
            with torch.cuda.amp.autocast():
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    """)
    assert [(f.rule, f.location.line) for f in report.findings] == [("samples-mixed-in-batch", 13)]


def test_torch_compile_is_told_the_truth_the_script_is_not():
    """torch.compile builds for the devices the tensors are on: its own questions about CUDA
    get the real answers (a CUDA build would compile Triton kernels for CPU tensors)."""
    asked_by = {}
    for module in ("torch._dynamo.variables.streams", "torch._inductor.utils", "__main__"):
        scope = {"__name__": module, "torch": torch}
        exec("def ask():\n    return torch.cuda.is_available(), torch.accelerator.is_available()",
             scope)
        asked_by[module] = scope["ask"]
    with emulate_cuda.CudaEmulation() as emulation:
        answers = {module: ask() for module, ask in asked_by.items()}
    truth = (torch.cuda.is_available(), torch.accelerator.is_available())
    assert answers["__main__"] == (True, True)
    assert answers["torch._dynamo.variables.streams"] == answers["torch._inductor.utils"] == truth
    assert emulation.answers == {"is_available()": "True"}  # the script's question only


def test_autocast_cuda_runs_as_cpu_autocast_in_the_dtype_asked():
    with emulate_cuda.CudaEmulation():
        with torch.autocast("cuda", dtype=torch.float16):
            assert torch.is_autocast_enabled("cpu")
            assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.float16
        with torch.cuda.amp.autocast(dtype=torch.bfloat16):
            assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.bfloat16
        scaler = torch.amp.GradScaler("cuda")
        assert scaler.is_enabled() and scaler.get_scale() == 65536.0
        assert torch.cuda.amp.GradScaler().is_enabled()


def test_a_custom_function_for_cuda_autocast_runs_its_backward_in_the_forwards_dtype():
    # custom_fwd/custom_bwd(device_type="cuda") ask torch for CUDA's autocast state: answered as
    # the CPU autocast standing in for it, the backward casts as on a GPU instead of stopping on
    # fp16 gradients against fp32 saved tensors
    class MyMM(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="cuda")
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a.mm(b)

        @staticmethod
        @torch.amp.custom_bwd(device_type="cuda")
        def backward(ctx, grad):
            a, b = ctx.saved_tensors
            return grad.mm(b.t()), a.t().mm(grad)

    with emulate_cuda.CudaEmulation():
        assert not torch.is_autocast_enabled("cuda")
        a = torch.randn(4, 3).cuda()
        b = torch.randn(3, 2, requires_grad=True)
        with torch.autocast("cuda", dtype=torch.float16):
            assert torch.is_autocast_enabled("cuda") and torch.is_autocast_enabled()
            assert torch.get_autocast_dtype("cuda") == torch.float16
            out = MyMM.apply(a, b)
        assert out.dtype == torch.float16
        out.float().sum().backward()
        assert b.grad is not None and b.grad.dtype == torch.float32

        class FP32MM(MyMM):
            forward = staticmethod(torch.amp.custom_fwd(MyMM.forward.__wrapped__, device_type="cuda",
                                                        cast_inputs=torch.float32))

        with torch.autocast("cuda", dtype=torch.float16):
            half = torch.nn.functional.linear(a, torch.randn(3, 3))  # fp16 under autocast
            assert FP32MM.apply(half, b).dtype == torch.float32  # cast back, run without autocast
    assert not torch.is_autocast_enabled("cuda")


def test_a_dtype_cpu_autocast_lacks_falls_back_to_bf16_with_a_note(monkeypatch):
    monkeypatch.setattr(emulate_cuda, "_cpu_autocast_dtypes", lambda: {torch.bfloat16})
    emulation = emulate_cuda.CudaEmulation()
    with emulation:
        with torch.autocast("cuda"):  # CUDA's default dtype, float16
            assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.bfloat16
    assert any("ran as CPU autocast in bfloat16" in n for n in emulation.notes())


def test_nccl_becomes_gloo_and_ddp_takes_device_ids(tmp_path):
    report = _check(tmp_path, textwrap.dedent("""
        import socket, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1, device_id=torch.device("cuda", 0))
        assert dist.get_backend() == "gloo"
        model = DDP(torch.nn.Linear(3, 1).cuda(), device_ids=[0], output_device=0)
    """) + LOOP + "dist.destroy_process_group()\n")
    assert report.run.status == "completed", report.run.error
    assert "init_process_group('nccl') -> gloo" in report.run.notes[0]
    assert "DistributedDataParallel(device_ids=[0], output_device=0) -> dropped" in \
        report.run.notes[0]


def test_a_bug_only_the_gpu_path_has_is_missed_on_the_cpu_path_and_found_emulated(monkeypatch):
    monkeypatch.chdir(os.path.join(ROOT, "fixtures", "cuda"))
    found = {}
    for emulate in (False, True):
        report = run_check(CheckOptions(target="bad_cuda_gpu_path_differs.py",
                                        emulate_cuda=emulate))
        found[emulate] = [(f.rule, f.location.line) for f in report.findings]
    assert found == {False: [], True: [("step-bypasses-scaler", 24)]}


def test_what_cannot_be_emulated_names_the_call_and_the_line(tmp_path):
    report = _check(tmp_path, """
        import torch
        model = torch.nn.Linear(3, 1).cuda()
        graph = torch.cuda.CUDAGraph()
    """)
    error = report.run.error
    assert error["location"]["line"] == 4
    assert error["message"].startswith("--emulate-cuda cannot emulate `graph = "
                                       "torch.cuda.CUDAGraph()`")
    assert re.search(r"train\.py:4: it needs a real GPU", error["message"])
    report = _check(tmp_path, "import torch\nimport triton.language as tl\n", name="kernels.py")
    assert report.run.error["message"].startswith(
        "--emulate-cuda cannot emulate Triton kernels: the script imports or calls triton at ")


def test_the_scripts_own_error_is_left_as_it_is(tmp_path):
    report = _check(tmp_path, "import torch\nraise ValueError('bad config')\n")
    assert report.run.error["message"] == "bad config"
    report = _check(tmp_path, "import torch\nraise RuntimeError('no CUDA in this config')\n")
    assert report.run.error["message"] == "no CUDA in this config"


@pytest.mark.parametrize("code", [
    "import torch\nassert torch.cuda.is_available()\n",
    "import torch\nx = torch.zeros(2).cuda()\n",
    "import torch\ntorch.cuda.set_device(0)\n",  # a CUDA binding the CPU build lacks
    "import torch\nif not torch.cuda.is_available():\n    raise SystemExit('CUDA required')\n",
    # the device chosen by is_available(), then pinned memory: no accelerator to pin for
    "import torch\ndevice = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
    "x = torch.zeros(2).pin_memory().to(device, non_blocking=True)\n",
])
def test_without_the_flag_a_script_that_needs_a_gpu_is_run_again_on_an_emulated_one(tmp_path, code):
    report = _check(tmp_path, code, emulate_cuda=False)
    assert report.run.status == "no-training-loop" and not report.run.error
    assert report.run.device.startswith("cuda")
    assert "for want of a GPU" in report.run.notes[0] and "ran it again" in report.run.notes[0]
    # --device cpu asks for the CPU path: the failure stands, with the hint
    report = _check(tmp_path, code, emulate_cuda=False, device="cpu")
    assert report.run.error and not report.run.device.startswith("cuda")
    assert any("`graddoctor check --emulate-cuda`" in n for n in report.run.notes), report.run.notes


def test_a_lightning_script_asking_for_a_cuda_accelerator_is_run_again_emulated(tmp_path):
    pytest.importorskip("lightning")
    code = "import lightning as L\nfabric = L.Fabric(accelerator='cuda', devices=1)\n"
    report = _check(tmp_path, code, emulate_cuda=False)
    assert report.run.device.startswith("cuda") and not report.run.error, report.run.error
    assert "for want of a GPU" in report.run.notes[0]


def test_a_gpu_script_run_again_emulated_is_checked_and_its_first_crash_noted(tmp_path, capsys):
    report = _check(tmp_path, """
        import torch
        print("starting")
        assert torch.cuda.is_available(), "this script needs a GPU"
        model = torch.nn.Linear(3, 1).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            loss = model(torch.randn(4, 3, device="cuda")).pow(2).mean()
            loss.backward()  # no zero_grad: missing-zero-grad on the GPU path
            opt.step()
    """, emulate_cuda=False)
    assert report.run.status == "completed" and report.run.steps == 3
    assert [f.rule for f in report.findings] == ["missing-zero-grad"]
    assert report.run.notes[0].startswith("the script stopped at ") and \
        "(AssertionError: this script needs a GPU)" in report.run.notes[0]
    assert capsys.readouterr().out.count("starting") == 2  # each run printed what it prints


def test_a_process_group_the_first_run_initialised_is_destroyed_before_the_second(tmp_path):
    # a one-process gloo group at the script's top (DINO-style code adapted to one CPU) and a
    # .cuda() below: the emulated second run initialises its group again instead of crashing
    report = _check(tmp_path, """
        import os, torch, torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("gloo", rank=0, world_size=1)
        model = torch.nn.Linear(3, 1).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 3, device="cuda")).pow(2).mean().backward()
            opt.step()
        dist.destroy_process_group()
    """, emulate_cuda=False)
    assert report.run.status == "completed" and report.run.steps == 3, report.run.error
    assert "ran it again" in report.run.notes[0]
    assert not torch.distributed.is_initialized()


def test_a_script_that_trained_before_it_failed_is_not_run_again(tmp_path):
    report = _check(tmp_path, """
        import torch
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(4, 3)).pow(2).mean().backward()
            opt.step()
        torch.zeros(1).cuda()
    """, emulate_cuda=False)
    assert report.run.status == "crashed" and report.run.steps == 2
    assert report.run.device == "cpu" and not any("ran it again" in n for n in report.run.notes)


def test_a_script_that_fails_for_another_reason_gets_no_hint(tmp_path):
    report = _check(tmp_path, "import torch\nassert 1 == 2\n", emulate_cuda=False)
    assert not any("--emulate-cuda" in n for n in report.run.notes)


def test_outside_the_emulated_device_the_run_is_as_under_python(tmp_path, capsys):
    code = """
        import torch
        torch.manual_seed(3)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            loss = model(torch.randn(4, 3)).pow(2).mean()
            loss.backward()
            opt.step()
        print("rng", torch.rand(1).item(), "w", model.weight.sum().item())
        open("out.txt", "w").write(repr(torch.randn(2).tolist()))
    """
    outputs = []
    for emulate in (False, True):
        folder = tmp_path / str(emulate)
        folder.mkdir()
        os.chdir(folder)
        try:
            report = _check(folder, code, emulate_cuda=emulate)
        finally:
            os.chdir(ROOT)
        assert report.run.status == "completed"
        outputs.append((capsys.readouterr().out, (folder / "out.txt").read_text(),
                        [(f.rule, f.location.line) for f in report.findings]))
    assert outputs[0] == outputs[1]


def test_the_option_reaches_every_door(tmp_path):
    option = OPTIONS["emulate_cuda"]
    assert option.flag == "--emulate-cuda" and CONFIG_KEYS["emulate-cuda"] is option
    (tmp_path / "pyproject.toml").write_text("[tool.graddoctor]\nemulate-cuda = true\n")
    script = tmp_path / "train.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(3, 1).cuda()\n" + LOOP)
    report = graddoctor.check_script(script)  # from [tool.graddoctor]
    assert report.run.device == "cuda (emulated on cpu)" and report.run.status == "completed"
    report = graddoctor.check_script(script, emulate_cuda=False)  # over the config's true:
    assert "ran it again" in report.run.notes[0]  # the first run had no GPU and stopped
    report = graddoctor.check_script(script, emulate_cuda=False, device="cpu")
    assert report.run.status == "crashed"
    with graddoctor.watch(emulate_cuda=True) as w:
        assert torch.cuda.is_available()
    assert w.report.run.device.startswith("cuda (emulated")
    with pytest.raises(ScriptError, match="cannot be combined with --device cpu"):
        run_check(CheckOptions(target=str(script), emulate_cuda=True, device="cpu"))


def test_the_pytest_plugin_takes_the_option(pytester):
    with graddoctor.watch(emulate_cuda=True):  # what the checked tests import, imported first
        pass
    pytester.makepyfile(test_gpu="""
        import pytest, torch

        @pytest.mark.graddoctor(emulate_cuda=True)
        def test_marked():
            assert torch.cuda.is_available()
            model = torch.nn.Linear(3, 1).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            model(torch.randn(2, 3).cuda()).sum().backward()
            opt.step()

        def test_everywhere():
            assert torch.cuda.is_available()
    """)
    from test_pytest_plugin import PLUGIN

    result = pytester.runpytest_inprocess(*PLUGIN, "--graddoctor", "--graddoctor-emulate-cuda")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.assert_outcomes(passed=2)


# -- the examples, rewritten for a GPU ---------------------------------------------------------

def cuda_version(text: str) -> str:
    """An example rewritten as a GPU script would be written, line for line (so that findings
    keep their lines): models and batches moved with ``.cuda()``, an AMP GradScaler on cuda
    around the backward and the step."""
    lines = text.splitlines()
    out, rewrites = [], 0
    loop_vars = None
    for line in lines:
        stripped = line.strip()
        module = re.match(r"^(\w+) = (nn\.\w+\(.*\))$", line)
        if module:
            line, rewrites = f"{module.group(1)} = {module.group(2)}.cuda()", rewrites + 1
        elif re.match(r"^optimizer = .*\)$", line):
            line, rewrites = line + "; scaler = torch.amp.GradScaler(\"cuda\")", rewrites + 1
        elif loop_vars is not None and stripped and not stripped.startswith("#"):
            indent = line[:len(line) - len(line.lstrip())]
            moved = ", ".join(f"{v}.cuda(non_blocking=True)" for v in loop_vars)
            line = f"{indent}{', '.join(loop_vars)} = {moved}; {stripped}"
            loop_vars, rewrites = None, rewrites + 1
        elif re.match(r"^\s*(\w+)\.backward\(\)$", line):
            line, rewrites = re.sub(r"(\w+)\.backward\(\)", r"scaler.scale(\1).backward()", line), \
                rewrites + 1
        elif re.match(r"^\s*optimizer\.step\(\)$", line):
            line = line.replace("optimizer.step()", "scaler.step(optimizer); scaler.update()")
            rewrites += 1
        loop = re.match(r"^\s*for ([\w, ]+) in \w*loader\w*:$", line)
        if loop:
            loop_vars = [v.strip() for v in loop.group(1).split(",")]
        out.append(line)
    assert rewrites >= 4, "the example no longer looks like a GPU script once rewritten"
    return "\n".join(out) + "\n"


EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.py")))


@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_examples_rewritten_for_cuda_get_the_findings_of_the_cpu_originals(path, tmp_path,
                                                                        monkeypatch):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    gpu = cuda_version(text)
    assert ".cuda()" in gpu and 'GradScaler("cuda")' in gpu
    (tmp_path / "cpu").mkdir()
    (tmp_path / "gpu").mkdir()
    (tmp_path / "cpu" / "train.py").write_text(text)
    (tmp_path / "gpu" / "train.py").write_text(gpu)
    found = {}
    for name, emulate in (("cpu", False), ("gpu", True)):
        monkeypatch.chdir(tmp_path / name)
        report = run_check(CheckOptions(target="train.py", emulate_cuda=emulate))
        assert report.run.status in ("completed", "step-limit"), report.run.error
        assert not report.internal_errors, report.internal_errors
        found[name] = sorted((f.rule, f.severity.value, f.location.line) for f in report.findings)
    assert found["gpu"] == found["cpu"] and found["cpu"]
