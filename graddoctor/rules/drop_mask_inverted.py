from __future__ import annotations

import ast

from ..analysis.source import scope_walk
from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_DROP_WORDS = ("drop", "uncond", "null")
# a rate named for what it drops (`p_uncond`, `drop_prob`, `mask_ratio`, `cfg_p`)
_RATE_WORDS = ("drop", "uncond", "null", "mask", "cfg", "corrupt", "guid")
# the null class of a label embedding is its last index: DiT's torch.where(drop_ids, self.num_classes, labels)
_NULL_WORDS = ("null", "uncond", "empty", "unk", "mask_token", "mask_id", "mask_idx", "num_classes",
               "n_classes")


def _is_uniform(node: ast.AST) -> bool:
    """A uniform [0, 1) draw: ``torch.rand(...)``, ``torch.rand_like(x)``, ``np.random.rand(...)``,
    ``random.random()``, ``x.uniform_()``, ``x.uniform_(0, 1)`` (through ``.to(...)``/``.float()``)."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("to", "float", "cuda", "type_as"):
        node = node.func.value
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name in ("rand", "rand_like", "random"):
        return True
    if name == "uniform_":
        values = [a.value for a in node.args if isinstance(a, ast.Constant)]
        return values in ([], [0, 1], [0.0, 1.0], [0, 1.0], [0.0, 1])
    return False


def _constants(tree: ast.AST) -> dict[str, float]:
    """Names and ``self`` attributes bound once to a number in (0, 1): module or function
    assignments, parameter defaults, ``self.p = p`` from such a default."""
    seen: dict[str, set] = {}

    def bind(name: str, value) -> None:
        seen.setdefault(name, set()).add(value)

    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.posonlyargs + node.args.args
            defaults = dict(zip([a.arg for a in args][len(args) - len(node.args.defaults):], node.args.defaults))
            defaults.update({a.arg: d for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None})
            for name, default in defaults.items():
                bind(name, default.value if isinstance(default, ast.Constant) else None)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple) \
                    and len(targets[0].elts) == len(node.value.elts):
                for target, value in zip(targets[0].elts, node.value.elts):  # A, B = 0.1, 5
                    if isinstance(target, ast.Name):
                        bind(target.id, value.value if isinstance(value, ast.Constant) else None)
                continue
            for target in targets:
                key = target.id if isinstance(target, ast.Name) else \
                    f"self.{target.attr}" if isinstance(target, ast.Attribute) \
                    and isinstance(target.value, ast.Name) and target.value.id == "self" else None
                if key is None:
                    continue
                value = node.value
                if isinstance(value, ast.Constant):
                    bind(key, value.value)
                elif isinstance(value, ast.Name) and key.startswith("self."):
                    bind(key, ("param", value.id))
                else:
                    bind(key, None)
    found = {}
    for key, values in seen.items():
        if len(values) != 1:
            continue
        value = next(iter(values))
        if isinstance(value, tuple):
            inner = seen.get(value[1], set())
            value = next(iter(inner)) if len(inner) == 1 else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1:
            found[key] = float(value)
    return found


def _rate(node: ast.AST, constants: dict) -> tuple[float, bool] | None:
    """``(the rate the script wrote, whether the threshold is 1 - rate)`` for a threshold."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and 0 < node.value < 1:
        return float(node.value), False
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id], False
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
            and f"self.{node.attr}" in constants:
        return constants[f"self.{node.attr}"], False
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and isinstance(node.left, ast.Constant) \
            and node.left.value == 1:
        inner = _rate(node.right, constants)
        if inner is not None and not inner[1]:
            return inner[0], True
    return None


def _true_share(cmp: ast.Compare, constants: dict) -> tuple[float, float] | None:
    """``(the written rate, how often the comparison is true)`` for ``rand < t`` and its spellings."""
    if len(cmp.ops) != 1:
        return None
    left, op, right = cmp.left, cmp.ops[0], cmp.comparators[0]
    if _is_uniform(left):
        threshold, below = right, isinstance(op, (ast.Lt, ast.LtE))
    elif _is_uniform(right):
        threshold, below = left, isinstance(op, (ast.Gt, ast.GtE))
    else:
        return None
    if not isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)):
        return None
    rate = _rate(threshold, constants)
    if rate is None:
        return None
    written, complement = rate
    t = 1 - written if complement else written
    return written, (t if below else 1 - t)


def _null(node: ast.AST) -> bool:
    """A value that stands for "no condition": a filled or zero tensor, a number, a name saying so."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("full_like", "zeros_like", "zeros", "full", "new_full", "new_zeros"):
            return True
    text = ast.unparse(node).lower()
    return any(word in text for word in _NULL_WORDS)


def _mask_name(node: ast.AST) -> str | None:
    """The mask a condition reads through a new axis or a reshape (``drop[:, None]``,
    ``drop.view(-1, 1)``)."""
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("view", "reshape", "unsqueeze", "expand_as", "expand", "bool", "float"):
            node = node.func.value
        else:
            return node.id if isinstance(node, ast.Name) else None


def _negated(node: ast.AST, name: str) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Invert, ast.Not)):
        return _mask_name(node.operand) == name
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and isinstance(node.left, ast.Constant) \
            and node.left.value == 1:
        return _mask_name(node.right) == name
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "logical_not":
        inner = node.args[0] if node.args else node.func.value
        return _mask_name(inner) == name
    return False


def _roles(tree: ast.AST, name: str) -> set[str]:
    """What the script does with mask ``name``: "drop" (true rows lose their condition or token)
    or "keep" (true rows keep theirs), read from its uses (``torch.where``'s branches, an
    indexed assignment, ``masked_fill``, a product), else from its name."""
    roles, products = set(), set()
    for node in walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            # cond * mask keeps the rows where the mask holds (a "drop_mask" multiplied in is
            # a keep mask whatever its name); cond * (1 - mask) drops them
            for operand in (node.left, node.right):
                if _mask_name(operand) == name:
                    products.add("keep")
                elif _negated(operand, name):
                    products.add("drop")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "where" \
                and len(node.args) == 3:
            cond, a, b = node.args
            if _mask_name(cond) == name:
                if _null(a) and not _null(b):
                    roles.add("drop")
                elif _null(b) and not _null(a):
                    roles.add("keep")
            elif _negated(cond, name):
                if _null(a) and not _null(b):
                    roles.add("keep")
                elif _null(b) and not _null(a):
                    roles.add("drop")
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript):
            index = node.targets[0].slice
            if _mask_name(index) == name and _null(node.value):
                roles.add("drop")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("masked_fill", "masked_fill_") and node.args:
            mask = node.args[0]
            if _mask_name(mask) == name:
                roles.add("drop")
            elif _negated(mask, name):
                roles.add("keep")
    if roles:
        return roles  # what the script does with the mask says more than its name
    lowered = name.lower()
    if any(word in lowered for word in _DROP_WORDS):
        roles.add("drop")
    if "keep" in lowered:
        roles.add("keep")
    # a product alone says nothing of a condition being dropped (synthetic 0/1 labels are
    # multiplied too): it only corrects a mask named for dropping
    return products if roles and products else roles


def _threshold(cmp: ast.Compare) -> ast.AST | None:
    """The side of ``rand < t`` (or its spellings) that is not the uniform draw."""
    if len(cmp.ops) != 1:
        return None
    if _is_uniform(cmp.left):
        return cmp.comparators[0]
    return cmp.left if _is_uniform(cmp.comparators[0]) else None


def _rescaled_by_keep(tree: ast.AST, name: str, rate: ast.AST) -> bool:
    """Is mask ``name`` multiplied into a value that the same statement divides by
    ``1 - rate`` (``x * keep / (1 - p)``, ``x.div(1 - p) * keep``)? Inverted dropout's rescaling
    by the keep probability says the script takes ``rate`` for the share dropped, and the mask
    for the rows kept."""
    complement = f"1 - {ast.unparse(rate)}"
    for stmt in walk(tree):
        if not isinstance(stmt, (ast.Assign, ast.AugAssign, ast.Return, ast.Expr)):
            continue
        nodes = list(walk(stmt))
        if not any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)
                   and name in (_mask_name(n.left), _mask_name(n.right)) for n in nodes):
            continue
        for n in nodes:
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and ast.unparse(n.right) == complement:
                return True
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                    and n.func.attr in ("div", "div_", "true_divide") and n.args \
                    and ast.unparse(n.args[0]) == complement:
                return True
    return False


def inverted_masks(tree: ast.AST) -> list[tuple[int, str, str, float, str]]:
    """``[(line, name, the comparison, the written rate, the role)]`` for each mask drawn as a
    comparison of a uniform draw with a rate under 0.5 that drops (or keeps) the rows it should
    keep (or drop): the dropping happens with probability 1 - rate."""
    constants = _constants(tree)
    found = []
    for node in walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        value = node.value
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                and value.func.attr in ("to", "float", "long", "bool", "int"):
            value = value.func.value
        if not isinstance(value, ast.Compare):
            continue
        share = _true_share(value, constants)
        if share is None:
            continue
        written, true_share = share
        if not 0 < written < 0.5:
            continue  # a rate written above one half is meant (word dropout at 0.75)
        name = node.targets[0].id
        rate = _threshold(value)
        rescaled = rate is not None and _rescaled_by_keep(tree, name, rate)
        roles = {"keep"} if rescaled else _roles(tree, name)
        if len(roles) != 1:
            continue
        role = next(iter(roles))
        if role == "keep" and not rescaled and not any(word in ast.unparse(value).lower() for word in _RATE_WORDS):
            continue  # `valid = torch.rand(...) < 0.3` keeps 30 % (sparse returns): a rate that
            # is not named for dropping may be the share kept
        dropped = true_share if role == "drop" else 1 - true_share
        if dropped > 0.5 and abs(dropped - (1 - written)) < 1e-9:
            found.append((node.lineno, name, ast.unparse(value), written, role))
    return sorted(found)


_KEEP_DRAWS = ("bernoulli", "bernoulli_")
# a rate named for what it drops: drop path's `drop_prob`, `drop_rate`, `p_drop`, `dropout`
_DROP_RATE_WORDS = ("drop",)


def _drop_named(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _DROP_RATE_WORDS) and "keep" not in lowered


def _bound_once(scope: ast.AST) -> dict[str, list]:
    bound: dict[str, list] = {}
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for arg in scope.args.posonlyargs + scope.args.args + scope.args.kwonlyargs:
            bound.setdefault(arg.arg, []).append(None)
    for node in scope_walk(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, []).append(node)
                else:
                    for name in walk(target):
                        if isinstance(name, ast.Name):
                            bound.setdefault(name.id, []).append(None)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For)):
            for name in walk(node.target):
                if isinstance(name, ast.Name):
                    bound.setdefault(name.id, []).append(None)
    return bound


def _keep_probability(call: ast.Call) -> ast.AST | None:
    """The probability of keeping a draw's ones: ``x.new_empty(s).bernoulli_(p)``,
    ``torch.bernoulli(torch.full(s, p))``, ``torch.bernoulli(p * torch.ones(s))``."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name == "bernoulli_":
        arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "p"), None)
        return arg
    if name == "bernoulli" and call.args:
        arg = call.args[0]
        if isinstance(arg, ast.Call):
            inner = arg.func.attr if isinstance(arg.func, ast.Attribute) else \
                arg.func.id if isinstance(arg.func, ast.Name) else ""
            if inner in ("full", "full_like", "new_full") and len(arg.args) >= 2:
                return arg.args[1]
        if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Mult):
            for side in (arg.left, arg.right):
                if isinstance(side, ast.Name):
                    return side
        return arg if isinstance(arg, ast.Name) else None
    return None


def kept_at_drop_rate(tree: ast.AST) -> list[tuple[int, str, str, str]]:
    """``[(line, the text, the rate's name, the mask's name)]`` for each Bernoulli mask (drop
    path, dropout by hand) that keeps its ones with a probability that is the drop rate itself:
    drawn with ``bernoulli_(drop_prob)``, or with a keep probability assigned the drop rate as
    it is (``keep_prob = drop_prob``), while the mask multiplies the kept values in. The line
    is the keep probability's assignment where there is one, else the draw."""
    found = []
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        bound = _bound_once(scope)
        for node in scope_walk(scope):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)):
                continue
            value = node.value
            while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                    and value.func.attr in ("to", "float", "type_as", "div_", "div"):
                value = value.func.value
            if not isinstance(value, ast.Call):
                continue
            prob = _keep_probability(value)
            if not isinstance(prob, ast.Name):
                continue
            mask = node.targets[0].id
            line, rate = None, None
            if _drop_named(prob.id):
                line, rate, text = node.lineno, prob.id, ast.unparse(node)
            else:
                sites = bound.get(prob.id, [])
                source = sites[0].value if len(sites) == 1 and sites[0] is not None else None
                source_name = source.id if isinstance(source, ast.Name) else \
                    source.attr if isinstance(source, ast.Attribute) else None
                if source_name is not None and _drop_named(source_name):
                    line, rate, text = sites[0].lineno, ast.unparse(source), ast.unparse(sites[0])
            if line is None:
                continue
            keeps = drops = False
            for use in scope_walk(scope):
                if isinstance(use, ast.BinOp) and isinstance(use.op, ast.Mult):
                    for operand in (use.left, use.right):
                        if _mask_name(operand) == mask:
                            keeps = True
                        elif _negated(operand, mask):
                            drops = True
                elif isinstance(use, ast.Call) and isinstance(use.func, ast.Attribute) \
                        and use.func.attr in ("masked_fill", "masked_fill_", "where"):
                    if any(_mask_name(arg) == mask for arg in use.args):
                        drops = True
                elif isinstance(use, ast.Assign) and isinstance(use.targets[0], ast.Subscript) \
                        and _mask_name(use.targets[0].slice) == mask:
                    drops = True
            if keeps and not drops:
                found.append((line, text, rate, mask))
    return sorted(set(found))


class DropMaskInverted(Rule):
    """
    ## What it does
    Finds a random mask meant to drop a small share of rows that drops all the others instead:
    a comparison of a uniform draw (`torch.rand`, `rand_like`, `uniform_()`) with a rate the
    script wrote under one half (a classifier-free guidance `p_uncond`, a token-masking or word
    dropout rate), where the comparison's direction and the mask's use (a `drop`/`keep` name,
    which branch of `torch.where` gets the null condition, `x[mask] = null`, `masked_fill`, a
    product rescaled by `1 / (1 - rate)` as inverted dropout does: a keep mask, whatever the
    rate's name) together make the dropped share `1 - rate`. Read from the script's source once a backward
    ran; it points at the comparison.

    ## Why is this bad?
    `torch.rand(n) < p` is true for a share `p` of the rows, `torch.rand(n) > p` for `1 - p`. With
    the comparison (or the `torch.where` branches) turned around, a diffusion model trained for
    classifier-free guidance sees its label on 10% of the samples instead of 90%: the
    conditional model is mostly unconditional, and guidance has little to amplify. A masked
    language model masks 85% of the tokens instead of 15%. The loss still falls; the model is
    weaker for it.

    ## Example
    ```python
    drop = torch.rand(labels.shape[0]) > p_uncond      # true for 90% of the rows
    labels = torch.where(drop, torch.full_like(labels, null_class), labels)
    ```

    ## Use instead
    ```python
    drop = torch.rand(labels.shape[0]) < p_uncond
    labels = torch.where(drop, torch.full_like(labels, null_class), labels)
    ```

    ## Stays silent on
    The keep-mask form (`keep = torch.rand(n) > p_uncond; torch.where(keep, y, null)`), `rand <
    1 - p` used as a keep mask; a keep mask compared with a rate not named for dropping (`valid =
    torch.rand(...) < 0.3`: the share kept), unless the product it keeps is divided by `1 - rate`
    (the script takes the rate for the share dropped); `x * (rand < keep_prob) / keep_prob`; a rate written at one half or above (word dropout at 0.75:
    meant); a rate the source does not bind to one number (an argument of the command line, a
    value assigned twice); a mask whose use says neither drop nor keep, or both. Not seen: masks
    from a helper function (lucidrains' `prob_mask_like(shape, prob)`).

    The same inversion drawn with `torch.bernoulli`/`bernoulli_` is found too: drop path's (or a
    hand-written dropout's) keep mask drawn with the drop rate itself as its probability
    (`bernoulli_(drop_prob)`, or `keep_prob = drop_prob` without the `1 -`), a mask the script
    multiplies in; timm's `keep_prob = 1 - drop_prob`, and a mask drawn at the drop rate that the
    script complements or fills with (a drop mask) stay silent.
    """

    code = "GD321"
    slug = "drop-mask-inverted"
    severity = Severity.WARNING
    summary = ("a random mask meant to drop a small share p of the rows (classifier-free guidance's "
               "label dropout, token masking) drops 1 - p of them: the comparison with the rate is "
               "turned around")
    fix = "compare the other way: torch.rand(n) < p is true for a share p of the rows"

    def check(self, a):
        backwards = a.by_kind.get("backward", ())
        paths = list(dict.fromkeys(e.loc.path for e in backwards if e.loc is not None))
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, name, text, written, role in inverted_masks(tree):
                share = round(100 * (1 - written))
                does = "drops" if role == "drop" else "keeps"
                yield self.finding(
                    f"`{name} = {text}` is true for {share}% of the rows (the rate written is "
                    f"{written:g}), and the script {does} the rows where `{name}` holds: "
                    f"{share}% of them lose their condition (label, token) instead of "
                    f"{round(100 * written)}%",
                    Location(path, line), evidence={"mask": name, "comparison": text,
                                                    "rate": written, "role": role},
                    fix=f"turn the comparison around so that {round(100 * written)}% of the rows "
                        f"are dropped ({'rand < rate for a drop mask' if role == 'drop' else 'rand > rate for a keep mask'})")
            for line, text, rate, mask in kept_at_drop_rate(tree):
                yield self.finding(
                    f"`{text}`: the Bernoulli mask `{mask}` keeps its ones with probability "
                    f"`{rate}`, the drop rate itself, and the script multiplies the kept values by "
                    f"it: a share `{rate}` of the rows (residual branches, units) is kept and "
                    f"`1 - {rate}` dropped, and the survivors are scaled up by its inverse",
                    Location(path, line), evidence={"mask": mask, "statement": text, "rate": rate,
                                                    "role": "keep"},
                    fix=f"draw the mask with the keep probability 1 - {rate} "
                        f"(keep_prob = 1 - {rate}; mask.bernoulli_(keep_prob))")
