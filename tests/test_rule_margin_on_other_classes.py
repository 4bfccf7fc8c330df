"""margin-on-other-classes (GD364): margin-softmax heads whose one-hot mask puts the margin on
the wrong classes, read from the script's source."""

from __future__ import annotations

import ast
import textwrap

import pytest

from graddoctor.rules.margin_on_other_classes import margin_on_other_classes


def _found(body: str):
    code = "def head(self, cosine, label):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    function = ast.parse(code).body[0]
    return [line for line, _ in margin_on_other_classes(function)]


@pytest.mark.parametrize("body", [
    """
    phi = cosine * self.cos_m - sine * self.sin_m
    one_hot = torch.zeros_like(cosine).scatter_(1, label.view(-1, 1), 1)
    return (1.0 - one_hot) * phi + one_hot * cosine
    """,
    """
    one_hot = F.one_hot(label, 10).float()
    return self.s * (cosine - (1 - one_hot) * self.m)
    """,
    """
    target = torch.cos(torch.acos(cosine) + margin)
    mask = torch.zeros_like(cosine).scatter_(1, label[:, None], 1.0)
    return torch.where(mask.bool(), cosine, target)
    """,
])
def test_margin_under_the_complement_is_found(body):
    assert len(_found(body)) == 1


@pytest.mark.parametrize("body", [
    """
    phi = cosine * self.cos_m - sine * self.sin_m
    one_hot = torch.zeros_like(cosine).scatter_(1, label.view(-1, 1), 1)
    return one_hot * phi + (1.0 - one_hot) * cosine
    """,
    """
    one_hot = F.one_hot(label, 10).float()
    return self.s * (cosine - one_hot * self.m)
    """,
    """
    one_hot = F.one_hot(label, 10).bool()
    return torch.where(one_hot, torch.cos(torch.acos(cosine) + self.m), cosine)
    """,
    # circle loss: both sides read a margin
    """
    one_hot = F.one_hot(label, 10).float()
    logit_p = ap * (cosine - (1 - self.m))
    logit_n = an * (cosine - self.m)
    return one_hot * logit_p + (1 - one_hot) * logit_n
    """,
    # a blend of two values without a margin (mixup-like targets)
    """
    one_hot = F.one_hot(label, 10).float()
    return one_hot * teacher + (1 - one_hot) * smooth
    """,
])
def test_silent_on(body):
    assert _found(body) == []
