from __future__ import annotations

import ast
import re

from ..findings import Related, Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

# names a distance bias is built from (ALiBi's slopes, a relative-position bias)
_BIAS_NAMES = re.compile(r"alibi|slope", re.IGNORECASE)


def bias_lines(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, text)`` of the assignments inside functions that compute (a product or a sum)
    with ALiBi's slopes, or assign an alibi-named value; the functions that make the slopes
    themselves (``get_slopes``) left out."""
    out = []
    for fn in walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or "slope" in fn.name.lower():
            continue
        for node in walk(fn):
            if not isinstance(node, (ast.Assign, ast.AugAssign)):
                continue
            text = ast.unparse(node)
            value = node.value
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            named = any(_BIAS_NAMES.search(ast.unparse(t)) for t in targets)
            # the bias is built where the slopes are read, or where an alibi-named value is
            # assigned; the scores that add it afterwards are not the line to change
            if (re.search("slope", ast.unparse(value), re.IGNORECASE) or named) \
                    and any(isinstance(n, ast.BinOp) for n in walk(value)):
                out.append((node.lineno, text))
    return sorted(set(out))


class AttentionPrefersDistantKeys(Rule):
    """
    ## What it does
    Finds a causal attention whose weights, at the first steps, grow with the distance between
    the query and the key: a fixed distance bias added with the wrong sign (ALiBi written
    `m * (i - j)`, `-m * j` or `-(m * (j - i))` instead of `-m * (i - j)` / `m * j`). Seen in the
    graph of the first 3 backwards: a softmax over square (T, T) causal scores whose batch-mean
    weights, for a head, rise with the distance in 90 % of the rows of the second half (key 0
    left out) with the farthest key holding twice the weight of the query's own position.
    Reported at the bias's assignment when the source names one (`alibi`, `slopes`), else at
    the backward.

    ## Why is this bad?
    ALiBi's bias is a penalty that grows with the distance: each head looks mostly at the
    recent tokens, at a scale set by its slope. With the sign flipped it rewards distance: the
    heads with large slopes look only at the first tokens of the sequence, whatever their
    content, and the model must learn against its own positional prior. Nothing fails; the loss
    falls more slowly, and the length extrapolation ALiBi is chosen for is lost.

    ## Example
    ```python
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    bias = self.slopes.view(-1, 1, 1) * (i - j)
    ```

    ## Use instead
    ```python
    bias = -self.slopes.view(-1, 1, 1) * (i - j)  # a penalty growing with the distance
    ```

    ## Stays silent on
    ALiBi with its penalty (`-m * (i - j)`, `m * (j - i)`, BLOOM's `m * j`); RoPE, learned or
    sinusoidal positions (no trend in the weights at the first steps); an attention sink on the
    first key; non-causal attention; heads whose content scores dominate the batch mean;
    attention through `F.scaled_dot_product_attention`'s fused kernels (they keep no weights
    to read: not judged).
    """

    code = "GD390"
    slug = "attention-prefers-distant-keys"
    severity = Severity.WARNING
    summary = ("a causal attention's weights grow with the distance to the key at the first "
               "steps: a distance bias (ALiBi) added with the wrong sign")
    fix = ("add the distance as a penalty: bias = -slopes * (i - j) for key j <= query i "
           "(or slopes * j, BLOOM's form)")

    def check(self, a):
        told: set = set()
        for e in a.of_kind("distance_bias"):
            loc, related, text = e.loc, (), None
            if e.loc is not None:
                tree = a.source.tree(e.loc.path)
                lines = bias_lines(tree) if tree is not None else []
                if len(lines) == 1:
                    loc = Location(e.loc.path, lines[0][0])
                    text = lines[0][1]
                    related = (Related(e.loc, "the backward whose graph holds the attention"),)
            if loc is not None and (loc.path, loc.line) in told:
                continue  # the same bias at another length (a curriculum): said once
            if loc is not None:
                told.add((loc.path, loc.line))
            heads, of = e["heads"], e["of"]
            T = e["shape"][-1]
            which = f"{len(heads)} of its {of} heads" if of > 1 else "it"
            built = f" `{text}` rewards distance instead of penalising it:" if text else ""
            yield self.finding(
                f"a causal attention over {T} positions prefers the farthest keys at the first "
                f"steps: in {which} the batch-mean weights rise with the distance from the "
                f"query (the farthest key kept holds {e['ratio']:g}× the weight of the query's "
                f"own position).{built} a distance bias added with the wrong sign makes the "
                f"heads look at the first tokens whatever their content",
                loc, related=related, step=a.next_step_number(e.seq), fix=self.fix,
                evidence={"shape": list(e["shape"]), "heads": list(heads), "of": of,
                          "ratio": e["ratio"]})
