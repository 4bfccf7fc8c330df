"""Walks of an autograd graph: the part that leads from a root to some target nodes, for the
watchers that hook one backward's nodes on the way (instrument/gradstop.py,
instrument/dependency.py); the nodes and leaf tensors below a root, for the watchers that ask
which parameters a value reaches (instrument/stopgrad.py, policygrad.py, lossterms.py)."""

from __future__ import annotations

from itertools import chain, filterfalse
from operator import attrgetter, itemgetter
from typing import Callable

_NEXT = attrgetter("next_functions")
_FIRST = itemgetter(0)


def packed(node, name: str) -> bool:
    """Whether the tensor ``node`` saved as ``name`` (``_saved_self``) went through saved-tensor
    hooks (non-reentrant checkpointing, CPU offloading): reading it would unpack it, which for a
    checkpoint runs the region's forward again. Read from ``_raw_saved_*`` without unpacking."""
    raw = getattr(node, "_raw" + name, None)
    for item in raw if isinstance(raw, (list, tuple)) else (raw,):
        if item is not None and getattr(item, "unpack_hook", None) is not None:
            return True
    return False


def saved(node, name: str, default=None):
    """``getattr(node, name, default)`` for a node's saved value, without unpacking a tensor
    saved under saved-tensor hooks (``packed``: ``default`` then)."""
    if packed(node, name):
        return default
    try:
        return getattr(node, name, default)
    except Exception:  # released after a backward
        return default


def signed(value: int) -> int:
    """A saved int64 (a dim, an index, a shift) as the script wrote it: torch hands a negative one
    back as an unsigned 64-bit number (``dim=-1`` reads 2**64 - 1)."""
    value = int(value)
    return value - (1 << 64) if value >= 1 << 63 else value


def saved_dims(node, name: str = "_saved_dim"):
    """A node's saved dimension (an int, or a tuple of them) as the script wrote it (``signed``).
    None when it is neither."""
    value = saved(node, name)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return signed(value)
    if isinstance(value, (tuple, list)) and all(isinstance(d, int) and not isinstance(d, bool)
                                                for d in value):
        return tuple(signed(d) for d in value)
    return None


def post_order(root, limit: int, refuse: type | None = None) -> list | None:
    """The nodes below ``root``, each after all of its inputs (iterative: deep graphs); None
    when there are more than ``limit`` or one is a ``refuse`` instance."""
    seen: set = set()
    out: list = []
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if node is None:
            continue
        if expanded:
            out.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        if len(seen) > limit or (refuse is not None and isinstance(node, refuse)):
            return None
        stack.append((node, True))
        for child, _ in node.next_functions:
            if child is not None and child not in seen:
                stack.append((child, False))
    return out


def paths_to(root, is_target: Callable[[object], bool], limit: int,
             refuse: type | None = None) -> dict | None:
    """``{node: indices of its inputs that lead to a target}`` over the graph below ``root``
    (a node leads to a target when it is one or one of its inputs leads to one); None past
    ``limit`` nodes or at a ``refuse`` node."""
    order = post_order(root, limit, refuse)
    if order is None:
        return None
    leads: dict = {}
    relevant: dict = {}
    for node in order:
        edges = tuple(i for i, (child, _) in enumerate(node.next_functions)
                      if child is not None and leads.get(child))
        leads[node] = bool(edges) or is_target(node)
        if edges:
            relevant[node] = edges
    return relevant



def nodes_below(roots, limit: int) -> tuple[list, bool]:
    """``(nodes, complete)``: the graph nodes reached from ``roots`` (the roots included), each
    once, breadth first, level by level in the order ``next_functions`` lists them;
    ``complete`` is False when there were more than ``limit`` (the first ``limit`` are
    returned). Each level is expanded by ``map``s over ``next_functions`` and a set test in C:
    no Python bytecode per node, only per level (a graph of thousands of tensors costs a few
    calls per level, not a loop turn per node)."""
    level = list(dict.fromkeys(r for r in roots if r is not None))
    seen = set(level)
    out = list(level)
    while level and len(out) <= limit:
        below = dict.fromkeys(map(_FIRST, chain.from_iterable(map(_NEXT, level))))
        below.pop(None, None)
        level = list(filterfalse(seen.__contains__, below))
        seen.update(level)
        out.extend(level)
    if len(out) > limit:
        return out[:limit], False
    return out, True


def reached(root, limit: int, truncate: bool = False) -> tuple[set, set] | None:
    """``(nodes, ids of the leaf tensors)`` below ``root``. Past ``limit`` nodes: None, or with
    ``truncate`` what was reached so far."""
    seen: set = set()
    leaves: set = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if len(seen) > limit:
            if truncate:
                break
            return None
        variable = getattr(node, "variable", None)
        if variable is not None:
            leaves.add(id(variable))
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return seen, leaves


def nearest(root, noted: dict, levels: int):
    """The value ``noted`` holds for the node nearest ``root`` (breadth first, ``root``
    included, at most ``levels`` levels down), or None."""
    level, seen = [root], set()
    for _ in range(levels):
        following = []
        for node in level:
            if node is None or node in seen:
                continue
            value = noted.get(node)
            if value is not None:
                return value
            seen.add(node)
            following.extend(child for child, _ in node.next_functions if child is not None)
        level = following
    return None
