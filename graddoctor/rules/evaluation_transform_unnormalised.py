from __future__ import annotations

import ast
import re

from ..analysis.source import scope_walk
from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_TRAIN = re.compile(r"(^|_)train(ing)?($|_)", re.I)
_EVAL = re.compile(r"(^|_)(eval|evaluation|test|val|valid|validation|inference)($|_)", re.I)
_PIPELINE = re.compile(r"(^|_)(transforms?|tfms?|tf|aug|augment|preprocess|pipeline)($|_)", re.I)


def _definitions(tree: ast.AST) -> dict[str, ast.AST]:
    """The module's functions and the names it assigns once at its top level, by name."""
    out: dict[str, list] = {}
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out.setdefault(node.targets[0].id, []).append(node.value)
    return {name: nodes[0] for name, nodes in out.items() if len(nodes) == 1}


def _normalises(node: ast.AST, defs: dict | None = None, depth: int = 0) -> bool:
    """Whether ``node`` standardises: a ``Normalize(...)`` (torchvision, albumentations,
    kornia), ``F.normalize(img, mean, std)``, or ``(x - mean) / std`` with the centre and the
    scale named (or attributes), also as methods or functions (``x.sub(mean).div(std)``,
    ``torch.div(torch.sub(x, mean), std)``); or a name of the module (``defs``) that does (a helper
    ``normalize(img)`` the pipeline calls, ``norm = T.Normalize(MEAN, STD)`` in its list)."""
    for sub in walk(node):
        if defs and depth < 2 and isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) \
                and sub.id in defs and defs[sub.id] is not node \
                and _normalises(defs[sub.id], defs, depth + 1):
            return True
        if isinstance(sub, ast.Call):
            func = sub.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name == "Normalize" or name == "normalize" and len(sub.args) + len(sub.keywords) >= 3:
                return True
        division = _operands(sub, ast.Div, _DIVIDE)
        if division is not None:
            centred = _operands(division[0], ast.Sub, _SUBTRACT)
            if centred is not None and isinstance(centred[1], _NAMED) and isinstance(division[1], _NAMED):
                return True
    return False


_NAMED = (ast.Name, ast.Attribute, ast.Subscript)
_DIVIDE = ("div", "div_", "divide", "true_divide")
_SUBTRACT = ("sub", "sub_", "subtract")


def _operands(node: ast.AST, op: type, methods: tuple[str, ...]) -> tuple[ast.AST, ast.AST] | None:
    """``(left, right)`` of a subtraction or a division however it is written: the operator
    (``x - m``), the tensor method (``x.sub(m)``, ``x.div_(s)``) or the function
    (``torch.sub(x, m)``)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, op):
        return node.left, node.right
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in methods:
        base = node.func.value
        if isinstance(base, ast.Name) and base.id == "torch":
            return (node.args[0], node.args[1]) if len(node.args) >= 2 else None
        return (base, node.args[0]) if len(node.args) == 1 else None
    return None


def _pipelines(tree: ast.AST) -> list[tuple[str, int, ast.AST, str]]:
    """``(name, line, node, "function" | "value")`` for each preprocessing pipeline the module
    defines: a function or an assigned ``Compose([...])`` (or list of transforms) whose name says
    it is one (``train_transform``, ``eval_tf``, ``test_preprocess``)."""
    out = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _PIPELINE.search(node.name):
            out.append((node.name, node.lineno, node, "function"))
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and _PIPELINE.search(node.targets[0].id) and isinstance(node.value, (ast.Call, ast.List)):
            out.append((node.targets[0].id, node.lineno, node.value, "value"))
    return out


def _stem(name: str, split: re.Pattern) -> str:
    """``transform`` for ``train_transform`` and ``eval_transform``: the name without its split."""
    return split.sub("_", name).strip("_").lower()


def _site(node: ast.AST, kind: str, line: int) -> int:
    """The line to change: a function's one ``return``, else its definition; a value's line."""
    if kind != "function":
        return line
    returns = [n for n in scope_walk(node) if isinstance(n, ast.Return)]
    return returns[0].lineno if len(returns) == 1 else line


def unnormalised_evaluation(tree: ast.AST) -> list[tuple[int, str, str, int]]:
    """``[(line, the evaluation pipeline, the training pipeline, its line)]`` where the module's
    training pipeline standardises its inputs and an evaluation pipeline of the same kind (a
    function, or a value) does not."""
    pipelines = _pipelines(tree)
    defs = _definitions(tree)
    found = []
    for name, line, node, kind in pipelines:
        if not _TRAIN.search(name) or not _normalises(node, defs):
            continue
        for other, other_line, other_node, other_kind in pipelines:
            if other_kind != kind or not _EVAL.search(other) or _TRAIN.search(other) \
                    or _stem(other, _EVAL) != _stem(name, _TRAIN):
                continue
            if _normalises(other_node, defs):
                continue
            if any(isinstance(n, ast.Name) and n.id == name for n in walk(other_node)):
                continue  # the evaluation pipeline calls the training one
            found.append((_site(other_node, other_kind, other_line), other, name, line))
    return sorted(set(found))


class EvaluationTransformUnnormalised(Rule):
    """
    ## What it does
    Finds an evaluation pipeline that leaves out the standardisation the training pipeline
    applies: the module defines a training transform (a function or a `Compose([...])` named
    `train_transform`, `train_tf`, ...) that normalises (`Normalize(mean, std)`, `(x - MEAN) /
    STD`, `x.sub(MEAN).div(STD)`) and an evaluation one of the same kind (`eval_transform`,
    `test_tf`, `val_preprocess`) that does not. Read from the script's source, in the files whose backwards ran; it points at
    the evaluation pipeline (a function's `return`, or the assignment).

    ## Why is this bad?
    The model learns on inputs centred at 0 with unit spread, and is evaluated on raw pixels in
    [0, 1] (or [0, 255]): every first-layer activation is shifted and scaled away from what it
    was trained on, BatchNorm's running statistics no longer fit, and the reported accuracy is
    much lower than the model's. Nothing fails; the model looks worse than it is, or a
    checkpoint is chosen on wrong numbers.

    ## Example
    ```python
    train_tf = T.Compose([T.RandomCrop(32, padding=4), T.ToTensor(), T.Normalize(MEAN, STD)])
    test_tf = T.Compose([T.ToTensor()])
    ```

    ## Use instead
    ```python
    test_tf = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
    ```

    ## Stays silent on
    An evaluation pipeline that normalises, or calls the training one, or calls a helper of the
    module that normalises (`return normalize(img)` with `def normalize(img): return (img -
    MEAN) / STD`), or lists a transform the module assigned once (`norm = T.Normalize(MEAN,
    STD)`); normalisation done
    inside the model (a `(x - self.mean) / self.std` in `forward`: neither pipeline has it);
    pipelines whose names do not say train and eval/test/val, or name different pipelines
    (`train_aug` and `eval_transform`); a function paired with a value (not compared).
    """

    code = "GD382"
    slug = "evaluation-transform-unnormalised"
    severity = Severity.WARNING
    summary = ("the evaluation preprocessing leaves out the normalisation the training "
               "preprocessing applies: the model is evaluated on inputs of another scale")
    fix = "apply the same normalisation (mean, std) in the evaluation pipeline as in training"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, evaluation, training, training_line in unnormalised_evaluation(tree):
                yield self.finding(
                    f"`{training}` (line {training_line}) standardises the training inputs, but "
                    f"`{evaluation}` does not: the model is evaluated on inputs of another offset "
                    f"and scale than it was trained on, so what it is measured at is not what "
                    f"it learned",
                    Location(path, line),
                    evidence={"evaluation": evaluation, "training": training,
                              "training_line": training_line},
                    fix=f"normalise in `{evaluation}` as `{training}` does (the same mean and std)")
