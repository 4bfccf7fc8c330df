"""Values named for a frozen model's role (a reference model's, a teacher's) computed by the model
the optimizer trains, read from the script's source: DPO's ``ref_chosen_logps``, an RLHF KL
penalty's ``ref_logprobs`` or a distillation's ``teacher_logits`` assigned from a call on the
policy (student) while the file keeps a reference (teacher) model that it assigns."""

from __future__ import annotations

import ast
import re

from .source import _parse, walk

# a value named for the reference's or the teacher's output
_ROLE_VALUE = {
    "reference": re.compile(r"(^|_)(ref|reference)(_|$)|^ref[A-Z]|(^|_)(ref|reference)\d*(_|$)", re.I),
    "teacher": re.compile(r"(^|_)(teacher|tch)(_|$)|^t_logits$", re.I),
}
# a model kept in that role
_ROLE_MODEL = {
    "reference": re.compile(r"^(ref|reference|ref_model|reference_model|ref_policy|ref_lm|model_ref|policy_ref|ref_net)$", re.I),
    "teacher": re.compile(r"^(teacher|teacher_model|teacher_net|model_teacher|tnet|t_model)$", re.I),
}
_OPTIMIZERS = re.compile(r"(^|\.)(SGD|Adam|AdamW|Adamax|Adagrad|Adadelta|RMSprop|NAdam|RAdam|LBFGS|Lion|Adafactor|"
                         r"SparseAdam|ASGD|Rprop)$|optim", re.I)
# contexts a value may rightly be computed under with the trained model in the role of the
# frozen one: an adapter switched off (PEFT's disable_adapter, TRL's null_ref_context), a swap
_NEUTRAL_WITH = re.compile(r"^(torch\.)?(no_grad|inference_mode|enable_grad|set_grad_enabled|autocast)$"
                           r"|(^|\.)(amp\.)?autocast$|^(torch\.)?(cuda\.amp\.)?autocast$")


def _text(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover
        return ""


def _trained_models(tree: ast.AST) -> set[str]:
    """The names whose ``.parameters()`` an optimizer is built on, directly or through one
    name assigned from them (``trainable = [p for p in model.parameters() if ...]``)."""
    holders: dict[str, set[str]] = {}
    for node in walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            owners = _parameter_owners(node.value)
            if owners:
                holders.setdefault(node.targets[0].id, set()).update(owners)
    out: set[str] = set()
    for node in walk(tree):
        if isinstance(node, ast.Call) and _OPTIMIZERS.search(_text(node.func)):
            for arg in list(node.args) + [k.value for k in node.keywords]:
                out |= _parameter_owners(arg)
                for sub in walk(arg):
                    if isinstance(sub, ast.Name) and sub.id in holders:
                        out |= holders[sub.id]
    return out


def _parameter_owners(node: ast.AST) -> set[str]:
    out = set()
    for sub in walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) \
                and sub.func.attr in ("parameters", "named_parameters"):
            out.add(_text(sub.func.value))
    return out


def _models_named(node: ast.AST) -> set[str]:
    """The names and attribute chains an expression calls or hands to a call."""
    out = set()
    for sub in walk(node):
        if isinstance(sub, ast.Call):
            f = sub.func
            if isinstance(f, ast.Attribute) and f.attr in ("forward", "__call__", "generate"):
                out.add(_text(f.value))
            elif isinstance(f, (ast.Name, ast.Attribute)):
                out.add(_text(f))
            for arg in list(sub.args) + [k.value for k in sub.keywords]:
                if isinstance(arg, (ast.Name, ast.Attribute)):
                    out.add(_text(arg))
    return out


def _target_names(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Attribute):
        return [target.attr]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for t in target.elts for n in _target_names(t)]
    return []


def _last_part(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def role_values_from_trained_model(path: str) -> list[tuple[int, str, str, str, str]]:
    """(line, role, the value's name, the trained model's name, the role model's name) for each
    assignment, inside a loop that calls ``backward`` (or a step function that does and holds no
    such loop), of a value named for a reference's (or a teacher's) output from a call on or with a model an optimizer trains, the statement naming
    no model of that role, in a file that assigns a model of that role (``ref = copy.deepcopy(
    policy)``, ``self.ref_model = ...``). Statements under a ``with`` other than the grad-mode and
    autocast contexts, or after a call switching an adapter off in their block
    (``disable_adapter_layers()``), and values the loop never reads, are left out."""
    tree = _parse(path)
    if tree is None:
        return []
    trained = _trained_models(tree)
    if not trained:
        return []
    kept = set()  # the models the file keeps: names and attributes it assigns
    for node in walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, (ast.Name, ast.Attribute)):
                    kept.add(_text(t))
    parents: dict[int, ast.AST] = {}
    for node in walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    out = []
    done: set[int] = set()
    for node in walk(tree):
        if not isinstance(node, (ast.For, ast.While, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if not _calls_backward(node):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                isinstance(loop, (ast.For, ast.While)) and _calls_backward(loop) for loop in walk(node)):
            continue  # its training loop is read as one: what runs before it may make the reference
        for s in walk(node):
            if not isinstance(s, ast.Assign) or id(s) in done:
                continue
            names = [n for t in s.targets for n in _target_names(t)]
            called = _models_named(s.value)
            on_trained = sorted(m for m in called if m in trained)
            if not on_trained:
                continue
            for role, value_re in _ROLE_VALUE.items():
                hit = next((n for n in names if value_re.search(n)), None)
                if hit is None:
                    continue
                role_models = sorted(m for m in kept if _ROLE_MODEL[role].match(_last_part(m))
                                     and m not in trained)
                if not role_models or any(m in called for m in role_models):
                    continue
                if _under_other_context(s, parents) or _adapters_switched_off(s, parents):
                    continue
                if not any(isinstance(n, ast.Name) and n.id == hit and isinstance(n.ctx, ast.Load)
                           for n in walk(node)):
                    continue  # a value the loop never reads (one of a model's many outputs)
                done.add(id(s))
                out.append((s.lineno, role, hit, on_trained[0], role_models[0]))
                break
    return sorted(set(out))


_SWITCH_OFF = re.compile(r"disable|unmerge|set_adapter|without_adapter", re.I)


def _adapters_switched_off(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Whether a statement before ``node`` in its block calls a method that switches the trained
    model's adapter off (PEFT's ``disable_adapter_layers()``, ``unmerge_adapter()``)."""
    block = parents.get(id(node))
    if block is None:
        return False
    for field in ("body", "orelse", "finalbody"):
        stmts = getattr(block, field, None)
        if isinstance(stmts, list) and node in stmts:
            for before in stmts[: stmts.index(node)]:
                for sub in walk(before):
                    if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) \
                            and _SWITCH_OFF.search(sub.func.attr):
                        return True
    return False


def _calls_backward(node: ast.AST) -> bool:
    return any(isinstance(s, ast.Call) and isinstance(s.func, ast.Attribute) and s.func.attr == "backward"
               for s in walk(node))


def _under_other_context(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    cur = parents.get(id(node))
    while cur is not None:
        if isinstance(cur, (ast.With, ast.AsyncWith)):
            for item in cur.items:
                ctx = item.context_expr
                f = ctx.func if isinstance(ctx, ast.Call) else ctx
                if not _NEUTRAL_WITH.search(_text(f)):
                    return True
        if isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            return False
        cur = parents.get(id(cur))
    return False
