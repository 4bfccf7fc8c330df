from __future__ import annotations

from ..findings import Severity
from ..location import Location
from .base import Rule


class PromptMaskInverted(Rule):
    """
    ## What it does
    Finds a token loss (`cross_entropy` / `nll_loss`, also the one a transformers model computes
    from `labels=`) whose labels ignore each example's response and train on its prompt: the
    prompt mask of supervised fine-tuning the wrong way round. The counted targets are the
    tokens of a (batch, length) batch the script embedded (the input ids, or the next ones), and
    in most rows the positions set to the `ignore_index` (-100) are exactly one run at the end
    of the row that holds real tokens, not padding, with the counted positions before it. It
    points at the statement that writes -100 into the labels by prompt and response, when the
    script has one such statement, else at the loss.

    ## Why is this bad?
    Fine-tuning on instructions means predicting the response given the prompt; the prompt's
    positions are left out of the loss. A comparison the wrong way round (`>=` for `<`), a
    response mask passed where the prompt mask belongs, or labels built as
    `prompt + [-100] * len(response)` keep the prompt and drop the response: the model learns
    to continue instructions and never sees an answer in its loss, while the loss falls as
    usual (prompts are often templated and easy to predict).

    ## Example
    ```python
    labels = input_ids.clone()
    labels[positions >= prompt_len[:, None]] = -100
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1))
    ```

    ## Use instead
    ```python
    labels = input_ids.clone()
    labels[positions < prompt_len[:, None]] = -100  # the prompt is context, not a target
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1))
    ```

    ## Stays silent on
    The prompt masked at the start of each row (with the padding at the end, or on the left);
    padding alone masked at the end (right-padded pretraining, an eos token used as the pad
    token: the masked end holds one filler id); the last position masked because it has no next
    token; seq2seq targets padded with -100 (read against their decoder inputs, which hold the
    filler there; the encoder's tokens are no match for the labels); multi-turn chats whose
    system prompt and user turns are masked, the last user turn included; labels that are not
    the embedded tokens (a tagger's classes); targets on an accelerator (not read). Not seen:
    labels built from token ids that were never embedded as a (batch, length) batch on the CPU.
    """

    code = "GD196"
    slug = "prompt-mask-inverted"
    severity = Severity.WARNING
    summary = ("the labels ignore (-100) each example's response and train on its prompt: the "
               "prompt mask of supervised fine-tuning is inverted")
    fix = ("set the labels of the prompt positions to -100 and keep the response's "
           "(labels[positions < prompt_len] = -100), not the other way round")

    def check(self, a):
        for e in a.of_kind("prompt_trained"):
            rows, hits = e.get("rows"), e.get("inverted_rows")
            ignore = e.get("ignore_index")
            loc, where = e.loc, ""
            if loc is not None:
                found = a.source.prompt_mask_line(loc.path, ignore if isinstance(ignore, int) else -100)
                if found is not None:
                    where = f" (set by `{found[1]}`)"
                    loc = Location(loc.path, found[0])
            yield self.finding(
                f"in {hits} of {rows} rows the labels given to {e.get('fn')} are {ignore} over one "
                f"run at the end of the row that holds real tokens ({e.get('ignored_real'):.1f} per "
                f"row on average) and count only the {e.get('kept'):.1f} positions before it{where}: "
                "the loss trains on the prompts and ignores the responses, the prompt mask is "
                "inverted",
                loc,
                evidence={"rows": rows, "inverted_rows": hits, "offset": e.get("offset"),
                          "kept": e.get("kept"), "ignored_real": e.get("ignored_real"),
                          "ignore_index": ignore})
