"""GD2xx through the real CLI: severities and evidence in the JSON, --epoch-batches, strict JSON."""

from __future__ import annotations

import json
import os

from conftest import FIXTURES, run_cli

HERE = os.path.join(FIXTURES, "amp_clip_accum")


def strict_json(text: str):
    def reject(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=reject)


def check(name: str, *args: str) -> dict:
    result = run_cli("check", name, "--format", "json", "--fail-on", "never", *args, cwd=HERE)
    assert result.returncode == 0, result.stderr[-3000:]
    return strict_json(result.stdout)


def findings(report: dict, slug: str) -> list[dict]:
    return [f for f in report["findings"] if f["rule"] == slug]


def test_tail_made_only_by_the_replays_cut_is_silent():
    # 32-batch epochs, k = 4: the 17-batch replay leaves a tail the real run does not have
    report = check("good_accumulation_divisible_real_epoch.py")
    assert findings(report, "accumulation-leftover") == []
    assert any("17 of their 32" in note for note in report["run"]["notes"])


def test_leftover_with_real_epochs():
    report = check("bad_accumulation_leftover.py", "--epoch-batches", "0")
    [f] = findings(report, "accumulation-leftover")
    assert f["severity"] == "warning" and f["location"]["line"] == 19
    assert (f["evidence"]["real_len"], f["evidence"]["replay_len"]) == (25, 25)
    assert report["run"]["notes"] == []


def test_clip_before_unscale_evidence_carries_the_scale():
    [f] = findings(check("bad_clip_before_unscale.py"), "clip-before-unscale")
    assert f["evidence"]["scale"] == 65536.0 and f["evidence"]["scaler_enabled"] is True
    [f] = findings(check("bad_clip_before_unscale_cuda_scaler.py"), "clip-before-unscale")
    assert f["evidence"]["scaler_enabled"] is False and "disabled" in f["message"]


def test_nan_gradients_stay_standard_json(tmp_path):
    trace = tmp_path / "trace.jsonl"
    report = check("bad_nonfinite_grad.py", "--trace", str(trace))
    [f] = findings(report, "nonfinite-grad")
    assert set(f["evidence"]["norms"].values()) == {"nan"}
    for line in trace.read_text().splitlines():
        strict_json(line)
