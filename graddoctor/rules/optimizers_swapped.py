from __future__ import annotations

from ..findings import Role, Severity
from .base import Rule, related


class OptimizersSwapped(Rule):
    """
    ## What it does
    Finds two optimizers whose steps are crossed: each loss's backward is followed by the step
    of the optimizer that trains the *other* model. An optimizer steps right after a backward
    that reached none of its parameters but wrote those of another optimizer, and that other
    optimizer steps only later, after a backward that wrote the first one's parameters (and
    before the first one steps again). Typical: a GAN's optimizers unpacked in the wrong order
    (`opt_g, opt_d = self.optimizers()` while `configure_optimizers` returns
    `[opt_d, opt_g]`), or `d_loss.backward(); opt_g.step()`. It points at each of the two
    steps.

    ## Why is this bad?
    Each model is updated with whatever its gradients hold when the other loss's backward is
    done: a gradient left from an earlier update, a gradient of the wrong loss, or nothing at
    all when its gradients were cleared right before (the model never moves). Both scripts run,
    the losses are logged, and the training silently does something else than written.

    ## Example
    ```python
    opt_d.zero_grad()
    d_loss.backward()
    opt_g.step()            # the generator's optimizer after the discriminator's loss
    opt_g.zero_grad()
    g_loss.backward()
    opt_d.step()
    ```

    ## Use instead
    ```python
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
    ```

    ## Stays silent on
    Correct GANs (also a generator loss backpropagated through D whose gradients on D are
    then cleared); alternating updates where a model skips steps on purpose (a critic stepped
    five times per generator step); an optimizer stepped without a gradient next to the one
    that got the phase's gradient (a head unused this iteration); two optimizers over one
    model's parameter groups, both stepped after one backward; an optimizer stepped at the end
    of an accumulation window while another steps after every micro-batch; Lightning's
    automatic optimisation, and its manual optimisation with the optimizers unpacked in the
    order `configure_optimizers` returns them.
    """

    code = "GD161"
    slug = "optimizers-swapped"
    severity = Severity.ERROR
    summary = ("each loss's backward is followed by the other model's optimizer step: the two "
               "optimizers' steps are crossed")
    fix = ("swap the two steps: step each optimizer right after the backward of the loss that "
           "trains its own parameters")
    fixes = {
        "lightning": ("self.optimizers() returns the optimizers in the order configure_optimizers "
                      "lists them: unpack them in that order, so that each one steps after the "
                      "self.manual_backward of its own model's loss"),
    }

    def check(self, a):
        shown: set = set()
        for crossing in a.crossings:
            for step, starved in ((crossing.starved, True), (crossing.late, False)):
                if step.loc is None or (step.loc.path, step.loc.line) in shown:
                    continue
                shown.add((step.loc.path, step.loc.line))
                yield self._finding(a, step, crossing, starved=starved)

    def _finding(self, a, step, c, *, starved: bool):
        x, y = c.starved["opt"], c.late["opt"]
        first_back, second_back = c.before.backwards[-1], c.after.backwards[-1]
        x_what, y_what = _trains(a, x), _trains(a, y)
        x_call, y_call = _step_call(a, c.starved), _step_call(a, c.late)
        if starved:
            mine = set(a.opt_params.get(x, ()))
            steps = [o.starved for o in a.crossings if o.starved.loc == step.loc]
            held = ("no gradient at all (none reached its parameters since they were last cleared)"
                    if all(mine <= set(s.get("without_grad") or ()) for s in steps)
                    else "the gradient its parameters still held from an earlier update")
            message = (f"{x_call} steps the optimizer over {x_what} right after the backward at "
                       f"{_line(first_back)}, which reached none of those parameters: it wrote "
                       f"{y_what}'s, and the optimizer over {y_what} steps only at "
                       f"{_line(c.late)}, after the backward at {_line(second_back)} wrote "
                       f"{x_what}'s. The two steps are crossed: {x_what} is updated with {held}, "
                       f"{y_what} after the other model's loss")
        else:
            message = (f"{y_call} steps the optimizer over {y_what} right after the backward at "
                       f"{_line(second_back)}, the loss that trains {x_what}; {y_what}'s gradient "
                       f"came from the backward at {_line(first_back)}, after which the optimizer "
                       f"over {x_what} stepped instead ({_line(c.starved)}). The two steps are "
                       f"crossed: each optimizer steps after the other model's loss")
        other = c.late if starved else c.starved
        rel = (related(first_back, f"the backward whose gradient the optimizer over {y_what} should apply",
                       Role.BACKWARD),
               related(second_back, f"the backward whose gradient the optimizer over {x_what} should apply",
                       Role.BACKWARD),
               related(other, "the other crossed step", Role.STEP))
        fix = self._fix(a, c, first_back, second_back, x_what, y_what)
        return self.finding(message, step.loc, related=rel, step=a.step_number.get(step.seq),
                            evidence={"optimizer": x if starved else y,
                                      "crossed_with": y if starved else x,
                                      "starved": starved, "lent": a.param_names(c.lent, 4),
                                      "owed": a.param_names(c.owed, 4)},
                            fix=fix, fixes=None if fix is None else {})

    def _fix(self, a, c, first_back, second_back, x_what, y_what) -> str | None:
        x_var, y_var = _stepped_name(a, c.starved), _stepped_name(a, c.late)
        loss_before, loss_after = _loss_text(a, first_back), _loss_text(a, second_back)
        if not (x_var and y_var and loss_before and loss_after):
            return None
        if a.framework == "lightning":
            return (f"step the optimizer over {y_what} after self.manual_backward({loss_before}) "
                    f"and the one over {x_what} after self.manual_backward({loss_after}); here "
                    f"{x_var} holds the optimizer over {x_what} and {y_var} the one over "
                    f"{y_what}: check the order self.optimizers() returns them in, the order "
                    f"configure_optimizers lists them, and unpack them in that order")
        return (f"step {y_var} after {loss_before}.backward() (line {first_back.loc.line}) and "
                f"{x_var} after {loss_after}.backward() (line {second_back.loc.line}): swap the "
                f"two steps")


def _line(event) -> str:
    return f"line {event.loc.line}" if event.loc is not None else "an earlier line"


def _trains(a, opt) -> str:
    """What an optimizer trains, for a message: the module its parameters share
    (``self.D``), else their names."""
    names = a.param_names(a.opt_params.get(opt, ()))
    parts = [n.split(".") for n in names]
    common: list[str] = []
    for pieces in zip(*parts):
        if len(set(pieces)) != 1:
            break
        common.append(pieces[0])
    if common and all(len(p) > len(common) for p in parts):
        return ".".join(common)
    return a.names(a.opt_params.get(opt, ()), 2)


def _step_call(a, step) -> str:
    name = _stepped_name(a, step)
    return f"{name}.step()" if name else "this step"


def _stepped_name(a, step) -> str | None:
    if step.loc is None:
        return None
    return a.source.called_object(step.loc.path, step.loc.line, "step")


def _loss_text(a, backward) -> str | None:
    """``d_loss`` for ``d_loss.backward()`` or ``self.manual_backward(d_loss)``."""
    if backward.loc is None:
        return None
    path, line = backward.loc.path, backward.loc.line
    return (a.source.call_argument(path, line, "manual_backward", 0, "loss")
            or a.source.called_object(path, line, "backward"))
