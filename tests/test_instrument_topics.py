"""Watchers talk through the recorder's topics: each one named in ``TOPICS``, published by one
watcher, subscribed to through ``Recorder.subscribe``."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

from graddoctor.instrument import Instrumentation
from graddoctor.instrument.recorder import TOPICS, Recorder

INSTRUMENT = pathlib.Path(__file__).resolve().parent.parent / "graddoctor" / "instrument"


def test_every_topic_has_one_publisher_and_every_published_topic_is_named():
    published: dict[str, list[str]] = {}
    for path in INSTRUMENT.glob("*.py"):
        for topic in re.findall(r"\.subscribers\(\"(\w+)\"\)", path.read_text()):
            published.setdefault(topic, []).append(path.name)
    assert set(published) == set(TOPICS)
    assert all(len(files) == 1 for files in published.values()), published


def test_an_unknown_topic_is_refused():
    with pytest.raises(KeyError):
        Recorder(step_budget=None).subscribe("steped", print)


def test_subscribers_hear_the_optimizers_topics_in_order():
    rec = Recorder(step_budget=None)
    heard = []
    with Instrumentation(rec):
        rec.subscribe("params_added", lambda opt, pids: heard.append(("added", opt, pids)))
        rec.subscribe("stepped_without_grad", lambda opt, pids: heard.append(("without", opt, pids)))
        rec.subscribe("stepped", lambda opt, optimizer: heard.append(("stepped", opt, type(optimizer))))
        used, idle = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
        optimizer = torch.optim.SGD([used, idle], lr=0.1)
        used.sum().backward()
        optimizer.step()
    assert heard == [("added", 0, [0, 1]), ("without", 0, [1]), ("stepped", 0, torch.optim.SGD)]
