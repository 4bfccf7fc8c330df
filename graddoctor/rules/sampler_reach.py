from __future__ import annotations

import ast

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_SPAN = 40  # lines above the sampler searched for the assignment of its weights


def per_sample_name_assignment(tree: ast.AST, line: int) -> tuple[int, str] | None:
    """``(line, text)`` of the assignment, within ``_SPAN`` lines above, of the weights that the
    ``WeightedRandomSampler(...)`` on ``line`` is given when their name says they are one per
    sample (``sample_weights = class_weights``): the assignment is then the line to change; None
    otherwise (weights named per class or label are right where they are made: the sampler is
    given the wrong ones)."""
    calls = [n for n in walk(tree) if isinstance(n, ast.Call) and n.lineno == line
             and (getattr(n.func, "attr", None) or getattr(n.func, "id", None)) == "WeightedRandomSampler"]
    if len(calls) != 1:
        return None
    call = calls[0]
    arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "weights"), None)
    if not isinstance(arg, ast.Name) or "sample" not in arg.id.lower():
        return None
    bound = [n for n in walk(tree) if isinstance(n, ast.Assign) and line - _SPAN <= n.lineno < line
             and any(isinstance(t, ast.Name) and t.id == arg.id for t in n.targets)]
    if not bound:
        return None
    latest = max(bound, key=lambda n: n.lineno)
    return latest.lineno, ast.unparse(latest).strip()


class SamplerReach(Rule):
    """
    ## What it does
    Finds a DataLoader whose sampler can only ever draw a part of its dataset: a
    `WeightedRandomSampler` given fewer weights than the dataset has samples (one weight per
    *class* where one per *sample* was meant), or a `RandomSampler`/`SequentialSampler` built
    over another, smaller dataset than the loader's. Reported at the sampler, or at the
    assignment of its weights when their name says they are one per sample
    (`sample_weights = class_weights`: the line to change).

    ## Why is this bad?
    A sampler draws indices below the length of what it was given. With one weight per class,
    `WeightedRandomSampler(class_weights, num_samples=len(ds))` draws indices 0..k-1 only (k
    classes): every epoch is made of the same k samples, repeated, and the rest of the data is
    never seen. Training runs, the loss falls (it memorises k samples), and the model is useless.

    ## Example
    ```python
    class_weights = 1.0 / torch.bincount(labels).float()       # one weight per class
    sampler = WeightedRandomSampler(class_weights, num_samples=len(labels))
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    ```

    ## Use instead
    ```python
    class_weights = 1.0 / torch.bincount(labels).float()
    sample_weights = class_weights[labels]                      # one weight per sample
    sampler = WeightedRandomSampler(sample_weights, num_samples=len(labels))
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    ```

    ## Stays silent on
    One weight per sample (zero weights for samples left out on purpose are that choice);
    `SubsetRandomSampler` and other samplers whose subset is the point; a loader whose dataset
    length is not known.
    """

    code = "GD232"
    slug = "sampler-reach"
    severity = Severity.WARNING
    summary = "a DataLoader's sampler can only draw a few of its dataset's samples"
    fix = "give WeightedRandomSampler one weight per sample (class_weights[labels]), not one per class"

    def check(self, a):
        seen = set()
        for e in a.of_kind("loader_sampler"):
            total, reach = e.get("dataset_len"), e.get("reach")
            if not isinstance(total, int) or not isinstance(reach, int) or total <= 0:
                continue
            weights = e.get("weights")
            sampler = e.get("sampler")
            if weights is not None:
                if weights >= total:
                    continue  # per-sample weights: zeros are a choice
                what = (f"{sampler} was given {weights} weights for a dataset of {total} samples: "
                        f"it draws indices 0..{weights - 1} only, so every epoch is made of the "
                        f"same {weights} samples and the other {total - weights} are never seen"
                        f"{' (one weight per class where one per sample was meant)' if weights <= 1000 else ''}")
                fix = None
            else:
                if reach >= total:
                    continue
                what = (f"{sampler} was built over {reach} samples while the DataLoader's dataset "
                        f"has {total}: it draws indices below {reach} only, so the other "
                        f"{total - reach} samples are never seen")
                fix = "build the sampler over the same dataset the DataLoader reads"
            key = (e.loc, what)
            if key in seen:
                continue
            seen.add(key)
            loc, related = e.loc, ()
            made = None
            if weights is not None and loc is not None:
                tree = a.source.tree(loc.path)
                made = per_sample_name_assignment(tree, loc.line) if tree is not None else None
            if made is not None:
                related = (Related(loc, f"the {sampler} given them"),)
                loc = Location(loc.path, made[0], loc.function)
                what = f"`{made[1]}` makes one weight per class, not per sample: {what}"
            yield self.finding(what, loc, fix=fix, related=related,
                               evidence={"sampler": sampler, "dataset_len": total, "reach": reach,
                                         "weights": weights})
