from __future__ import annotations

from dataclasses import replace

from ..findings import Related, Severity
from .base import Rule


class LabelsRemappedWrongly(Rule):
    """
    ## What it does
    Finds a loss whose target is the DataLoader's labels rewritten, value by value, into labels
    that no longer mean what the dataset's did: a void or unlabelled value (255, -1) turned
    into one of the classes (`mask.clamp(0, C - 1)`, `mask % C`, `torch.where(mask == 255, 0,
    mask)`) while the other classes are kept; labels that already cover the model's classes
    `0 .. C-1` shifted by a constant (`y - 1`, ids taken as 1-based) so that one class lands on
    the loss's `ignore_index`; a regression target that the loader serves already standardised
    (or scaled into [0, 1]) scaled down a second time, or put back into its units while the
    prediction it is compared with stays on the served scale. Read at the first 16 loss calls with a
    gradient (CPU targets): the target is compared with the latest batch the DataLoader served,
    value by value, and reported at the line that makes it.

    ## Why is this bad?
    The loss trains on the labels it is given. Void pixels merged into a class teach the model
    that every unannotated border, ignore region or padding is that class; shifted ids never
    train one class at all (its samples are the ignored ones), leave the last output without a
    target and put every other class on the output of its neighbour; a target scaled twice is nearly constant (a spread of 1/std of the first),
    so the model learns its mean and the loss looks small; a target put back into units against
    a standardised prediction undoes the standardisation (the model must learn the offset and
    scale, with gradients std times larger), and predictions put back into units afterwards are
    scaled twice. Nothing fails; accuracy or error is
    just worse than it should be.

    ## Example
    ```python
    for image, mask in loader:          # mask: classes 0..3, 255 where nobody labelled
        target = mask.clamp(0, NUM_CLASSES - 1)
        loss = F.cross_entropy(model(image), target)
    ```

    ## Use instead
    ```python
    for image, mask in loader:
        loss = F.cross_entropy(model(image), mask, ignore_index=255)
    ```

    ## Stays silent on
    Labels given as served; a lookup table from raw annotation ids to train ids that sends the
    unused ids to `ignore_index` (Cityscapes' `id -> trainId`); 1-based ids (`1 .. C`) shifted
    once to `0 .. C-1`; labels merged into coarser classes; a regression target standardised
    once (in the dataset or in the loop, not both); a target put back into its units for a
    prediction made in units (a last layer initialised to the mean, or the prediction scaled
    up the same way); one-hot or smoothed targets (not one value per served label). Not seen:
    remaps done inside the Dataset (the served labels are then the remapped ones), targets on
    an accelerator, a target reshaped to another number of values (a resize).
    """

    code = "GD312"
    slug = "labels-remapped-wrongly"
    severity = Severity.WARNING
    summary = ("the loss's target is the loader's labels remapped off their meaning: a void "
               "value made a class, classes shifted onto ignore_index, a target scaled twice or "
               "unscaled against a standardised prediction")
    fix = ("give the loss the labels as the dataset means them: void values to ignore_index, "
           "ids shifted only when they start at 1, a target standardised once")

    def check(self, a):
        for e in a.of_kind("target_remapped"):
            if e.loc is None:
                continue
            made = a.source.target_assignment(e.loc.path, e.loc.line)
            loc = replace(e.loc, line=made[0]) if made is not None else e.loc
            text = made[1] if made is not None else None
            shown = f"`{text}`" if text else "the target given here"
            fn = e.get("fn")
            how = e.get("how")
            if how == "void":
                raw, new, classes = e.get("raw"), e.get("new"), e.get("classes")
                count, values = e.get("count") or 0, e.get("values") or 1
                ignore = e.get("ignore_index")
                message = (
                    f"{shown} keeps the served labels' classes as they are but turns the value "
                    f"{raw} — outside the {classes} classes {fn} scores, a void or unlabelled "
                    f"mark ({count} of {values} values in the first batch looked at) — into "
                    f"class {new}: those positions are trained as class {new} instead of being "
                    f"ignored")
                if ignore is not None and ignore != raw:
                    message += f" (the call ignores {ignore}, not {raw})"
                fix = (f"leave the value {raw} as it is and ignore it in the loss: "
                       f"{fn}(..., ignore_index={raw}) (or map it to the ignore_index the call "
                       f"uses)")
                evidence = {"how": how, "raw": raw, "new": new, "classes": classes,
                            "ignore_index": ignore, "count": count}
            elif how == "shifted":
                shift, ignore, classes = e.get("shift"), e.get("ignore_index"), e.get("classes")
                raw = e.get("raw")
                sign = f"+ {shift}" if shift > 0 else f"- {-shift}"
                message = (
                    f"{shown} shifts labels that already run from 0 to {classes - 1} — every "
                    f"class {fn} scores — by {sign}: label {raw} becomes {ignore}, the call's "
                    f"ignore_index, so class {raw} is never trained ({e.get('count')} of "
                    f"{e.get('values')} values of the first batch looked at are ignored), output "
                    f"{classes - 1} is never a target, and every other class is trained on the "
                    f"output of the class below it")
                fix = ("drop the shift: the served ids are 0-based already (shift only ids "
                       "that start at 1)")
                evidence = {"how": how, "shift": shift, "classes": classes,
                            "ignore_index": ignore, "labels": e.get("labels")}
            elif how == "unscaled":
                served = ("standardised (mean {:.2g}, std {:.2g})".format(e.get("mean"), e.get("std"))
                          if e.get("served") == "standardised" else "scaled into [0, 1]")
                message = (
                    f"{shown} puts a target that the loader serves {served} back into its units, "
                    f"by {e.get('scale'):.3g} (offset {e.get('offset'):.3g}), while the prediction "
                    f"{fn} compares it with stays on the served scale (mean "
                    f"{e.get('prediction_mean'):.2g}, spread {e.get('prediction_std'):.2g} against "
                    f"the target's {e.get('target_mean'):.3g} and {e.get('target_std'):.3g}): the "
                    f"model has to learn the offset and scale the standardisation took away, "
                    f"with errors {abs(e.get('scale')):.3g} times the served spread, and "
                    f"predictions put back into units for evaluation would be scaled twice")
                fix = ("compare the prediction with the target as served (both standardised), and "
                       "put only the prediction back into units, for metrics")
                evidence = {"how": how, "scale": e.get("scale"), "offset": e.get("offset"),
                            "served": e.get("served")}
            else:
                served = ("standardised (mean {:.2g}, std {:.2g})".format(e.get("mean"), e.get("std"))
                          if e.get("served") == "standardised" else "scaled into [0, 1]")
                message = (
                    f"{shown} scales a target that the loader serves {served} again, by "
                    f"{e.get('scale'):.3g} (offset {e.get('offset'):.3g}): {fn} is given targets "
                    f"with mean {e.get('target_mean'):.3g} and spread {e.get('target_std'):.3g}, "
                    f"nearly one value, so the model learns their mean and the loss is small "
                    f"whatever it predicts")
                fix = ("scale the target once: the dataset already standardises it, so use it "
                       "as served (and invert that one scaling for predictions in units)")
                evidence = {"how": how, "scale": e.get("scale"), "offset": e.get("offset"),
                            "served": e.get("served")}
            related = (Related(e.loc, f"the {fn} call"),) if loc.line != e.loc.line else ()
            yield self.finding(message, loc, step=a.next_step_number(e.seq), fix=fix,
                               evidence=evidence, related=related)
