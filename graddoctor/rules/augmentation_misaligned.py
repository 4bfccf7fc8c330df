from __future__ import annotations

from ..findings import Severity
from .base import Rule

_HOW = {
    "flip": "flips", "fliplr": "flips", "flipud": "flips", "rot90": "rotates",
    "transpose": "transposes", "swapaxes": "transposes", "swapdims": "transposes",
    "permute": "transposes", "t": "transposes", "mT": "transposes", "__getitem__": "crops",
    "narrow": "crops", "roll": "shifts", "pad": "pads", "interpolate": "resizes",
    "upsample": "resizes", "grid_sample": "warps", "resize": "resizes", "crop": "crops",
    "center_crop": "crops",
}


class AugmentationMisaligned(Rule):
    """
    ## What it does
    Finds a Dataset whose augmentation moves an image's pixels and its segmentation mask's
    differently: the image flipped and the mask not (or flipped along the other axis), a random
    crop drawn twice (one offset for the image, another for the mask), a rotation or a
    transpose of the image alone, the image resized where the mask is cropped. Read from the
    DataLoader's first batched fetches (in-process, CPU): the torch ops `__getitem__` runs are
    followed (which pixel of the stored data each output pixel comes from), and a sample whose
    image (floating, many values) and mask (integers, or a few values) share their last two
    axes but not their pixels' places is reported at the op that moved one of them and not the
    other (for a helper that draws its own crop and is called once for each, at the call that
    makes the mask's). Also a batch augmented in the training loop: a flip of the batch the
    model reads (a layer's saved input in the loss's graph) and, in the same turn, a flip of
    another tensor of the same last two axes (its depth map, mask or flow) along other image
    axes (`img.flip(-1)` with `depth.flip(-2)`), seen at the first backwards and reported at the
    target's flip.

    ## Why is this bad?
    A dense target must move with its input: each pixel's label is the label of the pixel at
    the same place. Flipped apart, half the batches pair every pixel with the label of its
    mirror image; the model learns a blurred, symmetric guess, the loss stalls above what it
    could reach, and nothing fails.

    ## Example
    ```python
    def __getitem__(self, i):
        image, mask = self.images[i], self.masks[i]
        if random.random() < 0.5:
            image = torch.flip(image, dims=[-1])
            mask = torch.flip(mask, dims=[0])
        return image, mask
    ```

    ## Use instead
    ```python
    def __getitem__(self, i):
        image, mask = self.images[i], self.masks[i]
        if random.random() < 0.5:
            image = torch.flip(image, dims=[-1])
            mask = torch.flip(mask, dims=[-1])  # the same axis: the last one
        return image, mask
    ```

    ## Stays silent on
    The same flip, crop, rotation or resize for both (a bilinear resize of the image and a
    nearest one of the mask to the same size); photometric augmentation of the image alone
    (colour jitter, noise, normalisation, SpecAugment's masked bands); flips of a
    classification input (its label has no pixels); two views of one image cropped differently
    for a contrastive loss (two images, no mask); augmentation done outside torch (NumPy,
    PIL, albumentations: not followed); datasets fetched in worker processes (`num_workers >
    0`). In the loop: an image of (B, C, H, W) and a mask of (B, H, W) flipped along the same
    axis named either way (`dims=[3]` and `dims=[2]`, or `-1` for both); two views of one batch
    flipped apart, both fed to the model; a flow field flipped and negated.
    """

    code = "GD191"
    slug = "augmentation-misaligned"
    severity = Severity.WARNING
    summary = ("a Dataset's augmentation moves an image and its mask differently (the image "
               "flipped, cropped or rotated, the mask not or another way)")
    fix = ("apply the same geometric transform, with the same random draw, to the image and "
           "its mask")

    def check(self, a):
        for e in a.of_kind("augment_misaligned"):
            if e.loc is None:
                continue
            if e.get("cls") == "":
                yield self._in_loop(a, e)
                continue
            op, moved = str(e.get("op")), e.get("moved")
            how = _HOW.get(op, "moves")
            other = "mask" if moved == "image" else "image"
            cls = e.get("cls")
            H, W = (e.get("shape") or [0, 0])[:2]
            if moved == "image":
                what = (f"this `{op}` {how} the image of {cls}'s samples, and the mask of the "
                        f"same sample ({H}x{W}) is not moved the same way")
                fix = (f"apply the same `{op}` (the same axes, offsets or angle: one random "
                       f"draw) to the mask too")
            else:
                what = (f"this `{op}` {how} the mask of {cls}'s samples another way than its "
                        f"image ({H}x{W}) is moved (another axis, offset, angle or size)")
                fix = (f"move the mask exactly as the image: the same op with the same axes "
                       f"(a mask of (H, W) is flipped along dims=[-1] when the image of "
                       f"(C, H, W) is), the same random offsets, the same output size")
            yield self.finding(
                f"{what}: after the augmentation a mask pixel no longer labels the image pixel "
                f"at its place, so the model is trained on the label of another pixel for "
                f"the samples this hits. The loss stalls above what it could reach and "
                f"nothing fails",
                e.loc, step=a.next_step_number(e.seq),
                evidence={"dataset": cls, "op": op, "moved": moved, "other": other,
                          "image": e.get("image"), "mask": e.get("mask"), "shape": e.get("shape")},
                fix=fix)

    def _in_loop(self, a, e):
        """A batch flipped in the training loop and its target flipped along other axes."""
        image, mask = e.get("image") or {}, e.get("mask") or {}
        H, W = (e.get("shape") or [0, 0])[:2]
        names = {-1: "width (-1)", -2: "height (-2)"}

        def axes(side):
            picked = [names[x] for x in side.get("axes") or () if x in names]
            return " and ".join(picked) or "no image axis"

        return self.finding(
            f"this flip moves the target ({H}x{W}) along {axes(mask)}, while the batch the model "
            f"reads, flipped at line {image.get('line')}, is flipped along {axes(image)}: after "
            f"the augmentation a target pixel no longer belongs to the input pixel at its place, "
            f"so every flipped batch trains the model on the target of a pixel mirrored the "
            f"other way. The loss stalls above what it could reach and nothing fails",
            e.loc, step=a.next_step_number(e.seq),
            evidence={"dataset": None, "op": "flip", "moved": "mask", "other": "image",
                      "image": image, "mask": mask, "shape": e.get("shape")},
            fix=(f"flip the target along the same image axis as the input (counted from the end: "
                 f"dims=[-1] for both flips the width whatever their number of axes)"))
