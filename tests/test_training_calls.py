"""The one predicate of "a statement that trains", shared by the budget's later-phase wait and
the note for a phase the budget did not reach."""

from __future__ import annotations

import ast

from graddoctor.rules.notes import later_phases
from graddoctor.training_calls import backward_lines, block_of, functions_of, later_training_statements, trains

SCRIPT = """\
def step(model, batch):
    loss = model(batch)
    loss.backward()

def epoch(model, data):
    for batch in data:
        step(model, batch)

def deep(model, data):
    epoch(model, data)

def report(model):
    print(model)

for x in pretraining:
    loss = model(x)
    loss.backward()
    opt.step()
report(model)
trainer.fit(model)
hf_trainer.train()
model.train()
epoch(model, task_b)
deep(model, task_c)
"""


def _stmt(tree, line):
    return next(s for s in tree.body if s.lineno == line)


def test_a_statement_trains_through_a_backward_a_fit_or_a_function_two_calls_deep():
    tree = ast.parse(SCRIPT)
    functions = functions_of(tree)
    verdicts = {line: trains(_stmt(tree, line), functions) for line in (15, 19, 20, 21, 22, 23)}
    # report() does not train; model.train() only sets a mode; epoch() trains through step()
    assert verdicts == {15: True, 19: False, 20: True, 21: True, 22: False, 23: True}
    # deep -> epoch -> step is three calls: past the depth followed
    assert not trains(_stmt(tree, 24), functions)
    assert trains(_stmt(tree, 24), functions, depth=3)


def test_later_statements_skip_definitions_and_the_running_loop():
    tree = ast.parse(SCRIPT)
    assert block_of(tree, 17) is _stmt(tree, 15).body  # innermost: the loop's own body
    body = block_of(tree, 15)  # a compound statement's header: the block holding it
    assert body is tree.body
    lines = [s.lineno for s in later_training_statements(body, 18, functions_of(tree))]
    assert lines == [20, 21, 23]


def test_the_note_and_the_budget_read_the_same_later_phases():
    tree = ast.parse(SCRIPT)
    seen = set(backward_lines(_stmt(tree, 15)))
    assert seen == {17}
    assert later_phases(tree, seen) == [20, 21, 23]
