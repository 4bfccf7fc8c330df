from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_RESTORE = re.compile(r"restore|unshuffle|unsort|inverse|inv_perm|undo|back", re.I)


class RestoreNotInverse(Rule):
    """
    ## What it does
    Finds a masked model whose unshuffle does not put the kept tokens back where they were taken
    from: MAE-style random masking keeps `k` of `L` tokens per row with a gather by the first
    `k` entries of a random permutation, and after the encoder gathers `[kept tokens, mask
    tokens]` back into the original order with the inverse permutation
    (`ids_restore = torch.argsort(ids_shuffle, dim=1)`). Seen in the loss's graph at the first
    backwards: a gather along dim 1 by rows of permutations over a cat along dim 1 whose first
    part comes from a gather of `k < L` distinct positions per row, and fewer than half of the
    kept tokens land at the position they were picked from. It points at the assignment of the
    restore index (a name with `restore`, `unshuffle`, `inverse` in it) when the script has one.

    ## Why is this bad?
    With the forward permutation in the inverse's place (`ids_restore = ids_shuffle`, or
    `argsort(noise)` taken again), the decoder gets each kept token at another position than
    the one it came from: the positional embeddings added after the unshuffle lie about every
    token, the mask tokens sit where visible patches were, and the reconstruction is asked of
    positions whose content the decoder was given elsewhere. The loss still falls, slower, and
    the encoder learns a scrambled task. Nothing fails.

    ## Example
    ```python
    ids_shuffle = torch.argsort(torch.rand(n, length), dim=1)
    ids_restore = ids_shuffle
    x_kept = torch.gather(x, 1, ids_shuffle[:, :keep, None].expand(-1, -1, d))
    ...
    x_ = torch.gather(torch.cat([h, mask_tokens], 1), 1, ids_restore[..., None].expand(-1, -1, d))
    ```

    ## Use instead
    ```python
    ids_restore = torch.argsort(ids_shuffle, dim=1)  # the inverse permutation
    ```

    ## Stays silent on
    The inverse permutation (`argsort(ids_shuffle)`, `scatter` of an arange), a decoder that
    puts the tokens back with `scatter` or index assignment, models that keep every token, and
    gathers that are not a permutation over a cat of gathered tokens and fillers. Not seen:
    indices on an accelerator, a cat along another axis than 1.
    """

    code = "GD425"
    slug = "restore-not-inverse"
    severity = Severity.WARNING
    summary = ("a masked model's unshuffle is not the inverse of its shuffle: the kept tokens "
               "are put back at other positions than the ones they were taken from")
    fix = ("unshuffle with the inverse permutation: `ids_restore = torch.argsort(ids_shuffle, "
           "dim=1)`")

    def check(self, a):
        for e in a.of_kind("unshuffle_misplaced"):
            if e.loc is None:
                continue
            loc, fix = _restore_assignment(a, e.loc), self.fix
            if loc is not e.loc:
                text = a.source.line_text(loc.path, loc.line).split("#")[0].strip()
                name = text.split("=")[0].strip()
                shuffle = _permutation_name(a, loc.path)
                if shuffle:
                    fix = (f"make `{name}` the inverse of `{shuffle}`: `{name} = "
                           f"torch.argsort({shuffle}, dim=1)`, not `{text.split('=', 1)[1].strip()}`")
            yield self.finding(
                f"the gather that puts the {e['kept']} kept tokens of each row back among the "
                f"{e['length']} positions (after the mask tokens were appended) puts only "
                f"{e['placed']:.0%} of them where they were taken from: its index is not the "
                f"inverse of the shuffle that chose them, so the decoder sees every kept token "
                f"at another position, its positional embeddings lie, and it reconstructs a "
                f"scrambled image",
                loc, fix=fix,
                evidence={"rows": e["rows"], "length": e["length"], "kept": e["kept"],
                          "placed": e["placed"]})


def _assignments(a, path: str) -> list[ast.Assign]:
    tree = a.source.tree(path)
    if tree is None:
        return []
    return [n for n in walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name)]


def _restore_assignment(a, loc) -> Location:
    """The one assignment of a restore-named index in the backward's file, else the backward."""
    found = [n for n in _assignments(a, loc.path) if _RESTORE.search(n.targets[0].id)
             and not isinstance(n.value, ast.Constant)]
    return Location(loc.path, found[0].lineno, "") if len(found) == 1 else loc


def _permutation_name(a, path: str) -> str | None:
    """The one name the file assigns an ``argsort`` of a random draw (the shuffle), if any."""
    names = []
    for n in _assignments(a, path):
        text = ast.unparse(n.value)
        if re.search(r"argsort\(", text) and re.search(r"rand|noise", text, re.I) \
                and not _RESTORE.search(n.targets[0].id):
            names.append(n.targets[0].id)
    return names[0] if len(set(names)) == 1 else None
