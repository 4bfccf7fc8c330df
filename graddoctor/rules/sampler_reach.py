from __future__ import annotations

from ..findings import Severity
from .base import Rule


class SamplerReach(Rule):
    """
    ## What it does
    Finds a DataLoader whose sampler can only ever draw a part of its dataset: a
    `WeightedRandomSampler` given fewer weights than the dataset has samples (one weight per
    *class* where one per *sample* was meant), or a `RandomSampler`/`SequentialSampler` built
    over another, smaller dataset than the loader's.

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
            yield self.finding(what, e.loc, fix=fix,
                               evidence={"sampler": sampler, "dataset_len": total, "reach": reach,
                                         "weights": weights})
