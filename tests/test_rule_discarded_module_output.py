"""discarded-module-output (GD249): ``output_discarded`` events read against the script's source
(a name never read, a bare call, a value passed on through a helper), and the watcher's graph
walk."""

from __future__ import annotations

import torch

from graddoctor import events as ev
from graddoctor.analysis import Analysis
from graddoctor.instrument.discarded import reached_nodes
from graddoctor.rules import find_rule
from graddoctor.trace import TraceBuilder

SLUG = "discarded-module-output"

SOURCE = "\n".join([
    "class Net(nn.Module):",                                  # 1
    "    def encode(self, tokens):",                          # 2
    "        _, h = self.encoder(self.embed(tokens))",         # 3
    "        return h[-1]",                                   # 4
    "",                                                       # 5
    "    def forward(self, premise, hypothesis):",            # 6
    "        prem = self.encode(premise)",                    # 7
    "        hypo = self.encode(hypothesis)",                 # 8
    "        self.dropout(prem)",                             # 9
    "        target = self.encoder(hypothesis).detach()",     # 10
    "        _ = self.backbone(premise)",                     # 11
    "        self.cache = self.norm(prem)",                   # 12
    "        return self.out(torch.cat([prem, prem], 1)), target",  # 13
    "",                                                       # 14
    "    def exits(self, h):",                                # 15
    "        outs = []",                                      # 16
    "        outs.append(self.head(h))",                      # 17
    "        return outs",                                    # 18
]) + "\n"


def _check(tmp_path, frames, leaf=True, module="GRU"):
    (tmp_path / "model.py").write_text(SOURCE)
    t = TraceBuilder("model.py")
    t.put(ev.output_discarded(module=module, leaf=leaf,
                              frames=[["model.py", line] for line in frames]), frames[0])
    return list(find_rule(SLUG)().check(Analysis(t.trace, base_dir=str(tmp_path))))


def test_a_value_passed_on_by_a_helper_and_dropped_by_its_caller(tmp_path):
    found = _check(tmp_path, [3, 8])
    assert [f.location.line for f in found] == [8]
    assert "`hypo` is never read" in found[0].message and "`hypo`" in found[0].fix


def test_a_bare_call_of_a_leaf_module(tmp_path):
    found = _check(tmp_path, [9], leaf=True, module="Dropout")
    assert [f.location.line for f in found] == [9] and "x = self.dropout(prem)" in found[0].fix
    # a module with children may be run for its hooks or side effects
    assert _check(tmp_path, [9], leaf=False, module="Sequential") == []


def test_values_the_script_reads_or_keeps_are_silent(tmp_path):
    assert _check(tmp_path, [3, 7]) == []   # prem is read
    assert _check(tmp_path, [10]) == []     # a detached target, read
    assert _check(tmp_path, [11]) == []     # `_`: on purpose
    assert _check(tmp_path, [12]) == []     # kept on the module
    assert _check(tmp_path, [3]) == []      # passed on by return, no caller frame says more
    assert _check(tmp_path, [17], leaf=True, module="Linear") == []  # kept in a list


def test_an_unreadable_source_is_silent(tmp_path):
    t = TraceBuilder("missing.py")
    t.put(ev.output_discarded(module="GRU", leaf=True, frames=[["missing.py", 8]]), 8)
    assert list(find_rule(SLUG)().check(Analysis(t.trace, base_dir=str(tmp_path)))) == []


def test_reached_nodes_walks_the_whole_graph_and_gives_up_past_its_limit():
    x = torch.randn(3, requires_grad=True)
    used, unused = x * 2, x * 3
    loss = (used.exp() + 1).sum()
    reached = reached_nodes([loss.grad_fn])
    assert id(used.grad_fn) in reached and id(unused.grad_fn) not in reached
    assert reached_nodes([loss.grad_fn], limit=2) is None
