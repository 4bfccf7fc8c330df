"""How long the script plans to train: the count of the loop around a DataLoader's loop, read
when the loader's first epoch begins.

At a loader's first ``__iter__`` from the script's ``for batch in loader:`` line, the source of
that function gives the loop around it: ``for epoch in range(E)`` (the count of ``range``:
``range(a, b)`` is ``b - a``; ``trange(E)``, and ``range`` inside ``tqdm(...)`` or
``enumerate(...)``) or ``while step < N`` (``N``, a count of the steps the body
counts); when the loader's loop is the outermost loop of a function (``train_one_epoch``), the
loop around that function's call in its caller. The count's expression is evaluated on the
frames' variables by a small evaluator that runs no code of the script: numbers, names,
attributes held in an object's own ``__dict__`` (``args.epochs``), a dict's or list's items
(``cfg["epochs"]``), arithmetic, and ``len``/``int``/``min``/``max``/``round``/``math.ceil``
of those (``len(loader)`` of a DataLoader is its real length, not the replay's).

The result is ``epoch_start``'s ``planned`` on the loader's first epoch: ``["epochs", E]`` or
``["steps", N]``; absent when the source does not show such a loop or its count cannot be read.
Once per loader.

A framework's loop holds the count instead (``framework_plan``): Lightning's fit loop, its
``max_epochs`` (when no ``max_steps`` and no ``limit_train_batches`` cut the epochs; its
``max_steps``, ``["updates", N]``, when they alone end the run), and the
transformers Trainer's ``_inner_training_loop``, its ``num_train_epochs`` (when
``args.max_steps`` does not decide), read from the frames between the loader's ``__iter__`` and
the script (attributes held in ``__dict__`` and the loop's locals: no property runs).
"""

from __future__ import annotations

import ast
import threading
import linecache
import math
import operator

from .patcher import per_check

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv, ast.Div: operator.truediv}
_MAX = 10 ** 9  # a count past this is no plan (a sentinel: 10**18, inf)
# the script's files parsed, by name, for one check (a file edited between two checks of one
# process is parsed again; a finished check's trees are not kept)
_TREES: dict[str, ast.AST | None] = per_check({})


# CPython 3.11's parser is not safe from two threads at once ("AST constructor recursion depth
# mismatch"): the script's threads reach the step budget together and parse here together
PARSE_LOCK = threading.Lock()


def _tree(filename: str):
    if filename not in _TREES:
        with PARSE_LOCK:
            if filename not in _TREES:
                try:
                    text = "".join(linecache.getlines(filename))
                    _TREES[filename] = ast.parse(text) if text else None
                except (SyntaxError, ValueError):
                    _TREES[filename] = None
    return _TREES[filename]


def _loops_around(tree, line: int) -> list:
    """The loops around ``line`` in the innermost function holding it, outermost first."""
    loops: list = []
    node = tree
    while True:
        inner = None
        for child in ast.iter_child_nodes(node):
            start = getattr(child, "lineno", None)
            if start is not None and start <= line <= (getattr(child, "end_lineno", None) or start):
                inner = child
                break
        if inner is None:
            return loops
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            loops = []
        elif isinstance(inner, (ast.For, ast.While)):
            loops.append(inner)
        node = inner


def _header(loop, line: int) -> bool:
    """``line`` is in the loop's header (``for batch in loader:``), not its body."""
    return loop.lineno <= line < (loop.body[0].lineno if loop.body else loop.lineno + 1)


class _Unknown(Exception):
    pass


def _evaluate(node, frame, real_len):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name):
        for scope in (frame.f_locals, frame.f_globals):
            if node.id in scope:
                return scope[node.id]
        raise _Unknown
    if isinstance(node, ast.Attribute):
        owner = _evaluate(node.value, frame, real_len)
        held = getattr(owner, "__dict__", None)
        if type(held) is dict and node.attr in held:  # no property, no __getattr__ runs
            return held[node.attr]
        raise _Unknown
    if isinstance(node, ast.Subscript):
        owner = _evaluate(node.value, frame, real_len)
        key = _evaluate(node.slice, frame, real_len) if not isinstance(node.slice, ast.Constant) \
            else node.slice.value
        if type(owner) is dict and type(key) in (str, int) and key in owner:
            return owner[key]
        if type(owner) in (list, tuple) and type(key) is int and -len(owner) <= key < len(owner):
            return owner[key]
        raise _Unknown
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _number(node.left, frame, real_len), _number(node.right, frame, real_len)
        if type(node.op) in (ast.FloorDiv, ast.Div) and right == 0:
            raise _Unknown
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.Call) and not node.keywords and len(node.args) >= 1:
        name = node.func.id if isinstance(node.func, ast.Name) else \
            node.func.attr if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
            and node.func.value.id == "math" else None
        if name == "len" and len(node.args) == 1:
            value = _evaluate(node.args[0], frame, real_len)
            n = real_len(value)
            if n is None:
                raise _Unknown
            return n
        values = [_number(arg, frame, real_len) for arg in node.args]
        if name == "int" and len(values) == 1:
            return int(values[0])
        if name == "round" and len(values) == 1:
            return round(values[0])
        if name in ("ceil", "floor") and len(values) == 1:
            return (math.ceil if name == "ceil" else math.floor)(values[0])
        if name in ("min", "max") and len(values) >= 2:
            return (min if name == "min" else max)(values)
    raise _Unknown


def _number(node, frame, real_len):
    value = _evaluate(node, frame, real_len)
    if type(value) not in (int, float) or not math.isfinite(value):
        raise _Unknown
    return value


# wrappers of an epoch loop's range that keep its count: tqdm(range(E)), enumerate(range(E))
_WRAPPERS = frozenset({"tqdm", "enumerate", "iter", "list"})


def _unwrapped(node):
    """``range(E)`` out of ``tqdm(range(E), desc=...)``, ``tqdm.tqdm(range(E))``,
    ``enumerate(range(E))``; the node itself otherwise."""
    while isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) \
            else None
        if name not in _WRAPPERS:
            break
        node = node.args[0]
    return node


def _count(loop, frame, real_len):
    """``["epochs", E]`` or ``["steps", N]`` for the loop, or None."""
    try:
        if isinstance(loop, ast.For):
            it = _unwrapped(loop.iter)
            if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in ("range", "trange") \
                    and 1 <= len(it.args) <= 2 and not it.keywords:
                values = [_number(arg, frame, real_len) for arg in it.args]
                if not all(type(v) is int for v in values):
                    return None
                n = values[0] if len(values) == 1 else values[1] - values[0]
                return ["epochs", n] if 0 < n <= _MAX else None
            return None
        test = loop.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and \
                isinstance(test.ops[0], (ast.Lt, ast.LtE)):
            n = _number(test.comparators[0], frame, real_len)
            n = int(n) + (1 if isinstance(test.ops[0], ast.LtE) else 0)
            return ["steps", n] if 0 < n <= _MAX else None
    except _Unknown:
        return None
    except Exception:  # an odd value (a type that refuses arithmetic): no plan
        return None
    return None


def planned(frame, is_user_file, real_len):
    """The plan around the loader loop running in ``frame`` (the script's frame that called
    ``iter(loader)``); ``real_len(obj)``: a DataLoader's real length, ``len`` of a plain
    container, else None."""
    if frame is None or not is_user_file(frame.f_code.co_filename):
        return None
    tree = _tree(frame.f_code.co_filename)
    loops = _loops_around(tree, frame.f_lineno) if tree is not None else []
    if not loops or not _header(loops[-1], frame.f_lineno):
        return None  # not a `for ... in loader:` line (next(iter(loader)), a comprehension)
    if len(loops) >= 2:
        return _count(loops[-2], frame, real_len)
    caller = frame.f_back  # the loader's loop is its function's outermost: train_one_epoch()
    if caller is None or not is_user_file(caller.f_code.co_filename):
        return None
    tree = _tree(caller.f_code.co_filename)
    loops = _loops_around(tree, caller.f_lineno) if tree is not None else []
    return _count(loops[-1], caller, real_len) if loops else None


_FRAMES = 64  # how far up the stack a framework's training loop is looked for


def _held(obj, name):
    held = getattr(obj, "__dict__", None)
    return held.get(name) if type(held) is dict else None


def _lightning_epochs(loop):
    """A Lightning ``_FitLoop``'s planned epochs, or its ``max_steps`` (``["updates", N]``:
    Lightning counts optimizer steps) when those alone end the run; None when both cut it or a
    batch limit does."""
    epochs = _held(loop, "max_epochs")
    epoch_loop = _held(loop, "epoch_loop")
    max_steps = _held(epoch_loop, "max_steps") if epoch_loop is not None else None
    trainer = _held(loop, "trainer")
    limit = _held(trainer, "limit_train_batches") if trainer is not None else None
    if limit is not None and limit != 1.0:
        return None
    if type(max_steps) is int and 0 < max_steps <= _MAX and epochs in (-1, None):
        return ["updates", max_steps]
    if type(epochs) is not int or not 0 < epochs <= _MAX or max_steps not in (-1, None):
        return None
    return ["epochs", epochs]


def _transformers_epochs(frame):
    """The transformers Trainer's planned epochs in its ``_inner_training_loop``, or None."""
    local = frame.f_locals
    epochs, done = local.get("num_train_epochs"), local.get("epochs_trained", 0)
    args = _held(local.get("self"), "args")
    max_steps = _held(args, "max_steps") if args is not None else None
    if type(epochs) is not int or type(done) is not int or (type(max_steps) is int and max_steps > 0):
        return None
    n = epochs - done
    return ["epochs", n] if 0 < n <= _MAX else None


def framework_plan(frame):
    """``["epochs", E]`` from the training loop of Lightning or the transformers Trainer running
    above ``frame`` (the caller of a DataLoader's ``__iter__``), or None."""
    for _ in range(_FRAMES):
        if frame is None:
            return None
        module = frame.f_globals.get("__name__", "")
        if module.startswith(("lightning.pytorch.loops", "pytorch_lightning.loops")):
            owner = frame.f_locals.get("self")
            if type(owner).__name__ == "_FitLoop":
                return _lightning_epochs(owner)
        elif module.startswith("transformers.trainer") and frame.f_code.co_name == "_inner_training_loop":
            return _transformers_epochs(frame)
        frame = frame.f_back
    return None
