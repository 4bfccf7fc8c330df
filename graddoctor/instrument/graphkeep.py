"""Deep autograd graphs are released as safely under graddoctor as without it.

Touching an autograd node from Python (``next_functions``, ``metadata``) gives it a Python
object that lives as long as the node (PyTorch preserves it). Releasing a graph frees its nodes
in a loop, not by recursion, so any depth is fine without graddoctor; but a node that has a
Python object is freed through that object's deallocation, which frees its children from
inside it: a chain of such nodes is freed by recursion, one C stack level per node. A walk over
a graph 50,000 nodes deep (an RNN unrolled over a long sequence, a deep chain of layers) then
crashes the process (signal 11) on the line that drops the graph.

So the graph walks hold on to one node in every ``KEEP_EVERY`` they create a Python object for
(counted in walk order, which follows a chain). When the script drops the graph, freeing stops
at the first held node: at most ``KEEP_EVERY`` levels of recursion. ``sweep`` then lets go of
the held nodes nothing else keeps alive, one at a time, the shallowest first, so each release
also stops at the next held node. Sweeps run at the start of every backward (the script has
usually dropped the previous graph by then: memory stays at most one graph above what the script
holds) and at the end of a check, after the script's globals are let go of. A graph the
process still holds after that keeps its held nodes until the interpreter exits (an ``atexit``
sweep). Graphs smaller than ``KEEP_EVERY`` nodes hold nothing: a normal training loop pays one
counter per walked node and one ``if`` per backward.
"""

from __future__ import annotations

import atexit
import gc
import sys
import threading

KEEP_EVERY = 256  # Python-visible nodes between two held ones: the recursion depth of a release

HELD: dict[int, object] = {}  # id(node) -> node, in the order the walks held them
_lock = threading.Lock()  # one sweep at a time (a sweep may run from any thread)
_atexit_registered = False


def hold(node) -> None:
    """Keep ``node`` alive until nothing else does (see the module docs)."""
    HELD[id(node)] = node


def held() -> int:
    return len(HELD)


def _refs(table: dict, key: int) -> int:
    node = table.get(key)
    return sys.getrefcount(node)


_BASE = _refs({0: object()}, 0)  # the count of an object held by the table only


def sweep() -> int:
    """Let go of the held nodes that only graddoctor keeps alive, shallowest first; returns how
    many were let go of. Never raises."""
    if not HELD or not _lock.acquire(blocking=False):
        return 0
    released = 0
    try:
        progress = True
        while progress:  # releasing a node can leave a deeper held one alone: look again
            progress = False
            for key in list(HELD):
                if key in HELD and _refs(HELD, key) <= _BASE:
                    del HELD[key]  # frees the node and its graph down to the next held node
                    released += 1
                    progress = True
    except Exception:
        pass
    finally:
        _lock.release()
    return released


def release_after_check() -> None:
    """At the end of a check, once the script's globals are let go of: free what graddoctor
    held of the graphs the script no longer holds (a script's globals are usually a reference
    cycle, hence the collection, which only runs when something is held)."""
    global _atexit_registered
    if not HELD:
        return
    sweep()
    if HELD:
        gc.collect()
        sweep()
    if HELD and not _atexit_registered:
        _atexit_registered = True
        atexit.register(_at_exit)


def _at_exit() -> None:
    if HELD:
        gc.collect()
        sweep()
