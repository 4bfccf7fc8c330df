from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from .weight_factor_detached import _SHAPE_ONLY, _under_no_grad
from ..analysis.source import walk

# calls that apply a weight to an input: (function name, the weight's position, its keyword)
_APPLIES = {"linear": (1, "weight"), "bilinear": (2, "weight"), "embedding": (1, "weight"),
            "conv1d": (1, "weight"), "conv2d": (1, "weight"), "conv3d": (1, "weight"),
            "conv_transpose1d": (1, "weight"), "conv_transpose2d": (1, "weight"),
            "conv_transpose3d": (1, "weight"), "matmul": (None, None), "mm": (None, None),
            "bmm": (None, None)}
_LAYER_PARAMS = ("weight", "bias")
_SET_UP = {"__init__", "reset_parameters", "init_weights", "_init_weights", "tie_weights",
           "extra_repr", "__repr__"}


def _self_chain(node: ast.AST) -> str | None:
    """``self.enc.weight`` or ``self.w`` (attributes down from ``self``), else None."""
    probe = node
    while isinstance(probe, ast.Attribute):
        probe = probe.value
    if isinstance(probe, ast.Name) and probe.id == "self" and isinstance(node, ast.Attribute):
        return ast.unparse(node)
    return None


def _data_read(node: ast.AST) -> tuple[str, ast.AST] | None:
    """``(self.enc.weight, the .data node)`` of ``self.enc.weight.data`` (through shape-only
    methods and ``.T``: ``self.enc.weight.data.t()``), else None."""
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _SHAPE_ONLY:
            node = node.func.value
        elif isinstance(node, ast.Attribute) and node.attr in ("T", "mT"):
            node = node.value
        else:
            break
    if isinstance(node, ast.Attribute) and node.attr == "data":
        chain = _self_chain(node.value)
        if chain is not None:
            return chain, node
    return None


def _applied_weights(call: ast.AST) -> list[ast.AST]:
    """The operands of ``call`` that act as a weight: F.linear's ``weight``, a matmul's
    operands; ``a @ b``'s operands."""
    if isinstance(call, ast.BinOp) and isinstance(call.op, ast.MatMult):
        return [call.left, call.right]
    if not isinstance(call, ast.Call):
        return []
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in _APPLIES:
        return []
    position, keyword = _APPLIES[name]
    if position is None:
        return list(call.args[:2])
    found = [k.value for k in call.keywords if k.arg == keyword]
    if len(call.args) > position:
        found.append(call.args[position])
    return found


def _graph_reads(cls: ast.ClassDef, chain: str, quiet: set[int]) -> list[int]:
    """Lines of the class's methods that read ``chain`` with its gradient: the attribute
    itself not followed by ``.data``/``.detach()``, or the layer that owns it called
    (``self.enc(x)`` for ``self.enc.weight``), outside ``torch.no_grad()``."""
    owner, _, leaf = chain.rpartition(".")
    lines = []
    for node in walk(cls):
        line = getattr(node, "lineno", None)
        if line is None or line in quiet:
            continue
        if isinstance(node, ast.Call) and leaf in _LAYER_PARAMS and owner != "self" \
                and ast.unparse(node.func) == owner:
            lines.append(line)
    parents = {id(c): p for p in walk(cls) for c in ast.iter_child_nodes(p)}
    for node in walk(cls):
        if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                and node.lineno not in quiet and ast.unparse(node) == chain):
            continue
        parent = parents.get(id(node))
        if isinstance(parent, ast.Attribute) and parent.attr in ("data", "detach", "shape", "size",
                                                                  "device", "dtype", "copy_"):
            continue
        if isinstance(parent, ast.Call) and parent.func is not node \
                and isinstance(parent.func, (ast.Name, ast.Attribute)) \
                and ast.unparse(parent.func).rsplit(".", 1)[-1] in ("len", "isinstance", "getattr"):
            continue
        lines.append(node.lineno)
    return sorted(set(lines))


def detached_tied_reads(tree: ast.AST) -> list[tuple[int, str, str, int]]:
    """``(line, statement, attribute, a line that reads it with its gradient)``: in an
    ``nn.Module`` class, a weight applied to an input (``F.linear``, a convolution, an
    embedding, a matmul) through ``.data`` of a ``self`` attribute, outside ``no_grad``, while
    another method or statement of the class reads the same attribute with its gradient (or
    calls the layer that owns it): a tied weight, cut from the graph in one of its uses."""
    found = []
    for cls in walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        quiet: set[int] = set()
        for function in cls.body:
            if isinstance(function, ast.FunctionDef):
                quiet |= _under_no_grad(function)
                if function.name in _SET_UP:  # building or initialising, not computing
                    quiet.update(range(function.lineno, (function.end_lineno or function.lineno) + 1))
        statements = [s for s in walk(cls) if isinstance(s, ast.stmt)
                      and not isinstance(s, (ast.FunctionDef, ast.ClassDef, ast.With, ast.If,
                                             ast.For, ast.While, ast.Try))]
        for node in walk(cls):
            if getattr(node, "lineno", None) in quiet:
                continue
            for operand in _applied_weights(node):
                read = _data_read(operand)
                if read is None:
                    continue
                chain = read[0]
                others = _graph_reads(cls, chain, quiet)
                if not others:
                    continue
                statement = next((s for s in statements
                                  if s.lineno <= node.lineno <= (s.end_lineno or s.lineno)), None)
                text = ast.unparse(statement) if statement is not None else ast.unparse(node)
                found.append((node.lineno, text, chain, others[0]))
    return sorted(set(found))


class TiedWeightDetached(Rule):
    """
    ## What it does
    Finds a weight shared by two layers (tied) and cut from the graph in one of them: in a
    module's code, a weight applied to an input (`F.linear`, a convolution, `F.embedding`, a
    matmul or `@`) through `.data` of a parameter that the module also reads with its gradient
    elsewhere (the layer that owns it called, or the parameter itself read) — a tied
    autoencoder's decoder `F.linear(h, self.enc.weight.data.t())`, a language model's output
    projection `h @ self.embed.weight.data.T`. The attribute must name one of the model's
    trained parameters. Read from the source of the files a backward ran from.

    ## Why is this bad?
    `.data` hands autograd a tensor with no history: the tied use computes with the shared
    weight but none of the loss's gradient through it reaches the weight. The weight trains
    only through its other use (the encoder, the input embedding), as if the two layers were
    not tied at all for the half the `.data` read sits in; the decoder or output layer never
    adapts, and the loss settles above where it should. Nothing fails and the shared weight
    still changes, so the weights look trained.

    ## Example
    ```python
    def decode(self, z):
        return F.linear(z, self.encoder.weight.data.t(), self.dec_bias)
    ```

    ## Use instead
    ```python
    def decode(self, z):
        return F.linear(z, self.encoder.weight.t(), self.dec_bias)
    ```

    ## Stays silent on
    A tied weight read as itself in both uses (`self.encoder.weight.t()`, `h @ self.embed.weight.T`);
    `.data` under `torch.no_grad()` (an in-place constraint, a renormalisation of the weight);
    `.data` of a parameter the module never reads with its gradient (a frozen table, a buffer
    kept as a parameter); `.detach()` (a stop-gradient written on purpose, as in a codebook's
    distances); attributes that are not parameters of the model the run trained; modules
    defined in files no backward ran from.
    """

    code = "GD439"
    slug = "tied-weight-detached"
    severity = Severity.WARNING
    summary = ("a tied weight is applied through .data in one of its uses and read with its "
               "gradient in another: the .data use never trains it")
    fix = "apply the parameter itself (drop the .data) so that both uses train the tied weight"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        names = [str(a.param_name(pid)).split(" ")[0] for pid in a.params]
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, chain, other in detached_tied_reads(tree):
                attribute = chain.split(".", 1)[1]
                if not any(n == attribute or n.endswith("." + attribute) for n in names):
                    continue
                fixed = text.replace(f"{chain}.data", chain)
                yield self.finding(
                    f"`{text}` applies `{chain}` through `.data`, while line {other} reads the "
                    f"same parameter with its gradient: the `.data` use is a constant to autograd, "
                    f"so the loss's gradient through this use never reaches the tied weight and "
                    f"it trains only through its other use",
                    Location(path, line), evidence={"attribute": chain, "graph_read": other},
                    fix=f"apply `{chain}` itself: `{fixed}`")
