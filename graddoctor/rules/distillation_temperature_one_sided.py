from __future__ import annotations

from ..analysis.distill_temperature import one_sided_temperatures
from ..findings import Severity
from ..trace import Location
from .base import Rule


class DistillationTemperatureOneSided(Rule):
    """
    ## What it does
    Finds a distillation loss whose temperature divides one side's logits only: a KL divergence
    (`F.kl_div`, `nn.KLDivLoss`, any criterion called on a `log_softmax` and a `softmax`) or a
    soft cross-entropy (`softmax(t) * log_softmax(s)`) where the teacher's logits are divided
    by `T` and the student's are not, or the other way round. Read from the script's source, in
    the files whose backwards ran; the logits may be divided on the line or in one assignment
    before it (`soft_t = teacher_logits / T`). The temperature's value is read where the source
    binds it to a number (a literal, a name assigned one, a default argument).

    ## Why is this bad?
    Hinton's distillation softens both distributions with the same temperature, so that the
    student matches the teacher's relative scores on the wrong classes, and multiplies the loss
    by T² to keep its gradient on the hard loss's scale. With the teacher softened and the
    student not, the student is pulled towards a near-uniform distribution at T = 1: its logits
    shrink by a factor T, its own predictions lose their margin, and the T² factor multiplies a
    gradient that is no longer small. The student ends worse than with plain labels, and nothing
    fails.

    ## Example
    ```python
    soft = F.kl_div(F.log_softmax(student_logits, dim=1),
                    F.softmax(teacher_logits / T, dim=1), reduction="batchmean") * T * T
    ```

    ## Use instead
    ```python
    soft = F.kl_div(F.log_softmax(student_logits / T, dim=1),
                    F.softmax(teacher_logits / T, dim=1), reduction="batchmean") * T * T
    ```

    ## Stays silent on
    Both sides divided by one temperature, or by two (DINO's student and teacher temperatures);
    neither side divided (T = 1, deep mutual learning); a target sharpened by a temperature below
    1 (UDA's and DINO's sharpening of the target alone) or by one whose value the source does
    not give; `log_target=True` KLs of two `log_softmax`s with one temperature.
    """

    code = "GD327"
    slug = "distillation-temperature-one-sided"
    severity = Severity.WARNING
    summary = ("a distillation loss divides one side's logits by the temperature and not the "
               "other's: the student matches a distribution at another temperature")
    fix = "divide both the student's and the teacher's logits by the same temperature"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, side, scaled, unscaled, divisor, value in one_sided_temperatures(a.source.full(path)):
                at = f" (= {value:g})" if value is not None else ""
                if side == "student":
                    what = (f"the teacher's logits are divided by the temperature `{divisor}`{at} "
                            f"(`{scaled}`) but the student's `{unscaled}` are not: the student is "
                            f"fitted at T = 1 to the teacher's softened distribution, so its logits "
                            f"shrink by that factor and lose their margin")
                else:
                    what = (f"the student's logits are divided by the temperature `{divisor}`{at} "
                            f"(`{scaled}`) but the teacher's `{unscaled}` are not: the student's "
                            f"softened distribution is fitted to the teacher's sharp one, so its "
                            f"logits grow by that factor")
                yield self.finding(
                    f"{what}; Hinton's distillation softens both sides with one temperature",
                    Location(path, line, None),
                    fix=f"divide both sides by the temperature: `{unscaled} / {divisor}` as well",
                    evidence={"side": side, "divisor": divisor, "value": value})
