"""What the user's source says around an event's line, for the few bugs no runtime event can
show: a method named without its call (``optimizer.zero_grad`` with no parentheses) runs nothing,
so the trace holds no trace of it. Read-only, cached, and silent on any failure (a file that is
gone, not Python, or a location that is not a file): the rules then fall back to the trace."""

from __future__ import annotations

import ast
import linecache
import os
import re
from functools import lru_cache, wraps

from .logliklines import unsigned_loglik_line
from .promptlines import mask_line as prompt_mask_line
from .promptlines import padding_mask_line


class ScriptSource:
    """The user's files as the rules read them. A trace's paths are shown paths, relative to
    where the check started (``base_dir``), not to the working directory of the moment (a
    script may change it, and an in-process check of ``train.py`` from another folder used to
    read the file of the last one); each method takes such a path and reads the absolute one."""

    def __init__(self, base_dir: str | None = None):
        self.base_dir = base_dir

    def full(self, path: str) -> str:
        if os.path.isabs(path) or path.startswith("<"):
            return path
        return os.path.normpath(os.path.join(self.base_dir or os.getcwd(), path))

    def bare_method_lines(self, path: str, line: int, method: str, outer: bool = False):
        return bare_method_lines(self.full(path), line, method, outer)

    def assigned_object(self, path: str, line: int, attribute: str) -> str | None:
        return assigned_object(self.full(path), line, attribute)

    def assigned_name(self, path: str, line: int) -> str | None:
        return assigned_name(self.full(path), line)

    def inside_loop(self, path: str, line: int) -> bool | None:
        return inside_loop(self.full(path), line)

    def innermost_loop(self, path: str, line: int) -> tuple[int, int] | None:
        return innermost_loop(self.full(path), line)

    def computed_before_loop(self, path: str, line: int, later: int) -> bool:
        return computed_before_loop(self.full(path), line, later)

    def lr_assignment_lines(self, path: str) -> list[int]:
        return lr_assignment_lines(self.full(path))

    def float_conversion_lines(self, path: str) -> list[tuple[int, str]]:
        return float_conversion_lines(self.full(path))

    def loader_batch_of_one_lines(self, path: str) -> list[tuple[int, str]]:
        return loader_batch_of_one_lines(self.full(path))

    def called_object(self, path: str, line: int, method: str) -> str | None:
        return called_object(self.full(path), line, method)

    def call_argument(self, path: str, line: int, function: str, position: int, keyword: str,
                      receiver: str | None = None) -> str | None:
        return call_argument(self.full(path), line, function, position, keyword, receiver)

    def method_receivers(self, path: str, line: int, method: str) -> list[str]:
        return method_receivers(self.full(path), line, method)

    def keyword_line(self, path: str, line: int, keyword: str) -> tuple[int, str] | None:
        return keyword_line(self.full(path), line, keyword)

    def cuts_gradient_near(self, path: str, line: int) -> bool | None:
        return cuts_gradient_near(self.full(path), line)

    def tail_flush(self, path: str, line: int) -> str | None:
        return tail_flush(self.full(path), line)

    def bound_to_underscore(self, path: str, line: int) -> bool:
        return bound_to_underscore(self.full(path), line)

    def result_dropped(self, path: str, line: int) -> bool:
        return result_dropped(self.full(path), line)

    def bound_beside(self, path: str, line: int, name: str) -> list[str]:
        return bound_beside(self.full(path), line, name)

    def split_slices(self, path: str) -> list[tuple[int, str, str, str, str]]:
        return split_slices(self.full(path))

    def bare_method_before(self, path: str, line: int, method: str) -> list[tuple[int, str]]:
        return bare_method_before(self.full(path), line, method)

    def cut_after(self, path: str, line: int) -> tuple[int, str] | None:
        return cut_after(self.full(path), line)

    def enclosing_function(self, path: str, line: int) -> str | None:
        return enclosing_function(self.full(path), line)

    def method_called_on_assigned(self, path: str, line: int, method: str,
                                  built: str | None = None) -> bool | None:
        return method_called_on_assigned(self.full(path), line, method, built)

    def batch_use(self, path: str, fetch_line: int, loop_line: int) -> dict | None:
        return batch_use(self.full(path), fetch_line, loop_line)

    def result_reaches_backward(self, path: str, line: int) -> int | None:
        return result_reaches_backward(self.full(path), line)

    def keeping_line(self, path: str, line: int, name: str) -> int | None:
        return keeping_line(self.full(path), line, name)

    def rebound_later(self, path: str, line: int) -> int | None:
        return rebound_later(self.full(path), line)

    def discarded_updates(self, path: str) -> list[tuple[int, str, str, str]]:
        return discarded_updates(self.full(path))

    def grad_clears(self, path: str, first: int, last: int) -> list[tuple[int, str]]:
        return grad_clears(self.full(path), first, last)

    def ratio_line(self, path: str, line: int, fault: str) -> tuple[int, str] | None:
        return ratio_line(self.full(path), line, fault)

    def loss_assignment(self, path: str, line: int, framework: bool = False) -> tuple[int, str] | None:
        return loss_assignment(self.full(path), line, framework)

    def item_term(self, path: str, line: int) -> tuple[int, str] | None:
        return item_term(self.full(path), line)

    def loss_term_assignment(self, path: str, line: int) -> tuple[int, str] | None:
        return loss_term_assignment(self.full(path), line)

    def accumulated_term(self, path: str, line: int, after: int) -> tuple[int, str] | None:
        return accumulated_term(self.full(path), line, after)

    def zipped_unread(self, path: str, line: int) -> list[tuple[str, list[str], list[int]]]:
        return zipped_unread(self.full(path), line)

    def advantage_line(self, path: str, line: int) -> tuple[int, str] | None:
        return advantage_line(self.full(path), line)

    def policy_term_line(self, path: str, line: int) -> tuple[int, str] | None:
        return policy_term_line(self.full(path), line)

    def score_weight_line(self, path: str, line: int) -> tuple[int, str] | None:
        return score_weight_line(self.full(path), line)

    def degree_power_line(self, path: str) -> tuple[int, str] | None:
        return degree_power_line(self.full(path))

    def unsigned_loglik_line(self, path: str) -> tuple[int, str] | None:
        return unsigned_loglik_line(self.full(path))

    def self_scatter_line(self, path: str) -> tuple[int, str] | None:
        return self_scatter_line(self.full(path))

    def done_flag_bootstraps(self, path: str) -> list[tuple[int, str, str, str]]:
        return done_flag_bootstraps(self.full(path))

    def twin_critics_maximised(self, path: str) -> list[tuple[int, str, str]]:
        return twin_critics_maximised(self.full(path))

    def target_slice_line(self, path: str, columns: bool = False) -> tuple[int, str] | None:
        full = self.full(path)
        return target_column_slice_line(full) if columns else target_slice_line(full)

    def table_sliced_by_batch(self, path: str) -> list[tuple[int, str, str]]:
        return table_sliced_by_batch(self.full(path))

    def indices_as_values(self, path: str) -> list[tuple[int, str, str, int]]:
        return indices_as_values(self.full(path))

    def loss_sites(self, path: str) -> tuple[dict, list]:
        return loss_sites(self.full(path))

    def calls_named(self, path: str, names) -> list[tuple[int, str, bool]]:
        return calls_named(self.full(path), frozenset(names))

    def full_sums(self, path: str) -> list[tuple[int, str]]:
        return full_sums(self.full(path))

    def term_line(self, path: str, line: int, term: str) -> tuple[int, str] | None:
        return term_line(self.full(path), line, term)

    def square_weight_origin(self, path: str) -> tuple[int, str, str] | None:
        return square_weight_origin(self.full(path))

    def variance_added_lines(self, path: str) -> list[tuple[int, str, str]]:
        return variance_added_lines(self.full(path))

    def self_product_lines(self, path: str) -> list[tuple[int, str, str]]:
        return self_product_lines(self.full(path))

    def indexed_by_variable(self, path: str) -> frozenset:
        return indexed_by_variable(self.full(path))

    def factor_mentions(self, path: str, line: int, function: str, lr_text: str | None,
                        lr_value: float | None) -> str | None:
        return factor_mentions(self.full(path), line, function, lr_text, lr_value)

    def factor_capped(self, path: str, line: int, function: str) -> bool:
        return factor_capped(self.full(path), line, function)

    def written_lr_capped(self, path: str, line: int) -> bool:
        return written_lr_capped(self.full(path), line)

    def factor_branch_line(self, path: str, line: int, function: str) -> int | None:
        return factor_branch_line(self.full(path), line, function)

    def factor_straight(self, path: str, line: int, function: str) -> bool:
        return factor_straight(self.full(path), line, function)

    def stops_on_divergence(self, path: str, line: int) -> bool:
        return stops_on_divergence(self.full(path), line)

    def cut_penalty(self, path: str, line: int) -> tuple[int, str] | None:
        return cut_penalty(self.full(path), line)

    def no_grad_block(self, path: str, line: int) -> tuple[int, str] | None:
        return no_grad_block(self.full(path), line)

    def error_line(self, path: str, line: int) -> tuple[int, str] | None:
        return error_line(self.full(path), line)

    def comparison_line(self, path: str, line: int, form: str) -> tuple[int, str, str] | None:
        return comparison_line(self.full(path), line, form)

    def schedule_arguments(self, path: str, line: int, cls: str) -> str | None:
        return schedule_arguments(self.full(path), line, cls)

    def value_reaches_backward(self, path: str, line: int) -> int | None:
        return value_reaches_backward(self.full(path), line)

    def hard_cut_term(self, path: str, line: int) -> tuple[int, str, str, str] | None:
        return hard_cut_term(self.full(path), line)

    def graph_cut(self, path: str, line: int, fn: str, whole: bool = False) -> tuple[int, str, str] | None:
        return graph_cut(self.full(path), line, fn, whole)

    def operand_cut(self, path: str, line: int, operand: tuple) -> tuple[int, str, str] | None:
        return operand_cut(self.full(path), line, operand)

    def sum_operand_text(self, path: str, line: int, operand: tuple) -> str | None:
        return sum_operand_text(self.full(path), line, operand)

    def group_lr(self, path: str, line: int, index: int) -> tuple[int, str] | None:
        return group_lr(self.full(path), line, index)

    def param_writes(self, path: str) -> list[tuple[int, str, str, str | None]]:
        return param_writes(self.full(path))

    def softmax_first_axis_calls(self, path: str) -> list[tuple[int, str]]:
        return softmax_first_axis_calls(self.full(path))

    def sum_normalised_first_axis(self, path: str) -> list[tuple[int, str]]:
        return sum_normalised_first_axis(self.full(path))

    def label_weight_tables(self, path: str) -> list[tuple[int, str, str]]:
        return label_weight_tables(self.full(path))

    def column_picks_by_name(self, path: str) -> list[tuple[int, str, str, str]]:
        return column_picks_by_name(self.full(path))

    def gather_first_axis_calls(self, path: str) -> list[tuple[int, str]]:
        return gather_first_axis_calls(self.full(path))

    def subtracting_lines(self, path: str, name: str) -> list[tuple[int, str]]:
        return subtracting_lines(self.full(path), name)

    def subtracted_beside_factor(self, path: str, element: str) -> list[tuple[int, str]]:
        return subtracted_beside_factor(self.full(path), element)

    def foreach_writes(self, path: str, name: str) -> list[int]:
        return foreach_writes(self.full(path), name)

    def moves_to_host(self, path: str, line: int) -> bool | None:
        return moves_to_host(self.full(path), line)

    def copy_writers(self, path: str, name: str) -> dict | None:
        return copy_writers(self.full(path), name)

    def self_load_alias(self, path: str, line: int) -> tuple[str, str, int | None] | None:
        return self_load_alias(self.full(path), line)

    def loop_names(self, path: str, line: int) -> tuple[str | None, str | None] | None:
        return loop_names(self.full(path), line)

    def loss_row_selections(self, path: str, line: int) -> dict | None:
        return loss_row_selections(self.full(path), line)

    def output_read_line(self, path: str, line: int, time_dim: int, position: int,
                         length: int, through: frozenset = frozenset()) -> tuple[int, str] | None:
        return output_read_line(self.full(path), line, time_dim, position, length, through)

    def score_scalings(self, path: str) -> list[tuple[int, str, str, bool]]:
        return score_scalings(self.full(path))

    def temperature_products(self, path: str) -> list[tuple[int, str, str, bool, float | None]]:
        return temperature_products(self.full(path))

    def target_origin(self, path: str, line: int) -> dict | None:
        return target_origin(self.full(path), line)

    def target_assignment(self, path: str, line: int) -> tuple[int, str] | None:
        return target_assignment(self.full(path), line)

    def ignore_canvas(self, path: str, line: int, ignore_index: int) -> bool:
        return ignore_canvas(self.full(path), line, ignore_index)

    def function_calls_any(self, path: str, line: int, names: frozenset) -> bool:
        return function_calls_any(self.full(path), line, names)

    def argument_origin(self, path: str, line: int, callee: str, keyword: str) -> tuple[int, str] | None:
        return argument_origin(self.full(path), line, callee, keyword)

    def keyword_argument(self, path: str, callee: str, keywords) -> tuple[int, str] | None:
        return keyword_argument(self.full(path), callee, tuple(keywords))

    def squeeze_assignment(self, path: str, line: int, position: int) -> tuple[int, str, str] | None:
        return squeeze_assignment(self.full(path), line, position)

    def stored_array_use(self, path: str, line: int, attr: str) -> dict | None:
        return stored_array_use(self.full(path), line, attr)

    def labels_written(self, path: str, line: int, functions) -> tuple[int, str, str, str, bool] | None:
        return labels_written(self.full(path), line, functions)

    def labels_built(self, path: str, line: int) -> tuple[int, str, str] | None:
        return labels_built(self.full(path), line)

    def call_with_swapped(self, path: str, line: int, first: int, second: int) -> tuple[str, str] | None:
        return call_with_swapped(self.full(path), line, first, second)

    def target_filled_before(self, path: str, line: int) -> tuple[int, str, str] | None:
        return target_filled_before(self.full(path), line)

    def adversarial_term_after(self, path: str, line: int) -> tuple[int, str] | None:
        return adversarial_term_after(self.full(path), line)

    def snapshot_restored_later(self, path: str, line: int, name: str) -> tuple[int, str] | None:
        return snapshot_restored_later(self.full(path), line, name)

    def tree(self, path: str) -> ast.AST | None:
        """The parsed file (shared, cached: not to be changed), or None."""
        return _parse(self.full(path))

    def term_assignment(self, path: str, line: int, name: str) -> tuple[int, str] | None:
        return term_assignment(self.full(path), line, name)

    def value_origin(self, path: str, line: int, name: str) -> tuple[int, str] | None:
        return value_origin(self.full(path), line, name)

    def prompt_mask_line(self, path: str, ignore: int) -> tuple[int, str] | None:
        return prompt_mask_line(self.full(path), ignore)

    def padding_mask_line(self, path: str, ignore: int) -> tuple[int, str] | None:
        return padding_mask_line(self.full(path), ignore)

    def rounding_behind(self, path: str, line: int) -> tuple[int, str] | None:
        return rounding_behind(self.full(path), line)

    def target_made(self, path: str, line: int) -> tuple[int, str] | None:
        """``(line, text)`` of the statement that made the values of the target a loss call on
        ``line`` is given by name (``target_origin``'s name, followed by ``value_origin``);
        None when the target is written inline or its making is not found."""
        origin = target_origin(self.full(path), line)
        name = (origin or {}).get("target")
        if not name or not name.isidentifier():
            return None
        return value_origin(self.full(path), line, name)

    def batch_axis_scatter(self, path: str) -> tuple[int, str] | None:
        """``(line, text)`` of the one ``scatter``/``scatter_`` call in the file given dim 0
        (``t.scatter_(0, y.unsqueeze(1), 1.0)``), or None (none, or several)."""
        tree = self.tree(path)
        if tree is None:
            return None
        found = []
        for node in walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("scatter", "scatter_"):
                dim = node.args[0] if node.args else next(
                    (k.value for k in node.keywords if k.arg == "dim"), None)
                if isinstance(dim, ast.Constant) and dim.value == 0:
                    found.append((node.lineno, ast.unparse(node)))
        return found[0] if len(found) == 1 else None

    def soft_target_origin(self, path: str, line: int) -> tuple[int, str] | None:
        return soft_target_origin(self.full(path), line)

    def lines(self, path: str) -> list[str]:
        """The file's lines ([] when it cannot be read)."""
        try:
            return linecache.getlines(self.full(path))
        except Exception:
            return []

    def line_text(self, path: str, line: int) -> str:
        """The text of that line ("" when it cannot be read)."""
        try:
            return linecache.getline(self.full(path), line)
        except Exception:
            return ""


def _enclosing_function(tree: ast.AST, line: int, lambdas: bool = False) -> ast.AST:
    """The innermost function (or lambda, with ``lambdas``) whose lines hold ``line``; the
    module when none does."""
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda) if lambdas else \
        (ast.FunctionDef, ast.AsyncFunctionDef)
    scope: ast.AST = tree
    for node in walk(tree):
        if isinstance(node, kinds) and node.lineno <= line <= (node.end_lineno or node.lineno) \
                and (scope is tree or node.lineno >= scope.lineno):
            scope = node
    return scope


@lru_cache(maxsize=64)
def _tree(text: str) -> ast.AST | None:
    try:
        tree = ast.parse(text)
    except Exception:
        return None
    tree._graddoctor_nodes = None  # its nodes and theirs, listed by ``walk`` on first use
    walk(tree)
    return tree


def walk(node: ast.AST):
    """``ast.walk(node)``: the same nodes in the same order. A file parsed here (``_tree``: shared
    and never changed) lists its nodes once, on its first walk, and marks them so that a walk of
    any of them is listed once too: the rules walk each file, and each function and statement of
    it, hundreds of times per check, and each walk of ``ast.walk`` builds every node's children
    again. A node of any other tree (a rule's own parse, which it may change) is walked afresh."""
    nodes = getattr(node, "_graddoctor_nodes", _UNLISTED)
    if nodes is _UNLISTED:
        return ast.walk(node)
    if nodes is None:
        nodes = node._graddoctor_nodes = tuple(ast.walk(node))
        if isinstance(node, ast.Module):
            for inner in nodes[1:]:
                inner._graddoctor_nodes = None
    return iter(nodes)


_UNLISTED = object()


def scope_walk(node: ast.AST):
    """The nodes under ``node``, not entering nested functions, lambdas or classes (their names
    are their own): one function's (or the module's) statements and expressions. Listed once per
    node of a shared file (see ``walk``)."""
    if getattr(node, "_graddoctor_nodes", _UNLISTED) is _UNLISTED:
        return _scope_nodes(node)
    nodes = getattr(node, "_graddoctor_scope", None)
    if nodes is None:
        nodes = node._graddoctor_scope = tuple(_scope_nodes(node))
    return iter(nodes)


def _scope_nodes(node: ast.AST):
    stack = list(ast.iter_child_nodes(node))
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield n
        stack.extend(ast.iter_child_nodes(n))


def _once_per_file(derive):
    """``derive(path)``, a search of the whole file that reads nothing but its parsed tree,
    computed once per parsed text and kept on the tree: the analyses of one file (a check's,
    the same run folded, a second check of the same script) share it. A list comes back as a
    copy of its own."""
    name = derive.__name__

    @wraps(derive)
    def once(path: str):
        tree = _parse(path)
        if tree is None:
            return derive(path)
        memo = getattr(tree, "_graddoctor_memo", None)
        if memo is None:
            memo = tree._graddoctor_memo = {}
        if name not in memo:
            memo[name] = derive(path)
        found = memo[name]
        return list(found) if isinstance(found, list) else found

    return once


def _parse(path: str) -> ast.AST | None:
    # keyed by the text, not the name: a relative name (or a name of the same length) may stand
    # for another file by now, as in two checks of ``train.py`` from two directories
    try:
        linecache.checkcache(path)  # keeps the text that ran (run/target.py), drops edited files
        lines = linecache.getlines(path)
    except Exception:
        return None
    return _tree("".join(lines)) if lines else None


def bare_method_lines(path: str, line: int, method: str, outer: bool = False) -> list[tuple[int, str]]:
    """The lines, inside the innermost loop that holds ``line``, of expression statements that
    name ``<something>.<method>`` without calling it (``optimizer.zero_grad``): they do nothing.
    Each as ``(line, its source text)``.
    ``outer``: search the outermost loop that holds ``line`` instead (a per-epoch call such as
    ``model.train()`` sits in the epoch loop, around the batch loop). Empty when the source
    cannot be read or ``line`` is in no loop."""
    tree = _parse(path)
    if tree is None:
        return []
    loop = None
    for node in walk(tree):
        if (isinstance(node, (ast.For, ast.While, ast.AsyncFor))
                and node.lineno <= line <= (node.end_lineno or node.lineno)
                and (loop is None or (node.lineno < loop.lineno if outer else node.lineno >= loop.lineno))):
            loop = node
    if loop is None:
        return []
    return sorted((node.lineno, ast.unparse(node.value)) for node in walk(loop)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Attribute)
                  and node.value.attr == method)


def assigned_object(path: str, line: int, attribute: str) -> str | None:
    """The source text of the object whose ``attribute`` the statement at ``line`` assigns
    (``opt`` in ``opt.lr = 1e-3``), so that a fix can name the script's own variable; None when
    the source cannot be read or holds no such assignment there."""
    tree = _parse(path)
    if tree is None:
        return None
    for node in walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.lineno == line:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == attribute:
                    return ast.unparse(target.value)
    return None


def assigned_name(path: str, line: int) -> str | None:
    """The one name (``opt_g``, ``self.opt_d``) a statement starting at ``line`` assigns its
    value to, so that messages can call an object what the script calls it; None when the
    statement assigns to no single plain name or attribute, or the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    for node in walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.lineno <= line \
                <= (node.end_lineno or node.lineno):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], (ast.Name, ast.Attribute)):
                return ast.unparse(targets[0])
            return None
    return None


def inside_loop(path: str, line: int) -> bool | None:
    """Does a ``for``/``while`` loop of the function (or module) whose body holds ``line`` hold
    it too? Loops of an enclosing function around a nested one do not count. None when the
    source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    scope = _enclosing_function(tree, line, lambdas=True)
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue  # another scope
        if (isinstance(node, (ast.For, ast.While, ast.AsyncFor))
                and node.lineno <= line <= (node.end_lineno or node.lineno)):
            return True
        todo.extend(ast.iter_child_nodes(node))
    return False


def innermost_loop(path: str, line: int) -> tuple[int, int] | None:
    """``(first, last)`` line of the innermost ``for``/``while`` loop of ``path`` that holds
    ``line``, or None (no loop, or the file cannot be read)."""
    tree = _parse(path)
    if tree is None:
        return None
    best = None
    for node in walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and \
                node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is None or node.lineno >= best[0]:
                best = (node.lineno, node.end_lineno or node.lineno)
    return best


def computed_before_loop(path: str, line: int, later: int) -> bool:
    """Whether the statement at ``line`` runs once, outside every loop of its function (or
    module), while ``later`` sits in a loop of the same function that starts after it: a value
    computed once before a training loop and read at each of its passes."""
    tree = _parse(path)
    if tree is None or later <= line:
        return False
    scope = _enclosing_function(tree, line, lambdas=True)
    if scope is not _enclosing_function(tree, later, lambdas=True) or inside_loop(path, line) is not False:
        return False
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if (isinstance(node, (ast.For, ast.While, ast.AsyncFor)) and node.lineno > line
                and node.lineno <= later <= (node.end_lineno or node.lineno)):
            return True
        todo.extend(ast.iter_child_nodes(node))
    return False


def shared_if(tree: ast.AST | None, first: int, second: int) -> int | None:
    """The line of the innermost ``if`` whose body holds both lines (neither in its test), or
    None."""
    if tree is None:
        return None
    best = None
    for node in walk(tree):
        if isinstance(node, ast.If) and node.body:
            start, end = node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno
            if start <= first <= end and start <= second <= end and (best is None or node.lineno > best):
                best = node.lineno
    return best


@lru_cache(maxsize=16)
def _lr_lines(text: str) -> tuple[int, ...]:
    try:
        tree = ast.parse(text)
    except Exception:
        return ()
    found = []
    for node in walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign) else []
        for target in targets:
            if (isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant)
                    and target.slice.value == "lr"):
                found.append(node.lineno)
    return tuple(sorted(set(found)))


def lr_assignment_lines(path: str) -> list[int]:
    """The lines of ``<something>["lr"] = ...`` (or ``*=``, ...) in the file: where a script
    writes a param group's learning rate itself. Empty when the source cannot be read.
    Keyed by the text (not the name: a relative name may stand for another file by now)."""
    try:
        linecache.checkcache(path)
        lines = linecache.getlines(path)
        return list(_lr_lines("".join(lines))) if lines else []
    except Exception:
        return []


_FLOAT_METHODS = ("float", "double", "half", "bfloat16")
_REDUCTIONS = ("mean", "sum", "std", "var", "max", "min", "amax", "amin", "norm", "median", "item")
_FLOAT_DTYPES = ("float", "float32", "float64", "float16", "double", "half", "bfloat16")


def _makes_float(node: ast.AST) -> bool:
    """``x.float()`` (``double``, ``half``, ``bfloat16``), ``x.to(torch.float32)``,
    ``x.type(torch.float)``, ``x.to(dtype=torch.float32)``: a tensor made floating point."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    if node.func.attr in _FLOAT_METHODS:
        return not node.args and not node.keywords
    if node.func.attr not in ("to", "type"):
        return False
    given = list(node.args) + [k.value for k in node.keywords if k.arg == "dtype"]
    return any(isinstance(g, ast.Attribute) and g.attr in _FLOAT_DTYPES for g in given)


def float_conversion_lines(path: str) -> list[tuple[int, str]]:
    """``(line, text)`` of each statement that makes a tensor floating point (``x.float()``,
    ``x.to(torch.float32)``) and divides or multiplies nothing in it: where an 8-bit image is
    made float without being scaled. Empty when the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    found = []
    for stmt in walk(tree):
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Expr, ast.Return, ast.AugAssign)):
            continue
        nodes = list(walk(stmt))
        if not any(_makes_float(n) for n in nodes):
            continue
        if any(isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.Mult, ast.Sub))
               for n in nodes) or isinstance(stmt, ast.AugAssign):
            continue  # scaled (or shifted) in the same statement
        if any(isinstance(n, ast.Compare) or isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr in _REDUCTIONS for n in nodes):
            continue  # a statistic or a label made from the values, not a batch
        found.append((stmt.lineno, ast.unparse(stmt)))
    return sorted(found)


def _is_one(node: ast.AST, ones: set[str]) -> bool:
    return (isinstance(node, ast.Constant) and type(node.value) is int and node.value == 1) or (
        isinstance(node, ast.Name) and node.id in ones)


def loader_batch_of_one_lines(path: str) -> list[tuple[int, str]]:
    """``(line, text)`` of each ``DataLoader(...)`` call whose batch size is 1: ``batch_size=1``
    (or the second argument 1), written as the literal or as a name the file assigns only 1
    (``BATCH_SIZE = 1``). Empty when the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    values: dict[str, set] = {}
    for node in walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    values.setdefault(target.id, set()).add(
                        node.value.value if isinstance(node.value, ast.Constant) else None)
    ones = {name for name, seen in values.items() if seen == {1}}
    found = []
    for node in walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if not name.endswith("DataLoader"):
            continue
        given = [k.value for k in node.keywords if k.arg == "batch_size"] + list(node.args[1:2])
        if given and _is_one(given[0], ones):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def called_object(path: str, line: int, method: str) -> str | None:
    """The source text of the object whose ``method`` a call on ``line`` calls (``opt`` in
    ``opt.step()``, ``scaler`` in ``scaler.scale(loss).backward()``), so that a fix can name the
    script's own variables; None when the source cannot be read or holds no such call there."""
    tree = _parse(path)
    if tree is None:
        return None
    for node in walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == method and node.lineno <= line <= (node.end_lineno or node.lineno)):
            return ast.unparse(node.func.value)
    return None


def call_argument(path: str, line: int, function: str, position: int, keyword: str,
                  receiver: str | None = None) -> str | None:
    """The source text of an argument of a call of ``function`` (a plain or dotted name ending
    so: ``clip_grad_norm_`` matches ``torch.nn.utils.clip_grad_norm_``) on ``line``, given at
    ``position`` or as ``keyword=``: ``args.clip`` in ``clip_grad_norm_(params, args.clip)``.
    With ``receiver``, only a method call on that object counts (``sched_b.step(val_loss)``
    beside ``sched_a.step(val_f1)`` on one line). None when the source cannot be read or shows
    no such call and argument there."""
    tree = _parse(path)
    if tree is None:
        return None
    for node in walk(tree):
        if not (isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno)):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name != function:
            continue
        if receiver is not None and not (isinstance(node.func, ast.Attribute)
                                         and ast.unparse(node.func.value) == receiver):
            continue
        for kw in node.keywords:
            if kw.arg == keyword:
                return ast.unparse(kw.value)
        if len(node.args) > position and not any(isinstance(a, ast.Starred) for a in node.args[:position + 1]):
            return ast.unparse(node.args[position])
    return None


def method_receivers(path: str, line: int, method: str) -> list[str]:
    """The objects whose ``method`` the statements on ``line`` call, in source order
    (``["sched_a", "sched_b"]`` for ``sched_a.step(f1); sched_b.step(loss)``)."""
    tree = _parse(path)
    if tree is None:
        return []
    calls = [node for node in walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and node.func.attr == method and node.lineno <= line <= (node.end_lineno or node.lineno)]
    return [ast.unparse(c.func.value) for c in sorted(calls, key=lambda c: (c.lineno, c.col_offset))]


def keyword_line(path: str, line: int, keyword: str) -> tuple[int, str] | None:
    """``(line, text)`` where ``keyword=`` is written in the innermost call spanning ``line``
    that is given it (a call written over several lines names it on one of them): where an
    argument's value is to be changed. None when the source cannot be read or shows no such
    call there."""
    tree = _parse(path)
    if tree is None:
        return None
    found = None
    for node in walk(tree):
        if not (isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno)):
            continue
        for kw in node.keywords:
            if kw.arg == keyword and (found is None or node.lineno >= found[0]):
                found = (node.lineno, kw.value.lineno, ast.unparse(kw.value))
    return (found[1], f"{keyword}={found[2]}") if found is not None else None


_CUTS = ("detach", "detach_", "data")


def bound_to_underscore(path: str, line: int) -> bool:
    """Whether a statement on ``line`` binds a call's result to ``_`` alone (``_ = self.net(x)``):
    the script runs the call for what it does on the way (a forward hook that captures a hidden
    layer, as BYOL's NetWrapper does) and drops its result on purpose. A bare call statement
    (``self.bn(x)``, a forgotten assignment) is not one."""
    tree = _parse(path)
    if tree is None:
        return False
    for node in walk(tree):
        if isinstance(node, ast.Assign) and node.lineno <= line <= (node.end_lineno or node.lineno) \
                and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id == "_" and isinstance(node.value, ast.Call):
            return True
    return False


def result_dropped(path: str, line: int) -> bool:
    """Whether the statement on ``line`` is a call whose result nothing keeps: a bare call
    statement (``model(x)``), one bound to ``_`` alone, or one bound to a name that nothing in
    its function reads. A forward run that way is run for
    what it does on the way (BatchNorm statistics re-estimated, a hook's capture), not for
    its output."""
    tree = _parse(path)
    if tree is None:
        return False
    node = _statement_at(tree, line)
    if isinstance(node, ast.Expr):
        return isinstance(node.value, ast.Call)
    if _bound_and_never_read(tree, node, line):
        return True
    return bound_to_underscore(path, line)


def _bound_and_never_read(tree: ast.AST, node, line: int) -> bool:
    """``output = model(x)`` where nothing in the function holding it (the whole file at module
    level) ever reads ``output``: the result is bound by habit and dropped all the same (SWA's
    original ``bn_update`` loop)."""
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call)):
        return False
    if any(isinstance(sub, ast.Call) for sub in walk(node.value.func)):
        return False  # model(x).argmax(1): the forward's result is used, then the answer bound
    name = node.targets[0].id
    scope = _enclosing_function(tree, line)
    for sub in walk(scope):
        if isinstance(sub, ast.Name) and sub.id == name and not isinstance(sub.ctx, ast.Store):
            return False
        if isinstance(sub, (ast.Global, ast.Nonlocal)) and name in sub.names:
            return False
    return True  # a function's local (no global/nonlocal) is read nowhere but in it


def bound_beside(path: str, line: int, name: str) -> list[str]:
    """The other names bound by the latest assignment above ``line`` (in the innermost function
    holding it, else the file) that binds ``name`` as one item of a tuple (``val_loss, val_acc
    = evaluate()``): the values the script had at hand beside ``name``. Empty when the source
    cannot be read or no such assignment is found."""
    tree = _parse(path)
    if tree is None:
        return []
    scope = tree
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.lineno <= line <= (node.end_lineno or node.lineno) \
                and (scope is tree or node.lineno >= scope.lineno):
            scope = node
    best = None
    for node in walk(scope):
        if not isinstance(node, ast.Assign) or node.lineno >= line:
            continue
        for target in node.targets:
            if isinstance(target, (ast.Tuple, ast.List)):
                names = [e.id for e in target.elts if isinstance(e, ast.Name)]
                if name in names and (best is None or node.lineno > best[0]):
                    best = (node.lineno, [n for n in names if n != name and n != "_"])
    return best[1] if best is not None else []


def split_slices(path: str) -> list[tuple[int, str, str, str, str]]:
    """``(line, name, slice text, other name, its slice text)`` for each name bound to a slice
    of a sequence with constant bounds (``val_idx = perm[192:]``) whose rows overlap another
    slice of the same sequence bound to another name anywhere in the file (``train_idx =
    perm[:256]``): two parts of one split that share rows. The line is the later binding's."""
    tree = _parse(path)
    if tree is None:
        return []
    bound = []  # (line, name, sequence text, start, stop, slice text)
    for node in walk(tree):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        pairs = []
        if isinstance(target, ast.Name):
            pairs = [(target, value)]
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) \
                and len(target.elts) == len(value.elts):
            pairs = list(zip(target.elts, value.elts))
        for name, part in pairs:
            if not (isinstance(name, ast.Name) and isinstance(part, ast.Subscript)
                    and isinstance(part.slice, ast.Slice) and part.slice.step is None):
                continue
            ends = []
            for end in (part.slice.lower, part.slice.upper):
                if end is None:
                    ends.append(None)
                elif isinstance(end, ast.Constant) and type(end.value) is int and end.value >= 0:
                    ends.append(end.value)
                else:
                    ends = None
                    break
            if ends is None:
                continue
            bound.append((node.lineno, name.id, ast.unparse(part.value), ends[0] or 0, ends[1],
                          ast.unparse(part)))
    found = []
    for i, (line, name, seq, start, stop, text) in enumerate(bound):
        for other_line, other, other_seq, other_start, other_stop, other_text in bound[:i]:
            if other == name or other_seq != seq:
                continue
            if (stop is None or other_start < stop) and (other_stop is None or start < other_stop):
                found.append((max(line, other_line), name, text, other, other_text))
    return sorted(set(found))


def bare_method_before(path: str, line: int, method: str) -> list[tuple[int, str]]:
    """The expression statements that name ``<something>.<method>`` without calling it
    (``model.eval``: they do nothing), above ``line`` in the innermost function holding it,
    else in the outermost loop holding it; each as ``(line, its source text)``. Empty when the
    source cannot be read or ``line`` is in neither."""
    tree = _parse(path)
    if tree is None:
        return []
    scope = None
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.lineno <= line <= (node.end_lineno or node.lineno) \
                and (scope is None or node.lineno >= scope.lineno):
            scope = node
    if scope is None:
        for node in walk(tree):
            if isinstance(node, (ast.For, ast.While, ast.AsyncFor)) \
                    and node.lineno <= line <= (node.end_lineno or node.lineno) \
                    and (scope is None or node.lineno < scope.lineno):
                scope = node
    if scope is None:
        return []
    return sorted((node.lineno, ast.unparse(node.value)) for node in walk(scope)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Attribute)
                  and node.value.attr == method and node.lineno < line)


def cuts_gradient_near(path: str, line: int) -> bool | None:
    """Does the code around ``line`` cut a tensor from its graph (``.detach()``, ``.detach_()``,
    ``.data``)? Around: the innermost function holding it, else (module level) the innermost loop,
    else its statement. None when the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    scope: ast.AST | None = None
    for node in walk(tree):
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                and node.lineno <= line <= (node.end_lineno or node.lineno)
                and (scope is None or node.lineno >= scope.lineno)):
            scope = node
    if scope is None:
        holding = [node for node in walk(tree) if isinstance(node, ast.stmt)
                   and node.lineno <= line <= (node.end_lineno or node.lineno)]
        loops = [node for node in holding if isinstance(node, (ast.For, ast.While, ast.AsyncFor))]
        inner = loops or holding
        scope = max(inner, key=lambda node: node.lineno) if inner else None
    if scope is None:
        return None
    for node in walk(scope):
        if isinstance(node, ast.Attribute) and node.attr in _CUTS:
            return True
    return False


def enclosing_function(path: str, line: int) -> str | None:
    """The name of the innermost function holding ``line``; None at module level or when the
    source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    scope = None
    for node in walk(tree):
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.lineno <= line <= (node.end_lineno or node.lineno)
                and (scope is None or node.lineno >= scope.lineno)):
            scope = node
    return scope.name if scope is not None else None


def cut_after(path: str, line: int) -> tuple[int, str] | None:
    """The first statement after ``line``, in the function that holds it, that cuts a tensor
    from its graph (``.detach()``, ``.detach_()``, ``.data``): (its line, its text). None at
    module level, when there is none, or when the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    scope = None
    for node in walk(tree):
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.lineno <= line <= (node.end_lineno or node.lineno)
                and (scope is None or node.lineno >= scope.lineno)):
            scope = node
    if scope is None:
        return None
    found = [node.lineno for node in walk(scope)
             if isinstance(node, ast.Attribute) and node.attr in _CUTS and node.lineno > line]
    if not found:
        return None
    first = min(found)
    text = linecache.getline(path, first).split("  #")[0].strip()
    return (first, text) if text else None


def _has_modulo(node: ast.AST) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in walk(node))


def _disjuncts(test: ast.AST) -> list[ast.AST]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return [d for value in test.values for d in _disjuncts(value)]
    return [test]


def tail_flush(path: str, line: int) -> str | None:
    """The source text of a second way into an accumulation step: in the test of an ``if``
    whose body holds ``line``, an ``or`` that joins a window test with a ``%`` (``(i + 1) % k
    == 0``) to one without (``i + 1 == num_batches``, ``i == len(loader) - 1``, ``is_last``),
    which flushes the epoch's tail at a count of the script's own. None when the source cannot
    be read or shows no such test."""
    tree = _parse(path)
    if tree is None:
        return None
    for node in walk(tree):
        if not (isinstance(node, ast.If) and node.body
                and node.body[0].lineno <= line <= (node.body[-1].end_lineno or node.body[-1].lineno)):
            continue
        parts = _disjuncts(node.test)
        if len(parts) > 1 and any(_has_modulo(d) for d in parts):
            plain = [d for d in parts if not _has_modulo(d)]
            if plain:
                return ast.unparse(plain[0])
    return None


def method_called_on_assigned(path: str, line: int, method: str,
                              built: str | None = None) -> bool | None:
    """Does the file call ``<target>.<method>(...)`` anywhere, for the object the statement at
    ``line`` assigns (``swa_scheduler`` in ``swa_scheduler = SWALR(...)``), under that name or
    another one it is handed on as? The object is followed through the file by name: an
    assignment whose value mentions it (``self.scheduler = kwargs["scheduler"]``), a keyword
    argument it is passed as (``SimCLR(scheduler=scheduler)``). Of several assignments on the
    line (``swa = AveragedModel(m); sched = SWALR(opt)``), the one whose value calls ``built``
    (a class name) when given. None when the source cannot be read or the statement assigns no
    plain target."""
    tree = _parse(path)
    if tree is None:
        return None
    candidates = []
    for node in walk(tree):
        if (isinstance(node, (ast.Assign, ast.AnnAssign)) and node.lineno <= line <= (node.end_lineno or node.lineno)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) == 1 and isinstance(targets[0], (ast.Name, ast.Attribute)):
                candidates.append((node, targets[0]))
    if not candidates:
        return None
    target = next((t for node, t in candidates if built and isinstance(node.value, ast.Call)
                   and _last_name(node.value.func) == built), candidates[0][1])
    names = {_last_name(target)}
    nodes = list(walk(tree))
    grew = True
    while grew:  # the names the object is handed on as, until no new one appears
        grew = False
        for node in nodes:
            found: list[str] = []
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None \
                    and _mentions(node.value, names):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found = [n for t in targets if (n := _last_name(t)) is not None]
            elif isinstance(node, ast.Call):
                found = [k.arg for k in node.keywords if k.arg and _mentions(k.value, names)]
            for name in found:
                if name not in names:
                    names.add(name)
                    grew = True
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == method and _last_name(node.func.value) in names
               for node in nodes)


def _last_name(node: ast.AST) -> str | None:
    """``scheduler`` for ``scheduler``, ``self.scheduler`` and ``trainer.cfg.scheduler``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _mentions(value: ast.AST, names: set) -> bool:
    """Does the expression use one of ``names``: as a name, an attribute, or a string key
    (``kwargs["scheduler"]``)?"""
    for node in walk(value):
        if (isinstance(node, ast.Name) and node.id in names
                or isinstance(node, ast.Attribute) and node.attr in names
                or isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names):
            return True
    return False


def batch_use(path: str, fetch_line: int, loop_line: int) -> dict | None:
    """How a batch fetched once (``x, y = next(iter(loader))`` at ``fetch_line``) is used by the
    loop around ``loop_line`` (the backward): ``{"names": [...] assigned at fetch_line,
    "used": whether the innermost loop holding loop_line reads one of them, "loader": the
    name inside ``iter(...)`` or None, "counts_loader": whether a loop around loop_line
    iterates ``range(len(<loader>))`` or over ``<loader>``}``; None when unreadable."""
    tree = _parse(path)
    if tree is None:
        return None
    names: list[str] = []
    loader = None
    for node in walk(tree):
        if isinstance(node, ast.Assign) and node.lineno <= fetch_line <= (node.end_lineno or node.lineno):
            for target in node.targets:
                for leaf in walk(target):
                    if isinstance(leaf, ast.Name):
                        names.append(leaf.id)
            for call in walk(node.value):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) \
                        and call.func.id == "iter" and call.args:
                    loader = ast.unparse(call.args[0])
    loops = [node for node in walk(tree)
             if isinstance(node, (ast.For, ast.While, ast.AsyncFor))
             and node.lineno <= loop_line <= (node.end_lineno or node.lineno)]
    if not loops:
        return {"names": names, "used": False, "loader": loader, "counts_loader": False}
    inner = max(loops, key=lambda n: n.lineno)
    inside = fetch_line >= inner.lineno and fetch_line <= (inner.end_lineno or inner.lineno)
    used = any(isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load)
               for n in walk(inner))
    counts = False
    if loader is not None:
        for loop in loops:
            if isinstance(loop, (ast.For, ast.AsyncFor)):
                text = ast.unparse(loop.iter)
                if f"len({loader})" in text or text == loader:
                    counts = True
    return {"names": names, "used": used and not inside, "loader": loader, "counts_loader": counts}


_TORCH_ROOTS = ("torch", "F", "nn", "functional")
_BUILTINS = ("sum", "abs", "max", "min")


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _tainted(expr: ast.AST, names: set, calls: frozenset = frozenset()) -> bool:
    """Does ``expr``'s value come from one of ``names``, or from a call of one of the functions
    ``calls``, by arithmetic or tensor methods (not through a call of the user's other functions
    or modules, which start another computation)?"""
    if isinstance(expr, ast.Name):
        return expr.id in names
    if isinstance(expr, ast.BinOp):
        return _tainted(expr.left, names, calls) or _tainted(expr.right, names, calls)
    if isinstance(expr, ast.UnaryOp):
        return _tainted(expr.operand, names, calls)
    if isinstance(expr, (ast.Subscript, ast.Starred)):
        return _tainted(expr.value, names, calls)
    if isinstance(expr, (ast.Tuple, ast.List)):
        return any(_tainted(e, names, calls) for e in expr.elts)
    if isinstance(expr, ast.Call):
        func = expr.func
        if calls and (getattr(func, "id", None) in calls or getattr(func, "attr", None) in calls):
            return True
        args = list(expr.args) + [k.value for k in expr.keywords]
        if isinstance(func, ast.Attribute):
            if func.attr in ("detach", "item", "tolist", "numpy", "cpu") and _tainted(func.value, names, calls):
                return func.attr in ("detach", "cpu")
            if _tainted(func.value, names, calls):
                return True  # grad.pow(2).sum()
            if _root(func) in _TORCH_ROOTS:
                return any(_tainted(a, names, calls) for a in args)
            return False
        if isinstance(func, ast.Name) and func.id in _BUILTINS:
            return any(_tainted(a, names, calls) for a in args)
    return False


def result_reaches_backward(path: str, line: int, depth: int = 0,
                            via: frozenset = frozenset()) -> int | None:
    """The line of a ``.backward()`` whose loss is computed, by arithmetic and tensor methods,
    from what the statement at ``line`` assigns (a ``torch.autograd.grad`` result), in the same
    function, or in a caller of it when the function returns such a value (a
    ``gradient_penalty()`` helper); None when there is none or the source cannot be read.
    ``via``: the helpers whose result the statement at ``line`` must take up by arithmetic for
    its names to count (``model(fgsm(x))`` hands the helper's result to a model: a new input,
    not the penalty itself)."""
    tree = _parse(path)
    if tree is None or depth > 2:
        return None
    scope = _enclosing_function(tree, line)
    statements = sorted((n for n in walk(scope) if isinstance(n, (ast.Assign, ast.AugAssign,
                                                                      ast.AnnAssign, ast.Expr))),
                        key=lambda n: (n.lineno, n.col_offset))
    names: set = set()
    for node in statements:
        if isinstance(node, ast.Assign) and node.lineno <= line <= (node.end_lineno or node.lineno):
            if via and not _tainted(node.value, set(), via):
                continue
            for target in node.targets:
                names.update(leaf.id for leaf in walk(target) if isinstance(leaf, ast.Name))
    if not names:
        return None
    for node in statements:
        if node.lineno <= line:
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            hit = _tainted(node.value, names)
            for target in targets:
                for leaf in walk(target):
                    if isinstance(leaf, ast.Name):
                        (names.add if hit else names.discard)(leaf.id)
        elif isinstance(node, ast.AugAssign):
            if isinstance(node.target, ast.Name) and _tainted(node.value, names):
                names.add(node.target.id)
        for call in walk(node):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                    and call.func.attr == "backward":
                loss = call.func.value
                if _tainted(loss, names) or (isinstance(loss, ast.Call) and
                                             any(_tainted(a, names) for a in loss.args)):
                    return call.lineno
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
            isinstance(n, ast.Return) and n.value is not None and _tainted(n.value, names)
            for n in walk(scope)):
        for node in walk(tree):  # the helper returns it: follow each call's result
            if isinstance(node, ast.Assign) and any(
                    isinstance(c, ast.Call) and (getattr(c.func, "id", None) == scope.name
                                                 or getattr(c.func, "attr", None) == scope.name)
                    for c in walk(node.value)):
                found = result_reaches_backward(path, node.lineno, depth + 1, frozenset({scope.name}))
                if found is not None:
                    return found
    return None


def keeping_line(path: str, line: int, name: str) -> int | None:
    """The line, in a loop holding ``line`` (or else anywhere in the file), that adds a value to
    the variable ``name``: ``name += x``, ``name = name + x``, ``name.append(x)``,
    ``name[k] = ...``, ``name.update(...)`` / any method call on it in a statement of its own.
    None when there is none or the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    hits = []
    for node in walk(tree):
        if isinstance(node, ast.AugAssign) and _root(node.target) == name:
            hits.append(node.lineno)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if _root(target) == name and (
                        not isinstance(target, ast.Name)
                        or any(isinstance(n, ast.Name) and n.id == name for n in walk(node.value))):
                    hits.append(node.lineno)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and isinstance(node.value.func, ast.Attribute) and _root(node.value.func) == name:
            hits.append(node.lineno)
    if not hits:
        return None
    loop = innermost_loop(path, line)
    inside = [h for h in hits if loop is not None and loop[0] <= h <= loop[1]]
    return min(inside or hits)


def rebound_later(path: str, line: int) -> int | None:
    """The first later statement of the scope (function or module) whose statement at ``line``
    builds an object into a plain name (``head_opt = LARS(...)``) that binds the same object to
    another name (``optimizer = head_opt``) after the scope unfroze something in between
    (``requires_grad_(True)``, ``p.requires_grad = True``, an ``unfreeze...(...)`` call): a later
    phase taking over what an earlier phase built. None when there is none or the source cannot
    be read."""
    tree = _parse(path)
    if tree is None:
        return None
    scope = tree
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.lineno <= line <= (node.end_lineno or node.lineno) \
                and (scope is tree or node.lineno > scope.lineno):
            scope = node
    built = next((n for n in walk(scope) if isinstance(n, ast.Assign) and n.lineno == line
                  and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)), None)
    if built is None:
        return None
    name = built.targets[0].id
    later = [n.lineno for n in walk(scope) if isinstance(n, ast.Assign) and n.lineno > line
             and isinstance(n.value, ast.Name) and n.value.id == name
             and all(isinstance(t, (ast.Name, ast.Attribute)) and _root(t) != name for t in n.targets)]
    if not later:
        return None
    first = min(later)
    unfrozen = any(line < n.lineno < first and (
        isinstance(n, ast.Attribute) and n.attr in ("requires_grad_", "requires_grad")
        or isinstance(n, ast.Call) and "unfreeze" in (_call_name(n) or "").lower())
        for n in walk(scope) if hasattr(n, "lineno"))
    return first if unfrozen else None


# tensor methods that return a new tensor (their in-place twins end with "_")
_OUT_OF_PLACE = frozenset({"add", "sub", "mul", "div", "addcmul", "addcdiv", "lerp", "clamp",
                           "clip", "subtract", "multiply", "divide"})


def _reads_grad(node: ast.AST, name: str | None = None) -> bool:
    """Does ``node`` read a ``.grad`` (of ``name`` when given)?"""
    return any(isinstance(n, ast.Attribute) and n.attr == "grad"
               and (name is None or (isinstance(n.value, ast.Name) and n.value.id == name))
               for n in walk(node))


def _reads_itself(node: ast.AST, name: str) -> bool:
    """Does ``node`` read ``name`` other than through its ``.grad`` (``p - lr * p.grad``, not
    ``p.grad.clone()``)?"""
    inside_grad = {id(n.value) for n in walk(node)
                   if isinstance(n, ast.Attribute) and n.attr == "grad"}
    return any(isinstance(n, ast.Name) and n.id == name and id(n) not in inside_grad
               for n in walk(node))


def _in_place(name: str, value: ast.AST) -> str:
    """The in-place statement that does what ``name = value`` meant: ``p -= lr * p.grad`` for
    ``p = p - lr * p.grad``, else ``p.copy_(value)``."""
    ops = {ast.Sub: "-=", ast.Add: "+=", ast.Mult: "*=", ast.Div: "/="}
    if isinstance(value, ast.BinOp) and type(value.op) in ops \
            and isinstance(value.left, ast.Name) and value.left.id == name:
        return f"{name} {ops[type(value.op)]} {ast.unparse(value.right)}"
    return f"{name}.copy_({ast.unparse(value)})"


@_once_per_file
def discarded_updates(path: str) -> list[tuple[int, str, str, str]]:
    """Statements of a hand-written update whose result is thrown away, as ``(line, form,
    text, in-place statement meant)``: ``"rebind"`` — a loop variable assigned an expression of itself and its own
    ``.grad`` (``for p in params: p = p - lr * p.grad``: the name now holds a new tensor, the
    parameter is unchanged); ``"result"`` — an out-of-place op of a name, given a ``.grad``,
    whose result no one keeps (``p.sub(lr * p.grad)``, ``torch.add(p, p.grad, alpha=-lr)``);
    ``"blend"`` — in a loop over ``zip(...)`` of parameters (``.parameters()``, ``.named_parameters()``,
    ``.state_dict()``, ``.buffers()``, ``.values()``), a loop variable assigned an expression of
    itself and another of the loop's variables and never read after it in the loop's body
    (``for ema_p, p in zip(ema.parameters(), model.parameters()): ema_p = d * ema_p + (1 - d)
    * p``: an EMA or target-network update whose copy never changes); ``"into_grad"`` — an
    in-place op on a gradient that reads its own parameter (``p.grad.add_(p.data, alpha=-lr)``:
    the update written into the gradient). [] when the file cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    found: list[tuple[int, str, str, str]] = []

    def visit(node: ast.AST, loop_names: frozenset) -> None:
        for child in ast.iter_child_nodes(node):
            names = loop_names
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                names = frozenset()  # another scope
            elif isinstance(child, (ast.For, ast.AsyncFor)) and isinstance(child.target, ast.Name):
                names = loop_names | {child.target.id}
            elif isinstance(child, (ast.For, ast.AsyncFor)):
                found.extend(_blends(child))
            if isinstance(child, ast.Assign) and len(child.targets) == 1 \
                    and isinstance(child.targets[0], ast.Name) and child.targets[0].id in loop_names \
                    and _reads_grad(child.value, child.targets[0].id) \
                    and _reads_itself(child.value, child.targets[0].id):
                found.append((child.lineno, "rebind", child.targets[0].id,
                              _in_place(child.targets[0].id, child.value)))
            elif isinstance(child, ast.Expr) and isinstance(child.value, ast.Call) \
                    and isinstance(child.value.func, ast.Attribute) \
                    and isinstance(child.value.func.value, ast.Name) \
                    and child.value.func.attr in _OUT_OF_PLACE and _reads_grad(child.value):
                call = child.value
                if call.func.value.id == "torch" and call.args:  # torch.sub(p, ...)
                    target, rest = ast.unparse(call.args[0]), call.args[1:]
                else:
                    target, rest = call.func.value.id, call.args
                parts = [ast.unparse(a) for a in rest] + [ast.unparse(k) for k in call.keywords]
                found.append((child.lineno, "result", ast.unparse(call.func),
                              f"{target}.{call.func.attr}_({', '.join(parts)})"))
            elif isinstance(child, ast.Expr) and isinstance(child.value, ast.Call):
                into = _update_into_grad(child.value)
                if into is not None:
                    found.append((child.lineno, "into_grad", into[0], into[1]))
            visit(child, names)

    visit(tree, frozenset())
    return sorted(found)


_PARAM_ITERABLES = frozenset({"parameters", "named_parameters", "state_dict", "buffers",
                              "named_buffers", "values", "items"})


def _blends(loop: ast.AST) -> list[tuple[int, str, str, str]]:
    """The ``"blend"`` statements of ``discarded_updates`` directly in the body of ``loop``, a
    ``for a, b in zip(...)`` over parameters."""
    target, iterable = loop.target, loop.iter
    # for a, b in zip(...); for (name, a), (_, b) in zip(x.named_parameters(), ...)
    flat = [n for n in walk(target) if not isinstance(n, (ast.Tuple, ast.Store))]
    if not (isinstance(target, ast.Tuple) and all(isinstance(n, ast.Name) for n in flat)
            and isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name)
            and iterable.func.id == "zip"
            and any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr in _PARAM_ITERABLES for n in walk(iterable))):
        return []
    names = [n.id for n in flat]
    found = []
    body = loop.body
    for index, statement in enumerate(body):
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)):
            continue
        name = statement.targets[0].id
        read = {n.id for n in walk(statement.value) if isinstance(n, ast.Name)}
        if name not in names or name not in read or not (read & (set(names) - {name})):
            continue
        later = [n for rest in body[index + 1:] for n in walk(rest)]
        if any(isinstance(n, ast.Name) and n.id == name for n in later):
            continue  # the new value is used (stored, copied in) further down
        found.append((statement.lineno, "blend", name, f"{name}.copy_({ast.unparse(statement.value)})"))
    return found


_INTO_GRAD_OPS = frozenset({"add_", "sub_", "copy_", "addcmul_", "addcdiv_", "lerp_"})


def _update_into_grad(call: ast.Call) -> tuple[str, str] | None:
    """``(the call's text, the update meant)`` for an in-place op on a gradient that reads its
    own parameter (``p.grad.add_(p.data, alpha=-lr)``: the update written into ``p.grad``, the
    parameter left as it is); None else. Hand-written weight decay has this form too
    (``p.grad.add_(p, alpha=wd)``): the rule asks the run that no parameter changed."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr in _INTO_GRAD_OPS
            and _ends_in_grad(func.value)):
        return None
    grad = func.value.value if isinstance(func.value, ast.Attribute) and func.value.attr == "data" \
        else func.value
    owner = ast.unparse(grad.value)  # p of p.grad
    args = [ast.unparse(a) for a in call.args]
    if not any(a in (owner, f"{owner}.data") for a in args):
        return None
    rest = [f"{owner}.grad" if a in (owner, f"{owner}.data") else a for a in args] + \
        [ast.unparse(k) for k in call.keywords]
    return ast.unparse(call), f"{owner}.data.{func.attr}({', '.join(rest)})"


def _ends_in_grad(node: ast.AST) -> bool:
    """``x.grad`` or ``x.grad.data``."""
    if isinstance(node, ast.Attribute) and node.attr == "data":
        node = node.value
    return isinstance(node, ast.Attribute) and node.attr == "grad"


def grad_clears(path: str, first: int, last: int) -> list[tuple[int, str]]:
    """``(line, text)`` of the statements on lines ``first``..``last`` that clear a ``.grad`` by
    hand: ``p.grad = None``, ``p.grad.zero_()`` (also through ``.data``), ``p.grad.fill_(0)``,
    ``p.grad.mul_(0)``, ``p.grad *= 0``. [] when the file cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    found = []
    for node in walk(tree):
        if not (isinstance(node, ast.stmt) and first <= node.lineno <= last):
            continue
        if isinstance(node, ast.Assign) and any(_ends_in_grad(t) for t in node.targets) \
                and isinstance(node.value, ast.Constant) and node.value.value is None:
            found.append((node.lineno, ast.unparse(node).strip()))
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Mult) \
                and _ends_in_grad(node.target) and isinstance(node.value, ast.Constant) \
                and node.value.value == 0:
            found.append((node.lineno, ast.unparse(node).strip()))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and isinstance(node.value.func, ast.Attribute) and _ends_in_grad(node.value.func.value):
            call = node.value
            zero_arg = len(call.args) == 1 and isinstance(call.args[0], ast.Constant) \
                and call.args[0].value == 0
            if call.func.attr == "zero_" or (call.func.attr in ("fill_", "mul_") and zero_arg):
                found.append((node.lineno, ast.unparse(node).strip()))
    return sorted(found)


def calls_named(path: str, names: frozenset) -> list[tuple[int, str, bool]]:
    """``(line, text, in_forward)`` of every call in the file to a function or method whose
    own name is in ``names`` (``torch.round(x)``, ``h.round()``, ``nn.Dropout(p=1.0)``), in
    line order; ``in_forward``: inside a function named ``forward``. [] when it cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    found = []

    def visit(node: ast.AST, in_forward: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_forward or (isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                                    and child.name == "forward")
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else \
                    func.id if isinstance(func, ast.Name) else None
                if name in names:
                    found.append((child.lineno, ast.unparse(child), inside))
            visit(child, inside)

    visit(tree, False)
    return sorted(found)


def full_sums(path: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every sum over all axes in the file: ``x.sum()`` with no argument, ``torch.sum(x)`` with one; in line order, [] when it cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    found = []
    for node in walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute) \
                or node.func.attr != "sum" or node.keywords:
            continue
        owner = node.func.value
        torch_sum = isinstance(owner, ast.Name) and owner.id == "torch"
        if len(node.args) == (1 if torch_sum else 0):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(set(found))


def advantage_line(path: str, line: int) -> tuple[int, str] | None:
    """``(line, text)`` of the last assignment above ``line`` (a backward), in its function, to
    a name that says it is an advantage or a temporal-difference error (``adv``,
    ``advantage(s)``, ``delta``, ``td_error``), made by a subtraction; None when there is none."""
    tree = _parse(path)
    if tree is None:
        return None
    scope = _enclosing_function(tree, line)
    best = None
    for node in walk(scope):
        if isinstance(node, ast.Assign) and node.lineno < line and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) \
                and any(w in node.targets[0].id.lower() for w in ("adv", "delta", "td_err")) \
                and any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub)
                        for n in walk(node.value)) \
                and (best is None or node.lineno > best.lineno):
            best = node
    return (best.lineno, ast.unparse(best).strip()) if best is not None else None


_LOG_PROB_WORDS = ("log_prob", "logprob", "logp", "log_pi", "log_likelihood")


def policy_term_line(path: str, line: int) -> tuple[int, str] | None:
    """``(line, text)`` of the last statement at or above ``line`` (a backward), in its function,
    that multiplies a log-probability (a name or call mentioning ``log_prob``, ``logp``,
    ``log_pi``) by something else: the policy-gradient term; None when there is none."""
    tree = _parse(path)
    if tree is None:
        return None
    scope = _enclosing_function(tree, line)
    found = _policy_terms(scope, line)
    if found:
        best = max(found, key=lambda n: n.lineno)
    else:  # made in a helper the backward's function calls: the file's only such statement
        found = _policy_terms(tree, None)
        if len(found) != 1:
            return None
        best = found[0]
    return best.lineno, ast.unparse(best).strip()


def score_weight_line(path: str, line: int) -> tuple[int, str] | None:
    """``(line, text)`` of the assignment that makes the weight of a score-function term: in the
    function of ``line`` (a backward), or else in the whole file, the last product above it of a
    name assigned from a ``log_prob(...)`` call (``log_q = q.log_prob(z).sum(-1)``) and another
    name (``signal``); that name's assignment the product reads, followed back through
    assignments that rebind it from itself (``signal = (signal - mean) / std``) to the one that
    made it. None when there is none."""
    tree = _parse(path)
    if tree is None:
        return None
    for scope, limit in ((_enclosing_function(tree, line), line), (tree, None)):
        found = _score_weight(scope, limit)
        if found is not None:
            return found[0].lineno, ast.unparse(found[0]).strip()
    return None


def _score_weight(scope: ast.AST, limit: int | None):
    assigns: dict[str, list] = {}
    for node in walk(scope):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            assigns.setdefault(node.targets[0].id, []).append(node)
    scores = {name for name, nodes in assigns.items() if any(
        isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "log_prob" for n in nodes for sub in walk(n.value))}
    best = None
    for node in walk(scope):
        if not isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr, ast.Return)) \
                or (limit is not None and node.lineno > limit):
            continue
        for sub in walk(node):
            if not (isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mult)):
                continue
            sides = (sub.left, sub.right)
            if all(isinstance(side, ast.Name) for side in sides) \
                    and sum(side.id in scores for side in sides) == 1:
                weight = next(side.id for side in sides if side.id not in scores)
                if best is None or node.lineno > best[0].lineno:
                    best = (node, weight)
    if best is None:
        return None
    product, weight = best
    made = [n for n in assigns.get(weight, ()) if n.lineno < product.lineno]
    made.sort(key=lambda n: n.lineno)
    while made:
        last = made.pop()
        if not any(isinstance(n, ast.Name) and n.id == weight for n in walk(last.value)):
            return last, weight
    return None


@_once_per_file
def degree_power_line(path: str) -> tuple[int, str] | None:
    """``(line, text)`` of the script's only assignment that raises a degree to a power or
    multiplies by it (``deg.pow(0.5)``, ``deg ** -0.5``, ``degree.sqrt()``, ``deg[:, None] *
    adj``): a name with ``deg`` in it under ``pow``, ``**``, ``sqrt``, ``rsqrt`` or ``*``; None when
    there is none or several."""
    tree = _parse(path)
    if tree is None:
        return None
    found = []
    for node in walk(tree):
        if not isinstance(node, (ast.Assign, ast.AugAssign, ast.Return)):
            continue
        value = node.value
        if value is None:
            continue
        for sub in walk(value):
            powered = (isinstance(sub, ast.BinOp) and isinstance(sub.op, (ast.Pow, ast.Mult))) or (
                isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
                and sub.func.attr in ("pow", "pow_", "sqrt", "rsqrt", "mul", "mul_"))
            if powered and "deg" in ast.unparse(sub).lower():
                found.append(node)
                break
    if len(found) != 1:
        return None
    return found[0].lineno, ast.unparse(found[0]).strip()


_DONE_WORDS = frozenset({"done", "dones", "terminal", "terminals", "terminated", "terminateds",
                         "terminations", "termination"})
# words that make a done-named value its complement (a mask that is 1 while the episode goes on)
_NOT_DONE_WORDS = frozenset({"not", "non", "mask", "masks", "alive", "continue", "continues",
                             "ongoing", "live", "running"})
_KEEP_WORDS = ("nonterminal", "notdone", "notterminal", "nondone", "alive", "notdones")
_DISCOUNT_WORDS = frozenset({"gamma", "discount", "discounts", "gammas"})
_PASS_THROUGH = frozenset({"float", "double", "view", "reshape", "unsqueeze", "squeeze", "to",
                           "flatten", "type", "type_as", "detach", "clone"})


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"_|(?<=[a-z])(?=[A-Z])", name.lower()) if w]


# the other words a done flag's name holds (``b_dones``, ``next_done``, ``is_terminal``,
# ``dones_batch``): a name with any other word is some other value (``terminal_value``)
_FLAG_FILLERS = frozenset({"b", "mb", "batch", "next", "is", "t", "ep", "episode", "env", "envs",
                           "buf", "buffer", "flag", "flags", "tensor", "cur", "curr", "last"})


def _done_name(name: str) -> bool:
    words = set(_words(name))
    return bool(words & _DONE_WORDS) and words <= _DONE_WORDS | _FLAG_FILLERS \
        and not any(k in name.lower() for k in _KEEP_WORDS)


def _value_name(expr: ast.AST) -> str | None:
    """The name a value is read from through indexing and dtype/shape casts (``dones[t + 1]``,
    ``b_dones.float().unsqueeze(1)``, ``batch.dones``), or None for anything computed."""
    while True:
        if isinstance(expr, ast.Name):
            return expr.id
        if isinstance(expr, ast.Attribute):
            return expr.attr
        if isinstance(expr, ast.Subscript):
            expr = expr.value
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
                and expr.func.attr in _PASS_THROUGH:
            expr = expr.func.value
        else:
            return None


def _factors(expr: ast.AST) -> list[ast.AST]:
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        return _factors(expr.left) + _factors(expr.right)
    return [expr]


def _negated_names(tree: ast.AST) -> set[str]:
    """Names the script assigns a complement to (``dones = 1 - x``, ``~x``, ``not x``, ``x == 0``,
    ``logical_not``): a done-named value that is in fact a continuation mask."""
    found = set()
    for node in walk(tree):
        if not isinstance(node, (ast.Assign, ast.AugAssign)) or node.value is None:
            continue
        v = node.value
        negated = isinstance(v, ast.UnaryOp) and isinstance(v.op, (ast.Not, ast.Invert)) \
            or isinstance(v, ast.BinOp) and isinstance(v.op, ast.Sub) \
            or isinstance(v, ast.Compare) and len(v.ops) == 1 and isinstance(v.ops[0], ast.Eq) \
            and isinstance(v.comparators[0], ast.Constant) and v.comparators[0].value in (0, False) \
            or isinstance(v, ast.IfExp) and isinstance(v.body, ast.Constant) and v.body.value in (0, False) \
            or _calls_named(v, ("logical_not",))
        if negated:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found |= {_value_name(t) for t in targets} - {None}
    return found


@_once_per_file
def done_flag_bootstraps(path: str) -> list[tuple[int, str, str, str]]:
    """``(line, text, name, form)`` of each statement that keeps a bootstrapped value where the
    episode ended instead of where it goes on: ``"mask"``, a continuation mask assigned a done
    flag as it is (``nextnonterminal = dones[t + 1]``); ``"factor"``, a done flag multiplying a
    discount in a product (``r + gamma * q_next * dones``). A done-named value the script also
    assigns a complement to is left out; [] when the file cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    negated = _negated_names(tree)
    found = []
    for node in walk(tree):
        if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        source = _value_name(node.value)
        for target in targets:
            name = _value_name(target)
            if name and any(k in name.lower().replace("_", "") for k in _KEEP_WORDS) \
                    and source and _done_name(source) and source not in negated:
                found.append((node.lineno, ast.unparse(node).strip(), source, "mask"))
                break
        else:
            for sub in walk(node.value):
                if not (isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mult)):
                    continue
                factors = _factors(sub)
                names = [_value_name(f) for f in factors]
                if not any(n and set(_words(n)) & _DISCOUNT_WORDS for n in names):
                    continue
                flags = [n for n in names if n and _done_name(n) and n not in negated]
                if flags:
                    found.append((node.lineno, ast.unparse(node).strip(), flags[0], "factor"))
                    break
    return sorted(set(found))


def _twins(a: ast.AST, b: ast.AST) -> bool:
    """Whether two expressions are one critic's twin estimates: the same text but for one digit,
    1 and 2 (or 0 and 1: ``qs[0]``, ``qs[1]``), with a Q or a critic named in it."""
    x, y = ast.unparse(a), ast.unparse(b)
    if len(x) != len(y) or not ("q" in x.lower() or "critic" in x.lower()):
        return False
    diff = [(c, d) for c, d in zip(x, y) if c != d]
    return len(diff) == 1 and set(diff[0]) in ({"1", "2"}, {"0", "1"})


def _twin_maximum(node: ast.AST) -> bool:
    """``torch.max(q1, q2)``, ``torch.maximum(q1, q2)``, ``max(q1, q2)``, or a max over
    ``torch.stack``/``torch.cat`` of the two."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("max", "maximum", "amax", "fmax"):
        return False
    if len(node.args) >= 2 and _twins(node.args[0], node.args[1]):
        return True
    stacked = node.args[0] if node.args else (func.value if isinstance(func, ast.Attribute) else None)
    if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name) and func.value.id == "torch"):
        stacked = func.value
    if isinstance(stacked, ast.Call) \
            and (getattr(stacked.func, "attr", None) or getattr(stacked.func, "id", None)) in ("stack", "cat") \
            and stacked.args and isinstance(stacked.args[0], (ast.List, ast.Tuple)) \
            and len(stacked.args[0].elts) == 2:
        return _twins(*stacked.args[0].elts)
    return False


def _twin_minimum(node: ast.AST) -> bool:
    """``torch.min(q1, q2)``, ``torch.minimum(q1, q2)`` or a min over their stack: the clipped
    double-Q estimate, which a maximum beside it mixes with (``lmbda * min + (1 - lmbda) *
    max``, BCQ's and a weighted double Q's target)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("min", "minimum", "amin", "fmin"):
        return False
    renamed = ast.Call(func=ast.Attribute(value=func.value, attr="max", ctx=ast.Load())
                       if isinstance(func, ast.Attribute) else ast.Name(id="max", ctx=ast.Load()),
                       args=node.args, keywords=node.keywords)
    return _twin_maximum(renamed)


def _discounted(node: ast.AST) -> bool:
    return any(isinstance(n, (ast.Name, ast.Attribute))
               and set(_words(n.id if isinstance(n, ast.Name) else n.attr)) & _DISCOUNT_WORDS
               for n in walk(node))


@_once_per_file
def twin_critics_maximised(path: str) -> list[tuple[int, str, str]]:
    """``(line, text, maximum)`` of each statement that combines twin critics' estimates with a
    maximum (``torch.max(qf1_next, qf2_next)``) into a discounted target: the statement itself
    discounts, or a later statement of its function that reads the name it assigns does. A
    statement that also takes the twins' minimum mixes the two on purpose (BCQ): left out."""
    tree = _parse(path)
    if tree is None:
        return []
    found = []
    for node in walk(tree):
        if not isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) or node.value is None:
            continue
        maxima = [n for n in walk(node.value) if _twin_maximum(n)]
        if not maxima:
            continue
        if any(_twin_minimum(n) for n in walk(node.value)):
            continue  # a mix of the smaller and the larger estimate (BCQ's soft clipped double Q)
        feeds = _discounted(node.value)
        if not feeds:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            scope = _enclosing_function(tree, node.lineno)
            feeds = any(isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value is not None
                        and n.lineno > node.lineno and n.lineno <= node.lineno + 10
                        and {x.id for x in walk(n.value) if isinstance(x, ast.Name)} & names
                        and _discounted(n.value) for n in walk(scope))
        if feeds:
            found.append((node.lineno, ast.unparse(node).strip(), ast.unparse(maxima[0])))
    return sorted(set(found))


_SCATTER_CALLS = frozenset({"index_add", "index_add_", "scatter_add", "scatter_add_",
                            "scatter_reduce", "scatter_reduce_"})


def _root_name(expr: ast.AST) -> str | None:
    """The name a chain of attributes and method calls starts from (``dst`` for
    ``dst.unsqueeze(-1).expand_as(m)``), or None."""
    while True:
        if isinstance(expr, ast.Name):
            return expr.id
        if isinstance(expr, ast.Call):
            expr = expr.func
        elif isinstance(expr, (ast.Attribute, ast.Subscript)):
            expr = expr.value
        else:
            return None


def _gathers_with(expr: ast.AST, index: str) -> bool:
    """Whether ``expr`` gathers rows with the index named ``index`` (``x[index]``,
    ``x.index_select(0, index)``)."""
    for sub in walk(expr):
        if isinstance(sub, ast.Subscript) and ast.unparse(sub.slice) == index:
            return True
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) \
                and sub.func.attr == "index_select" and len(sub.args) >= 2 \
                and ast.unparse(sub.args[-1]) == index:
            return True
    return False


@_once_per_file
def self_scatter_line(path: str) -> tuple[int, str] | None:
    """``(line, text)`` of the script's only scatter call (``out.index_add_(0, idx, msg)``,
    ``scatter_add``, ``scatter_reduce``) whose rows (the argument, or the assignments to the name
    it passes, in the same function) gather with the name of its own index (``x[idx]``); None
    when there is none or several."""
    tree = _parse(path)
    if tree is None:
        return None
    found = []
    scopes = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] + [tree]
    for scope in scopes:
        assigned: dict[str, list] = {}
        calls = []
        for node in walk(scope):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append(node.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in _SCATTER_CALLS:
                calls.append(node)
        for call in calls:
            keywords = {k.arg: k.value for k in call.keywords}
            # torch.index_add(x, 0, idx, rows) takes the tensor first; x.index_add_(0, idx, rows) not
            shift = 1 if isinstance(call.func.value, ast.Name) and call.func.value.id == "torch" else 0
            args = call.args
            index = keywords.get("index", args[1 + shift] if len(args) > 1 + shift else None)
            rows = keywords.get("source", keywords.get("src", args[2 + shift] if len(args) > 2 + shift else None))
            if index is None or rows is None:
                continue
            names = [ast.unparse(index), _root_name(index)]
            # an index expanded over the columns first (index = dst.unsqueeze(-1).expand_as(m))
            names += [_root_name(value) for value in assigned.get(names[0], ())]
            names = [n for n in names if n is not None]
            sources = assigned.get(rows.id, []) if isinstance(rows, ast.Name) else [rows]
            if any(_gathers_with(src, name) for src in sources for name in names):
                found.append((call.lineno, ast.unparse(call)))
    found = sorted(set(found))
    return found[0] if len(found) == 1 else None


@_once_per_file
def target_slice_line(path: str) -> tuple[int, str] | None:
    """``(line, text)`` of the script's only assignment of a slice (``x[a:b]``) to a name with
    ``target`` in it (``target = source[i:i + seq_len]``, ``data, targets = ...``); None when there
    is none or several."""
    return _target_slice_line(path, False)


@_once_per_file
def target_column_slice_line(path: str) -> tuple[int, str] | None:
    """``target_slice_line`` with column slices too (``targets = caps[:, 1:]``)."""
    return _target_slice_line(path, True)


def _target_slice_line(path: str, columns: bool) -> tuple[int, str] | None:
    tree = _parse(path)
    if tree is None:
        return None
    found = []
    for node in walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        names = [n.id for t in node.targets for n in walk(t) if isinstance(n, ast.Name)]
        if any("target" in n.lower() for n in names) and any(
                isinstance(sub, ast.Subscript) and (isinstance(sub.slice, ast.Slice) or columns and isinstance(
                    sub.slice, ast.Tuple) and any(isinstance(e, ast.Slice) for e in sub.slice.elts))
                for sub in walk(node.value)):
            found.append(node)
    if len(found) != 1:
        return None
    return found[0].lineno, ast.unparse(found[0]).strip()


def _policy_terms(scope: ast.AST, line: int | None) -> list:
    out = []
    for node in walk(scope):
        if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return)) \
                or (line is not None and node.lineno > line):
            continue
        for sub in walk(node):
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mult) and any(
                    any(w in ast.unparse(side).lower() for w in _LOG_PROB_WORDS)
                    for side in (sub.left, sub.right)):
                out.append(node)
                break
    return out


def _calls_named(node: ast.AST, names: tuple[str, ...] | frozenset) -> bool:
    for sub in walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in names:
                return True
    return False


def ratio_line(path: str, line: int, fault: str) -> tuple[int, str] | None:
    """``(line, text)`` of the statement to change for a policy ratio's fault (ratios.py), from
    the line of the ``log_prob`` call behind it: the first assignment at or after ``line`` (20
    lines at most, in its function) that computes the ratio (an ``exp`` or a division; for
    ``"minimised"``, the clipped surrogate's ``min``/``max``), or for ``"cancels"`` the plain
    alias between them that makes the subtracted name the log-probability itself
    (``old_logp = logp``); for ``"denominator"``, the statement at ``line`` (the old
    log-probability's); None when there is none."""
    tree = _parse(path)
    if tree is None:
        return None
    if fault == "denominator":  # the old log-probability's own statement
        found = _innermost_statement(tree, line)
        if found is None:
            return None
        inline = _helper_call_in_ratio(tree, line) if isinstance(found[0], ast.Return) else None
        return inline or (found[0].lineno, ast.unparse(found[0]).strip())
    found = _ratio_statement(tree, line, fault, None)
    if found is None:
        # a log_prob returned by a helper (CleanRL's get_action_and_value): the ratio is looked
        # for after the helper's calls, from the name that element of its result is assigned to
        for call_line, seed in _returned_to(tree, line):
            found = _ratio_statement(tree, call_line, fault, seed)
            if found is not None:
                break
    if found is None:
        return None
    ratio, statements = found
    if fault == "cancels":
        subtracted = {n.right.id for n in walk(ratio.value)
                      if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Sub, ast.Div))
                      and isinstance(n.right, ast.Name)}
        aliases = [n for n in statements if n.lineno < ratio.lineno and isinstance(n, ast.Assign)
                   and isinstance(n.value, ast.Name) and len(n.targets) == 1
                   and isinstance(n.targets[0], ast.Name) and n.targets[0].id in subtracted]
        if aliases:
            ratio = aliases[-1]
    elif fault == "inverted" and not any(isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Sub, ast.Div))
                                         for n in walk(ratio.value)):
        # the exp of a name made by a difference above it (logratio = old - new; ratio =
        # logratio.exp()): the difference is what to change
        read = {sub.id for sub in walk(ratio.value) if isinstance(sub, ast.Name)}
        differences = [n for n in statements if n.lineno < ratio.lineno and isinstance(n, ast.Assign)
                       and any(isinstance(t, ast.Name) and t.id in read for t in n.targets)
                       and isinstance(n.value, ast.BinOp) and isinstance(n.value.op, ast.Sub)]
        if differences:
            ratio = differences[-1]
    return ratio.lineno, ast.unparse(ratio).strip()


def _ratio_statement(tree: ast.AST, line: int, fault: str, seed: set | None):
    """``(statement, statements)``: the first assignment at or after ``line`` (20 lines at most,
    in its function) that computes a policy ratio from what the statement at ``line`` made (only
    the names in ``seed``, when given), and the assignments of that window; None when none."""
    scope = _enclosing_function(tree, line)
    statements = sorted((n for n in walk(scope)
                         if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                         and n.value is not None and line <= n.lineno <= line + 20),
                        key=lambda n: n.lineno)
    if fault == "minimised":
        def wanted(value):
            return _calls_named(value, ("min", "max", "minimum", "maximum"))
    else:
        def wanted(value):
            return _calls_named(value, ("exp",)) or any(
                isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) for n in walk(value))
    def exp_of_difference(value):
        return any(isinstance(n, ast.Call)
                   and (getattr(n.func, "attr", None) or getattr(n.func, "id", None)) == "exp"
                   and n.args and any(isinstance(b, ast.BinOp) and isinstance(b.op, ast.Sub)
                                      for b in walk(n.args[0]))
                   for n in walk(value))

    # only statements that read what the log_prob's statement made, directly or through the
    # statements between (a ratio in another function is not guessed at); an exp of a
    # difference first (a division on the way, an advantage's normalisation, is no ratio)
    for test in ((exp_of_difference, wanted) if fault != "minimised" else (wanted,)):
        names: set = set()
        for n in statements:
            read = {sub.id for sub in walk(n.value) if isinstance(sub, ast.Name)}
            if n.lineno != line and not read & names:
                continue
            if n.lineno == line and seed is not None:
                names |= seed
                continue
            if test(n.value):
                return n, statements
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            names |= {sub.id for t in targets for sub in walk(t) if isinstance(sub, ast.Name)}
    return None


def _helper_call_in_ratio(tree: ast.AST, line: int) -> tuple[int, str] | None:
    """For a ``return`` at ``line`` in a helper that computes log-probabilities, the one statement
    of the file that calls the helper as the subtracted side of an ``exp`` (``exp(logp -
    helper(...))``) or as a divisor: the old log-probability recomputed inline in the ratio,
    where the detach (or the stored rollout value) belongs; None unless there is exactly one."""
    function = _enclosing_function(tree, line)
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None

    def calls_helper(node: ast.AST) -> bool:
        for sub in walk(node):
            if isinstance(sub, ast.Call):
                f = sub.func
                if (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)) == function.name:
                    return True
        return False

    sites = []
    for node in walk(tree):
        if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) or node.value is None:
            continue
        if node.lineno >= function.lineno and node.lineno <= (function.end_lineno or function.lineno):
            continue
        if not _calls_named(node.value, ("exp",)):
            continue
        if any(isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Sub, ast.Div)) and calls_helper(n.right)
               and not calls_helper(n.left) for n in walk(node.value)):
            sites.append((node.lineno, ast.unparse(node).strip()))
    return sites[0] if len(sites) == 1 else None


def _returned_to(tree: ast.AST, line: int) -> list[tuple[int, set]]:
    """For a ``return`` statement at ``line`` in a function, each ``(line, {name})`` of an
    assignment in the file that calls that function and binds the returned value at that line
    (the element of a returned tuple, by its position) to a plain name; [] else."""
    found = _innermost_statement(tree, line)
    if found is None or not isinstance(found[0], ast.Return) or found[0].value is None:
        return []
    value = found[0].value
    function = _enclosing_function(tree, line)
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    position = None
    if isinstance(value, ast.Tuple):
        held = [k for k, elt in enumerate(value.elts)
                if elt.lineno <= line <= (elt.end_lineno or elt.lineno)]
        if len(held) > 1:  # a tuple on one line: the element that takes the log-probability
            held = [k for k in held if _calls_named(value.elts[k], ("log_prob", "gather", "log_softmax"))]
        if len(held) != 1:
            return []
        position = held[0]
    calls = []
    for node in walk(tree):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1 or not isinstance(node.value, ast.Call):
            continue
        func = node.value.func
        if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) != function.name:
            continue
        target = node.targets[0]
        if position is not None:
            if not isinstance(target, ast.Tuple) or len(target.elts) <= position:
                continue
            target = target.elts[position]
        if isinstance(target, ast.Name):
            calls.append((node.lineno, {target.id}))
    return sorted(calls)


def _backpropagated_name(tree: ast.AST, line: int, framework: bool = False) -> str | None:
    """The variable backpropagated on ``line`` (``loss`` of ``loss.backward()``,
    ``scaler.scale(loss).backward()``, ``accelerator.backward(loss)``, a Lightning step's
    ``return loss``), or None."""
    name = None
    for node in walk(tree):
        if getattr(node, "lineno", None) != line:
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("backward", "manual_backward"):
            receiver, first = node.func.value, node.args[0] if node.args else None
            framework = framework or node.func.attr == "manual_backward" \
                or isinstance(receiver, ast.Attribute) \
                or (isinstance(receiver, ast.Name)
                    and any(w in receiver.id.lower() for w in ("accelerator", "fabric", "engine")))
            if framework and isinstance(first, ast.Name):  # accelerator.backward(loss)
                name = first.id
            elif not framework and isinstance(receiver, ast.Name):  # loss.backward()
                name = receiver.id
            elif isinstance(receiver, ast.Call) and _last_name(receiver.func) == "scale" \
                    and receiver.args and isinstance(receiver.args[0], ast.Name):
                name = receiver.args[0].id  # scaler.scale(loss).backward()
        elif isinstance(node, ast.Return) and node.value is not None:
            # ``return loss``, and the Trainer's ``return (loss, outputs) if return_outputs else loss``
            value = node.value
            if isinstance(value, ast.IfExp):
                value = value.orelse if isinstance(value.orelse, ast.Name) else value.body
            if isinstance(value, ast.Tuple) and value.elts:
                value = value.elts[0]
            if isinstance(value, ast.Name):
                name = value.id
        if name is not None:
            break
    return name


def _additive_terms(node: ast.AST):
    """The terms of a sum or difference (``a + b - c``), parentheses and signs unwrapped."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        yield from _additive_terms(node.left)
        yield from _additive_terms(node.right)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        yield from _additive_terms(node.operand)
    else:
        yield node


def _number_term(node: ast.AST, tensors: set) -> bool:
    """A term that is a Python number read out of a tensor: ``x.item()``, scaled by numbers
    or names that hold no tensor of the function (``lam * reg.item()``, ``reg.item() / n``)."""
    factors, items = [node], 0
    while factors:
        f = factors.pop()
        if isinstance(f, ast.BinOp) and isinstance(f.op, (ast.Mult, ast.Div)):
            factors += [f.left, f.right]
        elif isinstance(f, ast.Call) and isinstance(f.func, ast.Attribute) \
                and f.func.attr == "item" and not f.args \
                and not isinstance(f.func.value, ast.Constant):
            items += 1
        elif isinstance(f, ast.Constant) or (isinstance(f, (ast.Name, ast.Attribute))
                                             and _last_name(f) not in tensors):
            continue
        else:
            return False
    return items > 0


def _rescales(node: ast.AST, name: str) -> bool:
    """``x = x / n``, ``x = x * w``, ``x /= n``, ``x *= w``: the statement only rescales ``x``
    by factors that do not read a call (a count, a constant)."""
    if isinstance(node, ast.AugAssign):
        value, op = node.value, node.op
        ok_target = isinstance(node.target, ast.Name) and node.target.id == name
    elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.BinOp):
        value, op = node.value.right, node.value.op
        ok_target = isinstance(node.targets[0], ast.Name) and node.targets[0].id == name \
            and isinstance(node.value.left, ast.Name) and node.value.left.id == name
    else:
        return False
    return ok_target and isinstance(op, (ast.Div, ast.Mult)) \
        and not any(isinstance(n, ast.Call) for n in walk(value))


def loss_term_assignment(path: str, line: int, framework: bool = False) -> tuple[int, str] | None:
    """``loss_assignment``, past statements that only rescale the loss (``meta_loss =
    meta_loss / tasks``): the assignment above them that computes its terms."""
    found = loss_assignment(path, line, framework)
    tree = _parse(path)
    if found is None or tree is None:
        return found
    name = _backpropagated_name(tree, line, framework)
    scope = _enclosing_function(tree, line)
    assignments = sorted((node.lineno, node) for node in walk(scope)
                         if isinstance(node, (ast.Assign, ast.AugAssign)) and node.lineno < line
                         and any(isinstance(t, ast.Name) and t.id == name
                                 for t in (node.targets if isinstance(node, ast.Assign) else [node.target])))
    at = found[0]
    while True:
        current = next((n for ln, n in assignments if ln == at), None)
        earlier = [ln for ln, _ in assignments if ln < at]
        if current is None or not _rescales(current, name) or not earlier:
            break
        at = earlier[-1]
    if at == found[0]:
        return found
    node = next(n for ln, n in assignments if ln == at)
    return at, ast.unparse(node).strip()


def zipped_unread(path: str, line: int) -> list[tuple[str, list[str], list[int]]]:
    """For the ``for`` statement on ``line`` that unpacks ``zip(a, b, ...)`` (also inside
    ``enumerate``), each argument of the zip whose unpacked names (``(xv, yv)`` for ``val_loader``)
    nothing reads, neither the loop's body nor its function after the loop, while the names of
    another argument are read: ``[(the argument's text, its names, the lines that read the
    names of the others)]``. Names starting with ``_`` are left out (unused on purpose; an
    argument bound only to such names is never reported). [] otherwise."""
    tree = _parse(path)
    if tree is None:
        return []
    loop = next((n for n in walk(tree) if isinstance(n, (ast.For, ast.AsyncFor)) and n.lineno == line), None)
    if loop is None:
        return []
    target, source = loop.target, loop.iter
    if isinstance(source, ast.Call) and isinstance(source.func, ast.Name) and source.func.id == "enumerate" \
            and source.args and isinstance(target, ast.Tuple) and len(target.elts) == 2:
        source, target = source.args[0], target.elts[1]
    if not (isinstance(source, ast.Call) and isinstance(source.func, ast.Name) and source.func.id == "zip"
            and len(source.args) >= 2 and not any(isinstance(x, ast.Starred) for x in source.args)
            and isinstance(target, ast.Tuple) and len(target.elts) == len(source.args)):
        return []
    scope = _enclosing_function(tree, line)
    after = loop.end_lineno or loop.lineno
    reads: dict[str, list[int]] = {}
    for node in walk(scope):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.lineno > loop.lineno:
            reads.setdefault(node.id, []).append(node.lineno)
    groups = []
    for arg, elt in zip(source.args, target.elts):
        names = [n.id for n in walk(elt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
        groups.append((ast.unparse(arg), names))
    found = []
    for i, (text, names) in enumerate(groups):
        mine = [n for n in names if not n.startswith("_")]
        if not mine or any(reads.get(n) for n in mine):
            continue
        others = sorted({ln for j, (_, other) in enumerate(groups) if j != i
                         for n in other for ln in reads.get(n, ()) if ln <= after})
        if others:
            found.append((text, mine, others))
    return found


def accumulated_term(path: str, line: int, after: int) -> tuple[int, str] | None:
    """When the statement on ``line`` only adds one named term to a running sum (``total =
    total + task_loss``, ``total += task_loss``), ``(line, text)`` of the last assignment to that
    term above it, below ``after``, in the same function: the statement that computes it. None
    otherwise."""
    tree = _parse(path)
    if tree is None:
        return None
    scope = _enclosing_function(tree, line)
    stmt = next((n for n in walk(scope) if isinstance(n, (ast.Assign, ast.AugAssign))
                 and n.lineno == line), None)
    if stmt is None:
        return None
    if isinstance(stmt, ast.AugAssign):
        if not (isinstance(stmt.op, ast.Add) and isinstance(stmt.target, ast.Name)):
            return None
        total, term = stmt.target.id, stmt.value
    else:
        if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
            return None
        total, value = stmt.targets[0].id, stmt.value
        if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)):
            return None
        sides = [value.left, value.right]
        rest = [side for side in sides if not (isinstance(side, ast.Name) and side.id == total)]
        if len(rest) != 1:
            return None
        term = rest[0]
    if not isinstance(term, ast.Name) or term.id == total:
        return None
    found = [n for n in walk(scope) if isinstance(n, ast.Assign) and after < n.lineno < line
             and any(isinstance(t, ast.Name) and t.id == term.id for t in n.targets)]
    if not found:
        return None
    node = max(found, key=lambda n: n.lineno)
    return node.lineno, ast.unparse(node).strip()


def item_term(path: str, line: int) -> tuple[int, str] | None:
    """``(line, text)`` of an assignment, above ``line`` in its function, to the variable
    backpropagated on ``line`` that adds a term read out with ``.item()`` (``loss = loss +
    penalty().item()``, ``loss += lam * reg.item()``): a Python number, no gradient. Names the
    function assigns from a call or from the loss count as tensors (``loss * w.item()`` scales
    the loss: not a term). None when there is none or the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    name = _backpropagated_name(tree, line)
    if name is None:
        return None
    scope = _enclosing_function(tree, line)
    tensors = {name}
    for node in walk(scope):
        if isinstance(node, ast.Assign) and not isinstance(node.value, ast.Constant):
            tensors.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            tensors.add(node.target.id)
    found = []
    for node in walk(scope):
        if not isinstance(node, (ast.Assign, ast.AugAssign)) or node.lineno >= line:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
            continue
        if isinstance(node, ast.AugAssign):
            if not isinstance(node.op, (ast.Add, ast.Sub)):
                continue
            terms = list(_additive_terms(node.value))
        else:
            terms = list(_additive_terms(node.value))
            if len(terms) < 2:
                continue  # ``loss = x.item()`` is no loss that backward could run on
        if any(_number_term(t, tensors) for t in terms):
            found.append((node.lineno, ast.unparse(node).strip()))
    return min(found) if found else None


def loss_assignment(path: str, line: int, framework: bool = False) -> tuple[int, str] | None:
    """``(line, text)`` of the last assignment, above ``line`` in the same function, to the
    variable that is backpropagated on ``line`` (``loss = w * crit(out, y)`` for
    ``loss.backward()``, ``scaler.scale(loss).backward()``, ``accelerator.backward(loss)``, ``self.manual_backward(loss)``, and a
    Lightning ``training_step``'s ``return loss``); None when there is none or the source
    cannot be read. ``framework``: the backward on ``line`` is known to be a framework's
    (``acc.backward(loss)``, whatever the accelerator is called)."""
    tree = _parse(path)
    if tree is None:
        return None
    name = _backpropagated_name(tree, line, framework)
    if name is None:
        return None
    scope = _enclosing_function(tree, line)
    best = None
    text = linecache.getline(path, line)
    for node in walk(scope):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and (
                node.lineno < line or _before_backward_on_line(node, line, text)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) \
                    and (best is None or node.lineno > best.lineno):
                best = node
    return (best.lineno, ast.unparse(best).strip()) if best is not None else None


def _before_backward_on_line(node: ast.AST, line: int, text: str) -> bool:
    """An assignment written on the backward's own line before it (``loss = crit(x, y);
    opt.zero_grad(); loss.backward()``)."""
    if node.lineno != line or getattr(node, "end_lineno", None) != line:
        return False
    end = getattr(node, "end_col_offset", None)
    return end is not None and "backward(" in text.encode("utf-8")[end:].decode("utf-8", "replace")


_TERM_SPAN = 30  # lines above the loss's assignment searched for the term


def _holds_term(node: ast.AST, term: str) -> bool:
    """Does the expression compute an exp (``.exp()``, ``torch.exp(...)``) or a square
    (``** 2``, ``.pow(2)``, ``torch.square``)?"""
    for sub in walk(node):
        if isinstance(sub, ast.Call):
            name = _last_name(sub.func)
            if term == "exp" and name == "exp":
                return True
            if term in ("logsumexp", "log_softmax") and name == term:
                return True
            if term == "linear" and name in ("max", "maximum", "min", "minimum") and len(sub.args) == 2:
                return True
            if term == "square" and (name == "square" or (
                    name == "pow" and any(isinstance(x, ast.Constant) and x.value == 2
                                          for x in sub.args))):
                return True
        elif (term == "square" and isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Pow)
              and isinstance(sub.right, ast.Constant) and sub.right.value == 2):
            return True
    return False


def term_line(path: str, line: int, term: str) -> tuple[int, str] | None:
    """``(line, text)`` of the one assignment, in the scope of the loss's assignment at
    ``line`` and a few lines above it, that computes an exp or square term (``term``), when the
    loss's assignment does not negate that variable itself (``loss = recon - kld``: the line to
    change is the loss's); else None."""
    tree = _parse(path)
    if tree is None:
        return None
    found = _innermost_statement(tree, line)
    if found is None:
        return None
    statement, block, index = found
    if not isinstance(statement, (ast.Assign, ast.AugAssign)):
        return None
    if _holds_term(statement.value, term):
        return None  # the term is written in the loss's own line
    inner = _loss_function_term(tree, statement.value, term)
    if inner is not None:  # loss = loss_function(recon, x, mu, logvar): the line in its body
        return inner
    return _term_assignment(statement.value, block[:index], term, line - _TERM_SPAN)


def _weight_name(node: ast.AST) -> str | None:
    """The name a weight expression reads (``w``, ``self.w``, ``w.view(1, -1, 1)``, ``w[:, None]``),
    else None."""
    for _ in range(4):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("view", "reshape", "unsqueeze", "to", "expand_as", "type_as"):
            node = node.func.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            break
    if isinstance(node, (ast.Name, ast.Attribute)):
        return ast.unparse(node)
    return None


def square_weight_origin(path: str) -> tuple[int, str, str] | None:
    """``(line, text, name)`` of the first assignment of the one name the file multiplies a
    square by (``(pred - y) ** 2 * lat_w``): where a weight tensor of a weighted squared error
    is made (its later rescalings keep its signs). None when no or several names weigh a square,
    or the name is never assigned."""
    tree = _parse(path)
    if tree is None:
        return None
    names = set()
    for node in walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for square, weight in ((node.left, node.right), (node.right, node.left)):
                if _holds_term(square, "square") and not _holds_term(weight, "square"):
                    name = _weight_name(weight)
                    if name is not None:
                        names.add(name)
    if len(names) != 1:
        return None
    name = names.pop()
    first = None
    for node in walk(tree):
        if isinstance(node, ast.Assign) and any(ast.unparse(t) == name for t in node.targets) \
                and (first is None or node.lineno < first.lineno):
            first = node
    return (first.lineno, ast.unparse(first).strip(), name) if first is not None else None


def _loss_function_term(tree: ast.AST, value: ast.AST, term: str) -> tuple[int, str] | None:
    """In ``loss = loss_function(...)``, a function of this file whose last statement returns
    the loss: the line of its body that computes the term (its return, or one assignment before
    it that the return adds with a plus sign)."""
    if not isinstance(value, ast.Call) or not isinstance(value.func, (ast.Name, ast.Attribute)):
        return None
    name = value.func.id if isinstance(value.func, ast.Name) else value.func.attr
    defs = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name == name]
    if len(defs) != 1 or not defs[0].body or not isinstance(defs[0].body[-1], ast.Return) \
            or defs[0].body[-1].value is None:
        return None
    body, returned = defs[0].body, defs[0].body[-1]
    if _holds_term(returned.value, term):
        return returned.lineno, ast.unparse(returned).strip()
    return _term_assignment(returned.value, body[:-1], term, body[0].lineno)


def _term_assignment(loss: ast.AST, before: list, term: str, first: int) -> tuple[int, str] | None:
    """The one assignment among ``before`` (from line ``first`` on) that computes the term,
    when the expression ``loss`` reads it without negating it."""
    candidates = []
    for stmt in before:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name) and stmt.lineno >= first \
                and _holds_term(stmt.value, term):
            candidates.append(stmt)
    if len(candidates) != 1:
        return None
    name = candidates[0].targets[0].id
    for sub in walk(loss):  # loss = recon - kld, loss = -kld + recon
        # a name the loss negates is where the sign is, whether or not it is the line that
        # writes the square: `loss = (nll - kl)` with the KL's mu ** 2 inside `model.kl()`;
        # so is the term itself negated with its weight (`loss = fit - lam * eik`)
        if (isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Sub) and isinstance(sub.right, ast.Name)) \
                or (isinstance(sub, ast.UnaryOp) and isinstance(sub.op, ast.USub)
                    and isinstance(sub.operand, ast.Name)):
            return None
        negated = sub.right if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Sub) \
            else sub.operand if isinstance(sub, ast.UnaryOp) and isinstance(sub.op, ast.USub) else None
        if negated is not None and name in _weighted_names(negated):
            return None
    if not any(isinstance(sub, ast.Name) and sub.id == name for sub in walk(loss)):
        return None  # the loss does not read it
    return candidates[0].lineno, ast.unparse(candidates[0]).strip()


def _mean_arg(node: ast.AST) -> ast.AST | None:
    """``x`` of ``x.mean()``, ``torch.mean(x)``, ``x.sum()``, ``torch.sum(x)`` (with or without
    axes), and of those divided by something; else None."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        node = node.left
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("mean", "sum"):
        root = node.func.value
        if isinstance(root, ast.Name) and root.id in ("torch", "th"):
            return node.args[0] if node.args else None
        return root
    return None


def _square_arg(node: ast.AST) -> ast.AST | None:
    """``x`` of ``x ** 2``, ``x.pow(2)``, ``torch.pow(x, 2)``, ``torch.square(x)``, ``x.square()``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) \
            and isinstance(node.right, ast.Constant) and node.right.value == 2:
        return node.left
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        root, attr = node.func.value, node.func.attr
        is_torch = isinstance(root, ast.Name) and root.id in ("torch", "th")
        if attr == "pow" and not is_torch and node.args and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value == 2:
            return root
        if attr == "pow" and is_torch and len(node.args) == 2 and isinstance(node.args[1], ast.Constant) \
                and node.args[1].value == 2:
            return node.args[0]
        if attr == "square":
            return node.args[0] if is_torch and node.args else (None if is_torch else root)
    return None


def _signed_parts(node: ast.AST, sign: int = 1):
    """The terms of a sum or difference with their signs (products by anything keep the sign
    of the factor's place: ``lam * m ** 2`` is ``+``)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        yield from _signed_parts(node.left, sign)
        yield from _signed_parts(node.right, -sign if isinstance(node.op, ast.Sub) else sign)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        yield from _signed_parts(node.operand, -sign)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
        for side in (node.left, node.right) if isinstance(node.op, ast.Mult) else (node.left,):
            if _mean_arg(side) is not None or _square_arg(side) is not None:
                yield side, sign
            elif isinstance(side, ast.BinOp) and isinstance(side.op, (ast.Mult, ast.Div)):
                yield from _signed_parts(side, sign)
    else:
        yield node, sign


def variance_added_lines(path: str) -> list[tuple[int, str, str]]:
    """``(line, text, x)`` of each expression that adds the square of ``x``'s mean to the mean
    of ``x``'s squares (``(d ** 2).mean() + lam * d.mean() ** 2``)."""
    tree = _parse(path)
    if tree is None:
        return []
    found = []
    for node in walk(tree):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))):
            continue
        squares, means = {}, {}
        for part, sign in _signed_parts(node):
            inner = _mean_arg(part)
            if inner is not None and _square_arg(inner) is not None:
                squares.setdefault(ast.unparse(_square_arg(inner)), set()).add(sign)
            inner = _square_arg(part)
            if inner is not None and _mean_arg(inner) is not None:
                means.setdefault(ast.unparse(_mean_arg(inner)), set()).add(sign)
        for x, signs in means.items():
            if signs == squares.get(x) == {1}:
                found.append((node.lineno, ast.unparse(node), x))
    seen, out = set(), []
    for line, text, x in found:  # an inner sum of the same line is the same finding
        if line not in seen:
            seen.add(line)
            out.append((line, text, x))
    return out


def self_product_lines(path: str) -> list[tuple[int, str, str]]:
    """``(line, text, x)`` of each matrix product of an expression with itself: ``x @ x``,
    ``torch.bmm(x, x)``, ``torch.mm(x, x)``, ``torch.matmul(x, x)``, ``x.bmm(x)``, ``x.matmul(x)``."""
    tree = _parse(path)
    if tree is None:
        return []
    out, seen = [], set()
    for node in walk(tree):
        pair = None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            pair = node.left, node.right
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("bmm", "mm", "matmul"):
            root = node.func.value
            if isinstance(root, ast.Name) and root.id in ("torch", "th") and len(node.args) == 2:
                pair = node.args[0], node.args[1]
            elif not (isinstance(root, ast.Name) and root.id in ("torch", "th")) and len(node.args) == 1:
                pair = root, node.args[0]
        if pair is None or ast.unparse(pair[0]) != ast.unparse(pair[1]) or node.lineno in seen:
            continue
        seen.add(node.lineno)
        out.append((node.lineno, ast.unparse(node), ast.unparse(pair[0])))
    return sorted(out)


def _weighted_names(node: ast.AST) -> set:
    """The names a product or quotient is made of (``lam * eik``, ``eik / n``, ``0.1 * eik``)."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _weighted_names(node.left) | _weighted_names(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _weighted_names(node.left)
    return set()


def _is_cpu_device(node: ast.AST) -> bool:
    """``"cpu"``, ``"cpu:0"``, ``torch.device("cpu")``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value == "cpu" or node.value.startswith("cpu:")
    return (isinstance(node, ast.Call) and _last_name(node.func) == "device" and bool(node.args)
            and _is_cpu_device(node.args[0]))


def _to_host(node: ast.AST) -> bool:
    """Does the code move a tensor to the CPU: ``.cpu()``, ``.to("cpu")``, ``.to(device="cpu")``,
    ``.to(torch.device("cpu"))``?"""
    for call in walk(node):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            continue
        if call.func.attr == "cpu":
            return True
        if call.func.attr == "to" and (
                (call.args and _is_cpu_device(call.args[0]))
                or any(k.arg == "device" and _is_cpu_device(k.value) for k in call.keywords)):
            return True
    return False


def _squared_difference(node: ast.AST) -> bool:
    """``(a - b) ** 2``, ``(a - b).pow(2)``, ``(a - b).abs()``, ``torch.abs(a - b)`` somewhere in
    the expression."""
    for sub in walk(node):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Pow) and isinstance(sub.left, ast.BinOp) \
                and isinstance(sub.left.op, ast.Sub):
            return True
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            if sub.func.attr in ("pow", "abs", "square") and isinstance(sub.func.value, ast.BinOp) \
                    and isinstance(sub.func.value.op, ast.Sub):
                return True
            if sub.func.attr in ("abs", "square", "pow") and sub.args and isinstance(sub.args[0], ast.BinOp) \
                    and isinstance(sub.args[0].op, ast.Sub):
                return True
    return False


def error_line(path: str, line: int) -> tuple[int, str] | None:
    """``(line, text)`` of the statement that computes a hand-written squared or absolute
    difference for the loss backpropagated at ``line``: the loss's assignment, one of the
    assignments it reads a few lines above, or the body of the script's function it calls
    (``loss = regression_loss(pred, y)``); None when none is found."""
    found = _loss_statement(path, line, _squared_difference)
    return None if found is None else (found[0], found[1])


def _loss_statement(path: str, line: int, holds) -> tuple[int, str, ast.AST] | None:
    """``(line, text, expression)`` of the statement of the loss backpropagated at ``line``
    whose value ``holds(value)`` says computes the term looked for: the loss's assignment, one
    of the assignments a few lines above it in its block, or an assignment or the return of a
    function of the script that one of those calls; None when none is found."""
    tree = _parse(path)
    if tree is None:
        return None
    assigned = loss_assignment(path, line)
    if assigned is None:
        return None
    found = _innermost_statement(tree, assigned[0])
    if found is None:
        return None
    statement, block, index = found
    value = getattr(statement, "value", None)
    if value is None:
        return None
    if holds(value):
        return assigned[0], assigned[1], value
    above = [stmt for stmt in reversed(block[max(0, index - _TERM_SPAN):index]) if isinstance(stmt, ast.Assign)]
    for stmt in above:
        if holds(stmt.value):
            return stmt.lineno, ast.unparse(stmt).strip(), stmt.value
    for source in (value, *(stmt.value for stmt in above)):
        for call in (n for n in walk(source) if isinstance(n, ast.Call)):
            name = _last_name(call.func)
            defs = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and n.name == name]
            if len(defs) == 1:
                for stmt in defs[0].body:
                    if isinstance(stmt, (ast.Assign, ast.Return)) and stmt.value is not None \
                            and holds(stmt.value):
                        return stmt.lineno, ast.unparse(stmt).strip(), stmt.value
    return None


_LOG_CALLS = frozenset({"log_softmax", "log", "logsigmoid", "log_sigmoid", "log2", "log10"})


def _is_log(node: ast.AST) -> bool:
    """Does the expression take a log (``F.log_softmax(...)``, ``p.log()``, ``torch.log``), or
    name one (``log_p``, ``logprobs``)?"""
    for sub in walk(node):
        if isinstance(sub, ast.Call) and _last_name(sub.func) in _LOG_CALLS:
            return True
        if isinstance(sub, (ast.Name, ast.Attribute)) and "log" in (_last_name(sub) or "").lower():
            return True
    return False


def _squared_operand(node: ast.AST) -> ast.AST | None:
    """The difference ``a - b`` that ``node`` itself squares or takes the absolute value or norm
    of (``(a - b) ** 2``, ``(a - b).pow(2)``, ``(a - b).abs()``, ``torch.abs(a - b)``,
    ``torch.linalg.norm(a - b, dim=1)``), or the name it does that of (``td ** 2``), else
    None."""
    inner = None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        inner = node.left
    elif isinstance(node, ast.Call) and _last_name(node.func) in ("pow", "abs", "square", "norm"):
        if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.BinOp):
            inner = node.func.value
        elif node.args:
            inner = node.args[0]
    if isinstance(inner, ast.Name):
        return inner  # a difference computed above: ``td ** 2``
    return inner if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Sub) else None


def _normalize_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and _last_name(node.func) == "normalize"


def _compared_target(expr: ast.AST, form: str) -> ast.AST | None:
    """The operand that plays the target in the expression's hand-written comparison: the
    factor of a product with a log that takes none (``form`` "cross-entropy"), the subtracted
    side of a squared or absolute difference ("squared error"), the second operand of a cosine
    ("cosine similarity")."""
    for sub in walk(expr):
        if form == "cross-entropy" and isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mult):
            left, right = _is_log(sub.left), _is_log(sub.right)
            if left != right:
                return sub.right if left else sub.left
        elif form == "squared error":
            inner = _squared_operand(sub)
            if inner is not None:
                return inner.right if isinstance(inner, ast.BinOp) else inner
        elif form == "cosine similarity":
            if isinstance(sub, ast.Call) and _last_name(sub.func) == "cosine_similarity" and len(sub.args) >= 2:
                return sub.args[1]
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mult) \
                    and _normalize_call(sub.left) and _normalize_call(sub.right):
                return sub.right
    return None


def comparison_line(path: str, line: int, form: str) -> tuple[int, str, str] | None:
    """``(line, text, target)`` of the statement that computes the hand-written comparison
    ``form`` ("cross-entropy", "squared error", "cosine similarity") of the loss backpropagated
    at ``line``, and the text of its target operand (``_compared_target``); None when none is
    found."""
    found = _loss_statement(path, line, lambda value: _compared_target(value, form) is not None)
    if found is None:
        return None
    target = _compared_target(found[2], form)
    squared = next((operand for sub in walk(found[2])
                    if (operand := _squared_operand(sub)) is not None), None)
    if form == "squared error" and isinstance(squared, ast.Name):  # td ** 2: where td = a - b
        difference = _difference_assigned(_parse(path), squared.id, found[0])
        if difference is None:
            return None
        return difference[0], difference[1], ast.unparse(difference[2]).strip()
    return found[0], found[1], ast.unparse(target).strip()


def _difference_assigned(tree: ast.AST | None, name: str, line: int) -> tuple[int, str, ast.AST] | None:
    """``(line, text, b)`` of the last assignment ``name = a - b`` above ``line`` in its
    function, or None (the name holds something else)."""
    if tree is None:
        return None
    best = None
    for node in walk(_enclosing_function(tree, line)):
        if isinstance(node, ast.Assign) and node.lineno < line and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name \
                and (best is None or node.lineno > best.lineno):
            best = node
    if best is None or not (isinstance(best.value, ast.BinOp) and isinstance(best.value.op, ast.Sub)):
        return None
    return best.lineno, ast.unparse(best).strip(), best.value.right


_GRAD_OFF = {"no_grad", "inference_mode", "set_grad_enabled"}


def _turns_grad_off(node: ast.AST) -> bool:
    """``torch.no_grad()``, ``torch.inference_mode()``, ``torch.set_grad_enabled(False)``, and
    the decorators ``@torch.no_grad`` / ``@torch.no_grad()``."""
    call = node if isinstance(node, ast.Call) else None
    func = call.func if call is not None else node
    name = _last_name(func) if isinstance(func, (ast.Name, ast.Attribute)) else None
    if name not in _GRAD_OFF:
        return False
    if name == "set_grad_enabled":
        return (call is not None and bool(call.args) and isinstance(call.args[0], ast.Constant)
                and call.args[0].value is False)
    if name == "inference_mode" and call is not None and call.args \
            and isinstance(call.args[0], ast.Constant) and call.args[0].value is False:
        return False
    return True


def no_grad_block(path: str, line: int) -> tuple[int, str] | None:
    """``(line, text)`` of the innermost ``with torch.no_grad():`` (or ``inference_mode``,
    ``set_grad_enabled(False)``) whose body holds ``line``, or of such a decorator on the
    innermost function that holds it; None when neither does (the mode was set elsewhere)."""
    tree = _parse(path)
    if tree is None:
        return None
    best = None
    for node in walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)) and node.body \
                and node.body[0].lineno <= line <= (node.end_lineno or node.lineno) \
                and any(_turns_grad_off(item.context_expr) for item in node.items):
            candidate = (node.lineno, f"with {', '.join(ast.unparse(i) for i in node.items)}:")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
                and node.body[0].lineno <= line <= (node.end_lineno or node.lineno):
            decorator = next((d for d in node.decorator_list if _turns_grad_off(d)), None)
            if decorator is None:
                continue
            candidate = (decorator.lineno, f"@{ast.unparse(decorator)}")
        else:
            continue
        if best is None or candidate[0] > best[0]:
            best = candidate
    return best


def _innermost_statement(tree: ast.AST, line: int) -> tuple[ast.stmt, list, int] | None:
    """The innermost statement holding ``line``, the block (list of statements) it is in and
    its index there."""
    best = None
    for parent in walk(tree):
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(parent, field, None)
            if not isinstance(block, list):
                continue
            for index, stmt in enumerate(block):
                if isinstance(stmt, ast.stmt) and stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
                    span = (stmt.end_lineno or stmt.lineno) - stmt.lineno
                    if best is None or span <= best[0]:
                        best = (span, stmt, block, index)
    return None if best is None else best[1:]


_CONSTANT_TARGETS = frozenset({"zeros_like", "ones_like", "full_like", "zeros", "ones", "full"})


def adversarial_term_after(path: str, line: int) -> tuple[int, str] | None:
    """For a model call on ``line`` whose outputs are bound to names and nothing more
    (``_, fake_scores, real_fmaps, fake_fmaps = mpd(wav, wav_hat)``): ``(line, text)`` of the
    first of the 4 statements after it in the same block that reads one of those names against
    a constant target (``torch.zeros_like(g)``, ``(1 - g) ** 2``, ``g ** 2``), the term a
    generator's loss takes from them; a feature-matching term, whose target is data, is passed
    over. None when there is none or the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    for block in walk(tree):
        body = getattr(block, "body", None)
        if not isinstance(body, list):
            continue
        for i, stmt in enumerate(body):
            if not isinstance(stmt, ast.stmt) or stmt.lineno != line:
                continue
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.value, ast.Call)):
                return None
            names = {n.id for n in walk(stmt.targets[0]) if isinstance(n, ast.Name)} - {"_"}
            for after in body[i + 1:i + 5]:
                value = getattr(after, "value", None)
                if not isinstance(after, (ast.Assign, ast.AugAssign, ast.AnnAssign)) or value is None:
                    continue
                read = {n.id for n in walk(value) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
                if read & names and _constant_target(value):
                    return after.lineno, ast.unparse(after).strip()
            return None
    return None


def _constant_target(expr: ast.AST) -> bool:
    """Does ``expr`` compare something with a constant target: a ``zeros_like``/``ones_like``
    (or ``zeros``/``ones``/``full``) call, a difference with a number (``1 - g``), or a square
    of a name (``g ** 2``: the target 0)?"""
    for node in walk(expr):
        if isinstance(node, ast.Call) and _last_name(node.func) in _CONSTANT_TARGETS:
            return True
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and any(
                isinstance(side, ast.Constant) and isinstance(side.value, (int, float))
                for side in (node.left, node.right)):
            return True
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) \
                and isinstance(node.left, (ast.Name, ast.Subscript)):
            return True
    return False


def target_filled_before(path: str, line: int) -> tuple[int, str, str] | None:
    """For a model call bound to a name on ``line`` (``output = netD(fake)``) whose next
    statement hands that name and another one to a call (``errG = criterion(output, label)``),
    or written inside that call on ``line`` (``errG = criterion(netD(fake), label)``):
    ``(line, text, name)`` of the last statement before ``line``, within the 3 before it in the
    same block, that fills that other name in place (``label.fill_(real_label)``: the target of
    pytorch/examples' DCGAN); else None."""
    tree = _parse(path)
    if tree is None:
        return None
    for block in walk(tree):
        body = getattr(block, "body", None)
        if not isinstance(body, list):
            continue
        for i, stmt in enumerate(body):
            if stmt.lineno != line:
                continue
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)):
                return None
            inline = stmt.value if isinstance(stmt.value, ast.Call) else None
            if inline is not None and len(inline.args) == 2 and any(
                    isinstance(arg, ast.Call) for arg in inline.args) and any(
                    isinstance(arg, ast.Name) for arg in inline.args):
                # the model call written inside the loss's: errG = criterion(netD(fake), label)
                target = next(arg.id for arg in inline.args if isinstance(arg, ast.Name))
            else:
                if i + 1 >= len(body):
                    return None
                out = stmt.targets[0].id
                after = body[i + 1]
                call = getattr(after, "value", None)
                if not isinstance(call, ast.Call):
                    return None
                names = [a.id for a in call.args if isinstance(a, ast.Name)]
                if out not in names or len(names) != 2:
                    return None
                target = names[1 - names.index(out)]
            for before in reversed(body[max(0, i - 3):i]):
                value = getattr(before, "value", None)
                if isinstance(before, ast.Expr) and isinstance(value, ast.Call) \
                        and isinstance(value.func, ast.Attribute) and value.func.attr == "fill_" \
                        and isinstance(value.func.value, ast.Name) and value.func.value.id == target:
                    text = linecache.getline(path, before.lineno).split("  #")[0].strip()
                    return before.lineno, text, target
                if any(isinstance(n, ast.Name) and n.id == target and isinstance(n.ctx, ast.Store)
                       for n in walk(before)):
                    return None  # bound again in between
            return None
    return None


def snapshot_restored_later(path: str, line: int, name: str) -> tuple[int, str] | None:
    """For a statement on ``line`` that binds ``name`` and sits in an ``if`` inside a loop (a
    snapshot taken on some iterations only: ``if val < best: best_state = model.state_dict()``):
    the first later line that restores or saves that name, ``X.load_state_dict(name)`` or
    ``torch.save(name, ...)``, with ``"load_state_dict"`` or ``"torch.save"``; else None."""
    tree = _parse(path)
    if tree is None:
        return None
    parents: dict = {}
    binding = None
    for node in walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
        if binding is None and isinstance(node, (ast.Assign, ast.AnnAssign)) \
                and node.lineno <= line <= (node.end_lineno or node.lineno):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {n.id for t in targets for n in walk(t) if isinstance(n, ast.Name)}
            if name in names:
                binding = node
    if binding is None:
        return None
    node, in_if = binding, False
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If):
            in_if = True
        elif isinstance(node, (ast.For, ast.While, ast.AsyncFor)):
            break
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return None
    else:
        return None
    if not in_if:
        return None  # taken at every iteration: the last one is the weights it holds anyway
    found = []
    for call in walk(tree):
        if not isinstance(call, ast.Call) or not call.args or call.lineno <= line:
            continue
        first, func = call.args[0], call.func
        if not (isinstance(first, ast.Name) and first.id == name and isinstance(func, ast.Attribute)):
            continue
        if func.attr == "load_state_dict":
            found.append((call.lineno, "load_state_dict"))
        elif func.attr == "save" and isinstance(func.value, ast.Name) and func.value.id == "torch":
            found.append((call.lineno, "torch.save"))
    return min(found) if found else None


def moves_to_host(path: str, line: int) -> bool | None:
    """Does the statement holding ``line`` move its tensors to the CPU (``.cpu()``,
    ``.to("cpu")``, ``.to(torch.device("cpu"))``), or, when it binds a plain name
    (``state = model.state_dict()``), does a later statement of its block that reads the name
    before rebinding it? On a GPU such a move copies; on the CPU it returns the very tensor (a GPU
    script checked on a CPU). ``.to(device)`` with a variable is not read as one. None when the
    source cannot be read or holds no statement there."""
    tree = _parse(path)
    if tree is None:
        return None
    found = _innermost_statement(tree, line)
    if found is None:
        return None
    stmt, block, index = found
    if _to_host(stmt):
        return True
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)):
        return False
    name = stmt.targets[0].id
    for later in block[index + 1:]:
        reads = any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                    for n in walk(later))
        if reads and _to_host(later):
            return True
        if any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
               for n in walk(later)):
            return False
    return False


# in-place tensor methods that write a tensor's values (a parameter edited by hand)
_WRITES = frozenset({"copy_", "lerp_", "mul_", "add_", "sub_", "div_", "clamp_", "clamp_min_",
                     "clamp_max_", "clip_", "fill_", "zero_", "addcmul_", "addcdiv_", "set_",
                     "normal_", "uniform_", "renorm_", "load_state_dict"})


def _written(call: ast.Call) -> ast.AST | None:
    """The tensor an in-place method chain writes (``p`` in ``p.data.mul_(d).add_(q)``), or
    None for a call that writes nothing of ours."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr in _WRITES):
        return None
    target = func.value
    while (isinstance(target, ast.Call) and isinstance(target.func, ast.Attribute)
           and target.func.attr in _WRITES):
        target = target.func.value
    return target


def _chain(node: ast.AST) -> list[str]:
    """``p.data`` -> ["p", "data"]; subscripts and calls are passed over."""
    parts = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, (ast.Subscript, ast.Call)):
            node = node.value if isinstance(node, ast.Subscript) else node.func
        else:
            break
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return parts[::-1]


def _bindings(target: ast.AST, source: ast.AST, out: dict) -> None:
    """Each name a ``for`` target binds, with the text of what it iterates: ``for p, e in
    zip(a.parameters(), b.parameters())`` binds p to ``a.parameters()``."""
    if isinstance(target, ast.Name):
        out[target.id] = ast.unparse(source)
    elif isinstance(target, (ast.Tuple, ast.List)):
        if (isinstance(source, ast.Call) and getattr(source.func, "id", None) == "zip"
                and len(source.args) == len(target.elts)):
            for elt, arg in zip(target.elts, source.args):
                _bindings(elt, arg, out)
        else:
            for elt in target.elts:
                _bindings(elt, source, out)


@_once_per_file
def param_writes(path: str) -> list[tuple[int, str, str, str | None]]:
    """The statements of ``path`` that write a tensor's values in place by hand, as ``(line,
    root name, source text, what a loop binds the root to or None)``: in-place methods
    (``p.copy_(p0)``, ``p.data.mul_(d).add_(e, alpha=1 - d)``, ``model.load_state_dict(s)``) and
    ``x.data = ...`` assignments, never on a ``.grad``. Empty when the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    bound: dict[str, str] = {}
    for node in walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            _bindings(node.target, node.iter, bound)
    found = []
    for node in walk(tree):
        target = None
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            target = _written(node.value)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            t = node.targets[0]
            if isinstance(t, ast.Subscript):
                t = t.value
            if isinstance(t, ast.Attribute) and t.attr == "data":
                target = t.value
        if target is None:
            continue
        chain = _chain(target)
        if not chain or "grad" in chain:
            continue
        found.append((node.lineno, chain[0], ast.unparse(node).strip(), bound.get(chain[0])))
    return sorted(found)


def foreach_writes(path: str, name: str) -> list[int]:
    """Lines of ``torch._foreach_*_`` calls (in place: ``_foreach_lerp_``, ``_foreach_mul_``,
    ``_foreach_add_``, ``_foreach_copy_``) whose first argument is the module held as ``name``'s
    parameters or a name bound from them (``ema_params = list(ema.parameters())``). Empty when
    the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    names = {name}
    for _ in range(3):
        for node in walk(tree):
            if isinstance(node, ast.Assign) and _names_in(node.value) & names:
                for t in node.targets:
                    names |= {n.id for n in walk(t) if isinstance(n, ast.Name)}
    lines = []
    for node in walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called.startswith("_foreach_") and called.endswith("_") and _names_in(node.args[0]) & names:
            lines.append(node.lineno)
    return sorted(lines)


_SOFTMAX_FUNCTIONS = frozenset({"softmax", "log_softmax", "gumbel_softmax"})
_SOFTMAX_MODULES = frozenset({"Softmax", "LogSoftmax"})
_NAMESPACES = frozenset({"torch", "F", "nn", "functional", "special"})


@_once_per_file
def softmax_first_axis_calls(path: str) -> list[tuple[int, str]]:
    """The (log-)softmax calls of ``path`` given the literal dimension 0, as ``(line, source text
    of the call)``: ``torch.softmax(x, 0)``, ``F.log_softmax(x, dim=0)``, ``x.softmax(0)``,
    ``nn.Softmax(dim=0)``, ``F.gumbel_softmax(x, tau, dim=0)``. Empty when the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    found = []
    for node in walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in _SOFTMAX_FUNCTIONS and name not in _SOFTMAX_MODULES:
            continue
        dim = next((k.value for k in node.keywords if k.arg == "dim"), None)
        if name == "gumbel_softmax":
            # gumbel_softmax(logits, tau, hard, eps, dim): its dim is the fifth argument
            dim = dim if dim is not None else (node.args[4] if len(node.args) > 4 else None)
        elif dim is None:
            receiver = _chain(func.value) if isinstance(func, ast.Attribute) else []
            function_form = name in _SOFTMAX_MODULES or not receiver \
                or receiver[-1] in _NAMESPACES
            position = 0 if name in _SOFTMAX_MODULES or not function_form else 1
            dim = node.args[position] if len(node.args) > position else None
        if isinstance(dim, ast.Constant) and dim.value == 0 and not isinstance(dim.value, bool):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def _sum_over_first_axis(node: ast.AST) -> bool:
    """``q.sum(0)``, ``q.sum(dim=0, keepdim=True)``, ``torch.sum(q, 0)``: a sum whose literal
    dimension is 0 (and only 0)."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute) \
            or node.func.attr != "sum":
        return False
    receiver = _chain(node.func.value)
    function_form = bool(receiver) and receiver[-1] in _NAMESPACES
    dim = next((k.value for k in node.keywords if k.arg == "dim"), None)
    if dim is None:
        position = 1 if function_form else 0
        dim = node.args[position] if len(node.args) > position else None
    return isinstance(dim, ast.Constant) and dim.value == 0 and not isinstance(dim.value, bool)


def sum_normalised_first_axis(path: str) -> list[tuple[int, str]]:
    """The divisions of ``path`` by a sum over the literal dimension 0, as ``(line, source text
    of the division)``: ``q / q.sum(dim=0, keepdim=True)``, ``p / torch.sum(p, 0)``; with ``/=``
    the statement (``q /= q.sum(0)``). A target normalised that way sums to 1 down each column
    (across the batch), not along each row. Empty when the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    weighing = _names_times_log(tree)
    found = []
    for node in walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id in weighing \
                and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Div) \
                and _sum_over_first_axis(node.value.right):
            found.append((node.lineno, ast.unparse(node.value)))
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div) \
                and isinstance(node.target, ast.Name) and node.target.id in weighing \
                and _sum_over_first_axis(node.value):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def _names_times_log(tree: ast.AST) -> set[str]:
    """The names a product multiplies with a log-probability (``q * F.log_softmax(s, 1)``,
    ``-(t * torch.log(p))``): a soft target's."""
    def logged(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Call) and _callee_name(n) in ("log_softmax", "log")
                   for n in walk(node))

    logs = {t.id for node in walk(tree) if isinstance(node, ast.Assign) and logged(node.value)
            for t in node.targets if isinstance(t, ast.Name)}
    names: set[str] = set()
    for node in walk(tree):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
            continue
        for side, other in ((node.left, node.right), (node.right, node.left)):
            if isinstance(side, ast.UnaryOp):
                side = side.operand
            if isinstance(side, ast.Name) and (logged(other) or any(
                    isinstance(n, ast.Name) and n.id in logs for n in walk(other))):
                names.add(side.id)
    return names


def _callee_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def label_weight_tables(path: str) -> list[tuple[int, str, str]]:
    """The per-class tables of ``path`` looked up by a label inside a product (``w[y] * ce``,
    ``(cb[labels] * focal).mean()``), each as ``(line, source text, table name)`` of the
    statement that computes the table: the latest assignment to it before the lookup that does
    not read it (``w = counts / counts.sum()``, not a renormalisation ``w = w / w.sum()``).
    Empty when the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    lookups: dict[str, int] = {}
    for node in walk(tree):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
            continue
        for side in (node.left, node.right):
            for sub in walk(side):
                if isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name) \
                        and isinstance(sub.slice, (ast.Name, ast.Attribute)):
                    lookups.setdefault(sub.value.id, sub.lineno)
    found = []
    for name, line in lookups.items():
        made = [n for n in walk(tree) if isinstance(n, ast.Assign) and n.lineno < line
                and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
                and n.targets[0].id == name]
        made = [n for n in made if not any(isinstance(m, ast.Name) and m.id == name
                                           for m in walk(n.value))]
        if made:
            last = max(made, key=lambda n: n.lineno)
            found.append((last.lineno, ast.unparse(last), name))
    return sorted(found)


def column_picks_by_name(path: str) -> list[tuple[int, str, str, str]]:
    """The subscripts of ``path`` that pick columns of every row by a tensor of numbers,
    ``p[:, y]`` (a full slice, then a name or an attribute such as ``batch.y``), as ``(line,
    source text, the subscripted value's text, the index's text)``. With one class number per
    sample as the index, each row reads every sample's class. Empty when the source cannot be
    read."""
    tree = _parse(path)
    if tree is None:
        return []
    found = []
    for node in walk(tree):
        if not isinstance(node, ast.Subscript) or not isinstance(node.slice, ast.Tuple) \
                or len(node.slice.elts) != 2:
            continue
        first, second = node.slice.elts
        if not (isinstance(first, ast.Slice) and first.lower is None and first.upper is None
                and first.step is None):
            continue
        if not isinstance(second, (ast.Name, ast.Attribute)):
            continue
        found.append((node.lineno, ast.unparse(node), ast.unparse(node.value), ast.unparse(second)))
    return sorted(found)


def gather_first_axis_calls(path: str) -> list[tuple[int, str]]:
    """The ``gather`` / ``take_along_dim`` calls of ``path`` given the literal dimension 0, as
    ``(line, source text of the call)``: ``q.gather(0, a)``, ``torch.gather(q, 0, a)``,
    ``q.gather(dim=0, index=a)``, ``torch.take_along_dim(q, a, dim=0)``. Empty when the source
    cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    found = []
    for node in walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in ("gather", "take_along_dim"):
            continue
        dim = next((k.value for k in node.keywords if k.arg == "dim"), None)
        if dim is None:
            receiver = _chain(func.value) if isinstance(func, ast.Attribute) else []
            function_form = not receiver or receiver[-1] in _NAMESPACES
            position = (1 if function_form else 0) if name == "gather" else (2 if function_form else 1)
            dim = node.args[position] if len(node.args) > position else None
        if isinstance(dim, ast.Constant) and dim.value == 0 and not isinstance(dim.value, bool):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def subtracting_lines(path: str, name: str) -> list[tuple[int, str]]:
    """The lines of ``path`` that subtract the tensor ``name`` (a parameter's name, its last
    part matched: ``log_vars``, or one element of it: ``log_vars[0]``) from something, as
    ``(line, code without its comment)``: ``loss_reg * w - log_vars[0]``,
    ``l - self.log_vars[0]``; not a negation inside a call (``torch.exp(-log_vars[0])``) nor
    another element (``- log_vars[1]``). Empty when the source cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError, ValueError):
        return []
    base, _, element = name.rpartition(".")[2].partition("[")
    if not base.isidentifier():
        return []
    tail = rf"\[\s*{re.escape(element[:-1].strip())}\s*\]" if element else r"(?![\w\[])"
    pattern = re.compile(rf"[\w)\]]\s*-\s*(?:\w+\.)*{re.escape(base)}{tail}")
    found = []
    for number, text in enumerate(lines, 1):
        code = text.split("#", 1)[0]
        if pattern.search(code):
            found.append((number, code.strip()))
    return found


def subtracted_beside_factor(path: str, element: str) -> list[tuple[int, str]]:
    """The lines of ``path`` that subtract some ``NAME[k]`` (``element``: ``"[k]"``) and weigh a
    term with a factor of the same ``NAME[k]`` on the same line: ``exp(-NAME[k])``,
    ``exp(NAME[k])``, ``NAME[k] ** 2`` (a weight under another name: ``s = model.log_vars``),
    as ``(line, code without its comment)``."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError, ValueError):
        return []
    index = re.escape(element.strip("[] "))
    subtract = re.compile(rf"[\w)\]]\s*-\s*((?:\w+\.)*\w+)\[\s*{index}\s*\]")
    found = []
    for number, text in enumerate(lines, 1):
        code = text.split("#", 1)[0]
        for match in subtract.finditer(code):
            name = re.escape(match.group(1))
            factor = re.compile(rf"exp\(\s*-?\s*{name}\[\s*{index}\s*\]|{name}\[\s*{index}\s*\]\s*\*\*")
            if factor.search(code):
                found.append((number, code.strip()))
                break
    return found


def _same_number(value, number: float | None) -> bool:
    return (number is not None and isinstance(value, (int, float)) and not isinstance(value, bool)
            and value != 0 and abs(value - number) <= 1e-9 * abs(number))


def _factor_bodies(path: str, line: int, function: str) -> tuple[str, list[ast.AST]] | None:
    """``(text, bodies)`` of the ``lr_lambda`` given to a ``function`` (``LambdaLR``) call on
    ``line``: a lambda's body read in place; a name, the ``def`` of that name in the file (one
    level, no calls followed). None when the source cannot be read or holds no such call."""
    tree = _parse(path)
    if tree is None:
        return None
    given = call_argument(path, line, function, 1, "lr_lambda")
    if given is None:
        return None
    try:
        expr = ast.parse(given, mode="eval").body
    except SyntaxError:
        return None
    bodies: list[ast.AST] = []
    for node in (expr.elts if isinstance(expr, (ast.List, ast.Tuple)) else [expr]):
        if isinstance(node, ast.Lambda):
            bodies.append(node.body)
        elif isinstance(node, ast.Name):
            bodies += [d for d in walk(tree)
                       if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == node.id]
    return given, bodies



def factor_branch_line(path: str, line: int, function: str) -> int | None:
    """The line of the one branch (an ``if``, or ``... if ... else ...``) of the one ``lr_lambda``
    ``def`` given to a ``function`` (``LambdaLR``) call on ``line`` that compares its step
    (its first parameter) with something: where a warm-up and a decay are chosen. None for an
    inline lambda, and when there is no such ``def``, or none or several such branches."""
    found = _factor_bodies(path, line, function)
    if found is None or len(found[1]) != 1:
        return None
    body = found[1][0]
    if not isinstance(body, (ast.FunctionDef, ast.AsyncFunctionDef)) or not body.args.args:
        return None  # an inline lambda: its branch is on the constructor's line
    params = body.args.args
    step = params[0].arg
    branches = [n for n in walk(body) if isinstance(n, (ast.If, ast.IfExp))
                and any(isinstance(c, ast.Compare) and any(isinstance(m, ast.Name) and m.id == step
                                                           for m in walk(c))
                        for c in walk(n.test))]
    return branches[0].lineno if len(branches) == 1 else None


def _names_loss(node: ast.AST) -> bool:
    """Whether ``node`` reads a name or attribute that names a loss (``loss``, ``self.best_loss``,
    ``smoothed_loss``, ``self.losses[-1]``)."""
    for n in walk(node):
        ident = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else ""
        if "loss" in ident.lower():
            return True
    return False


def stops_on_divergence(path: str, line: int) -> bool:
    """Whether the function holding ``line`` (a scheduler's ``step()``, an lr write) also leaves
    its loop when the loss diverges: an ``if`` whose test compares a loss or asks whether it is
    NaN/inf (``if loss > diverge_th * self.best_loss: break``, ``if math.isnan(loss) or loss >
    self.min * 3: raise CancelFitException()``) and whose body breaks, returns or raises. That
    is an lr range test (torch-lr-finder, fastai's and miniai's ``LRFinder``): its lr climbs
    exponentially on purpose until the loss blows up, and training starts over after it. False
    when the source cannot be read or no such stop is there."""
    tree = _parse(path)
    if tree is None:
        return False
    scope = _enclosing_function(tree, line)
    if scope is tree:
        return False
    for node in scope_walk(scope):
        if not isinstance(node, ast.If):
            continue
        test = node.test
        compares = any(isinstance(n, ast.Compare) and _names_loss(n) for n in walk(test))
        non_finite = any(isinstance(n, ast.Call) and _callee_name(n) in ("isnan", "isinf")
                         and _names_loss(n) for n in walk(test))
        if not (compares or non_finite):
            continue
        if any(isinstance(n, (ast.Break, ast.Return, ast.Raise)) for stmt in node.body
               for n in walk(stmt)):
            return True
    return False


def factor_capped(path: str, line: int, function: str) -> bool:
    """Whether every ``lr_lambda`` given to a ``function`` (``LambdaLR``) call on ``line`` has a
    ceiling in its text: a ``min(...)`` of two or more terms (a warm-up capped at 1 or by its
    decay, ``min((s + 1) / w, (w / (s + 1)) ** 0.5)``), a ``clamp``/``clip`` with an upper
    bound, or a branch (``... if s < w else ...``, an ``if`` in its ``def``: a warm-up, then
    another piece). False when a body has none of them (``(s + 1) / w`` rises without end), or
    the source cannot be read."""
    found = _factor_bodies(path, line, function)
    if found is None or not found[1]:
        return False
    return all(_body_capped(body) for body in found[1])


def _body_capped(body: ast.AST) -> bool:
    """Whether a schedule's text has a ceiling: a branch, a ``min`` of two terms or more, a
    clamp with an upper bound, or a step taken modulo a period (a cycle)."""
    for node in walk(body):
        if isinstance(node, (ast.IfExp, ast.If)):
            return True
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            return True
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            terms = len(node.args) if not (len(node.args) == 1 and isinstance(
                node.args[0], (ast.List, ast.Tuple))) else len(node.args[0].elts)
            if name in ("min", "minimum") and terms >= 2 or name == "clamp_max" or \
                    name in ("clamp", "clip") and (terms >= 2 or any(k.arg == "max" for k in node.keywords)):
                return True
    return False


def written_lr_capped(path: str, line: int) -> bool:
    """Whether the value a script's own lr assignment on ``line`` writes (``g["lr"] = f(step)``)
    has a ceiling in its text (``_body_capped``): the expression itself, or the ``def`` of the
    function it calls by name in the file (one level). False when the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return False
    for stmt in walk(tree):
        if not isinstance(stmt, (ast.Assign, ast.AugAssign)) or stmt.lineno != line:
            continue
        value = stmt.value
        if _body_capped(value):
            return True
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            defs = [d for d in walk(tree) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and d.name == value.func.id]
            if defs and all(_body_capped(d) for d in defs):
                return True
    return False


_STRAIGHT_CALLS = frozenset({"float", "int", "min", "max"})


def _degree(node, names: set) -> int | None:
    """0: ``node`` holds none of ``names``; 1: it is a straight (affine) function of them, capped
    pieces (``min``/``max``) included; None: something else (a power, a cosine, a product of
    two of them, a division by one)."""
    if isinstance(node, ast.Name):
        return 1 if node.id in names else 0
    if isinstance(node, ast.Constant):
        return 0 if isinstance(node.value, (int, float)) else None
    if isinstance(node, (ast.Attribute, ast.Subscript)):
        return 0 if not any(isinstance(n, ast.Name) and n.id in names for n in walk(node)) else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _degree(node.operand, names)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left, right = _degree(node.left, names), _degree(node.right, names)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Mult) and left and right:
            return None
        if isinstance(node.op, ast.Div) and right:
            return None
        return max(left, right)
    if isinstance(node, ast.Call) and not any(isinstance(n, ast.Name) and n.id in names
                                              for n in walk(node)):
        return 0  # a call that does not see the step (len(batches)): a constant
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _STRAIGHT_CALLS \
            and node.args and not node.keywords:
        degrees = [_degree(arg, names) for arg in node.args]
        if any(d is None for d in degrees) or (node.func.id in ("float", "int") and len(degrees) != 1):
            return None
        return max(degrees)
    return None


def factor_straight(path: str, line: int, function: str) -> bool:
    """Whether every ``lr_lambda`` given to a ``function`` (``LambdaLR``) call on ``line`` is a
    straight line in its step (``min(1, s / 500)``, ``1 - e / total``, ``float(s + 1) / w``),
    capped pieces aside: a lambda read in place, or a ``def`` of that name in the file whose
    body is one ``return``. False for anything else (a power, a cosine, a branch, a call), or
    when the source cannot be read."""
    tree = _parse(path)
    given = call_argument(path, line, function, 1, "lr_lambda") if tree is not None else None
    if given is None:
        return False
    try:
        expr = ast.parse(given, mode="eval").body
    except SyntaxError:
        return False
    nodes = expr.elts if isinstance(expr, (ast.List, ast.Tuple)) else [expr]
    for node in nodes:
        if isinstance(node, ast.Lambda):
            params, body = node.args.args, node.body
        elif isinstance(node, ast.Name):
            defs = [d for d in walk(tree) if isinstance(d, ast.FunctionDef) and d.name == node.id]
            if len(defs) != 1:
                return False
            statements = [b for b in defs[0].body if not (isinstance(b, ast.Expr) and
                                                          isinstance(b.value, ast.Constant))]
            if len(statements) != 1 or not isinstance(statements[0], ast.Return) \
                    or statements[0].value is None:
                return False
            params, body = defs[0].args.args, statements[0].value
        else:
            return False
        if len(params) != 1 or _degree(body, {params[0].arg}) != 1:
            return False
    return True


def factor_mentions(path: str, line: int, function: str, lr_text: str | None,
                    lr_value: float | None) -> str | None:
    """The text of the ``lr_lambda`` given to a ``function`` (``LambdaLR``) call on ``line`` when
    its body uses the optimizer's learning rate: the expression the optimizer was given as its
    lr (``lr``, ``args.lr``, ``cfg["lr"]``), or a number equal to it. A lambda is read in place; a
    name, as the body of the ``def`` of that name in the file (one level, no calls followed).
    None when it does not, or the source cannot be read."""
    found = _factor_bodies(path, line, function)
    if found is None:
        return None
    given, bodies = found
    wanted = None
    if lr_text:
        try:
            wanted = ast.dump(ast.parse(lr_text, mode="eval").body)
        except SyntaxError:
            wanted = None
    for body in bodies:
        for node in walk(body):
            if isinstance(node, ast.Constant) and _same_number(node.value, lr_value):
                return given
            if wanted is not None and isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)) \
                    and isinstance(getattr(node, "ctx", None), ast.Load) and ast.dump(node) == wanted:
                return given
    return None


def group_lr(path: str, line: int, index: int) -> tuple[int, str] | None:
    """``(line, text)`` of the ``"lr"`` of the ``index``-th param group given as a dict literal
    to a call on ``line`` (an optimizer's list of groups, or ``add_param_group({...})``), or None
    (no such dict, no "lr" key in it, or the source cannot be read)."""
    tree = _parse(path)
    if tree is None:
        return None
    for node in walk(tree):
        if not (isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno)):
            continue
        given = node.args[0] if node.args else next(
            (k.value for k in node.keywords if k.arg in ("params", "param_group")), None)
        groups = [given] if isinstance(given, ast.Dict) else \
            list(given.elts) if isinstance(given, (ast.List, ast.Tuple)) else []
        if index >= len(groups) or not isinstance(groups[index], ast.Dict):
            continue
        for key, value in zip(groups[index].keys, groups[index].values):
            if isinstance(key, ast.Constant) and key.value == "lr":
                return value.lineno, ast.unparse(value)
    return None


_PARAM_WORDS = ("parameters", "weight", "bias")


def _param_bound(tree: ast.AST) -> set[str]:
    """Names a ``for`` or a comprehension binds to a model's parameters (``for p in
    model.parameters()``, ``for n, p in m.named_parameters()``, ``for w in (fc.weight,)``)."""
    bound: dict[str, str] = {}
    names: set[str] = set()
    for node in walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            bound.clear()
            _bindings(node.target, node.iter, bound)
            names.update(n for n, text in bound.items() if any(w in text for w in _PARAM_WORDS))
    return names


def _outside_targets(expr: ast.AST):
    """The nodes of ``expr``, less a loss function's target arguments (``F.mse_loss(feat,
    centers.weight.detach())``: a detached parameter as the target is data on purpose)."""
    todo = [expr]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.Call) and any(w in (_last_name(node.func) or "").lower()
                                              for w in ("loss", "crit", "cross_entropy", "kl_div")):
            todo.append(node.func)
            todo.extend(node.args[:1])
            todo.extend(k.value for k in node.keywords if k.arg in ("input", None))
            continue
        todo.extend(ast.iter_child_nodes(node))


def _cuts_param(expr: ast.AST, params: set[str]) -> bool:
    """Does ``expr`` read a parameter cut from the graph: ``p.data`` / ``p.detach()`` of a name
    bound to parameters, or of an attribute chain through ``weight`` / ``bias`` (not as a loss
    function's target)?"""
    for node in _outside_targets(expr):
        target = None
        if isinstance(node, ast.Attribute) and node.attr == "data":
            target = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "detach"):
            target = node.func.value
        if target is None:
            continue
        chain = _chain(target)
        if chain and (chain[0] in params or any(w in chain for w in ("weight", "bias"))):
            return True
    return False


def _statement_at(tree: ast.AST, line: int) -> ast.stmt | None:
    best = None
    for node in walk(tree):
        if isinstance(node, ast.stmt) and node.lineno == line and \
                not isinstance(node, (ast.For, ast.While, ast.If, ast.With, ast.FunctionDef)):
            best = node
    return best


def cut_penalty(path: str, line: int) -> tuple[int, str] | None:
    """``(line, text)`` of the statement that makes a term of the loss backpropagated on
    ``line`` from parameters cut from the graph (``l2 = sum((p.data ** 2).sum() for p in
    model.parameters())``, ``loss = ce + wd * w.detach().norm()``): the loss's assignment, an
    assignment above it to a name it reads, or a statement of a function of the file it calls
    (one level each). None when there is none or the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    params = _param_bound(tree)
    found = loss_assignment(path, line)
    start = _statement_at(tree, found[0] if found is not None else line)
    if start is None:
        return None
    value = getattr(start, "value", start)
    if _cuts_param(value, params):
        return start.lineno, ast.unparse(start).strip()
    defs = {d.name: d for d in walk(tree) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}
    scope = _enclosing_function(tree, start.lineno)
    sources = [value]
    for name in {n.id for n in walk(value) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}:
        best = None
        for node in walk(scope):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.lineno < start.lineno \
                    and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets) \
                        and (best is None or node.lineno > best.lineno):
                    best = node
        if best is not None:
            if _cuts_param(best.value, params):
                return best.lineno, ast.unparse(best).strip()
            sources.append(best.value)
    for expr in sources:
        for call in walk(expr):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in defs:
                for stmt in walk(defs[call.func.id]):
                    if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.Return, ast.Expr)) \
                            and getattr(stmt, "value", None) is not None \
                            and _cuts_param(stmt.value, params):
                        return stmt.lineno, ast.unparse(stmt).strip()
    return None


def schedule_arguments(path: str, line: int, cls: str) -> str | None:
    """The arguments of the ``cls(...)`` constructor call on ``line`` other than the optimizer
    (its first positional argument or ``optimizer=``), as text: ``"lr_lambda=warmup"`` for
    ``LambdaLR(opt, lr_lambda=warmup)``; None when the line holds no single such call."""
    tree = _parse(path)
    if tree is None:
        return None
    calls = [node for node in walk(tree) if isinstance(node, ast.Call)
             and node.lineno <= line <= (node.end_lineno or node.lineno) and _last_name(node.func) == cls]
    if len(calls) != 1:
        return None
    call = calls[0]
    keywords = [k for k in call.keywords if k.arg != "optimizer"]
    positional = call.args[1:] if len(keywords) == len(call.keywords) else call.args
    return ", ".join([ast.unparse(a) for a in positional]
                     + [f"{k.arg}={ast.unparse(k.value)}" if k.arg else f"**{ast.unparse(k.value)}"
                        for k in keywords])


def value_reaches_backward(path: str, line: int) -> int | None:
    """``result_reaches_backward``, also for a value a function returns from ``line`` itself
    (``return {"age": F.l1_loss(...), ...}``): the line of a backward whose loss is computed
    from what a call of that function gives; None when there is none."""
    found = result_reaches_backward(path, line)
    if found is not None:
        return found
    tree = _parse(path)
    if tree is None:
        return None
    statement = next((node for node in walk(tree) if isinstance(node, ast.Return)
                      and node.value is not None
                      and node.lineno <= line <= (node.end_lineno or node.lineno)), None)
    if statement is None:
        return None
    scope = _enclosing_function(tree, line)
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    for node in walk(tree):
        if isinstance(node, ast.Assign) and any(
                isinstance(c, ast.Call) and _last_name(c.func) == scope.name
                for c in walk(node.value)):
            found = result_reaches_backward(path, node.lineno)
            if found is not None:
                return found
    return None


# what cuts a value from the graph: tensor methods, NumPy/number round trips, new tensors
_CUT_METHODS = {"detach": ".detach()", "item": ".item()", "numpy": ".numpy()", "tolist": ".tolist()",
                "argmax": "argmax", "argmin": "argmin"}
_CUT_MAKERS = {"tensor": "torch.tensor()", "as_tensor": "torch.as_tensor()",
               "from_numpy": "torch.from_numpy()"}
_NO_GRAD = ("no_grad", "inference_mode")
_LOSS_WORDS = ("loss", "crit")


def _cut_how(expr: ast.AST) -> str | None:
    """How ``expr`` cuts a value from the graph (``.detach()``, ``.data``...), or None."""
    for node in walk(expr):
        if isinstance(node, ast.Attribute) and node.attr == "data" and isinstance(node.ctx, ast.Load):
            return ".data"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in _CUT_METHODS:
                return _CUT_METHODS[node.func.attr]
            if node.func.attr in _CUT_MAKERS and _root(node.func) in ("torch", "th"):
                return _CUT_MAKERS[node.func.attr]
    return None


_HARD_CALLS = {"argmax": "argmax", "argmin": "argmin", "round": "round", "floor": "floor",
               "ceil": "ceil", "sign": "sign", "searchsorted": "searchsorted",
               "bucketize": "bucketize"}
_HARD_CASTS = ("float", "long", "int", "double", "half", "bool", "to", "type", "type_as")
_HARD_HOPS = 4  # assignments followed back from the loss's terms


def _hard_ops(expr: ast.AST):
    """``(how, operand)`` for each op in ``expr`` whose result has no gradient however its input
    was made: ``x.argmax(1)``, ``torch.argmax(x, 1)``, ``x.round()``, a comparison made a number
    (``(p > 0.5).float()``, ``torch.where(p > 0.5, 1.0, 0.0)``)."""
    for node in walk(expr):
        if not isinstance(node, ast.Call):
            continue
        name = _last_name(node.func)
        if name in _HARD_CALLS:
            if isinstance(node.func, ast.Attribute) and _root(node.func) not in ("torch", "th", "F"):
                yield f".{name}()", node.func.value
            elif node.args:
                yield f"torch.{name}()", node.args[0]
        elif name in _HARD_CASTS and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Compare):
            yield f"a threshold comparison cast with .{name}()", node.func.value
        elif name == "where" and node.args and isinstance(node.args[0], ast.Compare) \
                and len(node.args) == 3 and all(isinstance(a, ast.Constant) for a in node.args[1:]):
            yield "torch.where(comparison, constant, constant)", node.args[0]


_LIBRARIES = ("torch", "th", "F", "nn", "math", "np")


def _names_outside_hard(expr: ast.AST) -> set:
    """The names ``expr`` reads as a prediction, other than inside a hard op's operand: the
    first argument of each call (``ce(logits, y)``: not the target), a method's receiver, both
    sides of arithmetic."""
    cut = {id(n) for _, operand in _hard_ops(expr) for n in walk(operand)}
    out: set = set()

    def visit(node) -> None:
        if node is None or id(node) in cut:
            return
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                out.add(node.id)
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and not (
                    isinstance(node.func.value, ast.Name) and node.func.value.id in _LIBRARIES + ("self",)):
                visit(node.func.value)  # a method of a value: (pred - y).abs().mean()
            visit(node.args[0] if node.args else None)
        elif isinstance(node, (ast.BinOp,)):
            visit(node.left)
            visit(node.right)
        elif isinstance(node, ast.UnaryOp):
            visit(node.operand)
        elif isinstance(node, (ast.Subscript, ast.Starred)):
            visit(node.value)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for item in node.elts:
                visit(item)

    visit(expr)
    return out


def _model_call(value: ast.AST) -> bool:
    """A call of the model or a helper (``net(x)``, ``self.head(f)``): what it is given is its
    input, not a prediction of the loss."""
    return isinstance(value, ast.Call) and not (
        isinstance(value.func, ast.Attribute) and (
            not isinstance(value.func.value, ast.Name) or value.func.value.id in _LIBRARIES
            or value.func.value.id not in ("self",) and value.func.attr in _TENSOR_METHODS))


_TENSOR_METHODS = frozenset({"float", "long", "permute", "view", "reshape", "softmax", "sigmoid",
                             "log_softmax", "mean", "sum", "flatten", "squeeze", "unsqueeze",
                             "transpose", "contiguous", "clone", "detach", "to", "abs", "pow"})


def hard_cut_term(path: str, line: int) -> tuple[int, str, str, str] | None:
    """``(line, text, how, name)`` of the statement that makes a term of the loss backpropagated
    on ``line`` from a hard op on a value the loss also reaches through its other terms: the
    loss's assignment or one above it (followed back ``_HARD_HOPS`` assignments deep in its
    function) computes ``how`` (``.argmax()``, a thresholded comparison...) of ``name``, and
    ``name`` is read by the loss's other terms outside any hard op (``loss = ce(logits, y) +
    dice(F.one_hot(logits.argmax(1), C), target)``). None when there is none or the source
    cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    found = loss_assignment(path, line)
    start = _statement_at(tree, found[0] if found is not None else line)
    if start is None or getattr(start, "value", None) is None:
        return None
    scope = _enclosing_function(tree, start.lineno)
    assignments = sorted((n for n in walk(scope) if isinstance(n, (ast.Assign, ast.AnnAssign))
                          and n.value is not None and n.lineno < start.lineno),
                         key=lambda n: n.lineno)

    def latest(name: str, before: int):
        best = None
        for node in assignments:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.lineno < before and any(isinstance(t, ast.Name) and t.id == name for t in targets):
                best = node
        return best

    statements = [start]
    graph_names = set(_names_outside_hard(start.value))
    todo = [(n, start.lineno, 0) for n in graph_names]
    seen: set = set()
    while todo:
        name, before, depth = todo.pop()
        if (name, before) in seen or depth >= _HARD_HOPS:
            continue
        seen.add((name, before))
        made = latest(name, before)
        if made is None:
            continue
        statements.append(made)
        if _model_call(made.value):
            continue  # the model's input is data, not a prediction
        reads = _names_outside_hard(made.value)
        graph_names |= reads
        todo += [(n, made.lineno, depth + 1) for n in reads]
    for stmt in statements:
        for how, operand in _hard_ops(stmt.value):
            names = {n.id for n in walk(operand) if isinstance(n, ast.Name)}
            # the value the hard op reads must reach the loss another way too (with its graph)
            hit = sorted(n for n in names if n in _graph_reads(start.value, stmt, graph_names))
            if hit:
                return stmt.lineno, ast.unparse(stmt).strip(), how, hit[0]
    return None


def _graph_reads(loss: ast.AST, stmt: ast.stmt, names: set) -> set:
    """The names of ``names`` that the loss reads outside ``stmt``'s own target (the term the
    hard op makes does not count as another way to the loss)."""
    own = set()
    if isinstance(stmt, ast.Assign):
        own = {t.id for t in stmt.targets if isinstance(t, ast.Name)}
    elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        own = {stmt.target.id}
    return names - own


def _grad_off(node: ast.AST) -> bool:
    """A ``with`` item or decorator that turns gradients off: ``torch.no_grad()``,
    ``torch.inference_mode()``, ``torch.set_grad_enabled(False)``."""
    call = node if isinstance(node, ast.Call) else None
    name = _last_name(call.func if call is not None else node)
    if name in _NO_GRAD:
        return True
    return (name == "set_grad_enabled" and call is not None and bool(call.args)
            and isinstance(call.args[0], ast.Constant) and call.args[0].value is False)


def _under_no_grad(tree: ast.AST, statement: ast.stmt) -> bool:
    """Is ``statement`` inside a ``with torch.no_grad():`` block or a ``@torch.no_grad()``
    function?"""
    for node in walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)) and any(_grad_off(i.context_expr) for i in node.items) \
                and node.lineno < statement.lineno <= (node.end_lineno or node.lineno):
            return True
    scope = _enclosing_function(tree, statement.lineno)
    return any(_grad_off(d) for d in getattr(scope, "decorator_list", ()))


def _value_names(expr: ast.AST) -> list[str]:
    """The names ``expr`` reads its values from, not its indices (``boxes`` in
    ``boxes[pos]``)."""
    names, todo = [], [expr]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Subscript):
            todo.append(node.value)
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            names.append(node.id)
        todo.extend(ast.iter_child_nodes(node))
    return names


def graph_cut(path: str, line: int, fn: str, whole: bool = False) -> tuple[int, str, str] | None:
    """``(line, text, how)`` of the statement where the input of the loss called on ``line``
    (``fn``: the wrapped function's name) was cut from the graph: the call's own arguments
    (``F.mse_loss(pred.detach(), y)``), the assignment above it, in the same function, of a
    name they read (followed back four assignments deep: ``boxes = decode(deltas.detach(),
    anchors)``), a statement of a function of the file called there (``torch.from_numpy(...)``
    in a helper), or a statement under ``torch.no_grad()``. ``how``: ".detach()", ".data",
    "torch.no_grad()"... None when no cut is found or the source cannot be read. ``whole``: when
    no call on ``line`` is a loss's, the assignment's whole value is the input (a loss written
    by hand: ``g_adv = ((d_fake - 1) ** 2).mean()``)."""
    tree = _parse(path)
    if tree is None:
        return None
    statement = _statement_at(tree, line)
    if statement is None:
        statement = next((node for node in walk(tree) if isinstance(node, ast.stmt)
                          and not isinstance(node, (ast.For, ast.While, ast.If, ast.With, ast.FunctionDef,
                                                    ast.AsyncFunctionDef, ast.ClassDef, ast.Try))
                          and node.lineno <= line <= (node.end_lineno or node.lineno)), None)
    if statement is None:
        return None
    calls = [c for c in walk(statement) if isinstance(c, ast.Call)
             and c.lineno <= line <= (c.end_lineno or c.lineno)]
    chosen = [c for c in calls if _last_name(c.func) == fn] or \
        [c for c in calls if any(w in (_last_name(c.func) or "").lower() for w in _LOSS_WORDS)]
    if not chosen and whole and isinstance(statement, (ast.Assign, ast.AnnAssign)) \
            and statement.value is not None:
        args = [statement.value]
    elif len(chosen) != 1:
        return None  # not told apart: say nothing rather than blame another call
    else:
        call = chosen[0]
        # the input (the prediction): a target is data, often detached on purpose
        args = call.args[:1] or [k.value for k in call.keywords if k.arg in ("input", "log_probs")]
    return _cut_behind(path, tree, statement, args)


def operand_cut(path: str, line: int, operand: tuple) -> tuple[int, str, str] | None:
    """``(line, text, how)`` of the statement where one operand of the sum assigned on ``line``
    was cut from the graph: ``operand`` is its path through the sum's additions (0 the left
    side, 1 the right; negations, constant factors and a bare ``.mean()``/``.sum()`` passed
    through), the operand any expression (a helper's call, ``generator_loss(d_fake)``), followed
    back through the assignments of the names it reads as ``graph_cut`` does (``_, d_fake, fmaps
    = msd(y, y_hat.detach())``). None when the operand or a cut is not found."""
    tree = _parse(path)
    if tree is None:
        return None
    statement = _statement_at(tree, line)
    if not isinstance(statement, (ast.Assign, ast.AnnAssign)) or statement.value is None:
        return None
    expr = _sum_operand(statement.value, list(operand))
    if expr is None:
        return None
    return _cut_behind(path, tree, statement, [expr])


def sum_operand_text(path: str, line: int, operand: tuple) -> str | None:
    """The source text of ``operand_cut``'s operand of the sum assigned on ``line``, or None."""
    tree = _parse(path)
    statement = _statement_at(tree, line) if tree is not None else None
    if not isinstance(statement, (ast.Assign, ast.AnnAssign)) or statement.value is None:
        return None
    expr = _sum_operand(statement.value, list(operand))
    return ast.unparse(expr) if expr is not None else None


def _sum_operand(expr, steps: list):
    """The operand of the sum ``expr`` at the additions' path ``steps``, or None."""
    for _ in range(32):
        if isinstance(expr, ast.UnaryOp):
            expr = expr.operand
        elif isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult) \
                and isinstance(expr.left, ast.Constant):
            expr = expr.right
        elif isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Mult, ast.Div)) \
                and isinstance(expr.right, ast.Constant):
            expr = expr.left
        elif steps and isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
                and expr.func.attr in ("mean", "sum") and not expr.args:
            expr = expr.func.value  # ``(a + b).mean()``: the sum inside
        elif isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub)):
            if not steps:
                return None
            expr = expr.left if steps.pop(0) == 0 else expr.right
        elif isinstance(expr, ast.Call):
            if steps and isinstance(expr.func, ast.Name) and expr.func.id == "sum":
                return None  # ``sum(terms)``: which of them is not told by the text
            return expr  # a helper's call: the term is in the sum it computes
        else:
            return expr if not steps else None
    return None


def _cut_behind(path: str, tree: ast.AST, statement: ast.stmt, args: list) -> tuple[int, str, str] | None:
    """``graph_cut``'s search from the expressions ``args`` of ``statement``: the statement
    itself, then the assignments above it of the names they read."""
    defs = {d.name: d for d in walk(tree) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}
    scope = _enclosing_function(tree, statement.lineno)
    assignments = sorted((n for n in walk(scope) if isinstance(n, (ast.Assign, ast.AnnAssign))
                          and n.value is not None), key=lambda n: n.lineno)

    def judged(stmt: ast.stmt, exprs: list) -> tuple[int, str, str] | None:
        text = ast.unparse(stmt).strip()
        for expr in exprs:
            how = _cut_how(expr)
            if how is not None:
                return stmt.lineno, text, how
        if _under_no_grad(tree, stmt):
            return stmt.lineno, text, "torch.no_grad()"
        for expr in exprs:  # a helper of the file that cuts what it is given
            for call in walk(expr):
                helper = defs.get(_last_name(call.func)) if isinstance(call, ast.Call) else None
                if helper is None or helper is scope:
                    continue
                if any(_grad_off(d) for d in helper.decorator_list):
                    return helper.lineno, f"def {helper.name}(...)", "torch.no_grad()"
                for inner in walk(helper):
                    if isinstance(inner, (ast.Assign, ast.AnnAssign, ast.Return, ast.Expr)) \
                            and getattr(inner, "value", None) is not None:
                        how = _cut_how(inner.value)
                        if how is not None:
                            return inner.lineno, ast.unparse(inner).strip(), how
        return None

    found = judged(statement, args)
    if found is not None:
        return found
    bound = _comprehension_sources(statement)
    todo = [(source, statement.lineno) for a in args for name in _value_names(a)
            for source in bound.get(name, [name])]
    seen: set = set()
    for _ in range(16):
        if not todo:
            break
        name, before = todo.pop(0)
        if (name, before) in seen:
            continue
        seen.add((name, before))
        best = None
        for node in assignments:
            if node.lineno >= before:
                break
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(leaf, ast.Name) and leaf.id == name
                   for t in targets for leaf in walk(t)):
                best = node
        if best is None:
            found = _cut_by_callers(path, tree, scope, name, judged)
            if found is not None:
                return found
            continue
        found = judged(best, [best.value])
        if found is not None:
            return found
        todo.extend((name, best.lineno) for name in _value_names(best.value))
    return None


def _comprehension_sources(statement: ast.stmt) -> dict[str, list[str]]:
    """The names a comprehension of ``statement`` binds -> the names its values come from:
    ``a`` -> ``feats_sr`` in ``sum(F.mse_loss(a, b) for a, b in zip(feats_sr, feats_hr))``
    (``zip``'s arguments by position; ``enumerate``'s second target; else every name the
    iterable reads)."""
    out: dict[str, list[str]] = {}
    for node in walk(statement):
        if not isinstance(node, ast.comprehension):
            continue
        target, it = node.target, node.iter
        if isinstance(it, ast.Call) and _last_name(it.func) == "enumerate" and it.args \
                and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            target, it = target.elts[1], it.args[0]
        if isinstance(it, ast.Call) and _last_name(it.func) == "zip" and isinstance(target, ast.Tuple) \
                and len(target.elts) == len(it.args):
            pairs = list(zip(target.elts, it.args))
        else:
            pairs = [(target, it)]
        for bound, source in pairs:
            for leaf in walk(bound):
                if isinstance(leaf, ast.Name):
                    out[leaf.id] = _value_names(source)
    return out


def _cut_by_callers(path: str, tree: ast.AST, scope, name: str, judged) -> tuple[int, str, str] | None:
    """When ``name`` is a parameter of the helper ``scope`` (a loss function of the script's own,
    ``stft_loss(pred, target)``), the one call of that helper, in a statement whose value
    reaches a backward, that passes it a value cut from the graph (``stft_loss(pred.detach(),
    y)``): ``judged``'s ``(line, text, how)`` at that call's statement. None when no caller or
    several cut it."""
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    params = [a.arg for a in scope.args.posonlyargs + scope.args.args]
    if name not in params and name not in [a.arg for a in scope.args.kwonlyargs]:
        return None
    position = params.index(name) if name in params else None
    if position is not None and params and params[0] in ("self", "cls"):
        position -= 1  # a method: called on its object
    found = set()
    for stmt in walk(tree):
        if not isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) or stmt.value is None:
            continue
        for call in walk(stmt.value):
            if not isinstance(call, ast.Call) or _last_name(call.func) != scope.name:
                continue
            given = [k.value for k in call.keywords if k.arg == name]
            if not given and position is not None and 0 <= position < len(call.args) \
                    and not any(isinstance(a, ast.Starred) for a in call.args[:position + 1]):
                given = [call.args[position]]
            if not given or _cut_how(given[0]) is None:
                continue
            if result_reaches_backward(path, stmt.lineno) is None:
                continue  # a value for a log, not the loss
            cut = judged(stmt, given)
            if cut is not None:
                found.add(cut)
    return found.pop() if len(found) == 1 else None


def self_load_alias(path: str, line: int) -> tuple[str, str, int | None] | None:
    """For a ``target.load_state_dict(source.state_dict())`` call on ``line``: ``(target, source,
    the line of the last assignment ``target = source`` above it in the file, or None)``; None
    when the line holds no such call (the state comes from a variable, the names are the same)."""
    tree = _parse(path)
    if tree is None:
        return None
    found = None
    for node in walk(tree):
        if (isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno)
                and isinstance(node.func, ast.Attribute) and node.func.attr == "load_state_dict"
                and node.args and isinstance(node.args[0], ast.Call)
                and isinstance(node.args[0].func, ast.Attribute)
                and node.args[0].func.attr == "state_dict"):
            found = (ast.unparse(node.func.value), ast.unparse(node.args[0].func.value))
            break
    if found is None or found[0] == found[1]:
        return None
    target, source = found
    assigned = None
    for node in walk(tree):
        if (isinstance(node, ast.Assign) and node.lineno < line and len(node.targets) == 1
                and ast.unparse(node.targets[0]) == target and ast.unparse(node.value) == source
                and (assigned is None or node.lineno > assigned)):
            assigned = node.lineno
    return target, source, assigned


_WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "trange", "islice", "progress_bar", "track"})


def loop_names(path: str, line: int) -> tuple[str | None, str | None] | None:
    """``(the name the ``for`` loop on ``line`` iterates, the function holding it)``: the last
    part of a dotted name (``self.val_loader`` -> ``val_loader``), seen through ``enumerate``,
    ``tqdm`` and the like; each None when there is none (a call, the module level). None when
    the line holds no ``for`` loop or the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    loop = next((node for node in walk(tree)
                 if isinstance(node, (ast.For, ast.AsyncFor)) and node.lineno == line), None)
    if loop is None:
        return None
    iterable = loop.iter
    while (isinstance(iterable, ast.Call) and iterable.args
           and _last_name(iterable.func) in _WRAPPERS):
        iterable = iterable.args[0]
    name = None
    if isinstance(iterable, ast.Name):
        name = iterable.id
    elif isinstance(iterable, ast.Attribute):
        name = iterable.attr
    scope = _enclosing_function(tree, line)
    return name, getattr(scope, "name", None)


def output_read_line(path: str, line: int, time_dim: int, position: int, length: int,
                     through: frozenset = frozenset()) -> tuple[int, str] | None:
    """``(line, text)`` of the expression that reads position ``position`` of dimension
    ``time_dim`` of the output the call at ``line`` assigns (``out[:, 0]``, ``out[0]``,
    ``out[:, :1]``, ``out.select(1, 0)``, ``out.narrow(1, 0, 1)``), in the function that holds
    the call, at or after it; the first such read. A call named in ``through`` given that
    output as its first argument passes it on to the name it assigns (``padded, _ =
    pad_packed_sequence(out)``: ``padded`` is read too). None when the call's output is bound to
    no name or no read of that position is written with constants."""
    tree = _parse(path)
    if tree is None:
        return None
    scope = _enclosing_function(tree, line)
    name = None
    for node in walk(scope):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.lineno <= line \
                <= (node.end_lineno or node.lineno):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, (ast.Tuple, ast.List)) and target.elts:
                target = target.elts[0]
            if isinstance(target, (ast.Name, ast.Attribute)):
                name = ast.unparse(target)
            break
    names = {name} if name is not None else set()
    if name is not None and through:
        for node in sorted((n for n in walk(scope) if isinstance(n, ast.Assign)
                            and n.lineno > line), key=lambda n: n.lineno):
            value = node.value
            if isinstance(value, ast.Call) and value.args and _call_name(value) in through \
                    and ast.unparse(value.args[0]) in names:
                target = node.targets[0]
                if isinstance(target, (ast.Tuple, ast.List)) and target.elts:
                    target = target.elts[0]
                if isinstance(target, (ast.Name, ast.Attribute)):
                    names.add(ast.unparse(target))
    reads = []
    for node in walk(scope):
        if getattr(node, "lineno", 0) < line:
            continue
        if isinstance(node, ast.Subscript):
            base = node.value
            # ``self.rnn(x)[0][:, 0]``: the call's own output, indexed on its line
            if isinstance(base, ast.Subscript) and isinstance(base.value, ast.Call) \
                    and base.value.lineno == line and _int(base.slice) == 0:
                base_text = "<call>"
            else:
                base_text = ast.unparse(base)
            if base_text != "<call>" and base_text not in names:
                continue
            index = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if len(index) > time_dim and _reads_position(index[time_dim], position, length):
                reads.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("select", "narrow") \
                and ast.unparse(node.func.value) in names and len(node.args) >= 2:
            dim, start = _int(node.args[0]), _int(node.args[1])
            if dim in (time_dim, time_dim - 3) and start is not None \
                    and start % length == position:
                reads.append((node.lineno, ast.unparse(node)))
    return min(reads) if reads else None


def _int(node: ast.AST) -> int | None:
    """The int a constant expression (``0``, ``-1``) writes, else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int(node.operand)
        return None if inner is None else -inner
    return None


def _reads_position(index: ast.AST, position: int, length: int) -> bool:
    """Whether an index along time reads ``position`` (and nothing after it): the position
    itself (or it counted from the end), or a slice of constants that ends right after it."""
    at = _int(index)
    if at is not None:
        return at % length == position
    if isinstance(index, ast.Slice) and index.step is None and index.upper is not None:
        upper = _int(index.upper)
        return upper is not None and (upper - 1) % length == position
    return False


# calls that only read a module passed to them (a copy handed to one of these is not written)
_READERS = frozenset({"zip", "list", "tuple", "enumerate", "print", "len", "isinstance", "sum",
                      "map", "filter", "sorted", "iter", "next", "id", "type", "str", "repr",
                      "deepcopy", "save", "chain", "getattr", "hasattr", "count_parameters"})
# methods of a module that write none of its parameters' values
_READING_METHODS = frozenset({"parameters", "named_parameters", "buffers", "named_buffers",
                              "modules", "named_modules", "children", "named_children",
                              "state_dict", "eval", "train", "requires_grad_", "to", "cpu", "cuda",
                              "float", "double", "half", "bfloat16", "forward", "zero_grad",
                              "register_forward_hook", "numel", "size", "extra_repr", "__call__"})
# an update's hyper-parameter by its name (a decay or sync period set and never read)
_FOLLOW_SETTING = ("ema", "decay", "momentum", "tau", "polyak", "sync", "target_update",
                   "update_target", "update_every", "update_freq", "update_interval")
# a method whose class derives from something else than a module or object may be a framework's
# hook (Lightning's on_train_batch_end), called without its name in the script
_PLAIN_BASES = frozenset({"object", "Module"})


def _names_in(node: ast.AST) -> set[str]:
    """Names and attribute names in an expression, but those only called (``teacher(x)``: a
    forward's result is not the module)."""
    called = {id(n.func) for n in walk(node) if isinstance(n, ast.Call)}
    out = set()
    for n in walk(node):
        if id(n) in called:
            continue
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def _referenced(tree: ast.AST) -> dict[str, int]:
    """How often each name is read (a Name loaded, an attribute read)."""
    counts: dict[str, int] = {}
    for n in walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            counts[n.id] = counts.get(n.id, 0) + 1
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
            counts[n.attr] = counts.get(n.attr, 0) + 1
    return counts


def _functions(tree: ast.AST) -> list[tuple[ast.AST, ast.AST | None]]:
    """Every function definition with the class holding it (None for a plain function)."""
    out = []
    for node in walk(tree):
        if isinstance(node, ast.ClassDef):
            out += [(f, node) for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    methods = {id(f) for f, _ in out}
    out += [(f, None) for f in walk(tree)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and id(f) not in methods]
    return out


def _uncalled(tree: ast.AST, func: ast.AST, owner: ast.AST | None, refs: dict[str, int]) -> bool:
    """A function nothing in the file names (so nothing calls it), that no framework calls by
    its name either: not a method of a class with other bases, not decorated but by
    ``torch.no_grad()``, ``staticmethod`` or ``classmethod``."""
    name = func.name
    if name.startswith("__") or refs.get(name, 0):
        return False
    for deco in func.decorator_list:
        text = ast.unparse(deco)
        if not any(ok in text for ok in ("no_grad", "staticmethod", "classmethod", "inference_mode")):
            return False
    if owner is not None:
        bases = {(b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "?")) for b in owner.bases}
        if bases - _PLAIN_BASES:
            return False
    return True


def _statement_writes(tree: ast.AST, path: str, names: set[str], params: set[str]) -> list[int]:
    """Lines of statements that write, in place, a tensor reached from ``names`` (a root, a part
    of the chain, or what a loop binds the root to), or from ``params`` (a function's own
    parameters)."""
    lines = []
    reach = names | params
    for line, root, text, bound in param_writes(path):
        chain = set(_chain_of(text))
        bound_names = set()
        if bound:
            try:
                bound_names = _names_in(ast.parse(bound, mode="eval"))
            except SyntaxError:
                pass
        if root in reach or chain & names or bound_names & reach:
            lines.append(line)
    return lines


def _attribute_chain(node: ast.AST) -> list[str]:
    """``self.teacher.head`` -> ["self", "teacher", "head"]; empty through a call (the result of
    ``teacher(x)`` is no module)."""
    parts = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return []
    parts.append(node.id)
    return parts[::-1]


def _chain_of(text: str) -> list[str]:
    try:
        node = ast.parse(text)
    except SyntaxError:
        return []
    for n in walk(node):
        if isinstance(n, ast.Call):
            target = _written(n)
            if target is not None:
                return _chain(target)
        if isinstance(n, ast.Assign) and len(n.targets) == 1:
            return _chain(n.targets[0])
    return []


def copy_writers(path: str, name: str) -> dict | None:
    """What the file says about the module a copy is held in (``name``: its variable or
    attribute, ``target_net``, ``teacher``): ``made`` (line, text) of its first assignment;
    ``writers``, lines of code that could change its parameters' values (an in-place write
    reaching it or a name bound from it, a method call on it that is not a read, the module
    handed to a function that writes its argument or to one the file does not define);
    ``setup``, those of ``writers`` that run once while things are built (module level outside
    a loop, an ``__init__``); ``uncalled``, (line, function name) of functions that write parameters by hand, reaching
    the copy or their own arguments, and that nothing in the file calls; ``unused``, (line,
    setting) of an update's setting (a decay, a sync period) assigned a number and never read.
    The writes inside uncalled functions are not among ``writers``. None when the file cannot
    be read."""
    tree = _parse(path)
    if tree is None:
        return None
    names = {name}
    # names bound from the copy: ``params = list(teacher.parameters())``, loop variables
    for _ in range(3):
        for node in walk(tree):
            if isinstance(node, ast.Assign) and _names_in(node.value) & names:
                for t in node.targets:
                    names |= {n.id for n in walk(t) if isinstance(n, ast.Name)}
            elif isinstance(node, (ast.For, ast.comprehension)) and _names_in(node.iter) & names:
                bound: dict[str, str] = {}
                _bindings(node.target, node.iter, bound)
                for var, text in bound.items():
                    try:
                        if _names_in(ast.parse(text, mode="eval")) & names:
                            names.add(var)
                    except SyntaxError:
                        pass
    refs = _referenced(tree)
    functions = _functions(tree)
    dead: list[tuple[int, int]] = []
    uncalled = []
    for func, owner in functions:
        if not _uncalled(tree, func, owner, refs):
            continue
        first, last = func.lineno, func.end_lineno or func.lineno
        dead.append((first, last))
        args = {a.arg for a in func.args.args + func.args.kwonlyargs} - {"self", "cls"}
        inside = [ln for ln in _statement_writes(tree, path, names, args) if first <= ln <= last]
        if inside:
            uncalled.append((func.lineno, func.name))

    def live(line: int) -> bool:
        return not any(a <= line <= b for a, b in dead)

    writers = [ln for ln in _statement_writes(tree, path, names, set()) if live(ln)]
    by_name = {f.name: f for f, _ in functions}
    made = None
    for node in walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and live(node.lineno):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                last_name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
                if last_name == name and (made is None or node.lineno < made[0]):
                    made = (node.lineno, ast.unparse(node).strip())
        if not isinstance(node, ast.Call) or not live(node.lineno):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr not in _READING_METHODS \
                and name in _attribute_chain(func.value) and func.attr not in _WRITES:
            writers.append(node.lineno)  # ema.update_parameters(model), target.apply(init)
        args = list(node.args) + [k.value for k in node.keywords]
        for position, arg in enumerate(args):
            if not (_names_in(arg) & {name}) or isinstance(arg, ast.Call):
                continue
            callee = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if callee in _READERS:
                continue
            target = by_name.get(callee or "")
            if target is None:
                writers.append(node.lineno)  # a function of another file: it may write it
                continue
            params = [a.arg for a in target.args.args if a.arg not in ("self", "cls")]
            if position < len(node.args) and position < len(params):
                mine = {params[position]}
            else:
                mine = set(params)
            first, last = target.lineno, target.end_lineno or target.lineno
            if any(first <= ln <= last for ln in _statement_writes(tree, path, set(), mine)):
                writers.append(node.lineno)
    unused = []
    for node in walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, (int, float)) and not isinstance(node.value.value, bool):
            t = node.targets[0]
            setting = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
            if setting and any(k in setting.lower() for k in _FOLLOW_SETTING) and not refs.get(setting):
                unused.append((node.lineno, setting))
    return {"made": made, "writers": sorted(set(writers)), "uncalled": uncalled, "unused": unused,
            "setup": sorted(ln for ln in set(writers) if _set_up(tree, ln))}


def _set_up(tree: ast.AST, line: int) -> bool:
    """A statement that runs once while things are built: at module level outside any loop,
    or in an ``__init__``."""
    scope = _enclosing_function(tree, line)
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return scope.name == "__init__"
    for node in walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) \
                and node.lineno <= line <= (node.end_lineno or node.lineno):
            return False
    return True


# -- numbers that round ------------------------------------------------------------------
# A setting computed with a rounding operation (integer division, int(), round(), floor())
# rounds a small ratio down to 0: an lr `base_lr * (bs // 256)`, a loss weight
# `min(1, step // warmup)`. One home for what counts as rounding.
ROUNDING_CALLS = frozenset({"int", "round", "floor", "trunc"})
ROUNDS = re.compile(r"//|\b(" + "|".join(sorted(ROUNDING_CALLS)) + r")\s*\(")


def rounding_behind(path: str, line: int) -> tuple[int, str] | None:
    """The statement that rounds an lr written at ``line``: that line when it rounds itself
    (``g["lr"] = base * (step // warmup)``), else the first rounding line in the body of a
    function of the script the line calls (``g["lr"] = lr_at(step)``, ``lr_at`` returning
    ``base * (step // warmup)``); ``(line, text)`` or None."""
    tree = _parse(path)
    if tree is None:
        return None
    lines = linecache.getlines(path)

    def _line(number: int) -> str:
        return lines[number - 1] if 0 < number <= len(lines) else ""

    text = _line(line)
    if ROUNDS.search(text.split("#")[0]):
        return line, text.split("#")[0].strip()
    called = {node.func.id for node in walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.lineno <= line <= (node.end_lineno or node.lineno)}
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in called:
            for number in range(node.body[0].lineno, (node.end_lineno or node.lineno) + 1):
                code = _line(number).split("#")[0]
                if ROUNDS.search(code):
                    return number, code.strip()
    return None


def _call_name(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def rounded_value(expr: ast.AST) -> bool:
    """Whether a number's expression takes its value through a rounding operation: it is one
    (``a // b``, ``int(x)``, ``round(x)``, ``floor(x)``) or an arithmetic of, or ``min``/``max``
    over, such values. A rounding inside another call's arguments (``x.view(n // 2)``) is not
    the value's, and a remainder (``(step // k) % 2``, a cycle) is left out: it comes back."""
    if isinstance(expr, ast.BinOp):
        if isinstance(expr.op, ast.Mod):
            return False
        if isinstance(expr.op, ast.FloorDiv):
            return not any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
                           for n in walk(expr))
        return rounded_value(expr.left) or rounded_value(expr.right)
    if isinstance(expr, ast.UnaryOp):
        return rounded_value(expr.operand)
    name = _call_name(expr)
    if name in ROUNDING_CALLS and expr.args:
        return not any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
                       for n in walk(expr))
    if name in ("min", "max"):
        return any(rounded_value(arg) for arg in expr.args)
    return False


def without_rounding(expr: ast.AST) -> str:
    """The expression with its rounding taken out: ``//`` made ``/``, ``int(x)``/``round(x)``/
    ``floor(x)`` made ``x`` (what a fix shows)."""
    class _Unround(ast.NodeTransformer):
        def visit_BinOp(self, node):
            self.generic_visit(node)
            if isinstance(node.op, ast.FloorDiv):
                node.op = ast.Div()
            return node

        def visit_Call(self, node):
            self.generic_visit(node)
            if _call_name(node) in ROUNDING_CALLS and len(node.args) == 1 and not node.keywords:
                return node.args[0]
            return node

    return ast.unparse(_Unround().visit(ast.parse(ast.unparse(expr), mode="eval")).body)
_PRODUCT_CALLS = frozenset({"matmul", "bmm", "einsum", "mm"})
_FLIPPED = {"up": "down", "down": "up", "named": "named"}


def _exponent(node: ast.AST) -> float | None:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _scale_direction(expr: ast.AST) -> str | None:
    """How ``expr`` reads as a factor on attention scores: ``"up"`` for a square root (``sqrt(d)``,
    ``d ** 0.5``), ``"down"`` for its inverse (``d ** -0.5``, ``rsqrt(d)``, ``1 / sqrt(d)``),
    ``"named"`` for a name that says it is a scale or a temperature; None for anything else."""
    if isinstance(expr, ast.Call):
        func = expr.func
        name = func.attr if isinstance(func, ast.Attribute) else \
            func.id if isinstance(func, ast.Name) else None
        return {"sqrt": "up", "rsqrt": "down"}.get(name or "")
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Pow):
        power = _exponent(expr.right)
        if power is None or power == int(power):
            return None
        return "up" if power > 0 else "down"
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div) and _exponent(expr.left) == 1:
        inner = _scale_direction(expr.right)
        return _FLIPPED.get(inner) if inner is not None else None
    name = expr.attr if isinstance(expr, ast.Attribute) else \
        expr.id if isinstance(expr, ast.Name) else None
    if name and any(word in name.lower() for word in ("scale", "temp", "sqrt", "norm_fact")):
        return "named"
    return None


def _has_product(expr: ast.AST) -> bool:
    for node in walk(expr):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            return True
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else \
                func.id if isinstance(func, ast.Name) else None
            if name in _PRODUCT_CALLS:
                return True
    return False


@_once_per_file
def score_scalings(path: str) -> list[tuple[int, str, str, bool]]:
    """``(line, text, direction, with_product)`` of every multiplication or division in the file
    by what reads as a scale (``_scale_direction``): ``direction`` says which way it moves the
    value it scales (``"up"``: ``* sqrt(d)``, ``/ d ** -0.5``; ``"down"``: ``/ sqrt(d)``,
    ``* d ** -0.5``; ``"named"``: ``* self.scale``), ``with_product``: the scaled side holds a
    matrix product (``q @ k.mT * s``). In line order, one per line; [] when it cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    found: dict = {}
    for node in walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
            pairs = [(node.right, node.left)]
            if isinstance(node.op, ast.Mult):
                pairs.append((node.left, node.right))
            divided = isinstance(node.op, ast.Div)
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Mult, ast.Div)):
            pairs = [(node.value, node.target)]
            divided = isinstance(node.op, ast.Div)
        else:
            continue
        for scale, scaled in pairs:
            direction = _scale_direction(scale)
            if direction is None:
                continue
            if divided:
                direction = _FLIPPED[direction]
            line = node.lineno
            text = ast.unparse(node)
            if line not in found or _has_product(scaled) and not found[line][3]:
                found[line] = (line, text, direction, _has_product(scaled))
            break
    return [found[line] for line in sorted(found)]
def _reads_as_temperature(expr: ast.AST) -> float | bool:
    """A factor that reads as a contrastive temperature: its value for a number in (0, 1)
    (``0.07``), True for a name that says so (``tau``, ``self.temperature``, ``TEMP``), False
    for anything else."""
    value = _exponent(expr)
    if value is not None:
        return value if 0.0 < value < 1.0 else False
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant):
        name = expr.slice.value if isinstance(expr.slice.value, str) else None  # cfg["tau"]
    else:
        name = expr.attr if isinstance(expr, ast.Attribute) else \
            expr.id if isinstance(expr, ast.Name) else None
    return bool(name) and any(word in name.lower() for word in ("temp", "tau", "scale"))


@_once_per_file
def temperature_products(path: str) -> list[tuple[int, str, str, bool, float | None]]:
    """``(line, text, divided, with_product, value)`` of every multiplication in the file by
    what reads as a temperature (``_reads_as_temperature``): ``divided`` is the same statement
    dividing by it instead (``z1 @ z2.T / tau`` for ``z1 @ z2.T * tau``), ``with_product``
    whether the other side holds a matrix product, ``value`` the number written (None for a
    name). In line order, one per line; [] when the file cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    assigned = {id(node.value): node.targets for node in walk(tree)
                if isinstance(node, ast.Assign)}
    found: dict = {}
    for node in walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            pairs = [(node.right, node.left), (node.left, node.right)]
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Mult):
            pairs = [(node.value, node.target)]
        else:
            continue
        for scale, scaled in pairs:
            read = _reads_as_temperature(scale)
            if read is False:
                continue
            if isinstance(node, ast.AugAssign):
                divided = ast.unparse(ast.AugAssign(target=node.target, op=ast.Div(), value=scale))
            else:
                divided = ast.unparse(ast.BinOp(left=scaled, op=ast.Div(), right=scale))
                if id(node) in assigned:  # the whole statement: `logits = z1 @ z2.T / tau`
                    divided = " = ".join([*(ast.unparse(t) for t in assigned[id(node)]), divided])
            line = node.lineno
            entry = (line, ast.unparse(node), divided, _has_product(scaled),
                     None if read is True else float(read))
            if line not in found or entry[3] and not found[line][3]:
                found[line] = entry
            break
    return [found[line] for line in sorted(found)]


def _index_names(node: ast.AST) -> list[str]:
    """The names an index expression reads, dotted ones whole (``data.test_mask``, ``idx``)."""
    out = []
    for sub in walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, (ast.Name, ast.Attribute)):
            out.append(ast.unparse(sub))
        elif isinstance(sub, ast.Name):
            out.append(sub.id)
    return out


def _row_index(node: ast.AST) -> bool:
    """Whether a subscript's index selects rows by a tensor (a mask or an index: a name, an
    attribute, a call or an operation on them), not by a slice, a constant or several axes."""
    if isinstance(node, (ast.Slice, ast.Constant, ast.Tuple, ast.List, ast.Starred)):
        return False
    if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
        return False  # y[-1]
    return any(isinstance(sub, (ast.Name, ast.Attribute)) for sub in walk(node))


# methods that keep a tensor's rows in their order (a cast, a reshape of each row)
_SAME_ROWS = frozenset({"float", "long", "double", "half", "int", "bool", "to", "type", "type_as",
                        "view", "reshape", "squeeze", "unsqueeze", "flatten", "view_as",
                        "reshape_as", "detach", "clone", "contiguous", "cpu", "cuda"})


def _binds(scope: ast.AST, name: str) -> bool:
    """Whether a function binds ``name`` itself (a parameter or an assignment, not ``global``);
    False for the module."""
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return False
    a = scope.args
    if any(arg.arg == name for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
           if arg is not None):
        return True
    for node in walk(scope):
        if isinstance(node, ast.Global) and name in node.names:
            return False
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            return True
    return False


def loss_row_selections(path: str, line: int) -> dict | None:
    """What the loss call on ``line`` is given and where the script selects rows of its target.

    ``{"target": the target argument's name (a name or a dotted name, seen through casts and
    reshapes: ``y`` of ``y.float()``), "written": the argument's text, "prediction": the first
    argument's text, "call": the called function's text ("" for an expression), "more": whether
    it is given other arguments, "selections": [(line, the subscript's text, the index's text, [names the
    index reads], under no_grad (a ``with`` block or a decorator), the function holding it)],
    "names": [every name and dotted name the file binds or reads]}``: the selections are the
    subscripts of the target's text by a tensor index (``y[test_mask]``, ``data.y[idx_val]``)
    read anywhere in the file but on the loss call's own line, where that name means the same
    binding (a function's parameter or local only in that function; a module's name only where
    no function binds its own). None when the line holds no call
    of two arguments whose target is a plain (dotted) name, or the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    calls = [node for node in walk(tree)
             if isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno)]
    found = []
    for call in calls:
        prediction = call.args[0] if call.args else next(
            (k.value for k in call.keywords if k.arg == "input"), None)
        written = call.args[1] if len(call.args) > 1 else next(
            (k.value for k in call.keywords if k.arg in ("target", "targets")), None)
        target = written
        while isinstance(target, ast.Call) and isinstance(target.func, ast.Attribute) \
                and target.func.attr in _SAME_ROWS:
            target = target.func.value  # y.float(), Y.view(-1, 1): the same rows
        if prediction is None or not isinstance(target, (ast.Name, ast.Attribute)) \
                or isinstance(prediction, ast.Subscript):
            continue
        if isinstance(target, ast.Attribute) and not isinstance(target.value, (ast.Name, ast.Attribute)):
            continue
        found.append((call, prediction, target, written))
    if len(found) != 1:
        return None  # no loss call, or several: which one ran is not known
    call, prediction, target, written = found[0]
    text = ast.unparse(target)
    first, last = call.lineno, call.end_lineno or call.lineno
    selections, names = [], set()
    for node in walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Name, ast.Attribute)):
            names.add(ast.unparse(node))
        if not (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                and isinstance(node.value, (ast.Name, ast.Attribute))
                and ast.unparse(node.value) == text and _row_index(node.slice)):
            continue
        if first <= node.lineno <= last:
            continue
        scope = _enclosing_function(tree, node.lineno)
        selections.append((node.lineno, ast.unparse(node), ast.unparse(node.slice),
                           _index_names(node.slice), no_grad_block(path, node.lineno) is not None,
                           getattr(scope, "name", None)))
    callee = ast.unparse(call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else ""
    # a name bound in a function (a parameter, an assignment) is another tensor in every other
    # function: ``def fit(model, X, y)`` trains on whatever it is given, not the module's ``y``
    root = target
    while isinstance(root, ast.Attribute):
        root = root.value
    home = _enclosing_function(tree, line)
    local = home is not tree and _binds(home, root.id)
    selections = [s for s in selections
                  if ((_enclosing_function(tree, s[0]) is home) if local
                      else not _binds(_enclosing_function(tree, s[0]), root.id))]
    return {"target": text, "written": ast.unparse(written),
            "prediction": ast.unparse(prediction), "call": callee,
            "more": len(call.args) > 2 or bool(call.keywords),
            "selections": sorted(selections), "names": sorted(names)}


# calls that make a tensor of values the script chose (a GAN's real labels, InfoNCE's positives
# at index 0), and calls that keep the values of what they are called on
_MAKERS = frozenset({"ones", "zeros", "full", "ones_like", "zeros_like", "full_like", "arange", "empty",
                     "empty_like", "tensor", "as_tensor", "eye", "new_ones", "new_zeros", "new_full",
                     "new_tensor", "new_empty", "fill_", "zero_", "linspace"})
_KEEPS_VALUES = _SAME_ROWS | {"expand", "expand_as", "repeat", "repeat_interleave"}


def _assigned_values(scope: ast.AST, text: str) -> list[tuple[int, ast.AST]]:
    """``(line, value)`` of each plain assignment of ``text`` (a name or dotted name) in
    ``scope``, an element of a tuple assigned from a tuple of as many values included."""
    found = []
    for node in walk(scope):
        if isinstance(node, ast.Assign):
            if any(ast.unparse(t) == text for t in node.targets
                   if isinstance(t, (ast.Name, ast.Attribute))):
                found.append((node.lineno, node.value))
            for t in node.targets:  # ``real_t, fake_t = torch.ones(n, 1), torch.zeros(n, 1)``
                if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                        and len(t.elts) == len(node.value.elts):
                    found.extend((node.lineno, v) for e, v in zip(t.elts, node.value.elts)
                                 if isinstance(e, (ast.Name, ast.Attribute)) and ast.unparse(e) == text)
        elif isinstance(node, ast.AnnAssign) and node.value is not None \
                and isinstance(node.target, (ast.Name, ast.Attribute)) and ast.unparse(node.target) == text:
            found.append((node.lineno, node.value))
    return found


def _called_defs(tree: ast.AST, func: ast.AST) -> list[ast.AST]:
    """The ``def``s of the file a call of ``func`` runs: the functions of that name
    (``info_nce(...)``, ``self.loss(...)``), else, for a name assigned an instance of a class of
    the file (``model = MoCo()``), that class's ``forward``."""
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name is None:
        return []
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    defs = [d for d in walk(tree) if isinstance(d, kinds) and d.name == name]
    if defs:
        return defs
    text = ast.unparse(func)
    classes = {c.name: c for c in walk(tree) if isinstance(c, ast.ClassDef)}
    for _, value in _assigned_values(tree, text):
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in classes:
            defs += [d for d in classes[value.func.id].body if isinstance(d, kinds) and d.name == "forward"]
    return defs


def _returned_values(tree: ast.AST, scope: ast.AST, text: str) -> list[tuple[int, ast.AST]]:
    """``(line, value)`` of what a function of the file returns into the name ``text`` where
    ``scope`` assigns it a call's result (``logits, labels = info_nce(feats)``, ``output, target
    = model(q, k)``): the value at the same place of each ``return`` of the function of that name
    (of each ``forward``, for a call of a module), in the function's own scope. One level."""
    found = []
    for node in walk(scope):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        for t in node.targets:
            if isinstance(t, ast.Name) and t.id == text:
                index, size = None, None
            elif isinstance(t, ast.Tuple) and any(isinstance(e, ast.Name) and e.id == text for e in t.elts):
                index = next(i for i, e in enumerate(t.elts) if isinstance(e, ast.Name) and e.id == text)
                size = len(t.elts)
            else:
                continue
            for d in _called_defs(tree, node.value.func):
                for ret in walk(d):
                    if not isinstance(ret, ast.Return) or ret.value is None:
                        continue
                    if size is None:
                        if not isinstance(ret.value, ast.Tuple):
                            found.append((ret.lineno, ret.value))
                    elif isinstance(ret.value, ast.Tuple) and len(ret.value.elts) == size:
                        found.append((ret.lineno, ret.value.elts[index]))
    return found


def _made_by_script(tree: ast.AST, expr: ast.AST, line: int, depth: int = 0) -> bool:
    """Whether ``expr`` (at ``line``) is a tensor the script makes from values of its own
    (``torch.ones(b, 1)``, ``torch.zeros(n, dtype=torch.long)``, a name assigned one, cast or
    reshaped), not one read from data."""
    if depth > 6:
        return False
    if isinstance(expr, ast.Call):
        name = expr.func.attr if isinstance(expr.func, ast.Attribute) else \
            expr.func.id if isinstance(expr.func, ast.Name) else None
        if name in _MAKERS:
            return True
        if isinstance(expr.func, ast.Attribute) and name in _KEEPS_VALUES:
            return _made_by_script(tree, expr.func.value, line, depth + 1)
        if name == "Variable" and expr.args:  # torch.autograd.Variable(t): t itself since torch 0.4
            return _made_by_script(tree, expr.args[0], line, depth + 1)
        return False
    if isinstance(expr, (ast.Name, ast.Attribute)):
        text = ast.unparse(expr)
        scope = _enclosing_function(tree, line)
        values = _assigned_values(scope, text) if isinstance(expr, ast.Name) else _assigned_values(tree, text)
        if not values and scope is not tree and isinstance(expr, ast.Name):
            values = _assigned_values(tree, text)
        if isinstance(expr, ast.Name):
            values = values + _returned_values(tree, scope, text)
        return any(_made_by_script(tree, value, at, depth + 1) for at, value in values)
    if isinstance(expr, ast.Subscript):
        return _made_by_script(tree, expr.value, line, depth + 1)
    if isinstance(expr, ast.BinOp):
        return _made_by_script(tree, expr.left, line, depth + 1) or \
            _made_by_script(tree, expr.right, line, depth + 1)
    if isinstance(expr, ast.UnaryOp):
        return _made_by_script(tree, expr.operand, line, depth + 1)
    if isinstance(expr, ast.IfExp):
        return _made_by_script(tree, expr.body, line, depth + 1) or \
            _made_by_script(tree, expr.orelse, line, depth + 1)
    return False


def _target_root(path: str, line: int) -> ast.AST | None:
    """The name the first target of the loss call on ``line`` reads, seen through reshapes,
    casts and subscripts (``labels[:, 1:].reshape(-1)``: ``labels``), or None."""
    origin = target_origin(path, line)
    if origin is None:
        return None
    try:
        root = ast.parse(origin["target"], mode="eval").body
    except SyntaxError:
        return None
    while True:
        if isinstance(root, ast.Call) and isinstance(root.func, ast.Attribute) and root.func.attr in _KEEPS_VALUES:
            root = root.func.value
        elif isinstance(root, ast.Subscript):
            root = root.value
        else:
            break
    return root if isinstance(root, ast.Name) else None


def target_assignment(path: str, line: int) -> tuple[int, str] | None:
    """``(line, text)`` of the latest plain assignment, in the innermost loop that holds the loss
    call on ``line`` and before it, of the name its first target reads (``labels =
    ids.masked_fill(mask, -100)``); None when there is none. A loss in a function with no loop
    around it (a framework's per-batch hook: a Trainer's ``compute_loss``, Lightning's
    ``training_step``) reads the function's body above the call."""
    tree = _parse(path)
    root = _target_root(path, line)
    loop = innermost_loop(path, line)
    if tree is None or root is None:
        return None
    scope = _enclosing_function(tree, line)
    if loop is None and scope is not tree:
        loop = (scope.lineno, scope.end_lineno or line)
    if loop is None:
        return None
    values = [(at, value) for at, value in _assigned_values(scope, root.id)
              if loop[0] <= at < line]
    if not values:
        return None
    at, value = max(values, key=lambda v: v[0])
    return at, f"{root.id} = {ast.unparse(value)}"


def ignore_canvas(path: str, line: int, ignore_index: int) -> bool:
    """Whether the first target of the loss call on ``line`` is named by a name assigned (in
    the call's function or anywhere in the file) a tensor filled with ``ignore_index``
    (``torch.full(shape, -100)``, ``torch.full_like(ids, -100)``, ``ids.new_full(shape,
    -100)``): a canvas of ignored positions the script writes the labels into, not a constant
    it trains on."""
    tree = _parse(path)
    root = _target_root(path, line)
    if tree is None or root is None:
        return False
    values = _assigned_values(_enclosing_function(tree, line), root.id) + _assigned_values(tree, root.id)
    for _, value in values:
        name = _call_name(value)
        fill = None
        if name in ("full", "full_like", "new_full") and len(value.args) >= 2:
            fill = value.args[1]
        elif name in ("full", "new_full"):
            fill = next((k.value for k in value.keywords if k.arg == "fill_value"), None)
        if fill is not None and _int(fill) == ignore_index:
            return True
    return False


def _converts(value: ast.AST) -> bool:
    """Whether an assigned value computes new label values from others (a cast, a comparison,
    arithmetic), not one that only names or selects them."""
    if isinstance(value, (ast.Compare, ast.BinOp, ast.UnaryOp)):
        return True
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
        return value.func.attr in ("long", "int", "bool", "round", "floor", "ceil", "trunc", "to", "type") \
            or _converts(value.func.value)
    return False


def function_calls_any(path: str, line: int, names: frozenset) -> bool:
    """Does the function holding ``line`` call a function or method whose own name is in
    ``names`` (``F.relu(x)``, ``x.tanh()``, ``torch.sigmoid(h)``)? False when it cannot be read
    or the line is in no function."""
    tree = _parse(path)
    if tree is None:
        return False
    scope = _enclosing_function(tree, line)
    return scope is not tree and _calls_named(scope, names)


_AS_TENSOR = frozenset({"as_tensor", "tensor", "from_numpy", "asarray", "array", "DoubleTensor",
                        "FloatTensor"})


def squeeze_assignment(path: str, line: int, position: int) -> tuple[int, str, str] | None:
    """``(line, text, dim)`` of the latest assignment, before ``line`` in its function, of the
    name given as argument ``position`` of the call on ``line`` (``F.mse_loss(pred, y)``),
    when that assignment's value ends in a ``.squeeze(dim)`` with an explicit dim (``pred =
    model(x).squeeze(0)``); None otherwise or when the file cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    calls = [node for node in walk(tree)
             if isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno)
             and len(node.args) > position and isinstance(node.args[position], ast.Name)]
    if len(calls) != 1:
        return None
    name = calls[0].args[position].id
    values = [(at, value) for at, value in _assigned_values(_enclosing_function(tree, line), name)
              if at < line]
    if not values:
        return None
    at, value = max(values, key=lambda v: v[0])
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and value.func.attr == "squeeze" and len(value.args) == 1 and not value.keywords:
        return at, f"{name} = {ast.unparse(value)}", ast.unparse(value.args[0])
    return None


def keyword_argument(path: str, callee: str, keywords: tuple) -> tuple[int, str] | None:
    """``(line, text)`` of the first of ``keywords`` given to the only call in the file to
    ``callee`` (its own name: ``TrainingArguments(..., warmup_steps=400)``), ``text`` being
    ``keyword=value``; None when the file holds no such call, several, or none of them gives
    one of ``keywords``."""
    tree = _parse(path)
    if tree is None:
        return None
    calls = [node for node in walk(tree) if isinstance(node, ast.Call) and _call_name(node) == callee]
    if len(calls) != 1:
        return None
    for keyword in keywords:
        for k in calls[0].keywords:
            if k.arg == keyword:
                return k.value.lineno, f"{keyword}={ast.unparse(k.value)}"
    return None


def argument_origin(path: str, line: int, callee: str, keyword: str) -> tuple[int, str] | None:
    """``(line, text)`` of the assignment that computes the first argument (or ``keyword=``)
    of the call to ``callee`` (its own name) on ``line``: the latest assignment of that name before the call in its function,
    followed through a plain selection (``w = class_w[labels]``) to the line that computes the
    selected values (``class_w = counts / counts.sum()``) when that line does arithmetic.
    None when the argument is no name assigned there, or the file cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    calls = [node for node in walk(tree)
             if isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno)
             and _call_name(node) == callee]
    for call in sorted(calls, key=lambda c: -c.lineno):
        written = call.args[0] if call.args else next(
            (k.value for k in call.keywords if k.arg == keyword), None)
        if written is not None:
            break
    else:
        return None
    scope = _enclosing_function(tree, line)

    def latest(name: str, before: int):
        values = [(at, value) for at, value in _assigned_values(scope, name) if at < before]
        return max(values, key=lambda v: v[0]) if values else None

    root = written
    while isinstance(root, ast.Call):
        name = _call_name(root)
        if name in _KEEPS_VALUES:
            root = root.func.value
        elif name in _AS_TENSOR and len(root.args) == 1:  # torch.as_tensor(w), np.asarray(w)
            root = root.args[0]
        else:
            break
    if not isinstance(root, ast.Name):
        return None
    found = latest(root.id, line)
    if found is None:
        return None
    at, value = found
    if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name):
        selected = latest(value.value.id, at)
        if selected is not None and _converts(selected[1]):
            return selected[0], f"{value.value.id} = {ast.unparse(selected[1])}"
    return at, f"{root.id} = {ast.unparse(value)}"


def target_origin(path: str, line: int) -> dict | None:
    """Where the targets of the loss call(s) on ``line`` come from.

    ``{"made": whether one of them is a tensor the script makes from values of its own
    (``torch.ones``/``zeros``/``full``/``arange``... directly, or through a name assigned one,
    cast or reshaped), "target": the first one's text, "line"/"text": the latest assignment
    of that name before ``line`` in the loop that holds the call, where it computes the labels
    (``y = yb.long()``, ``y = (s > 5).float()``, ``y = m // 255``), or the call's own line and
    the target's text}``; None when the line holds no call given a target, or the file cannot be
    read."""
    tree = _parse(path)
    if tree is None:
        return None
    calls = [node for node in walk(tree)
             if isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno)]
    targets = []
    for call in calls:
        written = call.args[1] if len(call.args) > 1 else next(
            (k.value for k in call.keywords if k.arg in ("target", "targets")), None)
        if written is not None:
            targets.append(written)
    if not targets:
        return None
    made = any(_made_by_script(tree, t, line) for t in targets)
    first = targets[0]
    found = {"made": made, "target": ast.unparse(first), "line": line, "text": ast.unparse(first)}
    root = first
    while isinstance(root, ast.Call) and isinstance(root.func, ast.Attribute) and root.func.attr in _KEEPS_VALUES:
        root = root.func.value
    loop = innermost_loop(path, line)
    if isinstance(root, ast.Name) and loop is not None:
        values = [(at, value) for at, value in _assigned_values(_enclosing_function(tree, line), root.id)
                  if loop[0] <= at < line]
        if values:
            at, value = max(values, key=lambda v: v[0])
            if _converts(value):
                found["line"], found["text"] = at, f"{root.id} = {ast.unparse(value)}"
    return found


# methods and functions whose result shares the memory of what they are given
_VIEW_METHODS = frozenset({"view", "view_as", "reshape", "squeeze", "unsqueeze", "permute",
                           "transpose", "swapaxes", "expand", "narrow", "select", "flatten",
                           "ravel", "T", "mT", "numpy", "detach", "contiguous"})
_SHARING_CALLS = frozenset({"from_numpy", "as_tensor", "asarray", "ascontiguousarray"})


def stored_array_use(path: str, line: int, attr: str) -> dict | None:
    """In the method defined on ``line`` (a dataset's ``__getitem__``): its first read of the
    array ``self.<attr>`` (``attr`` may name an item, ``tensors[0]``) and its first in-place
    write into what that read returns or a view of it (``x.add_(...)``, ``x += ...``,
    ``x[...] = ...``, ``out=x``). ``{"read": (line, text) | None, "write": (line, text, kind,
    name) | None, "read_expr": the read's subscript text | None, "index": the method's index
    parameter | None}``, kind "method" (with the method's name), "augmented", "item" or "out";
    None when the source cannot be read or holds no such method."""
    tree = _parse(path)
    if tree is None:
        return None
    function = next((node for node in walk(tree)
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and (node.lineno == line or any(d.lineno == line for d in node.decorator_list))),
                    None)
    if function is None or not function.args.args:
        return None
    me = function.args.args[0].arg
    base = attr.split("[", 1)[0]

    def stored(node) -> bool:  # self.<base>, seen through subscripts
        while isinstance(node, ast.Subscript):
            node = node.value
        return (isinstance(node, ast.Attribute) and node.attr == base
                and isinstance(node.value, ast.Name) and node.value.id == me)

    aliases: set[str] = set()

    def shares(node) -> bool:  # the stored data's memory, or a view of it
        if isinstance(node, ast.Subscript):
            return stored(node) or shares(node.value)
        if isinstance(node, ast.Name):
            return node.id in aliases
        if isinstance(node, ast.Attribute):
            return node.attr in _VIEW_METHODS and shares(node.value)
        if isinstance(node, ast.Call):
            name = _last_name(node.func)
            if isinstance(node.func, ast.Attribute) and name in _VIEW_METHODS:
                return shares(node.func.value)
            if name in _SHARING_CALLS and node.args:
                return shares(node.args[0])
        return False

    def text(node) -> str:
        try:
            return ast.unparse(node)
        except Exception:
            return ""

    read = write = read_expr = None
    statements = sorted((node for node in walk(function) if isinstance(node, ast.stmt)
                         and node is not function), key=lambda node: (node.lineno, node.col_offset))
    for node in statements:
        if read is None:
            for sub in walk(node):
                if isinstance(sub, ast.Subscript) and stored(sub):
                    read, read_expr = (node.lineno, text(node)), text(sub)
                    break
        if isinstance(node, ast.Assign):
            if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if shares(node.value):
                    aliases.add(node.targets[0].id)
                else:
                    aliases.discard(node.targets[0].id)
            elif write is None and any(isinstance(t, ast.Subscript) and shares(t.value)
                                       for t in node.targets):
                write = (node.lineno, text(node), "item", None)
        elif isinstance(node, ast.AugAssign) and write is None:
            target = node.target
            if (isinstance(target, ast.Name) and target.id in aliases) or \
                    (isinstance(target, ast.Subscript) and shares(target.value)):
                write = (node.lineno, text(node), "augmented", None)
        if write is None:
            for sub in walk(node):
                if not isinstance(sub, ast.Call):
                    continue
                func = sub.func
                if isinstance(func, ast.Attribute) and func.attr.endswith("_") \
                        and not func.attr.startswith("_") and shares(func.value):
                    write = (node.lineno, text(node), "method", func.attr)
                    break
                if any(k.arg == "out" and shares(k.value) for k in sub.keywords):
                    write = (node.lineno, text(node), "out", None)
                    break
    index = function.args.args[1].arg if len(function.args.args) > 1 else None
    return {"read": read, "write": write, "read_expr": read_expr, "index": index}


def _labels_returned(tree: ast.AST, line: int) -> tuple[int, str, str] | None:
    """``(line, text, name)`` of the assignment, inside the function the targets come from, of
    the name that function returns as the targets of the call on ``line`` (``output, target =
    model(q, k)`` then ``criterion(output, target)``: MoCo's ``labels = torch.zeros(...)`` in
    its ``forward``); None unless exactly one such assignment is found."""
    for node in walk(tree):
        if not (isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno)
                and len(node.args) > 1 and isinstance(node.args[1], ast.Name)):
            continue
        text = node.args[1].id
        scope = _enclosing_function(tree, line)
        if any(at <= line for at, value in _assigned_values(scope, text)
               if not isinstance(value, ast.Call)):
            continue  # assigned in this scope from something else than a call's result
        found = set()
        for at, value in _returned_values(tree, scope, text):
            if not isinstance(value, ast.Name):
                return None
            made = _last_assignment(tree, _enclosing_function(tree, at), at, value.id)
            if made is None or not isinstance(made, ast.Assign) or len(made.targets) != 1:
                return None
            found.add((made.lineno, ast.unparse(made).strip(), value.id))
        if len(found) == 1:
            return found.pop()
        return None
    return None


def labels_built(path: str, line: int) -> tuple[int, str, str] | None:
    """``(line, text, name)`` of the one assignment in the file of ``torch.arange(...)`` to a
    plain name (``labels = torch.arange(n, dtype=torch.long)``) when the targets of the loss on
    ``line`` come out of a call (``output, target = model(q, k)``: built inside the model's
    forward); None when there is none, or more than one."""
    tree = _parse(path)
    if tree is None:
        return None
    returned = _labels_returned(tree, line)
    if returned is not None:
        return returned
    found = []
    for node in walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name == "arange":
            found.append((node.lineno, f"{node.targets[0].id} = {ast.unparse(node.value)}",
                          node.targets[0].id))
    return found[0] if len(found) == 1 else None


def labels_written(path: str, line: int, functions) -> tuple[int, str, str, str, bool] | None:
    """``(line, text, name, input, assigned)`` where the targets of the call of one of
    ``functions`` on ``line`` are written: the latest plain assignment of the name given as
    target (``labels = ...``, ``assigned``) before ``line`` in the enclosing function, else the
    call's own line with the target's text; ``name`` is the target and ``input`` the first
    argument as the call writes them. None when the line shows no such call."""
    tree = _parse(path)
    if tree is None:
        return None
    for node in walk(tree):
        if not (isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno)):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name not in functions:
            continue
        written = node.args[1] if len(node.args) > 1 else next(
            (k.value for k in node.keywords if k.arg in ("target", "targets")), None)
        if written is None or isinstance(written, ast.Starred):
            continue
        shown = ast.unparse(written)
        given = ast.unparse(node.args[0]) if node.args else "logits"
        if isinstance(written, ast.Name):
            values = [(at, value) for at, value in
                      _assigned_values(_enclosing_function(tree, line), written.id) if at <= line]
            if values:
                at, value = max(values, key=lambda v: v[0])
                return at, f"{written.id} = {ast.unparse(value)}", shown, given, True
        return node.lineno, shown, shown, given, False
    return None


def call_with_swapped(path: str, line: int, first: int, second: int) -> tuple[str, str] | None:
    """``(call, the call with its positional arguments first and second swapped)`` of the
    outermost call starting last on ``line`` and given both (``crit(a, n, p)`` -> ``crit(a, p,
    n)``), or None."""
    tree = _parse(path)
    if tree is None:
        return None
    found = None
    for node in walk(tree):
        if isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno) \
                and len(node.args) > max(first, second) \
                and not any(isinstance(a, ast.Starred) for a in node.args) \
                and (found is None or node.lineno > found.lineno):
            found = node
    if found is None:
        return None
    args = list(found.args)
    args[first], args[second] = args[second], args[first]
    swapped = ast.Call(func=found.func, args=args, keywords=found.keywords)
    return ast.unparse(found), ast.unparse(swapped)


def term_assignment(path: str, line: int, name: str) -> tuple[int, str] | None:
    """``(line, text)`` of the statement that last assigns the plain variable ``name`` above
    ``line`` in the function (or module) holding ``line`` (``kl = -0.5 * torch.sum(...)`` for the
    ``kl`` of a loss backpropagated on ``line``). When that statement calls a loss object the
    file built once with ``reduction=...`` (``aux = aux_crit(logits, y)``), the object's
    construction instead: the reduction is chosen there. None when there is none or the source
    cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    scope = _enclosing_function(tree, line)
    best = None
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue  # another scope
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.lineno <= line:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for target in targets for t in walk(target) if isinstance(t, ast.Name)
                     and isinstance(t.ctx, ast.Store)}
            if name in names and (best is None or node.lineno > best.lineno):
                best = node
        todo.extend(ast.iter_child_nodes(node))
    if best is None:
        return None
    built = _reduction_built(tree, best)
    if built is not None:
        return built
    return best.lineno, ast.unparse(best).strip()


def _reduction_built(tree: ast.AST, statement: ast.stmt) -> tuple[int, str] | None:
    """The one assignment of the file that builds the object ``statement`` calls
    (``crit(...)``) with a ``reduction=`` keyword, or None."""
    value = getattr(statement, "value", None)
    if not isinstance(value, ast.Call) or not isinstance(value.func, (ast.Name, ast.Attribute)):
        return None
    called = ast.unparse(value.func)
    found = []
    for node in walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and ast.unparse(node.targets[0]) == called and isinstance(node.value, ast.Call) \
                and any(k.arg == "reduction" for k in node.value.keywords):
            found.append(node)
    if len(found) != 1:
        return None
    return found[0].lineno, ast.unparse(found[0]).strip()


def _last_assignment(tree: ast.AST, scope: ast.AST, line: int, name: str):
    """The statement of ``scope`` (not of scopes nested in it) that last assigns the plain
    variable ``name`` at or above ``line``, or None."""
    best = None
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.lineno <= line:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for target in targets for t in walk(target)
                     if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
            if name in names and (best is None or node.lineno > best.lineno):
                best = node
        todo.extend(ast.iter_child_nodes(node))
    return best


def value_origin(path: str, line: int, name: str) -> tuple[int, str] | None:
    """``(line, text)`` of the statement that made the values the variable ``name`` holds at
    ``line``: its last assignment in the function holding ``line`` (else the module's), followed
    through rows taken from another variable (``real = data[idx]``: where ``data`` was last
    assigned) and through a call of a function of this file (``real = preprocess(xb)``: that
    function's last ``return``). None when there is none or the source cannot be read."""
    tree = _parse(path)
    if tree is None:
        return None
    statement = None
    for _ in range(4):  # hops through selections of other variables
        scope = _enclosing_function(tree, line)
        found = _last_assignment(tree, scope, line, name)
        if found is None and scope is not tree:
            found = _last_assignment(tree, tree, line, name)
        if found is None:
            break
        statement = found
        value = getattr(found, "value", None)
        if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) \
                and value.value.id != name:
            name, line = value.value.id, found.lineno
            continue
        if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name):
            line = found.lineno - 1  # data = data[perm]: where the earlier data came from
            continue
        break
    if statement is None:
        return None
    value = getattr(statement, "value", None)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        defs = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                and n.name == value.func.id]
        if len(defs) == 1:
            returns = [n for n in walk(defs[0]) if isinstance(n, ast.Return) and n.value is not None]
            if len(returns) == 1:
                return returns[0].lineno, ast.unparse(returns[0]).strip()
    return statement.lineno, ast.unparse(statement).strip()


# what a call that returns a loss is named (`F.cross_entropy`, `criterion`, `loss_fn`, `mse_loss`)
_LOSS_CALL_WORDS = ("loss", "cross_entropy", "nll", "mse", "bce", "kl_div", "crit", "huber", "hinge")
# the ops a weight computed from losses is made with
_LOSS_WEIGHT_CALLS = ("exp", "softmax", "sigmoid", "pow", "log", "sqrt", "reciprocal")
_DETACHING_CALLS = ("detach", "item", "tolist", "numpy", "float")


def _callee(call: ast.AST) -> str:
    return _call_name(call) or ""


def _is_loss_call(node) -> bool:
    return isinstance(node, ast.Call) and any(w in _callee(node).lower() for w in _LOSS_CALL_WORDS)


def _outside_loss_calls(node):
    """The nodes under ``node`` that are not inside a loss call's arguments (the call itself is)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if not _is_loss_call(n):
            stack.extend(ast.iter_child_nodes(n))


def _nonlinear_of(node) -> bool:
    for n in _outside_loss_calls(node):
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.Pow)):
            return True
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub) and isinstance(n.left, ast.Constant):
            return True
        if isinstance(n, ast.Call) and _callee(n) in _LOSS_WEIGHT_CALLS:
            return True
    return False


def loss_sites(path: str) -> tuple[dict, list]:
    """``(losses, weights)``: the names bound to a value holding a loss call (``F.mse_loss``,
    ``criterion``, a stack of them) or a sum of such names, with that line, and the ``(line,
    names, text)`` of each assignment that makes a non-linear function of them (a quotient,
    power, exp, softmax, ``1 - x``) without detaching it (loss-weight-from-loss). Empty when the
    file cannot be read."""
    tree = _parse(path)
    if tree is None:
        return {}, []
    assigns = sorted((n for n in walk(tree) if isinstance(n, ast.Assign)), key=lambda n: n.lineno)
    losses: dict[str, int] = {}
    weights: list = []
    for node in assigns:
        targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        value = node.value
        outside = list(_outside_loss_calls(value))
        used = sorted({n.id for n in outside if isinstance(n, ast.Name)} & set(losses))
        calls = [n for n in outside if _is_loss_call(n)]
        detached = any(isinstance(n, ast.Call) and _callee(n) in _DETACHING_CALLS for n in outside)
        if (used or calls) and _nonlinear_of(value) and not detached:
            weights.append((node.lineno, used or [_callee(calls[0])], ast.unparse(node)))
        elif calls or (used and isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)):
            for name in targets:  # a loss, a stack of losses, total = l_cls + l_reg
                losses[name] = node.lineno
    return losses, weights


# calls whose second result (or ``.indices``) holds positions, not values
_WITH_INDICES = frozenset({"max", "min", "topk", "sort", "kthvalue", "mode", "median"})
_INDEX_CALLS = frozenset({"argmax", "argmin", "argsort"})
# methods through which a tensor keeps its values
_KEEPS_VALUES = frozenset({"float", "double", "half", "to", "type", "type_as", "unsqueeze", "squeeze",
                           "view", "reshape", "detach", "clone", "flatten"})


def _index_producer(node) -> str | None:
    """The text of an expression that yields the positions of a max (``q.max(1)[1]``,
    ``torch.max(q, dim=1)[1]``, ``q.max(1).indices``, ``q.argmax(1)``), else None."""
    target = None
    if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
            and node.slice.value == 1):
        target = node.value
    elif isinstance(node, ast.Attribute) and node.attr == "indices":
        target = node.value
    elif isinstance(node, ast.Call) and _callee(node) in _INDEX_CALLS:
        return ast.unparse(node)
    if not isinstance(target, ast.Call) or _callee(target) not in _WITH_INDICES:
        return None
    # a max without a dim returns the value alone: no positions
    module_call = isinstance(target.func, ast.Attribute) and isinstance(target.func.value, ast.Name) \
        and target.func.value.id == "torch"
    if len(target.args) + len(target.keywords) < (2 if module_call else 1) and _callee(target) != "sort":
        return None
    return ast.unparse(node)


def _float_literal(node, floats: set) -> bool:
    """A non-integer float literal, or a name bound to one."""
    for n in walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, float) and not n.value.is_integer():
            return True
        if isinstance(n, ast.Name) and n.id in floats:
            return True
    return False


@_once_per_file
def indices_as_values(path: str) -> list[tuple[int, str, str, int]]:
    """``(line, producer text, use, use line)`` for the positions of a max (``[1]``,
    ``.indices``, ``argmax``) used as its values: scaled or shifted by a non-integer float
    whose result reaches a loss call's arguments (``use`` "target"), or compared with a
    threshold between 0 and 1 (``use`` "threshold"). Empty when the file cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    assigns = sorted((n for n in walk(tree) if isinstance(n, ast.Assign)), key=lambda n: n.lineno)
    floats: set = set()
    for n in assigns:
        for t in n.targets:
            pairs = zip(t.elts, n.value.elts) if isinstance(t, ast.Tuple) and isinstance(
                n.value, ast.Tuple) and len(t.elts) == len(n.value.elts) else ((t, n.value),)
            floats.update(name.id for name, value in pairs if isinstance(name, ast.Name)
                          and isinstance(value, ast.Constant) and isinstance(value.value, float)
                          and not value.value.is_integer())
    # a name assigned in a function is that function's own: its values do not reach a name of
    # the same spelling elsewhere (an environment's ``obs`` inside ``env_step`` is not the
    # training loop's); a name a function only reads is the module's
    scope_of: dict = {}
    for fn in walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in walk(fn):
                scope_of[id(sub)] = fn  # ast.walk goes outer first: the innermost stays
    local: dict = {}
    for n in assigns:
        for t in n.targets:
            for name in walk(t):
                if isinstance(name, ast.Name):
                    local.setdefault(scope_of.get(id(n)), set()).add(name.id)

    def key(node, name):
        scope = scope_of.get(id(node))
        return (scope if scope is not None and name in local.get(scope, ()) else None, name)

    indices: dict[tuple, tuple[int, str]] = {}  # (scope, name) -> (line, producer)
    for n in assigns:
        if len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            text = _index_producer(n.value)
            if text is not None:
                indices[key(n, n.targets[0].id)] = (n.lineno, text)

    def producer_in(node):
        """The positions ``node`` carries as values: through arithmetic and dtype or shape
        changes, not through an index's use (``gather(1, a)``, ``x[a]``)."""
        text = _index_producer(node)
        if text is not None:
            return node.lineno, text
        if isinstance(node, ast.Name):
            return indices.get(key(node, node.id))
        if isinstance(node, ast.BinOp):
            return producer_in(node.left) or producer_in(node.right)
        if isinstance(node, ast.UnaryOp):
            return producer_in(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _KEEPS_VALUES:
            return producer_in(node.func.value)
        return None

    found: list = []
    # values made from positions by float arithmetic: name -> (producer line, text)
    valued: dict[tuple, tuple[int, str]] = {}
    for n in assigns:
        value = n.value
        arithmetic = [b for b in walk(value) if isinstance(b, ast.BinOp)
                      and isinstance(b.op, (ast.Add, ast.Sub, ast.Mult, ast.Div))]
        hit = None
        for b in arithmetic:
            for side, other in ((b.left, b.right), (b.right, b.left)):
                source = producer_in(side)
                if source is not None and _float_literal(other, floats):
                    hit = source
                    break
                if isinstance(side, ast.Name) and key(side, side.id) in valued:
                    hit = valued[key(side, side.id)]
                    break
            if hit:
                break
        if hit is None:
            names = sorted({key(s, s.id) for s in walk(value) if isinstance(s, ast.Name)} & set(valued),
                           key=lambda k: k[1])
            hit = valued[names[0]] if names and arithmetic else None
        if hit is not None:
            for t in n.targets:
                if isinstance(t, ast.Name):
                    valued[key(n, t.id)] = hit
    for call in walk(tree):
        if not (isinstance(call, ast.Call) and _is_loss_call(call)):
            continue
        for arg in list(call.args) + [k.value for k in call.keywords]:
            names = sorted({key(s, s.id) for s in walk(arg) if isinstance(s, ast.Name)} & set(valued),
                           key=lambda k: k[1])
            if names:
                line, text = valued[names[0]]
                found.append((line, text, "target", call.lineno))
                break
    for cmp in walk(tree):
        if isinstance(cmp, ast.Call) and isinstance(cmp.func, ast.Attribute) and \
                cmp.func.attr in ("ge", "gt", "le", "lt") and len(cmp.args) == 1:
            pairs = ((cmp.func.value, cmp.args[0]),)  # probs.max(1)[1].ge(0.95)
        elif isinstance(cmp, ast.Compare) and len(cmp.comparators) == 1:
            pairs = ((cmp.left, cmp.comparators[0]), (cmp.comparators[0], cmp.left))
        else:
            continue
        for side, other in pairs:
            source = producer_in(side)
            if (source is not None and isinstance(other, ast.Constant)
                    and isinstance(other.value, float) and 0 < other.value < 1):
                found.append((source[0], source[1], "threshold", cmp.lineno))
                break
    seen: set = set()
    return [f for f in sorted(found) if not (f[0] in seen or seen.add(f[0]))]


def _first_axis_length(node, name: str) -> bool:
    """``x.size(0)``, ``x.shape[0]``, ``len(x)`` of the name ``name``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "size" \
            and isinstance(node.func.value, ast.Name) and node.func.value.id == name \
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and node.args[0].value == 0:
        return True
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
            and node.value.attr == "shape" and isinstance(node.value.value, ast.Name) \
            and node.value.value.id == name and isinstance(node.slice, ast.Constant) and node.slice.value == 0:
        return True
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len"
            and len(node.args) == 1 and isinstance(node.args[0], ast.Name) and node.args[0].id == name)


@_once_per_file
def table_sliced_by_batch(path: str) -> list[tuple[int, str, str]]:
    """``(line, text, class name)`` of each ``forward`` that adds to a tensor a table attribute
    sliced by that tensor's first axis (``x + self.pe[:x.size(0)]``, the PyTorch tutorial's
    positional encoding for sequence-first input), in a file that builds batch-first layers
    (``batch_first=True``) and never swaps the first two axes. Empty otherwise, or when the file
    cannot be read."""
    tree = _parse(path)
    if tree is None:
        return []
    batch_first = swapped = False
    for n in walk(tree):
        if isinstance(n, ast.keyword) and n.arg == "batch_first":
            if isinstance(n.value, ast.Constant) and n.value.value is True:
                batch_first = True
            else:
                swapped = True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            args = [a.value for a in n.args if isinstance(a, ast.Constant)]
            if n.func.attr in ("transpose", "swapaxes") and sorted(args) == [0, 1]:
                swapped = True
            if n.func.attr == "permute" and args[:2] == [1, 0]:
                swapped = True
    if not batch_first or swapped:
        return []
    found = []
    for cls in (n for n in walk(tree) if isinstance(n, ast.ClassDef)):
        for fn in cls.body:
            if not (isinstance(fn, ast.FunctionDef) and fn.name == "forward"):
                continue
            for b in walk(fn):
                if not (isinstance(b, ast.BinOp) and isinstance(b.op, ast.Add)):
                    continue
                for side, other in ((b.right, b.left), (b.left, b.right)):
                    while isinstance(side, ast.Call) and isinstance(side.func, ast.Attribute):
                        side = side.func.value  # self.pe[:x.size(0)].unsqueeze(1)
                    if (isinstance(side, ast.Subscript) and isinstance(side.value, ast.Attribute)
                            and isinstance(side.value.value, ast.Name) and side.value.value.id == "self"
                            and isinstance(side.slice, ast.Slice) and side.slice.lower is None
                            and side.slice.upper is not None
                            and any(_first_axis_length(side.slice.upper, name) for name in
                                    {s.id for s in walk(other) if isinstance(s, ast.Name)})):
                        found.append((b.lineno, ast.unparse(b), cls.name))
                        break
    built = {n.func.id for n in walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return [f for f in found if f[2] in built]


def _log_probability_call(node: ast.AST) -> bool:
    """Whether ``node`` holds a log-softmax: ``F.log_softmax(...)``, ``x.log_softmax(...)``,
    ``torch.log(F.softmax(...))``."""
    for call in walk(node):
        if isinstance(call, ast.Call) and _last_name(call.func) == "log_softmax":
            return True
        if isinstance(call, ast.Call) and _last_name(call.func) == "log" and any(
                isinstance(inner, ast.Call) and _last_name(inner.func) == "softmax"
                for argument in call.args for inner in walk(argument)):
            return True
    return False


def _names_log_probabilities(path: str, line: int, node: ast.AST) -> bool:
    """Whether ``node`` is a name last assigned a log-softmax before ``line``
    (``logp = F.log_softmax(logits, 1)`` ... ``target * logp``)."""
    if not isinstance(node, ast.Name):
        return False
    origin = value_origin(path, line, node.id)
    if origin is None:
        return False
    try:
        return _log_probability_call(ast.parse(origin[1].strip()))
    except SyntaxError:
        return "log_softmax" in origin[1]


def soft_target_origin(path: str, line: int) -> tuple[int, str] | None:
    """``(line, text)`` of where the soft targets of a cross-entropy written by hand are made,
    for the backward on ``line``: the loss's assignment (``loss = -(target *
    F.log_softmax(logits, -1)).sum(-1).mean()``), the factor beside the log-softmax, and where
    that variable's values were made (``value_origin``: through a function of this file to its
    ``return``); the loss's assignment when the factor is not a plain name; None when the
    loss's assignment is not found."""
    assigned = loss_assignment(path, line)
    tree = _parse(path)
    if assigned is None or tree is None:
        return None
    at = assigned[0]
    statement = next((node for node in walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
                      and node.lineno == at), None)
    if statement is None or statement.value is None:
        return assigned
    for node in walk(statement.value):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
            continue
        for log_side, other in ((node.left, node.right), (node.right, node.left)):
            if not (_log_probability_call(log_side) or _names_log_probabilities(path, at, log_side)) \
                    or _log_probability_call(other):
                continue
            while isinstance(other, ast.UnaryOp) and isinstance(other.op, ast.USub):
                other = other.operand
            if isinstance(other, ast.Name):
                return value_origin(path, at, other.id) or assigned
            return assigned
    return assigned


@_once_per_file
def indexed_by_variable(path: str) -> frozenset:
    """The attribute names the file indexes with a value known only at run time
    (``self.heads[task_id]``, ``model.experts[k]``): a container whose members the run picks
    one at a time. Constant indices (``self.heads[0]``) and slices are left out."""
    tree = _parse(path)
    if tree is None:
        return frozenset()
    found = set()
    for node in walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and not isinstance(node.slice, (ast.Constant, ast.Slice, ast.Tuple)):
            found.add(node.value.attr)
    return frozenset(found)
