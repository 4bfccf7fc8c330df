"""Watchers talk through typed topics (``instrument/topics.py``): each one listed in
``TOPICS``, published by one watcher, subscribed to through ``Recorder.subscribe``."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest
import torch

from graddoctor.instrument import Instrumentation, topics
from graddoctor.instrument.recorder import Recorder
from graddoctor.instrument.topics import (PARAMS_ADDED, STEPPED, STEPPED_WITHOUT_GRAD, TOPICS,
                                          Topic)

INSTRUMENT = pathlib.Path(__file__).resolve().parent.parent / "graddoctor" / "instrument"


def test_every_topic_has_one_publisher_and_every_published_topic_is_listed():
    published: dict[str, list[str]] = {}
    for path in INSTRUMENT.glob("*.py"):
        for topic in re.findall(r"\.subscribers\((\w+)\)", path.read_text()):
            published.setdefault(topic, []).append(path.name)
    defined = {name: value for name, value in vars(topics).items() if isinstance(value, Topic)}
    assert set(published) == set(defined)
    assert all(len(files) == 1 for files in published.values()), published
    assert set(map(id, defined.values())) == set(map(id, TOPICS)) and len(TOPICS) == len(defined)
    assert all(topic.name == name.lower() for name, topic in defined.items())


def test_a_string_or_an_unlisted_topic_is_refused():
    rec = Recorder(step_budget=None)
    with pytest.raises(KeyError):
        rec.subscribe("stepped", print)
    with pytest.raises(KeyError):
        rec.subscribe(Topic("stepped", "nobody", "a look-alike"), print)


def test_subscribers_hear_the_optimizers_topics_in_order():
    rec = Recorder(step_budget=None)
    heard = []
    with Instrumentation(rec):
        rec.subscribe(PARAMS_ADDED, lambda opt, pids: heard.append(("added", opt, pids)))
        rec.subscribe(STEPPED_WITHOUT_GRAD, lambda opt, pids: heard.append(("without", opt, pids)))
        rec.subscribe(STEPPED, lambda opt, optimizer: heard.append(("stepped", opt, type(optimizer))))
        used, idle = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
        optimizer = torch.optim.SGD([used, idle], lr=0.1)
        used.sum().backward()
        optimizer.step()
    assert heard == [("added", 0, [0, 1]), ("without", 0, [1]), ("stepped", 0, torch.optim.SGD)]


# -- the recorder's state is written by the recorder alone -------------------------------------

GRADDOCTOR = INSTRUMENT.parent
MUTATORS = {"append", "extend", "insert", "update", "pop", "popitem", "clear", "setdefault", "add",
            "discard", "remove", "sort", "reverse", "difference_update", "intersection_update",
            "symmetric_difference_update", "__setitem__", "__delitem__"}


def _is_recorder(node) -> bool:
    """``rec`` or ``<anything>.rec``: how the package names its recorder."""
    return (isinstance(node, ast.Name) and node.id == "rec") or (
        isinstance(node, ast.Attribute) and node.attr == "rec")


# the recorder's parts, each in its own module: their state is the recorder's too
PARTS = {"grads": "instrument/gradstate.py", "progress": "instrument/progress.py"}


def _recorder_attribute(node) -> str | None:
    """``x`` for ``rec.x`` / ``self.rec.x``, ``grads.x`` for ``rec.grads.x`` (a part of the
    recorder), else None."""
    if isinstance(node, ast.Attribute) and _is_recorder(node.value):
        return node.attr
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
            and node.value.attr in PARTS and _is_recorder(node.value.value)):
        return f"{node.value.attr}.{node.attr}"
    return None


def recorder_writes(root: pathlib.Path) -> list[str]:
    """``path:line: what`` for each place outside the recorder's modules that assigns to a
    recorder attribute, or into it, or calls a mutating method on it, directly or through a
    local name bound to it (``known = rec.known_grad; known[pid] = ...``)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative == "instrument/recorder.py" or relative in PARTS.values():
            continue
        tree = ast.parse(path.read_text(), str(path))
        for function in [tree, *(n for n in ast.walk(tree)
                                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
            aliases: dict[str, str] = {}  # local name -> the recorder attribute it holds
            for node in ast.walk(function):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        pairs = ([(target, node.value)] if not isinstance(target, ast.Tuple) else
                                 list(zip(target.elts, node.value.elts))
                                 if isinstance(node.value, ast.Tuple) else [])
                        for name, value in pairs:
                            attr = _recorder_attribute(value)
                            if isinstance(name, ast.Name) and attr is not None:
                                aliases[name.id] = attr

            def held(node) -> str | None:
                """The recorder attribute ``node`` is, directly or through an alias."""
                if isinstance(node, ast.Name) and node.id in aliases:
                    return aliases[node.id]
                return _recorder_attribute(node)

            for node in ast.walk(function):
                targets = []
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                    targets = [node.target]
                elif isinstance(node, ast.Delete):
                    targets = node.targets
                for target in targets:
                    for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                        attr = _recorder_attribute(element) or (
                            held(element.value) if isinstance(element, (ast.Subscript, ast.Attribute))
                            else None)
                        if attr is not None:
                            found.append(f"{relative}:{node.lineno}: writes rec.{attr}")
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in MUTATORS and (attr := held(node.func.value)) is not None):
                    found.append(f"{relative}:{node.lineno}: rec.{attr}.{node.func.attr}()")
    return sorted(set(found))


def test_only_the_recorder_writes_its_state():
    """Watchers change the recorder's state through its methods (``backward_wrote``,
    ``cleared``, ``name_params``, ``subscribe``, ...), never by writing its attributes."""
    assert recorder_writes(GRADDOCTOR) == []


def test_the_recorder_write_scan_sees_each_way_of_writing(tmp_path):
    (tmp_path / "watcher.py").write_text(
        "def end(self, rec, pid):\n"
        "    rec.holder = self\n"
        "    self.rec.param_names[pid] = 'w'\n"
        "    del rec.finite[pid]\n"
        "    rec.steps += 1\n"
        "    rec.on_step.append(print)\n"
        "    known, zeroed = rec.known_grad, self.rec.zeroed_grad\n"
        "    known[pid] = (1, 0)\n"
        "    zeroed.pop(pid, None)\n"
        "    rec.note_known([])\n"  # a method: fine
        "    rec.trace.put(None)\n"  # the trace's own method: fine
        "    rec.grads.known[pid] = (1, 0)\n"
        "    self.rec.progress.steps += 1\n"
        "    finite = rec.grads.finite\n"
        "    finite.clear()\n"
        "    rec.grads.cleared([])\n")  # a part's method: fine
    assert recorder_writes(tmp_path) == [
        "watcher.py:12: writes rec.grads.known", "watcher.py:13: writes rec.progress.steps",
        "watcher.py:15: rec.grads.finite.clear()",
        "watcher.py:2: writes rec.holder", "watcher.py:3: writes rec.param_names",
        "watcher.py:4: writes rec.finite", "watcher.py:5: writes rec.steps",
        "watcher.py:6: rec.on_step.append()", "watcher.py:8: writes rec.known_grad",
        "watcher.py:9: rec.zeroed_grad.pop()"]


# -- a private attribute is touched by its own class alone ---------------------------------------

def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_private_names(trees) -> set[str]:
    """The private attributes graddoctor's classes define (methods, ``self._x``, class-level
    names): only those are checked, so torch's (``_version``, ``_local_tensor``) stay allowed."""
    names = set()
    for tree in trees:
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_private(node.name):
                    names.add(node.name)
                elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                      and isinstance(node.value, ast.Name) and node.value.id == "self"
                      and _is_private(node.attr)):
                    names.add(node.attr)
            for node in cls.body:
                if isinstance(node, ast.Assign):
                    names.update(t.id for t in node.targets
                                 if isinstance(t, ast.Name) and _is_private(t.id))
    return names


def _self_aliases(method) -> set[str]:
    """``self``, ``cls`` and the names a method binds to ``self`` for its closures
    (``watcher = self``, ``watcher, rec = self, self.rec``)."""
    aliases = {"self", "cls"}
    for node in ast.walk(method):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = ([(target, node.value)] if not isinstance(target, ast.Tuple) else
                         list(zip(target.elts, node.value.elts))
                         if isinstance(node.value, ast.Tuple) else [])
                aliases.update(name.id for name, value in pairs if isinstance(name, ast.Name)
                               and isinstance(value, ast.Name) and value.id == "self")
    return aliases


def private_reaches(root: pathlib.Path) -> list[str]:
    """``path:line: expr`` for each use of a graddoctor class's private attribute on an object
    other than ``self`` (or a closure's alias of it)."""
    trees = {path: ast.parse(path.read_text(), str(path)) for path in sorted(root.rglob("*.py"))}
    private = _own_private_names(trees.values())
    found = []

    def visit(node, allowed: set[str], relative: str) -> None:
        if isinstance(node, ast.ClassDef):
            for child in node.body:
                inner = (_self_aliases(child)
                         if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else allowed)
                visit(child, inner, relative)
            return
        if (isinstance(node, ast.Attribute) and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id in allowed)):
            found.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, allowed, relative)

    for path, tree in trees.items():
        visit(tree, {"self", "cls"}, path.relative_to(root).as_posix())
    return found


def test_no_private_attribute_is_touched_from_outside_its_class():
    assert private_reaches(GRADDOCTOR) == []


def test_the_private_attribute_scan_sees_a_reach_from_outside(tmp_path):
    (tmp_path / "watchers.py").write_text(
        "class Recorder:\n"
        "    def __init__(self):\n"
        "        self._stop = None\n"
        "    def wrap(self):\n"
        "        watcher = self\n"
        "        def hook():\n"
        "            return watcher._stop, self._stop\n"  # the class's own closure: fine
        "        return hook\n"
        "def divert(rec, tensor):\n"
        "    rec._stop = 1\n"
        "    return tensor._version\n")  # not a graddoctor name: a library's, fine
    assert private_reaches(tmp_path) == ["watchers.py:10: rec._stop"]


# -- subscribers that leave once done -----------------------------------------------------------

def test_a_subscriber_that_retires_while_published_lets_every_other_one_be_called():
    rec = Recorder(step_budget=None)
    heard = []

    def first(opt, optimizer):
        heard.append("first")
        rec.retire(STEPPED, first)  # leaves during the publication: the next one still runs

    rec.subscribe(STEPPED, first)
    rec.subscribe(STEPPED, lambda opt, optimizer: heard.append("second"))
    for _ in range(2):
        for subscriber in rec.subscribers(STEPPED).now:
            subscriber(0, None)
    assert heard == ["first", "second", "second"]


def test_a_resumed_subscriber_is_called_at_its_place_in_the_order():
    rec = Recorder(step_budget=None)
    heard = []
    a, b, c = (lambda name: lambda opt, optimizer: heard.append(name))("a"), \
        (lambda name: lambda opt, optimizer: heard.append(name))("b"), \
        (lambda name: lambda opt, optimizer: heard.append(name))("c")
    for subscriber in (a, b, c):
        rec.subscribe(STEPPED, subscriber)
    rec.retire(STEPPED, b)
    assert rec.subscribers(STEPPED).now == (a, c)
    rec.resume(STEPPED, b)
    rec.resume(STEPPED, b)  # resuming one that is subscribed changes nothing
    for subscriber in rec.subscribers(STEPPED).now:
        subscriber(0, None)
    assert heard == ["a", "b", "c"]


def test_per_optimizer_watchers_leave_the_step_topics_once_done_and_come_back_for_a_new_optimizer():
    from graddoctor.instrument.topics import STEP_BEGINS
    rec = Recorder(step_budget=None)
    with Instrumentation(rec):
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(40):
            optimizer.zero_grad()
            model(torch.ones(4, 3)).sum().backward()
            optimizer.step()
        begins = {getattr(s, "__qualname__", "") for s in rec.subscribers(STEP_BEGINS).now}
        stepped = {getattr(s, "__qualname__", "") for s in rec.subscribers(STEPPED).now}
        assert not {"DecayShareWatcher.before_step", "StepEditWatcher.before_step",
                    "CopyWatcher.before_step"} & begins, begins
        assert not {"SymmetryWatcher.after_step", "ParamNamer._name_after_first_step",
                    "StepEditWatcher.after_step", "CopyWatcher.after_step"} & stepped, stepped
        second = torch.optim.SGD(torch.nn.Linear(3, 2).parameters(), lr=0.1)
        begins = {getattr(s, "__qualname__", "") for s in rec.subscribers(STEP_BEGINS).now}
        stepped = {getattr(s, "__qualname__", "") for s in rec.subscribers(STEPPED).now}
        assert {"DecayShareWatcher.before_step", "StepEditWatcher.before_step"} <= begins, begins
        assert {"SymmetryWatcher.after_step", "ParamNamer._name_after_first_step",
                "StepEditWatcher.after_step"} <= stepped, stepped
        del second


def test_the_precision_hooks_stay_in_torch_when_a_second_thread_steps():
    # torch loops over its global hook dicts in every thread's step: taking a hook out while
    # another thread loops raises "OrderedDict mutated during iteration" in the script
    import threading

    from torch.optim.optimizer import _global_optimizer_pre_hooks
    rec = Recorder(step_budget=None)
    with Instrumentation(rec) as instrumentation:
        precision = next(w for w in instrumentation.watchers if type(w).__name__ == "PrecisionWatcher")

        def train():
            model = torch.nn.Linear(3, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(8):
                optimizer.zero_grad()
                model(torch.ones(4, 3)).sum().backward()
                optimizer.step()

        worker = threading.Thread(target=train)
        worker.start()
        worker.join()
        train()
        assert precision._pre in _global_optimizer_pre_hooks.values()


def test_the_precision_hooks_leave_torch_once_every_optimizer_is_checked_and_come_back_in_order():
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks
    rec = Recorder(step_budget=None)
    with Instrumentation(rec) as instrumentation:
        precision = next(w for w in instrumentation.watchers if type(w).__name__ == "PrecisionWatcher")
        pre_order, post_order = list(_global_optimizer_pre_hooks), list(_global_optimizer_post_hooks)
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(8):
            optimizer.zero_grad()
            model(torch.ones(4, 3)).sum().backward()
            optimizer.step()
        assert precision._pre not in _global_optimizer_pre_hooks.values()
        assert precision._post not in _global_optimizer_post_hooks.values()
        torch.optim.Adam(torch.nn.Linear(3, 2).half().parameters(), lr=0.1)  # a new one: back
        assert list(_global_optimizer_pre_hooks) == pre_order
        assert list(_global_optimizer_post_hooks) == post_order
