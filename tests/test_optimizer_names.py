"""Messages call an optimizer what the script calls it when its class alone is ambiguous."""

from __future__ import annotations

import os
import textwrap

from conftest import FIXTURES
from graddoctor import check_script

GAN = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    G = nn.Linear(4, 4)
    D = nn.Linear(4, 1)
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(
        D.parameters(), lr=1e-3)
    for step in range(6):
        opt_g.zero_grad()
        fake = G(torch.randn(8, 4))
        D(fake).mean().backward()  # D's gradients are never cleared
        opt_g.step()
        opt_d.step()
""")

SAME_NAME = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    models = [nn.Linear(4, 1), nn.Linear(4, 1)]
    opts = []
    for m in models:
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        opts.append(opt)
    for step in range(6):
        for m, opt in zip(models, opts):
            m(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
""")


def test_two_optimizers_of_one_class_are_named_by_their_variables(tmp_path):
    (tmp_path / "gan.py").write_text(GAN)
    report = check_script(str(tmp_path / "gan.py"), steps=5)
    a = report.analysis
    names = sorted(a.optimizer_name(opt) for opt in a.optimizers)
    assert names == ["opt_d (Adam)", "opt_g (Adam)"]  # a multi-line construction too
    assert report.findings and all("Adam #" not in f.message for f in report.findings)


def test_a_leak_message_names_the_step_by_its_variable():
    report = check_script(os.path.join(FIXTURES, "zero_grad", "bad_gan_discriminator_leak.py"), steps=6)
    (finding,) = [f for f in report.findings if f.rule == "missing-zero-grad"]
    assert "before opt_d (Adam) steps" in finding.message


def test_variables_that_do_not_tell_optimizers_apart_fall_back_to_numbers(tmp_path):
    (tmp_path / "same.py").write_text(SAME_NAME)
    report = check_script(str(tmp_path / "same.py"), steps=5)
    a = report.analysis
    assert sorted(a.optimizer_name(opt) for opt in a.optimizers) == ["SGD #0", "SGD #1"]
