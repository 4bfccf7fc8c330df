from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

# in-place methods that give the same result when applied twice, that write values rather than
# transform them (a memory bank's slot, a mask's fill), or that change only the view
_SAFE = frozenset({
    "clamp_", "clip_", "clamp_min_", "clamp_max_", "relu_", "abs_", "absolute_", "floor_",
    "ceil_", "round_", "trunc_", "fix_", "sign_", "sgn_", "nan_to_num_", "hardtanh_",
    "copy_", "fill_", "zero_", "index_copy_", "index_fill_", "masked_fill_", "masked_scatter_",
    "scatter_", "index_put_", "put_", "set_", "fill_diagonal_",
    "requires_grad_", "retain_grad_", "share_memory_", "detach_", "unsqueeze_", "squeeze_",
    "t_", "transpose_", "resize_", "resize_as_", "as_strided_", "swapdims_", "swapaxes_",
    "record_stream_", "pin_memory_",
})
_SAFE_INPLACE_FUNCTIONS = frozenset({"relu", "relu6", "hardtanh", "threshold"})
_SYMBOLS = {"Add": "+", "Sub": "-", "Mult": "*", "Div": "/", "FloorDiv": "//", "Mod": "%",
            "Pow": "**", "MatMult": "@"}


def _fix(name: str, op: str) -> str:
    """The out-of-place form of the write, in the script's terms."""
    if op.endswith("(inplace=True)"):
        form = f"drop inplace=True and rebind the result: `{name} = {op[:-len('(inplace=True)')]}({name}, ...)`"
    elif op.endswith("=") and not op[:-1].isidentifier():
        form = f"rebind instead of `{op}`: `{name} = {name} {op[:-1]} ...`"
    else:
        form = f"use the out-of-place `{op[:-1]}` and rebind: `{name} = {name}.{op[:-1]}(...)`"
    return f"{form} (or start the forward with `{name} = {name}.clone()`)"


def _root_name(node: ast.AST) -> str | None:
    """The variable an in-place chain starts from: ``x`` of ``x.sub_(m).div_(s)``."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        node = node.func.value
    return node.id if isinstance(node, ast.Name) else None


def _binds(node: ast.AST, name: str) -> bool:
    targets = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.For, ast.AsyncFor, ast.NamedExpr)):
        targets = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
    return any(isinstance(t, ast.Name) and t.id == name
               or isinstance(t, (ast.Tuple, ast.List)) and any(
                   isinstance(e, ast.Name) and e.id == name for e in t.elts)
               for t in targets)


def input_writes(tree: ast.AST, def_line: int, name: str) -> list[tuple[int, str, str]]:
    """``(line, statement, operation)`` of each in-place arithmetic on the argument ``name`` in
    the function defined at ``def_line``, before the name is bound to another tensor."""
    function = next((n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.lineno == def_line), None)
    if function is None:
        return []
    nodes = [n for n in walk(function) if hasattr(n, "lineno") and n is not function]
    rebound = min((n.lineno for n in nodes if _binds(n, name)), default=None)
    statements = {}
    for node in walk(function):
        if isinstance(node, ast.stmt) and node is not function:
            for child in walk(node):
                statements.setdefault(id(child), node)
    found = []
    for node in nodes:
        op = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            if attr.endswith("_") and not attr.startswith("_") and attr not in _SAFE \
                    and _root_name(node.func.value) == name:
                op = attr
            elif any(k.arg == "inplace" and isinstance(k.value, ast.Constant) and k.value.value is True
                     for k in node.keywords) and node.args and isinstance(node.args[0], ast.Name) \
                    and node.args[0].id == name and attr not in _SAFE_INPLACE_FUNCTIONS:
                op = f"{ast.unparse(node.func)}(inplace=True)"
        elif isinstance(node, ast.AugAssign):
            target = node.target.value if isinstance(node.target, ast.Subscript) else node.target
            if isinstance(target, ast.Name) and target.id == name:
                op = _SYMBOLS.get(type(node.op).__name__, "op") + "="
        if op is None:
            continue
        statement = statements.get(id(node), node)
        # the statement that rebinds the name evaluates its value first: a write there is on the input
        if rebound is not None and statement.lineno > rebound:
            continue
        found.append((node.lineno, node.end_col_offset, ast.unparse(statement), op))
    return [(line, text, op) for line, _, text, op in sorted(set(found))]


class InputWrittenInPlace(Rule):
    """
    ## What it does
    Finds a model whose `forward` changes its input tensor in place (`x.sub_(mean).div_(std)`,
    `x /= 255`, `F.dropout(x, inplace=True)`) when that input is the script's data: a slice
    of a tensor the script keeps (`X[i:i + 32]`, a view) or the same tensor at every call
    (`model(X)`). At the first backwards, every module call is watched for a tensor
    argument whose version changed during the call; two such calls whose written arguments
    share one tensor, and an in-place arithmetic on that argument in the forward's source
    before it is rebound, make a finding at the write.

    ## Why is this bad?
    The write lands in the data, not in a copy: every row the forward has seen is changed for
    good, so the next epoch normalises (scales, shifts) it again, evaluation reads data the
    model was never trained on, and the inputs drift further with each pass. The loss stalls
    or climbs from the second epoch on, and nothing fails.

    ## Example
    ```python
    def forward(self, x):
        x.sub_(self.mean).div_(self.std)
        return self.net(x)
    ...
    for i in range(0, len(X), 32):
        loss = F.cross_entropy(model(X[i:i + 32]), Y[i:i + 32])
    ```

    ## Use instead
    ```python
    def forward(self, x):
        x = (x - self.mean) / self.std     # a new tensor; the data stays as it was
        return self.net(x)
    ```

    ## Stays silent on
    In-place work on a copy (`x = x.clone()` first, or after `x = self.embed(x)` rebinds the
    name); writes into a fresh batch (a DataLoader's collated batch, a tensor made in the loop);
    idempotent writes (`clamp_`, `relu_`, `nan_to_num_`) and value writes into an argument (a
    memory bank's `queue[ptr] = keys`, `masked_fill_`, `copy_`); a model's buffer handed to a
    layer that updates it (running statistics); writes made outside the model's forward.
    """

    code = "GD337"
    slug = "input-written-in-place"
    severity = Severity.WARNING
    summary = ("a model's forward changes its input in place, and the input is the script's "
               "data: every pass changes the dataset again")
    fix = "compute on a new tensor in forward (x = (x - mean) / std), or clone the input first"

    def check(self, a):
        for e in a.of_kind("input_written"):
            path, line = str(e["forward"][0]), int(e["forward"][1])
            tree = a.source.tree(path)
            if tree is None:
                continue
            writes = input_writes(tree, line, e["argument"])
            if not writes:
                continue
            at, text, op = writes[0]
            name = e["argument"]
            held = (f"a view of a {e['rows']}-row tensor the script keeps ({e['batch']} rows of it "
                    f"per call)" if e["view"] else "the same tensor at every call")
            yield self.finding(
                f"{e['module']}.forward changes its input `{name}` in place (`{text.strip()}`), "
                f"and `{name}` is {held}: the write lands in the data itself, so every row is "
                f"transformed again each time it is read (the next epoch, evaluation) and the "
                f"model trains on inputs that drift",
                Location(path, at, "forward"), step=a.next_step_number(e.seq),
                fix=_fix(name, op))
