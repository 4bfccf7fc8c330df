"""The run note for a later phase of the script that the step budget kept from running (an EWC
second task, a fine-tuning stage after pre-training)."""

from __future__ import annotations

import ast

from graddoctor.rules.notes import later_phases

TWO_TASKS = """\
import torch
for step in range(20):
    loss = f(a)
    loss.backward()
    opt.step()
fisher = estimate()
for step in range(20):
    loss = f(b) + penalty()
    loss.backward()
    opt.step()
"""

ONE_LOOP = """\
for epoch in range(3):
    for x, y in loader:
        loss = f(x, y)
        loss.backward()
        opt.step()
evaluate()
"""

HELPER = """\
def finetune(model, data):
    for x in data:
        loss = model(x)
        loss.backward()
        opt.step()

for x in pretraining:
    loss = model(x)
    loss.backward()
    opt.step()
finetune(model, task_b)
"""


def test_a_second_training_loop_after_the_one_that_ran_is_a_later_phase():
    assert later_phases(ast.parse(TWO_TASKS), {4}) == [9]
    assert later_phases(ast.parse(TWO_TASKS), {4, 9}) == []


def test_one_loop_has_no_later_phase():
    assert later_phases(ast.parse(ONE_LOOP), {4}) == []


def test_a_call_of_a_training_function_after_the_loop_that_ran_is_a_later_phase():
    assert later_phases(ast.parse(HELPER), {9}) == [11]
    # the same function called twice is not told apart: which call was running is not recorded
    assert later_phases(ast.parse(HELPER), {4}) == []
