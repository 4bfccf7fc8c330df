"""reordered-copy-unused (GD375): the source reading of an index-reordered copy that nothing reads
while the function reads the original after it."""

from __future__ import annotations

import ast
import textwrap

from graddoctor.rules.reordered_copy_unused import unused_reorders


def _found(src):
    return unused_reorders(ast.parse(textwrap.dedent(src)))


def test_a_gathered_copy_dropped_for_the_original_is_found():
    assert _found("""
        def emd_loss(pred, gt):
            col = emd_match(pred, gt)
            matched = torch.gather(gt, 1, col.unsqueeze(-1).expand(-1, -1, 3))
            return (pred - gt).norm(dim=-1).mean()
    """) == [(4, "matched", "gt", 5)]
    assert _found("""
        def loss(p, labels, perm):
            shuffled = labels[perm]
            return F.cross_entropy(p, labels)
    """) == [(3, "shuffled", "labels", 4)]


def test_used_copies_loop_slices_constants_and_underscores_are_left_alone():
    assert _found("""
        def emd_loss(pred, gt):
            col = emd_match(pred, gt)
            matched = torch.gather(gt, 1, col)
            return (pred - matched).norm(dim=-1).mean() + gt.mean()
    """) == []
    assert _found("""
        def f(pred, gt):
            for b in range(3):
                row = gt[b]
            first = gt[0]
            _dbg = gt[perm]
            return (pred - gt).mean()
    """) == []
    # the original is not read after the copy: nothing claimed
    assert _found("""
        def f(pred, gt, idx):
            copy = gt[idx]
            return pred.mean()
    """) == []
