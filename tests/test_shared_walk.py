"""The rules and analysis walk the user's files through ``analysis.source.walk`` and
``scope_walk``: the nodes of a shared parse are listed once per node, not rebuilt on every walk
(whole-file and per-function walks were half of a check's analysis). The listing must be what
``ast.walk`` gives, and a tree a rule parses itself (and may change) is never listed."""

from __future__ import annotations

import ast
import pathlib
import re
import textwrap

from graddoctor.analysis import source

ROOT = pathlib.Path(__file__).resolve().parent.parent



def _own_walks() -> set[str]:
    """source.py, which holds walk, and the modules it imports (they cannot import it back;
    they read their own parse, which walk would not list anyway)."""
    text = (ROOT / "graddoctor/analysis/source.py").read_text()
    imported = {f"graddoctor/analysis/{m}.py" for m in re.findall(r"^from \.(\w+) import", text, re.M)}
    return {"graddoctor/analysis/source.py", *imported}

SCRIPT = textwrap.dedent("""
    import torch
    model = torch.nn.Linear(2, 1)
    def step(x, y):
        def inner(z):
            return z * 2
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return [inner(v) for v in (1, 2)]
    class Box:
        def get(self):
            return lambda q: q + 1
    for epoch in range(2):
        step(torch.randn(4, 2), torch.randn(4, 1))
""")


def test_rules_and_analysis_walk_through_the_shared_walk():
    offenders = []
    for sub in ("graddoctor/rules", "graddoctor/analysis"):
        for path in sorted((ROOT / sub).glob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel not in _own_walks() and "ast.walk(" in path.read_text():
                offenders.append(rel)
    assert not offenders, f"use analysis.source.walk instead of ast.walk in {offenders}"


def _uncached_scope(node):
    stack = list(ast.iter_child_nodes(node))
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield n
        stack.extend(ast.iter_child_nodes(n))


def test_walks_of_a_shared_tree_list_what_ast_walk_lists():
    tree = source._tree(SCRIPT)
    fresh = ast.parse(SCRIPT)
    shared_nodes, fresh_nodes = list(source.walk(tree)), list(ast.walk(fresh))
    assert [ast.dump(n) for n in shared_nodes] == [ast.dump(n) for n in fresh_nodes]
    for node, twin in zip(shared_nodes, fresh_nodes):
        for _ in range(2):  # listed, then read from the listing
            assert [ast.dump(n) for n in source.walk(node)] == [ast.dump(n) for n in ast.walk(twin)]
            assert [ast.dump(n) for n in source.scope_walk(node)] == \
                [ast.dump(n) for n in _uncached_scope(twin)]
    assert isinstance(shared_nodes[5]._graddoctor_nodes, tuple)  # listed once, kept


def test_a_tree_parsed_elsewhere_is_walked_afresh():
    tree = ast.parse("a = b + c")
    assert len(list(source.walk(tree))) == len(list(ast.walk(tree)))
    assert not hasattr(tree, "_graddoctor_nodes")
    tree.body.append(ast.parse("d = 1").body[0])  # a rule's own tree may change
    assert any(isinstance(n, ast.Name) and n.id == "d" for n in source.walk(tree))
    assert any(isinstance(n, ast.Name) and n.id == "d" for n in source.scope_walk(tree))
