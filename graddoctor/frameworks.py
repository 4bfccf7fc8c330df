"""Training frameworks graddoctor knows: PyTorch Lightning, Hugging Face accelerate and the
transformers Trainer. One table each, read by the location finder (graddoctor/location.py):

* which installed packages are the framework (its frames on a call's stack say the framework
  made or relayed the call: ``Location.via``);
* for a call the framework made on its own (automatic optimization), the user's hook that caused
  it: the framework function on the stack, and the hooks to try, first overridden one wins
  (``Location.hook``; the line is in that hook: the ``return`` of a hook that returns what the
  framework uses, e.g. the loss of ``training_step``, else its ``def``).

Rules never test for a framework themselves: a finding's fix is picked from the rule's
``fixes`` variants by the framework of its location, else the one that drove the run's optimizer
steps (``Analysis.framework``; graddoctor/rules/engine.py). A framework is recognised by
its installed location (site-packages / dist-packages): one installed from a source checkout
elsewhere counts as the user's code. No torch here, and no framework import.
"""

from __future__ import annotations

# the first folder under site-packages -> framework
PACKAGES = {
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
    "lightning_fabric": "lightning",
    "accelerate": "accelerate",
    "transformers": "transformers",
}

# framework -> the name its fix variants and the report use
TITLES = {"lightning": "PyTorch Lightning", "accelerate": "accelerate", "transformers": "transformers Trainer"}

# framework -> {"<folder>/<file>.py:<function>" on the stack: the user hooks it stands for, tried
# in order}. Keyed by the file's last two path parts and the function (the same names recur
# elsewhere in the framework: a manual opt.step() passes through the strategy's optimizer_step
# too, and is the user's own call). The innermost listed frame on the stack wins.
HOOKS: dict[str, dict[str, tuple[str, ...]]] = {
    "lightning": {
        # automatic optimization: the closure runs training_step, then backward of its loss
        "optimization/automatic.py:backward_fn": ("training_step",),
        "optimization/automatic.py:zero_grad_fn": ("configure_optimizers",),
        # the LightningModule's default hooks (a user's override is their own frame)
        "core/module.py:optimizer_zero_grad": ("configure_optimizers",),
        "core/module.py:optimizer_step": ("configure_optimizers",),
        "loops/training_epoch_loop.py:_update_learning_rates": ("configure_optimizers",),
        # Trainer(gradient_clip_val=...) clips: the Trainer's line, unless the user overrode it
        "core/module.py:clip_gradients": ("configure_gradient_clipping",),
    },
    "transformers": {
        # Trainer.training_step: compute_loss (if the user overrode it), then backward
        "transformers/trainer.py:training_step": ("compute_loss", "compute_loss_func"),
    },
    "accelerate": {},
}

# listed functions a user may also call straight from their own code (``self.clip_gradients(...)``
# in a configure_gradient_clipping override or a manual training_step, ``super().optimizer_step``):
# called from a user frame, the call is the user's own and keeps the user's line
USER_CALLABLE = frozenset({
    "core/module.py:clip_gradients",
    "core/module.py:optimizer_zero_grad",
    "core/module.py:optimizer_step",
})


def hook_key(path: str, function: str) -> str:
    """The HOOKS key of a frame: its file's last two path parts and its function."""
    parts = path.replace("\\", "/").rsplit("/", 2)
    return "/".join(parts[-2:]) + ":" + function


# hooks whose returned value is what the framework acts on: point at their return line
RETURNING = frozenset({"training_step", "configure_optimizers", "compute_loss", "compute_loss_func"})

# where to look for the user's object from a framework frame's ``self``
OWNER_ATTRS = ("lightning_module", "model")


def framework_of_path(path: str) -> str:
    """The framework a file belongs to ('' for none): the package right under site-packages."""
    for marker in ("site-packages", "dist-packages"):
        at = path.find(marker)
        if at >= 0:
            rest = path[at + len(marker) + 1:]
            top = rest.split("/", 1)[0].split("\\", 1)[0]
            return PACKAGES.get(top, "")
    return ""
