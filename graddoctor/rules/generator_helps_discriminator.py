from __future__ import annotations

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule


class GeneratorHelpsDiscriminator(Rule):
    """
    ## What it does
    Finds a GAN whose generator is trained toward the discriminator's own target for the
    generated samples: `g_loss = bce(D(G(z)), zeros)` with the label of D's fake term, an LSGAN
    generator regressed to the fake label, a WGAN generator loss with its sign flipped
    (`D(G(z)).mean()`). At the first backwards graddoctor notes a module D evaluated on another
    module G's output twice: detached (D's step) and with the gradient flowing into G (G's
    step). The gradient each backward gives D's output on the same samples is compared: when
    they point the same way (cosine near 1) while D and G are stepped by different optimizers,
    G's loss pulls D's output where D's loss does. It points at G's step's call of D. When
    each step draws its own noise (a WGAN-GP's critic loop, then a fresh `z` for G), the two
    calls never see the same samples; where both gradients are one constant on every sample (a
    critic's mean: `D(fake).mean()` gives each output 1/N whatever the samples), their signs
    are compared instead; for a logistic or squared-error loss, each call's target is read from
    its own gradients against its outputs (a line in the sigmoid or in the output), and the two
    targets are compared.

    The same agreement arises when the discriminator's loss is the wrong one, labelling the
    generated samples real (`bce(D(fake.detach()), ones)`): then D's own backward gives its
    output on the generated samples the gradients of the real samples' target, and the finding
    points at D's step instead. When the generator's loss takes a target tensor filled in place
    just before (pytorch/examples' DCGAN: `label.fill_(fake_label)` where `real_label` was
    meant), the finding points at that fill. When G's call of D only binds D's outputs to names
    (a vocoder's `_, fake_scores, fmap_r, fmap_g = mpd(y, y_hat)`), it points at the statement
    below that takes the generator's term from them against a constant target. A discriminator
    whose output is no one tensor (lists of scores and feature maps for the real and the
    generated samples) is compared through its parts called on the generated samples (each
    scale or period); a generated sample trimmed to the data's length (`y_hat[:, :n]`) is
    still the generator's output.

    ## Why is this bad?
    The discriminator learns to call the generated samples fake, and the generator, instead of
    fooling it, learns to make samples the discriminator finds even more fake. Both losses go
    down together, which looks like healthy training; the samples never approach the data.

    ## Example
    ```python
    d_loss = bce(D(real), ones) + bce(D(fake.detach()), zeros)
    ...
    g_loss = bce(D(fake), zeros)
    ```

    ## Use instead
    ```python
    g_loss = bce(D(fake), ones)  # the non-saturating loss: the label of real samples
    ```

    ## Stays silent on
    The non-saturating loss (`ones`), the minimax form (`-bce(D(fake), zeros)`), WGAN's
    `-D(fake).mean()` (with fresh noise for each step too), hinge and least-squares losses with
    the real target, one optimizer for
    both networks, a critic trained several times on the same detached samples, and a
    discriminator never called on the generator's output directly.
    """

    code = "GD257"
    slug = "generator-helps-discriminator"
    severity = Severity.WARNING
    summary = ("the generator's loss pushes the discriminator's output on generated samples the "
               "way the discriminator's own loss does: the generator is trained to look fake")
    fix = ("train the generator toward the real target: bce(D(fake), ones) (or -D(fake).mean() "
           "for a WGAN critic, -bce(D(fake), zeros) for the minimax form)")

    def check(self, a):
        for event in a.by_kind.get("gan_same_target", ()):
            critic = {o for p in event["critic_params"] for o in a.owners.get(p, ())}
            generator = {o for p in event["generator_params"] for o in a.owners.get(p, ())}
            if not critic or not generator or critic & generator:
                continue  # one optimizer for both, or a side no optimizer trains
            if not _stepped(a, critic) or not _stepped(a, generator):
                continue
            d_step = event.get("critic_step")
            if event.get("critic_fake_as_real") and d_step:
                # D's own loss pushes its output on real and generated samples one way: its
                # target for the generated ones is the real label, and G's (right) loss agrees
                yield self.finding(
                    f"the discriminator's loss here gives the samples {event['generator']} made "
                    f"the real label: it pushes {event['critic']}'s output on them the same way "
                    f"as on the real samples (and the same way the generator's loss does, cosine "
                    f"{event['cosine']:.2f} over {event['samples']} samples), so the "
                    f"discriminator never learns to tell them apart and the generator gets no "
                    f"signal",
                    Location(d_step[0], d_step[1]),
                    related=(Related(event.loc, "the generator's step, whose target agrees")
                             if event.loc is not None else None,),
                    fix="give the generated samples the fake target in the discriminator's "
                        "loss, the one its fake term is meant to have: zeros for a BCE or "
                        "least-squares D (bce(D(fake.detach()), zeros)), + D(fake.detach()).mean() "
                        "for a WGAN critic",
                    evidence={"critic": event["critic"], "generator": event["generator"],
                              "cosine": event["cosine"], "samples": event["samples"],
                              "wrong": "critic"})
                return
            same = event.get("same_samples", True)
            related = ()
            if d_step and event.loc is not None and (d_step[0], d_step[1]) != (event.loc.path, event.loc.line):
                related = (Related(Location(d_step[0], d_step[1]),
                                   "the discriminator's own step on the same samples" if same else
                                   "the discriminator's own step on its generated samples"),)
            agreement = (f"(cosine {event['cosine']:.2f} over {event['samples']} samples)" if same else
                         f"(on samples of their own, each step drawing fresh noise: the "
                         f"gradients both losses give its output on {event['samples']} samples "
                         f"point the same way — one sign for a critic's mean, one target read "
                         f"from each call's gradients against its outputs for a logistic or "
                         f"squared-error loss)")
            loc, fix, filled, term = event.loc, None, None, None
            if loc is not None:
                filled = a.source.target_filled_before(loc.path, loc.line)
                if filled is None:
                    term = a.source.adversarial_term_after(loc.path, loc.line)
            if term is not None:
                # D's outputs bound to names, the generator's term taken from them below: that
                # term's target is the line to change
                related = (Related(loc, "the discriminator's call on the generated samples"), *related)
                loc = Location(loc.path, term[0])
            if filled is not None:
                # the target tensor is filled in place just before (pytorch/examples' DCGAN:
                # `label.fill_(real_label)`): that fill is the line to change
                related = (Related(loc, "the discriminator's call on the generated samples, "
                                        f"whose loss takes `{filled[2]}`"), *related)
                loc = Location(loc.path, filled[0])
                fix = (f"fill `{filled[2]}` with the real label here, before the generator's loss "
                       f"(`{filled[2]}.fill_(real_label)`: fake labels are real for the "
                       f"generator's cost)")
            yield self.finding(
                ("the generator's loss here pushes " if filled is None and term is None else
                 f"the generator's term here, on the discriminator's outputs at line {event.loc.line}, pushes "
                 if filled is None else
                 f"the generator's loss on the discriminator's call at line {event.loc.line} pushes ")
                + f"{event['critic']}'s output on the samples "
                f"{event['generator']} made the same way as the discriminator's own loss does "
                f"{agreement}"
                + (f": `{filled[1]}` gives the generator's loss the discriminator's target for "
                   f"fake samples" if filled is not None else
                   ": the generator is trained toward the discriminator's target for fake samples")
                + ", so it learns to look fake instead of real",
                loc, related=related, fix=fix,
                evidence={"critic": event["critic"], "generator": event["generator"],
                          "cosine": event["cosine"], "samples": event["samples"],
                          "critic_params": a.param_names(event["critic_params"][:4]),
                          "generator_params": a.param_names(event["generator_params"][:4])})
            return


def _stepped(a, opts: set[int]) -> bool:
    return any(s["opt"] in opts and not s.get("skipped") for s in a.steps)
