"""On a CUDA machine: the AMP fixtures' patterns with float16 on the GPU give the same verdicts.

    python benchmarks/cuda_check.py          # from the repository root; < 2 minutes

Each AMP fixture of fixtures/amp_clip_accum is rewritten for CUDA without moving a line (so its
``# expect:`` marks still hold): ``torch.set_default_device("cuda")`` is appended to its
``import torch`` line, ``GradScaler("cpu"...)`` becomes ``GradScaler("cuda"...)`` and CPU
autocast becomes ``torch.autocast("cuda", dtype=torch.float16)``. The old
``torch.cuda.amp.GradScaler()`` fixtures pick CUDA themselves, where the scaler is *enabled*.
Every script then runs through the real CLI with ``--device cuda``; the findings must match the
marks exactly as on CPU, and a few CUDA-only facts are checked on top (the scale in the
evidence, steps the scaler skipped). Exit code 0 when everything agrees.

``--dry-run-on-cpu`` runs the same pipeline with CPU float16 (to test this script without a GPU;
the CUDA-only checks are left out).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "fixtures", "amp_clip_accum")
sys.path.insert(0, os.path.join(ROOT, "tests"))

from fixture_marks import compare, read_marks  # noqa: E402

FIXTURES = [
    "bad_clip_before_unscale.py",
    "bad_clip_before_unscale_cuda_scaler.py",
    "bad_unscaled_accumulation_amp.py",
    "good_amp_unscale_clip.py",
    "good_old_cuda_scaler.py",
    "good_amp_skipped_first_steps.py",
    "good_nonfinite_skipped_by_scaler.py",
    "good_amp_accumulation.py",
]


def to_cuda(source: str, device: str = "cuda") -> str:
    lines = source.split("\n")
    for i, line in enumerate(lines):
        if line.strip() == "import torch":
            lines[i] = f'import torch; torch.set_default_device("{device}")'
            break
    else:
        raise AssertionError("no `import torch` line to extend")
    out = "\n".join(lines)
    for cpu, cuda in (('GradScaler("cpu"', f'GradScaler("{device}"'),
                      ('torch.autocast("cpu", dtype=torch.bfloat16)', f'torch.autocast("{device}", dtype=torch.float16)'),
                      ('torch.autocast("cpu", dtype=torch.float16)', f'torch.autocast("{device}", dtype=torch.float16)')):
        out = out.replace(cpu, cuda)
    assert out.count("\n") == source.count("\n")
    return out


def run(path: str, trace: str, device: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, "-m", "graddoctor", "check", os.path.basename(path), "--format", "json",
         "--fail-on", "never", "--device", device, "--trace", trace],
        cwd=os.path.dirname(path), env=env, capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))


def extra_checks(name: str, report: dict, trace_events: list[dict]) -> list[str]:
    problems = []
    if report["run"]["device"] != "cuda":
        problems.append(f"replayed on {report['run']['device']}, not cuda")
    if name.startswith("bad_clip_before_unscale"):
        for f in report["findings"]:
            if f["rule"] == "clip-before-unscale":
                if f["evidence"]["scaler_enabled"] is not True:
                    problems.append("the GradScaler should be enabled on CUDA")
                if not isinstance(f["evidence"]["scale"], float):
                    problems.append("the evidence should carry the scale")
    if name in ("good_amp_skipped_first_steps.py", "good_nonfinite_skipped_by_scaler.py"):
        skipped = sum(1 for e in trace_events if e["kind"] == "step" and e["data"].get("skipped"))
        if not skipped:
            problems.append("expected the GradScaler to skip at least one step on CUDA")
    return problems


def main(argv: list[str]) -> int:
    import torch

    device = "cpu" if "--dry-run-on-cpu" in argv else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("cuda_check: no CUDA device here; nothing to check")
        return 2
    started = time.perf_counter()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in FIXTURES:
            with open(os.path.join(HERE, name), encoding="utf-8") as f:
                source = f.read()
            path = os.path.join(tmp, name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(to_cuda(source, device))
            expectations, extra_args = read_marks(path)
            assert not extra_args, f"{name}: fixture options are not supported here"
            trace = os.path.join(tmp, name + ".jsonl")
            t0 = time.perf_counter()
            report = run(path, trace, device)
            with open(trace, encoding="utf-8") as f:
                events = [json.loads(line) for line in f if line.strip()]
            found = [(f["location"]["line"], f["rule"], f["severity"]) for f in report["findings"]
                     if f["location"] and os.path.basename(f["location"]["path"]) == name]
            problems = compare(expectations, found)
            if device == "cuda":
                problems += extra_checks(name, report, events)
            if report["internal_errors"]:
                problems.append(f"internal errors: {report['internal_errors']}")
            status = "ok" if not problems else "FAIL"
            failures += bool(problems)
            print(f"{status:4} {name:42} {report['run']['steps']:3} steps "
                  f"{time.perf_counter() - t0:5.1f} s  {sorted({r for _, r, _ in found})}")
            for p in problems:
                print(f"       {p}")
    print(f"cuda_check: {len(FIXTURES) - failures}/{len(FIXTURES)} agree "
          f"({time.perf_counter() - started:.0f} s, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0) if device == 'cuda' else 'dry run on cpu'})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
