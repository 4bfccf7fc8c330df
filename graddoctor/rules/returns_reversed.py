from __future__ import annotations

import re
from dataclasses import replace

from ..findings import Severity
from .base import Rule

_LOOK_BACK = 80  # lines above the backward searched for the line that builds the weights


class ReturnsReversed(Rule):
    """
    ## What it does
    Finds a policy-gradient loss whose per-step weights (discounted returns) are in the reverse
    of the episode's order: the returns computed by the backward recursion `G = r + gamma * G`
    and appended as they come (last step first), then paired with the log-probabilities in the
    steps' order, so `log_prob_t` is multiplied by `G_{T-1-t}`. Read at the first 3 backwards
    after `torch.distributions` log-probabilities: the loss's products of a log-probability (or
    a `stack`/`cat` of them) and a weight without gradient, put in the order the log-probabilities
    were computed. Read backwards, the weights are discounted returns of a reward with at most
    three values (a reward per step, a cost, a sparse success) for a common gamma or one fitted
    to them; read in the steps' order they are not (an affine normalisation, `(G - mean) / std`,
    changes neither). It points at the line that appends the returns (or, when the script's
    names do not say, the backward).

    ## Why is this bad?
    REINFORCE weighs each action's log-probability by the return that followed it. Paired the
    other way round, the first actions of an episode get the small returns of its last steps and
    the last actions the large ones: the gradient credits the wrong actions, the loss still
    falls, and the policy learns little or the opposite of what the rewards say.

    ## Example
    ```python
    returns, G = [], 0.0
    for r in reversed(rewards):
        G = r + gamma * G
        returns.append(G)                     # last step first
    loss = -(torch.stack(log_probs) * torch.tensor(returns)).sum()
    ```

    ## Use instead
    ```python
    for r in reversed(rewards):
        G = r + gamma * G
        returns.insert(0, G)                  # or returns.reverse() after the loop
    ```

    ## Stays silent on
    Returns in the episode's order (built with `insert(0, G)`, reversed after the loop, or a
    reversed index `returns[t] = G`), normalised or not; GAE advantages and returns of a reward
    with many values (a critic's values or a continuous reward: no order can be told);
    undiscounted returns of a constant reward (a straight line reads the same both ways);
    fewer than 8 steps. Not seen: weights on an accelerator, log-probabilities not from
    `torch.distributions`, batches of episodes as 2-D tensors.
    """

    code = "GD274"
    slug = "returns-reversed"
    severity = Severity.WARNING
    summary = ("policy-gradient weights (discounted returns) are paired with the log-probabilities "
               "in the reverse of the episode's order: log_prob_t gets the return of step T-1-t")
    fix = ("reverse the returns built by the backward recursion before pairing them with the "
           "log-probabilities (returns.insert(0, G), or returns.reverse() after the loop)")

    def check(self, a):
        for e in a.of_kind("returns_order"):
            name, steps, gamma = e.get("name"), e.get("steps"), e.get("gamma")
            loc, where = e.loc, None
            if name and loc is not None:
                where = self._builder(a, loc, name)
                if where is not None:
                    loc = replace(loc, line=where)
            shown = f"`{name}`" if name else "the weights"
            fix = (f"reverse {shown} back into the episode's order before pairing: "
                   f"{name or 'returns'}.insert(0, G) in the loop, or "
                   f"{name or 'returns'}.reverse() (or {name or 'returns'}[::-1]) after it")
            yield self.finding(
                f"the {steps} log-probabilities of this loss are weighted by {shown} in the "
                f"reverse of the episode's order: read from the last step to the first, the "
                f"weights are discounted returns (gamma ≈ {gamma}) of a reward with at most three "
                f"values, read in the steps' order they are not. The backward recursion "
                f"G = r + gamma * G makes the last step's return first; unreversed, log_prob_t "
                f"is multiplied by the return of step T-1-t, and the policy is credited for the "
                f"wrong actions",
                loc, step=a.next_step_number(e.seq),
                evidence={"steps": steps, "gamma": gamma, "name": name}, fix=fix)

    @staticmethod
    def _builder(a, loc, name: str) -> int | None:
        """The last line above the backward that appends to ``name`` (``name.append(G)``), or
        else that makes it a tensor (``name = torch.tensor(name)``)."""
        append = re.compile(rf"\b{re.escape(name)}\s*\.\s*(append|insert)\s*\(")
        made = re.compile(rf"^\s*{re.escape(name)}\s*=.*\b(tensor|as_tensor|from_numpy|stack|cat)\s*\(")
        fallback = None
        for line in range(loc.line - 1, max(0, loc.line - _LOOK_BACK), -1):
            try:
                text = a.source.line_text(loc.path, line).split("#")[0]
            except Exception:
                return fallback
            if append.search(text):
                return line
            if fallback is None and made.search(text):
                fallback = line
        return fallback
