"""generator-helps-discriminator (GD257): what the adversarial watcher (instrument/adversarial.py)
records of a discriminator evaluated on a generator's samples in both players' steps, and the
rule over hand-written traces."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from graddoctor import events as ev
from graddoctor.findings import Severity
from graddoctor.instrument import Instrumentation, Recorder
from graddoctor.instrument.adversarial import _affine
from rule_traces import findings, only
from graddoctor.trace import TraceBuilder

SLUG = "generator-helps-discriminator"


def _gan(g_loss, d_loss=None, seed=0, iterations=3):
    rec = Recorder(step_budget=None)
    torch.manual_seed(seed)
    with Instrumentation(rec):
        G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
        D = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
        opt_g = torch.optim.Adam(G.parameters(), lr=2e-4)
        opt_d = torch.optim.Adam(D.parameters(), lr=2e-4)
        ones, zeros = torch.ones(32, 1), torch.zeros(32, 1)
        for _ in range(iterations):
            real = torch.randn(32, 2) + 2
            fake = G(torch.randn(32, 4))
            loss = (d_loss or (lambda D, real, fake: F.binary_cross_entropy_with_logits(D(real), ones)
                               + F.binary_cross_entropy_with_logits(D(fake.detach()), zeros)))(D, real, fake)
            opt_d.zero_grad()
            loss.backward()
            opt_d.step()
            loss = g_loss(D, fake, ones, zeros)
            opt_g.zero_grad()
            loss.backward()
            opt_g.step()
    return [e for e in rec.trace if e.kind == "gan_same_target"]


def test_a_generator_given_the_fake_label_is_recorded_once():
    found = _gan(lambda D, fake, ones, zeros: F.binary_cross_entropy_with_logits(D(fake), zeros))
    assert len(found) == 1
    assert found[0]["cosine"] > 0.99 and found[0]["offset"] < 0.1 and found[0]["samples"] == 32
    assert found[0]["critic"] == found[0]["generator"] == "Sequential"


def test_a_wgan_generator_with_the_critics_sign_is_recorded():
    wgan_d = lambda D, real, fake: D(fake.detach()).mean() - D(real).mean()  # noqa: E731
    assert len(_gan(lambda D, fake, ones, zeros: D(fake).mean(), d_loss=wgan_d)) == 1
    assert _gan(lambda D, fake, ones, zeros: -D(fake).mean(), d_loss=wgan_d) == []


def test_the_generator_losses_that_oppose_the_discriminator_record_nothing():
    bce = F.binary_cross_entropy_with_logits
    assert _gan(lambda D, fake, ones, zeros: bce(D(fake), ones)) == []  # non-saturating
    assert _gan(lambda D, fake, ones, zeros: -bce(D(fake), zeros)) == []  # minimax


def test_a_least_squares_gan_below_both_targets_is_told_by_the_offset():
    lsgan_d = lambda D, real, fake: F.mse_loss(D(real), torch.ones(32, 1)) + F.mse_loss(  # noqa: E731
        D(fake.detach()), torch.zeros(32, 1))
    for seed in range(4):
        assert _gan(lambda D, fake, ones, zeros: F.mse_loss(D(fake), ones), d_loss=lsgan_d, seed=seed) == []
        assert len(_gan(lambda D, fake, ones, zeros: F.mse_loss(D(fake), zeros), d_loss=lsgan_d,
                        seed=seed)) == 1


def test_the_affine_fit_tells_a_scaled_gradient_from_a_shifted_one():
    d = torch.tensor([-0.3, -0.2, -0.25, -0.1, -0.15], dtype=torch.float64)
    assert _affine(d, 0.5 * d)[1] < 1e-9  # one target: scaled
    assert _affine(d, d - 1)[1] > 0.5  # least squares toward another target: shifted
    assert _affine(torch.full((4,), 0.25, dtype=torch.float64), torch.full((4,), 0.25,
                                                                          dtype=torch.float64)) == (0.0, None)


def _trace(d_opt=0, g_opt=1, step_both=True):
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=1)
    if g_opt != d_opt:
        t.optimizer(1, [2, 3], line=2)
    t.put(ev.gan_same_target(critic="Disc", generator="Gen", critic_params=[0, 1],
                             generator_params=[2, 3], cosine=0.999, offset=0.004, samples=64,
                             critic_step=["train.py", 12]), line=20)
    for opt in ((0, 1) if step_both else (0,)):
        t.backward(fresh=[0, 1] if opt == 0 else [2, 3], line=21)
        t.step(opt, line=22)
    return t


def test_the_rule_warns_at_the_generators_call_of_the_discriminator():
    f = only(_trace(), SLUG)
    assert f.severity is Severity.WARNING and f.location.line == 20
    assert "Disc" in f.message and "Gen" in f.message and "cosine 1.00" in f.message
    assert f.related and f.related[0].location.line == 12


def test_silent_with_one_optimizer_for_both_or_a_player_never_stepped():
    t = TraceBuilder()
    t.optimizer(0, [0, 1, 2, 3], line=1)
    t.put(ev.gan_same_target(critic="Disc", generator="Gen", critic_params=[0, 1],
                             generator_params=[2, 3], cosine=0.999, offset=0.004, samples=64,
                             critic_step=None), line=20)
    t.backward(fresh=[0, 1, 2, 3], line=21)
    t.step(0, line=22)
    assert findings(t, SLUG) == []
    assert findings(_trace(step_both=False), SLUG) == []


def test_a_discriminator_that_labels_the_generated_samples_real_is_told_apart():
    bce = F.binary_cross_entropy_with_logits
    d_wrong = lambda D, real, fake: bce(D(real), torch.ones(32, 1)) + bce(D(fake.detach()), torch.ones(32, 1))  # noqa: E731
    (found,) = _gan(lambda D, fake, ones, zeros: bce(D(fake), ones), d_loss=d_wrong)
    assert found["critic_fake_as_real"] is True
    (found,) = _gan(lambda D, fake, ones, zeros: bce(D(fake), zeros))  # the generator's fault
    assert found["critic_fake_as_real"] is False


def test_the_rule_points_at_the_discriminators_step_when_its_loss_is_the_wrong_one():
    t = TraceBuilder()
    t.optimizer(0, [0, 1], line=1)
    t.optimizer(1, [2, 3], line=2)
    t.put(ev.gan_same_target(critic="Disc", generator="Gen", critic_params=[0, 1],
                             generator_params=[2, 3], cosine=0.999, offset=0.004, samples=64,
                             critic_step=["train.py", 12], critic_fake_as_real=True), line=20)
    t.backward(fresh=[0, 1, 2, 3], line=21)
    t.step(0, line=22)
    t.step(1, line=23)
    f = only(t, SLUG)
    assert f.location.line == 12 and "real label" in f.message and "zeros" in f.fix
    assert f.related and f.related[0].location.line == 20


def test_the_fake_terms_target_is_read_from_the_real_terms_line():
    from graddoctor.instrument.adversarial import _same_target
    x_real = torch.linspace(-0.4, 0.3, 32, dtype=torch.float64)
    x_fake = torch.linspace(-0.6, -0.1, 32, dtype=torch.float64)  # below both targets
    mse = lambda x, t: 2 * (x - t) / 32  # noqa: E731
    # least squares: the fake term pushed toward 0 has the real term's sign here, not its target
    assert _same_target((x_real, mse(x_real, 1.0)), (x_fake, mse(x_fake, 0.0))) is False
    assert _same_target((x_real, mse(x_real, 1.0)), (x_fake, mse(x_fake, 1.0))) is True
    logistic = lambda x, y: (torch.sigmoid(x) - y) / 32  # noqa: E731
    assert _same_target((x_real, logistic(x_real, 1.0)), (x_fake, logistic(x_fake, 0.0))) is False
    assert _same_target((x_real, logistic(x_real, 1.0)), (x_fake, logistic(x_fake, 1.0))) is True
    wgan = torch.full((32,), -1 / 32, dtype=torch.float64)
    assert _same_target((x_real, wgan), (x_fake, -wgan)) is False
    assert _same_target((x_real, wgan), (x_fake, wgan)) is True
    assert _same_target(None, (x_fake, wgan)) is None


def test_target_filled_before_finds_the_in_place_fill_of_the_loss_target(tmp_path):
    from graddoctor.analysis.source import target_filled_before
    path = tmp_path / "dcgan.py"
    path.write_text(
        "for real in loader:\n"                                   # 1
        "    label = torch.full((32,), 1.0)\n"                    # 2
        "    netG.zero_grad()\n"                                  # 3
        "    label.fill_(fake_label)  # the slip\n"               # 4
        "    output = netD(fake)\n"                               # 5
        "    errG = criterion(output, label)\n"                   # 6
        "    label = torch.ones(32)\n"                            # 7
        "    output = netD(fake)\n"                               # 8
        "    errG = criterion(output, label)\n"                   # 9
        "    output = netD(fake)\n"                               # 10
        "    errG = criterion(output)\n")                         # 11
    assert target_filled_before(str(path), 5) == (4, "label.fill_(fake_label)", "label")
    assert target_filled_before(str(path), 8) is None  # bound again, not filled
    assert target_filled_before(str(path), 10) is None  # no second argument
    assert target_filled_before(str(path), 6) is None  # not a model call bound to a name
    assert target_filled_before(str(tmp_path / "missing.py"), 5) is None


def test_target_filled_before_reads_a_model_call_inside_the_loss_call(tmp_path):
    from graddoctor.analysis.source import target_filled_before
    path = tmp_path / "dcgan.py"
    path.write_text(
        "for real in loader:\n"                                   # 1
        "    netG.zero_grad()\n"                                  # 2
        "    label.fill_(fake_label)\n"                           # 3
        "    errG = criterion(netD(fake), label)\n"               # 4
        "    label = torch.ones(32)\n"                            # 5
        "    errG = criterion(netD(fake), label)\n"               # 6
        "    errG = criterion(netD(fake), torch.ones(32))\n")     # 7
    assert target_filled_before(str(path), 4) == (3, "label.fill_(fake_label)", "label")
    assert target_filled_before(str(path), 6) is None  # bound again, not filled
    assert target_filled_before(str(path), 7) is None  # no target by name


# -- each step on its own noise: compared by the sign of a constant gradient -----------------

def _fresh_noise_gan(g_loss, d_loss):
    """Like ``_gan``, but the generator's step draws its own noise: D never sees one batch of
    generated samples both detached and not."""
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
        D = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
        opt_g = torch.optim.Adam(G.parameters(), lr=2e-4)
        opt_d = torch.optim.Adam(D.parameters(), lr=2e-4)
        ones, zeros = torch.ones(32, 1), torch.zeros(32, 1)
        for _ in range(3):
            for _ in range(2):
                real = torch.randn(32, 2) + 2
                fake = G(torch.randn(32, 4)).detach()
                loss = d_loss(D, real, fake, ones, zeros)
                opt_d.zero_grad()
                loss.backward()
                opt_d.step()
            loss = g_loss(D, G(torch.randn(32, 4)), ones, zeros)
            opt_g.zero_grad()
            loss.backward()
            opt_g.step()
    return [e for e in rec.trace if e.kind == "gan_same_target"]


def test_a_wgan_generator_with_the_critics_sign_on_fresh_noise_is_recorded():
    wgan_d = lambda D, real, fake, ones, zeros: D(fake).mean() - D(real).mean()  # noqa: E731
    found = _fresh_noise_gan(lambda D, fake, ones, zeros: D(fake).mean(), wgan_d)
    assert len(found) == 1 and found[0]["same_samples"] is False
    assert _fresh_noise_gan(lambda D, fake, ones, zeros: -D(fake).mean(), wgan_d) == []


def test_logistic_and_least_squares_targets_are_read_from_each_calls_outputs():
    # with different samples, each call's target is read from its own line of gradients
    # against outputs (in the sigmoid for a logistic loss, in the output for least squares)
    bce = F.binary_cross_entropy_with_logits
    bce_d = lambda D, real, fake, ones, zeros: bce(D(real), ones) + bce(D(fake), zeros)  # noqa: E731
    found = _fresh_noise_gan(lambda D, fake, ones, zeros: bce(D(fake), zeros), bce_d)
    assert len(found) == 1 and found[0]["same_samples"] is False
    assert _fresh_noise_gan(lambda D, fake, ones, zeros: bce(D(fake), ones), bce_d) == []
    assert _fresh_noise_gan(lambda D, fake, ones, zeros: -bce(D(fake), zeros), bce_d) == []
    ls_d = lambda D, real, fake, ones, zeros: ((D(real) - 1) ** 2).mean() + (D(fake) ** 2).mean()  # noqa: E731
    assert _fresh_noise_gan(lambda D, fake, ones, zeros: ((D(fake) - 1) ** 2).mean(), ls_d) == []
    assert len(_fresh_noise_gan(lambda D, fake, ones, zeros: (D(fake) ** 2).mean(), ls_d)) == 1


def test_constant_level_reads_one_value_or_none():
    from graddoctor.instrument.adversarial import _constant_level
    assert _constant_level(torch.full((32,), 1 / 32, dtype=torch.double)) == 1 / 32
    hinge = torch.cat([torch.full((20,), -1 / 32), torch.zeros(12)]).double()
    assert _constant_level(hinge) == -1 / 32
    assert _constant_level(torch.linspace(0.1, 0.9, 32).double()) is None
    assert _constant_level(torch.cat([torch.full((4,), 0.5), torch.zeros(28)]).double()) is None


class _Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 5, padding=2)
        self.out = nn.Conv1d(4, 1, 3, padding=1)

    def forward(self, x):
        feat = F.leaky_relu(self.conv(x.unsqueeze(1)), 0.1)
        return self.out(feat).flatten(1), [feat]


class _TwoScales(nn.Module):
    """A vocoder's multi-scale discriminator: called on (real, generated), it returns lists of
    scores and feature maps for each, no one tensor."""

    def __init__(self):
        super().__init__()
        self.scales = nn.ModuleList([_Scale(), _Scale()])
        self.pool = nn.AvgPool1d(4, 2, padding=2)

    def forward(self, y, y_hat):
        real, fake, fmaps = [], [], []
        for i, d in enumerate(self.scales):
            if i:
                y, y_hat = self.pool(y.unsqueeze(1)).squeeze(1), self.pool(y_hat.unsqueeze(1)).squeeze(1)
            r, _ = d(y)
            g, fm = d(y_hat)
            real.append(r); fake.append(g); fmaps.append(fm)
        return real, fake, fmaps


def _vocoder(g_target: float, crop: bool = True):
    rec = Recorder(step_budget=None)
    torch.manual_seed(0)
    with Instrumentation(rec):
        G = nn.Sequential(nn.ConvTranspose1d(4, 1, 8, 4, padding=2), nn.Tanh())
        D = _TwoScales()
        opt_g = torch.optim.Adam(G.parameters(), lr=2e-4)
        opt_d = torch.optim.Adam(D.parameters(), lr=2e-4)
        for _ in range(3):
            y = torch.tanh(torch.randn(8, 60))
            out = G(torch.randn(8, 4, 16)).squeeze(1)
            y_hat = out[:, :60] if crop else out[:, 2:62]  # trimmed to the data's length
            real, fake, _ = D(y, y_hat.detach())
            loss = sum(((1 - r) ** 2).mean() + (g ** 2).mean() for r, g in zip(real, fake))
            opt_d.zero_grad()
            loss.backward()
            opt_d.step()
            _, fake, _ = D(y, y_hat)
            loss = sum(((g - g_target) ** 2).mean() for g in fake)
            opt_g.zero_grad()
            loss.backward()
            opt_g.step()
    return [e for e in rec.trace if e.kind == "gan_same_target"]


def test_the_scales_of_a_discriminator_returning_lists_are_compared_on_a_cropped_sample():
    found = _vocoder(g_target=0.0)  # the generator regressed to the fake target
    assert len(found) == 1 and found[0]["critic"] == "_Scale" and found[0]["generator"] == "Sequential"
    assert _vocoder(g_target=1.0) == []  # the real target: the generator opposes D


def test_a_sample_cut_from_inside_the_output_is_not_taken_for_it():
    # a crop that does not start where the output does reads other memory: not the sample
    assert _vocoder(g_target=0.0, crop=False) == []


def test_adversarial_term_after_finds_the_term_taken_from_the_bound_outputs(tmp_path):
    from graddoctor.analysis.source import adversarial_term_after
    script = tmp_path / "vocoder.py"
    script.write_text(
        "for step in range(3):\n"                                                   # 1
        "    _, fake_scores, fmap_r, fmap_g = mpd(wav, wav_hat)\n"                  # 2
        "    loss_fm = sum(F.l1_loss(g, r.detach()) for r, g in zip(fmap_r, fmap_g))\n"  # 3
        "    loss_adv = sum(bce(g, torch.zeros_like(g)) for g in fake_scores)\n"    # 4
        "    loss = loss_adv + loss_fm\n"                                           # 5
        "    out = D(fake)\n"                                                       # 6
        "    err = criterion(out, label)\n"                                         # 7
        "    g = D(fake); lg = (g ** 2).mean()\n")                                  # 8
    # the feature-matching term's target is data: passed over for the adversarial term
    assert adversarial_term_after(str(script), 2) == (
        4, "loss_adv = sum((bce(g, torch.zeros_like(g)) for g in fake_scores))")
    assert adversarial_term_after(str(script), 6) is None  # the target is a name: not told here
    assert adversarial_term_after(str(script), 3) is None  # no later statement reads loss_fm against a constant
