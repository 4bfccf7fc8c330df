from __future__ import annotations

import ast

from ..analysis.reorder import (collate_fields_apart, fields_reordered_apart, input_reordered_at,
                                permuted_before_pairing, reordered_beside_kept, target_reordered_at)
from ..findings import Severity
from ..trace import Location
from .base import Related, Rule
from ..analysis.source import walk


class InputsPermutedWithoutLabels(Rule):
    """
    ## What it does
    Finds a model given the rows of a DataLoader batch in another order while the loss's target
    keeps the loader's order (`x = x[torch.randperm(len(x))]`, the labels left as they are).
    Checked by value on the first turns (CPU tensors): the model's inputs are all the rows of one
    batch, permuted, and the target is one of that batch's tensors unpermuted, with nothing
    between the model's output and the loss that reorders rows. It points at the statement that
    reordered the input (the latest assignment of a name the model's call is given, in the dozen
    lines above it, whose value reorders rows), else at the model's call.
    The reverse is the same bug: the model given the batch's rows in the loader's order and the
    loss's target one of the batch's tensors with its rows in another order (`y[perm]`, `y.sort()`),
    told by its rows as a multiset, at least three distinct values (0/1 labels in another order are
    not told from `1 - y`); it points at the loss module's call given that target where there is
    one, else at the model's call.
    Before the training loop, fields unpacked together (`X, labels = make_data()`), one put in a
    random order (`X = X[torch.randperm(len(X))]`) and the other not, then given row by row to
    one call (`TensorDataset(X[:split], labels[:split])`) are reported at the reordering.
    For a batch no DataLoader serves (made by the script's own function), the script's source
    is read instead, in the files whose backwards ran: in a loop that calls `backward`, fields
    unpacked together (`feats, lengths, y = make_batch()`), some rebound in the order of a
    permutation (`lengths, order = lengths.sort(descending=True)` then `feats = feats[order]`,
    or `x = x[torch.randperm(len(x))]`) while another keeps the old order and a loss call reads
    it (directly or through names assigned from it). It points at the reordering. In any
    scope (a loss function that sorts its inputs, as a Cox risk set or a ranking loss does), a
    tuple statement that rebinds some names to their rows in the order of a permutation made
    there and another name to itself as it is (`log_h, event = log_h[order], event`) is reported
    at that statement. The same in a collate function of the script: the indices of its list of
    examples sorted (`order = sorted(range(len(batch)), key=...)`), one returned field built in
    that order (`[batch[i][0] for i in order]`) and another straight from the list (`[y for _, y
    in batch]`): it points at the field left in the list's order.

    ## Why is this bad?
    Row `i` of the output is scored against label `i`, which now belongs to another sample: the
    model trains on random labels. The loss stalls near chance and nothing fails.

    ## Example
    ```python
    for x, y in loader:
        x = x[torch.randperm(len(x))]    # "shuffle" the batch
        loss = criterion(model(x), y)
    ```

    ## Use instead
    ```python
    for x, y in loader:                  # shuffle=True in the DataLoader, or one permutation
        perm = torch.randperm(len(x))    # for both
        loss = criterion(model(x[perm]), y[perm])
    ```

    ## Stays silent on
    One permutation applied to inputs and labels; mixup (the inputs mixed with a permuted copy,
    the loss over both label sets); a batch sorted by length for `pack_padded_sequence` and the
    outputs put back in the loader's order (any other use of the permutation, such as
    `order.argsort()`, leaves the source's reading silent); `enforce_sorted=False` on an
    unsorted batch; a permuted copy kept under a new name (negatives, a shuffled partner);
    a permutation-invariant target (one value repeated); inputs that are not the batch's rows
    (normalised, augmented); a tuple statement that reorders every field, keeps a sorted copy
    under a new name, or indexes by something the scope did not make as a permutation (a
    boolean mask).
    """

    code = "GD251"
    slug = "inputs-permuted-without-labels"
    severity = Severity.WARNING
    summary = ("the model gets the batch's rows in another order than the labels the loss "
               "compares them with")
    fix = ("apply the same permutation to the labels (x, y = x[perm], y[perm]), or let the "
           "DataLoader shuffle (shuffle=True)")

    def check(self, a):
        for e in a.of_kind("batch_pairing"):
            if e["problem"] == "labels-permuted":
                yield self._labels_permuted(a, e)
                continue
            if e["problem"] != "permuted":
                continue
            epoch, index = e["input_batch"]
            loc = e.loc
            tree = a.source.tree(loc.path) if loc is not None else None
            line = input_reordered_at(tree, loc.line) if tree is not None else None
            given = "the model here is given"
            if line is not None and line != loc.line:  # the statement that reordered the input
                given = f"this puts the model's input (its call at line {loc.line}),"
                loc = Location(loc.path, line)
            yield self.finding(
                f"{given} the {e['rows']} rows of batch {index} of epoch {epoch} "
                f"in another order, while the {e['fn']} loss's target, the batch's {e['field']}, "
                f"keeps the loader's order: each output is scored against another sample's "
                f"label, so the model trains on random labels",
                loc, step=a.next_step_number(e.seq),
                evidence={"loss": e["fn"], "batch": [e["loader"], epoch, index],
                          "target_field": e["field"], "rows": e["rows"]})
        yield from self._from_source(a)

    def _labels_permuted(self, a, e):
        epoch, index = e["input_batch"]
        loc, model_line = e.loc, e.get("model_line")
        tree = a.source.tree(loc.path) if loc is not None else None
        if tree is not None:  # the statement that reordered the target, where the source shows it
            line = target_reordered_at(tree, loc.line if model_line else None,
                                       model_line or loc.line, e["fn"])
            if line is not None and line != loc.line:
                model_line = model_line or loc.line
                loc = Location(loc.path, line)
        model = f" (the model's call at line {model_line})" if model_line else ""
        return self.finding(
            f"the {e['fn']} loss's target is the batch's {e['field']} with its rows put in "
            f"another order here, while the model{model} is given the {e['rows']} rows of batch {index} "
            f"of epoch {epoch} in the loader's order: each output is scored against another "
            f"sample's label, so the model trains on random labels",
            loc, step=a.next_step_number(e.seq),
            evidence={"loss": e["fn"], "batch": [e["loader"], epoch, index],
                      "target_field": e["field"], "rows": e["rows"], "permuted": "labels"},
            fix=("give the loss the labels in the loader's order, or apply one permutation to "
                 "inputs and labels together (perm = torch.randperm(len(x)); x, y = x[perm], y[perm])"))

    def _from_source(self, a):
        told = {e.loc.path for e in a.of_kind("batch_pairing")
                if e["problem"] in ("permuted", "labels-permuted") and e.loc is not None}
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            if path in told:
                continue  # the run's values said it already, at the model's call
            tree = a.source.tree(path)
            if tree is None:
                continue
            packs = any(isinstance(n, ast.Attribute) and n.attr == "pack_padded_sequence"
                        or isinstance(n, ast.Name) and n.id == "pack_padded_sequence"
                        for n in walk(tree))
            for line, perm, moved, kept in reordered_beside_kept(tree):
                names = ", ".join(f"`{n}`" for n in kept)
                both = ", ".join([*moved, *kept])
                yield self.finding(
                    f"this statement puts {', '.join(f'`{n}`' for n in moved)} in the order of "
                    f"`{perm}` and rebinds {names} beside it as it is: the rows that belonged "
                    f"together are now paired with other rows, so each score meets another "
                    f"sample's {kept[0]} and the loss trains on mismatched rows",
                    Location(path, line),
                    evidence={"permutation": perm, "left": list(kept), "reordered": list(moved)},
                    fix=(f"index every field with `{perm}`: {both} = "
                         + ", ".join(f"{n}[{perm}]" for n in [*moved, *kept])))
            for line, perm, left, loss_line, field in fields_reordered_apart(tree):
                order = f"the order of `{perm}`" if perm else "a random order drawn here"
                names = ", ".join(f"`{n}`" for n in left)
                yield self.finding(
                    f"this puts the batch's rows in {order}, but {names}, unpacked from the "
                    f"same batch, keep the old order, and the loss at line {loss_line} compares "
                    f"the model's output with `{field}`: each output is scored against another "
                    f"sample's target, so the model trains on mismatched labels",
                    Location(path, line),
                    related=(Related(Location(path, loss_line), f"the loss reading `{field}`"),),
                    evidence={"permutation": perm or None, "left": list(left), "loss_line": loss_line,
                              "target_field": field},
                    fix=(f"reorder {names} with the same indices in this statement"
                         + (f" ({field} = {field}[{perm}])" if perm else
                            " (draw `perm = torch.randperm(len(x))` once and index every field with it)")
                         + (", or pass enforce_sorted=False to pack_padded_sequence and leave the "
                            "batch in its order" if packs else "")))
            reported = set()
            for line, moved, left, paired in permuted_before_pairing(tree):
                if line in reported:
                    continue
                reported.add(line)
                yield self.finding(
                    f"this puts the rows of `{moved}` in a random order, but `{left}`, unpacked "
                    f"with it, keeps the old order, and line {paired} pairs them row by row: "
                    f"each input is trained towards another sample's label, so the model "
                    f"trains on random labels",
                    Location(path, line),
                    related=(Related(Location(path, paired), f"`{moved}` and `{left}` paired here"),),
                    evidence={"reordered": [moved], "left": [left], "paired_line": paired},
                    fix=(f"draw one permutation and index both with it: `perm = "
                         f"torch.randperm(len({moved}))` then `{moved}, {left} = {moved}[perm], "
                         f"{left}[perm]`"))
            for line, field, examples, order, ordered in collate_fields_apart(tree):
                names = ", ".join(f"`{n}`" for n in ordered)
                yield self.finding(
                    f"`{field}` is built from `{examples}` in its own order, while {names}, "
                    f"returned with it, is built from `{examples}` in the order of `{order}` "
                    f"(sorted for packing): row i of the batch's inputs and row i of `{field}` "
                    f"belong to different samples, so the model trains on mismatched labels",
                    Location(path, line),
                    evidence={"permutation": order, "left": [field], "ordered": list(ordered),
                              "examples": examples},
                    fix=(f"build `{field}` in the same order: iterate `for i in {order}` and read "
                         f"`{examples}[i]`, or sort `{examples}` itself once before building "
                         f"every field"))
