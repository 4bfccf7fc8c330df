"""restore-not-inverse (GD425): the comparison of a masked model's unshuffle with the gather
that kept its tokens, the watcher on a small MAE-style graph, and the line the rule points at."""

from __future__ import annotations

import torch

from graddoctor import events as ev
from graddoctor.instrument.unshuffle import misplaced
from graddoctor.trace import TraceBuilder
from rule_traces import findings, only

SLUG = "restore-not-inverse"


def _shuffle(rows=4, length=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.argsort(torch.rand(rows, length, generator=g), dim=1)


def test_the_inverse_puts_every_kept_token_back_and_the_shuffle_itself_does_not():
    shuffle = _shuffle()
    keep = shuffle[:, :3]
    assert misplaced(torch.argsort(shuffle, dim=1), keep) == 1.0
    assert misplaced(shuffle, keep) < 0.5


def test_indices_that_are_no_permutation_or_keep_everything_are_not_judged():
    shuffle = _shuffle()
    assert misplaced(shuffle.clamp(max=5), shuffle[:, :3]) is None  # not a permutation
    assert misplaced(shuffle, shuffle) is None  # every token kept


def _mae_loss(inverse: bool):
    from graddoctor.instrument import Recorder
    from graddoctor.instrument.unshuffle import UnshuffleWatcher

    torch.manual_seed(0)
    n, length, d, keep = 4, 10, 6, 3
    x = torch.randn(n, length, d, requires_grad=True)
    shuffle = _shuffle(n, length)
    restore = torch.argsort(shuffle, dim=1) if inverse else shuffle
    kept = torch.gather(x, 1, shuffle[:, :keep, None].expand(-1, -1, d)) * 2
    full = torch.cat([kept, torch.zeros(n, length - keep, d)], dim=1)
    out = torch.gather(full, 1, restore[:, :, None].expand(-1, -1, d))
    loss = out.pow(2).mean()
    rec = Recorder(step_budget=None)
    watcher = UnshuffleWatcher(rec)
    watcher.describe_loss(loss)
    return [e for e in rec.trace if e.kind == "unshuffle_misplaced"]


def test_the_watcher_reads_the_shuffle_and_the_unshuffle_from_the_graph():
    found = _mae_loss(inverse=False)
    assert len(found) == 1 and found[0]["kept"] == 3 and found[0]["placed"] < 0.5
    assert _mae_loss(inverse=True) == []


def test_the_rule_points_at_the_restore_index(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "noise = torch.rand(4, 10)\n"
        "ids_shuffle = torch.argsort(noise, dim=1)\n"
        "ids_restore = ids_shuffle\n"
        "loss = model(x, ids_shuffle, ids_restore)\n"
        "loss.backward()\n")
    t = TraceBuilder(path=str(script))
    t.put(ev.unshuffle_misplaced(rows=4, length=10, kept=3, placed=0.1), 6)
    f = only(t, SLUG)
    assert f.location.line == 4 and "torch.argsort(ids_shuffle, dim=1)" in f.fix


def test_no_event_no_finding():
    assert findings(TraceBuilder(), SLUG) == []
