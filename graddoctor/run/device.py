"""The ``--device`` policy around a script check: ``cpu`` hides CUDA from the script."""

from __future__ import annotations

import contextlib
import os

from ..errors import ScriptError
from ..instrument.patcher import Patcher

@contextlib.contextmanager
def device_policy(device: str):
    """``cpu`` hides CUDA from the script; ``cuda`` insists on it; ``auto`` leaves it be."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ScriptError("--device cuda: no CUDA device is available here")
    if device != "cpu":
        yield
        return
    saved_env = os.environ.get("CUDA_VISIBLE_DEVICES")
    patches = Patcher()
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    patches.patch(torch.cuda, "is_available", lambda: False)
    try:
        yield
    finally:
        patches.undo()
        if saved_env is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved_env

