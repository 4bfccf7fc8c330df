from __future__ import annotations

import ast
import re

from ..analysis.negative_labels import negatives_labelled_positive, paired_labels_wrong
from ..findings import Severity
from ..trace import Location
from .base import Rule
from ..analysis.source import walk

_CONSTANT_FOR = {1: ("ones_like", "new_ones", "ones"), 0: ("zeros_like", "new_zeros", "zeros")}
_UP = 0.6  # the negatives' share of the gradient raising them, at least
_DOWN = 0.4  # the positives' share raising them, at most, to say that they are lowered
_JUDGED = 2  # backwards that must each say reversed
_LOOK_BACK = 40  # lines above the backward searched for the line that uses the negatives' score
# names a script gives to what it draws as negatives (used only when the data's own rows are
# drawn at random too, so that where the draws come from does not tell them apart)
_NEGATIVE_NAME = re.compile(r"(^|_)(neg|negs|negative|negatives|corrupt\w*|corr|noise|fake|"
                            r"sampled|rand\w*|j|nj|false|wrong)($|_)|neg|corrupt|noise", re.I)


def _negated(node) -> bool:
    """``-x``, ``-1 * x``, ``x * -1``, ``x.neg()``: the expression's sign flipped."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return any(isinstance(side, ast.UnaryOp) and isinstance(side.op, ast.USub)
                   and isinstance(side.operand, ast.Constant) for side in (node.left, node.right))
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
        and node.func.attr == "neg"


def _negatives_term_unnegated(tree) -> tuple[int, str] | None:
    """``(line, text)`` of the file's one ``logsigmoid`` of a negatives' score given as it is
    (``F.logsigmoid(neg_score)``; the right term is ``logsigmoid(-neg_score)``) or ``softplus``
    of it negated, when the file has exactly one such term; None otherwise."""
    if tree is None:
        return None
    found = []
    for node in walk(tree):
        if not isinstance(node, ast.Call) or len(node.args) != 1:
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name not in ("logsigmoid", "softplus"):
            continue
        arg = node.args[0]
        flipped = _negated(arg)
        inner = arg.operand if isinstance(arg, ast.UnaryOp) else arg
        if not _NEGATIVE_NAME.search(ast.unparse(inner)):
            continue
        if (name == "logsigmoid") != flipped:  # logsigmoid(neg) or softplus(-neg)
            found.append(node)
    if len(found) != 1:
        return None
    node = found[0]
    return node.lineno, ast.unparse(node)


def _weighted_up(scores) -> float:
    mass = sum(s["mass"] for s in scores)
    return sum(s["up"] * s["mass"] for s in scores) / mass if mass > 0 else 0.5


def split(event, draw_name) -> tuple[list, list, set] | None:
    """(negatives, positives, the negatives' own draws) among a backward's scores, or None when they cannot be told
    apart. A negative reaches a drawn lookup that not every score reaches (the user of a BPR
    triple is drawn for both of its scores); when every score reaches one, the draws the
    script names as negatives (``neg``, ``j``, ``corrupt``, ``noise``) decide."""
    scores = [s for s in event["scores"] if s.get("up") is not None and s.get("mass", 0) > 0]
    if len(scores) < 2:
        return None
    common = set(scores[0]["draws"]).intersection(*(set(s["draws"]) for s in scores[1:]))
    extra = [set(s["draws"]) - common for s in scores]
    negatives = [s for s, e in zip(scores, extra) if e]
    positives = [s for s, e in zip(scores, extra) if not e]
    if negatives and not positives:
        def named(s, e) -> bool:
            return any(_NEGATIVE_NAME.search(draw_name(d) or "") for d in e) or \
                any(_NEGATIVE_NAME.search(n) for n in s.get("names") or ())
        negatives = [s for s, e in zip(scores, extra) if named(s, e)]
        positives = [s for s, e in zip(scores, extra) if e and not named(s, e)]
    if not negatives or not positives:
        return None
    # a negative is scored against what a positive is scored against (BPR's user, skip-gram's
    # centre word, TransE's relation): scores of unrelated drawn pairs are no ranking
    negatives = [s for s in negatives
                 if any(set(s.get("anchors") or ()) & set(p.get("anchors") or ()) for p in positives)]
    if not negatives or len({s["orient"] for s in negatives + positives}) != 1:
        return None
    own = set().union(*(set(s["draws"]) - common for s in negatives))
    return negatives, positives, own


class SampledNegativesPushedUp(Rule):
    """
    ## What it does
    Finds a negative-sampling loss that pushes the scores of the randomly drawn negatives up
    and the data's positives down: skip-gram's negatives' term written `logsigmoid(neg)` for
    `logsigmoid(-neg)`, BPR with the sampled item and the positive swapped
    (`-logsigmoid(neg - pos)`), TransE's margin ranking with the corrupted and the true
    distances swapped, word2vec's BCE with the labels built the other way round. The script's
    random integer draws (`torch.randint`, `multinomial`, `randperm`, numpy's `randint` /
    `choice`) are remembered for the first backwards; an embedding lookup whose indices are a
    draw made since the previous backward (or agree with one at 40% of their positions: a
    corruption of part of a batch; or are a draw read through an integer table the calling
    frames hold: word2vec's unigram^0.75 noise table `table[np.random.randint(0, len(table),
    k)]`, the data's pairs `pairs[idx, 0]`) reads *drawn* rows. Each score of looked-up embeddings the
    loss holds (a dot product, `bmm`, an einsum; a vector norm, `cdist`, a sum of squared
    differences) gets a node hook that reads the loss's gradient on it. The negatives are the
    scores that read a draw the other scores do not (when the data's rows are drawn at random
    too, the draws the script names `neg`, `j`, `corrupt`, `noise`), and that share an anchor
    with a positive (rows looked up from one indices tensor: BPR's user, skip-gram's centre
    word, TransE's relation). Reported when, at every
    one of the judged backwards (two at least), gradient descent raises the negatives'
    similarity (60% of the gradient's mass at least: a dot product's gradient negative, a
    distance's positive; a right loss lowers every negative's score at every step), at the
    line that builds a binary loss's labels the other way round (`torch.cat` of score blocks
    named `pos`/`neg` against a `torch.cat` of `zeros`/`ones` in the other order, or a positive
    block given a zero target) when the source shows one, else at the line that uses the
    negatives' score in the loss (for a loss computed inside a module's `forward`, whose names
    the loop does not hold: the file's one `logsigmoid(neg)` or `softplus(-neg)` of a
    negatives-named score). Lookups include rows gathered from a computed tensor (a graph
    network's node embeddings `z[neg[0]]`, with `neg` a drawn (2, E) edge list: each end of it
    is a row of the draw); the data's and the drawn pairs scored from one such tensor are
    scored against each other.

    Without a draw to follow (negatives drawn one number at a time, as SASRec's sampler does,
    drawn in a sampler process or read from a file), the source alone: in one function, each
    role's binary loss on its own score block (`neg_logits[mask]`, named `pos`/`neg`) with a
    constant target, and a negative labelled 1 or a positive labelled 0, reported at that
    loss call; a score given with its sign flipped (`-neg_logits`, `1 - p_neg`) against a 1
    is right and left out.

    ## Why is this bad?
    Negative sampling exists to rank the pairs the data holds above random ones. Reversed, the
    loss still falls steadily and nothing fails, but the model learns to rank random items
    above the data: the embeddings are worse than untrained ones for retrieval, link
    prediction or recommendation.

    ## Example
    ```python
    neg = torch.randint(0, n_items, (batch,))
    x_ui = (user(u) * item(i)).sum(-1)
    x_uj = (user(u) * item(neg)).sum(-1)
    loss = -F.logsigmoid(x_uj - x_ui).mean()
    ```

    ## Use instead
    ```python
    loss = -F.logsigmoid(x_ui - x_uj).mean()  # the data's item above the sampled one
    ```

    ## Stays silent on
    The same losses written right (skip-gram's `logsigmoid(-neg)`, BPR's `pos - neg`, a margin
    ranking's `relu(margin + d_pos - d_neg)`, scores as negated distances), either label
    convention applied consistently, hard negatives mined from drawn candidates (the trained
    negative is the argmax, not a draw), a regression on randomly drawn user and item rows
    (no score that reads a draw the others do not, or none scored against what another score
    is), drawn rows used as the positives' own
    (the same draw reaches every score), data drawn once before the loop. Not judged: scores
    of a drawn and a data lookup in one tensor mixed other than by columns (the first or last
    columns of `cat([true[:, None], drawn], 1)` are read apart), scores
    computed on an accelerator, draws made by numpy's `Generator`.
    """

    code = "GD270"
    slug = "sampled-negatives-pushed-up"
    severity = Severity.WARNING
    summary = ("a negative-sampling loss raises the scores of the randomly drawn negatives and "
               "lowers the data's positives: its sign or argument order is reversed")
    fix = ("give the negatives' scores the sign that lowers them: `logsigmoid(-neg_score)`, BPR's "
           "`logsigmoid(pos - neg)`, a margin ranking's `relu(margin + d_pos - d_neg)`")

    def check(self, a):
        verdicts: dict = {}  # backward location -> [(reversed, event, negatives, positives)]
        for event in a.of_kind("sampled_scores"):
            if event.loc is None:
                continue

            def draw_name(d, event=event):
                where = (event["draws"].get(str(d)) or {}).get("loc")
                if not where:
                    return None
                return a.source.assigned_name(where[0], where[1])

            parts = split(event, draw_name)
            if parts is None:
                continue
            negatives, positives, own = parts
            up_neg, up_pos = _weighted_up(negatives), _weighted_up(positives)
            verdicts.setdefault((event.loc.path, event.loc.line), []).append(
                (up_neg >= _UP, event, negatives, positives, up_neg, up_pos, own))
        reported = set()
        for (path, line), judged in verdicts.items():
            if len(judged) < _JUDGED or not all(v[0] for v in judged):
                continue
            reported.add(path)
            _, event, negatives, positives, up_neg, up_pos, own = judged[-1]
            orient = negatives[0]["orient"]
            names = [n for s in negatives for n in s.get("names") or ()]
            loc, text = self._line(a, path, line, names)
            drawn = [event["draws"].get(str(d)) or {} for d in sorted(own)]
            where = next((w for w in drawn if w.get("loc")), None)
            drawn_at = (f" (the rows drawn by `{where['fn']}` at line {where['loc'][1]})"
                        if where else "")
            neg_name = f"`{names[0]}`" if names else "the negatives' score"
            pos_names = [n for s in positives for n in s.get("names") or ()]
            pos_name = f"`{pos_names[0]}`" if pos_names else "the positives' score"
            similar = orient == "sim"
            what = "similarity" if similar else "distance"
            neg_move = "raises" if similar else "shrinks"
            pos_move = "lowers" if similar else "grows"
            said = f"`{text}`" if text else "this line"
            if up_pos <= _DOWN:
                pos_said = (f"and {pos_move} the {what} {pos_name} of the data's pairs "
                            f"({1 - up_pos:.0%})")
            else:
                pos_said = (f"as it does the {what} {pos_name} of the data's pairs: nothing "
                            f"teaches the model to tell the two apart")
            message = (f"the loss's gradient {neg_move} the {what} {neg_name} of the randomly "
                       f"drawn negatives{drawn_at} ({up_neg:.0%} of its mass) {pos_said}, at "
                       f"every one of the first {len(judged)} backwards: {said} has the "
                       f"negatives' sign or its arguments' order reversed, so the model learns to "
                       f"rank random items above the data while the loss falls")
            yield self.finding(message, loc, step=a.next_step_number(event.seq), evidence={
                "orient": orient, "up_negatives": round(up_neg, 4), "up_positives": round(up_pos, 4),
                "backwards": len(judged), "negatives": names[:4], "positives": pos_names[:4]})

        yield from self._labelled_apart(a, reported)

    def _labelled_apart(self, a, reported):
        """Negatives labelled 1 (or positives 0) where the source gives each role its own binary
        loss with a constant target in one function: no draw needs to be seen for that (negatives
        drawn one number at a time, in a sampler process, or read from a file)."""
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            if path in reported:
                continue  # the gradient's reading has said it there
            for line, text, role, label in paired_labels_wrong(a.source.full(path)):
                plural = "negatives" if role == "negative" else "positives"
                move = "up" if role == "negative" else "down"
                made = _CONSTANT_FOR[label]
                old = next((n for n in made if f"{n}(" in text), None)
                fix = f"give the {role} scores the target {1 - label}"
                if old is not None:
                    fix += f": `{_CONSTANT_FOR[1 - label][made.index(old)]}` in place of `{old}`"
                yield self.finding(
                    f"`{text}` gives the {role} scores the target {label}: a binary loss over "
                    f"sampled pairs labels the data's positives 1 and the sampled negatives 0, "
                    f"so this term pushes the {plural}' scores {move}, and the model is never "
                    f"taught to rank the data's items above the sampled ones (the loss still falls)",
                    Location(path, line), fix=fix,
                    evidence={"role": role, "label": label, "source_only": True})

    @staticmethod
    def _line(a, path, line, names):
        """The labels of a binary loss built the other way round (positives 0, negatives 1) just
        above the backward, else the last line above the backward that uses a negatives'
        score's name (not its assignment), else the loss's assignment, else the backward."""
        swapped = [(n, text) for n, text, _, _ in negatives_labelled_positive(a.source.full(path))
                   if line - _LOOK_BACK < n <= line]
        if swapped:
            number, _ = max(swapped)
            return Location(path, number), a.source.line_text(path, number).split("  #")[0].strip()
        words = [re.compile(rf"(?<![\w.]){re.escape(n)}(?!\w)") for n in names if n.isidentifier()]
        if words:
            for number in range(line, max(0, line - _LOOK_BACK), -1):
                text = a.source.line_text(path, number).split("#")[0]
                stripped = text.strip()
                if not stripped or stripped.startswith(("def ", "class ")):
                    continue
                for word in words:
                    match = word.search(text)
                    if match is None:
                        continue
                    head = text.split("=", 1)[0] if re.search(r"[^=!<>]=[^=]", text) else ""
                    if word.search(head):
                        continue  # an assignment of the name
                    return Location(path, number), stripped
        if not words:
            # scores made in a forward the backward's frames do not hold: the file's one
            # log-sigmoid of a negatives' score with the positives' sign
            reversed_term = _negatives_term_unnegated(a.source.tree(path))
            if reversed_term is not None:
                return Location(path, reversed_term[0]), reversed_term[1]
        assigned = a.source.loss_assignment(path, line)
        if assigned is not None:
            return Location(path, assigned[0]), assigned[1]
        return Location(path, line), a.source.line_text(path, line).strip()
