from __future__ import annotations

import re
from dataclasses import replace

from ..analysis.modes import evaluation_backward
from ..findings import Related, Severity
from .base import Rule, related

# words that name held-out data, as parts of a variable or function name (val_loader, testloader,
# evaluate, run_validation): "trainval" or "interval" are not among them
_HELD_OUT = re.compile(r"^(val|valid|validation|validate|test|testing|eval|evaluate|evaluation|dev|"
                       r"holdout)(loader|dl|set|data|dataloader|iter|batches)?$")


_TRAINING = re.compile(r"^(train|training|trn|fit|finetune)(loader|dl|set|data|dataloader|iter|batches|epoch|step|one|loop)?$")


def _parts(name: str) -> list[str]:
    return [part for part in re.split(r"_+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower())
            if part]


def _held_out(name: str | None) -> bool:
    """A name made of a held-out word and no training word (``train_and_evaluate`` holds
    both: it says nothing of one loop)."""
    if not name:
        return False
    parts = _parts(name)
    return (any(_HELD_OUT.match(part) for part in parts)
            and not any(_TRAINING.match(part) for part in parts))


def _training(name: str | None) -> bool:
    return bool(name) and any(_TRAINING.match(part) for part in _parts(name))


# words that name a set of rows, beside a training word: ``train_mask``, ``idx_train``
_ROWS = re.compile(r"^(mask|masks|idx|idxs|index|indices|ids|nodes|rows|split)$")


# words that name an order of all rows, not a subset: ``Y[order]`` sorts them for a plot
_ORDER = re.compile(r"^(order|ordering|perm|permutation|sort|sorted|argsort|rank|ranks|shuffle|shuffled)$")


def _evaluation_selection(index_names: list[str], no_grad: bool, function: str | None) -> bool:
    """Whether a selection of rows reads evaluation rows: its index is named for held-out data
    (``test_mask``, ``idx_val``), or, named neither way (``mask``, ``te``) nor for an order of
    the rows, it runs under no_grad or in a function named for evaluation (not one named for
    training)."""
    last = [name.rsplit(".", 1)[-1] for name in index_names]
    if any(_held_out(name) for name in last):
        return True
    if any(_training(name) or any(_ORDER.match(part) for part in _parts(name)) for name in last):
        return False
    return _held_out(function) or (no_grad and not _training(function))


def _training_rows(names: list[str], index: str) -> str:
    """The script's own name for its training rows (``data.train_mask`` beside
    ``data.test_mask``), or a generic one shaped like the evaluation index."""
    prefix = index.rsplit(".", 1)[0] + "." if "." in index else ""
    fitting = [name for name in names
               if _training(name.rsplit(".", 1)[-1])
               and any(_ROWS.match(part) for part in _parts(name.rsplit(".", 1)[-1]))]
    fitting.sort(key=lambda name: (not name.startswith(prefix) if prefix else "." in name, name))
    if fitting:
        return fitting[0]
    return prefix + ("train_mask" if "mask" in index.lower() else "train_idx")


class TrainsOnEvaluationData(Rule):
    """
    ## What it does
    Finds optimizer steps that apply gradients computed on batches of a DataLoader the script
    uses for evaluation: its loop iterates a loader named for held-out data (`val_loader`,
    `test_dl`, `self.valid_loader`) or runs in a function named for evaluation (`validate`,
    `evaluate`, `test_epoch`), while another DataLoader feeds the training steps. Read from the
    trace (each backward's batch and each loader's loop line) and the loop's source.

    Also finds a full-batch training loss over every row of a label tensor whose rows the
    script evaluates on: a GCN trained with `F.cross_entropy(out, y)` over all N nodes and
    scored on `y[test_mask]`, a regression trained on `model(X)` against `Y` and scored on
    `Y[test_idx]`. Read from the trace (a loss whose target is the same N-row tensor at every
    call and whose prediction has those N rows with no index or mask between the model and the
    loss) and the script's source (a selection of that tensor's rows by an index named for
    held-out data, or under `no_grad` or in a function named for evaluation, and not named for
    training).

    Also finds a held-out loader whose samples the training loader serves as well: two
    `random_split` calls with different generators, validation indices taken from the
    training indices, overlapping `Subset`s or `SubsetRandomSampler`s. Read from the trace
    (each DataLoader's rows of the dataset under its Subsets and sampler, at its first
    `iter()`; the loader whose batches the model was trained on last before each evaluation
    epoch) and the names of the evaluation loop or loader; reported at the line that made the
    held-out subset. Two datasets of their own (tensors indexed apart: `x[train_idx]`,
    `x[val_idx]`) are compared by value: input rows of many distinct values found in both are
    copies of the same samples, reported at the slice that made the held-out index when one
    held-out and one training slice of the same sequence overlap (`perm[:256]`,
    `perm[192:]`), else at the held-out loader.

    ## Why is this bad?
    A validation loop copied from the training loop keeps its `loss.backward()` and
    `optimizer.step()`: the model trains on the data it is evaluated on. The validation loss
    goes down with it and stops measuring generalisation — early stopping, model selection and
    the reported score all read a number the model was fitted to.

    ## Example
    ```python
    for x, y in val_loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        val_loss += loss.item()
    ```

    ```python
    out = model(x, adj)                     # all N nodes
    loss = F.cross_entropy(out, y)          # the test nodes' labels are in the loss
    ...
    acc = (out[test_mask].argmax(1) == y[test_mask]).float().mean()
    ```

    ```python
    train_set, _ = random_split(data, [800, 200], generator=torch.Generator().manual_seed(0))
    _, val_set = random_split(data, [800, 200], generator=torch.Generator().manual_seed(1))
    ```

    ## Use instead
    ```python
    model.eval()
    with torch.no_grad():
        for x, y in val_loader:
            val_loss += criterion(model(x), y).item()
    model.train()
    ```

    ```python
    loss = F.cross_entropy(out[train_mask], y[train_mask])
    ```

    ```python
    train_set, val_set = random_split(data, [800, 200], generator=torch.Generator().manual_seed(0))
    ```

    ## Stays silent on
    Evaluation loops without a step, a backward in an evaluation loop whose gradients are
    cleared before any step (saliency maps, Grad-CAM), loaders named otherwise (`trainval`,
    `finetune`, a meta-learning task's query set), and a script whose only training data is the
    held-out loader (test-time adaptation). For full-batch losses: a loss indexed with the
    training rows (`out[train_mask]`, or a model run on `X[train_idx]` against
    `Y[train_idx]`); terms over all rows that read no labels (an entropy or a reconstruction of
    the input, a graph autoencoder's links); a held-out set in tensors of its own; k-fold
    splits that index each fold's training rows; selections named for training
    (`y[train_mask]` for a training accuracy). For shared rows: k-fold cross-validation (each
    fold's validation rows are disjoint from that fold's training rows), a validation set of
    the same dataset with disjoint indices, a pass over the training rows named for training
    (`train_eval_loader`, also over a copy of those rows), or whose every row is a copy of a
    training row (a few training images evaluated one at a time); rows of a few values (a table of
    categories, blank images), where equal rows need not be the same sample, and fewer than 3
    copied rows or 5% of the smaller set.
    """

    code = "GD256"
    slug = "trains-on-evaluation-data"
    severity = Severity.WARNING
    summary = ("an optimizer steps on gradients from batches of the validation/test DataLoader, or "
               "from a full-batch loss over the rows the script evaluates on, or the held-out "
               "loader serves rows the training loader serves too: the model trains on the data "
               "it is evaluated on")
    fix = ("remove backward() and optimizer.step() from the evaluation loop, and run it under "
           "torch.no_grad() with model.eval() (model.train() after it)")

    def check(self, a):
        yield from self._full_batch(a)
        yield from self._loaders(a)
        yield from self._shared_rows(a)

    def _applied(self, a) -> list:
        """``[(backward, step)]`` of DataLoader batches a step applied, in backward order."""
        by_seq = {s.seq: s for s in a.steps}
        pairs = []
        for step_seq, backwards in a.ledger.windows.items():
            step = by_seq.get(step_seq)
            if step is None or step.get("skipped"):
                continue
            for b in backwards:
                batch = b.get("batch")
                if type(batch) is list and len(batch) == 3:
                    pairs.append((b, step))
        pairs.sort(key=lambda pair: pair[0].seq)
        return pairs

    def _shared_rows(self, a):
        """A held-out loader whose rows the loader training the model at its evaluation also
        serves: two random_splits with different seeds, validation indices taken from the
        training indices."""
        rows = {e.get("loader"): e for e in a.of_kind("loader_rows")}
        shared: dict[frozenset, int] = {}
        copies: set[frozenset] = set()  # pairs over two datasets holding copies of the same rows
        for e in rows.values():
            for other, count in e.get("shared") or ():
                shared[frozenset((e.get("loader"), other))] = count
            for other, count in e.get("copied") or ():
                pair = frozenset((e.get("loader"), other))
                if pair not in shared:
                    shared[pair] = count
                    copies.add(pair)
        if not shared:
            return
        applied = self._applied(a)
        trained = {b.get("batch")[0] for b, _ in applied}
        epochs: dict[int, list] = {}
        for e in a.by_kind.get("epoch_start", ()):
            epochs.setdefault(e.get("loader"), []).append(e)
        for loader, starts in epochs.items():
            if loader in trained or not any(loader in pair for pair in shared):
                continue
            what = self._held_out_loader(a, starts[0], rows.get(loader))
            if what is None:
                continue
            for start in starts:  # the loader that trains the model when it is evaluated
                before = [b for b, _ in applied if b.seq < start.seq]
                if not before:
                    continue
                training = before[-1].get("batch")[0]
                count = shared.get(frozenset((loader, training)))
                if not count or training == loader:
                    continue
                made = rows.get(loader) or rows.get(training)
                if made is None or made.loc is None:
                    continue
                total = rows[loader].get("rows") if loader in rows else None
                if frozenset((loader, training)) in copies and (not total or count >= total):
                    continue  # every sample a copy of a training row: a pass over (part of)
                    # the training data on purpose, no split gone wrong
                of = f" of the {total}" if total else ""
                how = ("copies of rows the training loader serves (the same input values in "
                       "both datasets: the split's index sets overlap)"
                       if frozenset((loader, training)) in copies else
                       "also rows the training loader serves (the same dataset, through "
                       "overlapping Subsets or samplers)")
                where, fix = made.loc, None
                if frozenset((loader, training)) in copies and made.loc.path:
                    split = _overlapping_split(a, made.loc.path)
                    if split is not None:
                        line, held, held_text, train, train_text = split
                        where = replace(made.loc, line=line)
                        how += f" — `{held} = {held_text}` overlaps `{train} = {train_text}`"
                        fix = (f"make the two slices of the split disjoint: the held-out part "
                               f"must start where `{train_text}` ends")
                yield self.finding(
                    f"{count}{of} samples of {what} are {how}: the model is "
                    f"evaluated on samples it trains on, so the validation score overstates "
                    f"how it generalises",
                    where,
                    related=(related(starts[0], "the evaluation loop"),
                             related(before[-1], "a backward on the training rows")),
                    fix=fix or ("split the dataset once into disjoint parts (one random_split call, or "
                                "index lists with no row in common) and take the training and the "
                                "validation set from that one split"),
                    evidence={"loader": loader, "training_loader": training, "shared": count,
                              "copies": frozenset((loader, training)) in copies})
                break

    def _held_out_loader(self, a, loop, rows_event) -> str | None:
        """What names a loader as held-out data (its loop's iterable, the function the loop is
        in, or the name the DataLoader is assigned to), None when none does or a training
        name does (``train_eval_loader``)."""
        made_name = None
        made = rows_event.get("made") if rows_event is not None else None
        if made:
            assigned = a.source.assigned_name(made[0], made[1])
            made_name = assigned.rsplit(".", 1)[-1] if assigned else None
        if _training(made_name):
            return None
        names = a.source.loop_names(loop.loc.path, loop.loc.line) if loop.loc is not None else None
        iterable, function = names if names is not None else (None, None)
        if _training(iterable):
            return None
        if _held_out(iterable):
            return f"`{iterable}`"
        if _held_out(made_name):
            return f"`{made_name}`"
        if _held_out(function):
            return f"the loader {function}() reads"
        return None

    def _full_batch(self, a):
        """Full-batch losses over every row of a label tensor the script evaluates rows of."""
        steps = [s for s in a.steps if not s.get("skipped")]
        for e in a.of_kind("full_rows_loss"):
            if e.loc is None or not any(s.seq > e.seq for s in steps):
                continue
            found = a.source.loss_row_selections(e.loc.path, e.loc.line)
            if found is None:
                continue
            evaluated = [(line, text, index) for line, text, index, names, no_grad, function
                         in found["selections"] if _evaluation_selection(names, no_grad, function)]
            if not evaluated:
                continue
            line, text, index = evaluated[0]
            target, prediction = found["target"], found["prediction"]
            rows = _training_rows(found["names"], index)
            call = found["call"] + ("(" if found["call"] else "")
            more = ", ..." if found["more"] else ""
            written = found["written"]
            labels = target + f"[{rows}]" + (written[len(target):] if written.startswith(target) else "")
            fix = (f"index the loss with the training rows: {call}{prediction}[{rows}], "
                   f"{labels}{more})" if call else
                   f"index the loss with the training rows: {prediction}[{rows}] and {labels}")
            yield self.finding(
                f"this {e.get('fn')} trains on all {e.get('rows')} rows of `{target}`, and the script "
                f"evaluates on rows of that same tensor (`{text}`, line {line}): the evaluation "
                f"rows' labels are in the training loss, so the model is fitted to the labels it "
                f"is scored on",
                e.loc,
                related=(Related(replace(e.loc, line=line, function="", via="", hook=""),
                                 "the evaluation's selection of those rows"),),
                fix=fix,
                evidence={"rows": e.get("rows"), "target": target, "selection": text})

    def _loaders(self, a):
        loops: dict[int, object] = {}  # loader -> its first epoch_start (the loop's line)
        for e in a.by_kind.get("epoch_start", ()):
            loops.setdefault(e.get("loader"), e)
        held_out: dict[int, tuple] = {}  # loader -> (what names it, the loop's event)
        for loader, e in loops.items():
            if e.loc is None:
                continue
            names = a.source.loop_names(e.loc.path, e.loc.line)
            if names is None:
                continue
            iterable, function = names
            if _held_out(iterable):
                held_out[loader] = (f"the batches of `{iterable}`", e)
            elif not _training(iterable) and _held_out(function):
                held_out[loader] = (f"the batches that {function}()'s loop reads", e)
        if not held_out:
            return
        applied: dict[int, list] = {}  # loader -> [(backward, step)] applied by a step
        by_seq = {s.seq: s for s in a.steps}
        for step_seq, backwards in a.ledger.windows.items():
            step = by_seq.get(step_seq)
            if step is None or step.get("skipped"):
                continue
            for b in backwards:
                batch = b.get("batch")
                if type(batch) is list and len(batch) == 3:
                    applied.setdefault(batch[0], []).append((b, step))
        # a backward of an eval-mode pass whose gradients leak into the next update is
        # backward-in-evaluation's finding (the same data trained on, told by the modes)
        leaking = {found.backward.seq for f in a.modes.forwards
                   if (found := evaluation_backward(a, f)) is not None}
        applied = {loader: [(b, s) for b, s in pairs if b.seq not in leaking]
                   for loader, pairs in applied.items()}
        trained_elsewhere = any(pairs and loader not in held_out for loader, pairs in applied.items())
        if not trained_elsewhere:
            return  # the held-out loader is the only training data: adaptation at test time
        for loader, (what, loop) in held_out.items():
            found = applied.get(loader)
            if not found:
                continue
            backward, step = found[0]
            n = a.count(b for b, _ in found)
            yield self.finding(
                f"{a.optimizer_name(step.get('opt'))} steps on gradients computed from {what} "
                f"({n} backward{'s' if n != 1 else ''} applied): the loop that reads held-out "
                f"data trains the model on it, so its loss stops measuring generalisation",
                backward.loc,
                related=(related(loop, "the evaluation loop"),
                         related(step, "the step that applies them")),
                step=a.step_number.get(step.seq),
                evidence={"loader": loader, "backwards": n})


def _overlapping_split(a, path):
    """``(line, held-out name, its slice, training name, its slice)``: the first pair of slices
    of one sequence, a held-out name's and a training name's, whose rows overlap
    (``train_idx, val_idx = perm[:256], perm[192:]``; the inputs' split where the labels are
    sliced alike below it); None when there is none or the pairs slice at different bounds."""
    pairs = []
    for line, name, text, other, other_text in a.source.split_slices(path):
        if _held_out(name) and _training(other):
            pairs.append((line, name, text, other, other_text))
        elif _held_out(other) and _training(name):
            pairs.append((line, other, other_text, name, text))
    if not pairs or len({(p[2].split("[", 1)[-1], p[4].split("[", 1)[-1]) for p in pairs}) != 1:
        return None
    return min(pairs)
