"""A normalising flow that never transforms some coordinates of its input
(flow-dimension-untransformed).

A coupling flow transforms one part of its input in each layer, conditioned on the other; the
layers must alternate which part they transform (masks ``m`` and ``1 - m``, a flip or a
permutation between them) so that every coordinate is transformed by some layer. With the same
mask in every layer, or the permutation forgotten, a coordinate passes from the data to the
latent unchanged: its density stays the prior's standard normal whatever the data, and the
other coordinates are never conditioned on it.

Read from the loss's graph at the first backwards of each line (``LossGraphReader``): the
latent is the (batch, features) tensor a square saves (``PowBackward0`` with exponent 2: the
prior's ``-0.5 * z ** 2``), with a graph; the data are the (batch, k) tensors without graph
that the graph's products save (the first layer's ``x * exp(s)``, a conditioner's linear layer
reading one half). When some feature columns of the latent equal a data column exactly, every
row (a column that varies), while others differ (a flow whose layers all start as the identity — zero-initialised scale and
shift networks — equals the data everywhere: no verdict until they move), a
``flow_identity_dims`` aside names them. While every ``exp`` the graph saves is exactly one
(zero-initialised scale networks), no verdict: the flow is still the identity, and where the
data reach the graph only masked (``b * x``, the masked-out half zeroed, as in normflows'
``MaskedAffineFlow``), a latent column with no data column to match is not evidence that a
layer transformed it.
"""

from __future__ import annotations

import torch

from .. import events as ev
from .graphpaths import saved
from .lossterms import LossGraphReader

_NODES = 20000  # nodes of the loss's graph walked, at most
_MIN_ROWS = 4  # rows the latent needs
_COLUMNS = 256  # features of a latent, and of a data tensor, compared at most
# products that save their operands: the data a flow's first layer reads (``x * exp(s)``, the
# conditioner's linear layer on one half)
_DATA_SAVERS = {"MulBackward0": ("_saved_self", "_saved_other"), "AddmmBackward0": ("_saved_mat1",),
                "MmBackward0": ("_saved_self",)}


class FlowIdentityWatcher(LossGraphReader):
    label = "flow_identity_dims"

    def _judge(self, root, loc) -> None:
        seen = {id(root)}
        queue = [root]
        latents, data = [], []
        scales_at_zero = None  # every exp the graph saves is exactly one (None: no exp)
        while queue and len(seen) < _NODES:
            node = queue.pop()
            name = type(node).__name__
            if name == "ExpBackward0" and scales_at_zero is not False:
                r = saved(node, "_saved_result")
                if isinstance(r, torch.Tensor) and r.device.type == "cpu":
                    scales_at_zero = bool((r == 1).all())
            elif name == "PowBackward0" and getattr(node, "_saved_exponent", None) == 2:
                z = saved(node, "_saved_self")
                if isinstance(z, torch.Tensor) and z.dim() == 2 and z.requires_grad:
                    latents.append(z)
            elif name in _DATA_SAVERS:
                for attr in _DATA_SAVERS[name]:
                    x = saved(node, attr)
                    if isinstance(x, torch.Tensor) and x.dim() == 2 and not x.requires_grad \
                            and x.is_floating_point() and x.device.type == "cpu" \
                            and x.grad_fn is None and x.shape[1] <= _COLUMNS:
                        data.append(x)
            for child, _ in node.next_functions:
                if child is not None and id(child) not in seen:
                    seen.add(id(child))
                    queue.append(child)
        if scales_at_zero:
            # the coupling layers' scale networks still output zero (zero-initialised, before
            # their first update): the flow is the identity, and the data its first layer reads
            # may be its kept half only (``b * x``), the other half not saved anywhere: a latent
            # column without a match there is not shown transformed. Judged once they move.
            return
        for z in latents:
            if z.shape[0] < _MIN_ROWS or not 2 <= z.shape[1] <= _COLUMNS or z.device.type != "cpu":
                continue
            with torch.no_grad():
                zt = z.detach().t()
                columns = [c for x in data if x.shape[0] == z.shape[0] for c in x.t()
                           if bool((c != c[0]).any())]
                if not columns:
                    continue
                kept = torch.stack(columns)  # (data columns, rows)
                same = (zt[:, None, :] == kept[None, :, :]).all(2).any(1)  # per latent column
            dims = [int(j) for j in same.nonzero().flatten()]
            if dims and not bool(same.all()):
                self._done.add(loc)
                self.rec.emit_aside(ev.flow_identity_dims(
                    dims=dims[:16], features=int(z.shape[1]), line=getattr(loc, "line", None)), loc)
                return
