"""Fix edits (``Finding.autofix``): every bad fixture's fixable findings, fixed and checked
again in-process (``run_check``): the finding is gone, nothing new appeared, the fixed file
compiles, and the diff changes only the lines the edits name. The good fixtures get no edit
(tests/test_fixtures.py holds that, on the run it already makes). Then the machinery:
applying and diffing edits, verification verdicts, ``--diff``/``--fix`` and the wire formats."""

from __future__ import annotations

import dataclasses
import difflib
import glob
import importlib.util
import json
import os

import pytest

from conftest import FIXTURES, run_cli
from fixture_marks import read_marks
from fixture_runs import check_fixture
from test_fixtures import frameworks_needed, options_for, reset_accelerate_state
from graddoctor.edits import apply_edits, fixable, line_map, unified_diff
from graddoctor.findings import (INTRODUCED, NOT_FIXED, VERIFIED, Autofix, Edit, Finding, Safety,
                                 Severity)
from graddoctor.report.json_format import finding_from_dict, finding_to_dict
from graddoctor.rules import ALL_RULES
from graddoctor.run import fixes
from graddoctor.run.session import run_check

FIXABLE = {r.slug for r in ALL_RULES if r.fix_safety is not None}
DDP = os.path.join(FIXTURES, "ddp")


def _marked(path: str) -> bool:
    expectations, _ = read_marks(path)
    return any(slug.split("(")[0] in FIXABLE for e in expectations for slug, _ in e.alternatives)


BAD = sorted(p for p in glob.glob(os.path.join(FIXTURES, "**", "bad_*.py"), recursive=True)
             if not p.startswith(DDP + os.sep) and _marked(p))

# findings of these fixtures get no edit, and say why or are left to a person:
NO_EDIT = {
    # which optimizer of which phase should own the left-out head, at which lr, is a person's call
    "bad_lightning_second_fit_head_left_out.py", "bad_head_left_out_after_pretraining.py",
    "bad_param_not_in_optimizer_phase_reuses_optimizer.py",
    # which name is the row grid is read from the source; renaming the script's grids is a person's call
    "bad_meshgrid_axes_swapped_point_centres.py", "bad_meshgrid_axes_swapped_numpy_heatmap.py",
    # which comparison keeps the confident rows is read from the source; the flip is a person's
    "bad_confidence_mask_inverted_self_training.py", "bad_confidence_mask_inverted_indexed.py",
    # which side the temperature belongs on is the script's: the finding names both
    "bad_distillation_temperature_one_sided_kldiv_module.py",
    "bad_distillation_temperature_one_sided_soft_ce.py",
    # which target each view's prediction was meant for is the method's: the fix shows the crossing
    "bad_views_paired_with_themselves_byol.py", "bad_views_paired_with_themselves_detached_inline.py",
    # Lightning / the Trainer drive the calls: the finding says why it offers no edit
    "bad_lightning_eval_in_epoch_hook.py", "bad_lightning_frozen_bn.py",
"bad_lightning_manual_gan_leak.py",
    "bad_lightning_zero_grad_override.py", "bad_transformers_accumulation_classifier.py",
    "bad_transformers_accumulation_no_clip.py", "bad_transformers_compute_loss_func.py",
    "bad_transformers_compute_loss_override.py", "bad_transformers_frozen_bn.py",
    # the layers are trained by no optimizer: adding them to it may be the fix, not eval()
    "bad_frozen_bn_head_only_optimizer.py",
    # a generator's loss leaks through an undetached discriminator: detach or clear, a choice
    "bad_optimizer_never_steps_gan.py",  # where the missing step goes is a person's call
    # a loss multiplied by the window: the factor on its own line is the one to replace
    "bad_accumulation_loss_multiplied.py",
    "bad_gan_discriminator_leak.py", "bad_gan_generator_leak_clear_after_step.py",
    # parameters left out of the optimizer: which optimizer owns them, at which lr, is a choice
    "bad_lightning_param_not_in_optimizer.py", "bad_learnable_scalar_left_out.py",
    "bad_optimizer_switch_drops_criterion_params.py", "bad_param_not_in_optimizer_head.py",
    "bad_param_not_in_optimizer_loss_param.py", "bad_param_not_in_optimizer_clamped_temperature.py",
    # the trainable list built in its own statement and unfrozen later: add a param group at
    # the unfreeze or build over every parameter, a person's call
    "bad_param_not_in_optimizer_unfrozen_third_epoch.py",
    # an optimizer built over the model's copy: which expression names the model is a person's
    "bad_param_not_in_optimizer_ema_copy.py", "bad_param_not_in_optimizer_frozen_target_copy.py",
    # a loss scale written by hand clipped before its division: the GradScaler edit does not
    # apply, and moving the script's own div_ before the clip is a person's edit
    "bad_clip_before_unscale_hand_scale.py",
    # a layer built in forward: moving it into __init__ names it and changes forward
    "bad_layer_built_in_forward.py", "bad_layers_built_in_forward_of_stacked_blocks.py",
    # eval() on a part that still trains: freeze it or let it train, the finding gives both
    "bad_train_in_eval_submodule_half_frozen.py", "bad_eval_used_to_freeze_encoder.py",
    # eval() with a freeze of everything, a part unfrozen after: model.train() would also wake
    # the part that stays frozen; the edit belongs after the unfreeze, on the right part
    "bad_train_in_eval_unfrozen_after_eval.py", "bad_lightning_freeze_then_unfreeze_head.py",
    # a layer built after the optimizer: move it before, or add it to the optimizer, a choice
    "bad_param_not_in_optimizer_layer_attached_after.py", "bad_lightning_head_built_on_train_start.py",
    # one window's micro-batches backpropagated at two lines: each loss needs the division
    "bad_accumulation_split_between_branches_undivided.py",
    # scheduler.learning_rate on a LambdaLR: base_lrs, the groups or a new scheduler, a choice
    "bad_scheduler_learning_rate_attribute.py",
    # a part unfrozen after the optimizer was built over the trainable ones: add_param_group at
    # the unfreeze (at which lr?) or an optimizer over every parameter, a choice
    "bad_param_not_in_optimizer_unfrozen_later.py", "bad_param_not_in_optimizer_unfrozen_in_function.py",
    # a parameter list taken before the model changed: take it after, or list the new part, a choice
    "bad_param_not_in_optimizer_list_taken_early.py",
    # an optimizer built over another optimizer's parameters: whose parameters it was meant for,
    # at which lr, is a person's call
    "bad_param_not_in_optimizer_twin_actor_critic.py",
    # an eval() undone by a train() after the training forward: move the train() before the
    # forward, or drop the eval(), depends on what the eval() was for
    "bad_eval_undone_after_training_forward.py",
    # a model meant to stay fixed under a soft prompt but handed to the optimizer: whether to
    # take it out of the optimizer or train it in train mode is a person's call
    "bad_train_in_eval_prompt_and_model_tuned.py",
}


def _run(path, monkeypatch, target=None):
    for name in frameworks_needed(path):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed")
    if frameworks_needed(path):
        reset_accelerate_state()
    _, extra = read_marks(path)
    monkeypatch.chdir(os.path.dirname(path))
    options = options_for(target or os.path.basename(path), extra)
    if target is None:  # the fixture itself: the run its test_fixture test made, if kept
        return check_fixture(path, options), options
    return run_check(options), options


def _key(f: Finding, line_of=lambda line: line):
    return (f.rule, f.location.line and line_of(f.location.line)) if f.location else (f.rule, None)


@pytest.mark.parametrize("path", BAD, ids=lambda p: os.path.relpath(p, FIXTURES))
def test_fix_removes_the_finding(path, monkeypatch):
    name = os.path.basename(path)
    report, _ = _run(path, monkeypatch)
    fixed = [f for f in report.findings if f.rule in FIXABLE and f.autofix and f.autofix.edits]
    if name in NO_EDIT:
        assert not fixed, [f.autofix for f in fixed]
        for f in report.findings:
            if f.rule in FIXABLE and f.autofix is not None:
                assert f.autofix.refused, f  # an empty fix says why
        return
    assert fixed, f"no edit for {[(f.rule, f.location) for f in report.findings]}"
    chosen = fixable(report.findings, unsafe=True)
    assert chosen == fixed
    with open(path, encoding="utf-8") as fh:
        old = fh.read()
    edits = [e for f in chosen for e in f.autofix.edits]
    assert {e.path for e in edits} == {name}
    new = apply_edits(old, edits)
    compile(new, name, "exec")  # the fixed file still compiles
    # the diff changes no more lines than the edits remove and insert
    budget = 0
    for e in edits:
        if e.col == 0 and e.end_col == 0:  # whole lines
            budget += (e.end_line - e.line) + e.text.count("\n")
        else:  # within lines: each touched line is one removed and one added
            budget += 2 * (e.end_line - e.line + 1) + e.text.count("\n")
    matcher = difflib.SequenceMatcher(a=old.splitlines(), b=new.splitlines(), autojunk=False)
    changed = sum((i2 - i1) + (j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes()
                  if tag != "equal")
    assert changed <= budget, (changed, budget, edits)
    inserted = sum(e.text.count("\n") for e in edits)
    removed = sum(e.end_line - e.line for e in edits)
    assert len(new.splitlines()) - len(old.splitlines()) == inserted - removed
    # re-run the fixed script: each finding gone, nothing new
    copy = os.path.join(os.path.dirname(path), f".fixtest-{os.getpid()}-{name}")
    with open(copy, "w", encoding="utf-8") as fh:
        fh.write(new)
    try:
        after, _ = _run(path, monkeypatch, target=os.path.basename(copy))
    finally:
        os.remove(copy)
    assert after.run.status in ("completed", "step-limit"), after.run
    new_of = line_map(edits, old)
    before = {_key(f, new_of) for f in report.findings}
    now = {_key(f) for f in after.findings}
    for f in chosen:
        assert _key(f, new_of) not in now, f"{f.rule} at line {f.location.line} is still there"
    assert now <= before, f"the fix introduced {now - before}"


def test_every_fixable_rule_has_a_fixed_fixture():
    """Each rule with ``fix_safety`` has a bad fixture whose finding the fix removes."""
    covered = set()
    for path in BAD:
        if os.path.basename(path) in NO_EDIT:
            continue
        expectations, _ = read_marks(path)
        covered |= {slug.split("(")[0] for e in expectations for slug, _ in e.alternatives}
    assert FIXABLE <= covered, FIXABLE - covered


# -- the pieces ----------------------------------------------------------------------------

def test_apply_edits_insert_replace_delete():
    text = "a\nbb\ncc\n"
    assert apply_edits(text, [Edit("f", 2, 0, 2, 0, "x\n")]) == "a\nx\nbb\ncc\n"
    assert apply_edits(text, [Edit("f", 2, 1, 2, 2, "Z")]) == "a\nbZ\ncc\n"
    assert apply_edits(text, [Edit("f", 2, 0, 3, 0, "")]) == "a\ncc\n"
    assert apply_edits(text, [Edit("f", 2, 0, 3, 0, ""), Edit("f", 4, 0, 4, 0, "bb\n")]) == "a\ncc\nbb\n"


def test_line_map_follows_inserted_and_deleted_lines():
    new_of = line_map([Edit("f", 2, 0, 2, 0, "x\ny\n"), Edit("f", 5, 0, 6, 0, "")])
    assert [new_of(n) for n in (1, 2, 3, 5, 6)] == [1, 4, 5, None, 7]


def test_line_map_follows_a_moved_statement():
    old = "a\nz\nb\nc\n"
    edits = [Edit("f", 2, 0, 3, 0, ""), Edit("f", 4, 0, 4, 0, "  z\n")]
    assert apply_edits(old, edits) == "a\nb\n  z\nc\n"
    new_of = line_map(edits, old)
    assert [new_of(n) for n in (1, 2, 3, 4)] == [1, 3, 2, 4]


def _finding(line, edits, safety=Safety.SAFE, verification=None, suppressed=False):
    return Finding("missing-zero-grad", "GD101", Severity.ERROR, "m", None, suppressed=suppressed,
                   autofix=Autofix("t", safety, tuple(edits), verification=verification))


def test_fixable_keeps_safety_verification_and_drops_overlaps():
    a = _finding(1, [Edit("f", 2, 0, 3, 0, "")])
    b = _finding(2, [Edit("f", 2, 0, 2, 4, "x")])  # overlaps a
    c = _finding(3, [Edit("f", 5, 0, 5, 0, "y\n")], safety=Safety.UNSAFE)
    d = _finding(4, [Edit("f", 7, 0, 7, 0, "y\n")], verification=VERIFIED)
    e = _finding(5, [Edit("f", 9, 0, 9, 0, "y\n")], suppressed=True)
    assert fixable([a, b, c, d, e]) == [a, d]
    assert fixable([a, b, c, d, e], unsafe=True) == [a, c, d]
    assert fixable([a, b, c, d, e], verified_only=True) == [d]


def test_diff_marks_each_hunk():
    text = "".join(f"l{i}\n" for i in range(1, 30))
    new = apply_edits(text, [Edit("f.py", 3, 0, 3, 0, "x\n"), Edit("f.py", 25, 0, 26, 0, "")])
    out = unified_diff("f.py", text, new, [(range(3, 4), "GD101 safe, verified"),
                                           (range(25, 26), "GD104 safe, not verified")])
    hunks = [ln for ln in out.splitlines() if ln.startswith("@@")]
    assert len(hunks) == 2
    assert hunks[0].endswith("GD101 safe, verified") and hunks[1].endswith("GD104 safe, not verified")


def test_autofix_round_trips_through_json():
    f = dataclasses.replace(_finding(1, [Edit("f.py", 2, 0, 2, 0, "x\n")], verification=NOT_FIXED),
                            location=None)
    assert finding_from_dict(json.loads(json.dumps(finding_to_dict(f)))) == f


BASIC = os.path.join(FIXTURES, "zero_grad", "bad_missing_zero_grad_basic.py")
AFTER_BACKWARD = os.path.join(FIXTURES, "zero_grad", "bad_misplaced_zero_grad_after_backward.py")


def test_verify_marks_fixed_and_not_fixed(monkeypatch):
    report, options = _run(BASIC, monkeypatch)
    verified = fixes.verify(report, options)
    assert [f.autofix.verification for f in verified.findings] == [VERIFIED]
    # a fix that does nothing useful is "not fixed"
    useless = dataclasses.replace(report.findings[0], autofix=dataclasses.replace(
        report.findings[0].autofix, edits=(Edit(report.findings[0].location.path, 1, 0, 1, 0, "pass\n"),)))
    verified = fixes.verify(dataclasses.replace(report, findings=[useless]), options)
    assert verified.findings[0].autofix.verification == NOT_FIXED


def test_verify_notices_a_fix_that_introduces_a_finding(monkeypatch):
    report, options = _run(BASIC, monkeypatch)
    f = report.findings[0]
    # clearing between backward and step: the finding goes, a misplaced clear comes
    bad = dataclasses.replace(f, autofix=dataclasses.replace(f.autofix, edits=(
        Edit(f.location.path, 14, 0, 14, 0, "    optimizer.zero_grad()\n"),)))
    verified = fixes.verify(dataclasses.replace(report, findings=[bad]), options)
    assert verified.findings[0].autofix.verification == INTRODUCED
    assert "misplaced-zero-grad" in verified.findings[0].autofix.verification_note


def test_write_refuses_a_file_changed_since_the_check(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(open(BASIC, encoding="utf-8").read())
    monkeypatch.chdir(tmp_path)
    report = run_check(options_for("train.py", []))
    chosen = fixable(report.findings)
    script.write_text(script.read_text() + "# edited meanwhile\n")
    done, skipped = fixes.write(report, chosen)
    assert not done and "changed since the check" in skipped[0]
    assert script.read_text().endswith("# edited meanwhile\n")


def test_cli_diff_and_fix(tmp_path):
    script = tmp_path / "train.py"
    original = open(AFTER_BACKWARD, encoding="utf-8").read()
    script.write_text(original)
    diff = run_cli("check", "train.py", "--diff", cwd=str(tmp_path))
    assert diff.returncode == 1, diff.stderr
    assert "@@" in diff.stdout and "GD104 safe, verified" in diff.stdout
    assert script.read_text() == original  # --diff writes nothing
    fixed = run_cli("check", "train.py", "--fix", cwd=str(tmp_path))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "fixed 1 finding" in fixed.stderr
    again = run_cli("check", "train.py", cwd=str(tmp_path))
    assert again.returncode == 0, again.stdout
    assert not [p for p in os.listdir(tmp_path) if "graddoctor" in p]  # no copy left behind


def test_a_notebook_finding_says_why_it_gets_no_edit():
    from graddoctor.rules.engine import _with_autofix
    from graddoctor.rules.missing_zero_grad import MissingZeroGrad
    from graddoctor.trace import Location

    f = Finding("missing-zero-grad", "GD101", Severity.ERROR, "m", Location("train.ipynb", 12))
    fixed = _with_autofix(MissingZeroGrad(), f, "", None)
    assert not fixed.autofix.edits and "notebook" in fixed.autofix.refused


def test_explain_says_whether_a_rule_has_an_automatic_fix():
    from typer.testing import CliRunner
    from graddoctor.cli import app

    safe = CliRunner().invoke(app, ["explain", "misplaced-zero-grad"], env={"COLUMNS": "200"})
    assert "Automatic fix" in safe.output and "safe (" in safe.output
    unsafe = CliRunner().invoke(app, ["explain", "plateau-every-batch"], env={"COLUMNS": "200"})
    assert "unsafe (" in unsafe.output and "--unsafe-fixes" in unsafe.output
    none = CliRunner().invoke(app, ["explain", "stale-grad"], env={"COLUMNS": "200"})
    assert "Automatic fix" in none.output and "None" in none.output


def _block_text(autofix) -> str:
    from rich.console import Console

    from graddoctor.report.text_findings import finding_block

    f = Finding(rule="misplaced-zero-grad", code="GD104", severity=Severity.ERROR, message="m",
                location=None, autofix=autofix)
    console = Console(width=200, color_system=None, record=True)
    console.print(finding_block(f))
    return console.export_text()


def test_text_report_never_offers_an_edit_its_verification_refuted():
    edit = (Edit("t.py", 1, 0, 1, 0, "x\n"),)
    base = Autofix("move the clear after the step", Safety.SAFE, edits=edit)
    failed = _block_text(dataclasses.replace(base, verification=NOT_FIXED,
                                             verification_note="the fixed script ended crashed: boom"))
    assert "autofix (safe" not in failed
    assert "autofix: none — the edit (move the clear after the step) failed its check" in failed
    assert "crashed: boom" in failed
    introduced = _block_text(dataclasses.replace(base, verification=INTRODUCED,
                                                 verification_note="GD101 missing-zero-grad"))
    assert "autofix (safe" not in introduced and "GD101" in introduced
    assert "autofix (safe, verified): move the clear" in _block_text(
        dataclasses.replace(base, verification=VERIFIED))
    assert "autofix (safe): move the clear" in _block_text(base)  # not verified (no --diff)
