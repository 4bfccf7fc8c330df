from __future__ import annotations

import ast
import re

from ..analysis.source import scope_walk
from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

# names that say an operand of a mix is a label (or a loss of one), not an input
_LABEL_WORDS = ("y", "label", "target", "onehot", "one_hot", "soft", "cls")
_LOSS_WORDS = ("loss", "criterion", "crit", "entropy", "nll", "ce")
_FRESH = ("randperm", "permutation", "shuffle")
_ALIAS_DEPTH = 4


def _aliases(scope: ast.AST) -> dict[str, ast.AST | None]:
    """Each name the scope binds exactly once (``y_b = y[index]``; ``y_a, y_b = y, y[index]``)
    with its value; a name bound twice or by a loop or an augmented assignment maps to None."""
    bound: dict[str, list] = {}
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for arg in scope.args.posonlyargs + scope.args.args + scope.args.kwonlyargs:
            bound[arg.arg] = [None]
    for node in scope_walk(scope):
        pairs = []
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                        and len(target.elts) == len(node.value.elts):
                    pairs += list(zip(target.elts, node.value.elts))
                else:
                    pairs.append((target, node.value if isinstance(target, ast.Name) else None))
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.comprehension)):
            pairs.append((node.target, None))
        for target, value in pairs:
            for name in walk(target):
                if isinstance(name, ast.Name):
                    bound.setdefault(name.id, []).append(value if target is name else None)
    out = {}
    for name, values in bound.items():
        value = values[0] if len(values) == 1 else None
        if value is not None and any(isinstance(n, ast.Name) and n.id == name for n in walk(value)):
            value = None  # `x = lam * x + ...` rebinds a name the scope had before
        out[name] = value
    return out


def _module_call(node: ast.AST | None) -> bool:
    """A call of a model or a function of the script (``model(x)``, ``self.net(x)``): its result
    holds no rows of the batch in an order the scope chose."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return isinstance(func, ast.Name) or isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
        and func.value.id == "self"


def _resolve(node: ast.AST, aliases: dict, depth: int = 0) -> ast.AST:
    while isinstance(node, ast.Name) and depth < _ALIAS_DEPTH and aliases.get(node.id) is not None:
        node, depth = aliases[node.id], depth + 1
    return node


def _fresh_draw(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in _FRESH


def _partner(node: ast.AST, aliases: dict, depth: int = 0) -> str | None:
    """The permutation an operand reads its rows through: ``x[perm]``, ``x[perm, :]``,
    ``x.index_select(0, perm)``, ``x.flip(0)`` (a name or "flip"; an inline random permutation is
    a draw of its own, named by its position), looked for through the names the scope binds
    once; None for an operand read in its own order."""
    if depth > _ALIAS_DEPTH:
        return None
    if isinstance(node, ast.Name):
        value = aliases.get(node.id)
        return _partner(value, aliases, depth + 1) if value is not None and not _module_call(value) else None
    found = None
    for sub in walk(node):
        key = None
        if isinstance(sub, ast.Subscript) and not isinstance(sub.ctx, ast.Store):
            index = sub.slice.elts[0] if isinstance(sub.slice, ast.Tuple) and sub.slice.elts else sub.slice
            target = _resolve(index, aliases)
            if _fresh_draw(target):
                key = f"draw@{target.lineno}:{target.col_offset}"
            elif isinstance(index, ast.Name) and target is index:
                key = index.id  # a permutation handed in: told apart by its name only
        elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            if sub.func.attr == "flip" and len(sub.args) == 1 and isinstance(sub.args[0], ast.Constant) \
                    and sub.args[0].value == 0:
                key = "flip"
            elif sub.func.attr == "index_select" and len(sub.args) == 2 \
                    and isinstance(sub.args[0], ast.Constant) and sub.args[0].value == 0:
                target = _resolve(sub.args[1], aliases)
                key = f"draw@{target.lineno}:{target.col_offset}" if _fresh_draw(target) \
                    else ast.unparse(sub.args[1])
        elif isinstance(sub, ast.Name) and sub is not node and aliases.get(sub.id) is not None \
                and not _module_call(aliases[sub.id]):
            key = _partner(aliases[sub.id], aliases, depth + 1)
        if key is not None:
            if found is not None and found != key:
                return None  # two orders in one operand: not a mix of one batch
            found = key
    return found


def _complement(node: ast.AST) -> ast.AST | None:
    """``lam`` for ``1 - lam`` / ``1.0 - lam``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and isinstance(node.left, ast.Constant) \
            and node.left.value == 1:
        return node.right
    return None


def _product(node: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """``(weight, operand)`` readings of a product ``w * v`` (either order)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return [(node.left, node.right), (node.right, node.left)]
    return []


def _mixes(scope: ast.AST, aliases: dict) -> list[dict]:
    """The convex mixes ``w * A + (1 - w) * B`` of the scope where one operand reads the batch's
    rows through a permutation and the other in their own order: the weight's text, which weight
    the permuted operand gets ("w" or "1-w"), the permutation, the operands' texts."""
    out = []
    for node in scope_walk(scope):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)):
            continue
        for wl, left in _product(node.left):
            for wr, right in _product(node.right):
                lam, first_weight = None, None
                if _complement(wr) is not None and ast.dump(_complement(wr)) == ast.dump(wl):
                    lam, first_weight = wl, "w"
                elif _complement(wl) is not None and ast.dump(_complement(wl)) == ast.dump(wr):
                    lam, first_weight = wr, "1-w"
                if lam is None or isinstance(lam, ast.Constant):
                    continue
                pl, pr = _partner(left, aliases), _partner(right, aliases)
                if (pl is None) == (pr is None):
                    continue
                if pl is not None:
                    permuted_weight, perm = first_weight, pl
                else:
                    permuted_weight, perm = ("1-w" if first_weight == "w" else "w"), pr
                out.append({"line": node.lineno, "lam": ast.unparse(lam), "weight": permuted_weight,
                            "perm": perm, "text": ast.unparse(node),
                            "operands": (ast.unparse(left), ast.unparse(right),
                                         ast.unparse(_resolve(left, aliases)),
                                         ast.unparse(_resolve(right, aliases)))})
    return out


def _is_label_mix(mix: dict) -> bool:
    words = set()
    for text in mix["operands"]:
        lowered = text.lower()
        if any(w in lowered for w in _LOSS_WORDS) and "(" in lowered:
            return True
        for token in walk(ast.parse(text, mode="eval")):
            if isinstance(token, ast.Name):
                words.add(token.id.lower())
            elif isinstance(token, ast.Attribute):
                words.add(token.attr.lower())
    return any(w == word or re.match(rf"^{word}(_|\d|h$|$)", w) or w.endswith("_" + word)
               or word in w and len(word) > 2 for w in words for word in _LABEL_WORDS)


def mismatched_mixes(tree: ast.AST) -> list[tuple[int, str, str, int, str]]:
    """``[(label mix's line, its text, the fault, the input mix's line, its text)]`` for each
    scope mixing a batch's inputs and its labels (or their losses) with one weight where the
    labels' permuted operand gets the other weight than the inputs' (fault "weights") or reads
    another permutation (fault "partner")."""
    scopes = [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = []
    for scope in scopes:
        aliases = _aliases(scope)
        mixes = _mixes(scope, aliases)
        inputs = [m for m in mixes if not _is_label_mix(m)]
        labels = [m for m in mixes if _is_label_mix(m)]
        for label in labels:
            same = [m for m in inputs if m["lam"] == label["lam"]]
            if not same:
                continue
            if any(m["weight"] == label["weight"] and m["perm"] == label["perm"] for m in same):
                continue
            ref = same[0]
            if ref["perm"] != label["perm"]:
                known = ("draw@", "flip")
                if not (ref["perm"].startswith(known) and label["perm"].startswith(known)):
                    continue  # a permutation the scope does not draw may be the same order
                fault = "partner"
            else:
                fault = "weights"
            found.append((label["line"], label["text"], fault, ref["line"], ref["text"]))
    return sorted(set(found))


class MixupLabelsMismatched(Rule):
    """
    ## What it does
    Finds mixup whose labels are mixed otherwise than its inputs: in one function, the inputs
    are mixed as `lam * x + (1 - lam) * x[perm]` and the labels (mixed one-hot targets, or the
    two-term loss `lam * criterion(out, y_a) + (1 - lam) * criterion(out, y_b)`) with the same
    weight `lam`, but the partner's labels get `lam` where its inputs get `1 - lam` (the weights
    swapped), or they are read through another permutation than the inputs' (a second
    `randperm`, `flip(0)` against `randperm`). Read from the script's source, in the files whose
    backwards ran; it points at the labels' mix.

    ## Why is this bad?
    A mixed input is `lam` of one sample and `1 - lam` of its partner, and its target must say
    the same. With the weights swapped, an image that is 80% a cat is trained as 80% the
    partner's class; with another permutation, the target names a third sample that is nowhere
    in the image. Either is label noise at the rate of the mix: accuracy falls below plain
    training, and nothing fails.

    ## Example
    ```python
    index = torch.randperm(x.size(0))
    x = lam * x + (1 - lam) * x[index]
    y_mix = (1 - lam) * y_onehot + lam * y_onehot[index]      # weights swapped
    ```

    ## Use instead
    ```python
    x = lam * x + (1 - lam) * x[index]
    y_mix = lam * y_onehot + (1 - lam) * y_onehot[index]
    ```

    ## Stays silent on
    Labels mixed as the inputs (`y_a, y_b = y, y[index]` and the two-term loss included);
    timm's batch mode through `flip(0)` on both sides; the mix's operands written in either
    order; inputs and labels mixed in different functions, or with different weights' names
    (not compared); mixes of two separate batches (no permutation: not judged).
    """

    code = "GD379"
    slug = "mixup-labels-mismatched"
    severity = Severity.WARNING
    summary = ("mixup mixes the labels with other weights or another partner than the inputs: "
               "each target describes a different mix than its input")
    fix = ("mix the labels exactly as the inputs: the same permutation, and the partner's labels "
           "weighted 1 - lam where its inputs are")

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, fault, input_line, input_text in mismatched_mixes(tree):
                if fault == "weights":
                    why = ("the partner samples' labels get the weight their inputs do not: the "
                           "weights are swapped, so each target names mostly the sample that is "
                           "the lesser part of its input")
                    fix = "swap the two weights of the labels' mix so that they follow the inputs'"
                else:
                    why = ("the labels' partner is read through another permutation than the "
                           "inputs': each target names a sample that is not in its input")
                    fix = "mix the labels through the same permutation the inputs were mixed with"
                yield self.finding(
                    f"the inputs are mixed as `{input_text}` (line {input_line}) but the labels as "
                    f"`{text}`: {why}",
                    Location(path, line), evidence={"labels": text, "inputs": input_text,
                                                    "inputs_line": input_line, "fault": fault},
                    fix=fix)
