from __future__ import annotations

import ast

from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_LOGSUMEXP = ("logsumexp", "log_sum_exp", "logsumexp_")


def _reads(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
               for n in walk(node))


def _mask_parameters(func: ast.FunctionDef) -> list[str]:
    args = [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]
    return [a.arg for a in args if "mask" in a.arg.lower()]


def _loop_assignments(loop: ast.For) -> list[ast.Assign]:
    return sorted((s for s in walk(loop) if isinstance(s, ast.Assign) and len(s.targets) == 1
                   and isinstance(s.targets[0], ast.Name)), key=lambda s: (s.lineno, s.col_offset))


def _carried_by_loop(loop: ast.For, name: str, first: ast.Assign) -> bool:
    """Whether the loop reads ``name`` before it first rebinds it (in an earlier statement or in
    the value of that assignment): the name holds the previous step's value."""
    for n in walk(loop):
        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load):
            if n.lineno < first.lineno or any(n is m for m in walk(first.value)):
                return True
    return False


def logsumexp_calls(node: ast.AST) -> list[ast.Call]:
    return [n for n in walk(node) if isinstance(n, ast.Call)
            and (getattr(n.func, "attr", None) or getattr(n.func, "id", None)) in _LOGSUMEXP]


def _recurrence(func: ast.FunctionDef) -> tuple[ast.For, ast.Assign] | None:
    """The time loop of a forward algorithm and its statement that carries the scores to the
    next step: a ``for`` loop whose body calls ``logsumexp`` over a name the loop then rebinds
    (``alpha = torch.logsumexp(alpha.unsqueeze(2) + trans + emit, dim=1)``, or through other
    names: ``nxt = alpha[:, :, None] + trans; nxt = torch.logsumexp(nxt, 1); alpha = nxt``).
    The carry is the last assignment to a name the loop reads before rebinding it (the
    previous step's scores); failing one, the last assignment to a name the call reads."""
    for loop in walk(func):
        if not isinstance(loop, ast.For):
            continue
        calls = logsumexp_calls(loop)
        if not calls:
            continue
        read = {n.id for c in calls for n in walk(c) if isinstance(n, ast.Name)}
        assigned = _loop_assignments(loop)
        direct = [s for s in assigned if s.targets[0].id in read]
        if not direct:
            continue
        feeding = set(read)
        grown = True
        while grown:  # the names the call reads, followed back through the loop's assignments
            grown = False
            for s in assigned:
                if s.targets[0].id in feeding:
                    new = {n.id for n in walk(s.value) if isinstance(n, ast.Name)} - feeding
                    if new:
                        feeding |= new
                        grown = True
        firsts: dict[str, ast.Assign] = {}
        for s in assigned:
            firsts.setdefault(s.targets[0].id, s)
        carried = [s for s in assigned if s.targets[0].id in feeding
                   and _carried_by_loop(loop, s.targets[0].id, firsts[s.targets[0].id])]
        return loop, max(carried or direct, key=lambda s: s.lineno)
    return None


def partitions_ignoring_masks(tree: ast.AST) -> list[tuple[int, str, str, str, int, str, str]]:
    """``(line, text, function, mask, line of a sibling reading its mask, the carried name, the
    loop's variable)`` for each function
    that takes a mask, never reads it, and computes a forward algorithm's recurrence in a time
    loop, while another function of the same class (or module) reads a mask of its own."""
    found = []
    scopes = [n for n in walk(tree) if isinstance(n, (ast.ClassDef, ast.Module))]
    for scope in scopes:
        funcs = [n for n in scope.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        readers = {}
        for f in funcs:
            for m in _mask_parameters(f):
                if _reads(f, m):
                    readers.setdefault(f.name, f.lineno)
        for f in funcs:
            unread = [m for m in _mask_parameters(f) if not _reads(f, m)]
            if not unread:
                continue
            others = [line for name, line in readers.items() if name != f.name]
            if not others:
                continue
            recurrence = _recurrence(f)
            if recurrence is None:
                continue
            loop, carry = recurrence
            step = loop.target.id if isinstance(loop.target, ast.Name) else "t"
            found.append((carry.lineno, ast.unparse(carry), f.name, unread[0], min(others),
                          carry.targets[0].id, step))
    return found


def _fix(carry: str, mask: str, carried: str, step: str) -> str:
    """The fix, naming the step's new scores as the script does (``prev = scores``)."""
    try:
        value = ast.parse(carry).body[0].value
    except (SyntaxError, IndexError, AttributeError):
        value = None
    if isinstance(value, ast.Name) and value.id != carried:
        return (f"keep the forward variables where `{mask}` is False: `{carried} = torch.where("
                f"{mask}[:, {step}].unsqueeze(1), {value.id}, {carried})`")
    return (f"keep the forward variables where `{mask}` is False: compute the step's "
            f"`logsumexp` into `nxt`, then `{carried} = torch.where({mask}[:, {step}]"
            f".unsqueeze(1), nxt, {carried})`")


class PartitionIgnoresMask(Rule):
    """
    ## What it does
    Finds a CRF's (or any sequence model's) forward algorithm that is given the padding mask
    and never reads it, while the score of the gold path next to it does: the partition
    function runs its `logsumexp` recurrence over every padded step, the gold path's score
    stops at each sequence's end. Read from the script's source, in the files whose backwards
    ran: a function with a parameter named as a mask (`mask`, `masks`, `seq_mask`) it never
    reads, holding a `for` loop that calls `logsumexp` over a name the loop rebinds (the
    forward variables `alpha`), in a class (or module) where another function reads its own
    mask parameter. It points at the statement that carries the recurrence to the next step:
    the last assignment to a name the loop reads before rebinding it (`alpha = nxt` after
    `nxt = torch.logsumexp(alpha.unsqueeze(2) + ..., 1)`), followed through the names that
    feed the `logsumexp`.

    ## Why is this bad?
    The negative log-likelihood `log Z - score(gold)` is only a likelihood when `Z` sums over
    the same steps as the gold score. Over padded steps the emissions and transitions at the
    padding enter `Z` and nothing else, so the model lowers the loss by pushing the padding's
    scores to minus infinity: the loss falls below zero and keeps falling, the gradient of the
    real steps is drowned by that of the padding, and the tagger trains worse (or diverges)
    with nothing failing.

    ## Example
    ```python
    def _forward_alg(self, feats, mask):
        alpha = self.start + feats[:, 0]
        for t in range(1, feats.size(1)):
            alpha = torch.logsumexp(alpha.unsqueeze(2) + self.trans + feats[:, t].unsqueeze(1), 1)
        return torch.logsumexp(alpha + self.end, 1)
    ```

    ## Use instead
    ```python
            nxt = torch.logsumexp(alpha.unsqueeze(2) + self.trans + feats[:, t].unsqueeze(1), 1)
            alpha = torch.where(mask[:, t].unsqueeze(1), nxt, alpha)  # padding keeps alpha
    ```

    ## Stays silent on
    A forward algorithm that reads its mask (`torch.where`, `nxt * m + alpha * (1 - m)`, a loop
    up to each sequence's length); one with no mask parameter (unpadded batches, one sentence
    at a time, as in the PyTorch BiLSTM-CRF tutorial); a mask parameter kept for an interface
    by a function with no `logsumexp` recurrence; a class where no function reads a mask.
    """

    code = "GD100"
    slug = "partition-ignores-mask"
    severity = Severity.WARNING
    summary = ("a forward algorithm given the padding mask never reads it: its partition function "
               "runs over the padding while the gold path's score stops at each sequence's end")
    fix = ("carry the forward variables through the padded steps unchanged: "
           "`alpha = torch.where(mask[:, t].unsqueeze(1), nxt, alpha)`")

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths[:4]:
            tree = a.source.tree(path)
            if tree is None:
                continue
            for line, text, function, mask, sibling, carried, step in partitions_ignoring_masks(tree):
                yield self.finding(
                    f"`{function}` is given the padding mask `{mask}` and never reads it: its "
                    f"`logsumexp` recurrence (`{text}`) runs over every padded step, while the "
                    f"function at line {sibling} scores the gold path with its mask. The "
                    f"partition function and the gold score then cover different steps, so the "
                    f"negative log-likelihood is no likelihood: the model lowers it by pushing "
                    f"the padding's scores down, and it can fall below zero",
                    Location(path, line, None),
                    evidence={"function": function, "mask": mask, "sibling_line": sibling},
                    fix=_fix(text, mask, carried, step))
