from __future__ import annotations

from ..analysis.hard_negatives import positive_drawn_as_negative
from ..findings import Severity
from ..trace import Location
from .base import Rule


class HardNegativeDrawsPositive(Rule):
    """
    ## What it does
    Finds hard negatives mined from a batch's similarity matrix with each row's own pair left
    in: a weight matrix assigned from a product of two batches' features with one transposed
    (`image_feat @ text_feat.t()`, `torch.mm`, `einsum`), directly or through a softmax, a
    temperature or a transpose, from which the script draws (`torch.multinomial`, `argmax`,
    `topk`, for the whole matrix or one row at a time) indices that pick the negatives
    (`image_embeds[neg_idx]`), while nothing in the same function masks or fills any matrix
    of that chain (`fill_diagonal_(0)`, `masked_fill` with the pairs of one id, an `eye`, an
    item assignment). A helper that mines and returns the draw counts when a caller indexes
    with what it returns (`image_embeds[mine(text_feat, image_feat)]`). Read from the script's
    source, in the files whose backwards ran.

    ## Why is this bad?
    In image-text matching (ALBEF, BLIP, BLIP-2's Q-Former, X-VLM) the diagonal of the batch's
    similarity matrix holds each text's own image: its positive, and the most similar entry of
    its row once the contrastive loss has started to work. Sampled in proportion to the
    softmax, the positive is drawn as that row's "hard negative" more and more often as the
    model gets better, and is trained with the label 0 beside the same pair labelled 1; an
    `argmax` draws it every time. The matching head is taught to contradict itself and
    learns nothing (its accuracy stays at chance) while the other losses fall.

    ## Example
    ```python
    with torch.no_grad():
        weights_t2i = F.softmax(sim_t2i, dim=1) + 1e-4
    neg_idx = torch.multinomial(weights_t2i, 1).squeeze(1)
    image_embeds_neg = image_embeds[neg_idx]
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        weights_t2i = F.softmax(sim_t2i, dim=1) + 1e-4
        weights_t2i.fill_diagonal_(0)  # or masked_fill of the pairs that share an id
    neg_idx = torch.multinomial(weights_t2i, 1).squeeze(1)
    ```

    ## Stays silent on
    A diagonal taken out by `fill_diagonal_`, by `masked_fill`/`where` with an identity or with
    the pairs that share an id, or by `-inf` on the logits before the softmax; sampling a
    language model's next token (`softmax(h @ emb.weight.t())`: a product with a parameter);
    draws that index nothing (a retrieval metric's `argmax`); weights that are no similarity of
    two batches (a sampler's class weights).
    """

    code = "GD395"
    slug = "hard-negative-draws-positive"
    severity = Severity.WARNING
    summary = ("hard negatives are drawn from a batch's similarity matrix whose diagonal is left "
               "in: each row's own positive is picked as its negative")
    fix = ("take each row's own pair out before drawing: `weights.fill_diagonal_(0)` (or "
           "masked_fill of the pairs that share an id)")

    def check(self, a):
        paths = sorted({e.loc.path for e in a.of_kind("backward") if e.loc is not None})
        for path in paths:
            for line, text, weights, draw_line, draw_text in positive_drawn_as_negative(path):
                yield self.finding(
                    f"`{draw_text}` (line {draw_line}) draws the negatives from `{weights}`, a "
                    f"similarity of the batch with itself whose diagonal (each row's own pair, "
                    f"its positive and its most similar entry) is never taken out: the positive "
                    f"is drawn as its own hard negative and trained with the label of a "
                    f"mismatch, so the matching head learns to contradict itself",
                    Location(path, line, None),
                    fix=(f"after `{text}`, take each row's own pair out: "
                         f"`{weights}.fill_diagonal_(0)` (or masked_fill of the pairs that share "
                         f"an id)"),
                    evidence={"weights": weights, "draw_line": draw_line})
