"""episode-flag-never-reset (GD374): the source reading of episode loops inside outer loops."""

from __future__ import annotations

import ast
import textwrap

from graddoctor.rules.episode_flag_never_reset import flags_never_reset

BUG = """\
done = False
for n_epi in range(100):
    s = env.reset()
    while not done:
        s, r, done, info = env.step(pi(s))
    train()
"""


def found(src: str):
    return flags_never_reset(ast.parse(textwrap.dedent(src)))


def test_a_flag_set_once_before_the_episodes_is_found_at_its_setting():
    assert found(BUG) == [(1, "done", 4, 2)]
    inside = "def main():\n" + textwrap.indent(BUG, "    ")
    assert found(inside) == [(2, "done", 5, 3)]


def test_silent_when_the_outer_loop_sets_it_back_or_the_name_is_no_episodes():
    assert found(BUG.replace("    s = env.reset()\n", "    s, done = env.reset(), False\n")) == []
    assert found(BUG.replace("    s = env.reset()\n", "    s = env.reset()\n    done = False\n")) == []
    assert found(BUG.replace("done", "warmed_up")) == []
    assert found(BUG.replace("        s, r, done, info = env.step(pi(s))\n",
                             "        s = env.step(pi(s))\n")) == []  # nothing inside ends it


def test_a_flag_set_in_a_tuple_of_constants_counts_too():
    src = BUG.replace("done = False\n", "done, truncated = False, False\n")
    assert found(src) == [(1, "done", 4, 2)]


def test_a_module_flag_a_function_declares_global_counts_too():
    src = ("terminated = False\n"
           "def run():\n"
           "    global terminated\n"
           "    for ep in range(9):\n"
           "        while not terminated:\n"
           "            s, r, terminated = env.step(a)\n"
           "        train()\n")
    assert found(src) == [(1, "terminated", 5, 4)]
    reset = src.replace("        while", "        terminated = False\n        while")
    assert found(reset) == []
