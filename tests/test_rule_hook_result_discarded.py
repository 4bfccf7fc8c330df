"""hook-result-discarded (GD363): forward hooks whose edit stays in a local name, read from the
script's source."""

from __future__ import annotations

import ast
import textwrap

import pytest

from graddoctor.rules.hook_result_discarded import _hook_functions, discarded_edit


def _found(code: str):
    tree = ast.parse(textwrap.dedent(code))
    return [discarded_edit(function, index) for _, function, index in _hook_functions(tree)]


def test_rebound_output_is_found():
    code = """
    def add(module, inputs, output):
        output = output + steer
    layer.register_forward_hook(add)
    """
    assert _found(code) == [(3, "output = output + steer")]


def test_pre_hook_and_method_hook():
    code = """
    def mask(module, args):
        args = (args[0] * m,)
    layer.register_forward_pre_hook(mask)

    class W:
        def __init__(self, layer):
            layer.register_forward_hook(self.inject)

        def inject(self, module, inp, out):
            out = out * self.scale
    """
    assert _found(code) == [(3, "args = (args[0] * m,)"), (11, "out = out * self.scale")]


@pytest.mark.parametrize("body", [
    "output = output + steer\n    return output",   # returned
    "return output + steer",
    "output.add_(steer)",                             # in place
    "output += steer",
    "output[:, 0] = 0",
    "output = output[0]\n    cache['h'] = output",     # unpacked for reading
    "hidden = output + steer",                        # another name: not a rebinding of it
])
def test_silent_on(body):
    code = f"def hook(module, inputs, output):\n    {body}\nlayer.register_forward_hook(hook)\n"
    assert _found(code) == [None]


def test_with_kwargs_and_twice_defined_names_are_left_out():
    code = """
    def hook(module, args, kwargs, output):
        output = output + 1
    layer.register_forward_hook(hook, with_kwargs=True)
    """
    assert _found(code) == []
    code = """
    def hook(module, inputs, output):
        output = output + 1
    def hook(module, inputs, output):
        return output
    layer.register_forward_hook(hook)
    """
    assert _found(code) == []
