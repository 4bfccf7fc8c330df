from __future__ import annotations

from ..findings import Severity
from .base import Rule

_FILLED = {"rows": "rows", "sparse": "values"}


class PlaceholderTargetsTrained(Rule):
    """
    ## What it does
    Finds a regression loss (`mse_loss`, `l1_loss`, `smooth_l1_loss`, `huber_loss`) taken over
    a target canvas whose empty entries hold a fill value: box offsets written into
    `torch.zeros(num_anchors, 4)` for the matched anchors only, keypoint coordinates left at
    (0, 0) for the invisible ones, a sparse depth or flow map with 0 where the sensor had no
    return. Read at the first calls with a gradient whose reduction averages or sums every
    element: a target of rows of 2 to 8 coordinates of which 20% or more (not all) are entirely
    0 while the other rows hold almost no 0, or a map (three axes or more) with 20% or more exact zeros
    whose other values are positive, not integers, and all at least 1% of the largest.
    A batch of variable-length sequences of frames, (B, T, F) or (B, F, T), padded with all-zero
    frames past each row's end (lengths of two values or more, 5% of the frames or more, no zero
    frame before a row's end), the prediction not zero there too, is the same canvas in time (a
    TTS decoder's mel frames, an enhancement model's spectrogram frames).
    Reported at the loss call. A loss written by hand is seen where it takes the log of such a
    map (`torch.log(gt)` in a scale-invariant depth loss, at the first calls of `torch.log` /
    `Tensor.log` on a tensor without gradient): log(0) is -inf there.

    ## Why is this bad?
    The zeros mean "nothing here", but the loss reads them as targets: the box head is trained
    to predict zero offsets for every background anchor (most of the batch, so the matched
    anchors' signal is diluted and pulled towards 0), the keypoint head to put invisible joints
    in the image's corner, the depth head to predict distance 0 wherever the ground truth is
    missing. The loss still goes down, and the model learns the canvas.

    ## Example
    ```python
    reg_t = torch.zeros(num_anchors, 4)
    reg_t[pos] = encode(gt[idx[pos]], anchors[pos])
    loss_reg = F.smooth_l1_loss(box_pred, reg_t)
    ```

    ## Use instead
    ```python
    loss_reg = F.smooth_l1_loss(box_pred[pos], reg_t[pos])
    # or, for a map: valid = depth > 0; F.l1_loss(pred[valid], depth[valid])
    ```

    ## Stays silent on
    The loss taken over the filled rows only (`pred[pos]`, `pred[valid]`); a prediction that is
    exactly 0 wherever the target is (a keypoint loss `mse_loss(pred * w, target * w)` with the
    target weights of the invisible joints multiplied into both); `reduction="none"`
    (a mask can follow) and a per-element `weight`; targets whose zero rows are rare (under
    20%) or whose filled rows hold zeros too (images, one-hot rows: 0 is a value there); maps
    whose small values reach down towards 0 (dark pixels, light rain); integer counts; targets
    that carry a gradient; the log of a prediction (it carries a gradient) or of a dense map.
    An autoencoder's colour images (3 or 4 channels) that the model itself read as its input
    (objects on a black background reconstructed by a slot-attention or conv autoencoder: 0 is
    a pixel value there); a one- or two-channel map given back that way still counts. Rows of
    three colours in [0, 1] predicted in [0, 1] (a sigmoid, alpha compositing): a NeRF's or a
    coordinate network's pixels over a black background, where black is a colour like the others.
    For padded sequences: the valid frames selected (`pred[mask]`), a prediction masked to 0 at
    the padding as well (`mel_out.masked_fill_(~mask, 0)` before an MSE over everything), batches
    of one length, zero frames inside the sequences too (silence that is 0).
    """

    code = "GD288"
    slug = "placeholder-targets-trained"
    severity = Severity.WARNING
    summary = ("a regression loss is taken over a target canvas whose empty entries are 0 "
               "(unmatched anchors, invisible keypoints, missing depth): the model is trained "
               "to predict the fill value there")
    fix = ("take the loss over the filled entries only: loss(pred[mask], target[mask]) with the "
           "mask of matched anchors, visible keypoints or valid pixels")

    def check(self, a):
        for e in a.of_kind("placeholder_targets"):
            shape = "×".join(str(s) for s in e["shape"])
            if e["how"] == "rows":
                message = (
                    f"the target given to {e['fn']} here ({shape}) is a canvas: {e['share']:.0%} "
                    f"of its {e['rows']} rows of {e['width']} are all 0 while the other rows hold "
                    f"values from {e['low']:g} to {e['high']:g} and almost no 0 — rows never "
                    f"filled in (unmatched anchors, invisible keypoints), which the loss still "
                    f"trains the model to predict as 0")
                fix = ("take the loss over the filled rows only: keep the mask the rows were "
                       "written with (pos = matched anchors, visible keypoints) and call "
                       f"{e['fn']}(pred[pos], target[pos]) (guard an empty mask)")
            elif e["how"] == "padded":
                message = (
                    f"the target given to {e['fn']} here ({shape}) is a padded batch of "
                    f"sequences: {e['rows']} of them end in all-zero frames (real lengths from "
                    f"{e['low']} to {e['high']}), {e['share']:.0%} of the frames, with no zero "
                    f"frame before each sequence's end — the padding, which this loss, reduced "
                    f"over every element, trains the model to predict (frames of silence at "
                    f"the level 0 after each utterance), while diluting the real frames' loss")
                fix = ("mask the padding out: build the frames' mask from the lengths "
                       "(mask = torch.arange(T)[None, :] < lengths[:, None]) and call "
                       f"{e['fn']}(pred[mask], target[mask]), or take reduction=\"none\" and "
                       "divide the masked sum by the mask's count")
            elif e["fn"] == "log":
                message = (
                    f"the target map whose log is taken here ({shape}) is {e['share']:.0%} "
                    f"exact zeros while its other values run from {e['low']:g} to "
                    f"{e['high']:g}: the zeros stand for missing measurements (no depth "
                    f"return), and log(0) = -inf makes the loss and every gradient inf or NaN "
                    f"at each step")
                fix = ("mask the missing values out before the log: valid = target > 0; "
                       "torch.log(pred[valid]) - torch.log(target[valid])")
            else:
                message = (
                    f"the target map given to {e['fn']} here ({shape}) is {e['share']:.0%} "
                    f"exact zeros while its other values run from {e['low']:g} to "
                    f"{e['high']:g}: the zeros stand for missing measurements (no depth "
                    f"return, no flow), not for a value of 0, and the loss trains the model "
                    f"to predict 0 there")
                fix = ("mask the missing values out: valid = target > 0; "
                       f"{e['fn']}(pred[valid], target[valid])")
            yield self.finding(
                message, e.loc, step=a.next_step_number(e.seq), fix=fix,
                evidence={"fn": e["fn"], "how": e["how"], "share": e["share"],
                          "shape": e["shape"]})
