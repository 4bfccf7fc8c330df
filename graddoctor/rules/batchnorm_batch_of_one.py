from __future__ import annotations

import ast

from ..findings import Role, Severity
from ..trace import Location
from .base import Rule, related
from ..analysis.source import walk

MIN_FORWARDS = 3  # training forwards with a batch of one, and none larger, before it is the run's batch


class BatchnormBatchOfOne(Rule):
    """
    ## What it does
    Finds BatchNorm layers trained on batches of one sample: at every training forward of the
    run's first backward turns (at least 3 of them), a BatchNorm layer in train mode that tracks
    running statistics and whose parameters train gets an input whose first (batch) size is 1,
    and no larger batch is seen. It points at the `DataLoader(..., batch_size=1)` that makes
    those batches when the script has exactly one, else at the line that runs the model.
    Gradient accumulation over micro-batches of one is the same bug: the statistics are
    per micro-batch. Only the input's shape is read (no host sync), in the first 6 turns.

    ## Why is this bad?
    In train mode BatchNorm normalises each channel with the mean and variance of the batch.
    With one sample that is the sample's own statistics (instance normalisation), the running
    statistics average per-image statistics, and `model.eval()` then normalises with those
    running averages, a normalisation the model never trained with. It trains, the training
    loss looks fine, and the evaluation accuracy is quietly worse.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=1, shuffle=True)   # large images: one fits
    model = UNet()                                              # built with nn.BatchNorm2d
    for x, y in loader:
        loss = criterion(model(x), y)
        ...
    ```

    ## Use instead
    ```python
    loader = DataLoader(dataset, batch_size=16, shuffle=True)  # 8-16 samples or more
    # or, when only one sample fits: GroupNorm/InstanceNorm instead of BatchNorm, or BatchNorm
    # frozen with its pretrained statistics after every model.train():
    model.apply(lambda m: m.eval() if isinstance(m, nn.BatchNorm2d) else None)
    ```

    ## Stays silent on
    Batches of one with BatchNorm in eval mode (frozen BN when fine-tuning a detection
    backbone) or with its parameters frozen (frozen-bn-train-mode's); GroupNorm, LayerNorm and
    InstanceNorm models; BatchNorm without running statistics (`track_running_stats=False`: it
    normalises with the batch's statistics at evaluation too); batches of one at evaluation
    (`no_grad`, `eval()`); `SyncBatchNorm`, whose batch spans the ranks; an epoch's last batch
    of one sample after larger ones (`drop_last=False`); a script that runs the model on single
    samples (a rollout) and trains it on larger batches; DataParallel's replicas. A script that
    never calls `eval()` (pix2pix keeps BatchNorm in train mode with a batch of one on purpose:
    instance normalisation) gets an `info`, not a warning.
    """

    code = "GD162"
    slug = "batchnorm-batch-of-one"
    severity = Severity.WARNING
    summary = ("BatchNorm layers train on batches of one sample: they normalise each sample with "
               "its own statistics, which evaluation (running statistics) does not")
    fix = ("use a batch of at least 8-16 samples, or replace BatchNorm with GroupNorm/InstanceNorm "
           "(or freeze BN: model.apply(lambda m: m.eval() if isinstance(m, nn.BatchNorm2d) else "
           "None) after model.train()) when only one sample fits")

    def check(self, a):
        seen = a.by_kind.get("bn_batch", ())
        if not seen or any(e["batch"] != 1 for e in seen):
            return
        backwards = a.count(a.by_kind.get("backward", ()))
        ones = [e for e in seen if e["turn"] < backwards]  # forwards that a backward followed
        forwards = a.count(ones)
        if forwards < MIN_FORWARDS:
            return
        first = ones[0]
        loc, call, loader = first.loc, None, None
        if loc is not None:
            lines = a.source.loader_batch_of_one_lines(loc.path)
            if len(lines) == 1:
                loc, loader = Location(loc.path, lines[0][0]), lines[0][1]
                call = related(first, "the model's training forward, one sample at a time",
                               Role.TRAINING_FORWARD)
        where = (f"this DataLoader (`{loader}`) serves batches of one sample" if loader is not None
                 else "the model is trained on one sample at a time")
        shape = "×".join(str(s) for s in first["shape"])
        # the running statistics only matter where the script evaluates in eval mode; a script
        # that never calls eval() keeps normalising by the batch (pix2pix's batch of one, on
        # purpose: BatchNorm as instance normalisation), a choice to name, not a bug to assert
        evaluated = first.loc is None or _calls_eval(a, first.loc.path)
        yield self.finding(
            f"{where}: at each of the first {forwards} training forwards the {first['cls']} "
            f"{first['layer']} (and any other BatchNorm layer on the way) gets a batch of one "
            f"({shape}), so in train mode it normalises every channel with that one sample's own "
            f"mean and variance; its running statistics average per-sample statistics, and after "
            f"eval() the model is normalised differently from how it trained — training looks "
            f"fine, evaluation is quietly worse"
            + ("" if evaluated else
               " (this script never calls eval(): if normalising each sample by itself is meant, "
               "as pix2pix does with a batch of one, InstanceNorm says so)"),
            loc, related=(call,), step=a.next_step_number(first.seq),
            severity=None if evaluated else Severity.INFO,
            evidence={"layer": first["layer"], "cls": first["cls"], "shape": first["shape"],
                      "forwards": forwards, "loader": loader is not None,
                      "eval_called": evaluated})


def _calls_eval(a, path: str) -> bool:
    """Whether the script's file calls ``.eval()`` or ``.train(False)`` anywhere."""
    tree = a.source.tree(path)
    if tree is None:
        return True  # unknown: the harm is assumed
    for node in walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "eval" and not node.args:
                return True
            if node.func.attr == "train" and node.args and isinstance(node.args[0], ast.Constant) \
                    and node.args[0].value is False:
                return True
    return False
