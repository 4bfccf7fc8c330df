from __future__ import annotations

import ast

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_LOOKUPS = {"EmbeddingBackward0", "EmbeddingDenseBackward0", "IndexBackward0", "IndexSelectBackward0",
            "GatherBackward0", "EmbeddingBagBackward0"}
_SIMILARITY = {"concatenation", "stack", "matrix product", "product", "dot product", "cdist"}
# calls whose repeated arguments are sizes or shapes, not two views of data
_SHAPED = {"zeros", "ones", "empty", "full", "rand", "randn", "randint", "eye", "arange", "view",
           "reshape", "expand", "repeat", "permute", "transpose", "new_zeros", "new_ones", "new_empty",
           "new_full", "tile", "Linear", "Embedding", "range", "max", "min", "print", "isinstance",
           "format", "sum", "zip", "dict", "list", "tuple", "setattr", "getattr", "range", "len"}


def _called_names(tree: ast.AST) -> dict[str, list[int]]:
    """name -> the lines where the name is a call's callee or one of its positional arguments."""
    used: dict[str, list[int]] = {}
    for node in walk(tree):
        if isinstance(node, ast.Call):
            for n in [node.func, *node.args]:
                if isinstance(n, ast.Name):
                    used.setdefault(n.id, []).append(node.lineno)
    return used


def _shaped(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in _SHAPED


def _uncopied(value: ast.AST) -> ast.AST:
    """``a`` for ``a.clone()``, ``a.detach()``, ``a.clone().detach()`` (the same values)."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and value.func.attr in ("clone", "detach", "contiguous") and not value.args:
        value = value.func.value
    return value


def _attention(call: ast.Call) -> bool:
    """Self-attention's ``attn(x, x, x)``: one input as query, key and value on purpose."""
    func = call.func
    name = (func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else "").lower()
    dumps = {ast.dump(a) for a in call.args}
    return "att" in name or (len(call.args) >= 3 and len(dumps) == 1)


def _constructed(node: ast.AST) -> bool:
    """A class constructed in place (``nn.ReLU()``, ``nn.Dropout(0.1)``): each call makes a new
    object, so the same text twice (``nn.Sequential(lin, nn.ReLU(), lin2, nn.ReLU())``) is two
    layers, not one value compared with itself."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name[:1].isupper()


def _data_like(node: ast.AST) -> bool:
    """An argument that can be a view of data: a name, a call, a subscript (not a constant)."""
    return isinstance(node, (ast.Name, ast.Call, ast.Subscript, ast.Attribute)) and not (
        isinstance(node, ast.Call) and (_shaped(node) or _constant_call(node))) and not _constructed(node)


_COPY_NOTE = "the second time as"  # how same_lines tells a prediction given with its own copy


def _constant_call(call: ast.Call) -> bool:
    """A call of literals only (``torch.linspace(0, 1, 32)``, ``torch.arange(10)``): the same
    grid or range made twice (``meshgrid(r, r)``) is no value compared with itself."""
    values = [*call.args, *(k.value for k in call.keywords)]
    return bool(values) and all(isinstance(v, ast.Constant) or (
        isinstance(v, ast.UnaryOp) and isinstance(v.operand, ast.Constant)) for v in values)


def same_lines(tree: ast.AST) -> list[tuple[int, str]]:
    """The statements that can make two sides of a comparison one value, ``[(line, what)]``:

    * an alias ``b = a`` (or ``a.clone()``, ``a.detach()``) of two plain names that are both
      called or passed to a call later (``v2 = v1``, ``neg = pos``, ``teacher = student``);
    * a tuple assignment whose targets get one expression twice (``u, i, j = b[:, 0], b[:, 1],
      b[:, 1]``; ``ea, ep, en = net(a), net(p), net(p)``);
    * a call given one argument expression twice (``model(x1, x1)``, ``crit(net(a), net(a), net(n))``,
      ``torch.cat([enc(v), enc(v)])``), shapes and sizes apart (``torch.zeros(n, n)``);
    * one call on both sides of a difference or product (``self.user(u) * self.user(u)``)."""
    found: list[tuple[int, str]] = []
    called = _called_names(tree)
    for node in walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            value = _uncopied(value)
            if isinstance(target, ast.Name) and isinstance(value, ast.Name) and target.id != value.id:
                later = lambda name: any(line > node.lineno for line in called.get(name, ()))  # noqa: E731
                if later(target.id) and later(value.id):
                    found.append((node.lineno, ast.unparse(node)))
            elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                    and len(target.elts) == len(value.elts) and all(isinstance(t, ast.Name) for t in target.elts):
                dumps = [ast.dump(v) for v in value.elts]
                for i in range(len(dumps)):
                    j = next((j for j in range(i + 1, len(dumps)) if dumps[j] == dumps[i]), None)
                    if j is not None and _data_like(value.elts[i]):
                        found.append((node.lineno, f"{target.elts[i].id} and {target.elts[j].id} get "
                                                   f"{ast.unparse(value.elts[i])} both"))
                        break
        elif isinstance(node, ast.Call) and not _shaped(node) and not _attention(node):
            args = list(node.args)
            if len(args) == 1 and isinstance(args[0], (ast.List, ast.Tuple)):
                args = list(args[0].elts)  # torch.cat([a, a])
            dumps = [ast.dump(a) for a in args]
            twice = next((a for i, a in enumerate(args) if _data_like(a) and dumps[i] in dumps[i + 1:]), None)
            if twice is not None:
                found.append((node.lineno, f"{ast.unparse(twice)} is passed twice to "
                                           f"{ast.unparse(node)}"))
            elif len(args) >= 2 and _data_like(args[0]) and _uncopied(args[1]) is not args[1] \
                    and ast.dump(_uncopied(args[1])) == dumps[0]:
                # a loss given a prediction and its own detached copy as the target
                # (``mse_loss(f, f.detach())``)
                found.append((node.lineno, f"{ast.unparse(args[0])} is passed twice ({_COPY_NOTE} "
                                           f"{ast.unparse(args[1])})"))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Sub, ast.Mult, ast.MatMult)) \
                and isinstance(node.left, ast.Call) and _data_like(node.left) \
                and ast.dump(node.left) == ast.dump(node.right):
            found.append((node.lineno, f"{ast.unparse(node.left)} is on both sides"))  # f(x) * f(x)
    return sorted(set(found))


def _owner(a, pids) -> str:
    """The module the parameters share (`enc`), else their names."""
    names = [a.param_name(p).split(".") for p in dict.fromkeys(pids)]
    prefix = []
    for parts in zip(*(n[:-1] for n in names)):
        if len(set(parts)) != 1:
            break
        prefix.append(parts[0])
    return f"`{'.'.join(prefix)}`" if prefix else a.names(pids)


def own_draw(tree: ast.AST, line: int) -> str | None:
    """For an alias ``b = a`` at ``line`` whose ``a`` was assigned a call before (``a = f(x)``):
    ``b = f(x)``, the draw of its own that ``b`` should get."""
    alias = next((n for n in walk(tree) if isinstance(n, ast.Assign) and n.lineno == line
                  and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)), None)
    source = _uncopied(alias.value) if alias is not None else None
    if not isinstance(source, ast.Name):
        return None
    made = [n for n in walk(tree) if isinstance(n, ast.Assign) and n.lineno < line and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name) and n.targets[0].id == source.id]
    if not made:
        return None
    value = max(made, key=lambda n: n.lineno).value
    return f"{alias.targets[0].id} = {ast.unparse(value)}" if isinstance(value, ast.Call) else None


def _own_function_call(tree: ast.AST | None, text: str) -> str | None:
    """For a ``same_lines`` text ``x is passed twice to f(x, x)`` whose ``f`` is a function the
    script defines (a hand-written MMD, CORAL or distance, not a model or torch's call): ``f``."""
    if tree is None or " is passed twice to " not in text:
        return None
    try:
        call = ast.parse(text.split(" is passed twice to ", 1)[1], mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        return None
    name = call.func.id
    defined = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
                  for n in walk(tree))
    return name if defined else None


class LossComparesWithItself(Rule):
    """
    ## What it does
    Finds a loss that compares a value with itself: a contrastive loss whose two views are the
    same view (`v2 = v1`, an augmentation without randomness), a BPR or triplet loss whose
    negatives (or positives) are the anchors' own partners (`neg = pos`), a Siamese network fed
    one input on both branches, a consistency or distillation term whose second pass or
    "teacher" is the student itself (`teacher = student`, the same model called twice on the same
    input without dropout). At the first backwards, the loss's graph is read for two nodes that
    computed the same values from the same inputs and parameters, to the last bit (a module
    called twice on identical inputs, two lookups of the same rows of an embedding), meeting in
    an op that compares them (a difference, a product or similarity matrix, a concatenation that
    one is built from, a loss function), each side a function of its twin alone; or for a loss
    function (`mse_loss`, `l1_loss`, `gaussian_nll_loss`, `kl_div`, soft `cross_entropy`...)
    whose target, computed without gradient, equals its input at two optimizer steps. It points at the line that made the two
    sides one (`v2 = v1`, `neg = pos`, `teacher = student`, an argument passed twice) when the
    script has exactly one such line, else at the backward; a layer constructed twice in place
    (`nn.Sequential(..., nn.ReLU(), ..., nn.ReLU())`) is two objects and no such line. A
    distribution-matching term the script writes itself (a domain adaptation's MMD or CORAL, a
    feature-statistics distance) given one domain's features twice, `coral(fs, fs)`, is named
    as such: the term is 0 whatever the features, and the domains are never aligned.

    ## Why is this bad?
    These losses learn from the difference between their two sides. With both sides the same
    value, a difference is exactly 0: a BPR loss is the constant log 2 and the gradients of the
    positive and the negative item cancel; a triplet's anchor-positive distance is 0, a
    distillation or consistency term is 0 with a zero gradient. A contrastive loss whose
    positive pair is a sample with itself is solved by any encoder, so the invariance the
    augmentations should teach is never learned. Nothing fails; the loss just trains the wrong
    thing or nothing.

    ## Example
    ```python
    v1 = aug(x)
    v2 = v1
    z = F.normalize(torch.cat([enc(v1), enc(v2)]), dim=1)
    ```

    ## Use instead
    ```python
    v1, v2 = aug(x), aug(x)  # two independent random augmentations
    z = F.normalize(torch.cat([enc(v1), enc(v2)]), dim=1)
    ```

    ## Stays silent on
    Two passes that differ: dropout in train mode (SimCSE, R-Drop), two random augmentations,
    sampled negatives that equal a positive in a few rows, triplets with a few anchor ==
    positive rows; a model called twice whose outputs meet only in a sum of separate terms
    (`ce(model(x), y) + 1e-3 * model(x).pow(2).mean()`), or in an entropy `p * log p`; the k3
    estimator of a KL to a frozen reference `exp(ref - logp) - (ref - logp) - 1` (GRPO); a frozen
    teacher that is another model; a copied or EMA teacher (equal to the student before the
    first step only); a model evaluated twice under `no_grad`; a product of one value with itself
    inside the model (shared-QK attention `q @ k.T` with `k` the same projection of the same
    input, a Gram matrix), whose result reaches the loss only through further layers; a stack or
    concatenation of equal outputs that no product of rows follows (REINFORCE on a bandit whose
    state never changes: the log-probabilities of each step are stacked, weighted by returns and
    summed); an MMD written with kernel matrices of each side with itself (`k(x, x).mean() +
    k(y, y).mean() - 2 * k(x, y).mean()`), which compares two domains.
    A penalty pulling parameters to an anchor that aliases them is `anchor-aliases-params`'s
    (it points at the anchor).
    """

    code = "GD264"
    slug = "loss-compares-with-itself"
    severity = Severity.WARNING
    summary = ("a contrastive, ranking, triplet or distillation loss compares a value with itself "
               "(identical views, negatives equal to the positives, a teacher that is the student)")
    fix = ("make the two sides differ: two independent random augmentations, negatives sampled "
           "apart from the positives, a teacher that is another model (copy.deepcopy(student))")

    def check(self, a):
        stepped = {pid for pids in a.opt_params.values() for pid in pids}
        # parameters compared with an anchor that aliases them: anchor-aliases-params points at
        # the anchor, the line to change
        anchored = {pid for e in a.of_kind("anchor_alias") for pid in e.get("params") or ()}
        for e in a.of_kind("same_compared"):
            pids = [pid for pid in e.get("params") or () if pid in stepped]
            if not pids or set(pids) <= anchored:
                continue
            how, op, starts = e.get("how"), e.get("op") or "comparison", e.get("starts") or []
            if how == "repeated":
                continue  # a rollout restarted from its input: recurrence-never-carried's
            loc, text, draw, related = e.loc, None, None, []
            if loc is not None:
                tree = a.source.tree(loc.path)
                lines = same_lines(tree) if tree is not None else []
                copies = [ln for ln in lines if _COPY_NOTE in ln[1]]
                if how == "constant" and len(copies) == 1:
                    lines = copies  # a target that is the input's own detached copy, by the text
                if len(lines) == 1:
                    loc, text = Location(loc.path, lines[0][0], loc.function), lines[0][1]
                    draw = own_draw(tree, lines[0][0])
                elif how == "constant":
                    # the target is made on the loss's line (``kd(s, s.detach(), y)``) or above
                    # it, not on the backward's: point at the loss the backward runs
                    found = a.source.loss_assignment(loc.path, loc.line)
                    if found is not None:
                        related = [Related(loc, "the backward of that loss")]
                        loc = Location(loc.path, found[0], loc.function)
            where = f" (`{text}`, here)" if text else ""
            names = _owner(a, pids)
            lookups = bool(starts) and all(s in _LOOKUPS for s in starts)
            made = (f"two lookups of the same rows of {names}" if lookups else
                    f"two calls of {names} on identical inputs")
            if text and text.endswith(" is on both sides"):
                call = text[: -len(" is on both sides")]
                message = (f"a {op} of a value with itself ({made}): `{call}` is on both sides, so "
                           f"each sample is compared with itself; one side was meant to be "
                           f"another input, model or view, which never enters the loss")
                fix = (f"put the intended second operand on one side of the {op} (another tower, "
                       f"input or view) instead of a second `{call}`")
            elif text and _own_function_call(tree, text) is not None:
                arg, call = text.split(" is passed twice to ", 1)
                message = (f"`{call}` is given `{arg}` as both of the values it compares (they meet "
                           f"in a {op}): the term measures `{arg}` against itself, so it "
                           f"is exactly its minimum with gradients that cancel, and what it should "
                           f"align or contrast with (another domain's, view's or model's output) "
                           f"never enters the loss")
                fix = (f"pass the other side as the second argument of `{_own_function_call(tree, text)}` "
                       f"(e.g. the target domain's features, the other view), not `{arg}` again")
            elif how == "constant":
                message = (f"the {op} term's target, computed without gradient, equals its input "
                           f"(made by {names}) at every step{where}: the teacher is the student "
                           f"itself (or a second pass on the same input), so the term is exactly "
                           f"its minimum with a zero gradient and distils nothing")
                fix = ("distil from another model: a trained teacher, or `teacher = "
                       "copy.deepcopy(student)` kept frozen or updated as an EMA; for a "
                       "consistency term, give the two passes different augmentations or dropout")
            elif op == "difference" and lookups:
                message = (f"a difference of two values that are equal to the last bit ({made})"
                           f"{where}: the score of each negative equals its positive's, so "
                           f"the difference is exactly 0, the loss is a constant and the gradients "
                           f"of the two sides cancel exactly: nothing is learned")
                fix = ("sample the negatives apart from the positives (" +
                       (f"`{draw}`, a draw of their own" if draw else
                        "e.g. `neg = torch.randint(0, n_items, pos.shape)`") +
                       ", redrawn where it equals the positive)")
            elif op == "difference":
                message = (f"a difference of two embeddings that are equal to the last bit ({made})"
                           f"{where}: their distance is exactly 0, so that part of the loss "
                           f"is a constant with gradients that cancel: the pair is never pulled "
                           f"together or pushed apart")
                fix = ("give each side its own input" + (f" (`{draw}`)" if draw else "") +
                       ": the positive (or the second branch, the negative) from another sample "
                       "or augmentation than the anchor")
            elif op in _SIMILARITY and lookups:
                # a pair scored from one table (link prediction, matrix factorisation): the two
                # sides were meant to be the pair's two ends, not augmented views
                message = (f"a {op} of two lookups of the same rows of {names}{where}: each "
                           f"pair is scored as a row with itself, so every pair, positive or "
                           f"negative, gets the score of one row against itself and the scorer "
                           f"learns nothing about which pairs belong together")
                fix = ("index the two sides with the pair's two ends (`z[edges[0]] * "
                       "z[edges[1]]`, a user's row and an item's row), not the same rows twice")
            elif op in _SIMILARITY:
                message = (f"a {op} of two views that are equal to the last bit ({made})"
                           f"{where}: every positive pair is a sample with itself, which "
                           f"any encoder matches trivially, so the invariance the two views should "
                           f"teach is never learned")
                fix = ("feed two independently augmented views: " +
                       (f"`{draw}`, a draw of its own," if draw else "`v1, v2 = aug(x), aug(x)`") +
                       " with an augmentation that draws random numbers (a fixed transform gives "
                       "the same view twice)")
            else:
                message = (f"the {op} compares two passes that are equal to the last bit ({made})"
                           f"{where}: the term is exactly its minimum and its "
                           f"gradients cancel, so the consistency or distillation does nothing")
                fix = ("make the two passes differ (dropout in train mode, two random "
                       "augmentations), or distil from another model")
            yield self.finding(message, loc, step=a.next_step_number(e.seq), related=related,
                               evidence={"how": how, "op": op, "params": pids[:16],
                                         "starts": list(starts)[:8]},
                               fix=fix)
