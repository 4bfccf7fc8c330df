"""log-scale-used-as-scale (GD331): the source reading on draws and distributions."""

from __future__ import annotations

import ast

from graddoctor.rules.log_scale_used_as_scale import log_scales_used_as_scales


def found(src: str):
    return log_scales_used_as_scales(ast.parse(src))


def test_a_log_variance_multiplying_the_noise_is_found_in_either_order():
    assert found("z = mu + logvar * torch.randn_like(mu)\n") == [
        (1, "mu + logvar * torch.randn_like(mu)", "logvar")]
    assert len(found("z = self.mu + eps * self.log_sigma\n")) == 1
    assert len(found("a = mean + noise * out['log_std']\n")) == 1


def test_a_distribution_given_a_log_std_as_its_scale_is_found():
    assert len(found("d = Normal(mean, log_std)\n")) == 1
    assert len(found("d = torch.distributions.Normal(loc=m, scale=self.logstd)\n")) == 1


def test_silent_when_the_log_is_exponentiated_or_the_names_say_nothing_of_a_log():
    for src in ("z = mu + torch.exp(0.5 * logvar) * eps\n",
                "std = logvar.mul(0.5).exp_()\nz = mu + std * eps\n",
                "d = Normal(mean, log_std.exp())\n",
                "z = mu + sigma * torch.randn_like(mu)\n",
                "y = logvar * 2 + mu\n",
                "loss = recon + beta * logvar.mean()\n"):
        assert found(src) == [], src
