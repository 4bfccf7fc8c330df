from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Related, Rule

_TYPES = {"a", "b"}


def _masks(cls: ast.ClassDef) -> bool:
    """Whether the class keeps a mask: a name, attribute or buffer name holding "mask"."""
    for node in ast.walk(cls):
        text = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) \
            else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
        if "mask" in text.lower() and text.lower() != "mask_type":
            return True
    return False


def _type_parameter(cls: ast.ClassDef) -> tuple[str, int] | None:
    """``(name, position after self)`` of the parameter of ``__init__`` that the class compares
    with the strings 'A'/'B' (PixelCNN's ``mask_type``)."""
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None or not _masks(cls):
        return None  # a model size or variant named 'B' (ViT-B) is no mask type
    params = [arg.arg for arg in init.args.posonlyargs + init.args.args][1:]
    for node in ast.walk(cls):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        names = [o.id for o in operands if isinstance(o, ast.Name) and o.id in params]
        strings = {c.value.lower() for o in operands for c in ast.walk(o)
                   if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        if names and strings and strings <= _TYPES:
            return names[0], params.index(names[0])
    return None


def _given(call: ast.Call, name: str, position: int) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if position < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[:position + 1]):
        return call.args[position]
    return None


def leaking_layers(tree: ast.AST) -> list[tuple[int, str, list[int]]]:
    """``[(line of the first construction, the class, the lines of every construction)]`` for each
    masked layer class with an 'A'/'B' mask type that the script builds only with type 'B' (each
    construction's type a string the source spells)."""
    found = []
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    for cls in classes:
        typed = _type_parameter(cls)
        if typed is None:
            continue
        name, position = typed
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and isinstance(n.func, (ast.Name, ast.Attribute))
                 and (n.func.id if isinstance(n.func, ast.Name) else n.func.attr) == cls.name]
        kinds, lines, known = set(), [], True
        for call in calls:
            value = _given(call, name, position)
            strings = {c.value.lower() for c in ast.walk(value) if isinstance(c, ast.Constant)
                       and isinstance(c.value, str)} if value is not None else set()
            if value is None or not isinstance(value, ast.Constant):
                known = False  # a type the source does not spell: its value is not known
            kinds |= strings
            lines.append(call.lineno)
        if calls and known and kinds == {"b"}:
            found.append((min(lines), cls.name, sorted(lines)))
    return found


class AutoregressiveMaskLeaks(Rule):
    """
    ## What it does
    Finds a PixelCNN-style masked layer class (its `__init__` takes a mask type compared with
    `'A'`/`'B'`) that the script builds only with type `'B'`: no layer of the network masks the
    centre position, so the first layer lets each output see the pixel (token, sample) it
    predicts. Read from the script's source once a backward ran; it points at the first
    construction, the one that should be `'A'`.

    ## Why is this bad?
    An autoregressive model predicts position `i` from the positions before it. Type `'A'`
    masks the centre as well as what follows it and is meant for the first layer, whose input is
    the data; type `'B'` keeps the centre and is right only after an `'A'` layer, where the
    centre holds features of earlier positions. With `'B'` everywhere the model reads the value
    it is asked to predict: the training loss falls towards zero by copying its input, while the
    model learns nothing it can sample with (each pixel is generated from itself, still zero).

    ## Example
    ```python
    net = nn.Sequential(
        MaskedConv2d("B", 1, 64, 7, 1, 3), nn.ReLU(),
        MaskedConv2d("B", 64, 64, 3, 1, 1), nn.ReLU(),
        nn.Conv2d(64, 256, 1))
    ```

    ## Use instead
    ```python
    net = nn.Sequential(
        MaskedConv2d("A", 1, 64, 7, 1, 3), nn.ReLU(),
        MaskedConv2d("B", 64, 64, 3, 1, 1), nn.ReLU(),
        nn.Conv2d(64, 256, 1))
    ```

    ## Stays silent on
    A network with one `'A'` layer anywhere; a type chosen by an expression (`"A" if i == 0 else
    "B"`, a variable) or unpacked arguments; masks given as booleans (`mask_center=True`) or
    built another way (MADE's degrees, a shifted input). Not seen: a masked layer class or its
    constructions in another module than the script's.
    """

    code = "GD320"
    slug = "autoregressive-mask-leaks"
    severity = Severity.WARNING
    summary = ("every masked layer of an autoregressive model (PixelCNN) is built with mask type 'B': "
               "none masks the centre, so the model sees the value it predicts")
    fix = "build the first masked layer, the one applied to the data, with mask type 'A'"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for first, cls, lines in leaking_layers(tree):
                others = [Related(Location(path, line), "another layer built with type 'B'")
                          for line in lines if line != first][:4]
                yield self.finding(
                    f"every {cls} of the script is built with mask type 'B' ({len(lines)} "
                    f"construction{'s' if len(lines) > 1 else ''}): no layer masks the centre "
                    f"position, so this first layer lets each output read the pixel it predicts "
                    f"and the model learns to copy its input",
                    Location(path, first), related=others,
                    evidence={"class": cls, "constructions": lines},
                    fix=f"build this first {cls} (the one applied to the data) with mask type 'A'")
