from __future__ import annotations

import ast
import re

from ..findings import Severity
from ..location import Location
from .base import Rule
from ..analysis.source import walk

# an inversion of the mask written on the loss's line: `~m`, `1 - m`, `logical_not(m)`, `m == 0`
_INVERTED = re.compile(r"~\s*\(?\s*[A-Za-z_]|\b1\.?0?\s*-\s*[A-Za-z_(]|logical_not|==\s*0\b|==\s*False\b")


class MaskedTargetVisible(Rule):
    """
    ## What it does
    Finds a masked reconstruction loss that counts the positions the model sees and leaves out
    the ones it hides: an MAE whose loss is taken over the visible patches, masked feature or
    frame modelling whose error is kept where the input was left intact, an inpainting model
    given the whole image (the hole only as an extra channel) and asked for the hole, a
    BERT-style masked language model whose labels are set at the tokens that were not replaced,
    whose mask id went to the positions its labels ignore (the replaced positions drawn from
    the complement of the labelled ones, `& ~masked`: the ignored positions inside the rows
    hold the mask id, the counted ones never do, and show the model their own token or a random
    one), or whose mask id went into the labels instead of the inputs (the model is given every token
    and asked for the mask id: the counted labels hold, often and spread over the positions, an
    id of the input's vocabulary that the input never holds, and no lookup holds the other
    labels one position later, as a language model's would).
    graddoctor follows the loss's 0/1 weight, `where`, `masked_fill`, boolean index or
    `ignore_index` to the positions it counts, reads the target there, and compares it with
    what the model's first layer was given at those positions: the same values (up to each
    patch's normalisation), reached by the loss's gradient, while the positions the loss leaves
    out are the ones the model does not see (replaced, zeroed, dropped before the encoder, or a
    mask channel tells it where they are). It points at the line to change: where the input is
    built with `torch.where(mask, tokens, MASK)` (its branches swapped) or
    `tokens.masked_fill(~mask, MASK)` from the mask the loss counts with, that statement; where
    the one write of a mask id into the input (`tokens[hide] = MASK`) takes an index made with
    an inversion (`hide = draw & ~masked`), that index's statement. A loss
    that comes out of a method of the model (an MAE's `forward_loss`) is pointed at the file's
    one masked reduction that inverts a mask (`(loss * (1 - mask)).sum() / (1 - mask).sum()`),
    where there is one.

    ## Why is this bad?
    The answer is in the input: the model learns to copy what it is given, the loss falls
    toward 0, and it learns nothing about the hidden positions — the only ones that matter when
    the input really is missing. Nothing fails.

    ## Example
    ```python
    mask = torch.ones(b, n)
    mask[:, keep:] = 0  # 1 on the kept (visible) patches
    mask = torch.gather(mask, 1, ids_restore)
    loss = (per_patch * mask).sum() / mask.sum()
    ```

    ## Use instead
    ```python
    mask = torch.ones(b, n)
    mask[:, :keep] = 0  # 1 on the removed patches: the loss counts what the encoder did not see
    mask = torch.gather(mask, 1, ids_restore)
    loss = (per_patch * mask).sum() / mask.sum()
    ```

    ## Stays silent on
    A plain autoencoder or VAE (no mask: reconstructing the input is the task); a denoising
    autoencoder (noise on every position); MAE with the loss on the masked patches, with or
    without `norm_pix_loss`; BERT-style masking with 80/10/10 replacement (a tenth of the
    counted tokens kept is the method); inpainting with the hole zeroed and the mask given as an
    extra channel; a loss on every position beside a masked term; padding left out of a
    reconstruction loss (the padded input is its target there: nothing is hidden); a loss mask
    over targets that are not the input (labels, next steps); token labels set to -100 in one
    run at a row's start or end (prompts, padding); a filler the loss leaves out on purpose
    inside the rows (alignment gaps, separators) beside a mask id at the counted positions, or
    beside a loss over most positions. Not seen: models on an accelerator, inputs
    made by a layer other than `nn.Linear`, a convolution or an embedding, a masked term whose
    error is not a square, an absolute value or one of torch's regression losses.
    """

    code = "GD197"
    slug = "masked-target-visible"
    severity = Severity.WARNING
    summary = ("a masked reconstruction loss counts the positions the model sees and leaves out "
               "the ones it hides: the model learns to copy its input")
    fix = ("count the hidden positions in the loss (the mask's 1s where the input was removed, "
           "replaced or zeroed), not the visible ones")

    def check(self, a):
        for e in a.of_kind("masked_visible"):
            if e.loc is None:
                continue
            loc, fix = self._site(a, e)
            counted, visible, hidden = e.get("counted"), e.get("visible"), e.get("hidden")
            by = e.get("by")
            if by == "mask_id":
                what = (f"{hidden:.0%} of the token labels the loss counts are the id "
                        f"{e.get('mask_id')}, which the model's input never holds, while the input "
                        f"keeps the original token at those positions: the mask went into the "
                        f"labels instead of the inputs")
                yield self.finding(
                    f"{what}, so the model is given every token and asked for the mask id, and "
                    f"learns nothing about predicting a hidden token", loc, fix=fix,
                    evidence={"how": e.get("how"), "counted": counted, "visible": visible,
                              "mask_share": hidden, "by": by, "mask_id": e.get("mask_id"),
                              "positions": e.get("positions")})
                continue
            if by == "mask_beside":
                yield self.finding(
                    f"the masked-LM loss counts {counted:.0%} of the token positions, and the "
                    f"input never holds the mask id {e.get('mask_id')} at any of them, while "
                    f"{hidden:.0%} of the positions it ignores inside the rows hold it: the mask "
                    f"id is written where the labels are -100, so the loss asks only for tokens "
                    f"the model is shown (kept or replaced by random ones, {visible:.0%} the very "
                    f"token) and never for a hidden one", loc, fix=fix,
                    evidence={"how": e.get("how"), "counted": counted, "visible": visible,
                              "mask_share": hidden, "by": by, "mask_id": e.get("mask_id"),
                              "positions": e.get("positions")})
                continue
            if by == "tokens":
                what = (f"the loss counts {counted:.0%} of the token positions, and at "
                        f"{visible:.0%} of them the model's input holds the very token the label "
                        f"asks for, while the positions it ignores hold other ids ({hidden:.0%} "
                        f"of them): the labels are set at the tokens that were kept, not at the "
                        f"ones that were masked")
            else:
                shown = ("the same values up to each position's normalisation" if e.get("normalised")
                         else "the target's values")
                if by == "channel":
                    hides = ("and the loss's mask is one of its input channels, while the other "
                             "channels hold the whole target")
                elif by == "gradient":
                    hides = (f"while {hidden:.0%} of the positions it leaves out are dropped "
                             f"before the model's first layers (no gradient reaches them)")
                else:
                    hides = (f"while {hidden:.0%} of the positions it leaves out hold other "
                             f"values in the input (zeroed or replaced)")
                what = (f"the masked loss counts {counted:.0%} of the positions, and at "
                        f"{visible:.0%} of them the model's input holds {shown}, {hides}")
            yield self.finding(
                f"{what}: the loss asks for what the model is given and leaves out what it "
                f"hides, so it learns to copy its input and nothing about the hidden positions",
                loc, fix=fix,
                evidence={"how": e.get("how"), "counted": counted, "visible": visible,
                          "hidden": hidden, "by": by, "positions": e.get("positions")})

    def _site(self, a, e) -> tuple[Location, str]:
        """The line to change: the loss's own line when it inverts the mask there, else the one
        statement that writes the mask's 0s or 1s by position, else the line that builds the
        model's input (a mask channel), else the loss."""
        loc = e.loc
        if e.get("by") == "mask_id":
            return _mask_written(a, loc), (
                "write the mask id into the inputs at the masked positions (`inputs[masked] = "
                "MASK`) and keep the original tokens as the labels there")
        if e.get("by") == "mask_beside":
            return _mask_placement(a, loc, e.get("mask_id"))[:2]
        built = a.source.loss_assignment(loc.path, loc.line) if e.get("by") not in ("tokens",) else None
        line, text = built if built is not None else (loc.line, a.source.line_text(loc.path, loc.line))
        at = Location(loc.path, line, loc.hook)
        if e.get("by") == "tokens":
            ignore = e.get("ignore_index")
            placed, placed_fix, inverted = _mask_placement(a, loc, None)
            if inverted:  # the labels are right, the mask's positions were drawn from their complement
                return placed, placed_fix
            if not isinstance(ignore, int):
                kept = _input_keeps_counted(a, loc.path, _mask_names(text or ""), text or "")
                if kept is not None:
                    return Location(loc.path, kept[0], ""), kept[1]
                return Location(loc.path, loc.line, loc.hook), (
                    "index the loss with the positions replaced in the input (the mask itself, "
                    "not its complement): the tokens the model was not given")
            found = a.source.prompt_mask_line(loc.path, ignore)
            if found is not None:
                at = Location(loc.path, found[0], "")
            return at, (f"invert the mask where the labels are set to {ignore}: keep the labels "
                        f"at the positions replaced in the input and set {ignore} at the others")
        if _INVERTED.search(text or ""):
            return at, ("drop the inversion: count the positions the input hides (`mask`, not "
                        "`~mask` or `1 - mask`)")
        if e.get("by") == "channel":
            built = _input_origin(a, e.get("input_at"))
            return built or at, ("hide the counted positions from the model: zero them in its "
                                 "input (`torch.cat([img * (1 - hole), hole], 1)`), keeping the "
                                 "mask as a channel")
        names = _mask_names(text or "")
        kept = _input_keeps_counted(a, loc.path, names, text or "")
        if kept is not None:
            return Location(loc.path, kept[0], ""), kept[1]
        written = _position_writes(a, loc.path, names)
        if len(written) == 1:
            line_w, text_w = written[0]
            return Location(loc.path, line_w, ""), (
                f"write the mask the other way round: `{text_w}` marks the positions the "
                f"model sees, but the loss needs 1 where the input was hidden")
        if not written:
            # the loss comes out of a call (an MAE's `forward_loss`): the one masked reduction
            # of the file that inverts a mask is where the counted positions are chosen
            reductions = _inverted_reductions(a, loc.path)
            if len(reductions) == 1:
                return Location(loc.path, reductions[0][0], ""), (
                    "drop the inversion: count the positions the input hides (`mask`, not "
                    "`~mask` or `1 - mask`)")
        return at, self.fix


# a write into a slice of labels of a mask token: `labels[masked] = MASK`,
# `tgt[m] = tokenizer.mask_token_id`
_MASK_INTO_LABELS = re.compile(
    r"^\s*([A-Za-z_][A-Za-z_0-9]*)\s*\[[^\]]+\]\s*=\s*([^=].*)$")
_LABEL_NAME = re.compile(r"label|target|tgt|(^|_)y($|_)", re.I)


_MASK_FIX = ("write the mask id at the positions the labels keep (the selection drawn from the "
             "masked positions, `& masked`), so the loss asks for the tokens the model was not shown")


def _mask_placement(a, loc, mask_id) -> tuple[Location, str, bool]:
    """The statement that chose where the mask id goes into the inputs: the one write of a mask
    id into a slice of an input (``input_ids[replaced] = MASK``), or the assignment of its index
    when that inverts a mask (``replaced = draw & ~masked``: then True); else the loss."""
    tree = a.source.tree(loc.path)
    if tree is None:
        return loc, _MASK_FIX, False
    writes = []
    for node in walk(tree):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if not (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                and isinstance(target.slice, ast.Name)) or _LABEL_NAME.search(target.value.id):
            continue
        value = node.value
        named = ast.unparse(value) if isinstance(value, (ast.Name, ast.Attribute)) else ""
        if re.search(r"mask", named, re.I) or (isinstance(value, ast.Constant)
                                                and value.value == mask_id and mask_id is not None):
            writes.append((node.lineno, target.slice.id))
    if len(writes) != 1:
        return loc, _MASK_FIX, False
    line, index = writes[0]
    made = a.source.value_origin(loc.path, line, index)
    if made is not None and re.search(r"~\s*\(?\s*[A-Za-z_]|logical_not|\b1\.?0?\s*-\s*[A-Za-z_(]",
                                      made[1].split("#")[0]):
        return Location(loc.path, made[0], ""), (
            f"draw `{index}` from the masked positions, not from their complement: "
            f"`{made[1].strip()}` puts the mask id where the labels are ignored"), True
    return Location(loc.path, line, ""), _MASK_FIX, False


def _mask_written(a, loc) -> Location:
    """The one statement of the loss's file that writes a mask token into a slice of labels,
    else the loss."""
    found = []
    for number, text in enumerate(a.source.lines(loc.path), 1):
        m = _MASK_INTO_LABELS.match(text.split("#")[0])
        if m and _LABEL_NAME.search(m.group(1)) and re.search(r"mask", m.group(2), re.I) \
                and "-100" not in m.group(2):
            found.append(number)
    return Location(loc.path, found[0], "") if len(found) == 1 else loc


def _input_origin(a, input_at) -> Location | None:
    """Where the script built the input it gave the model on the call ``input_at`` (``out =
    net(inputs)``: the statement that assigned ``inputs``), or None."""
    if not input_at:
        return None
    path, line = str(input_at[0]), int(input_at[1])
    called = re.findall(r"([A-Za-z_][A-Za-z_0-9]*)\s*\(", a.source.line_text(path, line))
    if not called:
        return None
    name = a.source.call_argument(path, line, called[-1], 0, "input")
    if not name or not name.isidentifier():
        return None
    built = a.source.value_origin(path, line, name)
    return Location(path, built[0], "") if built is not None else None


def _mask_names(text: str) -> list[str]:
    """The names the loss's statement restricts by: `x * mask`, `err[keep]`, `where(m, ...)`,
    `masked_fill(m, ...)`."""
    names = re.findall(r"\*\s*\(?\s*([A-Za-z_][A-Za-z_0-9]*)\s*\)?", text)
    names += re.findall(r"\[\s*~?\s*([A-Za-z_][A-Za-z_0-9]*)\s*\]", text)
    names += re.findall(r"(?:masked_fill|where)\(\s*~?\s*([A-Za-z_][A-Za-z_0-9]*)", text)
    return [n for n in dict.fromkeys(names) if n not in ("torch", "F")]


_INVERTED_MASK = re.compile(r"\*\s*\(?\s*(?:~\s*|1\.?0?\s*-\s*)[A-Za-z_.]*mask|"
                            r"[A-Za-z_.]*mask[A-Za-z_]*\.logical_not\(\)", re.I)


def _inverted_reductions(a, path: str) -> list[tuple[int, str]]:
    """The statements of the script that weigh values by an inverted mask and reduce them
    (`(loss * (1 - mask)).sum() / (1 - mask).sum()`, `(err * ~mask).mean()`)."""
    found = []
    for number, line in enumerate(a.source.lines(path), 1):
        text = line.split("#")[0]
        if "=" in text and _INVERTED_MASK.search(text) and re.search(r"\.(sum|mean)\(", text):
            found.append((number, text.strip()))
    return found


def _position_writes(a, path: str, names: list[str]) -> list[tuple[int, str]]:
    """The statements of the script that write a constant into a slice of one of ``names``
    (`mask[:, keep:] = 0`): where a mask's positions are chosen."""
    tree = a.source.tree(path)
    if tree is None or not names:
        return []
    found = []
    for node in walk(tree):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if not (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                and target.value.id in names and isinstance(node.value, ast.Constant)):
            continue
        text = a.source.line_text(path, node.lineno).split("#")[0].strip()
        found.append((node.lineno, text))
    return found


def _input_keeps_counted(a, path: str, names: list[str], loss_text: str) -> tuple[int, str] | None:
    """``(line, fix)`` of the one statement that builds the model's input by position from a
    mask the loss counts with, keeping the loss's target where that mask is set:
    ``torch.where(mask, tokens, MASK)`` (the branches swapped) or ``tokens.masked_fill(~mask,
    MASK)`` (the mask inverted), ``tokens`` read by the loss's statement too; else None."""
    tree = a.source.tree(path)
    if tree is None or not names:
        return None
    read = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", loss_text))
    found = []
    for node in walk(tree):
        if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
            continue
        call, func = node.value, node.value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name == "where" and len(call.args) == 3:
            cond, kept = call.args[0], call.args[1]
            if isinstance(cond, ast.Name) and cond.id in names and isinstance(kept, ast.Name) \
                    and kept.id in read and kept.id not in names:
                fixed = (f"torch.where({cond.id}, {ast.unparse(call.args[2])}, {kept.id})")
                found.append((node.lineno, f"swap the branches: `{fixed}` hides the positions the "
                                           f"loss counts and keeps the others"))
        elif name == "masked_fill" and isinstance(func, ast.Attribute) and call.args:
            cond, kept = call.args[0], func.value
            if isinstance(cond, ast.UnaryOp) and isinstance(cond.op, ast.Invert) \
                    and isinstance(cond.operand, ast.Name) and cond.operand.id in names \
                    and isinstance(kept, ast.Name) and kept.id in read:
                found.append((node.lineno, f"fill the positions the loss counts: "
                                           f"`{kept.id}.masked_fill({cond.operand.id}, ...)`"))
    return found[0] if len(found) == 1 else None
