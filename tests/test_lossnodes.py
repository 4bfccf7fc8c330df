"""``lossnodes.loss_of``: one lookup of "the loss node" for the losses with a node of their own
and those torch builds of plain ops (``F.l1_loss`` is abs then mean), whose top node the
composite-loss watcher tags while its window lasts."""

import torch
import torch.nn.functional as F

from graddoctor.instrument.lossnodes import WINDOW, CompositeLossWatcher, loss_of
from graddoctor.instrument.patcher import Patcher
from graddoctor.instrument.recorder import Recorder
from graddoctor.instrument.topics import DESCRIBE_LOSS


def _watched():
    rec = Recorder(step_budget=None)
    watcher = CompositeLossWatcher(rec)
    rec.subscribe(DESCRIBE_LOSS, watcher.describe_loss)
    patcher = Patcher()
    watcher.install(patcher)
    return watcher, patcher


def test_native_and_composite_losses_are_found_alike():
    original = F.l1_loss
    watcher, patcher = _watched()
    try:
        x = torch.randn(6, 3, requires_grad=True)
        y = torch.randn(6, 3)
        flat = y.reshape(-1)
        scores = x.reshape(-1)
        mse = F.mse_loss(scores, flat)
        l1 = F.l1_loss(scores, flat)
        assert type(l1.grad_fn).__name__ == "MeanBackward0"  # no L1LossBackward in this torch
        for loss, fn in ((mse, "mse_loss"), (l1, "l1_loss")):
            call = loss_of(loss.grad_fn)
            assert call is not None and call.fn == fn and call.target is flat and call.reduced
            assert type(call.input_node).__name__ == "ViewBackward0"
        kl = F.kl_div(x.log_softmax(-1), y.softmax(-1), reduction="batchmean")
        assert loss_of(kl.grad_fn).fn == "kl_div"
        per_element = F.l1_loss(scores, flat, reduction="none")
        assert loss_of(per_element.grad_fn).reduced is False
        assert loss_of((scores - flat).abs().mean().grad_fn) is None  # written out: no loss call
        with torch.no_grad():
            assert F.l1_loss(scores, flat).grad_fn is None
        watcher.describe_loss(())  # the backward's watchers have read the tags: taken off
        assert loss_of(l1.grad_fn) is None and loss_of(mse.grad_fn).fn == "mse_loss"
        for _ in range(WINDOW - 1):
            watcher.describe_loss(())
        assert F.l1_loss is original  # the window is over: torch's own function is back
        assert loss_of(F.l1_loss(scores, flat).grad_fn) is None
    finally:
        patcher.undo()
    assert F.l1_loss is original
