from __future__ import annotations

import ast

from ..analysis.unread_twins import unread_twins
from ..findings import Related, Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk


class TwinValueUnread(Rule):
    """
    ## What it does
    Finds a value the training step computes beside a twin of the same kind and never reads,
    while the twin is read where it was meant: one piece of a split
    (`logits_u_w, logits_u_s = logits[b:].chunk(2)` and only `logits_u_w` ever reaches a
    loss), one slice of a pair (`xs, ys, xq, yq = x[:k], y[:k], x[k:], y[k:]` and the support
    loss reads the query slice), the transformed copy of a batch
    (`x_adv = attack(model, xb, yb)`, then `model(xb)`), a second call of one function on
    other arguments (`z2 = encoder(v2)`, then `nt_xent(z1, z1)`), or a piece rebound from its twin
    before anything read it (`end = start.masked_fill(...)` right after
    `start, end = logits.unbind(-1)`). It points at the statement that reads the twin (or
    rebinds the piece), the one a person changes. Read from the source of the files whose
    backwards ran: the bodies of the loops that call `backward()`, of step functions and of
    `forward` methods (the statement reading the twin assigns or returns: a bare call logs).

    ## Why is this bad?
    The value was computed because part of the update was meant to use it: the strongly
    augmented view of a consistency loss, the support set of an inner adaptation, the
    adversarial examples of adversarial training, the end-position scores of a span head.
    When a copy-pasted name reads its twin instead, that part of the update trains on the other
    data: the unlabeled loss sees the weak view it took its pseudo-labels from, the inner loop
    adapts on the query set it is scored on, the model trains on clean inputs only, the end
    head gets the start head's scores. The shapes agree, nothing fails, the loss goes down.

    ## Example
    ```python
    logits_u_w, logits_u_s = model(torch.cat([u_w, u_s])).chunk(2)
    targets_u = logits_u_w.detach().argmax(1)
    loss_u = F.cross_entropy(logits_u_w, targets_u)   # logits_u_s is never read
    ```

    ## Use instead
    ```python
    logits_u_w, logits_u_s = model(torch.cat([u_w, u_s])).chunk(2)
    targets_u = logits_u_w.detach().argmax(1)
    loss_u = F.cross_entropy(logits_u_s, targets_u)
    ```

    ## Stays silent on
    A piece read anywhere in its function (logged, every k steps, after the loop); a piece bound
    to `_` names; an unpacking of values of different kinds (`x, y = batch` with `y` unused, a
    `max`'s values and indices); a twin read only detached or for its shape (`.detach()`,
    `.size(0)`, `.item()`); an unused result of a call that is no function of the script, or
    whose name shares nothing with the batch it was made from (`acc = accuracy(logits, y)`);
    code outside the training loop and the model's forward.
    """

    code = "GD429"
    slug = "twin-value-unread"
    severity = Severity.WARNING
    summary = ("a value computed beside its twin (a split's piece, a slice of a pair, an "
               "attacked or augmented copy of the batch) is never read, and the twin is read where "
               "it was meant: that part of the update trains on the other data")
    fix = "read the value where it was meant (a copy-pasted name reads its twin), or remove the computation"

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            by_line: dict[int, list[dict]] = {}
            for found in unread_twins(a.source.full(path)):
                by_line.setdefault(found["line"], []).append(found)
            for line, group in sorted(by_line.items()):
                found = group[0]
                pairs = [(f["name"], f["twin"]) for f in group]
                name, twin = found["name"], found["twin"]
                text, dead = found["text"], found["dead_text"]
                loc = Location(path, found["line"], None)
                related = (Related(Location(path, found["dead_line"], None),
                                   f"where `{name}` is computed"),)
                if len(group) > 1 and found["how"] == "unread":
                    names = ", ".join(f"`{n}`" for n, _ in pairs)
                    twins = ", ".join(f"`{t}`" for _, t in pairs)
                    message = (f"`{dead}` computes {names} and nothing reads them, while "
                               f"`{text}` reads their twins {twins}: the part of the update "
                               f"meant for them trains on the twins instead")
                elif found["how"] == "overwritten":
                    message = (f"`{text}` rebinds `{name}` from its twin `{twin}` before anything "
                               f"read the `{name}` that `{dead}` made: that value is thrown away, "
                               f"and `{name}` holds a copy of `{twin}`'s data from here on")
                else:
                    message = (f"`{dead}` computes `{name}` and nothing reads it, while "
                               f"`{text}` reads its twin `{twin}`: the part of the update meant "
                               f"for `{name}` trains on `{twin}` instead")
                yield self.finding(message, loc, related=related,
                                   fix=_fix(pairs, text),
                                   evidence={"name": name, "twin": twin,
                                             "computed_line": found["dead_line"],
                                             "how": found["how"]})


def _fix(pairs: list[tuple[str, str]], text: str) -> str:
    """The statement with each twin's first read replaced by its value, where it parses."""
    names = " and ".join(f"`{n}`" for n, _ in pairs)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        tree = None
    if tree is not None and tree.body and isinstance(tree.body[0], ast.Assign):
        statement = tree.body[0]
        for name, twin in pairs:
            for node in walk(statement.value):
                if isinstance(node, ast.Name) and node.id == twin:
                    node.id = name
                    break
        return (f"read {names} where {'it was' if len(pairs) == 1 else 'they were'} meant: "
                f"`{ast.unparse(statement)}` (or remove the computation if the script is right)")
    return f"read {names} where `{text}` reads the twin, or remove the computation"
