from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Related, Rule
from ..analysis.source import walk

_TYPES = {"a", "b"}


def _masks(cls: ast.ClassDef) -> bool:
    """Whether the class keeps a mask: a name, attribute or buffer name holding "mask"."""
    for node in walk(cls):
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
    for node in walk(cls):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        names = [o.id for o in operands if isinstance(o, ast.Name) and o.id in params]
        strings = {c.value.lower() for o in operands for c in walk(o)
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
    classes = [n for n in walk(tree) if isinstance(n, ast.ClassDef)]
    for cls in classes:
        typed = _type_parameter(cls)
        if typed is None:
            continue
        name, position = typed
        calls = [n for n in walk(tree) if isinstance(n, ast.Call)
                 and isinstance(n.func, (ast.Name, ast.Attribute))
                 and (n.func.id if isinstance(n.func, ast.Name) else n.func.attr) == cls.name]
        kinds, lines, known = set(), [], True
        for call in calls:
            value = _given(call, name, position)
            strings = {c.value.lower() for c in walk(value) if isinstance(c, ast.Constant)
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
    Also finds a 2-D convolution's 0/1 weight mask (a buffer or tensor attribute of the module)
    that is meant to be causal — it hides positions after the kernel's centre in raster order
    and keeps every position before it — but keeps other positions after the centre: part of a
    row below the centre (`mask[:, :, k // 2 + 1:, k // 2 + 1:] = 0` where whole rows were
    meant), or the rows below while the rest of the centre row is hidden (the rows-below line
    forgotten). Read at each masked module's first forward; it points at the class's last
    write into the mask.
    And finds a MADE whose masked linear layers (a 0/1 buffer of the weight's shape, chained
    through pointwise activations) order their inputs — each output reads only positions
    before its own, in some order — while outputs also read their own position: the output
    mask compares degrees with `>=` like the hidden ones. Read at the first optimizer step from
    the product of the chain's masks, with the outputs taken as k blocks of the inputs (`chunk`
    or interleaved `view(d, k)`); it points at the script's last degree comparison when the
    file holds two to as many as the chain has layers and none is strict, else at the last
    layer's forward.

    ## Why is this bad?
    An autoregressive model predicts position `i` from the positions before it. Type `'A'`
    masks the centre as well as what follows it and is meant for the first layer, whose input is
    the data; type `'B'` keeps the centre and is right only after an `'A'` layer, where the
    centre holds features of earlier positions. With `'B'` everywhere the model reads the value
    it is asked to predict: the training loss falls towards zero by copying its input, while the
    model learns nothing it can sample with (each pixel is generated from itself, still zero).
    A MADE (or each MADE of a MAF) that reads its own input has a Jacobian that is no longer
    triangular: the log-det the flow sums from the diagonal is wrong, the reported NLL falls
    far below the true one, and sampling one dimension at a time gives garbage.

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
    built another way (a shifted input); a MADE whose output degrees are compared strictly (or
    shifted by one and compared with `>=`), in any input order; random pruning masks and
    block-diagonal (grouped, packed-ensemble) masks; a single lower-triangular masked layer
    with its diagonal (a triangular linear flow); a gated PixelCNN's vertical-stack mask
    (whole rows below hidden, the centre row kept: its output is shifted down a row); masks that
    hide positions before the centre too (a checkerboard, a fixed sparse pattern). Not seen: a masked layer class or its
    constructions in another module than the script's.
    """

    code = "GD320"
    slug = "autoregressive-mask-leaks"
    severity = Severity.WARNING
    summary = ("every masked layer of an autoregressive model (PixelCNN) is built with mask type 'B': "
               "none masks the centre, so the model sees the value it predicts")
    fix = "build the first masked layer, the one applied to the data, with mask type 'A'"

    def check(self, a):
        yield from self._not_causal(a)
        yield from self._sees_itself(a)
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

    def _sees_itself(self, a):
        told = set()
        for event in a.by_kind.get("mask_sees_itself", ()):
            if event["cls"] in told:
                continue
            told.add(event["cls"])
            defined = event.get("defined_at")
            path = str(defined[0]) if defined else event.loc.path if event.loc is not None else None
            found = _last_loose_comparison(a, path, event["layers"]) if path else None
            loc = Location(path, found[0]) if found else event.loc
            d, k, seen = event["inputs"], event["blocks"], event["seen"]
            said = f" (`{found[1]}`)" if found else ""
            yield self.finding(
                f"the {event['layers']} masked linear layers ending in {event['cls']} order their "
                f"{d} inputs autoregressively (each output reads only positions before it) yet "
                f"the outputs of {seen} of the {d} positions also read their own input{said}: "
                f"the masks compare degrees with >= where the "
                f"output layer needs >, so the model predicts each value from itself and its "
                f"likelihood (a MADE's, a MAF's log-det from the diagonal) is no longer exact",
                loc, related=(Related(event.loc, "the last masked layer's first forward"),)
                if event.loc is not None and event.loc != loc else (),
                evidence={"class": event["cls"], "layers": event["layers"], "inputs": d,
                          "blocks": k, "seen": seen},
                fix="build the output layer's mask with a strict comparison (MADE: output "
                    "degree > hidden degree; hidden layers keep >=), so output i reads only "
                    "inputs before i")

    def _not_causal(self, a):
        told = set()
        for event in a.by_kind.get("mask_not_causal", ()):
            key = (event["cls"], event["mask"])
            if key in told:
                continue
            told.add(key)
            defined = event.get("defined_at")
            loc = _mask_write(a, defined, event["mask"]) if defined else None
            if loc is None:
                loc = Location(str(defined[0]), int(defined[1])) if defined else event.loc
            kh, kw = event["kernel"]
            shown = ", ".join(f"({r}, {c})" for r, c in event["open_after"][:4])
            yield self.finding(
                f"the `{event['mask']}` of {event['cls']} hides some of its {kh}×{kw} kernel's "
                f"positions after the centre (raster order) and keeps all before it, so it is "
                f"meant to be causal, but it keeps other positions after the centre too "
                f"(row, column: {shown}): each output reads pixels below the one it predicts, "
                f"and the model learns to copy them",
                loc, related=(Related(event.loc, "the layer's first forward"),) if event.loc else (),
                evidence={"class": event["cls"], "param": event["param"], "mask": event["mask"],
                          "kernel": event["kernel"], "open_after": event["open_after"]},
                fix=f"hide every position after the centre: the rest of the centre row "
                    f"(`{event['mask']}[:, :, kh // 2, kw // 2 + 1:] = 0`, the centre too for "
                    f"type 'A') and every row below it (`{event['mask']}[:, :, kh // 2 + 1:] = 0`)")


def _mask_write(a, defined, mask: str) -> Location | None:
    """The last statement of the module's class that writes into a slice of its mask
    (``self.mask[:, :, k // 2 + 1:] = 0``): where the mask's pattern is made."""
    path, first, last = str(defined[0]), int(defined[1]), int(defined[2])
    tree = a.source.tree(path)
    if tree is None:
        return None
    inside = [n for n in walk(tree) if first <= getattr(n, "lineno", 0) <= last]
    names = {mask}
    for node in inside:  # a local the mask is registered from: register_buffer("m", local)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "register_buffer" and len(node.args) == 2 \
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == mask \
                and isinstance(node.args[1], ast.Name):
            names.add(node.args[1].id)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Attribute) and node.targets[0].attr == mask \
                and isinstance(node.value, ast.Name):
            names.add(node.value.id)
    writes = []
    for node in inside:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Subscript):
                base = target.value
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)
                if name in names:
                    writes.append(node.lineno)
    return Location(path, max(writes)) if writes else None


def _broadcast_operand(node: ast.AST) -> bool:
    """``m[:, None]``, ``m[None, :]``, ``m.unsqueeze(1)``, ``m.view(-1, 1)``: a degree vector
    turned to broadcast against another."""
    if isinstance(node, ast.Subscript):
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return any(isinstance(p, ast.Constant) and p.value is None for p in parts)
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
        and node.func.attr in {"unsqueeze", "view", "reshape"}


def _last_loose_comparison(a, path: str, layers: int) -> tuple[int, str] | None:
    """``(line, text)`` of the last of the file's degree comparisons (``m_out[:, None] >=
    m_h[None, :]``) when it has two or more, no more than the chain's layers, and none is strict:
    the output layer's, which must be. More comparisons than layers belong to other models too."""
    tree = a.source.tree(path)
    if tree is None:
        return None
    found = []
    for node in walk(tree):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 \
                and isinstance(node.ops[0], (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) \
                and _broadcast_operand(node.left) and _broadcast_operand(node.comparators[0]):
            found.append(node)
    if not 2 <= len(found) <= layers or any(isinstance(n.ops[0], (ast.Lt, ast.Gt)) for n in found):
        return None
    last = max(found, key=lambda n: (n.lineno, n.col_offset))
    return last.lineno, a.source.line_text(path, last.lineno).split("  #")[0].strip()
