"""schedule-factor-is-lr (GD132): hand-written traces over a script written to a temporary
folder (the rule reads the lr_lambda from the source), and the source helper."""

from __future__ import annotations

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.analysis.source import factor_mentions
from graddoctor.findings import Severity
from graddoctor.rules import find_rule
from graddoctor.trace import TraceBuilder
from rule_traces import P

SLUG = "schedule-factor-is-lr"


def _check(tmp_path, script: str, base=1e-2, lrs=None, cls="LambdaLR", opt_line=2, sched_line=3,
           steps=()):
    (tmp_path / "train.py").write_text(script)
    t = TraceBuilder()
    t._params(P)
    t.put(ev.optimizer_init(opt=0, cls="SGD", params=list(P), lrs=[base]), opt_line)
    t.put(ev.scheduler_init(sched=0, cls=cls, opt=0, args={}, children=[], base_lrs=[base],
                            lrs=[base * base] if lrs is None else lrs), sched_line)
    for after in steps:
        t.backward(fresh=P, line=5)
        t.step(line=5)
        t.put(ev.scheduler_step(sched=0, cls=cls, opt=0, lrs=[after], metric="none", grad=True), 5)
    return list(find_rule(SLUG)().check(Analysis(t.trace, base_dir=str(tmp_path))))


SCRIPT = ("lr = 1e-2\n"
          "opt = torch.optim.SGD(model.parameters(), lr=lr)\n"
          "sched = LambdaLR(opt, {fn})\n")


def test_a_lambda_that_multiplies_the_optimizers_lr_is_a_warning(tmp_path):
    found = _check(tmp_path, SCRIPT.format(fn="lambda s: lr * 0.99 ** s"), steps=[0.99e-4])
    assert len(found) == 1 and found[0].severity is Severity.WARNING
    assert found[0].location.line == 3 and "100× too small" in found[0].message


def test_silent_on_factors(tmp_path):
    assert _check(tmp_path, SCRIPT.format(fn="lambda s: 0.99 ** s"), lrs=[1e-2]) == []
    # a warm-up whose first factor equals the lr by chance: the numbers alone are not judged
    assert _check(tmp_path, SCRIPT.format(fn="lambda s: min(1.0, (s + 1) / 100)"), lrs=[1e-4]) == []
    # divided by the lr: a factor again, above the lr
    assert _check(tmp_path, SCRIPT.format(fn="lambda s: sched_lr(s) / lr"), lrs=[1.0]) == []
    # the lambda names the lr, but a factor it returned went above it
    assert _check(tmp_path, SCRIPT.format(fn="lambda s: lr * 100"), lrs=[1e-2]) == []
    # an optimizer built with lr=1.0 takes the lambda's value as the lr
    assert _check(tmp_path, SCRIPT.format(fn="lambda s: lr * 0.99 ** s"), base=1.0, lrs=[1e-2]) == []


def test_multiplicative_lr_returning_the_lr(tmp_path):
    script = SCRIPT.format(fn="lambda s: lr").replace("LambdaLR", "MultiplicativeLR")
    found = _check(tmp_path, script, cls="MultiplicativeLR", lrs=[1e-2], steps=[1e-4, 1e-6])
    assert len(found) == 1 and "collapses" in found[0].message
    script = SCRIPT.format(fn="lambda s: 0.95").replace("LambdaLR", "MultiplicativeLR")
    assert _check(tmp_path, script, cls="MultiplicativeLR", lrs=[1e-2], steps=[0.95e-2]) == []


def test_the_source_helper_reads_lambdas_functions_and_numbers(tmp_path):
    path = tmp_path / "s.py"
    path.write_text("def f(step):\n    return cfg.lr * 0.5 ** step\n"
                    "s1 = LambdaLR(opt, lr_lambda=f)\n"
                    "s2 = LambdaLR(opt, lambda e: 3e-4 * e)\n"
                    "s3 = LambdaLR(opt, [lambda e: 1.0, lambda e: cfg.lr])\n")
    assert factor_mentions(str(path), 3, "LambdaLR", "cfg.lr", 1e-3) == "f"
    assert factor_mentions(str(path), 3, "LambdaLR", "lr", 1e-3) is None
    assert factor_mentions(str(path), 4, "LambdaLR", None, 3e-4) is not None
    assert factor_mentions(str(path), 4, "LambdaLR", None, 1e-3) is None
    assert factor_mentions(str(path), 5, "LambdaLR", "cfg.lr", 0.1) is not None
