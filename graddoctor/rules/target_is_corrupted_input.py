from __future__ import annotations

from ..findings import Severity
from .base import Rule

_HOW = {"noise": "noise was added to it", "mask": "a random mask was written or multiplied into it",
        "dropout": "dropout zeroed part of it"}


class TargetIsCorruptedInput(Rule):
    """
    ## What it does
    Finds a loss whose target is the corrupted value the model was given instead of the clean
    value it was corrupted from: a denoising autoencoder trained with
    `mse(model(noisy), noisy)`, masked language modelling whose labels are taken from the ids
    after `[MASK]` was written into them, an inpainting or masked-autoencoder loss against the
    zeroed patches. In the first steps graddoctor follows the values without gradient: a random
    draw made after the data it is mixed into (noise added, a 0/1 mask multiplied in, a constant
    written where a random mask is set, dropout) makes a corrupted value; a model given that
    value, and a loss target that holds its corrupted values (a copy, a view, a selection of it)
    where the clean ones differ, while the clean value is still there (or was overwritten in
    place), is reported. It points at the copy that made the target (`labels = ids.clone()`),
    or else at the loss call.

    ## Why is this bad?
    The model's job is to undo the corruption: predict the clean pixels, the original token
    under `[MASK]`. With the corrupted value as the target the best answer is to copy the
    input: the loss falls quickly toward zero (or to the noise it cannot predict), the model
    learns the identity or to output `[MASK]` for `[MASK]`, and nothing fails. The learned
    representation is useless for the task the objective was meant to train.

    ## Example
    ```python
    noisy = x + 0.1 * torch.randn_like(x)
    loss = F.mse_loss(model(noisy), noisy)

    ids[mask] = MASK_ID
    labels = ids.clone()
    labels[~mask] = -100
    ```

    ## Use instead
    ```python
    noisy = x + 0.1 * torch.randn_like(x)
    loss = F.mse_loss(model(noisy), x)

    labels = ids.clone()
    labels[~mask] = -100
    ids[mask] = MASK_ID
    ```

    ## Stays silent on
    A plain autoencoder (`mse(model(x), x)`: no corruption); a denoiser whose target is the
    clean tensor; labels cloned before the ids are masked, with -100 outside the masked
    positions (BERT's 80/10/10 corruption included); a diffusion loss whose target is the
    noise; a VAE (values with gradient are not followed); a model given noisy or masked inputs
    on purpose with a clean target (noise augmentation); noisy labels (a target made noisy that
    the model was not given); data whose randomness is older than its "noise" (`x[x < 0] = 0`
    of random data, synthetic data made as `clean + noise` whose clean part is gone); a target
    that is a corrupted copy made by a second, later corruption of an already corrupted value
    (Noise2Void's blind spots on a noisy image are a new corruption, not the noisy image's);
    values on a GPU, and corruptions whose positions are not drawn by torch (a box placed with
    Python's `random`), are not followed.
    """

    code = "GD166"
    slug = "target-is-corrupted-input"
    severity = Severity.WARNING
    summary = ("the loss's target is the corrupted input the model was given (noise added, tokens "
               "masked), not the clean value it was corrupted from: the model learns to copy it")
    fix = ("compare the output with the clean value the input was corrupted from (the tensor "
           "before noise or the mask was applied; labels cloned before masking)")

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        for e in a.of_kind("target_corrupted"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids:
                continue  # no optimizer steps what makes the prediction
            fn, how = e.get("fn"), e.get("how")
            line = e.get("corrupted_line")
            where = f" (line {line})" if line else ""
            made = ("the copy made here" if e.get("copied")
                    else f"the target given to {fn} here")
            if how == "mask":
                fix = ("take the target before the corruption: clone the labels before writing the "
                       "mask token into the ids (labels = ids.clone(); labels[~mask] = -100; "
                       "ids[mask] = MASK_ID), or compare with the unmasked tensor "
                       "(F.mse_loss(pred[mask], patches[mask]))")
            else:
                fix = ("compare the output with the clean tensor the noisy input was made from: "
                       "noisy = x + sigma * torch.randn_like(x); loss = F.mse_loss(model(noisy), x)")
            yield self.finding(
                f"{made} holds the corrupted values the model was given: {_HOW.get(how, how)}"
                f"{where}, and at {e.get('positions')} of its {e.get('numel')} positions the target "
                f"has those corrupted values where the clean value it was made from differs. The "
                f"model ({a.names(pids)}) is trained to reproduce its own corrupted input — to "
                f"copy it — instead of recovering the clean value, so the loss falls while it "
                f"learns nothing the corruption was meant to teach",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"function": fn, "corruption": how, "corrupted_line": line,
                          "positions": e.get("positions"), "params": pids[:16]},
                fix=fix)
